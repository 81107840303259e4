"""The credit-assignment benchmark's --quick grid: a smoke test of the whole pipeline (structure only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from agent_rl.cli import main


@pytest.mark.slow
def test_quick_grid_writes_every_output_and_resumes(tmp_path):
    out = tmp_path / "grid"
    # The installed console script, from outside the checkout: the way users run it.
    console_script = Path(sys.executable).with_name("agent-rl")
    run = subprocess.run([str(console_script), "bench", "credit", "--quick", "--out", str(out)], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True and summary["seeds"] == [0, 1]
    assert summary["training_seconds"]["cells_s"] > 0 and summary["training_seconds"]["warm_starts_s"] > 0
    methods = summary["results"]["maze"]
    assert set(methods) == {"grpo", "gigpo-state"}
    for result in methods.values():
        assert set(result["seeds"]) == {"0", "1"}
        assert 0.0 <= result["final_success"]["mean"] <= 1.0 and result["final_success"]["ci95"] >= 0.0
        assert len(result["curve"]["mean"]) == len(result["curve"]["iterations"]) == 3  # iterations 0, 1, 2
        assert result["curve"]["env_steps"][0] == 0 and result["curve"]["env_steps"][-1] > 0
    table = (out / "summary.md").read_text().splitlines()
    assert len(table) == 2 + 2 and table[2].startswith("| maze | ")
    assert (out / "success_maze.png").stat().st_size > 0
    metrics = sorted(out.glob("runs/maze/*/seed*/metrics.jsonl"))
    assert len(metrics) == 4
    stamps = [m.stat().st_mtime_ns for m in metrics]
    # A rerun skips finished cells: no run is trained again.
    assert main(["bench", "credit", "--quick", "--out", str(out)]) == 0
    assert [m.stat().st_mtime_ns for m in metrics] == stamps


def test_the_full_grid_warm_starts_as_committed_whatever_the_defaults():
    """The committed grid cloned 400 episodes in batches of 16 at a constant rate: its overrides name
    that, so changing the main job's warm start does not change what a rerun of the grid trains."""
    from agent_rl.config import load_config
    from benchmarks.credit_assignment import COMMON, FULL_GRID

    for env in FULL_GRID:
        sft = load_config(overrides=[*COMMON, *env.overrides]).sft
        assert (sft.episodes, sft.lr_schedule, sft.batch_size, sft.lr, sft.perturb) == (400, "constant", 16, 1e-3, 0.0), env.name
