"""Each task's reachable state graph, explored breadth first with the real environment, and all tasks
stacked as flat tables (states numbered globally)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class TaskGraph:
    """The states reachable from one reset within the step limit and every transition between them.
    Transitions are listed state by state, each state's in the order of its admissible actions."""

    anchors: list[str]
    """``info["anchor"]`` of each state; state 0 is the reset state."""
    n_actions: np.ndarray
    """Admissible actions per state (0 for states first reached at the step limit)."""
    action_names: list[str]
    action_id: np.ndarray
    """Per transition: its action, an index into ``action_names``."""
    next_state: np.ndarray
    """Per transition: the next state, or -1 where the action terminates the episode."""
    reward: np.ndarray
    """Per transition: the environment's reward."""
    won: np.ndarray
    """Per transition: ``info["won"]`` after it."""
    valid: np.ndarray
    """Per transition: ``info["action_valid"]``."""
    observation_texts: list[str]
    observation_id: np.ndarray
    """Per transition: the observation the step returned (what the next action is chosen on), an
    index into ``observation_texts``; index 0 is the reset observation."""
    max_steps: int
    """The environment's step limit: states first reached there are not expanded."""

    def first_transition(self) -> np.ndarray:
        """Index of each state's first transition."""
        return np.concatenate([[0], np.cumsum(self.n_actions)[:-1]])


def explore(env_id: str, kwargs: dict[str, Any], seed: int) -> TaskGraph:
    """Breadth-first search of one task's state graph by stepping the real environment.

    A state is restored by writing back a copy of the environment's attributes taken when the state
    was first reached, which is exact for environments that replace their state attributes on a
    step instead of mutating them in place (all bundled ones); :func:`replay_check` verifies it.
    """
    import gymnasium as gym

    env = gym.make(env_id, **kwargs)
    observation, info = env.reset(seed=seed)
    game = env.unwrapped
    if "admissible_actions" not in info:
        raise ValueError(f"{env_id} gives no info['admissible_actions']: the testbed needs a finite action set")
    max_steps = int(game.max_steps)
    names: dict[str, int] = {}
    texts = {observation: 0}
    index = {info["anchor"]: 0}
    anchors, snapshots, depth, admissible = [info["anchor"]], [dict(vars(game))], [0], [info["admissible_actions"]]
    n_actions: list[int] = []
    columns: tuple[list, ...] = ([], [], [], [], [], [])  # action, next state, reward, won, valid, observation
    state = 0
    while state < len(anchors):
        actions = admissible[state] if depth[state] < max_steps else []
        n_actions.append(len(actions))
        for action in actions:
            vars(game).update(snapshots[state])
            observation, reward, terminated, _, info = env.step(action)
            target = -1
            if not terminated:
                target = index.setdefault(info["anchor"], len(anchors))
                if target == len(anchors):
                    anchors.append(info["anchor"])
                    snapshots.append(dict(vars(game)))
                    depth.append(depth[state] + 1)
                    admissible.append(info.get("admissible_actions", []))
            values = (
                names.setdefault(action, len(names)),
                target,
                reward,
                info["won"],
                info["action_valid"],
                texts.setdefault(observation, len(texts)),
            )
            for column, value in zip(columns, values):
                column.append(value)
        snapshots[state] = None  # expanded: its snapshot is no longer needed
        state += 1
    env.close()
    action, next_state, reward, won, valid, observation_id = columns
    return TaskGraph(
        anchors,
        np.array(n_actions),
        list(names),
        np.array(action, dtype=np.int64),
        np.array(next_state, dtype=np.int64),
        np.array(reward, dtype=np.float64),
        np.array(won, dtype=bool),
        np.array(valid, dtype=bool),
        list(texts),
        np.array(observation_id, dtype=np.int64),
        max_steps,
    )


def replay_check(env_id: str, kwargs: dict[str, Any], seed: int, graph: TaskGraph, rng: np.random.Generator) -> None:
    """Play one random walk of the recorded graph through the environment's public API (a fresh
    ``reset(seed)`` and ``step``s) and check that every anchor, reward and observation agrees."""
    import gymnasium as gym

    env = gym.make(env_id, **kwargs)
    observation, info = env.reset(seed=seed)
    first = graph.first_transition()
    state, agrees = 0, observation == graph.observation_texts[0]
    for _ in range(graph.max_steps):
        agrees = agrees and info["anchor"] == graph.anchors[state]
        if not agrees:
            break
        edge = first[state] + int(rng.integers(graph.n_actions[state]))
        observation, reward, terminated, _, info = env.step(graph.action_names[graph.action_id[edge]])
        agrees = (
            terminated == (graph.next_state[edge] < 0)
            and reward == graph.reward[edge]
            and observation == graph.observation_texts[graph.observation_id[edge]]
        )
        if terminated or not agrees:
            break
        state = graph.next_state[edge]
    else:  # the step limit: the last state must match too
        agrees = info["anchor"] == graph.anchors[state]
    env.close()
    if not agrees:
        raise RuntimeError(
            f"{env_id} seed {seed}: replaying the explored state graph through reset/step disagrees with it; the "
            "testbed restores states by copying the environment's attributes, which needs a step that replaces its "
            "state attributes rather than mutating them in place"
        )


