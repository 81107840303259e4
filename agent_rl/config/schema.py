"""The config's schema: one typed dataclass per section, a docstring per field, the choice lists
and defaults they draw on, and :class:`ConfigError`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from agent_rl.core.presets import (
    ALGORITHM_PRESETS,
    EPISODE_MODES,
    EPISODE_STATS,
    INVALID_CREDIT,
    K3_CLAMP,
    KL_ESTIMATORS,
    STEP_CREDIT,
    STEP_NORMALIZE,
)

ACTION_PARSERS = ("first_line", "action_tag", "admissible")
"""How actions are read from completions (``agent_rl.training.models.prompts.PARSERS`` implements each)."""
SFT_MODES = ("random", "oracle")
"""Warm starts that clone demonstrations (``agent_rl.training.loop.sft.warm_start``); ``sft.mode``
adds none and auto."""
PRECISIONS = ("fp32", "bf16")
"""Numeric precisions of the forward passes (``agent_rl.training.infra.distributed.check_precision``)."""


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names the key."""


# ---- the sections -------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """Which environment to train on."""

    id: str = "agent_rl/Maze-v0"
    """Registered Gymnasium id (bundled or user-registered), or Gymnasium's ``module:ns/Name-vN`` form,
    which imports ``module`` (registering the environment) first; with an environment factory passed
    to the trainer, the run's name for its environment."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments passed to ``gymnasium.make(id, **kwargs)`` (difficulty knobs); empty uses
    the environment's own defaults. ``env.kwargs.KEY=VALUE`` sets one. Arguments the environment
    refuses, and a constructor that raises or passes ``env.timeout_s``, are a config error naming
    ``env.id`` and ``env.kwargs`` (and the error) before the run starts."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before ``gymnasium.make``; importing them registers user environments."""
    anchor_key: str | None = None
    """Anchor key kind for GiGPO step groups (one of ``agent_rl.anchors.KEY_KINDS``; ``context`` keys the state
    together with the last ``rollout.history_turns`` turns its prompt shows); None uses the
    environment's registered default."""
    timeout_s: float | None = 120.0
    """Seconds one environment call (``reset``, which includes building the environment, ``step``
    or ``oracle``) may take, and ``sft.mode=auto``'s probe at the start (a build, a reset and an
    oracle call) too. A call over it fails its trajectory as an exception would (the probe stops the
    run before it starts), and its environment is abandoned and rebuilt, so a hung simulator cannot
    stall the run; null waits forever. Local environments then run on a helper thread, so an
    environment that must run on the main thread (one that installs signal handlers) needs null."""

    _shorthand = "id"


