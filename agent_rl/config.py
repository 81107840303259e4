"""Typed training configuration: one dataclass per component, loadable from YAML, overridable with
``key=value`` on the command line.

Resolution order: dataclass defaults (the "embedded defaults", which are the Maze GiGPO main-job
recipe) <- a YAML file <- command-line overrides. Dotted keys address fields
(``trainer.iterations=50``); values are parsed with ``yaml.safe_load`` (``true``, ``1e-4``,
``[a, b]``). A section name with a plain value sets that section's shorthand field:
``env=ID`` is ``env.id=ID``, ``algo=gigpo`` is ``algo.preset=gigpo``, ``engine=hf`` is
``engine.kind=hf``, ``policy=PATH`` is ``policy.name_or_path=PATH``. Free-form dict fields take
dotted sub-keys (``env.kwargs.max_steps=40``). Unknown keys and invalid values raise
:class:`ConfigError` naming the key.

:func:`resolve` makes every choice a config leaves open (``engine=auto``, the environment's default
anchor key, the algorithm preset's parts, Dr.GRPO's normalizer) in one place; the trainer, the
run directory's ``config.yaml`` and the checkpoints hold the resolved config.

This module imports neither torch nor ``training``: building a config is cheap.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import importlib
import os
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

import yaml

from agent_rl.advantages import EPISODE_MODES, EPISODE_STATS, STEP_NORMALIZE
from agent_rl.batch import KEY_KINDS
from agent_rl.presets import ALGORITHM_PRESETS, LOSS_KWARGS, LOSS_PRESETS

ACTION_PARSERS = ("first_line", "action_tag", "admissible")
"""How actions are read from completions (``training.prompts.PARSERS`` implements each)."""


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names the key."""


DEFAULT_ENV_ID = "agent_rl/Maze-v0"
"""The environment of the embedded defaults (the main job)."""

DEFAULT_ENV_KWARGS: dict[str, Any] = {
    "n_rooms": 4, "n_locked_doors": 1, "dead_ends": 1, "extra_edges": 0, "n_distractors": 0, "max_steps": 20,
    "oracle": "explore",
}
"""The main job's Maze: ``env.kwargs`` when ``env.id`` is ``DEFAULT_ENV_ID`` and no kwargs are given."""

MAZE_SFT_SIZES = {"steps": 1200, "episodes": 4000}
"""The warm start's size for the default environment id (the main job's oracle clone)."""
GENERIC_SFT_SIZES = {"steps": 300, "episodes": 500}
"""The warm start's size for any other environment when the config leaves it open: a random-action
warm start stops at its format target long before, and a recipe names its own sizes."""


# ---- the sections -------------------------------------------------------------------------------


@dataclass
class EnvConfig:
    """Which environment to train on."""

    id: str = DEFAULT_ENV_ID
    """Registered Gymnasium id (bundled or user-registered), or Gymnasium's ``module:ns/Name-vN`` form,
    which imports ``module`` (registering the environment) first; with an environment factory passed
    to the trainer, the run's name for its environment."""
    kwargs: dict[str, Any] | None = None
    """Constructor arguments passed to ``gymnasium.make(id, **kwargs)`` (difficulty knobs); None is the
    main job's Maze knobs (``DEFAULT_ENV_KWARGS``) for the default id and ``{}`` for any other id, so a
    config naming another environment never inherits the Maze's arguments. ``env.kwargs.KEY=VALUE``
    edits that default."""
    imports: list[str] = field(default_factory=list)
    """Modules imported before ``gymnasium.make``; importing them registers user environments."""
    anchor_key: str | None = None
    """Anchor key kind for GiGPO step groups (one of ``anchors.KEY_KINDS``; ``context`` keys the state
    together with the last ``rollout.history_turns`` turns its prompt shows); None uses the
    environment's registered default."""

    _shorthand = "id"

    def __post_init__(self) -> None:
        if self.kwargs is None:
            self.kwargs = dict(DEFAULT_ENV_KWARGS) if self.id == DEFAULT_ENV_ID else {}


