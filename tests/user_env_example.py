"""A user-defined text environment, registered the way a user script or plugin would do it.

Importing this module registers ``usertest/Counter-v0``; the tests use it through ``gymnasium.make``,
``agent-rl envs --import user_env_example`` and the checker.
"""

from __future__ import annotations

from typing import Any

from agent_rl.envs import TextEnv, Transition, register_text_env


class CounterEnv(TextEnv):
    """Reach ``target`` from 0 with ``inc`` and ``dec``; the target comes from the seed."""

    def __init__(self, *, max_target: int = 5, **base_kwargs: Any) -> None:
        super().__init__(**base_kwargs)
        self.max_target = max_target
        self.value = 0
        self.target = 0

    def _new_game(self, options: dict[str, Any] | None) -> str:
        self.value = 0
        self.target = int(self.np_random.integers(1, self.max_target + 1))
        self.task = f"Make the counter equal {self.target}."
        return f"The counter shows {self.value}."

    def _apply(self, command: str) -> Transition:
        if command not in ("inc", "dec"):
            return Transition(f"Unknown command {command!r}; use inc or dec.", valid=False, error="unknown command")
        self.value += 1 if command == "inc" else -1
        return Transition(f"The counter shows {self.value}.")

    def admissible_actions(self) -> list[str]:
        return ["inc", "dec"]

    def anchor(self) -> str:
        return f"value={self.value}"

    def oracle(self) -> list[str]:
        return (
            ["inc"] * (self.target - self.value) if self.value <= self.target else ["dec"] * (self.value - self.target)
        )

    def is_won(self) -> bool:
        return self.value == self.target


register_text_env(
    "usertest/Counter-v0",
    CounterEnv,
    description="Count up or down to a seeded target (a user environment used by the tests).",
    default_anchor="state",
    max_target=5,
)
