"""Shared bits of the benchmark scripts: machine description and JSON output."""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import re
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

_PACKAGE = Path(__file__).resolve().parent
RESULTS_DIR = (
    _PACKAGE / "results" if (_PACKAGE.parent / "pyproject.toml").is_file() else Path.cwd() / "benchmarks" / "results"
)
"""Where results go unless ``--out`` says otherwise: ``benchmarks/results`` of the source checkout, or
of the working directory when the benchmarks run from an installed package."""
CHECKOUT = RESULTS_DIR.parents[1]
"""The directory that holds ``benchmarks/results``: result files name paths inside it relative to it."""


def cpu_model(cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    """The CPU's model name as the kernel reports it (None where there is no ``cpuinfo``)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    match = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return match.group(1).strip() if match else None


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "load_average_1_5_15min": [round(load, 2) for load in os.getloadavg()],  # other jobs share the CPU
        "python": platform.python_version(),
    }
    if os.environ.get("LD_PRELOAD"):  # e.g. tcmalloc: it changes allocation-heavy timings
        info["ld_preload"] = os.environ["LD_PRELOAD"]
    try:
        import numpy

        info["numpy"] = numpy.__version__
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["torch_threads"] = torch.get_num_threads()
        info["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()  # AVX2 or AVX512: timings differ
        info["cuda"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


def best_of(fn: Callable[[], Any], repeats: int, setup: Callable[[], Any] | None = None) -> float:
    """Best wall time of ``repeats`` calls, in seconds (the least disturbed run); ``setup`` runs
    untimed before each call."""
    best = float("inf")
    for _ in range(repeats):
        if setup is not None:
            setup()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _portable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str) and value.startswith(f"{CHECKOUT}{os.sep}"):
        return value[len(str(CHECKOUT)) + 1 :]
    if isinstance(value, dict):
        return {k: _portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(v) for v in value]
    return value


def write_json(path: Path, payload: Any, indent: int = 2) -> None:
    """``payload`` as standard JSON: a measure that was not taken (NaN, an infinity) is null, which
    every JSON reader parses (``NaN`` is not JSON), and a path inside the checkout (a run directory, a
    model) is written relative to it, so a committed result names no machine's directories."""
    path.write_text(json.dumps(_portable(payload), indent=indent, allow_nan=False) + "\n")


def write_result(name: str, payload: dict[str, Any], out_dir: Path | None = None) -> Path:
    out_dir = RESULTS_DIR if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    write_json(path, {"machine": machine_info(), **payload})
    return path


@contextmanager
def runs_stop_with_this_process(
    running: Callable[[], Iterable[subprocess.Popen]], grace_s: float = 120.0
) -> Iterator[None]:
    """SIGTERM stops the benchmark as Ctrl-C does, and however it stops, the runs it started (``running()``:
    their processes) stop with it. Each still running gets SIGTERM (``agent-rl train`` then saves a checkpoint,
    so a rerun resumes it), then SIGKILL after ``grace_s`` seconds. A run left behind would go on training
    beside the rerun's copy of itself, in the same directory."""
    from agent_rl.cli import raise_stopped

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        yield
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the cleanup short
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            live = [process for process in running() if process.poll() is None]
            for process in live:
                process.terminate()
            deadline = time.monotonic() + grace_s
            for process in live:
                try:
                    process.wait(timeout=max(deadline - time.monotonic(), 0.0))
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        finally:
            signal.signal(signal.SIGINT, interrupt)
            signal.signal(signal.SIGTERM, previous)


def stopped(name: str, exc: KeyboardInterrupt) -> int:
    """Say that the benchmark ``name`` was stopped and how to go on; returns the conventional status, 128 + signal."""
    from agent_rl.cli import report_stop

    return report_stop(name, exc, "finished runs are kept; the same command resumes the others")