@dataclass
class PolicyConfig:
    """The policy model."""

    name_or_path: str = "embedded"
    """``embedded`` (the tiny built-in model), a known model (``smollm2-135m-instruct``, installed with
    ``agent-rl models install NAME``), a local GGUF file (dequantized once into a cached Hugging Face
    directory) or a local Hugging Face model directory."""
    device: str = "auto"
    """``auto`` (cuda when available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """``fp32``, or ``bf16``: the forward passes of the learner, the warm start and the hf engine run
    under bfloat16 autocast while weights, optimizer state and losses stay float32. Needs a CUDA GPU
    with bf16 or a CPU with AVX512-BF16 or AMX; elsewhere the trainer refuses it."""
    cache_dir: str | None = None
    """Where the embedded model and GGUF conversions are cached; None uses ``$AGENT_RL_CACHE/policies``
    (default: the user cache directory)."""
    lora_rank: int = 0
    """Rank of LoRA adapters (``peft``, the ``lora`` extra) on ``lora_target_modules``; only the adapters
    are trained, rollouts use the merged weights and checkpoints hold the adapter alone. 0 trains every
    weight (full fine-tuning)."""
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

    n_groups: int = 8
    """Groups (distinct seeds, i.e. distinct initial states) per batch."""
    group_size: int = 4
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
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass; keep 1.0 for on-policy RL (the learner does not renormalize)."""
    parser: Literal[ACTION_PARSERS] = "first_line"
    """How actions are read from completions: ``first_line`` (the embedded model), ``action_tag`` (the
    content of an ``<action>`` tag) or ``admissible`` (the first admissible action the reply names, for
    instruct models that answer in sentences; a reply that names none is an invalid action)."""
    show_admissible_actions: bool = True
    """List the environment's admissible actions in the prompt when it provides them."""
    max_admissible_actions: int = 0
    """List at most this many admissible actions, in the environment's order (0: all); keeps prompts
    short where the list is long (TextWorld, ScienceWorld). The ``admissible`` parser accepts all of them."""
    min_batch_rows: int = 0
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

    def __post_init__(self) -> None:
        for name in ("n_groups", "group_size", "max_turns", "max_prompt_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("history_turns", "max_admissible_actions", "min_batch_rows", "max_resample_rounds", "overlong_buffer"):
            if getattr(self, name) < 0:
                raise ValueError(f"RolloutConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"RolloutConfig.overlong_buffer ({self.overlong_buffer}) exceeds max_new_tokens ({self.max_new_tokens})"
            )
        if self.overlong_penalty < 0:
            raise ValueError(f"RolloutConfig.overlong_penalty must be >= 0, got {self.overlong_penalty}")
        if self.parser not in ACTION_PARSERS:
            raise ValueError(f"RolloutConfig.parser must be one of {sorted(ACTION_PARSERS)}, got {self.parser!r}")
        if not self.temperature > 0:
            raise ValueError(f"RolloutConfig.temperature must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"RolloutConfig.top_p must be in (0, 1], got {self.top_p}")


def _default_rollout() -> RolloutConfig:
    # The main-job recipe: 8 groups x 8 trajectories, the last turn in the prompt (without it a greedy
    # reactive policy walks back and forth), and room for the longest Maze action (9 tokens + EOS with
    # the embedded tokenizer); at least 256 rows, so one-step environments play 4 rounds; temperature
    # 0.7, so samples stay closer to the greedy policy that is evaluated.
    return RolloutConfig(n_groups=8, group_size=8, max_turns=20, history_turns=1, max_new_tokens=12, min_batch_rows=256,
                         temperature=0.7)


@dataclass
class AlgorithmConfig:
    """Credit assignment and policy loss (presets: ``ALGORITHM_PRESETS``)."""

    preset: Literal[tuple(ALGORITHM_PRESETS)] = "gigpo"
    """Algorithm preset: sets ``advantage``, ``loss`` and ``step_credit`` unless those are given."""
    advantage: Literal[(*EPISODE_MODES, "none")] | None = None
    """Episode-level advantage: grpo (R-mean)/(std+eps), drgrpo R-mean, rloo leave-one-out, or none (no
    trajectory-level term: step credit alone, which needs step credit on); None = preset."""
    loss: str | None = None
    """Loss preset name from ``agent_rl.losses.LOSS_PRESETS``; None = the algorithm preset's loss."""
    step_credit: bool | None = None
    """Add GiGPO step-level advantages (anchor groups); None = the preset's choice (True for gigpo only)."""
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
    """Step-level normalization within an anchor group: (R-mean)/(std+eps) or R-mean; None = preset."""
    invalid_penalty: float = 0.5
    """Subtracted from the advantage of each step whose action was invalid, on that step alone (not
    discounted into earlier steps, outside every group statistic); 0 disables it. Unlike the
    environments' ``invalid_action_penalty`` reward, it never changes a trajectory's return, and it
    reaches an invalid command that every member of a group repeats, which group-relative credit
    gives 0."""
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
    eps: float = 1e-6
    """Added to the std in every normalization."""
    loss_kwargs: dict[str, Any] = field(default_factory=dict)
    """Overrides on top of the loss preset: ratio_level, clip_low, clip_high, cispo_cap, loss_agg,
    norm_length (``null`` clip bounds mean no clipping on that side)."""
    kl_coef: float | None = 0.0
    """Per-token KL penalty coefficient against the frozen post-SFT reference; 0 (the default) disables
    it and the reference model; null = the loss preset's value (0.001 for grpo, 0 for the others)."""
    kl_estimator: Literal["k1", "k2", "k3"] | None = None
    """KL estimator (d = logp - ref): k1 = d, k2 = d^2/2, k3 = exp(-d) + d - 1; None = the preset's (k3)."""

    _shorthand = "preset"


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

    mode: Literal["auto", "none", "random", "oracle"] = "auto"
    """oracle (clone the environment's oracle plans), random (clone uniformly random admissible actions:
    format, not task), none, or auto: oracle when the environment gives oracle plans, else random when
    its reset info lists ``admissible_actions``, else none. The resolved config records the choice."""
    steps: int | None = None
    """Optimizer steps of supervised training; None is 1,200 for the default environment id (the
    main job's oracle clone, ``MAZE_SFT_SIZES``) and 300 for any other (``GENERIC_SFT_SIZES``)."""
    lr: float = 1e-3
    """AdamW learning rate of the warm start (the peak, under a schedule)."""
    lr_schedule: Literal["constant", "cosine"] = "cosine"
    """constant, or cosine: linear warmup over the first 5% of the steps, then cosine decay towards 0."""
    batch_size: int = 16
    """(prompt, response) pairs per step."""
    episodes: int | None = None
    """Episodes played to build the demonstration set (distinct seeds); None is 4,000 for the default
    environment id and 500 for any other (collecting 4,000 episodes of a game with a long rules text
    takes minutes)."""
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
    """Fraction of ``steps`` trained after the DAgger round; the learning-rate schedule runs on."""
    format_target: float | None = 0.95
    """random mode: stop cloning once at least this share of the replies sampled (at the rollout's
    temperature) for held-out demonstration prompts name an admissible action, checked every 25
    steps: random actions teach the format, not the task, and RL learns the task. None clones all
    ``steps``."""
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
    eval_sampled: bool = True
    """Also evaluate with sampling (temperature of the rollout), besides greedy."""
    target_success: float | None = 0.95
    """Stop once greedy success on the held-out seeds reaches this value (confirmed, see
    ``confirm_episodes``); None trains all iterations."""
    confirm_episodes: int = 128
    """Stop only when greedy success on this many held-out episodes reaches ``target_success``, so the
    noise of a small evaluation cannot end a run early: the periodic greedy evaluation is extended to
    them, ``eval_episodes`` at a time, while the target is still within reach. At most
    ``eval_episodes`` (0, say) stops on the periodic evaluation alone."""
    save_every: int = 1
    """Write the ``last`` checkpoint every this many iterations (and at the end)."""
    recompute_old_logprobs: bool = False
    """Recompute old logprobs with the training model before the update (and log the mismatch)."""
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
    rollout: RolloutConfig = field(default_factory=_default_rollout)
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

    def __post_init__(self) -> None:
        sizes = MAZE_SFT_SIZES if self.env.id == DEFAULT_ENV_ID else GENERIC_SFT_SIZES
        for name, value in sizes.items():
            if getattr(self.sft, name) is None:
                setattr(self.sft, name, value)


def _section_types() -> dict[str, type]:
    return typing.get_type_hints(Config)


# ---- parsing --------------------------------------------------------------------------------------


def _field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _all_keys() -> list[str]:
    keys = []
    for section, cls in _section_types().items():
        keys += [f"{section}.{name}" for name in _field_hints(cls)]
    return keys


def _unknown(key: str) -> ConfigError:
    close = difflib.get_close_matches(key, _all_keys() + list(_section_types()), n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"unknown config key {key!r}{hint}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """Check ``value`` against the type ``hint`` of field ``key``; convert where unambiguous."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, arg, key)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if len(errors) == 1 else f"config key {key!r}: invalid value {value!r}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"config key {key!r}: {value!r} is not one of {list(args)}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config key {key!r} expects true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config key {key!r} expects an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"config key {key!r} expects a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"config key {key!r} expects a number, got {value!r}")
        return float(value)
    if hint is str:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if not isinstance(value, str):
            raise ConfigError(f"config key {key!r} expects a string, got {value!r}")
        return value
    if origin is list:
        items = value if isinstance(value, (list, tuple)) else [value]
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(items)]
    if origin is tuple:
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise ConfigError(f"config key {key!r} expects a list of {len(args)} values, got {value!r}")
        return tuple(_coerce(v, a, f"{key}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key {key!r} expects a mapping, got {value!r}")
        return {str(k): v for k, v in value.items()}
    raise ConfigError(f"config key {key!r}: unsupported type {hint!r}")


class _Edits(dict):
    """Sub-key edits of a mapping field (``env.kwargs.max_steps=40``), applied on top of the field's
    value once its section is built: ``env.kwargs``'s default depends on the final ``env.id``."""


def _build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    hints = _field_hints(cls)
    default = getattr(Config(), section)
    # Missing keys keep the embedded defaults of this section; a field declared None stays None for
    # __post_init__ to derive from the others (env.kwargs from env.id).
    kwargs = {f.name: None if f.default is None else getattr(default, f.name) for f in dataclasses.fields(cls)}
    edits = {}
    for name, value in values.items():
        key = f"{section}.{name}"
        if name not in hints:
            raise _unknown(key)
        if isinstance(value, _Edits):
            edits[name] = value
        else:
            kwargs[name] = _coerce(value, hints[name], key)
    try:
        built = cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"config section {section!r}: {exc}") from exc
    for name, edit in edits.items():
        setattr(built, name, _coerce({**(getattr(built, name) or {}), **edit}, hints[name], f"{section}.{name}"))
    return built


def config_from_dict(data: dict[str, Any]) -> Config:
    """Build and validate a :class:`Config` from a nested dict (missing keys keep their defaults)."""
    if not isinstance(data, dict):
        raise ConfigError(f"a config must be a mapping of sections, got {type(data).__name__}")
    sections = _section_types()
    built = {}
    for section, values in data.items():
        if section not in sections:
            raise _unknown(str(section))
        cls = sections[section]
        if not isinstance(values, dict):
            shorthand = getattr(cls, "_shorthand", None)
            if shorthand is None:
                raise ConfigError(f"config section {section!r} expects a mapping, got {values!r}")
            values = {shorthand: values}
        built[section] = _build_section(cls, values, section)
    config = Config(**built)
    validate(config)
    return config


def config_to_dict(config: Config) -> dict[str, Any]:
    """Plain nested dict (YAML/JSON-safe: tuples become lists)."""

    def plain(value: Any) -> Any:
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {s.name: plain(dataclasses.asdict(getattr(config, s.name))) for s in dataclasses.fields(config)}


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    sections = _section_types()
    parts = key.split(".")
    section = parts[0]
    if section not in sections:
        raise _unknown(key)
    cls = sections[section]
    current = data.setdefault(section, {})
    if not isinstance(current, dict):  # the YAML used the shorthand form (algo: gigpo)
        current = data[section] = {cls._shorthand: current}
    if len(parts) == 1:
        if isinstance(value, dict):
            current.update(value)
            return
        shorthand = getattr(cls, "_shorthand", None)
        if shorthand is None:
            raise ConfigError(f"config key {key!r} is a section; set one of its fields ({key}.FIELD=VALUE)")
        current[shorthand] = value
        return
    name = parts[1]
    hints = _field_hints(cls)
    if name not in hints:
        raise _unknown(f"{section}.{name}")
    if len(parts) == 2:
        current[name] = value
        return
    if dict not in (typing.get_origin(hints[name]), *map(typing.get_origin, typing.get_args(hints[name]))):
        raise _unknown(key)
    if current.get(name) is None:  # a sub-key override edits the default mapping rather than replacing it
        current[name] = _Edits()
    target = current[name]
    for part in parts[2:-1]:
        target = target.setdefault(part, {})
    target[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``'trainer.iterations=50'`` -> ``('trainer.iterations', 50)`` (value via yaml.safe_load)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form key=value")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {text!r}: cannot parse the value: {exc}") from None
    return key.strip(), value


def resolve_config_path(name_or_path: str) -> Path:
    """A YAML path, or the name of a bundled recipe in ``training/configs`` (``maze``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    recipes = Path(__file__).resolve().parent.parent / "training" / "configs"
    recipe = recipes / f"{name_or_path}.yaml"
    if recipe.is_file():
        return recipe
    known = ", ".join(sorted(p.stem for p in recipes.glob("*.yaml"))) or "none"
    raise ConfigError(f"config file {name_or_path!r} not found (bundled recipes: {known})")


def load_config(
    path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None
) -> Config:
    """Defaults <- ``base`` dict <- YAML file ``path`` <- ``overrides`` (``key=value`` strings)."""
    data: dict[str, Any] = yaml.safe_load(yaml.safe_dump(base)) if base else {}
    if path is not None:
        file_path = resolve_config_path(str(path))
        try:
            loaded = yaml.safe_load(file_path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {str(file_path)!r} is not valid YAML: {exc}") from None
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {str(file_path)!r} must hold a mapping of sections")
        for section, values in loaded.items():
            _set_dotted(data, str(section), values)
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(data, key, value)
    return config_from_dict(data)


def save_config(config: Config, path: str | Path) -> None:
    """Write ``config.yaml`` atomically: a reader (another learner resuming) never sees half a file."""
    path = Path(path)
    staging = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    staging.write_text(yaml.safe_dump(config_to_dict(config), sort_keys=False))
    os.replace(staging, path)


# ---- value checks ---------------------------------------------------------------------------------


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key!r}: {message}")


def validate(config: Config) -> None:
    """Range and consistency checks that types alone cannot express."""
    _require(bool(config.env.id.strip()), "env.id", "must not be empty")
    if config.env.anchor_key is not None:
        _require(config.env.anchor_key in KEY_KINDS, "env.anchor_key",
                 f"{config.env.anchor_key!r} is not one of {list(KEY_KINDS)} (or null for the environment's default)")
    _require(config.policy.lora_rank >= 0, "policy.lora_rank", "must be >= 0 (0 = full fine-tuning)")
    _require(config.policy.lora_alpha > 0, "policy.lora_alpha", "must be > 0")
    _require(bool(config.policy.lora_target_modules) and all(m.strip() for m in config.policy.lora_target_modules),
             "policy.lora_target_modules", "must name at least one module, e.g. [all-linear] or [q_proj, v_proj]")
    _require(config.engine.kv_cache_memory_bytes > 0, "engine.kv_cache_memory_bytes", "must be > 0")
    _require(config.engine.max_batch_size >= 1, "engine.max_batch_size", "must be >= 1")
    algo = config.algo
    _require(0 <= algo.gamma <= 1, "algo.gamma", f"must be in [0, 1], got {algo.gamma}")
    _require(algo.step_weight >= 0, "algo.step_weight", "must be >= 0")
    _require(algo.eps > 0, "algo.eps", "must be > 0")
    _require(algo.kl_coef is None or algo.kl_coef >= 0, "algo.kl_coef", "must be >= 0")
    _require(algo.invalid_penalty >= 0, "algo.invalid_penalty", "must be >= 0")
    _require(0 <= algo.negative_weight <= 1, "algo.negative_weight", f"must be in [0, 1], got {algo.negative_weight}")
    for name in algo.loss_kwargs:
        _require(name in LOSS_KWARGS, f"algo.loss_kwargs.{name}", f"unknown loss argument; choose from {list(LOSS_KWARGS)}")
    _require(algo.loss is None or algo.loss in LOSS_PRESETS, "algo.loss",
             f"unknown loss preset {algo.loss!r}; choose one of {sorted(LOSS_PRESETS)}")
    resolve_algorithm(algo)  # the parts the preset leaves open must combine (algo.advantage=none needs step credit)
    optim = config.optim
    _require(optim.lr > 0, "optim.lr", f"must be > 0, got {optim.lr}")
    _require(all(0 <= b < 1 for b in optim.betas), "optim.betas", "each beta must be in [0, 1)")
    _require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    _require(optim.adam_eps > 0, "optim.adam_eps", "must be > 0")
    _require(optim.grad_clip >= 0, "optim.grad_clip", "must be >= 0")
    _require(optim.epochs >= 1, "optim.epochs", "must be >= 1")
    _require(optim.minibatches >= 1, "optim.minibatches", "must be >= 1")
    _require(optim.minibatch_size >= 0, "optim.minibatch_size", "must be >= 0 (0 = use optim.minibatches)")
    rollout = config.rollout
    trajectories = rollout.n_groups * rollout.group_size
    if optim.minibatch_size == 0:
        _require(optim.minibatches <= trajectories, "optim.minibatches",
                 f"{optim.minibatches} minibatches exceed the {trajectories} trajectories of a round "
                 "(rollout.n_groups x rollout.group_size)")
    _require(optim.minibatch_size <= trajectories, "optim.minibatch_size",
             f"{optim.minibatch_size} trajectories leave no full minibatch: a round holds {trajectories} trajectories "
             "(rollout.n_groups x rollout.group_size)")
    _require(optim.micro_batch_size >= 1, "optim.micro_batch_size", "must be >= 1")
    _require(optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 (0 = no warmup)")
    sft = config.sft
    _require(sft.steps >= 0, "sft.steps", "must be >= 0")
    _require(sft.lr > 0, "sft.lr", "must be > 0")
    _require(sft.batch_size >= 1, "sft.batch_size", "must be >= 1")
    _require(sft.episodes >= 1, "sft.episodes", "must be >= 1")
    _require(0.0 <= sft.perturb < 1.0, "sft.perturb", "must be in [0, 1)")
    _require(0.0 <= sft.epsilon <= 1.0, "sft.epsilon", "must be in [0, 1]")
    _require(sft.dagger_episodes >= 0, "sft.dagger_episodes", "must be >= 0")
    _require(0.0 < sft.dagger_fraction < 1.0, "sft.dagger_fraction", "must be in (0, 1)")
    if sft.format_target is not None:
        _require(0.0 < sft.format_target <= 1.0, "sft.format_target", f"must be in (0, 1] or null, got {sft.format_target}")
    if sft.max_seconds is not None:
        _require(sft.max_seconds > 0, "sft.max_seconds", f"must be > 0 or null, got {sft.max_seconds}")
    trainer = config.trainer
    _require(trainer.iterations >= 0, "trainer.iterations", "must be >= 0")
    _require(trainer.eval_every >= 0, "trainer.eval_every", "must be >= 0")
    _require(trainer.eval_episodes >= 1, "trainer.eval_episodes", "must be >= 1")
    _require(trainer.confirm_episodes >= 0, "trainer.confirm_episodes", "must be >= 0 (0 = no confirmation)")
    _require(trainer.save_every >= 1, "trainer.save_every", "must be >= 1")
    if trainer.target_success is not None:
        _require(0 < trainer.target_success <= 1, "trainer.target_success", "must be in (0, 1] or null")
    if trainer.torch_threads is not None:
        _require(trainer.torch_threads >= 1, "trainer.torch_threads", "must be >= 1 or null")
    scale = config.scale
    _require(scale.env_actors >= 0, "scale.env_actors", "must be >= 0 (0 = in-process environments)")
    _require(scale.engine_replicas >= 0, "scale.engine_replicas", "must be >= 0 (0 = one in-process engine)")
    _require(scale.num_cpus_per_actor > 0, "scale.num_cpus_per_actor", "must be > 0")
    _require(scale.num_gpus_per_replica >= 0, "scale.num_gpus_per_replica", "must be >= 0")


# ---- resolution -------------------------------------------------------------------------------------


def vllm_available() -> bool:
    """Whether ``vllm`` imports in this environment (what ``engine=auto`` picks)."""
    try:
        importlib.import_module("vllm")
    except Exception:  # a broken install (e.g. CUDA-only torchvision) counts as absent
        return False
    return True


def resolve_algorithm(algo: AlgorithmConfig, norm_length: int | None = None) -> AlgorithmConfig:
    """A copy of ``algo`` with every part its preset decides filled in: ``advantage``, ``loss``,
    ``step_credit``, ``step_normalize``, ``kl_coef``, ``kl_estimator`` and all of ``loss_kwargs``
    (the loss preset under the given overrides). ``norm_length`` is Dr.GRPO's constant normalizer
    (``seq_mean_token_sum_norm``) when none is set. Resolving a resolved config changes nothing."""
    base = ALGORITHM_PRESETS[algo.preset]
    loss = algo.loss if algo.loss is not None else base["loss"]
    advantage = algo.advantage if algo.advantage is not None else base["advantage"]
    step_credit = algo.step_credit if algo.step_credit is not None else base["step_credit"]
    if advantage == "none" and not step_credit:
        raise ConfigError(
            "config key 'algo.advantage': 'none' leaves step credit as the only advantage, but step credit is "
            f"off for preset {algo.preset!r}; set algo.step_credit=true"
        )
    preset = {"cispo_cap": None, "norm_length": None, "kl_estimator": "k3", **LOSS_PRESETS[loss]}
    loss_kwargs = {key: algo.loss_kwargs.get(key, preset[key]) for key in LOSS_KWARGS}
    if loss_kwargs["norm_length"] is None and loss_kwargs["loss_agg"] == "seq_mean_token_sum_norm":
        loss_kwargs["norm_length"] = norm_length
    return dataclasses.replace(
        algo,
        advantage=advantage,
        loss=loss,
        step_credit=step_credit,
        step_normalize=algo.step_normalize if algo.step_normalize is not None else base["step_normalize"],
        loss_kwargs=loss_kwargs,
        kl_coef=float(algo.kl_coef if algo.kl_coef is not None else preset["kl_coef"]),
        kl_estimator=algo.kl_estimator if algo.kl_estimator is not None else preset["kl_estimator"],
    )


def default_anchor_key(env_id: str) -> str:
    """The anchor key kind registered for ``env_id`` (``envs.register_text_env``; ``module:ns/Name-vN``
    imports ``module`` first); ``observation`` for any other environment (a plain Gymnasium env, or a
    label for a user's environment factory)."""
    from envs import registry_id, text_env_specs  # gymnasium, no torch

    spec = text_env_specs().get(registry_id(env_id))
    return spec.default_anchor if spec is not None else "observation"


def make_configured_env(env: EnvConfig) -> Any:
    """``gymnasium.make(env.id, **env.kwargs)`` after importing ``env.imports``. An id that names no
    registered environment (or a ``module:`` that does not import) and an environment that refuses
    its kwargs raise a :class:`ConfigError` naming the keys."""
    import gymnasium as gym

    import envs

    try:
        envs.import_modules(env.imports)
        registered = envs.registry_id(env.id)
    except ImportError as exc:
        raise ConfigError(f"config key 'env.id' {env.id!r}: {exc}") from None
    if registered not in gym.registry:
        raise ConfigError(
            f"config key 'env.id': unknown environment {env.id!r}; registered text environments: "
            f"{', '.join(envs.text_env_specs())} (gym.register it in a module and name it as module:{registered}, "
            "or import that module with env.imports=[module] or --import)"
        )
    try:
        return envs.make_text_env(env.id, env.kwargs)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"config keys 'env.id' and 'env.kwargs': gymnasium.make({env.id!r}, **{env.kwargs!r}) failed: "
            f"{type(exc).__name__}: {exc}"
        ) from None


def resolve(config: Config, make_env: Callable[[], Any] | None = None) -> Config:
    """A copy of ``config`` with every open choice made, once for every consumer:

    - ``engine.kind``: ``auto`` is ``vllm`` when it imports, else ``hf``;
    - ``env.anchor_key``: None is the environment's registered default (after ``env.imports``);
    - ``sft.mode``: ``auto`` is ``envs.auto_sft_mode`` of one environment from ``make_env`` (the
      trainer's environment factory) or, without one, of :func:`make_configured_env`;
    - ``algo``: the preset's parts (:func:`resolve_algorithm`), with Dr.GRPO's ``norm_length`` set to
      ``rollout.max_new_tokens``.

    Resolving a resolved config changes nothing, so configs written before resolution existed (with
    ``auto`` and nulls) compare equal to their resolved form once resolved."""
    from envs import auto_sft_mode, import_modules

    resolved = copy.deepcopy(config)
    if resolved.engine.kind == "auto":
        resolved.engine.kind = "vllm" if vllm_available() else "hf"
    if resolved.env.anchor_key is None:
        import_modules(resolved.env.imports)
        resolved.env.anchor_key = default_anchor_key(resolved.env.id)
    if resolved.sft.mode == "auto":
        env = make_env() if make_env is not None else make_configured_env(resolved.env)
        try:
            resolved.sft.mode = auto_sft_mode(env)
        finally:
            env.close()
    resolved.algo = resolve_algorithm(resolved.algo, norm_length=resolved.rollout.max_new_tokens)
    validate(resolved)
    return resolved
