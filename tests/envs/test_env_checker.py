"""check_text_env: passes good environments and names the check a broken one fails."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agent_rl.envs import TextEnv, TextEnvCheckError, Transition, check_text_env
from agent_rl.envs.checker import HOSTILE_ACTIONS


class Walk(TextEnv):
    """A correct little environment: walk ``left``/``right`` on a line to reach the seeded cell."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_steps=kwargs.pop("max_steps", 20), **kwargs)
        self.position = self.goal = 0

    def _new_game(self, options: dict[str, Any] | None) -> str:
        self.position, self.goal = 0, int(self.np_random.integers(2, 6))
        self.task = f"Walk to cell {self.goal}."
        return f"You are at cell {self.position}."

    def _apply(self, command: str) -> Transition:
        if command not in ("left", "right"):
            return Transition(f"Unknown command {command!r}.", valid=False, error="unknown command")
        self.position += 1 if command == "right" else -1
        return Transition(f"You are at cell {self.position}.")

    def admissible_actions(self) -> list[str]:
        return ["left", "right"]

    def anchor(self) -> str:
        return str(self.position)

    def oracle(self) -> list[str]:
        return ["right"] * (self.goal - self.position)

    def is_won(self) -> bool:
        return self.position == self.goal


class RaisesOnHash(Walk):
    def _apply(self, command: str) -> Transition:
        if command == "# comment":  # one fuzz action, one gymnasium's random samples never hit
            raise KeyError(command)
        return super()._apply(command)


class IntAnchor(Walk):
    def anchor(self) -> Any:
        return self.position


class DriftsAcrossResets(Walk):
    """Step 2 onwards depends on how often the class was reset: not deterministic per seed."""

    resets = 0

    def _new_game(self, options: dict[str, Any] | None) -> str:
        DriftsAcrossResets.resets += 1
        return super()._new_game(options)

    def _apply(self, command: str) -> Transition:
        transition = super()._apply(command)
        if self._steps >= 1:
            transition.observation += f" ({DriftsAcrossResets.resets})"
        return transition


class AcceptsJunk(Walk):
    def _apply(self, command: str) -> Transition:
        if command == "quit":
            return Transition("Bye!")
        return super()._apply(command)


class HangsOnLongInput(Walk):
    def _apply(self, command: str) -> Transition:
        if command.startswith("x" * 50):
            time.sleep(30)
        return super()._apply(command)


class BreaksAfterRestart(Walk):
    broken = False

    def _apply(self, command: str) -> Transition:
        self.broken = self.broken or command == "restart"
        if self.broken:
            return Transition("Something went wrong.", valid=False, error="broken")
        return super()._apply(command)


def test_a_correct_environment_passes_with_a_full_report():
    report = check_text_env(Walk(), seeds=(0, 1))
    assert report.checks == ["gymnasium_check_env", "info_contract", "determinism", "fuzz", "usable_after_fuzz"]
    assert report.fuzz_actions == len(HOSTILE_ACTIONS)
    assert report.steps > report.fuzz_actions
    assert 0 < report.slowest_fuzz_step_s < 2.0


@pytest.mark.parametrize(
    ("env", "check"),
    [
        (RaisesOnHash(), "fuzz"),
        (IntAnchor(), "info_contract"),
        (DriftsAcrossResets(), "determinism"),
        (AcceptsJunk(), "fuzz"),
        (BreaksAfterRestart(), "usable_after_fuzz"),
    ],
    ids=lambda value: value if isinstance(value, str) else type(value).__name__,
)
def test_a_broken_environment_fails_the_named_check(env, check):
    with pytest.raises(TextEnvCheckError) as failure:
        check_text_env(env)
    assert failure.value.check == check and f"[{check}]" in str(failure.value)


def test_a_hanging_step_is_interrupted():
    start = time.perf_counter()
    with pytest.raises(TextEnvCheckError, match=r"\[fuzz\].*did not return"):
        check_text_env(HangsOnLongInput(), fuzz_time_limit=0.2)
    assert time.perf_counter() - start < 10


def test_gymnasiums_own_checker_runs_first():
    class WrongSpace(Walk):
        def _new_game(self, options):
            super()._new_game(options)
            return 42

    with pytest.raises(TextEnvCheckError) as failure:
        check_text_env(WrongSpace())
    assert failure.value.check == "gymnasium_check_env"


def test_by_id_with_kwargs_and_argument_errors():
    report = check_text_env("agent_rl/Maze-v0", env_kwargs={"n_rooms": 5, "n_locked_doors": 1}, seeds=(3,))
    assert report.env_id == "agent_rl/Maze-v0"
    with pytest.raises(ValueError, match="seeds"):
        check_text_env(Walk(), seeds=())
    with pytest.raises(ValueError, match="env_kwargs"):
        check_text_env(Walk(), env_kwargs={"max_steps": 3})
    with pytest.raises(ValueError, match="fuzz_time_limit"):
        check_text_env(Walk(), fuzz_time_limit=0)
