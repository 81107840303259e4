"""The long-prompt run benchmark: costs read from a run's metrics records, and its arms."""

from __future__ import annotations

import pytest

from agent_rl.benchmarks.long_prompt_run import arm_overrides, main, run_costs


def test_run_costs_leave_evaluations_out_of_the_warm_start_and_the_iterations():
    records = [
        {"iteration": 0, "time/elapsed": 100.0, "time/eval": 10.0, "sft/steps_taken": 300.0},
        {"iteration": 1, "time/elapsed": 150.0, "time/rollout": 20.0, "time/update": 25.0, "rollout/rows": 300.0},
        {"iteration": 2, "time/elapsed": 230.0, "time/eval": 12.0, "time/rollout": 30.0, "time/update": 33.0},
    ]
    costs = run_costs(records)
    assert costs["warm_start_s"] == 90.0 and costs["sft_steps"] == 300.0 and costs["format_accuracy"] is None
    assert [i["total_s"] for i in costs["iterations"]] == [50.0, 68.0]  # 150 - 100; 230 - 12 - 150
    assert [(i["rollout_s"], i["update_s"], i["rows"]) for i in costs["iterations"]] == [
        (20.0, 25.0, 300.0),
        (30.0, 33.0, None),
    ]


def test_the_covering_arm_trains_the_tokenizer_on_the_game():
    assert arm_overrides("bundled", "textarena/FrozenLake-v0") == ()
    assert arm_overrides("covering", "textarena/FrozenLake-v0") == ("policy.tokenizer_envs=[textarena/FrozenLake-v0]",)
    assert arm_overrides("covering-bf16", "textarena/FrozenLake-v0") == (
        "policy.tokenizer_envs=[textarena/FrozenLake-v0]",
        "policy.precision=bf16",
    )


def test_an_unknown_arm_is_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit):
        main(["--arms", "covering,fp8"])
    assert "unknown arm(s) fp8: use bundled, covering, covering-bf16" in capsys.readouterr().err
