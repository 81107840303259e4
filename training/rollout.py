"""Multi-turn rollouts: environments + engine -> ``StepBatch`` (one row per turn), and evaluation.

``collect_rollouts`` runs ``n_groups x group_size`` environments. The members of a group reset with
the same seed, so they share the initial state; groups get distinct seeds from the caller's
``numpy.random.Generator``. Every turn, all active environments are prompted in one batched
``engine.generate`` call; each completion is parsed into an action and stepped, and the turn becomes
one row holding the exact prompt/response token ids and engine logprobs.

Decisions worth knowing:
- Output with no parsable action (empty text, a missing ``<action>`` tag) is sent as the empty
  command: the environment answers "invalid action" and the row has ``action_valid = False``.
- A trajectory whose environment raises (in ``reset`` or ``step``) is *failed*: all its rows are
  dropped from the batch, it is counted in ``stats["failed_trajectories"]``, and the others go on.
- ``done`` is True on the last row of every trajectory; ``truncated`` when it ended by the
  environment's time limit or by ``max_turns`` rather than by termination.
- Overlong shaping (DAPO): a response at the token limit gets ``-overlong_penalty`` added to its
  reward, ramped linearly over the last ``overlong_buffer`` tokens before the limit. The added amount
  is kept in ``batch.extras["overlong_penalty"]``; ``batch.extras["seed"]`` holds the reset seed.
- Dynamic sampling (DAPO): groups whose trajectory returns are all equal (zero advantage signal) are
  dropped and new groups are collected until ``n_groups`` are kept or ``max_resample_rounds`` extra
  rounds ran; the batch may then hold fewer groups (possibly none).
- Statistics describe every trajectory played in the call, dropped groups included (they measure the
  policy, not the batch).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from agent_rl.batch import StepBatch
from training.engines import Completion, Engine, SamplingParams
from training.envpool import EnvPool, EnvResult, LocalEnvPool
from training.prompts import PARSERS, Turn, build_prompt_ids, parse_action

SEED_HIGH = 2**31 - 1


@dataclass
class RolloutConfig:
    """How rollouts are collected."""

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
    """Generation limit per turn; a response that hits it is ``overlong``."""
    temperature: float = 1.0
    """Sampling temperature."""
    top_p: float = 1.0
    """Nucleus sampling mass; keep 1.0 for on-policy RL (the learner does not renormalize)."""
    parser: str = "first_line"
    """How actions are read from completions: ``first_line`` (embedded model) or ``action_tag``."""
    show_admissible_actions: bool = True
    """List the environment's admissible actions in the prompt when it provides them."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop groups whose trajectory returns are all equal, collect more."""
    max_resample_rounds: int = 3
    """Extra collection rounds dynamic sampling may run to fill the batch."""
    overlong_penalty: float = 0.0
    """Reward subtracted from a response at the token limit (0 disables overlong shaping)."""
    overlong_buffer: int = 0
    """Tokens before the limit over which the penalty ramps up linearly (0: only at the limit)."""

    def __post_init__(self) -> None:
        for name in ("n_groups", "group_size", "max_turns", "max_prompt_tokens", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"RolloutConfig.{name} must be >= 1, got {getattr(self, name)}")
        for name in ("history_turns", "max_resample_rounds", "overlong_buffer"):
            if getattr(self, name) < 0:
                raise ValueError(f"RolloutConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.overlong_buffer > self.max_new_tokens:
            raise ValueError(
                f"RolloutConfig.overlong_buffer ({self.overlong_buffer}) exceeds max_new_tokens ({self.max_new_tokens})"
            )
        if self.overlong_penalty < 0:
            raise ValueError(f"RolloutConfig.overlong_penalty must be >= 0, got {self.overlong_penalty}")
        if self.parser not in PARSERS:
            raise ValueError(f"RolloutConfig.parser must be one of {sorted(PARSERS)}, got {self.parser!r}")
        SamplingParams(self.temperature, self.top_p, self.max_new_tokens)  # validates the sampling fields

    def sampling(self, greedy: bool = False) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.max_new_tokens, greedy=greedy)


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


@dataclass
class PlayStats:
    """Counters accumulated while playing episodes."""

    tokens: int = 0
    generate_seconds: float = 0.0
    turns: int = 0


