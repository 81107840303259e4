"""The one harness of the benchmarks that train: each run is an ``agent-rl train`` process (a :class:`Job`),
:func:`run_jobs` starts them ``workers`` at a time with resume and per-job readiness, and a run is finished
when its ``metrics.jsonl`` logs its last iteration (:func:`finished`): nothing else marks it, so committed
results say by themselves which runs are complete."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Sequence

from agent_rl.benchmarks.common import runs_stop_with_this_process

RESUME = ("--resume", "auto")
"""How every run starts: one killed midway continues from its last checkpoint, one killed before its
first checkpoint (or during a save) starts again; the command names the run directory."""


class RunFailed(RuntimeError):
    """A benchmark's ``agent-rl train`` process exited with an error, or without logging its last iteration."""


def logged_iterations(run_dir: Path) -> int:
    """How many iterations ``run_dir``'s ``metrics.jsonl`` logs (0 when it has none)."""
    from agent_rl.training.infra.logger import read_metrics

    return len({record["iteration"] for record in read_metrics(run_dir)})


def finished(run_dir: Path, iterations: int) -> bool:
    """Whether the run in ``run_dir`` logged its iterations 0 to ``iterations``."""
    return logged_iterations(run_dir) > iterations


def recorded_iterations(run_dir: Path) -> int | None:
    """The RL iterations the run in ``run_dir`` was started for (``trainer.iterations`` of its
    ``config.yaml``); None before it saved one."""
    from agent_rl.config import load_config

    config = run_dir / "config.yaml"
    return load_config(config).trainer.iterations if config.is_file() else None


def adopt_rebuilt_warm_start(rebuilt: Path, recorded: Path, name: str, consequence: str) -> None:
    """Move the checkpoints of ``rebuilt``, a warm start trained again because the finished run in
    ``recorded`` lacks them (checkpoints are not committed, so a fresh clone has none), into
    ``recorded``, and remove ``rebuilt``. A warm start is deterministic on one torch thread, so its
    iteration-0 evaluation must be the one recorded (every measure recorded; a later version of the
    library may log more); if not, :class:`RunFailed` says so with the ``consequence`` for the runs
    that were to share it."""
    from agent_rl.training.infra.logger import read_metrics

    expected = {key: value for key, value in read_metrics(recorded)[0].items() if key.startswith("eval/")}
    logged = read_metrics(rebuilt)[0]
    if not expected or any(logged.get(key) != value for key, value in expected.items()):
        raise RunFailed(
            f"{name} was trained again (its checkpoint was not there), and its iteration-0 evaluation "
            f"differs from the one recorded in {recorded}: {consequence}"
        )
    os.replace(rebuilt / "checkpoints", recorded / "checkpoints")
    shutil.rmtree(rebuilt)


def train_command(overrides: Sequence[str], recipe: str | None = None) -> list[str]:
    """``agent-rl train`` with resume, the recipe (``--config``) when one is named, and ``overrides``."""
    return [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        *RESUME,
        *(("--config", recipe) if recipe else ()),
        *overrides,
    ]


def threads_override(threads: int | None) -> str:
    """The config override that gives a run ``threads`` torch threads (None: every core)."""
    return f"trainer.torch_threads={threads or 'null'}"


def thread_environment(threads: int | None) -> dict[str, str]:
    """A run's process environment: OpenMP pinned to ``threads``, or left as it is (None: every core)."""
    return {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else dict(os.environ)


PRELOADED = ("agent_rl.cli", "agent_rl.training.loop.trainer", "transformers.models.qwen2.modeling_qwen2")
"""What the process that starts the runs imports once (torch and transformers among them), so a run
forked from it starts without paying those imports again."""


def _train_in_this_process(argv: list[str], log: str, environment: dict[str, str]) -> None:
    """A forked run's body: its environment, its output into its log, then ``agent-rl`` with ``argv``."""
    os.environ.clear()
    os.environ.update(environment)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    from agent_rl.cli import main

    sys.exit(main(argv))


class ForkedRun:
    """A run forked from the preloading server, with the parts of ``subprocess.Popen`` the pool uses."""

    def __init__(self, argv: list[str], log: Path, environment: dict[str, str]) -> None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(list(PRELOADED))
        self.process = context.Process(target=_train_in_this_process, args=(argv, str(log), environment))
        self.process.start()
        self.pid = self.process.pid

    def poll(self) -> int | None:
        return self.process.exitcode

    def terminate(self) -> None:
        self.process.terminate()

    def kill(self) -> None:
        self.process.kill()

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"run {self.pid}", timeout)
        return self.process.exitcode


def start(command: list[str], log: Path, environment: dict[str, str]) -> subprocess.Popen | ForkedRun:
    """Start a run's process, its output appended to ``log``. An ``agent-rl`` command on the hf engine
    is forked from a server that has imported the library (:data:`PRELOADED`), which saves each run
    seconds of imports; any other command (vLLM starts processes of its own) gets a process of its own."""
    if command[:3] == [sys.executable, "-m", "agent_rl.cli"] and "engine=hf" in command:
        return ForkedRun(command[3:], log, environment)
    with log.open("a") as output:
        return subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, env=environment)


