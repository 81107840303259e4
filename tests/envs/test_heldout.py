"""Held-out evaluation: no evaluation seed (``EVAL_SEED_BASE + i``) reaches a training instance.

For Maze, Sokoban and MiniCode: instance keys of training and evaluation seeds are disjoint (on
configurations small enough that single-draw generation repeats training instances), each key lies
in its seed's split, keys are canonical, resets stay deterministic, and the checker passes on
evaluation seeds. Then the opt-in hook for user environments and the bound on redraws. TextWorld's
two game pools are tested in ``test_env_textworld.py``.
"""

from __future__ import annotations

import random
from dataclasses import replace

import gymnasium as gym
import networkx as nx
import pytest

import agent_rl.envs.base
from agent_rl.envs import EVAL_SEED_BASE, TextEnv, Transition, check_text_env, instance_split, seed_split
from agent_rl.envs.maze import MazeEnv, generate_world
from agent_rl.envs.minicode import MiniCodeEnv
from agent_rl.envs.sokoban import SokobanEnv

MAIN_MAZE = dict(n_rooms=4, n_locked_doors=1, dead_ends=1, extra_edges=0, n_distractors=0, max_steps=20)
"""The README main job's maze: a few hundred layouts."""
SMALL = {
    "maze": (MazeEnv, MAIN_MAZE, 300),
    "maze_default": (MazeEnv, {}, 100),
    "sokoban": (SokobanEnv, dict(width=6, height=6, n_boxes=1, reverse_steps=20, max_steps=20), 150),
    "minicode": (MiniCodeEnv, dict(templates=["cube_plus"], n_tests=1), 300),
    "minicode_level1": (MiniCodeEnv, dict(level=1, n_tests=3), 100),
}
"""name -> (class, kwargs, seeds per split). Single draws repeat training instances on the small ones."""


def keys_of(env: TextEnv, seeds) -> list[str]:
    keys = []
    for seed in seeds:
        env.reset(seed=seed)
        keys.append(env.instance_key())
    return keys


def test_seed_convention():
    assert EVAL_SEED_BASE == 2**31
    assert [seed_split(s) for s in (None, 0, EVAL_SEED_BASE - 1, EVAL_SEED_BASE, EVAL_SEED_BASE + 7)] == [
        "train",
        "train",
        "train",
        "eval",
        "eval",
    ]
    # the low bit of a one-byte blake2b digest, the same on every run and machine: 0x2e for "", 0xde for "a"
    assert instance_split("") == "train" and instance_split("a") == "train" and instance_split("b") == "eval"


@pytest.mark.parametrize("name", SMALL)
def test_training_and_evaluation_instances_are_disjoint(name):
    cls, kwargs, n = SMALL[name]
    env = cls(**kwargs)
    train = keys_of(env, range(n))
    held_out = keys_of(env, range(EVAL_SEED_BASE, EVAL_SEED_BASE + n))
    assert not set(train) & set(held_out)
    assert {instance_split(key) for key in train} == {"train"}
    assert {instance_split(key) for key in held_out} == {"eval"}
    assert len(set(held_out)) > 1  # evaluation still varies
    keys_of(env, [None])  # an unseeded reset is a training reset
    assert instance_split(env.instance_key()) == "train"


@pytest.mark.parametrize("name", SMALL)
def test_a_seed_gives_one_instance_for_every_group_member(name):
    cls, kwargs, _ = SMALL[name]
    a, b = cls(**kwargs), gym.make(f"agent_rl/{cls.__name__.removesuffix('Env')}-v0", **kwargs).unwrapped
    seeds = [*range(5), *range(EVAL_SEED_BASE, EVAL_SEED_BASE + 5)]
    for seed in seeds:
        first, second = a.reset(seed=seed), b.reset(seed=seed)
        assert first == second and a.instance_key() == b.instance_key()
    assert keys_of(a, seeds) == keys_of(a, seeds)  # and again, after other resets


@pytest.mark.parametrize("name", ["maze", "sokoban", "minicode"])
def test_checker_passes_on_evaluation_seeds(name):
    cls, kwargs, _ = SMALL[name]
    report = check_text_env(cls(**kwargs), seeds=(EVAL_SEED_BASE, EVAL_SEED_BASE + 1))
    assert report.checks[-1] == "usable_after_fuzz"


def test_the_key_describes_the_instance_not_the_state():
    env = MazeEnv(**MAIN_MAZE)
    env.reset(seed=EVAL_SEED_BASE)
    key = env.instance_key()
    for command in env.oracle():
        env.step(command)
    assert env.is_won() and env.instance_key() == key
    sokoban = SokobanEnv(width=6, height=6, n_boxes=1, reverse_steps=20)
    observation, _ = sokoban.reset(seed=3)
    key = sokoban.instance_key()
    assert observation == f"{key}\nBoxes on targets: 0/1."
    sokoban.step(sokoban.admissible_actions()[0])
    assert sokoban.instance_key() == key != sokoban.anchor()


# ---- canonical keys ----------------------------------------------------------------------------------


def _maze_world():
    return generate_world(random.Random(5), n_rooms=6, n_locked_doors=2, extra_edges=1, dead_ends=1, n_distractors=1)


def _maze_key(world) -> str:
    env = MazeEnv(n_rooms=6, n_locked_doors=2, extra_edges=1, dead_ends=1, n_distractors=1)
    env.world = world
    return env.instance_key()


