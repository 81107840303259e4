"""Evaluation on held-out seeds: during training (greedy, sampled, and a confirmation before
stopping at the target), and of a finished run or model directory (``agent-rl eval``).

Seeds from ``agent_rl.envs.EVAL_SEED_BASE`` (2**31) on are evaluation seeds: training draws its seeds below
them and no environment reaches a training instance from one, so evaluation is always held out.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.console import Console

from agent_rl.config import Config, RolloutConfig, TrainerConfig, load_config, load_default_config
from agent_rl.envs import EVAL_SEED_BASE
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.rollout import (
    SEED_HIGH,
    Episode,
    PlayStats,
    episode_stats,
    play_episodes,
    policy_actor,
)
from agent_rl.training.serving.engines import Engine, engine_from_config
from agent_rl.training.serving.envpool import EnvFactory, EnvPool, env_factory, env_pool

assert EVAL_SEED_BASE > SEED_HIGH  # training seeds are drawn below SEED_HIGH


def eval_seeds(episodes: int, offset: int = 0) -> list[int]:
    """``episodes`` held-out seeds, from the ``offset``-th on (``trainer.eval_offset``)."""
    return [EVAL_SEED_BASE + offset + i for i in range(episodes)]


def evaluate(
    envs: EnvPool | EnvFactory,
    engine: Engine,
    tokenizer,
    seeds: Sequence[int],
    *,
    greedy: bool = True,
    config: RolloutConfig | None = None,
    progress: Any = None,
    transcripts: int = 0,
) -> dict[str, Any]:
    """Play one episode per seed (greedy, or sampled with ``config``'s temperature/top-p) and report
    ``success_rate``, ``mean_length``, ``mean_return``, ``n`` and the other ``episode_stats``; with
    ``transcripts`` > 0, ``transcripts`` also holds what the first that many episodes played
    (:func:`transcript`)."""
    if len(seeds) == 0:
        raise ValueError("evaluate needs at least one seed")
    config = config or RolloutConfig()
    play = PlayStats()
    actor = policy_actor(engine, tokenizer, config, play, greedy=greedy, seeds=seeds)
    start = time.perf_counter()
    with env_pool(envs, len(seeds)) as pool:
        episodes = play_episodes(pool, actor, seeds, range(len(seeds)), config, play, progress)
    stats = episode_stats(episodes, play, time.perf_counter() - start)
    stats["n"] = float(len(seeds))
    if transcripts:
        stats["transcripts"] = [transcript(e) for e in episodes[:transcripts]]
    return stats


def transcript(episode: Episode) -> dict[str, Any]:
    """An episode's seed, outcome, actions and whether each was valid (``None`` for an episode whose
    environment failed)."""
    return {
        "seed": episode.seed,
        "won": bool(episode.rows and episode.rows[-1]["won"]),
        "actions": None if episode.failure else [row["action"] for row in episode.rows],
        "valid": None if episode.failure else [row["action_valid"] for row in episode.rows],
    }


def evaluate_heldout(
    envs: EnvPool | EnvFactory, engine: Engine, tokenizer, config: Config, progress: Any = None
) -> dict[str, float]:
    """Greedy (and, with ``trainer.eval_sampled``, sampled) success on ``trainer.eval_episodes``
    held-out seeds, then the greedy confirmation (:func:`confirm`) that decides whether to stop."""
    trainer = config.trainer

    def play(seeds: Sequence[int], greedy: bool) -> dict[str, float]:
        return evaluate(envs, engine, tokenizer, seeds, greedy=greedy, config=config.rollout, progress=progress)

    metrics = {}
    for mode in ("greedy", "sampled") if trainer.eval_sampled else ("greedy",):
        stats = play(eval_seeds(trainer.eval_episodes, trainer.eval_offset), mode == "greedy")
        metrics.update(
            {
                f"eval/{mode}_success": stats["success_rate"],
                f"eval/{mode}_length": stats["mean_length"],
                f"eval/{mode}_invalid_rate": stats["invalid_action_rate"],
                f"eval/{mode}_action_entropy": stats["action_entropy"],
                f"eval/{mode}_loop_rate": stats["loop_rate"],
            }
        )
        if mode == "greedy":
            wins = wins_of(stats)
    if trainer.eval_sampled:  # a policy that wins only when it samples has not committed to what works
        metrics["eval/greedy_minus_sampled"] = metrics["eval/greedy_success"] - metrics["eval/sampled_success"]
    if trainer.target_success is not None and trainer.confirm_episodes > trainer.eval_episodes:
        metrics.update(
            confirm(
                lambda seeds: wins_of(play(seeds, greedy=True)),
                trainer.eval_episodes,
                wins,
                trainer.confirm_episodes,
                trainer.target_success,
                trainer.eval_offset,
            )
        )
    return metrics


def wins_of(stats: dict[str, float]) -> int:
    """Won episodes in ``evaluate``'s stats (an episode whose environment raised is not won)."""
    return round(stats["success_rate"] * stats["trajectories"])


