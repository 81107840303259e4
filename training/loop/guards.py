"""What a run says about its own health, and what stops a run that can no longer learn:
environments that keep failing and optimizer steps that keep coming out non-finite. Both errors
name the last checkpoint and the command that continues from it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.console import Console

from agent_rl.config import Config
from agent_rl.training.infra.env_calls import failure_kind

NONFINITE_STOP = 4
"""Optimizer steps in a row with a non-finite loss or gradient norm that stop a run."""


class NonFiniteUpdates(ValueError):
    """Several optimizer steps in a row had a non-finite loss or gradient norm."""


class EnvironmentFailures(ValueError):
    """Too many of an iteration's trajectories failed because their environment raised."""


class FaultGuard:
    """Counts faults across iterations, reports each kind once and stops the run past its limits.
    ``how_to_go_on()`` says what the last checkpoint holds and how to continue from it."""

    def __init__(self, config: Config, console: Console, how_to_go_on: Callable[[], str]):
        self.env_id, self.anchor_key = config.env.id, config.env.anchor_key
        self.max_failed_share = config.trainer.max_failed_share
        self.console, self.how_to_go_on = console, how_to_go_on
        self.warned_blind_step_credit = False  # said once per run: it is the environment's nature, not an event
        self.env_failure_kinds: set[str] = set()  # environment errors already printed (env_calls.failure_kind)
        self.failing_streak = 0  # iterations running in which more than half of the trajectories failed
        self.nonfinite_streak = 0  # optimizer steps skipped for a non-finite loss or gradient since the last one taken

    def check_credit(self, iteration: int, blind: str | None) -> None:
        """Warn once per run when step credit found no state to compare (``Credit.blind_step_credit``)."""
        if blind and not self.warned_blind_step_credit:
            self.warned_blind_step_credit = True
            self.console.print(
                f"[yellow]warning[/]: iteration {iteration}: {blind}; env.anchor_key={self.anchor_key} "
                f"may never repeat in {self.env_id} (see anchors/grouped_fraction)"
            )

    def check_environments(self, iteration: int, stats: dict[str, Any]) -> None:
        """Print the first environment error of each kind once and the iteration's count of failed
        trajectories; stop the run when ``trainer.max_failed_share`` of them failed, or more than
        half in two iterations running."""
        failures = stats["failures"]
        for failure in failures:
            if (kind := failure_kind(failure)) not in self.env_failure_kinds:
                self.env_failure_kinds.add(kind)
                self.console.print(f"[yellow]environment error[/] in {self.env_id}: {failure}")
        played = len(failures) + int(stats["trajectories"])
        share = len(failures) / max(played, 1)
        self.failing_streak = self.failing_streak + 1 if share > 0.5 else 0
        if not failures:
            return
        self.console.print(
            f"iteration {iteration}: {len(failures)} of {played} trajectories failed in the environment "
            "and are left out"
        )
        if share >= self.max_failed_share or self.failing_streak >= 2:
            count = f"{len(failures)} of {played} trajectories failed at iteration {iteration}"
            why = (
                f"{count} (trainer.max_failed_share={self.max_failed_share})"
                if share >= self.max_failed_share
                else f"more than half of the trajectories failed in two iterations running ({count})"
            )
            raise EnvironmentFailures(f"{why}; the first error: {failures[0]}; the run stops ({self.how_to_go_on()})")

    def check_updates(self, iteration: int, learned: dict[str, float]) -> None:
        """Say when the learner skipped steps whose loss or gradient norm was not finite, and stop the
        run once ``NONFINITE_STOP`` such steps came with no finite step between them: the skipped steps
        changed no weight, so the last checkpoint holds the last good ones."""
        skipped = int(learned.get("update/nonfinite_steps", 0))
        if not skipped:
            if learned.get("update/optimizer_steps"):
                self.nonfinite_streak = 0
            return
        self.nonfinite_streak = skipped if learned.get("update/optimizer_steps") else self.nonfinite_streak + skipped
        self.console.print(
            f"[yellow]warning[/]: iteration {iteration}: {skipped} optimizer step(s) skipped: "
            "the loss or the gradient norm was not finite"
        )
        if self.nonfinite_streak >= NONFINITE_STOP:
            raise NonFiniteUpdates(
                f"{self.nonfinite_streak} optimizer steps in a row had a non-finite loss or gradient "
                f"norm at iteration {iteration}; they changed no weight and the run stops ({self.how_to_go_on()})"
            )
