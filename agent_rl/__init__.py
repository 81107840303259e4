"""agent-rl: multi-turn agent RL on text environments with step-level credit assignment.

Importing this package is cheap: numpy only. Torch-based pieces (``agent_rl.losses``) load on
first attribute access.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "StepBatch": ("agent_rl.batch", "StepBatch"),
    "discounted_returns": ("agent_rl.advantages", "discounted_returns"),
    "episode_advantages": ("agent_rl.advantages", "episode_advantages"),
    "step_advantages": ("agent_rl.advantages", "step_advantages"),
    "compute_advantages": ("agent_rl.advantages", "compute_advantages"),
    "Credit": ("agent_rl.advantages", "Credit"),
    "policy_loss": ("agent_rl.losses", "policy_loss"),
    "kl_penalty": ("agent_rl.losses", "kl_penalty"),
    "LOSS_PRESETS": ("agent_rl.losses", "LOSS_PRESETS"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'agent_rl' has no attribute {name!r}")