@dataclass
class PolicyConfig:
    """The policy model."""

    name_or_path: str = "embedded"
    """``embedded`` (the tiny built-in model), a known model (``smollm2-135m-instruct``, installed with
    ``agent-rl models install NAME``), a local GGUF file (dequantized once into a cached Hugging Face
    directory), a local Hugging Face model directory, or a LoRA checkpoint directory (loaded as its
    base model with the adapter merged in)."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    precision: Literal[("auto", *PRECISIONS)] = "fp32"
    """``fp32``; ``bf16``: the forward passes of the learner, the warm start and the hf engine run
    under bfloat16 autocast, with the output head (the logits) in float32 (vLLM serves bfloat16
    weights), while weights, gradients, optimizer state and the loss stay float32. Engine and
    learner logprobs then differ by bf16 rounding, which ``trainer.recompute_old_logprobs`` keeps
    out of most importance ratios (docs/models.md). It needs a CUDA GPU with bf16 or a CPU with
    AVX512-BF16 or AMX; on any other device the trainer refuses it with a ``ConfigError``. ``auto`` is ``bf16`` where
    ``policy.device`` has it, else ``fp32``; the trainer prints the choice and the run's
    ``config.yaml`` records it."""
    tokenizer_envs: list[str] = field(default_factory=list)
    """Environment ids the embedded model's tokenizer is also trained on, besides the bundled games (a
    third-party or user env, ``[textarena/FrozenLake-v0]`` say): its rules text and observations then
    cost a few characters per token instead of about one, and a long-prompt game's warm start and
    iterations cost that much less (docs/benchmarks.md, long prompts). Another list builds another
    embedded model (its own vocabulary, so other initial weights). Only with ``policy=embedded``."""
    cache_dir: str | None = None
    """Where the embedded model and GGUF conversions are cached; None uses ``$AGENT_RL_CACHE/policies``
    (default: the user cache directory)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (``peft``, the ``lora`` extra: ``pip install -e ".[lora]"``) on
    ``policy.lora_target_modules``. Only the adapters train (the warm start too); engines serve the
    merged weights; checkpoints hold the adapter alone. 0 trains every weight (full fine-tuning)."""
    lora_alpha: float = 32.0
    """LoRA scaling numerator: an adapter's update is ``(alpha / rank) * B @ A``."""
    lora_target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Names (suffixes) of the linear layers that get adapters; ``[all-linear]`` is every linear layer
    but the output head."""

    _shorthand = "name_or_path"


@dataclass
class EngineConfig:
    """The generation engine used for rollouts and evaluation."""

    kind: Literal["auto", "hf", "vllm"] = "auto"
    """``hf`` (Hugging Face ``generate``), ``vllm``, or ``auto``: ``vllm`` when it imports, else ``hf``."""
    kv_cache_memory_bytes: int = 256 * 1024**2
    """vLLM only: KV-cache size in bytes (must be explicit on CPU)."""
    enforce_eager: bool = False
    """vLLM only: skip graph capture (faster start, slower steps)."""
    max_batch_size: int = 256
    """hf only: most sequences generated in one ``generate`` call."""

    _shorthand = "kind"


@dataclass
class RolloutConfig:
    """How rollouts are collected and prompts are built."""

    n_groups: int = 16
    """Groups (distinct seeds, i.e. distinct initial states) per batch. 16 fresh groups in place of
    further passes over 4 (``optim.min_steps``) lifted a small Maze's short clone by +31 points more on
    fresh seeds, and lowered no other multi-step case (docs/benchmarks.md, "What RL adds")."""
    group_size: int = 8
    """Trajectories per group, all reset with the group's seed."""
    max_turns: int = 20
    """A trajectory still running after this many turns is cut (``done`` and ``truncated``)."""
    history_turns: int = 2
    """Past (observation, action) turns shown in each prompt."""
    history_observations: bool = True
    """Show the observations of the history turns; False shows only their actions (shorter prompts)."""
    system_prompt: str | None = None
    """The system message; None uses the action parser's instructions, "" sends none (a model
    trained from scratch learns the format from the warm start, and every prompt is shorter)."""
    max_prompt_tokens: int = 1024
    """Prompt budget; over it, history goes oldest first, then the head of the observation."""
    max_new_tokens: int = 24
    """Generation limit per turn; a response that hits it is ``overlong``. The warm start warns when a
    demonstrated reply is longer (its action could never be played)."""
    temperature: float = 0.7
    """Sampling temperature; below 1, samples stay closer to the greedy policy that is evaluated."""
    top_p: float = 1.0
    """Nucleus sampling mass; keep 1.0 for on-policy RL (the learner does not renormalize)."""
    action_mode: Literal["generate", "admissible"] = "generate"
    """How the policy plays a turn. ``generate`` (default): it writes a reply and the parser reads the
    action from it. ``admissible``: where the environment lists ``admissible_actions``, the policy
    plays one of them, drawn as decoding constrained to the list would draw it (each token from the
    policy's distribution at ``temperature``, renormalized over the tokens that continue a listed
    action; the most probable action when greedy): no turn is invalid, and an item name the policy
    never learned to copy costs nothing once its ``take`` is chosen (GLAM, Carta et al., 2023,
    normalizes whole-action probabilities instead, which favours the shortest actions). The chosen
    reply is learned as ``choice_logprobs`` says. ``top_p`` and ``max_new_tokens`` do not apply to such
    turns; turns without a list are generated. Each turn scores every listed action with the policy
    module in this process (the prompt forwarded once), whichever engine generates."""
    choice_logprobs: Literal["reply", "choice"] = "choice"
    """The logprobs an action chosen among the listed ones (``action_mode=admissible``) is learned
    with, in the rollout and in the learner alike; a generated reply is learned as written whatever
    this says. ``choice`` (default): those of the choice the rollout drew, each token's renormalized
    over the tokens that continue a listed action at its position, so the importance ratio and the
    gradient are those of the policy that played: a token no other listed action branches off at (the
    EOS after ``up``, the ``go`` of ``go north`` when every action is a move) has logprob 0 and no
    gradient, and pushing a chosen action down moves its probability to the other listed ones; the
    update's ``entropy`` is then that of the choice at each token (0 at a forced one). ``reply``:
    those of its reply written freely, as if generated. In declared tests on fresh seeds, ``choice``
    ended the small Maze's listed-target clone +13.6 greedy points [+3.5, +23.7] above ``reply``
    (higher on 5 of 5 seeds) and Sokoban's recipe +7.2 [-3.0, +17.3] (4 of 5)."""
    explore_rate: float = 0.0
    """Probability that a training turn plays a uniformly random admissible action in place of the
    policy's reply (turns whose environment lists no ``admissible_actions`` always play the policy's).
    Such a turn is learned like the policy's own, written as the policy writes that action, with its
    old logprobs scored by the learner's model before the update. From a start that never wins, it
    lets some trajectories reach the reward that the policy alone never finds; evaluation never
    explores. 0 (default) plays the policy alone."""
    greedy_members: int = 0
    """Members of each training group (the first this many of ``group_size``) that play greedily, as
    evaluation does; the others sample. Greedy play loops more often than sampled play (one invalid
    command over and over, or moves back and forth): its greedy member brings the loops that greedy
    evaluation meets into the batch, beside its group's sampled members from the same initial
    state. Their turns are learned like the others, with old logprobs scored by the learner's model
    at the sampling temperature before the update. 0 (default) samples every member."""
    target_pass_rate: float | None = None
    """Reverse curriculum, for environments that give oracle plans (``agent_rl.envs.oracle_actions``).
    None (default) starts every training episode at its reset state. A rate in (0, 1) starts each
    group part-way along the oracle's plan for its seed: a share of the plan's first actions
    (``replay_start`` at first) is played for it, shown in the prompt's history and never learned,
    at least one move left to the policy; after each iteration the share moves by ``replay_step``
    toward this training pass rate: up while training success is below it, down while above. A
    policy that seldom wins then learns the end of each task first and more of it as it improves.
    Evaluation always starts at the reset state."""
    replay_start: float = 0.5
    """The share of each oracle plan replayed in the first iteration (with ``target_pass_rate``); 1
    leaves the policy only each plan's last action."""
    replay_step: float = 0.1
    """How far the replayed share moves after each iteration (with ``target_pass_rate``)."""
    parser: Literal[ACTION_PARSERS] = "first_line"
    """How actions are read from completions: ``first_line`` (the embedded model), ``action_tag`` (the
    content of an ``<action>`` tag) or ``admissible`` (the first admissible action the reply names, for
    instruct models that answer in sentences; a reply that names none is an invalid action)."""
    show_admissible_actions: bool = True
    """List the environment's admissible actions in the prompt when it provides them."""
    max_admissible_actions: int = 0
    """List at most this many admissible actions, in the environment's order (0: all); keeps prompts
    short where the list is long (TextWorld, ScienceWorld). The ``admissible`` parser accepts all of them."""
    min_batch_rows: int = 256
    """Collect further rounds of ``n_groups`` groups (fresh seeds) until the batch holds at least this
    many rows (turns), within ``max_resample_rounds`` extra rounds: an environment of one-step
    episodes then gives the learner as many rows per iteration as a multi-step one (64 one-step
    trajectories are too few for minibatches that average out sampling noise). 0 collects one round."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose trajectory returns are all equal, collect more."""
    max_resample_rounds: int = 3
    """Extra collection rounds that dynamic sampling and ``min_batch_rows`` may run."""
    overlong_penalty: float = 0.0
    """Reward subtracted from a response at the token limit (0 disables overlong shaping)."""
    overlong_buffer: int = 0
    """Tokens before the limit over which the penalty ramps up linearly (0: only at the limit)."""
    progress_reward: float = 0.0
    """Progress shaping, for environments that give oracle plans (``agent_rl.envs.oracle_actions``):
    each training turn's reward gets this much per step its action brought the state closer to a win,
    ``progress_reward x (d(s) - d(s'))``, where ``d`` is the length of the oracle's plan from a state,
    0 once won, and ``rollout.max_turns`` where no plan is left (a dead state, or an episode that
    terminated without a win). A potential-based shaping (Ng et al., 1999): over a trajectory it adds
    ``progress_reward x (d(start) - d(end))``, the same for every member of a group whose members all
    win, so a win still outranks every loss, and a loss that ended nearer the goal outranks one that
    did not. Evaluation and success are unshaped. 0 (default) turns it off."""


