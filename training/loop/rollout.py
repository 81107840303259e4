"""The episode loop, and multi-turn rollouts: environments + engine -> ``StepBatch`` (one row per turn).

``play_episodes`` is the one loop that plays episodes in a pool of environments, whoever chooses
the actions: an ``actor`` answers every active episode of a turn at once. :class:`PolicyActor`
prompts an engine (rollouts, evaluation); ``agent_rl.training.loop.sft``'s demonstration actor plays oracle plans
or random admissible actions (warm-start demonstrations).

``collect_rollouts`` runs ``n_groups x group_size`` environments. The members of a group reset with
the same seed, so they share the initial state; groups get distinct seeds from the caller's
``numpy.random.Generator``. Every turn, all active environments are prompted in one batched
``engine.generate`` call; each completion is parsed into an action and stepped, and the turn becomes
one row holding the exact prompt/response token ids and engine logprobs.

Decisions worth knowing:
- Output with no parsable action (empty text, a missing ``<action>`` tag) is sent as the empty
  command: the environment answers "invalid action" and the row has ``action_valid = False``.
- A trajectory whose environment raises (in ``reset`` or ``step``), or breaks its contract (an
  observation that is not a string, a reward that is not finite), is *failed*: all its rows are
  dropped from the batch, it is counted in ``stats["failed_trajectories"]`` and its reason kept in
  ``stats["failures"]``, and the others go on.
- ``done`` is True on the last row of every trajectory; ``truncated`` when it ended by the
  environment's time limit or by ``max_turns`` rather than by termination.
- Overlong shaping (DAPO): a response at the token limit gets ``-overlong_penalty`` added to its
  reward, ramped linearly over the last ``overlong_buffer`` tokens before the limit. The added amount
  is kept in ``batch.extras["overlong_penalty"]``; ``batch.extras["seed"]`` holds the reset seed.
- Dynamic sampling (DAPO): groups whose trajectory returns are all equal (zero advantage signal) are
  dropped and new groups are collected until ``n_groups`` are kept or ``max_resample_rounds`` extra
  rounds ran; the batch may then hold fewer groups (possibly none).
- ``min_batch_rows``: while the kept groups hold fewer rows than that, another round of ``n_groups``
  groups is played (within the same ``max_resample_rounds``), so short episodes still fill a batch.
- Reverse curriculum (``target_pass_rate``): with a ``replay_share`` above 0, each group starts
  part-way along the oracle's plan for its seed (:func:`replay_depths` of its actions are played for
  every member, shown in the history, never rows); the trainer moves the share toward the target
  pass rate after each iteration (:func:`next_replay_share`).
- Progress shaping (``progress_reward``): each turn's reward gets ``progress_reward x (d(s) - d(s'))``,
  ``d`` the oracle's distance to a win (:func:`oracle_distances`); the added amount is kept in
  ``batch.extras["progress_reward"]``.
- ``action_mode=admissible``: on turns whose environment lists admissible actions the policy
  chooses one of them (:class:`ChoosingActor`, :func:`constrained_choices`) instead of writing a
  reply; its draws come from the round's seeds, so the seed stream is the generating mode's. With
  ``choice_logprobs=choice`` (the default) such a row's old logprobs are the choice's, and
  ``batch.choice_ids`` holds the tokens it offered at each position (:func:`learns_choices`).
- Statistics describe every trajectory played in the call, dropped groups included (they measure the
  policy, not the batch).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Protocol, Sequence

import numpy as np

from agent_rl.config import RolloutConfig, check_rollout
from agent_rl.core.batch import StepBatch
from agent_rl.envs.base import step_won
from agent_rl.training.models.prompts import PromptFormat, Turn
from agent_rl.training.serving.engines import Engine, SamplingParams
from agent_rl.training.serving.envpool import EnvFactory, EnvPool, EnvResult, env_pool

SEED_HIGH = 2**31 - 1


def sampling_params(config: RolloutConfig, greedy: bool = False) -> SamplingParams:
    """The engine's sampling parameters for a rollout config (greedy for evaluation)."""
    return SamplingParams(config.temperature, config.top_p, config.max_new_tokens, greedy=greedy)


@dataclass
class Episode:
    """One trajectory being played: its pool slot, what the agent saw, and the rows so far."""

    slot: int
    seed: int
    group: int
    task: str = ""
    observation: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    history: list[Turn] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)
    finished: bool = False
    failure: str | None = None
    """``"ExceptionType: message"`` when the environment raised; the trajectory is then discarded."""

    @property
    def total_return(self) -> float:
        return float(sum(row["reward"] for row in self.rows))

    @property
    def admissible_actions(self) -> list[str] | None:
        return self.info.get("admissible_actions")

    @property
    def replayed(self) -> int:
        """Oracle actions played before the policy's first turn (the reverse curriculum): the turns of
        the history that hold no row."""
        return len(self.history) - len(self.rows)


