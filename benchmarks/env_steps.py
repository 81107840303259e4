"""Steps per second, reset time and oracle success of every registered text environment, one process.

Each step takes a random admissible action (an environment without an admissible list gets a random
choice among its oracle plan and a few malformed commands); resets are inside the timed loop, each
with a fresh seed, so level generation is counted (and also reported on its own, as the mean reset
time). TextWorld is the exception: its games are generated offline and cached by design, so its
episodes cycle over a small pool of games generated before timing (the generation time is reported
on its own). After timing, environments with an oracle play it on ``--oracle-episodes`` seeds.
``--scienceworld-tasks N`` adds, per ScienceWorld task, reset time and gold-path success on N train
variations, and how many gold steps are among the valid and the shown actions.

    python -m agent_rl.benchmarks.env_steps                     # -> benchmarks/results/env_steps.json
    python -m agent_rl.benchmarks.env_steps --seconds 2 --env agent_rl/Maze-v0
    python -m agent_rl.benchmarks.env_steps --env agent_rl/ScienceWorld-v0 --env textarena/Sokoban-v0 --name envs_suites
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import gymnasium as gym
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agent_rl.benchmarks.common import write_result
from agent_rl.envs import oracle_actions, plays_to_a_win, text_env_specs
from agent_rl.envs.registration import NAMESPACE

TARGET_STEPS_PER_S = {
    f"{NAMESPACE}/Maze-v0": 10_000,
    f"{NAMESPACE}/Sokoban-v0": 10_000,
    f"{NAMESPACE}/MiniCode-v0": 10_000,
}
"""The issue's one-core targets; TextWorld is bounded by the textworld package itself."""
SEED_POOLS = {f"{NAMESPACE}/TextWorld-v0": 4}
"""Environments whose episodes cycle over this many pre-generated seeds instead of fresh ones."""
MALFORMED = ("", "help", "xyzzy", "1 2 +", "go", "(")


def measure(env_id: str, seconds: float, seed_pool: int | None, oracle_episodes: int) -> dict:
    start = time.perf_counter()
    env = gym.make(env_id)
    make_s = time.perf_counter() - start
    chooser = random.Random(0)
    generation_s = None
    if seed_pool:
        start = time.perf_counter()
        for seed in range(seed_pool):
            env.reset(seed=seed)
        generation_s = (time.perf_counter() - start) / seed_pool
    steps = episodes = wins = 0
    reset_s = 0.0
    start = time.perf_counter()
    while True:
        reset_start = time.perf_counter()
        _, info = env.reset(seed=episodes % seed_pool if seed_pool else 1000 + episodes)
        reset_s += time.perf_counter() - reset_start
        episodes += 1
        fallback = None if "admissible_actions" in info else [*oracle_actions(env), *MALFORMED]
        done = False
        while not done:
            candidates = fallback if fallback is not None else (info["admissible_actions"] or MALFORMED)
            action = chooser.choice(candidates)
            _, _, terminated, truncated, info = env.step(action)
            steps += 1
            done = terminated or truncated
        wins += bool(info["won"])
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            break
    oracle = oracle_success(env, oracle_episodes)
    env.close()
    result = {
        "steps": steps,
        "episodes": episodes,
        "seconds": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
        "make_s": round(make_s, 3),
        "mean_reset_s": round(reset_s / episodes, 4),
        "steps_per_s_without_resets": round(steps / (elapsed - reset_s), 1),
        "mean_episode_length": round(steps / episodes, 2),
        "random_success_rate": round(wins / episodes, 4),
        "seeds": f"pool of {seed_pool} pre-generated" if seed_pool else "fresh seed per episode",
        "target_steps_per_s": TARGET_STEPS_PER_S.get(env_id),
    }
    if generation_s is not None:
        result["first_reset_s"] = round(generation_s, 3)
    if result["target_steps_per_s"]:
        result["meets_target"] = result["steps_per_s"] >= result["target_steps_per_s"]
    result["oracle"] = oracle
    return result


def oracle_success(env: gym.Env, episodes: int) -> dict | None:
    """Play the oracle plan on seeds 0..episodes-1: success rate and mean plan length (None: no oracle)."""
    wins, lengths = 0, []
    for seed in range(episodes):
        env.reset(seed=seed)
        try:
            plan = oracle_actions(env)
        except NotImplementedError:
            return None
        wins += plays_to_a_win(env, plan)
        lengths.append(len(plan))
    return {
        "episodes": episodes,
        "success_rate": round(wins / max(episodes, 1), 4),
        "mean_plan_length": round(sum(lengths) / max(len(lengths), 1), 2),
    }


