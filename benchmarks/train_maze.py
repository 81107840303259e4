"""Benchmark the README main job: ``agent-rl train`` with no config: the maze recipe (Maze, GiGPO, the tiny
model, vllm if available else hf) until the run stops at its target.

The run stops as the trainer decides: greedy success on ``trainer.confirm_episodes`` held-out mazes
(the periodic evaluation, extended while the target is within reach) reaches
``trainer.target_success`` (or, with ``confirm_episodes=0``, the periodic evaluation alone). Records the wall
time to that point (the warm start included), the evaluation and confirmation curves, and the
per-phase timing split (SFT warm start, rollout, advantage, update, weight sync, evaluation).
Writes ``benchmarks/results/<--name>.json``.

    python -m agent_rl.benchmarks.train_maze [--name NAME] [key=value overrides]
    python -m agent_rl.benchmarks.train_maze --name main_job/seed1 trainer.seed=1
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, write_result

PHASES = ("rollout", "advantage", "update", "sync", "eval")


def rollout_success_curve(records: list[dict]) -> list[dict[str, float]]:
    """Success of each iteration's sampled training rollouts (greedy evaluation is ``eval_curve``)."""
    return [
        {"iteration": r["iteration"], "sampled_success": r["rollout/success_rate"]}
        for r in records
        if r.get("rollout/success_rate") is not None
    ]


def eval_curve(records: list[dict]) -> list[dict[str, float | None]]:
    """Each evaluation's greedy success, and the confirmation's with its episode count where one ran
    (``None`` otherwise)."""
    return [
        {
            "iteration": r["iteration"],
            "greedy_success": r["eval/greedy_success"],
            "confirm_greedy_success": r.get("eval/confirm_greedy_success"),
            "confirm_greedy_episodes": r.get("eval/confirm_greedy_episodes"),
            "elapsed_s": r["time/elapsed"],
        }
        for r in records
        if r.get("eval/greedy_success") is not None
    ]


def main(argv: list[str] | None = None) -> dict[str, object]:
    from agent_rl.config import config_to_dict, load_default_config
    from agent_rl.training.infra.logger import read_metrics
    from agent_rl.training.loop.trainer import train

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="train_maze", help="result file under benchmarks/results/, without .json")
    parser.add_argument("overrides", nargs="*", help="config overrides, key=value")
    args = parser.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="bench-train-maze-"))
    config = load_default_config([f"trainer.run_dir={run_dir}", *args.overrides])
    target = config.trainer.target_success
    if target is None:
        raise SystemExit(
            "agent_rl.benchmarks.train_maze measures the time to trainer.target_success; it must not be null"
        )
    machine_at_start = machine_info()  # the load average before training started
    start = time.perf_counter()
    summary = train(config)
    wall = time.perf_counter() - start
    records = read_metrics(run_dir)
    reached = summary["reached_target"]  # the trainer stops at its target (training.loop.evaluation.target_reached)
    phase_totals = {p: sum(r.get(f"time/{p}", 0.0) or 0.0 for r in records) for p in PHASES}
    first = records[0] if records else {}
    sft_seconds = first.get("time/elapsed", 0.0) - (first.get("time/eval") or 0.0)
    result = {
        "benchmark": "train_maze",
        "machine_at_start": machine_at_start,
        "command": "agent-rl train " + " ".join(args.overrides),
        "config": config_to_dict(config),
        "target_greedy_success": target,
        "confirm_episodes": config.trainer.confirm_episodes,
        "reached_target": reached,
        "wall_time_to_target_s": summary["elapsed_s"] if reached else None,
        "iterations_to_target": summary["iterations"] if reached else None,
        "total_wall_s": wall,
        "best_greedy_success": summary["best_greedy_success"],
        "iterations_run": summary["iterations"],
        "warm_start": {k: first[k] for k in sorted(first) if k.startswith("sft/")},
        "eval_curve": eval_curve(records),
        "rollout_success_curve": rollout_success_curve(records),
        "phase_seconds": {"sft_and_setup": sft_seconds, **phase_totals},
        "phase_fraction": {p: v / max(wall, 1e-9) for p, v in {"sft_and_setup": sft_seconds, **phase_totals}.items()},
        "run_dir": str(run_dir),
    }
    write_result(Path(args.name).name, result, RESULTS_DIR / Path(args.name).parent)
    print(
        json.dumps(
            {k: result[k] for k in ("reached_target", "wall_time_to_target_s", "total_wall_s", "best_greedy_success")},
            indent=2,
        )
    )
    return result


if __name__ == "__main__":
    main()
