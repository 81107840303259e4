"""The LLM credit benchmark: its gate, settings check, statistics and report, and the --quick grid."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from agent_rl.benchmarks import credit_assignment as bench
from agent_rl.benchmarks.report import area_under, p_value
from agent_rl.cli import main as cli_main


def _records(iterations, greedy, sampled=None, invalid=0.1, length=9.0, grouped=None):
    """metrics.jsonl records of a finished cell: one per iteration 0..max, evaluations at ``iterations``
    (sampled success half of greedy unless given, so the two measures differ)."""
    sampled = [g / 2 for g in greedy] if sampled is None else sampled
    evals = {it: (s, g) for it, s, g in zip(iterations, sampled, greedy)}
    records = []
    for it in range(iterations[-1] + 1):
        record = {
            "iteration": it,
            "time/elapsed": 10.0 * (it + 1),
            "time/rollout": 3.0,
            "time/advantage": 1.0,
            "time/update": 4.0,
            "time/sync": 0.0,
        }
        if it > 0:
            record["rollout/invalid_rate"] = invalid / 2
        if grouped is not None and it > 0:
            record["anchors/grouped_fraction"] = grouped
            record["anchors/mean_group_size"] = 3.0
        if it in evals:
            record.update(
                {
                    "eval/sampled_success": evals[it][0],
                    "eval/greedy_success": evals[it][1],
                    "eval/sampled_invalid_rate": invalid,
                    "eval/sampled_length": length,
                }
            )
        records.append(record)
    return records


def _write(run_dir: Path, records) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def _write_cell(job, records) -> None:
    """A finished cell as the grid writes it: its seed's warm start logged iteration 0 with the shared
    evaluation, the cell logged its own iteration 0 without one, then its iterations."""
    _write(job.warm_start.run_dir, records[:1])
    _write(job.run_dir, [{k: v for k, v in records[0].items() if not k.startswith("eval/")}, *records[1:]])


def test_area_under_is_the_mean_height_of_the_curve():
    assert area_under(np.array([0.0, 5, 10]), np.array([0.2, 0.4, 0.6])) == pytest.approx(0.4)
    # Uneven spacing: (0 + 1) / 2 * 10 + 1 * 20 = 25 over 30 iterations.
    assert area_under(np.array([0.0, 10, 30]), np.array([0.0, 1.0, 1.0])) == pytest.approx(25 / 30)
    assert area_under(np.array([3.0]), np.array([0.7])) == pytest.approx(0.7)


def test_p_values_are_never_shown_as_zero():
    assert [p_value(p) for p in (0.1257, 0.0005, 0.00049, 1.0)] == ["= 0.126", "= 0.001", "< 0.001", "= 1.000"]


def test_pilot_gate_compares_the_last_two_evaluations_with_iteration_zero():
    records = _records([0, 5, 10, 15], [0.30, 0.35, 0.44, 0.48])
    gate = bench.pilot_gate("maze", records, 15.0)
    assert gate.start == 0.30 and gate.end == pytest.approx(0.46)
    assert gate.gain == pytest.approx(16.0) and gate.passed
    assert not bench.pilot_gate("maze", records, 16.5).passed
    assert "failed" in bench.pilot_gate("maze", records, 16.5).describe()
    assert "+16.0 points" in gate.describe()
    with pytest.raises(ValueError, match="iteration-0 evaluation and two more"):
        bench.pilot_gate("maze", _records([0, 5], [0.3, 0.5]), 15.0)


def _grid(tmp_path, methods=("trajectory", "gigpo-state")):
    env = bench.Environment("maze", "a test maze", bench.QUICK_GRID[0].overrides, methods)
    return bench.plan((env,), 3, tmp_path)


def test_warm_starts_launch_before_any_cell_and_the_pilot_runs_first(tmp_path):
    jobs = _grid(tmp_path)["maze"]
    order = [(job.seed, job.method) for job in bench.launch_order(jobs)]
    assert order == [
        (0, None),
        (1, None),
        (2, None),
        (0, "trajectory"),
        (0, "gigpo-state"),
        (1, "trajectory"),
        (1, "gigpo-state"),
        (2, "trajectory"),
        (2, "gigpo-state"),
    ]
    assert bench.pilot_of(jobs) is bench.launch_order(jobs)[3]


def test_summary_pairs_each_method_with_the_baseline_on_shared_seeds(tmp_path):
    jobs = _grid(tmp_path)
    base_auc = {0: [0.2, 0.3, 0.4], 1: [0.1, 0.1, 0.1], 2: [0.5, 0.5, 0.6]}
    step_auc = {0: [0.2, 0.5, 0.6], 1: [0.1, 0.2, 0.3], 2: [0.5, 0.4, 0.4]}
    for job in jobs["maze"]:
        if job.method == "trajectory":
            _write_cell(job, _records([0, 5, 10], base_auc[job.seed]))
        elif job.method == "gigpo-state" and job.seed != 2:  # seed 2 of the treatment is unfinished
            _write_cell(job, _records([0, 5, 10], step_auc[job.seed], invalid=0.05, grouped=0.9))
    summary = bench.summarize(jobs, {})["maze"]
    assert summary["baseline"] == "trajectory" and summary["gate"] is None
    # 5 finished cells of 11 iterations, 10 s each as logged, and 3 finished warm starts of 10 s.
    assert summary["compute_seconds"] == {"cells": 550.0, "warm_starts": 30.0}
    trajectory, step = summary["methods"]["trajectory"], summary["methods"]["gigpo-state"]
    # Greedy AUCs (trapezoid over 0, 5, 10): trajectory 0.3, 0.1, 0.525; gigpo-state 0.45, 0.2.
    assert [trajectory["seeds"][s]["greedy_auc"] for s in (0, 1, 2)] == pytest.approx([0.3, 0.1, 0.525])
    assert [trajectory["seeds"][s]["sampled_auc"] for s in (0, 1, 2)] == pytest.approx([0.15, 0.05, 0.2625])
    assert "paired" not in trajectory
    paired = step["paired"]
    assert paired["seeds"] == [0, 1]
    assert paired["greedy_auc"]["per_seed"] == pytest.approx([0.15, 0.1])
    assert paired["greedy_auc"]["mean"] == pytest.approx(0.125) and paired["greedy_auc"]["wins"] == 2
    assert paired["sampled_auc"]["per_seed"] == pytest.approx([0.075, 0.05])
    assert paired["final_invalid_rate"]["per_seed"] == pytest.approx([-0.05, -0.05])
    # The training rollouts' invalid-action rate, averaged over a cell's iterations, then over seeds.
    assert step["train_invalid_rate"]["mean"] == pytest.approx(0.025)
    assert trajectory["seeds"][0]["train_invalid_rate"] == pytest.approx(0.05)
    # The declared measure alone is tested over the family (here one comparison): differences 0.15 and
    # 0.1 give t = 0.125 / 0.025 = 5 on 1 degree of freedom, p = 1 - 2 atan(5) / pi = 0.1257.
    primary = paired["primary"]
    assert primary["measure"] == bench.PRIMARY_MEASURE == "greedy_auc" and primary["family_size"] == 1
    assert primary["holm_t_p"] == pytest.approx(0.12567, abs=1e-4) and not primary["significant"]
    assert (primary["adjusted_ci_low"], primary["adjusted_ci_high"]) == pytest.approx(
        (paired["greedy_auc"]["ci_low"], paired["greedy_auc"]["ci_high"])
    )
    assert not any("significant" in paired[key] for key in bench.PAIRED_METRICS)
    assert step["grouped_fraction"]["mean"] == pytest.approx(0.9) and trajectory["grouped_fraction"] is None
    assert step["credit_share_of_iteration"]["mean"] == pytest.approx(1 / 8)
    bench.write_markdown({"maze": summary}, tmp_path / "summary.md")
    table = (tmp_path / "summary.md").read_text()
    assert "| gigpo-state | 2 | 32.5 ± " in table and "+12.5 [" in table and "+15.0, +10.0" in table
    assert "| +6.2 [" in table  # the sampled AUC's difference, beside the primary one
    # A row over several seeds keeps its interval; a row of one seed shows its value, not a zero-width interval.
    assert "| trajectory | 3 | 30.8 ± " in table
    assert "- gigpo-state: +12.5 points; Holm over the 1 comparisons: t-test p = 0.126" in table
    one_seed = bench.summarize({"maze": [job for job in jobs["maze"] if job.seed == 0]}, {})["maze"]
    bench.write_markdown({"maze": one_seed}, tmp_path / "one_seed.md")
    assert "| trajectory | 1 | 30.0 (one seed) |" in (tmp_path / "one_seed.md").read_text()
    assert "The pilot has not finished" in table
    assert "Compute: 5 cells and their warm starts took 0.16 core-hours (cells 0.15, warm starts 0.01)" in table


def test_summary_checks_where_the_baseline_learned_and_repeats_the_comparison_there(tmp_path):
    jobs = _grid(tmp_path)
    # The baseline gains +20, 0 and +20 points (the last two evaluations' mean minus iteration 0).
    base = {0: [0.1, 0.3, 0.3], 1: [0.1, 0.1, 0.1], 2: [0.2, 0.4, 0.4]}
    step = {0: [0.1, 0.4, 0.4], 1: [0.1, 0.5, 0.5], 2: [0.2, 0.4, 0.6]}
    for job in jobs["maze"]:
        if job.method is not None:
            _write_cell(job, _records([0, 5, 10], (base if job.method == "trajectory" else step)[job.seed]))
    summary = bench.summarize(jobs, {}, gate_points=15.0)["maze"]
    assert summary["baseline_gain_points"] == pytest.approx({0: 20.0, 1: 0.0, 2: 20.0})
    # AUC = (v0 + 2 v1 + v2) / 4: trajectory 0.25, 0.1, 0.35; gigpo-state 0.325, 0.4, 0.4.
    step_summary = summary["methods"]["gigpo-state"]
    assert step_summary["paired"]["greedy_auc"]["per_seed"] == pytest.approx([0.075, 0.3, 0.05])
    learned = step_summary["paired_where_baseline_learned"]
    assert learned["seeds"] == [0, 2]
    assert learned["greedy_auc"]["per_seed"] == pytest.approx([0.075, 0.05])
    assert learned["greedy_auc"]["mean"] == pytest.approx(0.0625)
    bench.write_markdown({"maze": summary}, tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    assert "seed 0 +20.0, seed 1 +0.0, seed 2 +20.0 points; 15 or more on 2 of 3 seeds" in text
    assert "| gigpo-state | 0, 2 | +6." in text and "| 0.5 | +7.5, +5.0 |" in text
    # Where the baseline learned on every seed, there is nothing to repeat.
    assert (
        "paired_where_baseline_learned"
        not in bench.summarize(jobs, {}, gate_points=0.0)["maze"]["methods"]["gigpo-state"]
    )


def _fake_training(monkeypatch, greedy_by_seed):
    """Jobs that write their metrics (and a warm start's checkpoint) at once instead of training: a
    seed's cells all log greedy success ``greedy_by_seed[seed]`` at iterations 1 and 2 against 0.3 at
    iteration 0."""

    def command(job):
        if job.method is None:
            records, model = _records([0], [0.3]), "(run / 'checkpoints').mkdir()"
        else:
            records, model = (
                _records([0, 1, 2], [0.3, *[greedy_by_seed[job.seed]] * 2]),
                "",
            )  # iteration 0 is the warm start's
        lines = "".join(json.dumps(r) + "\n" for r in records)
        return [
            sys.executable,
            "-c",
            f"import pathlib; run = pathlib.Path({str(job.run_dir)!r}); "
            f"(run / 'metrics.jsonl').write_text({lines!r}); {model}",
        ]

    monkeypatch.setattr(bench.Job, "command", command)
    monkeypatch.setattr(bench.time, "sleep", lambda seconds: None)


@pytest.mark.parametrize("gated", [True, False])
def test_a_failed_gate_stops_a_gated_environment_and_not_an_ungated_one(tmp_path, monkeypatch, gated):
    from rich.progress import Progress

    _fake_training(monkeypatch, {0: 0.35, 1: 0.6})  # the pilot (seed 0) gains 5 points, seed 1 gains 30
    env = bench.Environment(
        "maze", "a test maze", bench.QUICK_GRID[0].overrides, ("trajectory", "gigpo-state"), gated=gated
    )
    jobs = bench.plan((env,), 2, tmp_path)
    with Progress(disable=True) as progress:
        gates = bench.run_grid(jobs, workers=2, gate_points=15.0, progress=progress)
    assert gates["maze"].gain == pytest.approx(5.0) and not gates["maze"].passed and gates["maze"].binding == gated
    trained = [(job.seed, job.method) for job in jobs["maze"] if job.done]
    if gated:
        assert trained == [(0, None), (0, "trajectory")]
        assert "no comparison was run" in gates["maze"].describe()
    else:
        assert trained == [
            (0, None),
            (0, "trajectory"),
            (0, "gigpo-state"),
            (1, None),
            (1, "trajectory"),
            (1, "gigpo-state"),
        ]
        assert "runs ungated" in gates["maze"].describe()
        summary = bench.summarize(jobs, gates)["maze"]
        assert summary["baseline_learned_seeds"] == [1] and summary["gate"]["binding"] is False


def test_a_warm_start_without_its_checkpoint_is_trained_again_and_must_match(tmp_path):
    jobs = _grid(tmp_path)["maze"]
    warm = {job.seed: job for job in jobs if job.method is None}
    for job in jobs:
        if job.method is not None and job.seed != 2:  # seeds 0 and 1 finished, seed 2 has cells to train
            _write_cell(job, _records([0, 5, 10], [0.2, 0.3, 0.4]))
    _write(warm[2].run_dir, _records([0], [0.25]))
    (warm[1].run_dir / "checkpoints").mkdir()  # seed 1's warm start still has its model
    pending = [job for job in jobs if not job.done]
    assert [warm[0].lacks_model, warm[1].lacks_model, warm[2].lacks_model] == [True, False, True]
    rebuilds = bench.rebuilds_needed(pending)
    assert [(job.rebuilds, job.run_dir) for job in rebuilds] == [(warm[2], warm[2].run_dir / "rebuild")]
    # The retrained warm start logs the recorded evaluation: its checkpoint moves into place.
    rebuild = rebuilds[0]
    _write(rebuild.run_dir, _records([0], [0.25]))
    (rebuild.run_dir / "checkpoints" / "iter-000000").mkdir(parents=True)
    bench.adopt_rebuild(rebuild)
    assert (warm[2].run_dir / "checkpoints" / "iter-000000").is_dir() and not rebuild.run_dir.exists()
    assert not warm[2].lacks_model
    # One that logs another evaluation is refused: the seed's cells would not share a warm start.
    other = bench.Job(warm[0].env, 0, None, warm[0].run_dir / "rebuild", rebuilds=warm[0])
    _write(other.run_dir, _records([0], [0.5]))
    with pytest.raises(bench.RunFailed, match="iteration-0 evaluation differs"):
        bench.adopt_rebuild(other)


def test_settings_are_recorded_then_checked(tmp_path):
    job = _grid(tmp_path)["maze"][1]
    bench.check_settings(job)
    assert not job.run_dir.exists()  # checked, nothing recorded
    bench.check_settings(job, record=True)
    recorded = json.loads((job.run_dir / "settings.json").read_text())
    assert (
        recorded["algo.step_credit"] == "none" and recorded["trainer.seed"] == 0 and "trainer.run_dir" not in recorded
    )
    assert recorded["trainer.eval_first"] is False  # its seed's warm start evaluated iteration 0
    bench.check_settings(job)  # the same settings: accepted
    lr = recorded["optim.lr"] / 4
    other = bench.Job(
        bench.Environment("maze", "", (*job.env.overrides, f"optim.lr={lr}"), job.env.methods),
        job.seed,
        job.method,
        job.run_dir,
    )
    with pytest.raises(
        bench.MixedSettingsError, match=re.escape(f"1 differ: optim.lr: {recorded['optim.lr']} there, {lr} now")
    ):
        bench.check_settings(other)
    # A run recorded before a config key existed trained with its default: accepted at the default only.
    del recorded["sft.epsilon"]
    (job.run_dir / "settings.json").write_text(json.dumps(recorded))
    bench.check_settings(job)
    epsilon = bench.Job(
        bench.Environment("maze", "", (*job.env.overrides, "sft.epsilon=0.5"), job.env.methods),
        job.seed,
        job.method,
        job.run_dir,
    )
    with pytest.raises(bench.MixedSettingsError, match="1 differ: sft.epsilon: None there, 0.5 now"):
        bench.check_settings(epsilon)
    stray = tmp_path / "stray"
    (stray / "metrics.jsonl").parent.mkdir()
    (stray / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(bench.MixedSettingsError, match="no settings.json"):
        bench.check_settings(bench.Job(job.env, 0, "trajectory", stray))


def test_every_full_grid_run_has_valid_settings():
    from agent_rl.training.infra.resolution import resolve

    for env_jobs in bench.plan(bench.FULL_GRID, bench.FULL_SEEDS, Path("/nonexistent")).values():
        for job in env_jobs:
            settings = bench.settings_of(job)
            assert settings["trainer.torch_threads"] == 1 and settings["trainer.target_success"] is None
            assert settings["trainer.eval_episodes"] >= 128 and settings["trainer.eval_sampled"]
            assert settings["trainer.eval_first"] == (job.method is None)  # the warm start's run evaluates it
            if job.method is not None:
                assert settings["sft.mode"] == "none" and settings["algo.preset"] == "gigpo"
                kind = {"gigpo": "anchor", "graph": "graph"}.get(job.method.split("-")[0], "none")
                assert resolve(bench.config_of(job)).algo.step_credit == kind


def test_unknown_names_are_errors_that_list_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--envs", "combination,sokobann"])
    assert "unknown environment 'sokobann'; valid environments: combination, branching" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.main(["--methods", "gigpo"])
    assert "unknown method 'gigpo'" in capsys.readouterr().err


@pytest.mark.slow
def test_quick_grid_gate_report_resume_and_settings_check(tmp_path, capsys):
    out = tmp_path / "grid"
    # An unreachable gate: the pilot trains, the report says why nothing else ran.
    console_script = Path(sys.executable).with_name("agent-rl")  # the installed script, run as users do
    run = subprocess.run(
        [str(console_script), "bench", "credit", "--quick", "--gate", "101", "--out", str(out)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())["results"]["maze"]
    assert summary["gate"]["passed"] is False and "no comparison was run" in (out / "summary.md").read_text()
    assert [p.parent.parent.name for p in out.glob("runs/maze/*/seed*/metrics.jsonl")] == ["trajectory"]
    assert not (out / "runs/maze/gigpo-state").exists()  # nothing of a gated-out cell is written
    assert "paired" not in summary["methods"]["gigpo-state"]
    pilot = out / "runs/maze/trajectory/seed0/metrics.jsonl"
    stamp = pilot.stat().st_mtime_ns
    # A gate every pilot passes: the rest of the grid runs and the pilot is reused.
    assert bench.main(["--quick", "--gate", "-100", "--out", str(out)]) == 0
    assert pilot.stat().st_mtime_ns == stamp
    payload = json.loads((out / "summary.json").read_text())
    maze = payload["results"]["maze"]
    assert maze["gate"]["passed"]
    assert maze["methods"]["gigpo-state"]["paired"]["seeds"] == [0, 1]
    assert maze["methods"]["graph-state"]["paired"]["seeds"] == [0, 1]
    graph_log = [
        json.loads(line) for line in (out / "runs/maze/graph-state/seed0/metrics.jsonl").read_text().splitlines()
    ]
    assert all("graph/merged_fraction" in record for record in graph_log if record["iteration"] > 0)
    for method in ("trajectory", "gigpo-state", "graph-state"):
        for cell in maze["methods"][method]["seeds"].values():
            assert cell["iterations"] == [0.0, 1.0, 2.0] and 0.0 <= cell["sampled_auc"] <= 1.0
    assert (out / "success_maze.png").stat().st_size > 0 and (out / "paired_maze.png").stat().st_size > 0
    # A rerun trains nothing; a changed setting is refused with the differing key.
    stamps = [p.stat().st_mtime_ns for p in sorted(out.glob("runs/maze/*/seed*/metrics.jsonl"))]
    assert cli_main(["bench", "credit", "--quick", "--gate", "-100", "--out", str(out)]) == 0
    assert [p.stat().st_mtime_ns for p in sorted(out.glob("runs/maze/*/seed*/metrics.jsonl"))] == stamps
    # --report on a grid in progress (a cell that has not logged its last iteration): the finished cells
    # only, nothing trained.
    unfinished = out / "runs/maze/gigpo-state/seed1/metrics.jsonl"
    logged = unfinished.read_text()
    unfinished.write_text("".join(logged.splitlines(keepends=True)[:-1]))
    stamps = [p.stat().st_mtime_ns for p in sorted(out.glob("runs/maze/*/seed*/metrics.jsonl"))]
    assert bench.main(["--quick", "--report", "--gate", "-100", "--out", str(out)]) == 0
    partial = json.loads((out / "summary.json").read_text())["results"]["maze"]
    assert partial["gate"]["passed"] and list(partial["methods"]["gigpo-state"]["seeds"]) == ["0"]
    assert "paired" not in partial["methods"]["gigpo-state"]  # one paired seed is no statistic
    assert [p.stat().st_mtime_ns for p in sorted(out.glob("runs/maze/*/seed*/metrics.jsonl"))] == stamps
    unfinished.write_text(logged)
    # A fresh clone of committed results has no checkpoints: a seed with a cell left to train gets its
    # warm start trained again, which must log the same iteration-0 evaluation, then the cell trains.
    import shutil

    for checkpoints in out.glob("**/checkpoints"):
        shutil.rmtree(checkpoints)
    shutil.rmtree(out / "runs/maze/graph-state/seed1")
    warm_log = (out / "sft/maze/seed1/metrics.jsonl").read_text()
    assert bench.main(["--quick", "--gate", "-100", "--out", str(out)]) == 0
    assert bench.Job(bench.QUICK_GRID[0], 1, "graph-state", out / "runs/maze/graph-state/seed1").done
    assert (out / "sft/maze/seed1/checkpoints").is_dir()
    assert not (out / "sft/maze/seed1/rebuild").exists() and not (out / "sft/maze/seed0/checkpoints").exists()
    assert (out / "sft/maze/seed1/metrics.jsonl").read_text() == warm_log
    settings = out / "runs/maze/gigpo-state/seed1/settings.json"
    lr = json.loads(settings.read_text())["optim.lr"]
    settings.write_text(settings.read_text().replace(f'"optim.lr": {lr}', '"optim.lr": 0.5'))
    capsys.readouterr()
    assert bench.main(["--quick", "--out", str(out)]) == 2
    assert f"optim.lr: 0.5 there, {lr} now" in capsys.readouterr().err
