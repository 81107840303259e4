"""Run logging (training/infra/logger.py): metrics.jsonl, TensorBoard event files and the console table."""

from __future__ import annotations

import json
import math

import pytest
from rich.console import Console

from agent_rl.training.infra.logger import METRICS_FILE, RunLogger, iteration_table, read_metrics


def test_metrics_jsonl_holds_one_sorted_record_per_iteration_and_non_finite_values_as_null(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    logger.log(0, {"eval/greedy_success": 0.5, "sft/loss": 1.25})
    logger.log(1, {"rollout/success_rate": 0.75, "update/approx_kl": math.nan, "time/update": math.inf})
    logger.close()
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert [list(json.loads(line)) for line in lines] == [  # keys sorted: records diff line by line
        ["eval/greedy_success", "iteration", "sft/loss"],
        ["iteration", "rollout/success_rate", "time/update", "update/approx_kl"],
    ]
    assert read_metrics(tmp_path) == [
        {"iteration": 0, "eval/greedy_success": 0.5, "sft/loss": 1.25},
        {"iteration": 1, "rollout/success_rate": 0.75, "time/update": None, "update/approx_kl": None},
    ]
    assert read_metrics(tmp_path / "elsewhere") == []


def test_a_new_run_starts_a_fresh_file_and_a_resumed_one_drops_iterations_after_its_checkpoint(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    for iteration in range(4):
        logger.log(iteration, {"rollout/return": float(iteration)})
    # A run killed after iteration 3 whose last checkpoint is iteration 1 redoes 2 and 3.
    resumed = RunLogger(tmp_path, tensorboard=False, resume_iteration=1)
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1]
    resumed.log(2, {"rollout/return": 20.0})
    assert [r["rollout/return"] for r in read_metrics(tmp_path)] == [0.0, 1.0, 20.0]
    RunLogger(tmp_path, tensorboard=False)
    assert read_metrics(tmp_path) == []


def test_tensorboard_gets_every_finite_scalar(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = RunLogger(tmp_path, tensorboard=True)
    logger.log(0, {"eval/greedy_success": 0.25, "update/approx_kl": math.nan})
    logger.log(1, {"eval/greedy_success": 0.5})
    logger.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert events.Tags()["scalars"] == ["eval/greedy_success"]
    assert [(e.step, e.value) for e in events.Scalars("eval/greedy_success")] == [(0, 0.25), (1, 0.5)]


def test_console_table_shows_the_columns_and_a_dash_for_missing_metrics():
    console = Console(record=True, width=200)
    record = {
        "iteration": 3,
        "rollout/success_rate": 0.625,
        "rollout/return": 0.5,
        "eval/greedy_success": 0.875,
        "time/rollout": 4.4,
        "time/update": 11.6,
    }
    console.print(iteration_table(record))
    header, *rows = [line for line in console.export_text().splitlines() if line.strip()]
    assert header.split() == [
        "it",
        "succ",
        "ret",
        "len",
        "inval",
        "clip",
        "kl",
        "ent",
        "anch",
        "eval",
        "s",
        "r/a/u/s/e",
    ]
    cells = rows[-1].split()
    assert cells[:5] == ["3", "0.62", "0.50", "-", "-"] and cells[-2:] == ["0.88", "4/0/12/0/0"]


def test_logger_prints_the_table_of_each_record(tmp_path):
    console = Console(record=True, width=200)
    logger = RunLogger(tmp_path, tensorboard=False, console=console)
    logger.log(7, {"rollout/success_rate": 1.0})
    row = console.export_text().splitlines()[-1].split()
    assert row[:3] == ["7", "1.00", "-"]
    with pytest.raises(ValueError):  # a metric that is not a number is refused before anything is written
        logger.log(8, {"rollout/success_rate": "high"})
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [7]


def test_a_last_line_cut_short_by_a_crash_is_dropped_with_a_warning_and_a_resume_writes_whole_lines(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=False)
    for iteration in range(3):
        logger.log(iteration, {"rollout/return": float(iteration)})
    path = tmp_path / METRICS_FILE
    path.write_text(path.read_text()[:-12])  # the crash cut iteration 2's record
    with pytest.warns(UserWarning, match="dropped its last line"):
        assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1]
    with pytest.warns(UserWarning, match="dropped its last line"):
        resumed = RunLogger(tmp_path, tensorboard=False, resume_iteration=1)
    resumed.log(2, {"rollout/return": 2.0})
    assert [r["iteration"] for r in read_metrics(tmp_path)] == [0, 1, 2]  # no warning: every line is whole


def test_a_bad_line_before_the_last_is_an_error_naming_it(tmp_path):
    (tmp_path / METRICS_FILE).write_text('{"iteration": 0}\n{"iteration": \n{"iteration": 2}\n')
    with pytest.raises(ValueError, match="line 2 is not a JSON record"):
        read_metrics(tmp_path)


@pytest.mark.parametrize("counters", [None, (9, 10)])
def test_tensorboard_after_a_resume_holds_each_iteration_once_with_the_resumed_values(tmp_path, monkeypatch, counters):
    """Also when the resumed event file's counter gains a digit (9, then 10): in the same second,
    its name would sort before the first file's, and TensorBoard would read it first."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.summary.writer import event_file_writer

    if counters is not None:
        numbers = iter(counters)
        monkeypatch.setattr(event_file_writer._global_uid, "get", lambda: next(numbers))

    logger = RunLogger(tmp_path)
    for iteration in range(4):
        logger.log(iteration, {"rollout/return": float(iteration)})
    logger.close()
    # Killed after iteration 3 with its last checkpoint at 1: iterations 2 and 3 are redone.
    resumed = RunLogger(tmp_path, resume_iteration=1)
    for iteration in (2, 3):
        resumed.log(iteration, {"rollout/return": 10.0 * iteration})
    resumed.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = events.Scalars("rollout/return")
    assert [(e.step, e.value) for e in scalars] == [(0, 0.0), (1, 1.0), (2, 20.0), (3, 30.0)]
