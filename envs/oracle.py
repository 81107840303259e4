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


AUTO_SFT_REASONS = {
    "oracle": "the environment gives oracle plans",
    "random": "the environment lists admissible actions but gives no oracle plan",
    "none": "the environment gives neither oracle plans nor admissible actions",
}
"""Why ``sft.mode=auto`` chose each mode (:func:`auto_sft_mode`)."""


def auto_sft_mode(env: gym.Env, seed: int = 0) -> str:
    """What ``sft.mode=auto`` warm-starts ``env`` with: ``oracle`` when it gives an oracle plan after
    ``reset(seed=seed)`` (an ``oracle()`` that raises ``NotImplementedError``, as games without one do,
    gives none), else ``random`` when the reset info lists ``admissible_actions``, else ``none``."""
    _, info = env.reset(seed=seed)
    if has_oracle(env):
        try:
            oracle_actions(env)
            return "oracle"
        except NotImplementedError:
            pass
    return "random" if info.get("admissible_actions") else "none"