@dataclass
class Tables:
    """All tasks of one environment (every seed's) as flat arrays; states are numbered globally."""

    next_state: np.ndarray
    """(states, max actions) int64: next state, -1 for termination and padding."""
    reward: np.ndarray
    """(states, max actions) float64."""
    won: np.ndarray
    """(states, max actions) bool."""
    valid: np.ndarray
    """(states, max actions) bool."""
    admissible: np.ndarray
    """(states, max actions) bool: the action slot exists."""
    observation_id: np.ndarray
    """(states, max actions): index into ``observations`` of the step's observation."""
    action_id: np.ndarray
    """(states, max actions): index into ``actions``."""
    anchor_id: np.ndarray
    """(states,): index into ``anchors``."""
    task_of_state: np.ndarray
    """(states,): the task (seed x tasks + task) a state belongs to."""
    start_state: np.ndarray
    """(tasks,): the reset state of each task."""
    start_observation_id: np.ndarray
    """(tasks,): index into ``observations`` of each task's reset observation."""
    anchors: np.ndarray
    """Distinct anchor strings (object array)."""
    actions: np.ndarray
    """Distinct action strings (object array)."""
    observations: np.ndarray
    """Distinct observation strings (object array; only ``""`` when they are not kept)."""
    max_steps: int
    """The step limit."""
    edges: tuple[np.ndarray, np.ndarray, np.ndarray] = field(init=False)
    """(source state, action slot, target state) of every non-terminating transition."""

    def __post_init__(self) -> None:
        source, slot = np.nonzero(self.next_state >= 0)
        self.edges = (source, slot, self.next_state[source, slot])


def build_tables(graphs: list[TaskGraph]) -> Tables:
    """Stack the task graphs, numbering states globally and strings across tasks."""
    texts: dict[str, dict[str, int]] = {"anchors": {}, "actions": {}, "observations": {}}

    def global_ids(kind: str, values: list[str]) -> np.ndarray:
        table = texts[kind]
        return np.array([table.setdefault(value, len(table)) for value in values], dtype=np.int64)

    n_states = np.array([len(g.anchors) for g in graphs])
    offsets = np.concatenate([[0], np.cumsum(n_states)[:-1]])
    n_actions = np.concatenate([g.n_actions for g in graphs])
    shape = (len(n_actions), int(n_actions.max()))
    # Row and slot of every transition: each state's transitions are consecutive, in slot order.
    rows = np.repeat(np.arange(len(n_actions)), n_actions)
    slots = np.arange(len(rows)) - np.repeat(np.cumsum(n_actions) - n_actions, n_actions)
    state_offset = np.repeat(offsets, [len(g.next_state) for g in graphs])
    target = np.concatenate([g.next_state for g in graphs])
    tables = {
        name: np.zeros(shape, dtype=dtype)
        for name, dtype in (
            ("reward", np.float64),
            ("won", bool),
            ("valid", bool),
            ("admissible", bool),
            ("observation_id", np.int64),
            ("action_id", np.int64),
        )
    }
    tables["next_state"] = np.full(shape, -1, dtype=np.int64)
    tables["next_state"][rows, slots] = np.where(target >= 0, target + state_offset, -1)
    tables["admissible"][rows, slots] = True
    for name in ("reward", "won", "valid"):
        tables[name][rows, slots] = np.concatenate([getattr(g, name) for g in graphs])
    tables["action_id"][rows, slots] = np.concatenate(
        [global_ids("actions", g.action_names)[g.action_id] for g in graphs]
    )
    observation_ids = [global_ids("observations", g.observation_texts) for g in graphs]
    tables["observation_id"][rows, slots] = np.concatenate(
        [ids[g.observation_id] for ids, g in zip(observation_ids, graphs)]
    )
    anchor_id = np.concatenate([global_ids("anchors", g.anchors) for g in graphs])
    strings = {kind: np.array(list(table), dtype=object) for kind, table in texts.items()}
    return Tables(
        **tables,
        anchor_id=anchor_id,
        task_of_state=np.repeat(np.arange(len(graphs)), n_states),
        start_state=offsets,
        start_observation_id=np.array([ids[0] for ids in observation_ids]),
        anchors=strings["anchors"],
        actions=strings["actions"],
        observations=strings["observations"],
        max_steps=graphs[0].max_steps,
    )
