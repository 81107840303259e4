"""A run's directory: a new one claimed, or an interrupted one resumed from its checkpoint."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from rich.console import Console

from agent_rl.config import Config, ConfigError
from agent_rl.training.infra import checkpoint
from agent_rl.training.infra.distributed import DistContext, broadcast_flag

RESUME_MAY_CHANGE = (
    "trainer.iterations",
    "trainer.run_dir",
    "trainer.target_success",
    "trainer.confirm_episodes",
    "trainer.torch_threads",
    "logging",
    "engine",
    "scale",
)
"""Config keys a resumed run may change; any other difference refuses the checkpoint."""


def default_run_dir(config: Config) -> Path:
    name = config.env.id.split("/")[-1].lower()
    return Path("runs") / f"{name}-{config.algo.preset}-{time.strftime('%Y%m%d-%H%M%S')}"


LOCK_FILE = ".agent-rl.lock"
"""Held by the process training in the directory (or a benchmark training runs under it), for as long as it trains."""


def hold_dir(path: Path, in_use: str) -> FileLock:
    """Hold ``path`` (its :data:`LOCK_FILE`) for this process, creating it if needed; ``FileExistsError``
    with ``in_use`` when another process holds it. The operating system releases the lock when the
    process ends, however it ends."""
    path.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise FileExistsError(in_use) from None
    return lock


def lock_run_dir(run_dir: Path, dist: DistContext) -> FileLock | None:
    """Hold ``run_dir`` for this run (rank 0 for every learner process): a second process training
    in it (a benchmark started twice, a resume beside the live run) would delete the first one's
    checkpoint save in progress and interleave its logs."""
    if not dist.is_main:
        return None
    return hold_dir(
        run_dir,
        f"run directory {str(run_dir)!r} is in use by another training process; wait for it to end (or stop "
        "it: it saves a checkpoint to resume from) or choose another trainer.run_dir",
    )


def run_dir_in_use(run_dir: Path) -> bool:
    """Whether a process holds ``run_dir`` now (:func:`hold_dir`: a run training in it, or a benchmark
    training runs under it)."""
    if not (Path(run_dir) / LOCK_FILE).is_file():
        return False
    lock = FileLock(Path(run_dir) / LOCK_FILE)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return True
    lock.release()
    return False


def open_run_dir(
    config: Config,
    *,
    resume: bool | str,
    resume_from: str,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    generators: dict[str, Any],
    dist: DistContext,
    console: Console,
) -> tuple[Path, tuple[int, dict[str, Any]] | None, FileLock | None]:
    """Set ``config.trainer.run_dir`` and hold it (:func:`lock_run_dir`), remove leftovers of
    interrupted saves, then restore the checkpoint ``resume_from`` into ``model``, ``optimizer`` and
    ``generators`` (``resume``: True, or "auto" when the directory holds checkpoints) or claim the
    directory for a new run. Returns the directory, for a resumed run its ``(iteration, trainer
    state)``, and the lock to release when the run ends."""
    if resume not in (False, True, "auto"):
        raise ValueError(f"resume must be False, True or 'auto', got {resume!r}")
    if resume_from not in checkpoint.POINTERS:
        raise ValueError(f"resume_from (--resume-from) must be one of {checkpoint.POINTERS}, got {resume_from!r}")
    if resume_from != "last" and not resume:
        raise ValueError(
            f"resume_from={resume_from!r} (--resume-from) applies only to a resumed run: resume=True "
            "or 'auto' (--resume RUN_DIR or --resume auto)"
        )
    if resume == "auto" and not config.trainer.run_dir:
        raise ConfigError(
            "config key 'trainer.run_dir': resuming with 'auto' needs a fixed run directory, "
            "the one a restarted job looks in"
        )
    run_dir = Path(config.trainer.run_dir) if config.trainer.run_dir else default_run_dir(config)
    config.trainer.run_dir = str(run_dir)
    lock = lock_run_dir(run_dir, dist)
    try:
        if dist.is_main and (left := checkpoint.remove_leftovers(run_dir)):
            console.print(f"removed {len(left)} leftover(s) of an interrupted save from {run_dir}")
        if resume == "auto":
            resume = broadcast_flag(dist.is_main and checkpoint.holds_checkpoints(run_dir), dist)
            if not resume:
                console.print(f"no checkpoint in {run_dir}: starting a new run")
        if not resume:
            checkpoint.claim_run_dir(run_dir, dist)
            return run_dir, None, lock
        iteration, state = checkpoint.resume_run(
            run_dir,
            config,
            model=model,
            optimizer=optimizer,
            generators=generators,
            may_change=RESUME_MAY_CHANGE,
            which=resume_from,
        )
        console.print(f"[bold]resumed[/] {run_dir} at iteration {iteration} ({resume_from!r} checkpoint)")
        if dist.is_main and (moved := checkpoint.rewind(run_dir, resume_from)):
            console.print(
                f"pointers {', '.join(moved)} now name iteration {iteration}; the iterations after it run again"
            )
        saved_threads = state.get("torch_threads")
        if saved_threads is not None and saved_threads != torch.get_num_threads():
            console.print(
                f"[yellow]warning[/]: the checkpoint was written with {saved_threads} torch threads, this process has "
                f"{torch.get_num_threads()}: float sums are ordered differently, so the run continues correctly "
                "but not bit-identically to an uninterrupted one"
            )
        return run_dir, (iteration, state), lock
    except BaseException:
        if lock is not None:
            lock.release()
        raise