RESPELLED: dict[str, dict[Any, Any]] = {"algo.step_credit": {True: "anchor", False: "none"}}
"""Earlier spellings of a key's values, read as today's: saved configs and checkpoints keep them."""


def respelled(key: str, value: Any) -> Any:
    """``value`` of dotted ``key`` as this version spells it (see ``RESPELLED``)."""
    return RESPELLED.get(key, {}).get(value, value) if isinstance(value, (bool, str)) else value


@dataclass
class AlgorithmConfig:
    """Credit assignment and policy loss (presets: ``ALGORITHM_PRESETS``)."""

    preset: Literal[tuple(ALGORITHM_PRESETS)] = "gigpo"
    """Algorithm preset: sets ``advantage``, ``loss`` and ``step_credit`` unless those are given."""
    advantage: Literal[(*EPISODE_MODES, "none")] | None = None
    """Episode-level advantage: grpo (R-mean)/(std+eps), drgrpo R-mean, rloo leave-one-out, or none (no
    trajectory-level term: step credit alone, which needs step credit on); None = preset."""
    loss: str | None = None
    """Loss preset name from ``agent_rl.core.losses.LOSS_PRESETS``; None = the algorithm preset's loss."""
    step_credit: Literal[STEP_CREDIT] | bool | None = None
    """Step-level advantages added to the episode's: ``anchor`` (GiGPO: a step's return against the
    steps taken from the same anchor state), ``graph`` (a step's progress towards a win in its group's
    state graph, against its group) or ``none``; None = the preset's choice (anchor for gigpo only).
    ``true`` and ``false`` are read as ``anchor`` and ``none``."""
    episode_stats: Literal[EPISODE_STATS] = "trajectory"
    """Episode statistics count each trajectory once (paper Eq. 3) or every row (verl-agent)."""
    gamma: float = 1.0
    """Discount of the step-level return-to-go used by GiGPO step advantages. 1 (undiscounted) compares
    the actions of an anchor state by the outcomes they led to; below 1, shorter winning walks also
    score higher, which in a group that always wins rewards whichever walk was shortest in that
    instance, something a policy that sees one room cannot know (the GiGPO paper uses 0.95)."""
    step_weight: float = 1.0
    """Weight omega of the step-level advantage: A = A_episode + omega * A_step."""
    step_normalize: Literal[STEP_NORMALIZE] | None = None
    """Step-level normalization, within an anchor group (anchor credit) or a group (graph credit):
    (x-mean)/(std+eps) or x-mean; None = preset."""
    invalid_penalty: float = 0.5
    """Subtracted from the advantage of each step whose action was invalid, on that step alone (not
    discounted into earlier steps, outside every group statistic); 0 disables it. Unlike the
    environments' ``invalid_action_penalty`` reward, it never changes a trajectory's return, and it
    reaches an invalid command that every member of a group repeats, which group-relative credit
    gives 0."""
    invalid_credit: Literal[INVALID_CREDIT] = "outcome"
    """What a step whose action was invalid (the environment rejected it and nothing changed) is
    credited with: ``outcome``, the episode and step credit of any step, less ``invalid_penalty``;
    ``penalty``, ``-invalid_penalty`` alone. A step that changed nothing did not bring about its
    trajectory's outcome: with ``outcome`` the invalid steps of a won trajectory get a positive
    advantage once the win outweighs the penalty, and the passes of
    ``optim.extra_passes_on=positive`` push them up again on every pass."""
    novelty_bonus: float = 0.0
    """Added to the advantage of each step whose action reached an anchor state (``env.anchor_key``)
    its trajectory had not been in, on that step alone (as ``invalid_penalty`` is charged), in the
    groups the task leaves silent: no trajectory won and every return is equal. There it is the one
    signal (count-based episodic novelty: explore); in a group with a win or a return spread the
    task alone decides. Returns and success are never changed. 0 disables it."""
    negative_weight: float = 0.25
    """Multiplies every negative advantage (after the invalid-action penalty). Below 1 the update
    learns more from what worked than from what failed: most rows of a failed trajectory are moves
    that winning ones made too, and pushing their tokens down disturbs the policy (asymmetric
    REINFORCE). 1 is the unbiased policy gradient; 0 learns from positive advantages alone."""
    row_weight: Literal["turn", "trajectory"] = "trajectory"
    """How the rows (turns) of a trajectory share its weight in the loss: ``turn`` counts every row
    the same, so a trajectory weighs as many turns as it has (verl-agent); ``trajectory`` scales each
    row's advantage by the batch's mean trajectory length over its own, so every trajectory weighs
    the same. With ``turn``, a group whose failures run longer than its wins pushes, summed over
    rows, away from what it sampled."""
    keep_groups: float = 1.0
    """Variance filter (RAGEN): keep this share of each batch's groups, those whose trajectory
    returns spread the most, and give the rows of the others advantage 0 (they leave the update).
    A group whose members all did equally well carries no trajectory-level signal; once most groups
    are such, their step and penalty terms dominate the update. 1 keeps every group (but see
    ``drop_flat_groups``); below 1 a group whose returns are all equal is never kept. Must be in (0, 1]."""
    drop_flat_groups: bool = False
    """Drop the groups whose trajectory returns are all equal, and only those, when ``keep_groups``
    is 1: their rows get advantage 0 and leave the update, so the step and invalid-action terms of a
    group that holds no task signal cannot move the policy on their own. An iteration in which every
    group is flat takes no optimizer step. Below 1 ``keep_groups`` drops flat groups anyway."""
    mask_overlong: bool = False
    """Give advantage 0 to each row whose reply hit ``rollout.max_new_tokens`` without a stop token
    (DAPO's overlong filtering; TRL's ``mask_truncated_completions``), so it leaves the update: a
    reply cut off by the limit is not credited with what its cut-off action led to. With a KL term
    the row still carries that term."""
    eps: float = 1e-6
    """Added to the std in every normalization."""
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides on top of the loss preset: ratio_level, clip_low, clip_high, cispo_cap, loss_agg,
    norm_length (``null`` clip bounds mean no clipping on that side)."""
    kl_coef: float | None = 0.0
    """Per-token KL penalty coefficient against the frozen post-SFT reference; 0 (the default) disables
    it and the reference model; null = the loss preset's value (0.001 for grpo, 0 for the others)."""
    kl_estimator: Literal[KL_ESTIMATORS] | None = None
    """KL estimator (d = logp - ref): k1 = d, k2 = d^2/2, k3 = exp(-d) + d - 1; None = the preset's (k3)."""
    kl_clamp: float | None = K3_CLAMP
    """Upper bound on each token's k3 (verl's ``low_var_kl``: d clamped to +-20, k3 to 10): a token
    beyond it adds the bound and no gradient. null leaves k3 unbounded, where a token the policy
    pushed far below the reference outweighs the rest of the update. k1 and k2 are not clamped."""

    _shorthand = "preset"

    def __post_init__(self) -> None:
        self.step_credit = respelled("algo.step_credit", self.step_credit)


