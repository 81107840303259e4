"""The GPU check: its dry run on the CPU (the same code path, embedded model), and its refusal to
run without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from agent_rl.benchmarks import gpu_check


@pytest.mark.slow
def test_the_dry_run_checks_parity_a_training_run_and_a_process_group(tmp_path):
    assert gpu_check.main(["--dry-run", "--out", str(tmp_path), "--label", "dry"]) == 0
    result = json.loads((tmp_path / "dry.json").read_text())
    assert result["dry_run"] and result["model"] == "embedded" and result["label"] == "dry"
    checks = result["checks"]
    assert checks["matmul_peak_tflops"]["bfloat16"] > 0 and checks["matmul_peak_tflops"]["float32"] > 0
    parity = checks["parity"]
    assert parity["engine_vs_learner_fp32"]["within_tolerance"]  # float32: the control agrees to 1e-3
    assert parity["engine_vs_learner_fp32"]["max"] <= gpu_check.PARITY_TOLERANCE["fp32"]
    assert parity["engine_vs_learner_bf16"]["tokens"] > 0 and parity["learner_bf16_vs_fp32"]["mean"] >= 0
    run = checks["rl_run"]
    sizes = gpu_check.SIZES["dry-run"]
    assert [row["iteration"] for row in run["per_iteration"]] == list(range(sizes["iterations"] + 1))
    assert run["trajectories_per_iteration"] == sizes["n_groups"] * sizes["group_size"]
    learner = run["per_iteration"][1]
    # MFU is 6 * parameters * forwarded tokens / update seconds, over the measured bf16 peak.
    expected = 6 * run["parameters"] * learner["update/forwarded_tokens"] / learner["time/update"] / 1e12
    assert learner["learner_tflops"] == pytest.approx(expected)
    assert learner["learner_mfu_bf16"] == pytest.approx(expected / checks["matmul_peak_tflops"]["bfloat16"])
    assert run["greedy_success_start"] is not None and run["greedy_success_end"] is not None
    assert checks["distributed"] == {
        **checks["distributed"],
        "backend": "gloo",
        "values_correct": True,
        "world_size": 1,
    }


@pytest.mark.slow
def test_skip_rl_run_records_the_skip_and_still_runs_the_other_checks(tmp_path):
    assert gpu_check.main(["--dry-run", "--skip-rl-run", "--out", str(tmp_path), "--label", "dry"]) == 0
    checks = json.loads((tmp_path / "dry.json").read_text())["checks"]
    assert checks["rl_run"] == {"skipped": "--skip-rl-run"}
    assert checks["parity"]["engine_vs_learner_fp32"]["within_tolerance"]
    assert checks["distributed"]["values_correct"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_without_cuda_it_says_so_in_one_line_and_exits_non_zero(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no CUDA device" in err and "--dry-run" in err
    assert not list(tmp_path.iterdir())  # nothing written