def confirm(
    play_greedy: Callable[[Sequence[int]], int],
    played: int,
    wins: int,
    episodes: int,
    target: float,
    offset: int = 0,
) -> dict[str, float]:
    """Extend a greedy evaluation of the first ``played`` held-out seeds from ``offset`` (``wins`` won)
    to the first ``episodes``, ``played`` more at a time, while greedy success on all ``episodes`` can still reach
    ``target``. Greedy play of a seed is deterministic, so the decision is the one a fresh evaluation
    on ``episodes`` seeds would make, but a policy far from the target costs only a chunk or none.
    Returns ``eval/confirm_greedy_success`` over the seeds played and ``eval/confirm_greedy_episodes``
    (below ``episodes`` only when the target is out of reach), or nothing when no more seeds were played."""
    if played < 1:
        raise ValueError(f"confirm extends an evaluation of at least one seed, got played={played}")
    allowed = math.floor(episodes * (1 - target) + 1e-9)  # losses that still leave the target reachable
    total = played
    while total - wins <= allowed and total < episodes:
        seeds = eval_seeds(min(episodes, total + played), offset)[total:]
        wins += play_greedy(seeds)
        total += len(seeds)
    if total == played:
        return {}
    return {"eval/confirm_greedy_success": wins / total, "eval/confirm_greedy_episodes": float(total)}


def eval_due(iteration: int, trainer: TrainerConfig) -> bool:
    """Whether ``iteration`` ends with a held-out evaluation: every ``trainer.eval_every``
    iterations (0: never) and after the last."""
    every = trainer.eval_every
    return iteration == trainer.iterations or (every > 0 and iteration % every == 0)


def target_reached(metrics: dict[str, float], target: float | None) -> bool:
    """The stopping rule: the confirmation's greedy success where one ran (``evaluate_heldout``), else
    the periodic evaluation's, at or above ``target``; never without an evaluation or a target."""
    decisive = metrics.get("eval/confirm_greedy_success", metrics.get("eval/greedy_success"))
    return decisive is not None and target is not None and decisive >= target


REPORTED_STATS = ("success_rate", "mean_length", "mean_return", "invalid_action_rate", "loop_rate", "transcripts")
"""What ``agent-rl eval`` reports of each mode's :func:`evaluate`."""


def evaluate_policy(
    target: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    env_id: str | None = None,
    episodes: int | None = None,
    which: str = "best",
    sampled: bool = False,
    console: Console | None = None,
    transcripts: int = 0,
) -> dict[str, Any]:
    """Evaluate a run directory (its ``best``/``last`` checkpoint, its config) or a model directory
    (the default recipe's config, ``agent_rl.config.load_default_config``) on held-out seeds; returns
    the eval metrics (``agent-rl eval``), and the actions of the first ``transcripts`` episodes of
    each mode (``<mode>_transcripts``), which the console also shows."""
    from agent_rl.training.infra import checkpoint
    from agent_rl.training.infra.distributed import resolve_device
    from agent_rl.training.models.policy import load_policy

    target = Path(target)
    console = console or Console()
    is_run = (target / "config.yaml").is_file()
    base = list(overrides)
    if env_id is not None:
        base.insert(0, f"env.id={env_id}")
        if is_run and env_id != load_config(target / "config.yaml").env.id:
            base.insert(0, "env.kwargs={}")  # another environment's constructor arguments do not carry over
    config = load_config(target / "config.yaml", base) if is_run else load_default_config(base)
    if episodes is not None:
        config.trainer.eval_episodes = episodes
    make_env = env_factory(config)
    config = resolve(config, make_env)
    model_dir = checkpoint.find_checkpoint(target, which).model_dir if is_run else target
    model, tokenizer = load_policy(model_dir, device=resolve_device(config.policy.device))
    engine = engine_from_config(config, model, tokenizer)
    try:
        seeds = eval_seeds(config.trainer.eval_episodes, config.trainer.eval_offset)
        results: dict[str, Any] = {"model": str(model_dir), "env": config.env.id, "episodes": len(seeds)}
        for mode in ("greedy", "sampled") if sampled else ("greedy",):
            stats = evaluate(
                make_env,
                engine,
                tokenizer,
                seeds,
                greedy=mode == "greedy",
                config=config.rollout,
                transcripts=transcripts,
            )
            results.update({f"{mode}_{k}": v for k, v in stats.items() if k in REPORTED_STATS})
    finally:
        engine.close()
    for key, value in results.items():
        if key.endswith("_transcripts"):
            for shown in value:
                outcome = "won " if shown["won"] else "lost"
                if shown["actions"] is None:
                    actions = "environment failed"
                else:
                    played = zip(shown["actions"], shown["valid"])
                    actions = " | ".join(a if valid else f"{a} (invalid)" for a, valid in played)
                mode = key.removesuffix("_transcripts")
                console.print(f"{mode:>8} seed {shown['seed']} {outcome}: {actions}", markup=False, soft_wrap=True)
        else:
            console.print(f"{key:>28}: {value:.3f}" if isinstance(value, float) else f"{key:>28}: {value}")
    return results