@dataclass
class Move:
    """What an actor does on one turn of one episode."""

    action: str | None
    """The command sent to the environment; None ends the episode here, without a step."""
    prompt_ids: Sequence[int] = ()
    """The prompt the action answers (empty where no model was asked and nothing is learned)."""
    response_ids: Sequence[int] = ()
    """The tokens that write the action."""
    logprobs: Sequence[float] = ()
    """The engine's logprob of each response token (empty for demonstrations)."""
    finish_reason: str = "stop"
    """``"length"`` when the response hit the token limit."""
    parsed: bool = True
    """Whether an action was found in the response (False: the empty command, an invalid action)."""
    learn: bool = True
    """Whether the turn is a training example (a demonstration's perturbed turn is not)."""
    explored: bool = False
    """Whether the rollout played a random admissible action in place of the policy's reply
    (``rollout.explore_rate``); its ``logprobs`` are placeholders for the learner to score."""
    greedy: bool = False
    """Whether a training rollout decoded this reply greedily (``rollout.greedy_members``); its
    ``logprobs`` are greedy decoding's, so the learner scores it at the sampling temperature."""
    choice_ids: np.ndarray | None = None
    """With ``rollout.choice_logprobs=choice``, for a reply chosen among the listed actions: the
    token ids decoding constrained to the list could write at each of its positions, ``(tokens,
    K)`` padded with -1; its ``logprobs`` are then the constrained ones. None otherwise."""


class Actor(Protocol):
    def act(self, episodes: list[Episode]) -> list[Move]:
        """One move for each of ``episodes`` (the active episodes of one turn)."""
        ...


@dataclass
class PlayStats:
    """Counters accumulated while playing episodes."""

    tokens: int = 0
    generate_seconds: float = 0.0
    turns: int = 0


def turn_prompt_ids(prompt_format: PromptFormat, tokenizer, episode: Episode) -> list[int]:
    """The prompt of ``episode``'s current turn."""
    return prompt_format.prompt_ids(
        tokenizer, episode.task, episode.history, episode.observation, episode.admissible_actions
    )


class PolicyActor:
    """The policy: prompts every active episode in one batched ``engine.generate`` call and parses
    each completion into an action."""

    def __init__(
        self, engine: Engine, tokenizer, prompt_format: PromptFormat, sampling: SamplingParams, stats: PlayStats
    ):
        self.engine, self.tokenizer, self.format, self.sampling, self.stats = (
            engine,
            tokenizer,
            prompt_format,
            sampling,
            stats,
        )

    def act(self, episodes: list[Episode]) -> list[Move]:
        prompts = [turn_prompt_ids(self.format, self.tokenizer, e) for e in episodes]
        start = time.perf_counter()
        completions = self.engine.generate(prompts, 1, self.sampling)
        self.stats.generate_seconds += time.perf_counter() - start
        moves = []
        for episode, prompt, (completion,) in zip(episodes, prompts, completions):
            text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
            action, found = self.format.parse(text, episode.admissible_actions)
            moves.append(
                Move(action, prompt, completion.token_ids, completion.logprobs, completion.finish_reason, found)
            )
        return moves


def split_moves(
    episodes: list[Episode],
    mask: Sequence[bool],
    masked: Callable[[list[Episode]], list[Move]],
    others: Callable[[list[Episode]], list[Move]],
) -> list[Move]:
    """Moves for ``episodes``, in their order: ``masked`` answers those where ``mask`` holds and
    ``others`` the rest, each in one call, made only when it has an episode to answer."""

    def answers(actor: Callable[[list[Episode]], list[Move]], wanted: bool) -> Iterator[Move]:
        chosen = [e for e, x in zip(episodes, mask, strict=True) if bool(x) == wanted]
        return iter(actor(chosen) if chosen else [])

    picked, rest = answers(masked, True), answers(others, False)
    return [next(picked) if x else next(rest) for x in mask]


def choose_in_segments(scores: np.ndarray, counts: Sequence[int], rng: np.random.Generator | None) -> np.ndarray:
    """For each run of ``counts`` consecutive ``scores`` (log-weights), the index (into ``scores``) of
    one drawn with probability ``softmax`` over its run (Gumbel-max with ``rng``), or of its largest
    (the first of equals) when ``rng`` is None."""
    scores, counts = np.asarray(scores, dtype=np.float64), np.asarray(counts, dtype=np.int64)
    if counts.size == 0:
        return np.zeros(0, dtype=np.int64)
    if (counts < 1).any() or counts.sum() != scores.size:
        raise ValueError(f"each run needs at least one score and the runs must cover all {scores.size} scores")
    keys = scores if rng is None else scores + rng.gumbel(size=scores.size)
    run = np.repeat(np.arange(counts.size), counts)
    order = np.lexsort((np.arange(scores.size), -keys, run))  # per run: largest key first, then listed first
    return order[np.cumsum(counts) - counts]


