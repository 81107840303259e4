"""Oracle plans: the action sequence that wins from an environment's current state."""

from __future__ import annotations

import gymnasium as gym


def has_oracle(env: gym.Env) -> bool:
    """Whether ``env`` (wrapped or not) can give an oracle plan: its unwrapped env has ``oracle()``."""
    return callable(getattr(env.unwrapped, "oracle", None))


def oracle_actions(env: gym.Env) -> list[str]:
    """A shortest (or walkthrough) winning command sequence from ``env``'s current state.

    ``env`` may be wrapped (``gymnasium.make`` adds wrappers); the plan comes from the unwrapped
    environment's ``oracle()`` method (every ``TextEnv`` has one). Call it after ``reset``.
    """
    if not has_oracle(env):
        raise TypeError(f"{type(env.unwrapped).__name__} has no oracle() method, so it has no oracle plan")
    return [str(action) for action in env.unwrapped.oracle()]
