"""Steps per second of every bundled text environment, one process, one core.

Each step takes a random admissible action (an environment without an admissible list gets a random
choice among its oracle plan and a few malformed commands); resets are inside the timed loop, each
with a fresh seed, so level generation is counted. TextWorld is the exception: its games are
generated offline and cached by design, so its episodes cycle over a small pool of games generated
before timing (the generation time is reported on its own).

    python -m benchmarks.env_steps                     # -> benchmarks/results/env_steps.json
    python -m benchmarks.env_steps --seconds 2 --env agent_rl/Maze-v0
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

from benchmarks.common import write_result
from envs import oracle_actions, text_env_specs
from envs.registration import NAMESPACE

TARGET_STEPS_PER_S = {f"{NAMESPACE}/Maze-v0": 10_000, f"{NAMESPACE}/Sokoban-v0": 10_000, f"{NAMESPACE}/MiniCode-v0": 10_000}
"""The issue's one-core targets; TextWorld is bounded by the textworld package itself."""
SEED_POOLS = {f"{NAMESPACE}/TextWorld-v0": 4}
"""Environments whose episodes cycle over this many pre-generated seeds instead of fresh ones."""
MALFORMED = ("", "help", "xyzzy", "1 2 +", "go", "(")


def measure(env_id: str, seconds: float, seed_pool: int | None) -> dict:
    env = gym.make(env_id)
    chooser = random.Random(0)
    generation_s = None
    if seed_pool:
        start = time.perf_counter()
        for seed in range(seed_pool):
            env.reset(seed=seed)
        generation_s = (time.perf_counter() - start) / seed_pool
    steps = episodes = wins = 0
    start = time.perf_counter()
    while True:
        _, info = env.reset(seed=episodes % seed_pool if seed_pool else 1000 + episodes)
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
    env.close()
    result = {
        "steps": steps,
        "episodes": episodes,
        "seconds": round(elapsed, 3),
        "steps_per_s": round(steps / elapsed, 1),
        "mean_episode_length": round(steps / episodes, 2),
        "random_success_rate": round(wins / episodes, 4),
        "seeds": f"pool of {seed_pool} pre-generated" if seed_pool else "fresh seed per episode",
        "target_steps_per_s": TARGET_STEPS_PER_S.get(env_id),
    }
    if generation_s is not None:
        result["first_reset_s"] = round(generation_s, 3)
    if result["target_steps_per_s"]:
        result["meets_target"] = result["steps_per_s"] >= result["target_steps_per_s"]
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed wall-clock seconds per environment")
    parser.add_argument("--env", action="append", default=[], help="only these ids (repeatable); default: bundled")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    env_ids = args.env or [env_id for env_id in text_env_specs() if env_id.startswith(f"{NAMESPACE}/")]
    results = {}
    with Progress(transient=True) as progress:
        task = progress.add_task("environments", total=len(env_ids))
        for env_id in env_ids:
            progress.update(task, description=env_id)
            results[env_id] = measure(env_id, args.seconds, SEED_POOLS.get(env_id))
            progress.advance(task)
    table = Table(title="Text environment throughput (one process)")
    for column in ("env", "steps/s", "target", "episodes", "mean length", "seeds"):
        table.add_column(column, overflow="fold")
    for env_id, r in results.items():
        target = f"{r['target_steps_per_s']:,}" if r["target_steps_per_s"] else "-"
        table.add_row(env_id, f"{r['steps_per_s']:,.0f}", target, str(r["episodes"]), str(r["mean_episode_length"]), r["seeds"])
    Console().print(table)
    path = write_result("env_steps", {"seconds_per_env": args.seconds, "results": results}, args.out)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
