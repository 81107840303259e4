"""The benchmark harness: finished-ness from metrics.jsonl, and the worker pool on processes that log at once."""

from __future__ import annotations

import io
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console
from rich.progress import Progress

from agent_rl.benchmarks import harness


def _log(run_dir: Path, iterations) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"iteration": k}) + "\n" for k in iterations))


def test_a_run_is_finished_once_its_metrics_log_its_last_iteration(tmp_path):
    assert harness.logged_iterations(tmp_path) == 0 and not harness.finished(tmp_path, 0)
    _log(tmp_path, [0, 1, 2])
    assert harness.logged_iterations(tmp_path) == 3
    assert harness.finished(tmp_path, 2) and not harness.finished(tmp_path, 3)
    _log(tmp_path, [0, 1, 2, 1, 2])  # a resumed run logs the iterations after its checkpoint again
    assert harness.logged_iterations(tmp_path) == 3 and not harness.finished(tmp_path, 3)


@dataclass(eq=False)
class FakeJob:
    """A run whose process logs its iterations at once (``exit_code`` != 0: it fails; ``stop_at``: it
    exits cleanly before its last iteration)."""

    name: str
    run_dir: Path
    iterations: int = 2
    exit_code: int = 0
    stop_at: int | None = None
    linger_s: float = 0.0
    """Seconds the process goes on after logging its last iteration (a checkpoint being saved)."""

    def command(self) -> list[str]:
        last = self.iterations if self.stop_at is None else self.stop_at
        lines = "".join(json.dumps({"iteration": k}) + "\n" for k in range(last + 1))
        run = f"pathlib.Path({str(self.run_dir)!r})"
        return [
            sys.executable,
            "-c",
            f"import pathlib, sys, time; ({run} / 'metrics.jsonl').write_text({lines!r}); "
            f"time.sleep({self.linger_s}); ({run} / 'exited').touch(); sys.exit({self.exit_code})",
        ]

    def environment(self) -> dict[str, str]:
        return harness.thread_environment(1)


def _run(jobs, workers: int = 2, **kwargs) -> None:
    with Progress(disable=True) as progress:
        harness.run_jobs(jobs, workers=workers, progress=progress, title="test", **kwargs)


@pytest.fixture(autouse=True)
def _no_waiting(monkeypatch):
    monkeypatch.setattr(harness.time, "sleep", lambda seconds: None)


def test_jobs_start_when_ready_in_order_skip_finished_ones_and_drop_unwanted_ones(tmp_path):
    first, second, gated, dropped = (FakeJob(name, tmp_path / name) for name in ("first", "second", "gated", "dropped"))
    _log(second.run_dir, [0, 1, 2])  # finished before: never started again
    started, finished_order = [], []
    _run(
        [first, second, gated, dropped],
        workers=1,
        ready=lambda job: job is not gated or harness.finished(first.run_dir, first.iterations),
        wanted=lambda job: job is not dropped or not harness.finished(first.run_dir, first.iterations),
        on_start=lambda job: started.append(job.name),
        on_finish=lambda job: finished_order.append(job.name),
    )
    assert started == finished_order == ["first", "gated"]  # one worker: "dropped" was unwanted by its turn
    assert all(harness.finished(job.run_dir, 2) for job in (first, second, gated))
    assert not dropped.run_dir.exists()
    assert (first.run_dir / "train.log").exists()


def test_each_start_and_finish_is_a_line_of_its_own_for_output_that_goes_to_a_file(tmp_path):
    before, first, second = (
        FakeJob(name, tmp_path / "[a long] run directory" / name) for name in ("before", "first", "second")
    )
    _log(before.run_dir, [0, 1, 2])
    output = io.StringIO()
    with Progress(console=Console(file=output, width=40)) as progress:  # a file: no terminal, the bars at the end
        harness.run_jobs([before, first, second], workers=1, progress=progress, title="lift")
    lines = [line for line in output.getvalue().splitlines() if line.startswith("lift: ")]
    assert [line.split(";")[0].split(" after ")[0] for line in lines] == [
        "lift: first started",
        "lift: first finished",
        "lift: second started",
        "lift: second finished",
    ]
    assert lines[0].endswith(f"its log: {first.run_dir / 'train.log'}")
    assert lines[1].endswith("min here (2 of 3 runs finished)") and lines[3].endswith("(3 of 3 runs finished)")


