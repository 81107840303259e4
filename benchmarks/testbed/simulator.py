"""The tabular softmax policy and its rollouts, simulated on the explored tables for every task at
once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agent_rl.benchmarks.testbed.explore import Tables


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax over finite entries (-inf marks a missing action); all-missing rows give 0."""
    top = logits.max(axis=1, keepdims=True)
    top[~np.isfinite(top)] = 0.0
    weights = np.exp(logits - top)
    total = weights.sum(axis=1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


def initial_logits(tables: Tables) -> np.ndarray:
    """A uniform policy over each state's admissible actions."""
    return np.where(tables.admissible, 0.0, -np.inf)


@dataclass
class Rollout:
    """The rows of one batch, in time order within each trajectory (trajectories interleaved)."""

    traj: np.ndarray
    """Trajectory id (tasks x group size of them)."""
    task: np.ndarray
    """Task of the row: its group id."""
    state: np.ndarray
    """Global state the action was chosen in."""
    action: np.ndarray
    """Slot of the chosen action."""
    observation_id: np.ndarray
    """The observation the action was chosen on (index into ``Tables.observations``)."""
    reward: np.ndarray
    """The environment's reward for the action."""
    valid: np.ndarray
    """``info["action_valid"]`` of the action."""
    won: np.ndarray
    """``info["won"]`` after the action."""
    terminated: np.ndarray
    """The action ended the episode (a trajectory's last row without it was cut by the step limit)."""


def rollout(tables: Tables, logits: np.ndarray, uniforms: np.ndarray) -> Rollout:
    """Sample ``uniforms.shape[1]`` trajectories from every task's reset state (inverse-CDF sampling
    with the given uniforms, shape (tasks, group size, max steps)), all tasks at once."""
    n_tasks, group_size, _ = uniforms.shape
    traj_task = np.repeat(np.arange(n_tasks), group_size)
    noise = uniforms.reshape(n_tasks * group_size, -1)
    state = tables.start_state[traj_task]
    observation = tables.start_observation_id[traj_task]
    can_act = tables.admissible.any(axis=1)  # a state without admissible actions ends the trajectory
    alive = np.flatnonzero(can_act[state])
    columns: list[list[np.ndarray]] = [[] for _ in range(9)]
    for t in range(tables.max_steps):
        if len(alive) == 0:
            break
        s = state[alive]
        cumulative = np.cumsum(softmax(logits[s]), axis=1)
        action = np.minimum((cumulative < noise[alive, t, None]).sum(axis=1), tables.admissible[s].sum(axis=1) - 1)
        for column, values in zip(
            columns,
            (
                alive,
                traj_task[alive],
                s,
                action,
                observation[alive],
                tables.reward[s, action],
                tables.valid[s, action],
                tables.won[s, action],
                tables.next_state[s, action] < 0,
            ),
        ):
            column.append(values)
        state[alive] = tables.next_state[s, action]
        observation[alive] = tables.observation_id[s, action]
        alive = alive[state[alive] >= 0]
        alive = alive[can_act[state[alive]]]
    return Rollout(*(np.concatenate(column) for column in columns))
