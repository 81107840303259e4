"""SokobanEnv: hand-checked moves and solver, generated levels, determinism, invariants."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import agent_rl.envs.sokoban as sokoban
from agent_rl.envs import check_text_env, oracle_actions
from agent_rl.envs.sokoban import UNREACHABLE, SokobanEnv, SokobanLevel, generate_level, push_distances, solve

SETTINGS = [
    dict(width=6, height=6, n_boxes=1, reverse_steps=30),
    dict(),
    dict(width=8, height=8, n_boxes=3, reverse_steps=150),
]


def parse_level(rows: list[str]) -> SokobanLevel:
    """A hand-drawn level (``#`` wall, ``.`` target, ``$`` box, ``*`` box on target, ``@`` player)."""
    width = len(rows[0])
    cells = "".join(rows)
    walls = tuple(ch == "#" for ch in cells)
    targets = frozenset(i for i, ch in enumerate(cells) if ch in ".*+")
    boxes = frozenset(i for i, ch in enumerate(cells) if ch in "$*")
    player = next(i for i, ch in enumerate(cells) if ch in "@+")
    distance = push_distances(width, walls, targets)
    plan = solve(width, walls, distance, player, boxes) or []
    return SokobanLevel(width, len(rows), walls, targets, player, boxes, tuple(plan), distance)


CORRIDOR = ["#######", "#######", "#@ $ .#", "#######", "#######"]
ROOM = [
    "#######",
    "#     #",
    "# $$ .#",
    "#@   .#",
    "#######",
]


@pytest.fixture
def hand_env(monkeypatch):
    """``hand_env(rows, **kwargs)``: a SokobanEnv whose reset loads that hand-drawn level."""

    def make(rows: list[str], **kwargs) -> SokobanEnv:
        level = parse_level(rows)
        monkeypatch.setattr(sokoban, "generate_level", lambda *args: level)
        monkeypatch.setattr(SokobanEnv, "split_by_instance_key", False)  # one level serves every seed
        env = SokobanEnv(width=len(rows[0]), height=len(rows), n_boxes=len(level.boxes), **kwargs)
        env.reset(seed=0)
        return env

    return make


def test_solver_and_push_distances_on_a_corridor():
    level = parse_level(CORRIDOR)
    assert level.plan == ("right", "right", "right")
    assert level.push_distance[2 * 7 + 3] == 2 and level.push_distance[2 * 7 + 5] == 0
    assert level.push_distance[2 * 7 + 1] == UNREACHABLE  # against the west wall: a box there is dead


def test_astar_plans_are_as_short_as_exhaustive_search():
    assert 0 < len(parse_level(ROOM).plan) == _bfs_length(parse_level(ROOM))
    for seed in range(5):
        level = generate_level(seed, 6, 6, 2, 40)
        assert len(level.plan) == _bfs_length(level)


def _bfs_length(level: SokobanLevel) -> int:
    """Plain breadth-first search over (player, boxes): the true shortest solution length."""
    width, walls = level.width, level.walls
    frontier, seen, depth = [(level.player, level.boxes)], {(level.player, level.boxes)}, 0
    while not any(boxes <= level.targets for _, boxes in frontier):
        assert frontier, "the level has no solution"
        depth += 1
        nxt = []
        for player, boxes in frontier:
            for offset in (-width, width, -1, 1):
                to = player + offset
                new_boxes = boxes
                if walls[to]:
                    continue
                if to in boxes:
                    if walls[to + offset] or to + offset in boxes:
                        continue
                    new_boxes = boxes - {to} | {to + offset}
                if (to, new_boxes) not in seen:
                    seen.add((to, new_boxes))
                    nxt.append((to, new_boxes))
        frontier = nxt
    return depth


def test_moves_pushes_and_invalid_moves(hand_env):
    env = hand_env(ROOM)
    assert env.anchor() == "\n".join(["#######", "#     #", "# $$ .#", "#@   .#", "#######"])
    assert env.admissible_actions() == ["up", "right"]
    observation, reward, terminated, truncated, info = env.step("left")
    assert not info["action_valid"] and info["error"] == "You can't move left: a wall is in the way."
    assert info["error"] in observation and (reward, terminated, truncated) == (0.0, False, False)
    env.step("up")
    _, _, _, _, info = env.step("right")
    assert not info["action_valid"] and info["error"] == "You can't push the box right: it is blocked by another box."
    env.step("down")
    env.step("right")
    _, _, _, _, info = env.step("up")
    assert info["action_valid"] and info["anchor"] == "\n".join(["#######", "# $   #", "# @$ .#", "#    .#", "#######"])


def test_push_onto_target_wins_with_reward(hand_env):
    env = hand_env(CORRIDOR, step_penalty=0.1)
    assert env.step("RIGHT")[1] == pytest.approx(-0.1)
    _, reward, terminated, _, info = env.step("push right")
    assert info["anchor"].splitlines()[2] == "#  @$.#" and not terminated
    _, reward, terminated, truncated, info = env.step("r")
    assert info["anchor"].splitlines()[2] == "#   @*#"
    assert terminated and not truncated and info["won"] and reward == pytest.approx(0.9)


def test_oracle_mid_episode_and_in_a_dead_state(hand_env):
    rows = ["#######", "#     #", "#  $ .#", "#  @  #", "#######"]
    env = hand_env(rows)
    env.step("left")
    for command in env.oracle():  # solved from a state that is not the generated start
        env.step(command)
    assert env.is_won()
    env = hand_env(rows)
    env.step("up")  # the box is now against the north wall, a row away from the target: dead
    assert env.oracle() == []  # no plan left, which the warm start and DAgger read as the end of the plan


def test_there_and_back_recurs_the_anchor(hand_env):
    env = hand_env(ROOM)
    start = env.anchor()
    assert env.step("right")[4]["anchor"] != start
    assert env.step("left")[4]["anchor"] == start


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_checker_passes(kwargs):
    report = check_text_env(SokobanEnv(**kwargs))
    assert report.fuzz_actions > 40


@pytest.mark.parametrize("kwargs", SETTINGS)
def test_oracle_wins_on_20_seeds(kwargs):
    env = SokobanEnv(**kwargs)
    for seed in range(20):
        observation, info = env.reset(seed=seed)
        assert not info["won"] and observation.count("@") + observation.count("+") == 1
        plan = oracle_actions(env)
        assert 0 < len(plan) <= env.max_steps
        for command in plan:
            _, reward, terminated, truncated, info = env.step(command)
            assert info["action_valid"], command
        assert terminated and not truncated and info["won"] and reward == 1.0


def test_generation_is_deterministic_and_seed_dependent():
    a, b = SokobanEnv(), SokobanEnv()
    for seed in (0, 5, 99):
        assert a.reset(seed=seed) == b.reset(seed=seed)
    level = generate_level(1234, 7, 7, 2, 100)
    generate_level.cache_clear()
    assert generate_level(1234, 7, 7, 2, 100) == level
    assert len({SokobanEnv().reset(seed=seed)[0] for seed in range(10)}) > 5


@pytest.mark.parametrize(
    "action", ["", " ", "\x00", "\x1b[2J", "quit", "undo", "#", "upp", "north-east", "🙂", "x" * 100_000, None, 7]
)
def test_hostile_input_is_invalid(action):
    env = SokobanEnv()
    _, info = env.reset(seed=3)
    observation, reward, terminated, truncated, step_info = env.step(action)
    assert step_info["action_valid"] is False and step_info["anchor"] == info["anchor"]
    assert (reward, terminated, truncated) == (0.0, False, False) and observation in env.observation_space


def test_truncation_and_bad_knobs():
    env = SokobanEnv(max_steps=2)
    env.reset(seed=0)
    assert env.step("dance")[2:4] == (False, False)
    assert env.step("dance")[2:4] == (False, True)
    with pytest.raises(ValueError, match="n_boxes"):
        SokobanEnv(width=5, height=5, n_boxes=3)
    with pytest.raises(ValueError, match="width"):
        SokobanEnv(width=4)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31), moves=st.lists(st.sampled_from(["up", "down", "left", "right", "x"]), max_size=40))
def test_random_play_keeps_invariants(seed, moves):
    """Boxes are conserved and never overlap walls or the player; admissible == the moves that
    change the grid; the grid text always matches the state."""
    env = SokobanEnv(n_boxes=2)
    _, info = env.reset(seed=seed)
    level = env.level
    for move in moves:
        for candidate in ("up", "down", "left", "right"):
            changed = copy.deepcopy(env).step(candidate)[4]["anchor"] != info["anchor"]
            assert changed == (candidate in info["admissible_actions"])
        _, _, terminated, _, info = env.step(move)
        grid = info["anchor"].replace("\n", "")
        assert len(env._boxes) == 2 and not any(level.walls[b] for b in env._boxes)
        assert env._player not in env._boxes and not level.walls[env._player]
        assert grid.count("$") + grid.count("*") == 2 and grid.count("@") + grid.count("+") == 1
        assert grid.count("*") == len(env._boxes & level.targets)
        assert [i for i, ch in enumerate(grid) if ch == "#"] == [i for i, wall in enumerate(level.walls) if wall]
        if terminated:
            break