def overlong_shaping(lengths: np.ndarray, max_new_tokens: int, penalty: float, buffer: int) -> np.ndarray:
    """DAPO soft overlong punishment: 0 up to ``max_new_tokens - buffer`` tokens, then a linear ramp
    to ``-penalty`` at the limit (a step at the limit when ``buffer == 0``)."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer == 0:
        return np.where(lengths >= max_new_tokens, -penalty, 0.0)
    return -penalty * np.clip((lengths - (max_new_tokens - buffer)) / buffer, 0.0, 1.0)


def play_episodes(
    pool: EnvPool,
    engine: Engine,
    tokenizer,
    seeds: Sequence[int],
    groups: Sequence[int],
    config: RolloutConfig,
    sampling: SamplingParams,
    stats: PlayStats,
    progress: Any = None,
) -> list[Episode]:
    """Play one episode per seed, in pool slots ``0..len(seeds)-1``, to the end (or ``max_turns``),
    batching generation across them and stepping all their environments in one pool call."""
    if len(seeds) > pool.n_envs:
        raise ValueError(f"{len(seeds)} episodes need more than the pool's {pool.n_envs} environments")
    episodes = [Episode(slot, int(seed), int(group)) for slot, (seed, group) in enumerate(zip(seeds, groups))]
    for episode, result in zip(episodes, pool.reset([e.slot for e in episodes], [e.seed for e in episodes])):
        if result.failure is not None:  # a broken environment fails its own trajectory only
            _fail(episode, result.failure)
        else:
            episode.observation, episode.info = result.observation, result.info
            episode.task = str(result.info.get("task", ""))
    task_id = progress.add_task(f"rollout {pool.env_id}", total=config.max_turns) if progress is not None else None
    for turn in range(config.max_turns):
        active = [e for e in episodes if not e.finished]
        if not active:
            break
        prompts = [_prompt(tokenizer, e, config) for e in active]
        start = time.perf_counter()
        completions = engine.generate(prompts, 1, sampling)
        stats.generate_seconds += time.perf_counter() - start
        texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for (c,) in completions]
        parsed = [parse_action(text, config.parser) for text in texts]
        results = pool.step([e.slot for e in active], [action for action, _ in parsed])
        for episode, prompt, (completion,), (action, found), result in zip(active, prompts, completions, parsed, results):
            stats.tokens += len(completion.token_ids)
            _record(episode, prompt, completion, action, found, result, config, last_turn=turn == config.max_turns - 1)
        stats.turns += len(active)
        if task_id is not None:
            progress.update(task_id, advance=1)
    if task_id is not None:
        progress.remove_task(task_id)
    return episodes


def _prompt(tokenizer, episode: Episode, config: RolloutConfig) -> list[int]:
    admissible = episode.info.get("admissible_actions") if config.show_admissible_actions else None
    return build_prompt_ids(
        tokenizer,
        episode.task,
        episode.history,
        episode.observation,
        admissible,
        parser=config.parser,
        history_turns=config.history_turns,
        max_prompt_tokens=config.max_prompt_tokens,
        history_observations=config.history_observations,
        system_prompt=config.system_prompt,
    )


def _fail(episode: Episode, failure: str) -> None:
    episode.failure = failure
    episode.finished = True


def _record(
    episode: Episode,
    prompt: list[int],
    completion: Completion,
    action: str,
    found: bool,
    result: EnvResult,
    config: RolloutConfig,
    last_turn: bool,
) -> None:
    if result.failure is not None:
        _fail(episode, result.failure)
        return
    observation, reward, terminated, truncated, info = (
        result.observation, result.reward, result.terminated, result.truncated, result.info
    )
    overlong = completion.finish_reason == "length"
    shaping = float(
        overlong_shaping(len(completion.token_ids), config.max_new_tokens, config.overlong_penalty, config.overlong_buffer)
    )
    done = bool(terminated or truncated or last_turn)
    episode.rows.append(
        {
            "t": len(episode.rows),
            "reward": float(reward) + shaping,
            "overlong_penalty": shaping,
            "done": done,
            "truncated": done and not terminated,
            "action_valid": bool(found and info.get("action_valid", True)),
            "won": bool(info.get("won", False)),
            "overlong": overlong,
            "prompt_ids": np.asarray(prompt, dtype=np.int64),
            "response_ids": np.asarray(completion.token_ids, dtype=np.int64),
            "old_logprobs": np.asarray(completion.logprobs, dtype=np.float32),
            # The state the action was taken in (not the one it led to): GiGPO groups by it.
            "observation": episode.observation,
            "error": episode.info.get("error"),
            "anchor_state": str(episode.info.get("anchor", episode.observation)),
            "action": action,
        }
    )
    episode.history.append(Turn(episode.observation, action))
    episode.observation, episode.info = observation, info
    episode.finished = done


def episodes_to_batch(episodes: Sequence[Episode], group_ids: Sequence[int], first_traj_id: int = 0) -> StepBatch:
    """A ``StepBatch`` of the given (successful) episodes, trajectories contiguous and in time order."""
    rows = [row for episode in episodes for row in episode.rows]
    lengths = [len(episode.rows) for episode in episodes]
    traj_ids = np.repeat(np.arange(first_traj_id, first_traj_id + len(episodes)), lengths)

    def column(name: str) -> list[Any]:
        return [row[name] for row in rows]

    return StepBatch(
        group_id=np.repeat(np.asarray(group_ids, dtype=np.int64), lengths),
        traj_id=traj_ids,
        t=column("t"),
        reward=column("reward"),
        done=column("done"),
        truncated=column("truncated"),
        action_valid=column("action_valid"),
        won=column("won"),
        overlong=column("overlong"),
        prompt_ids=column("prompt_ids"),
        response_ids=column("response_ids"),
        old_logprobs=column("old_logprobs"),
        observation=column("observation"),
        error=column("error"),
        action=column("action"),
        anchor_state=column("anchor_state"),
        extras={
            "overlong_penalty": np.asarray(column("overlong_penalty"), dtype=np.float64),
            "seed": np.repeat(np.asarray([e.seed for e in episodes], dtype=np.int64), lengths),
        },
    )


@contextlib.contextmanager
def env_pool(env_id: str, env_kwargs: dict[str, Any] | None, n_envs: int, pool: EnvPool | None) -> Iterator[EnvPool]:
    """``pool`` after checking it fits, or a local pool of ``n_envs`` environments for one call."""
    if pool is not None:
        if pool.env_id != env_id or pool.n_envs < n_envs:
            raise ValueError(
                f"the pool holds {pool.n_envs} {pool.env_id!r} environments; {n_envs} {env_id!r} ones are needed"
            )
        yield pool
        return
    local = LocalEnvPool(env_id, env_kwargs, n_envs)
    try:
        yield local
    finally:
        local.close()


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
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    engine: Engine,
    tokenizer,
    config: RolloutConfig,
    rng: np.random.Generator,
    *,
    progress: Any = None,
    pool: EnvPool | None = None,
) -> tuple[StepBatch, dict[str, float]]:
    """Collect one batch of grouped trajectories; see the module docstring for the rules.

    ``progress`` is an optional ``rich.progress.Progress`` to show turns on. ``pool`` holds the
    environments (at least ``n_groups * group_size``, e.g. a ``RayEnvPool``); without one a local
    pool is built for the call."""
    sampling = config.sampling()
    play = PlayStats()
    start = time.perf_counter()
    used: set[int] = set()
    kept: list[list[Episode]] = []
    played: list[Episode] = []
    dropped_groups = rounds = 0
    while True:
        seeds = draw_seeds(rng, config.n_groups - len(kept), used)
        round_seeds = np.repeat(seeds, config.group_size)
        round_groups = np.repeat(np.arange(len(seeds)), config.group_size)
        with env_pool(env_id, env_kwargs, len(round_seeds), pool) as envs_of_round:
            episodes = play_episodes(envs_of_round, engine, tokenizer, round_seeds, round_groups, config, sampling, play, progress)
        played += episodes
        rounds += 1
        for group in range(len(seeds)):
            members = [e for e in episodes if e.group == group and e.failure is None]
            returns = np.array([e.total_return for e in members])
            if config.dynamic_sampling and (len(members) < 2 or np.ptp(returns) == 0):
                dropped_groups += 1
            elif members:
                kept.append(members)
        if not config.dynamic_sampling or len(kept) >= config.n_groups or rounds > config.max_resample_rounds:
            break
    episodes = [e for members in kept for e in members]
    group_ids = [g for g, members in enumerate(kept) for _ in members]
    batch = episodes_to_batch(episodes, group_ids)
    stats = episode_stats(played, play, time.perf_counter() - start)
    stats.update(dropped_groups=float(dropped_groups), rounds=float(rounds), batch_groups=float(len(kept)), batch_rows=float(len(batch)))
    return batch, stats


def episode_stats(episodes: Sequence[Episode], play: PlayStats, seconds: float) -> dict[str, float]:
    """Success rate, return, length, invalid-action and overlong rates over the successful episodes,
    plus failure count and generation throughput."""
    done = [e for e in episodes if e.failure is None]
    rows = [row for e in done for row in e.rows]

    def mean(values: list[Any]) -> float:
        return float(np.mean(values)) if len(values) else 0.0

    return {
        "trajectories": float(len(done)),
        "failed_trajectories": float(len(episodes) - len(done)),
        "success_rate": mean([bool(e.rows and e.rows[-1]["won"]) for e in done]),
        "mean_return": mean([e.total_return for e in done]),
        "mean_length": mean([len(e.rows) for e in done]),
        "invalid_action_rate": mean([not row["action_valid"] for row in rows]),
        "overlong_rate": mean([row["overlong"] for row in rows]),
        "tokens_generated": float(play.tokens),
        "tokens_per_s": play.tokens / play.generate_seconds if play.generate_seconds > 0 else 0.0,
        "turns_per_s": play.turns / seconds if seconds > 0 else 0.0,
        "seconds": seconds,
    }


def evaluate(
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    engine: Engine,
    tokenizer,
    seeds: Sequence[int],
    *,
    greedy: bool = True,
    config: RolloutConfig | None = None,
    progress: Any = None,
    pool: EnvPool | None = None,
) -> dict[str, float]:
    """Play one episode per seed (greedy, or sampled with ``config``'s temperature/top-p) and report
    ``success_rate``, ``mean_length``, ``mean_return``, ``n`` and the other ``episode_stats``."""
    if len(seeds) == 0:
        raise ValueError("evaluate needs at least one seed")
    config = config or RolloutConfig()
    play = PlayStats()
    start = time.perf_counter()
    with env_pool(env_id, env_kwargs, len(seeds), pool) as envs_of_eval:
        episodes = play_episodes(
            envs_of_eval, engine, tokenizer, seeds, range(len(seeds)), config, config.sampling(greedy), play, progress
        )
    stats = episode_stats(episodes, play, time.perf_counter() - start)
    stats["n"] = float(len(seeds))
    return stats
