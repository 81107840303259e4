"""The SmolLM2 speed benchmark: an arm's summary on hand-made metrics, its arm checks, and a tiny
end-to-end run on the embedded policy."""

from __future__ import annotations

import json

import pytest

from agent_rl.benchmarks import smollm2_speed
from agent_rl.training.infra.distributed import bf16_supported


def _iteration(k: int, rollout: float, update: float, forwarded: float, **extra) -> dict:
    return {
        "iteration": k,
        "time/rollout": rollout,
        "time/advantage": 0.5,
        "time/update": update,
        "time/sync": 1.5,
        "rollout/rows": 50.0,
        "rollout/tokens_per_s": 100.0,
        "update/forwarded_tokens": forwarded,
        "rollout/success_rate": 0.5,
        "rollout/invalid_rate": 0.1,
        **extra,
    }


def test_arm_summary_by_hand():
    records = [
        {"iteration": 0, "time/elapsed": 5.0},
        _iteration(1, 10.0, 20.0, 4000.0, **{"time/elapsed": 40.0}),
        _iteration(2, 30.0, 40.0, 8000.0, **{"time/elapsed": 130.0, "time/eval": 16.0, "eval/greedy_success": 0.5}),
    ]
    peaks = {"float32": 1e6, "bfloat16": 4e6}
    s = smollm2_speed.arm_summary(records, non_embedding=10, peaks=peaks, lora=False, eval_episodes=8)
    assert s["iterations"] == 2 and s["phase_s"] == {"rollout": 20.0, "advantage": 0.5, "update": 30.0, "sync": 1.5}
    assert s["iteration_s"] == 52.0 and s["rows_per_iteration"] == 50.0 and s["forwarded_tokens_per_row"] == 120.0
    assert s["rollout_rows_per_s"] == 100 / 40 and s["learner_tokens_per_s"] == 12000 / 60
    assert s["learner_flops_per_s"] == 6 * 10 * 12000 / 60
    assert s["learner_fraction_of_fp32_peak"] == pytest.approx(12000 / 1e6)
    assert s["learner_fraction_of_bf16_peak"] == pytest.approx(12000 / 4e6)
    assert s["eval_s_per_episode"] == 2.0 and s["eval_greedy_success"] == 0.5 and s["train_success"] == [0.5, 0.5]
    assert (
        smollm2_speed.arm_summary(records, 10, peaks, lora=True, eval_episodes=8)["learner_flops_per_s"]
        == 4 * 10 * 12000 / 60
    )


def test_unknown_arms_are_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        smollm2_speed.main(["--arms", "fp32-hf,fp16-tpu"])
    assert "fp16-tpu" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(not bf16_supported(__import__("torch").device("cpu")), reason="needs a CPU with AVX512-BF16 or AMX")
def test_a_tiny_run_times_its_arm_against_itself(tmp_path):
    path = smollm2_speed.main(
        [
            "--out",
            str(tmp_path),
            "--parts",
            "smollm2",
            "--arms",
            "fp32-hf",
            "--iterations",
            "1",
            "--eval-episodes",
            "2",
            "policy=embedded",
            "sft.steps=1",
            "sft.episodes=2",
            "sft.batch_size=2",
            "rollout.n_groups=1",
            "rollout.group_size=2",
            "rollout.max_turns=2",
            "optim.minibatch_size=2",
        ]
    )
    result = json.loads(path.read_text())["smollm2"]
    arm = result["arms"]["fp32-hf"]
    assert arm["iterations"] == 1 and arm["speedup_per_iteration"] == 1.0 and arm["eval_s_per_episode"] > 0
    assert set(result["warm_start"]) == {"fp32", "bf16"} and result["warm_start"]["bf16"]["sft/steps_taken"] == 1.0
    assert result["parity"]["engine_vs_learner_fp32"]["within_tolerance"]
    assert not any(tmp_path.glob("**/checkpoints"))  # nothing of 0.5 GB left behind
    # --report summarizes the same logs again, training nothing.
    logs = sorted(p.stat().st_mtime_ns for p in tmp_path.glob("**/metrics.jsonl"))
    again = json.loads(smollm2_speed.main(["--out", str(tmp_path), "--report", "--arms", "fp32-hf"]).read_text())[
        "smollm2"
    ]
    assert again["arms"] == result["arms"] and again["warm_start"] == result["warm_start"]
    assert sorted(p.stat().st_mtime_ns for p in tmp_path.glob("**/metrics.jsonl")) == logs


def test_speedups_by_hand():
    def arm(iteration_s, rows_per_s, tokens_per_s, eval_s):
        return {
            "iteration_s": iteration_s,
            "rows_per_iteration": 100.0,
            "forwarded_tokens_per_row": 50.0,
            "rollout_rows_per_s": rows_per_s,
            "learner_tokens_per_s": tokens_per_s,
            "eval_s_per_episode": eval_s,
            "phase_s": {"rollout": 0.0, "advantage": 1.0, "update": 0.0, "sync": 3.0},
        }

    arms = {"base": arm(60.0, 5.0, 250.0, 3.0), "fast": arm(20.0, 10.0, 500.0, 1.5)}
    arms["fast"]["rows_per_iteration"] = 40.0  # sampled other rows: its own iterations are not the baseline's
    smollm2_speed.add_speedups(arms, "base")
    assert arms["base"]["iteration_s_on_baseline_workload"] == 100 / 5 + 5000 / 250 + 4
    assert arms["fast"]["iteration_s_on_baseline_workload"] == 100 / 10 + 5000 / 500 + 4
    assert arms["fast"]["speedup_on_baseline_workload"] == pytest.approx(44 / 24)
    assert arms["fast"]["speedup_per_iteration"] == 3.0 and arms["fast"]["speedup_per_eval_episode"] == 2.0
    assert arms["base"]["speedup_on_baseline_workload"] == 1.0
