"""Memory and open files over a long run: the main job's learner for 200 iterations on the tiny model.

One ``agent-rl train`` run in this process with the main job's recipe (the Maze, GiGPO, the tiny
policy, the default engine: vLLM when it is installed) and smaller batches (``SOAK_OVERRIDES``, then
``--set``), saving a checkpoint at every iteration, the heaviest schedule. After every iteration it
records the resident memory of this process and of its child processes (an engine may run in one),
the open file descriptors, the OS threads and the Python objects the garbage collector tracks. It
reports each one's growth per 100 iterations: the least-squares slope over the iterations after
``--settle`` (caches and the allocator fill up first), with a 95% interval from the residuals. Memory
leaks when that interval lies above zero and the growth reaches 1% of the mean (less is noise for a
process of this size); a count (descriptors, threads, children, objects) leaks when it ends above
its peak over the first half of the window.

    python -m agent_rl.benchmarks.soak            # 200 iterations -> benchmarks/results/soak/soak.json
    python -m agent_rl.benchmarks.soak --quick    # 8 iterations, the same code path (about a minute)
"""

from __future__ import annotations

import argparse
import gc
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent_rl.benchmarks.common import RESULTS_DIR, write_result
from agent_rl.benchmarks.paired_stats import student_t_quantile
from agent_rl.config import DEFAULT_RECIPE, load_config
from agent_rl.training.loop.trainer import train

SOAK_OVERRIDES = [
    "rollout.n_groups=2",
    "rollout.group_size=2",
    "rollout.max_turns=10",
    "rollout.min_batch_rows=0",
    "optim.minibatch_size=4",
    "sft.steps=50",
    "sft.episodes=50",
    "trainer.eval_every=25",
    "trainer.eval_episodes=8",
    "trainer.eval_sampled=false",
    "trainer.confirm_episodes=0",
    "trainer.target_success=null",
    "trainer.save_every=1",
    "logging.console=false",
]
"""The main job shrunk to seconds per iteration; it never stops early and saves at every iteration."""

RELATIVE_NOISE = 0.01
"""A size whose growth per 100 iterations stays under this fraction of its mean does not leak."""

COUNTS = ("open_fds", "threads", "child_processes", "python_objects")
"""Series that count held things: a leak shows as a climb of any size."""

SERIES = ("rss_mb", "children_rss_mb", *COUNTS)