@dataclass
class OptimizerConfig:
    """AdamW and the PPO-style update schedule."""

    lr: float = 2e-4
    """AdamW learning rate of the RL phase (peak, after ``warmup_steps``; a minibatch short of
    ``minibatch_size`` trajectories steps at a proportional share of it). AdamW moves every parameter
    by about ``lr`` per step whatever the gradient's size, so the rate sets how far one step of noisy
    evidence moves the policy (docs/benchmarks.md, "What RL adds")."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas."""
    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""
    adam_eps: float = 1e-8
    """AdamW epsilon."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value before each step; 0 disables clipping."""
    warmup_steps: int = 16
    """Optimizer steps over which the RL learning rate rises linearly to ``lr`` (step k uses
    ``lr * k / warmup_steps``); 0 starts at ``lr``. A fresh AdamW moves every parameter by about
    ``lr`` in its first steps whatever the gradient's size, which noisy policy gradients turn into
    a random perturbation of the warm start."""
    epochs: int = 2
    """Passes over each iteration's learnable trajectories."""
    min_steps: int = 0
    """Raise an update's passes above ``epochs`` until it takes at least this many optimizer steps
    (``update/epochs``). The steps per pass follow the learnable trajectories (``minibatch_size``),
    so a sparse task whose groups rarely hold a win gets one or two steps an iteration while a dense
    one gets dozens; this lifts the first without touching the second. 0 keeps ``epochs``. With 8
    groups an iteration, 16 (and ``extra_passes_on=positive``) took a sparse four-step task to 100%
    on 10 of 10 fresh seeds where ``epochs`` alone reached it on 2; 16 groups and no floor (the
    defaults) reach it too (docs/benchmarks.md, "What RL adds")."""
    extra_passes_on: Literal["all", "positive"] = "positive"
    """The rows of the passes ``min_steps`` adds after ``epochs``: ``all`` the learnable rows, or
    ``positive`` only the rows with a positive advantage (passes over their trajectories, raised
    until the update takes ``min_steps`` steps). The extra steps then push up the rare wins of a
    sparse task and never push sampled tokens down again: pushing down moves probability onto tokens
    the batch never sampled, which lets a strong policy drift or a reply format break."""
    target_kl: float | None = None
    """Stop an update early once a minibatch's approximate KL from the policy that sampled the batch
    (k3, per token, measured before that minibatch's step) exceeds this: neither that step nor any
    later one of the update is taken (``update/kl_stopped``); the first minibatch always steps.
    Bounds how far one iteration moves the policy when it runs many epochs (PPO's ``target_kl``).
    None never stops."""
    minibatches: int = 4
    """Optimizer steps per epoch when ``minibatch_size`` is 0: the learnable trajectories are
    shuffled and split into this many minibatches; with more than one, the ratios leave 1 after the
    first step and the clip terms act."""
    minibatch_size: int = 16
    """Learnable trajectories (those with a row of non-zero advantage) per optimizer step: they split
    into ``count // size`` minibatches, so the number of steps follows the evidence, and with fewer
    than ``size`` of them the one step takes ``lr * count / size``. 0 uses ``minibatches``."""
    micro_batch_size: int = 64
    """Rows per forward/backward pass (gradient accumulation); does not change the gradient."""


