"""A corridor: take the key at one end, open the door at the other; registered the way a user
registers an environment (``testbed/KeyCorridor-v0``)."""

from __future__ import annotations

from typing import Any

from agent_rl.envs import TextEnv, Transition, register_text_env


class KeyCorridorEnv(TextEnv):
    """A corridor of cells: take the key at one end, then open the door at the other end.

    Registered below with ``agent_rl.envs.register_text_env`` exactly as a user would register their own
    environment. Its states recur constantly (walking back and forth), so anchor groups are large.
    The length, the key's end and the start cell come from the seed.
    """

    def __init__(self, *, min_length: int = 5, max_length: int = 8, max_steps: int = 20, **base_kwargs: Any) -> None:
        if not 3 <= min_length <= max_length:
            raise ValueError(f"need 3 <= min_length <= max_length, got {min_length} and {max_length}")
        super().__init__(max_steps=max_steps, **base_kwargs)
        self.min_length, self.max_length = min_length, max_length
        self.length = self.key_cell = self.door_cell = self.start = self.cell = 0
        self.has_key = self.opened = False

    def _new_game(self, options: dict[str, Any] | None) -> str:
        self.length = int(self.np_random.integers(self.min_length, self.max_length + 1))
        self.key_cell = 0 if self.np_random.random() < 0.5 else self.length - 1
        self.door_cell = self.length - 1 - self.key_cell
        self.start = self.cell = int(self.np_random.integers(1, self.length - 1))
        self.has_key = self.opened = False
        self.task = "Take the key, then open the door with it. Commands: left, right, take key, open door."
        return self._describe("")

    def _apply(self, command: str) -> Transition:
        if command in ("left", "right"):
            target = self.cell + (-1 if command == "left" else 1)
            if not 0 <= target < self.length:
                return self._invalid(f"A wall blocks the way {command}.")
            self.cell = target
            return Transition(self._describe(f"You walk {command}."))
        if command == "take key":
            if self.cell != self.key_cell or self.has_key:
                return self._invalid("There is no key here.")
            self.has_key = True
            return Transition(self._describe("You take the key."))
        if command == "open door":
            if self.cell != self.door_cell:
                return self._invalid("There is no door here.")
            if not self.has_key:
                return self._invalid("The door is locked.")
            self.opened = True
            return Transition(self._describe("The door opens."), terminated=True)
        return self._invalid(f"Unknown command {command!r}. Commands: left, right, take key, open door.")

    def _invalid(self, message: str) -> Transition:
        return Transition(self._describe(message), valid=False, error=message)

    def _describe(self, message: str) -> str:
        sights = [
            *(["You see a key."] if self.cell == self.key_cell and not self.has_key else []),
            *(["There is a door here."] if self.cell == self.door_cell else []),
        ]
        here = " ".join([f"You are in cell {self.cell + 1} of {self.length}.", *sights])
        carrying = f"You carry {'the key' if self.has_key else 'nothing'}."
        return "\n".join([*([message] if message else []), here, carrying])

    def admissible_actions(self) -> list[str]:
        actions = [move for move, ok in (("left", self.cell > 0), ("right", self.cell < self.length - 1)) if ok]
        if self.cell == self.key_cell and not self.has_key:
            actions.append("take key")
        if self.cell == self.door_cell and self.has_key:
            actions.append("open door")
        return actions

    def anchor(self) -> str:
        return f"cell={self.cell};key={int(self.has_key)}"

    def is_won(self) -> bool:
        return self.opened

    def instance_key(self) -> str:
        return f"length={self.length};key={self.key_cell};start={self.start}"


register_text_env(
    "testbed/KeyCorridor-v0",
    KeyCorridorEnv,
    description="Walk a corridor: take the key at one end, open the door at the other (credit testbed toy).",
)