class Job(Protocol):
    """What the harness needs of a run."""

    name: str
    run_dir: Path

    @property
    def iterations(self) -> int:
        """Its ``trainer.iterations``: it is finished once ``metrics.jsonl`` logs that iteration."""

    def command(self) -> list[str]:
        """Its process' command line, built when it starts (it may name another run's checkpoint)."""

    def environment(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class TrainRun:
    """A plain run: ``agent-rl train`` with these overrides, in ``run_dir``."""

    name: str
    run_dir: Path
    overrides: tuple[str, ...]
    """Config overrides, without ``trainer.iterations`` and ``trainer.run_dir`` (the run's own fields)."""
    iterations: int
    recipe: str | None = None
    threads: int | None = 1
    """Torch and OpenMP threads; None leaves every core to the run."""
    start: Callable[[], Sequence[str]] | None = None
    """Overrides computed when the run starts (e.g. ``policy=`` another run's warm start)."""

    @property
    def done(self) -> bool:
        return finished(self.run_dir, self.iterations)

    def command(self) -> list[str]:
        started = tuple(self.start()) if self.start else ()
        return train_command(
            [
                *self.overrides,
                *started,
                threads_override(self.threads),
                f"trainer.iterations={self.iterations}",
                f"trainer.run_dir={self.run_dir}",
            ],
            self.recipe,
        )

    def environment(self) -> dict[str, str]:
        return thread_environment(self.threads)


def run_jobs(
    jobs: Sequence[Job],
    *,
    workers: int,
    progress,
    title: str,
    needs: Callable[[Job], Sequence[Job]] = lambda job: (),
    ready: Callable[[Job], bool] = lambda job: True,
    waits_outside: Callable[[Job], bool] = lambda job: False,
    wanted: Callable[[Job], bool] = lambda job: True,
    on_start: Callable[[Job], None] = lambda job: None,
    on_finish: Callable[[Job], None] = lambda job: None,
) -> None:
    """Train every job of ``jobs`` not finished yet, ``workers`` at a time, in their order: a job starts
    once every job it ``needs`` (each one of ``jobs``) was finished before or has finished here, its
    process exited (a warm start whose last iteration is logged may still be saving its checkpoint),
    and ``ready(job)`` (``on_start(job)``
    just before); a pending one no longer ``wanted(job)`` is dropped (a failed gate), and
    ``on_finish(job)`` runs when one has finished. A failed job stops the others (:class:`RunFailed`);
    so does stopping the benchmark, each run saving a checkpoint its rerun resumes from, and so does
    a state where nothing runs and no pending job can start, unless one ``waits_outside`` (on a run
    another process is training now). Each start and finish is also printed as a line of its own, so
    that a benchmark whose output goes to a file (where the bars show only at the end) logs its way."""
    pending = [job for job in jobs if not finished(job.run_dir, job.iterations)]
    done = {id(job) for job in jobs} - {id(job) for job in pending}
    total = sum(job.iterations + 1 for job in jobs)
    overall = progress.add_task(f"{title} (iterations of all runs)", total=total)
    progress.advance(overall, total - sum(job.iterations + 1 for job in pending))
    running: list[tuple[Job, subprocess.Popen | ForkedRun, int, float]] = []
    credited: dict[int, int] = {}  # iterations of a running job already counted in the overall bar

    def say(line: str) -> None:  # one unwrapped line, as written (paths may hold brackets)
        progress.console.print(line, markup=False, highlight=False, soft_wrap=True)

    with runs_stop_with_this_process(lambda: [process for _, process, _, _ in running]):
        while pending or running:
            for job in [job for job in pending if not wanted(job)]:
                pending.remove(job)
                total -= job.iterations + 1
                progress.update(overall, total=total)
            free = workers - len(running)  # ready() is asked only when a worker is free: it may read checkpoints
            startable = [job for job in pending if free > 0 and all(id(n) in done for n in needs(job)) and ready(job)]
            starting = startable[:free]
            for job in starting:
                pending.remove(job)
                on_start(job)
                job.run_dir.mkdir(parents=True, exist_ok=True)
                process = start(job.command(), job.run_dir / "train.log", job.environment())
                bar = progress.add_task(f"  {job.name}", total=job.iterations + 1)
                running.append((job, process, bar, time.time()))
                say(f"{title}: {job.name} started; its log: {job.run_dir / 'train.log'}")
            if pending and not running and not any(waits_outside(job) for job in pending):
                raise RunFailed(f"no run can start: {pending[0].name} waits on a run that will not finish")
            time.sleep(1.0)
            for entry in list(running):
                job, process, task, started_at = entry
                logged = min(logged_iterations(job.run_dir), job.iterations + 1)
                progress.advance(overall, logged - credited.get(id(job), 0))
                progress.update(task, completed=logged)
                credited[id(job)] = logged
                code = process.poll()
                if code is None:
                    continue
                if code != 0:
                    raise RunFailed(f"{job.name} failed (exit code {code}); its log: {job.run_dir / 'train.log'}")
                if not finished(job.run_dir, job.iterations):
                    raise RunFailed(
                        f"{job.name} exited without logging iteration {job.iterations}; its log: "
                        f"{job.run_dir / 'train.log'}"
                    )
                progress.remove_task(task)
                running.remove(entry)
                done.add(id(job))
                say(
                    f"{title}: {job.name} finished after {(time.time() - started_at) / 60:.1f} min here "
                    f"({len(done)} of {len(done) + len(pending) + len(running)} runs finished)"
                )
                on_finish(job)