@dataclass
class SFTConfig:
    """Supervised warm start that teaches the action format before RL."""

    mode: Literal[("auto", "none", *SFT_MODES)] = "auto"
    """oracle (clone the environment's oracle plans), random (clone uniformly random admissible actions:
    format, not task), none, or auto: oracle when the environment gives oracle plans, else random when
    its reset info lists ``admissible_actions``, else none. The resolved config records the choice."""
    steps: int = 300
    """Optimizer steps of supervised training (a random-action warm start stops at its
    ``format_target`` long before; the Maze recipe's oracle clone takes 1,200)."""
    lr: float = 1e-3
    """AdamW learning rate of the warm start (the peak, under a schedule)."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """constant, or cosine: linear warmup over the first 5% of the steps, then cosine decay towards 0."""
    batch_size: int = 16
    """(prompt, response) pairs per step."""
    targets: Literal["played", "listed"] = "played"
    """random mode: what each demonstration turn teaches. ``played``: the one random action the
    demonstration played there. ``listed``: every action the turn listed, each weighted by one over
    their number, so the turn still counts once: the loss whose expectation ``played`` has, without
    the noise of the draw, for clones whose choice among the listed actions matters
    (``rollout.action_mode=admissible``). The turn's prompt is forwarded once for all its actions."""
    episodes: int = 500
    """Episodes played to build the demonstration set (distinct seeds); collecting thousands of
    episodes of a game with a long rules text takes minutes."""
    perturb: float = 0.1
    """oracle mode: probability that a demonstration turn plays a random action instead (not cloned;
    the oracle plans again from there), so the clone learns to recover from detours and errors."""
    epsilon: float = 0.0
    """oracle mode: probability that a demonstration turn plays a uniformly random admissible action
    and clones it (the oracle plans again from there). The clone then plays like an epsilon-greedy
    expert: valid but often poor actions, a warm start that RL has room to improve. 0 clones the
    expert alone."""
    dagger_episodes: int = 0
    """oracle mode: once the first ``1 - dagger_fraction`` of the steps are done, the clone plays this
    many episodes greedily and each of its turns is labelled with the oracle's action from the state
    the clone reached (DAgger); the remaining steps draw half of every batch from those pairs. 0
    disables it."""
    dagger_fraction: float = 0.25
    """Fraction of ``sft.steps`` trained after the DAgger round; the learning-rate schedule runs on."""
    format_target: float | None = 0.95
    """random mode: stop cloning once at least this share of the replies sampled (at the rollout's
    temperature) for held-out demonstration prompts name an action of the game (one admissible in
    any of those prompts' states; which is legal where is the task), checked every 25 steps: random
    actions teach the format, not the task, and RL learns the task. None clones all ``steps``."""
    max_seconds: float | None = None
    """Stop cloning after this many seconds of training (collection excluded), in any mode; None
    sets no time bound. A time bound makes the warm start depend on the machine's speed."""


