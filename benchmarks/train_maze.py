"""Benchmark the README main job: ``agent-rl train`` on the embedded defaults (Maze, GiGPO, the tiny
model, vllm if available else hf) until greedy eval success reaches the target.

Records the wall time to the first evaluation at or above the target (90% by default), the eval
curve, and the per-phase timing split (SFT warm start, rollout, advantage, update, weight sync,
evaluation). Writes ``benchmarks/results/train_maze.json``.

    python -m benchmarks.train_maze [key=value overrides]
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import machine_info, write_result

PHASES = ("rollout", "advantage", "update", "sync", "eval")


def rollout_success_curve(records: list[dict]) -> list[dict[str, float]]:
    """Success of each iteration's sampled training rollouts (greedy evaluation is ``eval_curve``)."""
    return [{"iteration": r["iteration"], "sampled_success": r["rollout/success_rate"]}
            for r in records if r.get("rollout/success_rate") is not None]


def main(overrides: list[str]) -> dict[str, object]:
    from agent_rl.config import config_to_dict, load_config
    from training.logger import read_metrics
    from training.trainer import train

    run_dir = Path(tempfile.mkdtemp(prefix="bench-train-maze-"))
    config = load_config(overrides=[f"trainer.run_dir={run_dir}", *overrides])
    target = config.trainer.target_success or 0.9
    machine_at_start = machine_info()  # the load average before training started
    start = time.perf_counter()
    summary = train(config)
    wall = time.perf_counter() - start
    records = read_metrics(run_dir)
    evals = [
        {"iteration": r["iteration"], "greedy_success": r["eval/greedy_success"], "elapsed_s": r["time/elapsed"]}
        for r in records
        if r.get("eval/greedy_success") is not None
    ]
    reached = next((e for e in evals if e["greedy_success"] >= target), None)
    phase_totals = {p: sum(r.get(f"time/{p}", 0.0) or 0.0 for r in records) for p in PHASES}
    sft_seconds = records[0]["time/elapsed"] - (records[0].get("time/eval") or 0.0) if records else 0.0
    result = {
        "benchmark": "train_maze",
        "machine_at_start": machine_at_start,
        "command": "agent-rl train " + " ".join(overrides),
        "config": config_to_dict(config),
        "target_greedy_success": target,
        "reached_target": reached is not None,
        "wall_time_to_target_s": reached["elapsed_s"] if reached else None,
        "iterations_to_target": reached["iteration"] if reached else None,
        "total_wall_s": wall,
        "best_greedy_success": summary["best_greedy_success"],
        "iterations_run": summary["iterations"],
        "eval_curve": evals,
        "rollout_success_curve": rollout_success_curve(records),
        "phase_seconds": {"sft_and_setup": sft_seconds, **phase_totals},
        "phase_fraction": {p: v / max(wall, 1e-9) for p, v in {"sft_and_setup": sft_seconds, **phase_totals}.items()},
        "run_dir": str(run_dir),
    }
    write_result("train_maze", result)
    print(json.dumps({k: result[k] for k in ("reached_target", "wall_time_to_target_s", "best_greedy_success", "phase_seconds")}, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