def constrained_choices(
    replies: Sequence[Sequence[int]], token_logprobs: Sequence[np.ndarray], counts: Sequence[int]
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Decoding that may only continue one of the replies of its run (``counts`` consecutive replies
    per run, distinct, none a prefix of another: each ends with EOS), per reply: each token's
    logprob under it, the token's logprob minus the log of the summed probability of the distinct
    tokens that continue its prefix within the run (0 where no other reply branches off), and those
    tokens' ids, ``(tokens, K)`` padded with -1 (K: the most any of its positions offers). Each
    run's summed logprobs exponentiate to probabilities that sum to 1."""
    counts = np.asarray(counts, dtype=np.int64)
    if counts.size == 0:
        return [], []
    runs, most, width = counts.size, int(counts.max()), max(len(r) for r in replies)
    # Runs padded to [run, reply, token]; a padded reply or token is not valid.
    run, member = (
        np.repeat(np.arange(runs), counts),
        np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts),
    )
    tokens, logp = np.full((runs, most, width), -1, dtype=np.int64), np.zeros((runs, most, width))
    for r, m, reply, values in zip(run, member, replies, token_logprobs, strict=True):
        tokens[r, m, : len(reply)], logp[r, m, : len(reply)] = reply, values
    valid = tokens >= 0
    # same_node[r, i, j, t]: replies i and j agree on their tokens 0..t.
    agree = (tokens[:, :, None] == tokens[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    same_node = np.cumprod(agree, axis=3).astype(bool)
    shares_prefix = np.concatenate([np.ones((runs, most, most, 1), dtype=bool), same_node[..., :-1]], axis=3)
    # The first reply through each node speaks for it, so a token two replies share counts once.
    earlier = np.triu(np.ones((most, most), dtype=bool), k=1)[None, :, :, None]  # [., i, j, .]: i < j
    first = valid & ~(same_node & earlier).any(axis=1)
    offered = shares_prefix & first[:, :, None, :] & valid[:, None, :, :]  # [r, i, j, t]: i's token, a branch of j's
    branches = np.where(offered, logp[:, :, None, :], -np.inf)
    peak = branches.max(axis=1)
    peak = np.where(np.isfinite(peak), peak, 0.0)  # a padded position has no branch
    with np.errstate(divide="ignore"):
        normalizer = peak + np.log(np.exp(branches - peak[:, None]).sum(axis=1))
    chosen = np.where(valid, logp - normalizer, 0.0)[run, member]
    # Each position's offered tokens, first the listed order's, then the padding (a stable sort).
    options = np.where(offered, tokens[:, :, None, :], -1).transpose(0, 2, 3, 1)[run, member]  # [reply, t, i]
    options = np.take_along_axis(options, np.argsort(options < 0, axis=2, kind="stable"), axis=2)
    widths = np.maximum((options >= 0).sum(axis=2).max(axis=1), 1)
    lengths = [len(r) for r in replies]
    return [v[:n] for v, n in zip(chosen, lengths)], [o[:n, :k] for o, n, k in zip(options, lengths, widths)]


def listed_replies(
    prompt_format: PromptFormat, tokenizer, admissible: Sequence[str]
) -> tuple[list[str], list[list[int]]]:
    """The distinct listed actions (an action listed twice is one), in the list's order, and the
    reply that writes each."""
    listed = list(dict.fromkeys(admissible))
    return listed, [prompt_format.response_ids(tokenizer, action) for action in listed]


class ChoosingActor:
    """``rollout.action_mode=admissible``: on each turn of an episode whose environment lists
    admissible actions, the policy plays one of them, drawn as decoding constrained to the list
    would draw it: each token from the policy's distribution at the sampling temperature
    renormalized over the tokens that continue a listed action (:func:`constrained_choices` of the
    replies' token logprobs from ``engine.score``); greedy plays the most probable action, scored at
    temperature 1 as greedy generation reports. The move carries the chosen reply's tokens and their
    logprobs: unconstrained, or with ``constrained`` those of the choice and the tokens offered at
    each position (``Move.choice_ids``), which the learner renormalizes over alike. Episodes without
    a list are the policy's to generate."""

    def __init__(self, policy: PolicyActor, rng: np.random.Generator, constrained: bool = False):
        if not callable(getattr(policy.engine, "score", None)):
            raise ValueError(
                f"rollout.action_mode=admissible scores the admissible actions with engine.score(), and "
                f"{type(policy.engine).__name__} has none"
            )
        self.policy, self.rng, self.constrained = policy, rng, constrained
        self.format, self.tokenizer = policy.format, policy.tokenizer

    def act(self, episodes: list[Episode]) -> list[Move]:
        return split_moves(episodes, [bool(e.admissible_actions) for e in episodes], self._choose, self.policy.act)

    def _choose(self, episodes: list[Episode]) -> list[Move]:
        sampling = self.policy.sampling
        prompts = [turn_prompt_ids(self.format, self.tokenizer, e) for e in episodes]
        listed = [listed_replies(self.format, self.tokenizer, e.admissible_actions) for e in episodes]
        counts = [len(actions) for actions, _ in listed]
        actions = [a for each, _ in listed for a in each]
        replies = [r for _, each in listed for r in each]
        start = time.perf_counter()
        scored = self.policy.engine.score(
            [p for p, k in zip(prompts, counts) for _ in range(k)],
            replies,
            1.0 if sampling.greedy else sampling.temperature,
        )
        self.policy.stats.generate_seconds += time.perf_counter() - start
        chosen, choice_ids = constrained_choices(replies, scored, counts)
        picks = choose_in_segments([values.sum() for values in chosen], counts, None if sampling.greedy else self.rng)
        self.policy.stats.tokens += sum(len(replies[i]) for i in picks)
        if self.constrained:
            return [
                Move(actions[i], p, replies[i], chosen[i].tolist(), choice_ids=choice_ids[i])
                for p, i in zip(prompts, picks)
            ]
        return [Move(actions[i], prompt, replies[i], scored[i].tolist()) for prompt, i in zip(prompts, picks)]


CHOICE_STREAM = 0x43484F
"""Mixed into the seeds of ``ChoosingActor``'s generator, so that its draws are not the explorer's."""


def learns_choices(config: RolloutConfig) -> bool:
    """Whether rows are learned as choices among the listed actions (``choice_logprobs=choice``):
    only ``action_mode=admissible`` chooses; a generated reply, or one explored in its place, was
    written freely and is learned as such."""
    return config.action_mode == "admissible" and config.choice_logprobs == "choice"


def policy_actor(
    engine: Engine,
    tokenizer,
    config: RolloutConfig,
    stats: PlayStats,
    *,
    greedy: bool = False,
    seeds: Sequence[int] = (),
) -> PolicyActor | ChoosingActor:
    """The policy as ``config.action_mode`` plays it; a :class:`ChoosingActor` draws from a generator
    seeded by ``seeds`` (the episodes' reset seeds), so a rerun draws the same."""
    policy = PolicyActor(engine, tokenizer, PromptFormat.from_rollout(config), sampling_params(config, greedy), stats)
    if config.action_mode == "admissible":
        rng = np.random.default_rng([CHOICE_STREAM, *(int(s) for s in seeds)])
        return ChoosingActor(policy, rng, constrained=learns_choices(config))
    return policy


class GreedyMembersActor:
    """``rollout.greedy_members``: the episodes in ``greedy_slots`` play the greedy policy, the others
    the sampling one; the greedy moves are marked (``Move.greedy``) for the learner to score."""

    def __init__(self, sampled: PolicyActor | ChoosingActor, greedy: PolicyActor | ChoosingActor, greedy_slots):
        self.policy, self.greedy, self.greedy_slots = sampled, greedy, frozenset(greedy_slots)
        self.format, self.tokenizer = sampled.format, sampled.tokenizer  # as ExploringActor writes its moves

    def act(self, episodes: list[Episode]) -> list[Move]:
        return split_moves(
            episodes,
            [e.slot in self.greedy_slots for e in episodes],
            lambda chosen: [replace(move, greedy=True) for move in self.greedy.act(chosen)],
            self.policy.act,
        )


class ExploringActor:
    """The policy, except that each turn of an episode whose environment lists admissible actions
    plays a uniformly random one of them with probability ``rate`` (``rollout.explore_rate``). That
    move is written as the policy writes the action; its logprobs are zeros for the learner to
    score (``Move.explored``), since no engine sampled it, and with ``constrained`` it carries the
    tokens a choice among the listed actions offers (``Move.choice_ids``)."""

    def __init__(
        self, policy: PolicyActor | ChoosingActor, rate: float, rng: np.random.Generator, constrained: bool = False
    ):
        self.policy, self.rate, self.rng, self.constrained = policy, rate, rng, constrained

    def act(self, episodes: list[Episode]) -> list[Move]:
        listed = np.array([bool(e.admissible_actions) for e in episodes])
        explore = (self.rng.random(len(episodes)) < self.rate) & listed
        return split_moves(episodes, explore, lambda explored: [self._explore(e) for e in explored], self.policy.act)

    def _explore(self, episode: Episode) -> Move:
        admissible = episode.admissible_actions
        action = admissible[int(self.rng.integers(len(admissible)))]
        prompt_format, tokenizer = self.policy.format, self.policy.tokenizer
        response = prompt_format.response_ids(tokenizer, action)
        prompt = turn_prompt_ids(prompt_format, tokenizer, episode)
        choice_ids = None
        if self.constrained:
            listed, replies = listed_replies(prompt_format, tokenizer, admissible)
            _, offered = constrained_choices(replies, [np.zeros(len(r)) for r in replies], [len(replies)])
            choice_ids = offered[listed.index(action)]
        return Move(action, prompt, response, [0.0] * len(response), explored=True, choice_ids=choice_ids)


def overlong_shaping(lengths: np.ndarray, max_new_tokens: int, penalty: float, buffer: int) -> np.ndarray:
    """DAPO soft overlong punishment: 0 up to ``max_new_tokens - buffer`` tokens, then a linear ramp
    to ``-penalty`` at the limit (a step at the limit when ``buffer == 0``)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer == 0:
        return np.where(lengths >= max_new_tokens, -penalty, 0.0)
    return -penalty * np.clip((lengths - (max_new_tokens - buffer)) / buffer, 0.0, 1.0)


def replay_depths(plan_lengths: np.ndarray, share: float) -> np.ndarray:
    """Actions of each oracle plan the reverse curriculum plays before the policy: ``floor(share *
    length)``, leaving at least the plan's last action to the policy (0 for an empty plan)."""
    lengths = np.asarray(plan_lengths, dtype=np.int64)
    return np.minimum(np.floor(share * lengths).astype(np.int64), np.maximum(lengths - 1, 0))


def next_replay_share(share: float, pass_rate: float, target: float, step: float) -> float:
    """The replayed share for the next iteration: ``step`` more while the pass rate is below
    ``target``, ``step`` less while above, within [0, 1]. Rounded, so that steps of 0.1 land on
    tenths and :func:`replay_depths` floors ``0.8 * 5`` to 4, not 3."""
    return round(float(np.clip(share + step * np.sign(target - pass_rate), 0.0, 1.0)), 12)


def replay_plans(pool: EnvPool, episodes: list[Episode], share: float) -> None:
    """Play the first :func:`replay_depths` actions of each group's oracle plan in every member of the
    group (its first member's plan: the members share their seed), as turns of the history that hold
    no rows. A plan the environment cannot give replays nothing; a replay that ends or breaks an
    episode fails it, and so does an oracle call that fails."""
    leaders = {}
    for episode in episodes:
        if episode.failure is None:
            leaders.setdefault(episode.group, episode)
    plans = dict(zip(leaders, oracle_plans(pool, list(leaders.values()))))
    depth = dict(zip(plans, replay_depths(np.array([len(p) for p in plans.values()]), share)))
    for turn in range(max(depth.values(), default=0)):
        moving = [e for e in episodes if e.failure is None and depth.get(e.group, 0) > turn]
        actions = [plans[e.group][turn] for e in moving]
        for episode, action, result in zip(moving, actions, pool.step([e.slot for e in moving], actions)):
            failure = result_failure("step", turn, result)
            if failure is None and (result.terminated or result.truncated):
                failure = f"ReplayError: the oracle plan's action {turn + 1} ({action!r}) ended the episode"
            if failure is not None:
                _fail(episode, failure)
                continue
            episode.history.append(Turn(episode.observation, action))
            episode.observation, episode.info = result.observation, result.info


def play_episodes(
    pool: EnvPool,
    actor: Actor,
    seeds: Sequence[int],
    groups: Sequence[int],
    config: RolloutConfig,
    stats: PlayStats,
    progress: Any = None,
    replay_share: float = 0.0,
    progress_reward: float = 0.0,
) -> list[Episode]:
    """Play one episode per seed, in pool slots ``0..len(seeds)-1``, to the end (or ``max_turns``):
    each turn the actor moves in every active episode and the pool steps them all in one call. With
    ``replay_share`` above 0, each group first replays part of its oracle plan (:func:`replay_plans`);
    with ``progress_reward`` above 0, each turn's reward is shaped by the oracle's distance to a win."""
    if len(seeds) > pool.n_envs:
        raise ValueError(f"{len(seeds)} episodes need more than the pool's {pool.n_envs} environments")
    episodes = [Episode(slot, int(seed), int(group)) for slot, (seed, group) in enumerate(zip(seeds, groups))]
    for episode, result in zip(episodes, pool.reset([e.slot for e in episodes], [e.seed for e in episodes])):
        failure = result_failure("reset", 0, result)
        if failure is not None:  # a broken environment fails its own trajectory only
            _fail(episode, failure)
        else:
            episode.observation, episode.info = result.observation, result.info
            episode.task = str(result.info.get("task", ""))
    if replay_share > 0:
        replay_plans(pool, episodes, replay_share)
    distance: dict[int, float] = {}  # each slot's oracle distance to a win, for progress shaping
    if progress_reward:
        live = [e for e in episodes if e.failure is None]
        distance = dict(zip([e.slot for e in live], oracle_distances(pool, live, [None] * len(live), config.max_turns)))
    task_id = progress.add_task(f"rollout {pool.env_id}", total=config.max_turns) if progress is not None else None
    for turn in range(config.max_turns):
        active = [e for e in episodes if not e.finished]
        if not active:
            break
        moves = actor.act(active)
        for episode, move in zip(active, moves):
            # The actor ends it (an oracle with no plan left), or its oracle call failed it.
            episode.finished = move.action is None or episode.failure is not None
        stepping = [(e, m) for e, m in zip(active, moves) if not e.finished]
        results = pool.step([e.slot for e, _ in stepping], [m.action for _, m in stepping]) if stepping else []
        bonus = np.zeros(len(results))
        if progress_reward:
            stepped = [i for i, result in enumerate(results) if result.failure is None]
            slots = [stepping[i][0].slot for i in stepped]
            before = np.array([distance[slot] for slot in slots])
            after = oracle_distances(
                pool, [stepping[i][0] for i in stepped], [results[i] for i in stepped], config.max_turns
            )
            bonus[stepped] = progress_reward * (before - after)
            distance.update(zip(slots, after))
        for (episode, move), result, progress_bonus in zip(stepping, results, bonus):
            stats.tokens += len(move.response_ids)
            if episode.failure is not None:  # its oracle call after the step failed it
                continue
            _record(
                episode, move, result, config, last_turn=turn == config.max_turns - 1, progress=float(progress_bonus)
            )
        stats.turns += len(stepping)
        if task_id is not None:
            progress.update(task_id, advance=1)
    if task_id is not None:
        progress.remove_task(task_id)
    return episodes


def won(result: EnvResult) -> bool:
    """Whether a step's result is a win (``agent_rl.envs.step_won``)."""
    return step_won(result.info, result.terminated, result.reward)


def oracle_distances(
    pool: EnvPool, episodes: Sequence[Episode], results: Sequence[EnvResult | None], no_plan: float
) -> np.ndarray:
    """Each episode's distance to a win from its environment's current state, reached by its step's
    result (None: its reset): 0 once won, ``no_plan`` where no plan is left (a dead state, or the
    episode terminated without a win), else the length of the oracle's plan. An oracle call that
    fails fails its episode (:func:`oracle_plans`)."""
    lengths = np.array([len(plan) for plan in oracle_plans(pool, episodes)], dtype=np.float64)
    wins = np.array([r is not None and won(r) for r in results], dtype=bool)
    lost = np.array([r is not None and r.terminated for r in results], dtype=bool) & ~wins
    return np.where(wins, 0.0, np.where((lengths > 0) & ~lost, lengths, no_plan))


def oracle_plans(pool: EnvPool, episodes: Sequence[Episode]) -> list[list[str]]:
    """Each episode's oracle plan from its environment's current state (empty: won, or no winning
    plan is left); an episode whose oracle call raised or hung fails, and gets an empty plan."""
    plans = pool.oracle([e.slot for e in episodes])
    for episode, plan in zip(episodes, plans):
        if plan.failure is not None:
            _fail(episode, plan.failure)
    return [plan.actions for plan in plans]


def _fail(episode: Episode, failure: str) -> None:
    episode.failure = failure
    episode.finished = True


def result_failure(call: str, turn: int, result: EnvResult) -> str | None:
    """Why ``result`` of ``call`` (``reset`` or ``step``) for ``turn`` fails its trajectory: the
    environment's own failure, or a breach of the text-environment contract (an observation that is
    not a string, a reward that is not finite) in the same form
    (``agent_rl.training.serving.envpool``); None when it does not."""
    if result.failure is not None:
        return result.failure
    if not isinstance(result.observation, str):
        what = f"an observation of type {type(result.observation).__name__}, not str"
    elif not np.isfinite(result.reward):
        what = f"the reward {result.reward}, not a finite number"
    else:
        return None
    return f"ContractError: {call}() returned {what}, at turn {turn} (in {call}())"


def _record(
    episode: Episode, move: Move, result: EnvResult, config: RolloutConfig, last_turn: bool, progress: float = 0.0
) -> None:
    """Append the turn's row: every column of ``agent_rl.core.batch.ROW_COLUMNS``, and what the rollout
    keeps beside them. ``progress`` is the turn's progress shaping, added to its reward."""
    failure = result_failure("step", len(episode.rows), result)
    if failure is not None:
        _fail(episode, failure)
        return
    observation, reward, terminated, truncated, info = (
        result.observation,
        result.reward,
        result.terminated,
        result.truncated,
        result.info,
    )
    # An explored reply was written by the rollout, not generated: the policy's length is not in it.
    length = 0 if move.explored else len(move.response_ids)
    shaping = float(overlong_shaping(length, config.max_new_tokens, config.overlong_penalty, config.overlong_buffer))
    done = bool(terminated or truncated or last_turn)
    episode.rows.append(
        {
            "t": len(episode.rows),
            "reward": float(reward) + shaping + progress,
            "overlong_penalty": shaping,
            "progress_reward": progress,
            "done": done,
            "truncated": done and not terminated,
            "action_valid": bool(move.parsed and info.get("action_valid", True)),
            "won": won(result),
            "overlong": move.finish_reason == "length",
            "learn": move.learn,
            "explored": move.explored,
            "greedy": move.greedy,
            "prompt_ids": np.asarray(move.prompt_ids, dtype=np.int64),
            "response_ids": np.asarray(move.response_ids, dtype=np.int64),
            "old_logprobs": np.asarray(move.logprobs, dtype=np.float32),
            "choice_ids": np.zeros((0, 0), dtype=np.int64) if move.choice_ids is None else move.choice_ids,
            # The state the action was taken in (not the one it led to): GiGPO groups by it.
            "observation": episode.observation,
            "error": episode.info.get("error"),
            "anchor_state": str(episode.info.get("anchor", episode.observation)),
            "admissible": episode.admissible_actions,
            "action": move.action,
        }
    )
    episode.history.append(Turn(episode.observation, move.action))
    episode.observation, episode.info = observation, info
    episode.finished = done


def episodes_to_batch(episodes: Sequence[Episode], group_ids: Sequence[int], first_traj_id: int = 0) -> StepBatch:
    """A ``StepBatch`` of the given (successful) episodes, trajectories contiguous and in time order."""
    rows = [row for episode in episodes for row in episode.rows]
    lengths = [len(episode.rows) for episode in episodes]
    return StepBatch.from_rows(
        rows,
        group_id=np.repeat(np.asarray(group_ids, dtype=np.int64), lengths),
        traj_id=np.repeat(np.arange(first_traj_id, first_traj_id + len(episodes)), lengths),
        extras={
            "overlong_penalty": np.asarray([row["overlong_penalty"] for row in rows], dtype=np.float64),
            "progress_reward": np.asarray([row["progress_reward"] for row in rows], dtype=np.float64),
            "seed": np.repeat(np.asarray([e.seed for e in episodes], dtype=np.int64), lengths),
            "explored": np.asarray([row["explored"] for row in rows], dtype=bool),
            "greedy": np.asarray([row["greedy"] for row in rows], dtype=bool),
        },
    )


def draw_seeds(rng: np.random.Generator, count: int, used: set[int]) -> list[int]:
    """``count`` seeds from ``rng``, distinct from each other and from ``used`` (which is updated)."""
    seeds: list[int] = []
    while len(seeds) < count:
        seed = int(rng.integers(0, SEED_HIGH))
        if seed not in used:
            used.add(seed)
            seeds.append(seed)
    return seeds


def collect_rollouts(
    envs: EnvPool | EnvFactory,
    engine: Engine,
    tokenizer,
    config: RolloutConfig,
    rng: np.random.Generator,
    *,
    progress: Any = None,
    replay_share: float = 0.0,
) -> tuple[StepBatch, dict[str, float]]:
    """Collect one batch of grouped trajectories; see the module docstring for the rules.

    ``envs`` is a pool of at least ``n_groups * group_size`` environments (``LocalEnvPool``,
    ``RayEnvPool``) or an environment factory, from which a local pool is built for the call.
    ``progress`` is an optional ``rich.progress.Progress`` to show turns on. ``replay_share`` is the
    reverse curriculum's share of each oracle plan played before the policy (0: none)."""
    check_rollout(config)
    play = PlayStats()
    start = time.perf_counter()
    used: set[int] = set()
    kept: list[list[Episode]] = []
    played: list[Episode] = []
    dropped_groups = rounds = 0
    while True:
        missing = config.n_groups - len(kept)  # dynamic sampling refills the groups it dropped
        seeds = draw_seeds(rng, missing if missing > 0 else config.n_groups, used)
        round_seeds = np.repeat(seeds, config.group_size)
        round_groups = np.repeat(np.arange(len(seeds)), config.group_size)
        round_actor = policy_actor(engine, tokenizer, config, play, seeds=seeds)
        if config.greedy_members:  # each group's seeds are consecutive slots: its first members play greedily
            greedy_actor = policy_actor(engine, tokenizer, config, play, greedy=True, seeds=seeds)
            greedy_slots = np.flatnonzero(np.arange(len(round_seeds)) % config.group_size < config.greedy_members)
            round_actor = GreedyMembersActor(round_actor, greedy_actor, greedy_slots.tolist())
        if config.explore_rate:  # its own numbers, from the round's seeds: the seed stream stays the same
            round_actor = ExploringActor(
                round_actor,
                config.explore_rate,
                np.random.default_rng(seeds),
                constrained=learns_choices(config),
            )
        with env_pool(envs, len(round_seeds)) as pool:
            episodes = play_episodes(
                pool,
                round_actor,
                round_seeds,
                round_groups,
                config,
                play,
                progress,
                replay_share,
                config.progress_reward,
            )
        played += episodes
        rounds += 1
        for group in range(len(seeds)):
            members = [e for e in episodes if e.group == group and e.failure is None]
            returns = np.array([e.total_return for e in members])
            if config.dynamic_sampling and (len(members) < 2 or np.ptp(returns) == 0):
                dropped_groups += 1
            elif members:
                kept.append(members)
        groups_short = config.dynamic_sampling and len(kept) < config.n_groups
        rows_short = sum(len(e.rows) for members in kept for e in members) < config.min_batch_rows
        if not (groups_short or rows_short) or rounds > config.max_resample_rounds:
            break
    episodes = [e for members in kept for e in members]
    group_ids = [g for g, members in enumerate(kept) for _ in members]
    batch = episodes_to_batch(episodes, group_ids)
    stats = episode_stats(played, play, time.perf_counter() - start)
    stats.update(
        dropped_groups=float(dropped_groups),
        rounds=float(rounds),
        batch_groups=float(len(kept)),
        batch_rows=float(len(batch)),
    )
    return batch, stats


def split_failed(episodes: Sequence[Episode]) -> tuple[list[Episode], list[str]]:
    """The episodes that played to their end, and why each of the others failed (its environment
    raised, hung or broke its contract)."""
    return [e for e in episodes if e.failure is None], [e.failure for e in episodes if e.failure is not None]


def episode_stats(episodes: Sequence[Episode], play: PlayStats, seconds: float) -> dict[str, Any]:
    """Success rate, return, length, invalid-action and overlong rates over the successful episodes,
    plus failure count, generation throughput and ``failures``: why each failed episode failed."""
    done, failures = split_failed(episodes)
    rows = [row for e in done for row in e.rows]

    def mean(values: list[Any]) -> float:
        return float(np.mean(values)) if len(values) else 0.0

    return {
        "trajectories": float(len(done)),
        "failed_trajectories": float(len(episodes) - len(done)),
        "failures": failures,
        "success_rate": mean([bool(e.rows and e.rows[-1]["won"]) for e in done]),
        "mean_return": mean([e.total_return for e in done]),
        "mean_length": mean([len(e.rows) for e in done]),
        "invalid_action_rate": mean([not row["action_valid"] for row in rows]),
        "explored_rate": mean([row["explored"] for row in rows]),
        "replayed_turns": mean([e.replayed for e in done]),
        "progress_reward": mean([sum(row["progress_reward"] for row in e.rows) for e in done]),
        "action_entropy": action_entropy([row["action"] for row in rows]),
        "loop_rate": mean([ended_in_loop(e.rows) for e in done]),
        "overlong_rate": mean([row["overlong"] for row in rows]),
        "tokens_generated": float(play.tokens),
        "tokens_per_s": play.tokens / play.generate_seconds if play.generate_seconds > 0 else 0.0,
        "turns_per_s": play.turns / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
    }


def ended_in_loop(rows: Sequence[dict[str, Any]]) -> bool:
    """Whether an episode ran out of turns without a win, its last action one it had already taken
    in the same state (``anchor_state``). A policy whose action follows from the state, as greedy
    play does when the prompt shows little or no history, repeats such a cycle to any step limit:
    one invalid command over and over, or moves back and forth."""
    if not rows or not rows[-1]["truncated"] or rows[-1]["won"]:
        return False
    return (rows[-1]["anchor_state"], rows[-1]["action"]) in {(row["anchor_state"], row["action"]) for row in rows[:-1]}


def action_entropy(actions: Sequence[str]) -> float:
    """Entropy in bits of the actions played, pooled over every turn (0 when there are none). For a
    greedy policy, whose action is a function of its prompt, it is the information its actions carry
    about what it was shown: 0 is a policy that plays one action whatever the state (the
    input-agnostic collapse of RAGEN-2)."""
    if not len(actions):
        return 0.0
    _, counts = np.unique(np.asarray(actions, dtype=str), return_counts=True)
    shares = counts / counts.sum()
    return float((shares * np.log2(1 / shares)).sum())


ROLLOUT_METRICS = {
    "success_rate": "success_rate",
    "return": "mean_return",
    "length": "mean_length",
    "invalid_rate": "invalid_action_rate",
    "explored_rate": "explored_rate",
    "replayed_turns": "replayed_turns",
    "progress_reward": "progress_reward",
    "action_entropy": "action_entropy",
    "loop_rate": "loop_rate",
    "overlong_rate": "overlong_rate",
    "failed_trajectories": "failed_trajectories",
    "dropped_groups": "dropped_groups",
    "rounds": "rounds",
    "rows": "batch_rows",
    "tokens_per_s": "tokens_per_s",
}
"""Logged ``rollout/<name>`` metrics and the ``collect_rollouts`` statistic each one reports."""


def rollout_metrics(stats: dict) -> dict[str, float]:
    """The logged ``rollout/<name>`` metrics of :func:`collect_rollouts`' statistics."""
    return {f"rollout/{name}": stats[key] for name, key in ROLLOUT_METRICS.items()}