@dataclass
class TrainerConfig:
    """The RL loop: iterations, evaluation, checkpoints, seeds."""

    iterations: int = 200
    """RL iterations (rollout + update) to run."""
    seed: int = 0
    """Seeds python, numpy, torch, the engine and the environment seed stream."""
    run_dir: str | None = None
    """Run directory (checkpoints, logs, resolved config); None = runs/<env>-<preset>-<time>."""
    eval_every: int = 2
    """Evaluate on held-out seeds every this many iterations (and after the last); 0 = only at the end."""
    eval_episodes: int = 32
    """Held-out episodes per evaluation (distinct seeds, never used for training)."""
    eval_offset: int = 0
    """Where the held-out episodes start in the held-out seed stream: an evaluation plays held-out
    seeds ``eval_offset`` to ``eval_offset + eval_episodes - 1``. Another offset gives seeds
    disjoint from the default ones, to confirm a setting chosen by looking at results on episodes
    it was not chosen on (new instances where the environment builds each from its seed, as the
    bundled games do; an environment that picks from a finite held-out pool, as TextWorld does,
    picks again from that pool)."""
    eval_sampled: bool = True
    """Also evaluate with sampling (temperature of the rollout), besides greedy."""
    eval_first: bool = True
    """Evaluate the warm start at iteration 0. False skips that evaluation: runs that share one warm
    start (a comparison of methods) evaluate it once, in the run that trains it."""
    target_success: float | None = 0.95
    """Stop once greedy success on the held-out seeds reaches this value (confirmed, see
    ``confirm_episodes``); None trains all iterations."""
    confirm_episodes: int = 128
    """Stop only when greedy success on this many held-out episodes reaches ``target_success``, so the
    noise of a small evaluation cannot end a run early: the periodic greedy evaluation is extended to
    them, ``eval_episodes`` at a time, while the target is still within reach. At most
    ``eval_episodes`` (0, say) stops on the periodic evaluation alone."""
    max_failed_share: float = 1.0
    """Stop the run when at least this share of an iteration's trajectories failed (their environment
    raised); more than half in two iterations running stops it too. Failed trajectories are left out
    of the batch either way, and the first error of each kind is printed once. 1 stops only when every
    trajectory of an iteration failed."""
    save_every: int = 1
    """Write the ``last`` checkpoint every this many iterations (and at the end)."""
    recompute_old_logprobs: bool = False
    """Recompute old logprobs with the training model before the update (and log the mismatch), so
    the update's importance ratios start from the learner's own logprobs rather than the engine's;
    worth its forward pass in bf16, where the two round differently (``policy.precision``)."""
    torch_threads: int | None = None
    """torch intra-op threads; None keeps torch's default."""


