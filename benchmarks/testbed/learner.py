"""The tabular policy gradient, and the rescaling of the ``equal`` view."""

from __future__ import annotations

import numpy as np

from agent_rl.benchmarks.testbed.simulator import softmax


def policy_gradient_step(
    logits: np.ndarray, states: np.ndarray, actions: np.ndarray, advantages: np.ndarray, lr: float
) -> None:
    """``logits[s, a] += lr * A * (onehot(a) - pi(.|s))`` summed over rows, in place (pi before the step)."""
    visited, inverse = np.unique(states, return_inverse=True)
    width = logits.shape[1]
    pi = softmax(logits[visited])
    per_state = np.bincount(inverse, weights=advantages, minlength=len(visited))
    per_action = np.bincount(inverse * width + actions, weights=advantages, minlength=len(visited) * width)
    logits[visited] += lr * (per_action.reshape(len(visited), width) - per_state[:, None] * pi)


def unit_mean_abs(advantages: np.ndarray, seed_of_row: np.ndarray, n_seeds: int) -> np.ndarray:
    """Advantages rescaled so that each seed's rows have mean |A| = 1 (rows of a seed whose
    advantages are all 0 stay 0): the ``equal`` view, where arms differ only in direction."""
    rows = np.bincount(seed_of_row, minlength=n_seeds)
    mean_abs = np.bincount(seed_of_row, weights=np.abs(advantages), minlength=n_seeds) / np.maximum(rows, 1)
    scale = np.divide(1.0, mean_abs, out=np.zeros_like(mean_abs), where=mean_abs > 0)
    return advantages * scale[seed_of_row]