def test_maze_key_ignores_names_and_numbering():
    world = _maze_world()
    key = _maze_key(world)
    renamed = replace(
        world,
        room_names=tuple(f"room {i}" for i in range(6)),
        item_names=tuple(f"thing {i}" for i in range(len(world.item_names))),
    )
    assert _maze_key(renamed) == key
    # The same maze with its rooms numbered in reverse: the key names rooms by grid cell.
    order = {room: 5 - room for room in range(6)}
    graph = nx.relabel_nodes(world.graph, order)
    items = tuple(order[room] for room in world.initial_items)
    assert _maze_key(replace(world, graph=graph, initial_items=items, start_room=order[world.start_room])) == key


def test_maze_key_sees_every_part_of_the_layout():
    world = _maze_world()
    key = _maze_key(world)
    goal_room = world.initial_items[world.goal_item]
    other_room = next(room for room in range(6) if room != goal_room)
    items = list(world.initial_items)
    items[world.goal_item] = other_room
    changes = {"goal": replace(world, initial_items=tuple(items))}
    items = list(world.initial_items)
    items[0] = next(room for room in range(6) if room != items[0])
    changes["key of door 0"] = replace(world, initial_items=tuple(items))
    items = list(world.initial_items)
    items[2] = next(room for room in range(6) if room != items[2])
    changes["distractor"] = replace(world, initial_items=tuple(items))
    graph = world.graph.copy()
    open_edge = next((a, b) for a, b, door in graph.edges(data="door") if door < 0)
    graph.edges[open_edge]["door"] = 1
    changes["a passage locked"] = replace(world, graph=graph)
    graph = world.graph.copy()
    graph.remove_edge(*open_edge)
    changes["a passage removed"] = replace(world, graph=graph)
    graph = world.graph.copy()
    (a, b), pos = open_edge, nx.get_node_attributes(graph, "pos")
    nx.set_node_attributes(graph, {a: {"pos": pos[b]}, b: {"pos": pos[a]}})
    changes["two rooms swapped"] = replace(world, graph=graph)
    for what, changed in changes.items():
        assert _maze_key(changed) != key, what


def test_sokoban_keys_are_equal_exactly_for_equal_levels():
    env = SokobanEnv(width=6, height=6, n_boxes=1, reverse_steps=20)
    levels: dict[tuple, str] = {}
    for seed in range(120):
        env.reset(seed=seed)
        level = env.level
        start = (level.walls, level.targets, level.player, level.boxes)
        assert levels.setdefault(start, env.instance_key()) == env.instance_key()
    assert len(set(levels.values())) == len(levels)


def test_minicode_keys_are_equal_exactly_for_equal_tasks():
    env = MiniCodeEnv(level=2, n_tests=1)  # "sign" has 19 possible tests: instances repeat
    tasks: dict[tuple, str] = {}
    repeats = 0
    for seed in range(400):
        env.reset(seed=seed)
        task = (env.task, tuple(env._tests))
        repeats += task in tasks
        assert tasks.setdefault(task, env.instance_key()) == env.instance_key()
    assert repeats > 0 and len(set(tasks.values())) == len(tasks)


# ---- user environments -------------------------------------------------------------------------------


class GuessEnv(TextEnv):
    """A user environment without ``instance_key``: guess a seeded number in 1..20."""

    def _new_game(self, options):
        self.target, self.guessed = int(self.np_random.integers(1, 21)), False
        self.task = f"Say {self.target}."
        return "Say the number."

    def _apply(self, command: str) -> Transition:
        self.guessed = command == str(self.target)
        return Transition("Right." if self.guessed else "Wrong.")

    def admissible_actions(self) -> list[str]:
        return [str(n) for n in range(1, 21)]

    def anchor(self) -> str:
        return str(self.guessed)

    def is_won(self) -> bool:
        return self.guessed


class HeldOutGuessEnv(GuessEnv):
    def instance_key(self) -> str:
        return f"target={self.target}"


def test_user_environments_opt_in_with_instance_key():
    plain, held_out = GuessEnv(), HeldOutGuessEnv()
    assert plain.instance_key() is None
    eval_seeds = range(EVAL_SEED_BASE, EVAL_SEED_BASE + 100)
    plain_targets = {plain.reset(seed=s)[1]["task"] for s in range(100)}
    assert plain_targets & {plain.reset(seed=s)[1]["task"] for s in eval_seeds}  # no split by default
    train = {held_out.reset(seed=s)[1]["task"] for s in range(100)}
    held = {held_out.reset(seed=s)[1]["task"] for s in eval_seeds}
    assert train and held and not train & held
    assert held_out.reset(seed=1) == held_out.reset(seed=1)


class OneInstance(GuessEnv):
    def instance_key(self) -> str:
        return "the only one"


def test_an_unreachable_split_raises_instead_of_looping(monkeypatch):
    draws = []
    env = OneInstance()
    original = env._new_game
    monkeypatch.setattr(env, "_new_game", lambda options: draws.append(1) or original(options))
    reachable = instance_split("the only one")
    env.reset(seed=0 if reachable == "train" else EVAL_SEED_BASE)
    assert len(draws) == 1
    with pytest.raises(
        RuntimeError, match=r"OneInstance: none of 1000 generated instances falls in the (train|eval) split"
    ):
        env.reset(seed=EVAL_SEED_BASE if reachable == "train" else 0)
    assert len(draws) == 1 + agent_rl.envs.base.MAX_SPLIT_DRAWS
