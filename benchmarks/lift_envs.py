"""The user environments of ``agent-rl bench lift``: plain Gymnasium envs with text spaces, no oracle,
written the way a user writes one (no ``agent_rl.envs.TextEnv`` base class), registered under ``lift/``.

- ``lift/SayTheNumber-v0``: the README quickstart's environment: say the number (1-3) you are shown.
  Random play wins 1/3; the answer can be copied from the observation.
- ``lift/Bandit-v0``: a one-step contextual bandit. The observation names one of 8 signs; each sign
  opens one of 4 doors by a fixed table that nothing in the text reveals, so the answer cannot be
  copied: it must be learned from rewards. Random play wins 1/4.
- ``lift/Combination-v0``: four steps, one reward at the end. A lock has four dials; each dial
  shows a symbol, and a table that nothing in the text reveals says whether that symbol's dial turns
  up or down. The lock opens (reward 1) only when all four turns were right, and says nothing before
  that. Random play wins 1/16; a policy that reads each dial's symbol wins every time.
- ``lift/BranchingCombination-v0``: the same lock, but which dial comes next depends on the turn:
  the dials form a binary tree (up to one child, down to the other), each with its own symbol and
  its node number in the text. Where a turn leads says nothing about whether it was right (that
  takes the hidden table), yet trajectories that turned differently go on to different dials, so
  their later states differ. Random play wins 1/16.

    agent-rl train env.id=benchmarks.lift_envs:lift/Bandit-v0
"""

from __future__ import annotations

import string

import gymnasium as gym

SIGNS = ("red", "blue", "green", "gold", "star", "moon", "tree", "fish")
DOORS = ("A", "B", "C", "D")
DOOR_OF_SIGN = dict(zip(SIGNS, ("C", "A", "D", "B", "B", "D", "A", "C")))
"""The fixed table: every door opens for two signs."""


class SayTheNumber(gym.Env):
    """Say the number you are shown (the README quickstart's environment)."""

    observation_space = action_space = gym.spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.number = str(self.np_random.integers(1, 4))
        return self.number, {"task": "Say the number you are shown.", "admissible_actions": ["1", "2", "3"]}

    def step(self, action):
        won = action == self.number
        return "right" if won else "wrong", float(won), True, False, {"won": won, "admissible_actions": ["1", "2", "3"]}


class Bandit(gym.Env):
    """One step: the observation names a sign, and the door it opens must be named."""

    observation_space = action_space = gym.spaces.Text(64, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.sign = SIGNS[int(self.np_random.integers(len(SIGNS)))]
        info = {"task": "Each sign opens one door. Name the door.", "admissible_actions": list(DOORS)}
        return f"The sign shows {self.sign}.", info

    def step(self, action):
        valid = action in DOORS
        won = action == DOOR_OF_SIGN[self.sign]
        observation = "The door opens." if won else ("The door stays shut." if valid else "There is no such door.")
        return (
            observation,
            float(won),
            True,
            False,
            {"won": won, "action_valid": valid, "admissible_actions": list(DOORS)},
        )


SYMBOLS = ("circle", "square", "star", "wave")
TURN_OF_SYMBOL = dict(zip(SYMBOLS, ("up", "down", "down", "up")))
"""The hidden table of ``lift/Combination-v0``."""
DIALS = 4


class Combination(gym.Env):
    """Turn each of ``dials`` dials (four by default) up or down as its symbol demands; the lock
    opens only when all are right. An invalid action leaves the dial as it is and says so; 12 turns
    end the episode. With ``branching``, the dials are the nodes of a binary tree of that depth, and
    a turn up or down leads to one child or the other."""

    observation_space = action_space = gym.spaces.Text(96, charset=string.printable)
    turns = ("up", "down")
    time_limit = 12

    def __init__(self, dials: int = DIALS, branching: bool = False):
        if not isinstance(dials, int) or dials < 1:
            raise ValueError(f"dials must be a positive integer, got {dials!r}")
        self.dials, self.branching = dials, bool(branching)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        nodes = 2**self.dials - 1 if self.branching else self.dials
        self.symbols = [SYMBOLS[int(i)] for i in self.np_random.integers(len(SYMBOLS), size=nodes)]
        self.dial = self.node = self.elapsed = 0
        self.all_right = True
        info = {"task": "Open the lock: turn each dial up or down.", "admissible_actions": list(self.turns)}
        return self._shows(), info

    def _shows(self) -> str:
        where = f" (node {self.node + 1})" if self.branching else ""
        return f"Dial {self.dial + 1} of {self.dials}{where} shows {self.symbols[self.node]}."

    def step(self, action):
        self.elapsed += 1
        valid = action in self.turns
        info = {"action_valid": valid, "admissible_actions": list(self.turns), "won": False}
        if valid:
            self.all_right &= action == TURN_OF_SYMBOL[self.symbols[self.node]]
            self.dial += 1
            self.node = 2 * self.node + 1 + self.turns.index(action) if self.branching else self.dial
        if self.dial == self.dials:
            info["won"] = self.all_right
            return (
                ("The lock opens." if self.all_right else "The lock stays shut."),
                float(self.all_right),
                True,
                False,
                info,
            )
        observation = self._shows() if valid else f"Turn up or down. {self._shows()}"
        return observation, 0.0, False, self.elapsed >= self.time_limit, info


gym.register("lift/SayTheNumber-v0", entry_point=SayTheNumber)
gym.register("lift/Bandit-v0", entry_point=Bandit)
gym.register("lift/Combination-v0", entry_point=Combination)
gym.register("lift/BranchingCombination-v0", entry_point=Combination, kwargs={"branching": True})
