"""The exact probability that a trajectory sampled from a tabular policy wins within the step limit."""

from __future__ import annotations

import numpy as np

from agent_rl.benchmarks.testbed.explore import Tables
from agent_rl.benchmarks.testbed.simulator import softmax


def success_probability(tables: Tables, logits: np.ndarray) -> np.ndarray:
    """Per task, the exact probability that a trajectory sampled from the policy wins within the
    step limit: the state distribution pushed forward ``max_steps`` times along the policy."""
    pi = softmax(logits)
    win_rate = (pi * tables.won).sum(axis=1)
    source, slot, target = tables.edges
    weight = pi[source, slot]
    mass = np.zeros(len(pi))
    mass[tables.start_state] = 1.0
    visits = np.zeros(len(pi))  # expected visits of each state before the limit
    for _ in range(tables.max_steps):
        visits += mass
        mass = np.bincount(target, weights=mass[source] * weight, minlength=len(pi))
    return np.bincount(tables.task_of_state, weights=visits * win_rate, minlength=len(tables.start_state))
