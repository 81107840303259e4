"""The main-job comparison: its statistics on hand-made curves, its arms on a stand-in trainer (no training)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent_rl.benchmarks.main_job_defaults import auc, main, summarize


def curve(values):
    return {"iteration": [0, 2, 4], "greedy_success": values}


def test_auc_is_the_trapezoid_mean_over_the_span():
    # (0.5 + 0.7) / 2 * 2 + (0.7 + 0.3) / 2 * 2 = 2.2 over a span of 4
    assert auc(curve([0.5, 0.7, 0.3])) == pytest.approx(0.55)


def test_summary_pairs_each_seed_with_the_baseline():
    curves = {
        "previous": {0: curve([0.5, 0.6, 0.6]), 1: curve([0.4, 0.4, 0.5]), 2: curve([0.6, 0.7, 0.7])},
        "new": {0: curve([0.5, 0.6, 0.7]), 1: curve([0.4, 0.5, 0.7]), 2: curve([0.6, 0.6, 0.6])},
    }
    summary = summarize(curves, [0, 1, 2])
    assert summary["previous"]["final_greedy_success"]["mean"] == pytest.approx(0.6)
    assert summary["new"]["mean_curve"] == pytest.approx([0.5, 17 / 30, 2 / 3])
    paired = summary["new"]["paired_vs_previous"]
    assert paired["per_seed_final"] == pytest.approx([0.1, 0.2, -0.1])
    assert paired["final"]["mean"] == pytest.approx(0.2 / 3)
    assert (paired["final"]["wins"], paired["final"]["losses"]) == (2, 1)
    assert paired["final"]["ci_low"] < paired["final"]["mean"] < paired["final"]["ci_high"]
    assert "paired_vs_previous" not in summary["previous"]


def test_summary_pairs_each_arm_with_every_arm_listed_before_it():
    curves = {
        "a": {0: curve([0.5, 0.5, 0.5]), 1: curve([0.4, 0.4, 0.4])},
        "b": {0: curve([0.5, 0.5, 0.7]), 1: curve([0.4, 0.4, 0.5])},
        "c": {0: curve([0.5, 0.5, 0.6]), 1: curve([0.4, 0.4, 0.8])},
    }
    summary = summarize(curves, [0, 1])
    assert [k for k in summary["c"] if k.startswith("paired")] == ["paired_vs_a", "paired_vs_b"]
    assert summary["c"]["paired_vs_a"]["per_seed_final"] == pytest.approx([0.1, 0.4])
    assert summary["c"]["paired_vs_b"]["per_seed_final"] == pytest.approx([-0.1, 0.3])
    assert [k for k in summary["b"] if k.startswith("paired")] == ["paired_vs_a"]


def test_unknown_arm_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit):
        main(["--arms", "previous,bogus", "--summarize-only"])
    assert "unknown arm(s) bogus" in capsys.readouterr().err


def test_warm_start_arms_train_their_own_warm_start(tmp_path, monkeypatch):
    """A warm-start arm passes its overrides to one training run from scratch (its own warm start);
    a learner arm starts from the seed's shared warm start with cloning off. The one-point curves of
    warm starts alone (``--iterations 0``) summarize like any others."""
    import agent_rl.benchmarks.main_job_defaults as bench
    import agent_rl.training.loop.trainer

    calls = []

    def fake_train(config):
        calls.append(config)
        run = Path(config.trainer.run_dir)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text(
            json.dumps(
                {
                    "iteration": 0,
                    "eval/greedy_success": 0.5,
                    "eval/greedy_invalid_rate": 0.1,
                    "time/elapsed": 100.0,
                    "time/eval": 30.0,
                }
            )
            + "\n"
        )

    monkeypatch.setattr(agent_rl.training.loop.trainer, "train", fake_train)
    monkeypatch.setattr(bench, "warm_start", lambda seed, args: tmp_path / "shared")
    args = argparse.Namespace(out=tmp_path, engine="hf", iterations=0, eval_every=5, eval_episodes=4, threads=1)
    own = bench.curve(bench.run_arm("explore-900", 3, args))
    bench.run_arm("previous", 3, args)
    bench.run_arm("shortest-300", 3, args)
    bench.run_arm("precision-bf16", 3, args)
    assert (calls[0].sft.steps, calls[0].env.kwargs["oracle"], calls[0].sft.mode, calls[0].trainer.seed) == (
        900,
        "explore",
        "auto",
        3,
    )
    assert (calls[0].sft.episodes, calls[0].sft.lr_schedule, calls[0].sft.batch_size, calls[0].sft.perturb) == (
        400,
        "constant",
        16,
        0.0,
    )
    assert calls[0].policy.name_or_path == "embedded"
    assert calls[1].sft.mode == "none" and calls[1].policy.name_or_path == str(tmp_path / "shared")
    # The warm start the committed comparisons used, whatever the embedded defaults are now.
    before = calls[2].sft
    assert (before.steps, before.episodes, before.lr_schedule, before.batch_size) == (300, 400, "constant", 16)
    assert calls[2].env.kwargs["oracle"] == "shortest"
    # The main job's own warm start, under bf16 autocast.
    assert (calls[3].policy.precision, calls[3].sft.steps, calls[3].sft.mode) == ("bf16", 1200, "auto")
    assert own == {
        **own,
        "iteration": [0],
        "greedy_success": [0.5],
        "seconds_per_iteration": None,
        "warm_start_s": 70.0,
    }
    summary = bench.summarize(
        {"a": {0: own, 1: own}, "b": {0: own, 1: {**own, "greedy_success": [0.75], "warm_start_s": 50.0}}}, [0, 1]
    )
    assert summary["b"]["paired_vs_a"]["per_seed_final"] == pytest.approx([0.0, 0.25])
    assert summary["b"]["auc_greedy_success"]["mean"] == pytest.approx(0.625)
    assert (summary["a"]["warm_start_s"]["mean"], summary["b"]["warm_start_s"]["mean"]) == (70.0, 60.0)


@pytest.mark.parametrize("choice, sft_steps, oracle", [("default", 1200, "explore"), ("before", 300, "shortest")])
def test_the_shared_warm_start_is_the_main_jobs_or_the_one_before(tmp_path, monkeypatch, choice, sft_steps, oracle):
    import agent_rl.benchmarks.main_job_defaults as bench
    import agent_rl.training.infra.checkpoint
    import agent_rl.training.loop.trainer

    calls = []

    def fake_train(config):
        calls.append(config)
        Path(config.trainer.run_dir).mkdir(parents=True)

    monkeypatch.setattr(agent_rl.training.loop.trainer, "train", fake_train)
    monkeypatch.setattr(
        agent_rl.training.infra.checkpoint,
        "find_checkpoint",
        lambda run_dir, pointer: argparse.Namespace(model_dir=run_dir / pointer),
    )
    args = argparse.Namespace(out=tmp_path, engine="hf", threads=1, warm_start=choice)
    assert bench.warm_start(2, args) == tmp_path / "warm_start" / "seed2" / "sft"
    (config,) = calls
    assert (config.sft.steps, config.env.kwargs["oracle"], config.trainer.iterations, config.trainer.seed) == (
        sft_steps,
        oracle,
        0,
        2,
    )


@pytest.mark.parametrize("arm", ["previous", "new", "mission", "env-penalty", "credit-penalty", "step-stats"])
def test_learner_arms_name_every_learner_setting_they_depend_on(arm):
    """A learner arm resolves to the same learner whatever the embedded defaults are: its result
    reproduces after a default changes."""
    from agent_rl.benchmarks.main_job_defaults import ARMS
    from agent_rl.config import load_config, resolve_algorithm

    def learner(config):
        algo = resolve_algorithm(config.algo)
        return (
            algo.advantage,
            algo.step_normalize,
            algo.loss,
            algo.gamma,
            algo.invalid_penalty,
            config.optim.lr,
            config.optim.minibatches,
        )

    odd_algo = {"preset": "rloo", "gamma": 0.5, "invalid_penalty": 0.9}
    odd_optim = {"lr": 0.123, "minibatches": 3}
    odd = load_config(overrides=list(ARMS[arm]), base={"algo": odd_algo, "optim": odd_optim})
    assert learner(odd) == learner(load_config(overrides=list(ARMS[arm])))
