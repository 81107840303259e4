"""The SmolLM2 recipe benchmark: its summary on hand-made metrics, and a tiny run of the recipe's pipeline."""

from __future__ import annotations

import json

import pytest

from agent_rl.benchmarks import smollm2_recipe


def test_summary_sums_phases_and_derives_throughput_by_hand():
    records = [
        {"iteration": 0, "sft/steps": 2.0, "time/elapsed": 10.0, "time/eval": 4.0, "eval/greedy_success": 0.25},
        {
            "iteration": 1,
            "time/elapsed": 30.0,
            "time/rollout": 5.0,
            "time/advantage": 0.5,
            "time/update": 10.0,
            "time/sync": 1.0,
            "rollout/tokens_per_s": 20.0,
            "update/forwarded_tokens": 1000.0,
            "rollout/success_rate": 0.5,
            "rollout/invalid_rate": 0.1,
            "update/ratio_max": 1.2,
            "update/clip_frac": 0.1,
        },
        {
            "iteration": 2,
            "time/elapsed": 50.0,
            "time/rollout": 5.0,
            "time/advantage": 0.5,
            "time/update": 10.0,
            "time/sync": 1.0,
            "time/eval": 4.0,
            "eval/greedy_success": 0.75,
            "rollout/tokens_per_s": 10.0,
            "update/forwarded_tokens": 3000.0,
            "rollout/success_rate": 1.0,
            "rollout/invalid_rate": 0.0,
            "update/ratio_max": 1.5,
            "update/clip_frac": 0.3,
        },
    ]
    s = smollm2_recipe.summarize(records, non_embedding_parameters=100, peak=1e6)
    assert s["curve"]["iteration"] == [0, 2] and s["curve"]["greedy_success"] == [0.25, 0.75]
    assert s["phase_seconds"] == {"rollout": 10.0, "advantage": 1.0, "update": 20.0, "sync": 2.0, "eval": 8.0}
    assert s["mean_phase_seconds_per_iteration"]["update"] == 10.0
    assert s["rollout_tokens_generated"] == 20 * 5 + 10 * 5 and s["rollout_tokens_per_s"] == 150 / 10
    assert s["learner_forwarded_tokens"] == 4000 and s["learner_tokens_per_s"] == 200
    assert s["learner_flops_per_s"] == 6 * 100 * 4000 / 20 and s["learner_fraction_of_matmul_peak"] == pytest.approx(
        0.12
    )
    assert s["warm_start"] == {"sft/steps": 2.0} and s["wall_s"] == 50.0
    assert s["ratio_max"] == 1.5 and s["clip_frac_mean"] == pytest.approx(0.2)
    lora = smollm2_recipe.summarize(records, non_embedding_parameters=100, peak=1e6, weight_gradients=False)
    assert lora["learner_flops_per_s"] == 4 * 100 * 4000 / 20  # no weight gradients for frozen weights


def test_a_short_run_of_the_recipe_writes_its_curve_and_no_checkpoints(tmp_path):
    # The recipe's pipeline (admissible parser, oracle warm start, gigpo) on the embedded policy, tiny.
    path = smollm2_recipe.main(
        [
            "--out",
            str(tmp_path),
            "policy=embedded",
            "engine=hf",
            "sft.steps=1",
            "sft.episodes=2",
            "sft.batch_size=2",
            "trainer.iterations=1",
            "trainer.eval_every=1",
            "trainer.eval_episodes=2",
            "rollout.n_groups=1",
            "rollout.group_size=2",
            "rollout.max_turns=2",
            "optim.minibatch_size=2",
            "logging.console=false",
        ]
    )
    result = json.loads(path.read_text())
    assert result["curve"]["iteration"] == [0, 1] and result["matmul_peak_flops_per_s"] > 0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert result["learner_forwarded_tokens"] == records[-1]["update/forwarded_tokens"]  # 0 when every advantage is 0
    assert (tmp_path / "run" / "metrics.jsonl").is_file() and not (tmp_path / "run" / "checkpoints").exists()
    assert result["zero_shot"] is None or result["zero_shot"]["parser"] == "admissible"
    # A run summarized afterwards (--from-run) gives the same curve and counts.
    again = json.loads(
        smollm2_recipe.main(["--out", str(tmp_path / "again"), "--from-run", str(tmp_path / "run")]).read_text()
    )
    for key in ("curve", "phase_seconds", "learner_forwarded_tokens", "warm_start", "best_greedy_success"):
        assert again[key] == result[key], key
