"""The main-job comparison: its statistics on hand-made curves, its arms on a stand-in trainer (no training)."""

from __future__ import annotations

import argparse
import json

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


def _config_of(command: list[str]):
    """The config an ``agent-rl train`` command line trains with."""
    from agent_rl.config import load_config

    at = command.index("--config")
    return load_config(command[at + 1], command[at + 2 :])


def _args(tmp_path, **kwargs) -> argparse.Namespace:
    defaults = dict(
        out=tmp_path, engine="hf", iterations=0, eval_every=5, eval_episodes=4, threads=1, workers=2, seeds=[3]
    )
    return argparse.Namespace(**{**defaults, "warm_start": "default", **kwargs})


def test_warm_start_arms_train_their_own_warm_start(tmp_path, monkeypatch):
    """A warm-start arm passes its overrides to one training run from scratch (its own warm start);
    a learner arm starts from the seed's shared warm start with cloning off. The one-point curves of
    warm starts alone (``--iterations 0``) summarize like any others."""
    import agent_rl.benchmarks.main_job_defaults as bench

    monkeypatch.setattr(bench, "sft_model", lambda run: run.run_dir / "sft")
    args = _args(tmp_path)
    configs = [_config_of(bench.arm_run(arm, 3, args).command()) for arm in ("explore-900", "previous", "shortest-300")]
    configs.append(_config_of(bench.arm_run("precision-bf16", 3, args).command()))
    own, learner, before, bf16 = configs
    assert (own.sft.steps, own.env.kwargs["oracle"], own.sft.mode, own.trainer.seed) == (900, "explore", "auto", 3)
    assert (own.sft.episodes, own.sft.lr_schedule, own.sft.batch_size, own.sft.perturb) == (400, "constant", 16, 0.0)
    assert own.policy.name_or_path == "embedded" and own.trainer.torch_threads == 1
    assert learner.sft.mode == "none"
    assert learner.policy.name_or_path == str(tmp_path / "warm_start" / "seed3" / "sft")
    # The warm start the committed comparisons used, whatever the embedded defaults are now.
    assert (before.sft.steps, before.sft.episodes, before.sft.lr_schedule, before.sft.batch_size) == (
        300,
        400,
        "constant",
        16,
    )
    assert before.env.kwargs["oracle"] == "shortest"
    # The main job's own warm start, under bf16 autocast.
    assert (bf16.policy.precision, bf16.sft.steps, bf16.sft.mode) == ("bf16", 1200, "auto")
    record = {
        "iteration": 0,
        "eval/greedy_success": 0.5,
        "eval/greedy_invalid_rate": 0.1,
        "time/elapsed": 100.0,
        "time/eval": 30.0,
    }
    one_point = bench.curve([record])
    assert one_point == {
        **one_point,
        "iteration": [0],
        "greedy_success": [0.5],
        "seconds_per_iteration": None,
        "warm_start_s": 70.0,
    }
    summary = bench.summarize(
        {
            "a": {0: one_point, 1: one_point},
            "b": {0: one_point, 1: {**one_point, "greedy_success": [0.75], "warm_start_s": 50.0}},
        },
        [0, 1],
    )
    assert summary["b"]["paired_vs_a"]["per_seed_final"] == pytest.approx([0.0, 0.25])
    assert summary["b"]["auc_greedy_success"]["mean"] == pytest.approx(0.625)
    assert (summary["a"]["warm_start_s"]["mean"], summary["b"]["warm_start_s"]["mean"]) == (70.0, 60.0)


@pytest.mark.parametrize("choice, sft_steps, oracle", [("default", 1200, "explore"), ("before", 300, "shortest")])
def test_the_shared_warm_start_is_the_main_jobs_or_the_one_before(tmp_path, choice, sft_steps, oracle):
    import agent_rl.benchmarks.main_job_defaults as bench

    run = bench.warm_start(2, _args(tmp_path, warm_start=choice))
    config = _config_of(run.command())
    assert run.run_dir == tmp_path / "warm_start" / "seed2"
    assert (config.sft.steps, config.env.kwargs["oracle"], config.trainer.iterations, config.trainer.seed) == (
        sft_steps,
        oracle,
        0,
        2,
    )


def test_arms_train_after_their_warm_start_and_keep_only_their_metrics(tmp_path, monkeypatch, capsys):
    """Runs as processes that log at once: each learner arm starts once its seed's shared warm start has
    its model, a warm-start arm needs none; a rerun trains nothing; a committed warm start without its
    checkpoint is an error that says what to do."""
    import sys

    import agent_rl.benchmarks.harness as harness
    import agent_rl.benchmarks.main_job_defaults as bench

    started = []

    def command(run):
        started.append(run.name)
        if run.start:  # the shared warm start has saved its model by now
            assert (run.start()[0]).startswith("policy=") and run.start()[1] == "sft.mode=none"
        lines = "".join(
            json.dumps({"iteration": k, "eval/greedy_success": 0.5, "eval/greedy_invalid_rate": 0.0}) + "\n"
            for k in range(run.iterations + 1)
        )
        return [
            sys.executable,
            "-c",
            f"import pathlib; run = pathlib.Path({str(run.run_dir)!r}); (run / 'metrics.jsonl').write_text({lines!r}); "
            "(run / 'checkpoints').mkdir()",
        ]

    monkeypatch.setattr(harness.TrainRun, "command", command)
    monkeypatch.setattr(bench, "sft_model", lambda run: run.run_dir / "checkpoints")
    monkeypatch.setattr(harness.time, "sleep", lambda seconds: None)
    argv = ["--arms", "previous,explore-900", "--seeds", "0", "1", "--iterations", "2", "--eval-every", "1"]
    argv += ["--workers", "2", "--out", str(tmp_path)]
    assert main(argv) == 0
    assert sorted(started) == sorted(
        ["warm start / seed 0", "warm start / seed 1", "previous / seed 0", "previous / seed 1"]
        + ["explore-900 / seed 0", "explore-900 / seed 1"]
    )
    assert started.index("previous / seed 0") > started.index("warm start / seed 0")
    assert (tmp_path / "warm_start/seed0/checkpoints").is_dir() and not (
        tmp_path / "runs/previous/seed0/checkpoints"
    ).exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["seeds"] == [0, 1] and summary["curves"]["previous"]["0"]["iteration"] == [0, 1, 2]
    started.clear()
    assert main(argv) == 0 and started == []
    # A fresh clone: the warm start's metrics without its checkpoint, a learner arm left to train.
    (tmp_path / "warm_start/seed1/checkpoints").rmdir()
    (tmp_path / "runs/previous/seed1/metrics.jsonl").unlink()
    assert main(argv) == 1
    assert "holds a finished warm start without its checkpoint" in capsys.readouterr().err and started == []


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
