"""Run logging: ``metrics.jsonl`` (one JSON record per iteration), TensorBoard event files, and a
compact rich table per iteration on the console, and the progress display of its phases. The
resolved config is saved as ``config.yaml``."""

from __future__ import annotations

import contextlib
import json
import math
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

METRICS_FILE = "metrics.jsonl"

# (column header, metric key, format) of the per-iteration console table.
_COLUMNS = (
    ("it", "iteration", "{:.0f}"),
    ("succ", "rollout/success_rate", "{:.2f}"),
    ("ret", "rollout/return", "{:.2f}"),
    ("len", "rollout/length", "{:.1f}"),
    ("inval", "rollout/invalid_rate", "{:.2f}"),
    ("clip", "update/clip_frac", "{:.2f}"),
    ("kl", "update/approx_kl", "{:.3f}"),
    ("ent", "update/entropy", "{:.2f}"),
    ("anch", "anchors/grouped_fraction", "{:.2f}"),
    ("eval", "eval/greedy_success", "{:.2f}"),
)
_TIMES = ("rollout", "advantage", "update", "sync", "eval")


@contextlib.contextmanager
def timed(metrics: dict[str, float], key: str):
    """Record the seconds the block took as ``metrics[key]``."""
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """All records of ``metrics.jsonl`` in order (empty when the file does not exist).

    A last line cut short (a crash while it was written) is dropped with a warning; a bad line
    before the last is an error naming it."""
    path = Path(run_dir) / METRICS_FILE
    if not path.is_file():
        return []
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    records = []
    for number, line in enumerate(lines, start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number < len(lines):
                raise ValueError(f"{path}: line {number} is not a JSON record ({exc})") from None
            warnings.warn(
                f"{path}: dropped its last line, which was cut short (a crash while it was written): {line[:60]!r}",
                stacklevel=2,
            )
    return records


def _after_last_event_file(directory: Path) -> None:
    """Wait, if need be, until the second after the newest event file's: TensorBoard reads a run's event
    files in name order, whose first key is the creation second, and a resumed run's purge only drops
    the redone iterations of files read before its own (the names' last key, a counter without
    leading zeros, would otherwise put a file of the same second before an older one)."""
    seconds = [int(p.name.split(".")[3]) for p in directory.glob("events.out.tfevents.*")]
    while seconds and time.time() < max(seconds) + 1:
        time.sleep(0.05)


class RunLogger:
    """Writes one record per iteration to every enabled sink."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        tensorboard: bool = True,
        console: Console | None = None,
        resume_iteration: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.console = console
        self.path = self.run_dir / METRICS_FILE
        if resume_iteration is not None:
            # A killed run may have logged iterations after its last checkpoint; they are redone.
            kept = [r for r in read_metrics(self.run_dir) if r["iteration"] <= resume_iteration]
            self.path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept))
        elif self.path.exists():
            self.path.unlink()
        self.writer = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            purge = None if resume_iteration is None else resume_iteration + 1
            if purge is not None:
                _after_last_event_file(self.run_dir / "tensorboard")
            self.writer = SummaryWriter(log_dir=str(self.run_dir / "tensorboard"), purge_step=purge)

    def log(self, iteration: int, metrics: dict[str, float]) -> None:
        record = {"iteration": int(iteration), **{k: _json_number(v) for k, v in sorted(metrics.items())}}
        with open(self.path, "a") as handle:
            handle.write(json.dumps(record, sort_keys=True) + "\n")
        if self.writer is not None:
            for key, value in metrics.items():
                if value is not None and math.isfinite(value):
                    self.writer.add_scalar(key, value, iteration)
            self.writer.flush()
        if self.console is not None:
            self.console.print(iteration_table(record))

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _json_number(value: Any) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def iteration_table(record: dict[str, Any]) -> Table:
    """The compact one-row table of an iteration record; absent metrics show as '-'."""
    table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, show_edge=False, collapse_padding=True)
    cells = []
    for header, key, fmt in _COLUMNS:
        table.add_column(header, justify="right")
        value = record.get(key)
        cells.append("-" if value is None else fmt.format(value))
    table.add_column("s r/a/u/s/e", justify="right", no_wrap=True)
    cells.append("/".join(f"{record.get(f'time/{name}', 0.0):.0f}" for name in _TIMES))
    table.add_row(*cells)
    return table


def progress_bar(console: Console, enabled: bool = True) -> Progress:
    """The progress display of a run's phases (rollout, update, evaluation), gone once done."""
    return Progress(
        TextColumn("[bold blue]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not enabled,
    )


def run_header(config, model: torch.nn.Module, run_dir: Path) -> str:
    """The line a run starts with: what trains on what, where."""
    n_params = sum(p.numel() for p in model.parameters())
    n_trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    trained = f" (trained {n_trained / 1e6:.2f}M)" if n_trained < n_params else ""
    return (
        f"[bold]agent-rl train[/] env={config.env.id} algo={config.algo.preset} engine={config.engine.kind} "
        f"device={next(model.parameters()).device} params={n_params / 1e6:.2f}M{trained} "
        f"anchor={config.env.anchor_key} run_dir={run_dir}"
    )


def run_footer(summary: dict) -> str:
    """The line a run ends with: its best held-out greedy success and where its checkpoints are."""
    return (
        f"[bold green]done[/]: best greedy eval success {summary['best_greedy_success']:.2f} at iteration "
        f"{summary['best_iteration']} ({summary['elapsed_s']:.0f} s); checkpoints in {summary['run_dir']}/checkpoints"
    )