def test_a_job_starts_only_once_the_jobs_it_needs_have_logged_everything_and_exited(tmp_path):
    warm = FakeJob("warm", tmp_path / "warm", linger_s=1.0)
    cells = [FakeJob(f"cell{k}", tmp_path / f"cell{k}") for k in range(2)]
    seen_exited = []
    _run(
        [warm, *cells],
        needs=lambda job: (warm,) if job is not warm else (),
        on_start=lambda job: seen_exited.append((job.name, (warm.run_dir / "exited").exists())),
    )
    assert seen_exited == [("warm", False), ("cell0", True), ("cell1", True)]


def test_a_job_waiting_on_a_run_another_process_trains_is_waited_for_while_that_run_trains(tmp_path):
    job = FakeJob("pilot", tmp_path / "pilot")
    asked = []

    def warm_start_saved(job) -> bool:  # another process saves it after a few looks
        asked.append(job.name)
        return len(asked) > 3

    _run([job], ready=warm_start_saved, waits_outside=lambda job: True)
    assert harness.finished(job.run_dir, job.iterations) and len(asked) == 4
    # Once no process trains it any more and it is still missing, the benchmark stops instead of waiting forever.
    other = FakeJob("orphan", tmp_path / "orphan")
    training = iter([True, True, False])
    with pytest.raises(harness.RunFailed, match="no run can start: orphan waits on a run that will not finish"):
        _run([other], ready=lambda job: False, waits_outside=lambda job: next(training))
    assert not other.run_dir.exists()


def test_a_failed_run_or_one_that_stops_early_stops_the_benchmark_naming_it(tmp_path):
    with pytest.raises(harness.RunFailed, match=r"broken failed \(exit code 3\); its log: .*broken/train.log"):
        _run([FakeJob("broken", tmp_path / "broken", exit_code=3)])
    with pytest.raises(harness.RunFailed, match="short exited without logging iteration 2"):
        _run([FakeJob("short", tmp_path / "short", stop_at=1)])
    with pytest.raises(harness.RunFailed, match="no run can start: waiting waits on a run that will not finish"):
        _run([FakeJob("waiting", tmp_path / "waiting")], ready=lambda job: False)


def test_a_train_run_names_its_iterations_directory_threads_and_late_overrides(tmp_path):
    run = harness.TrainRun(
        "r", tmp_path / "r", ("env.id=x",), 3, recipe="maze", threads=None, start=lambda: ["policy=/m"]
    )
    command = run.command()
    assert command[command.index("train") + 1 :] == [
        "--resume",
        "auto",
        "--config",
        "maze",
        "env.id=x",
        "policy=/m",
        "trainer.torch_threads=null",
        "trainer.iterations=3",
        f"trainer.run_dir={tmp_path / 'r'}",
    ]
    assert run.environment() == dict(os.environ)  # every core
    assert harness.TrainRun("r", tmp_path, (), 1, threads=2).environment()["OMP_NUM_THREADS"] == "2"


def test_an_hf_run_forks_from_the_preloaded_server_with_its_output_and_exit_code(tmp_path):
    command = [sys.executable, "-m", "agent_rl.cli", "train", "engine=hf", "optim.lr=-1"]
    process = harness.start(command, tmp_path / "train.log", harness.thread_environment(1))
    assert isinstance(process, harness.ForkedRun) and process.wait(timeout=120) != 0
    assert "optim.lr" in (tmp_path / "train.log").read_text()  # the bad value, named in the run's own log
    other = harness.start([sys.executable, "-c", "print('plain')"], tmp_path / "plain.log", dict(os.environ))
    assert not isinstance(other, harness.ForkedRun) and other.wait(timeout=60) == 0
    assert (tmp_path / "plain.log").read_text() == "plain\n"