@dataclass
class LoggingConfig:
    """Where and how progress is reported."""

    tensorboard: bool = True
    """Write TensorBoard event files in the run directory."""
    console: bool = True
    """Print a compact table per iteration and progress bars."""


@dataclass
class ScaleConfig:
    """Scale-out on Ray. Learner processes come from ``torchrun`` or ``agent-rl train --nproc N``."""

    ray_address: str | None = None
    """Ray cluster to join (``auto`` or ``ray://host:port``); None starts a local Ray when Ray is used."""
    env_actors: int = 0
    """Ray actors holding the rollout's environments, each a batch of them; 0 keeps them in-process."""
    engine_replicas: int = 0
    """Generation engines as Ray actors (kind ``engine.kind``); 0 runs one engine in-process."""
    num_cpus_per_actor: float = 1.0
    """CPUs Ray reserves for each environment actor and engine replica."""
    num_gpus_per_replica: float = 0.0
    """GPUs Ray reserves for each engine replica (1 for a vLLM replica per GPU)."""


@dataclass
class Config:
    """The full training configuration."""

    env: EnvConfig = field(default_factory=EnvConfig)
    """Environment."""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """Policy model."""
    engine: EngineConfig = field(default_factory=EngineConfig)
    """Generation engine."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Rollout collection and prompts."""
    algo: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Credit assignment and loss."""
    optim: OptimizerConfig = field(default_factory=OptimizerConfig)
    """Optimizer and update schedule."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm start."""
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """RL loop."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Logging."""
    scale: ScaleConfig = field(default_factory=ScaleConfig)
    """Ray environment actors and engine replicas."""