def _proc_children(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return children


def _rss_bytes(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/statm").read_text().split()
    except OSError:  # the process ended between listing and reading
        return 0
    return int(fields[1]) * os.sysconf("SC_PAGE_SIZE")


def _os_threads() -> int:
    """Threads of this process, OpenMP's and the engine's included (Python's count sees its own only)."""
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Threads:")))


def process_sample() -> dict[str, float]:
    """This process's resident memory (MB) and that of its descendants, its open descriptors, OS
    threads and Python objects (Linux ``/proc``)."""
    descendants, frontier = [], _proc_children(os.getpid())
    while frontier:
        descendants += frontier
        frontier = [c for pid in frontier for c in _proc_children(pid)]
    return {
        "rss_mb": _rss_bytes(os.getpid()) / 1e6,
        "children_rss_mb": sum(_rss_bytes(pid) for pid in descendants) / 1e6,
        "child_processes": float(len(descendants)),
        "open_fds": float(len(os.listdir("/proc/self/fd"))),
        "threads": float(_os_threads()),
        "python_objects": float(len(gc.get_objects())),
    }


def growth_per_100(iterations: np.ndarray, values: np.ndarray, *, confidence: float = 0.95) -> dict[str, float]:
    """Least-squares slope of ``values`` on ``iterations``, per 100 iterations, with its interval
    (t on n - 2 degrees of freedom; an exact fit has a zero-width interval)."""
    x, y = np.asarray(iterations, float), np.asarray(values, float)
    if len(x) < 3:
        raise ValueError(f"a growth needs at least 3 samples, got {len(x)}")
    dx = x - x.mean()
    slope = float(dx @ (y - y.mean()) / (dx @ dx))
    residuals = y - y.mean() - slope * dx
    stderr = float(np.sqrt(residuals @ residuals / (len(x) - 2) / (dx @ dx)))
    half = student_t_quantile(0.5 + confidence / 2, len(x) - 2) * stderr
    return {"per_100": 100 * slope, "low": 100 * (slope - half), "high": 100 * (slope + half), "mean": float(y.mean())}


def verdict(name: str, values: np.ndarray, growth: dict[str, float]) -> bool:
    """Flat (no leak). A count (``COUNTS``) ends no higher than its peak over the first half of the
    window: a leak keeps climbing, a fluctuation comes back. A size leaks when its growth interval
    lies above zero and the growth reaches ``RELATIVE_NOISE`` of its mean; shrinking is no leak."""
    if name in COUNTS:
        return bool(values[-1] <= values[: max(1, len(values) // 2)].max())
    return not (growth["low"] > 0 and growth["per_100"] >= RELATIVE_NOISE * abs(growth["mean"]))


def soak(iterations: int, settle: int, overrides: list[str], run_dir: Path, console: Console) -> dict[str, Any]:
    config = load_config(
        DEFAULT_RECIPE, [*SOAK_OVERRIDES, f"trainer.iterations={iterations}", f"trainer.run_dir={run_dir}", *overrides]
    )
    columns = ("iteration", *SERIES, "elapsed_s")
    # Preallocated: the record itself must not add a Python object per iteration.
    table = np.full((iterations + 1, len(columns)), np.nan)
    with Progress(
        TextColumn("[bold blue]soak"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[rss]}"),
        console=console,
    ) as progress:
        task = progress.add_task("soak", total=iterations + 1, rss="")

        def record(iteration: int, metrics: dict[str, float]) -> None:
            gc.collect()  # what is left is held, not merely not yet collected
            sample = {"iteration": iteration, **process_sample(), "elapsed_s": metrics.get("time/elapsed", 0.0)}
            table[iteration] = [sample[c] for c in columns]
            progress.update(task, advance=1, rss=f"RSS {sample['rss_mb']:.0f} MB, fds {sample['open_fds']:.0f}")

        summary = train(config, on_iteration=record)
    table = table[~np.isnan(table[:, 0])]
    iteration, settled = table[:, 0], table[:, 0] >= settle
    growth = {name: growth_per_100(iteration[settled], table[settled, columns.index(name)]) for name in SERIES}
    flat = {name: verdict(name, table[settled, columns.index(name)], growth[name]) for name in SERIES}
    return {
        "iterations": iterations,
        "settle": settle,
        "overrides": [*SOAK_OVERRIDES, *overrides],
        "engine": config.engine.kind,
        "summary": summary,
        "growth_per_100_iterations": growth,
        "flat": flat,
        "all_flat": all(flat.values()),
        "samples": [dict(zip(columns, np.round(row, 3).tolist())) for row in table],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument(
        "--settle",
        type=int,
        default=80,
        help="iterations left out of the fit: the engine's caches fill over the first 60 or so",
    )
    parser.add_argument("--quick", action="store_true", help="8 iterations, settle 2 (checks the code path)")
    parser.add_argument("--set", dest="overrides", nargs="*", default=[], metavar="key=value", help="config overrides")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "soak", help="result directory")
    args = parser.parse_args(argv)
    iterations, settle = (8, 2) if args.quick else (args.iterations, args.settle)
    if not 0 <= settle <= iterations - 3:
        parser.error(f"--settle must leave at least 3 iterations to fit, got {settle} of {iterations}")
    console = Console()
    with tempfile.TemporaryDirectory(prefix="agent-rl-soak-") as run_dir:
        result = soak(iterations, settle, args.overrides, Path(run_dir), console)
    path = write_result("soak_quick" if args.quick else "soak", result, args.out)
    for name, growth in result["growth_per_100_iterations"].items():
        console.print(
            f"{name:>16}: {growth['per_100']:+10.3f} per 100 iterations [{growth['low']:+.3f}, "
            f"{growth['high']:+.3f}], mean {growth['mean']:.1f}  {'flat' if result['flat'][name] else 'GROWS'}"
        )
    console.print(f"wrote {path}")
    return 0 if result["all_flat"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
