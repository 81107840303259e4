"""agent-rl: multi-turn agent RL on text environments with step-level credit assignment.

Importing this package is cheap: numpy only. Everything below loads on first attribute access,
so ``from agent_rl import load_config, train`` imports the trainer (torch) only then.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

__version__ = "0.1.0"

_CHECKOUT = Path(__file__).resolve().parent.parent
if (_CHECKOUT / "pyproject.toml").is_file():
    # Imported from a source checkout (editable, or on sys.path as a benchmark's worktree is): its
    # folders envs/, anchors/, training/ and benchmarks/ are this package's subpackages, even when
    # another checkout is the one installed.
    __path__.append(str(_CHECKOUT))

_LAZY = {
    # configs
    "Config": ("agent_rl.config", "Config"),
    "load_config": ("agent_rl.config", "load_config"),
    "resolve": ("agent_rl.training.infra.resolution", "resolve"),
    # training, resuming and evaluating (what the CLI does)
    "Trainer": ("agent_rl.training.loop.trainer", "Trainer"),
    "train": ("agent_rl.training.loop.trainer", "train"),
    "evaluate_policy": ("agent_rl.training.loop.evaluation", "evaluate_policy"),
    # the credit-assignment core
    "StepBatch": ("agent_rl.core.batch", "StepBatch"),
    "discounted_returns": ("agent_rl.core.advantages", "discounted_returns"),
    "episode_advantages": ("agent_rl.core.advantages", "episode_advantages"),
    "step_advantages": ("agent_rl.core.advantages", "step_advantages"),
    "compute_advantages": ("agent_rl.core.advantages", "compute_advantages"),
    "Credit": ("agent_rl.core.advantages", "Credit"),
    "policy_loss": ("agent_rl.core.losses", "policy_loss"),
    "kl_penalty": ("agent_rl.core.losses", "kl_penalty"),
    "LOSS_PRESETS": ("agent_rl.core.presets", "LOSS_PRESETS"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'agent_rl' has no attribute {name!r}")