def resident_mb(pid: int) -> float | None:
    """Resident memory of a process in MB (Linux /proc; None elsewhere)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kilobytes = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return round(kilobytes / 1024, 1)


def scienceworld_tasks(variations: int) -> dict:
    """Per ScienceWorld task, on its first ``variations`` training seeds: reset time, the gold path's
    success and length, how many gold steps are among ScienceWorld's valid actions and among the
    shown ones (the prompt's capped list) at the state where they are taken, and the Java process's
    resident memory at the end."""
    from agent_rl.envs.scienceworld_env import ScienceWorldEnv, task_names

    results = {}
    with Progress(transient=True) as progress:
        bar = progress.add_task("ScienceWorld tasks", total=len(task_names()))
        for task in task_names():
            progress.update(bar, description=f"ScienceWorld {task}")
            env = ScienceWorldEnv(task=task, max_steps=10_000)  # the longest gold paths have a few hundred steps
            reset_s, wins, gold, in_valid, shown, valid_counts, shown_counts = 0.0, 0, 0, 0, 0, [], []
            for seed in range(variations):
                start = time.perf_counter()
                _, info = env.reset(seed=seed)
                reset_s += time.perf_counter() - start
                valid_counts.append(info["valid_action_count"])
                shown_counts.append(len(info["admissible_actions"]))
                for action in env.oracle():
                    gold += 1
                    in_valid += action in env.valid_actions()
                    shown += action in info["admissible_actions"]
                    *_, terminated, truncated, info = env.step(action)
                    if terminated or truncated:
                        break
                wins += bool(info["won"])
            java_rss_mb = resident_mb(env._gateway.java_process.pid)
            env.close()
            results[task] = {
                "variations": variations,
                "splits": {name: len(v) for name, v in env.splits.items()},
                "mean_reset_s": round(reset_s / variations, 3),
                "gold_success_rate": round(wins / variations, 3),
                "mean_gold_length": round(gold / variations, 1),
                "mean_valid_actions_at_start": round(sum(valid_counts) / variations, 1),
                "mean_shown_actions_at_start": round(sum(shown_counts) / variations, 1),
                "gold_steps_in_valid_list": round(in_valid / max(gold, 1), 3),
                "gold_steps_shown": round(shown / max(gold, 1), 3),
                "java_resident_mb_after": java_rss_mb,
            }
            progress.advance(bar)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed wall-clock seconds per environment")
    parser.add_argument(
        "--env", action="append", default=[], help="only these ids (repeatable); default: all registered"
    )
    parser.add_argument("--oracle-episodes", type=int, default=10, help="seeds the oracle plays per environment")
    parser.add_argument(
        "--scienceworld-tasks", type=int, default=0, metavar="N", help="per-task ScienceWorld sweep on N variations"
    )
    parser.add_argument("--name", default="env_steps", help="result file name (default env_steps -> env_steps.json)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    env_ids = args.env or list(text_env_specs())
    results = {}
    with Progress(transient=True) as progress:
        task = progress.add_task("environments", total=len(env_ids))
        for env_id in env_ids:
            progress.update(task, description=env_id)
            results[env_id] = measure(env_id, args.seconds, SEED_POOLS.get(env_id), args.oracle_episodes)
            progress.advance(task)
    table = Table(title="Text environment throughput (one process)")
    for column in ("env", "steps/s", "target", "reset s", "episodes", "mean length", "oracle wins", "seeds"):
        table.add_column(column, overflow="fold")
    for env_id, r in results.items():
        target = f"{r['target_steps_per_s']:,}" if r["target_steps_per_s"] else "-"
        oracle = f"{r['oracle']['success_rate']:.0%}" if r["oracle"] else "-"
        table.add_row(
            env_id,
            f"{r['steps_per_s']:,.0f}",
            target,
            f"{r['mean_reset_s']:.3f}",
            str(r["episodes"]),
            str(r["mean_episode_length"]),
            oracle,
            r["seeds"],
        )
    Console().print(table)
    payload = {"seconds_per_env": args.seconds, "results": results}
    if args.scienceworld_tasks:
        payload["scienceworld_tasks"] = scienceworld_tasks(args.scienceworld_tasks)
    path = write_result(args.name, payload, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
