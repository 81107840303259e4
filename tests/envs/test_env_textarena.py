"""TextArenaEnv on TextArena's offline single-player games: the checker per game, seeds, the bracketed
action format, TextArena's invalid-move rule, oracles, anchors, held-out instances and the games left
out (unknown ids, games that need network data)."""

from __future__ import annotations

import random
import sys

import gymnasium as gym
import pytest

from agent_rl.envs import (
    EVAL_SEED_BASE,
    EnvUnavailableError,
    check_text_env,
    instance_split,
    oracle_actions,
    unavailable_envs,
)
from agent_rl.envs.checker import HOSTILE_ACTIONS

pytest.importorskip("textarena")

from agent_rl.envs.textarena_env import GAMES, NETWORK_DATA, TextArenaEnv  # noqa: E402

WITH_ORACLE = [
    "Sokoban-v0",
    "FrozenLake-v0",
    "FrozenLake-v0-random",
    "TowerOfHanoi-v0-medium",
    "GuessTheNumber-v0",
    "GuessTheNumber-v0-hardcore",
]


@pytest.mark.parametrize("game", [pytest.param(g, marks=pytest.mark.slow) if g == "Sokoban-v0" else g for g in GAMES])
def test_checker_passes(game):
    report = check_text_env(f"textarena/{game}")  # Sokoban is slow: TextArena generates each level (up to 1.6 s)
    assert report.checks[-1] == "usable_after_fuzz" and report.env_id == f"textarena/{game}"


@pytest.mark.parametrize("game", WITH_ORACLE)
def test_oracle_wins(game):
    env = gym.make(f"textarena/{game}")
    for seed in range(3):
        _, info = env.reset(seed=seed)
        plan = oracle_actions(env)
        for action in plan:
            assert action in info["admissible_actions"]
            _, reward, terminated, truncated, info = env.step(action)
            assert info["action_valid"], (seed, action, info["error"])
        assert terminated and not truncated and info["won"] and reward == 1.0  # TextArena's own reward for a win


def test_sokoban_oracle_is_empty_in_a_dead_state(monkeypatch):
    from agent_rl.envs import sokoban

    env = TextArenaEnv(game="Sokoban-v0")
    env.reset(seed=0)
    monkeypatch.setattr(sokoban, "solve", lambda *args: None)  # the solver finds no plan from this board
    assert env.oracle() == []


def test_hanoi_oracle_is_optimal_and_replans_after_a_detour():
    env = TextArenaEnv(game="TowerOfHanoi-v0-medium")  # 4 disks: 2**4 - 1 = 15 moves
    env.reset(seed=0)
    assert len(env.oracle()) == 15 and env.oracle()[0] == "[a b]"  # even disk count: the smallest disk goes to B first
    env.step("[a b]")
    assert len(env.oracle()) == 14
    env.step("[b c]")  # a detour: one move changes the distance to the goal by exactly one
    assert len(env.oracle()) in (13, 15)
    for action in env.oracle():
        _, _, terminated, _, info = env.step(action)
    assert terminated and info["won"]


def test_minesweeper_has_no_oracle():
    env = TextArenaEnv(game="Minesweeper-v0-small")
    env.reset(seed=0)
    with pytest.raises(NotImplementedError, match="no oracle"):
        env.oracle()


def test_same_seed_same_game_across_instances_and_despite_global_random():
    a, b = TextArenaEnv(game="Minesweeper-v0"), gym.make("textarena/Minesweeper-v0")
    for seed in (0, 5, EVAL_SEED_BASE + 1):
        first, second = a.reset(seed=seed), b.reset(seed=seed)
        assert first == second
        info, chooser = first[1], random.Random(seed)
        for _ in range(6):
            action = chooser.choice(info["admissible_actions"])
            random.seed(12345 + seed)  # someone else reseeds the global generator between steps
            first, second = a.step(action), b.step(action)
            assert first == second
            info = first[4]
            if first[2]:
                break


def test_the_caller_random_stream_is_untouched():
    env = TextArenaEnv(game="FrozenLake-v0")
    random.seed(7)
    expected = [random.random() for _ in range(3)]
    random.seed(7)
    got = [random.random()]
    env.reset(seed=3)  # TextArena seeds the global generator inside
    got.append(random.random())
    env.step("[down]")
    got.append(random.random())
    assert got == expected


def test_different_seeds_give_different_games():
    env = TextArenaEnv(game="FrozenLake-v0")
    boards = {env.reset(seed=seed)[0] for seed in range(10)}
    assert len(boards) >= 5


@pytest.mark.parametrize("spelling", ["down", "[down]", "[s]", "[S]", "  [ down ]  ", "I will go [down] now", "s"])
def test_bare_and_bracketed_moves_are_the_same_move(spelling):
    reference, env = TextArenaEnv(game="FrozenLake-v0"), TextArenaEnv(game="FrozenLake-v0")
    reference.reset(seed=0)
    env.reset(seed=0)
    assert env.step(spelling) == reference.step("[down]")


def test_admissible_actions_are_the_legal_moves():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    _, info = env.reset(seed=0)
    assert info["admissible_actions"] == ["[a b]", "[a c]"]  # only the top disk of A can move
    _, _, _, _, info = env.step("[a c]")
    assert info["admissible_actions"] == ["[a b]", "[c a]", "[c b]"]  # disk 2 cannot go onto disk 1
    guess = TextArenaEnv(game="GuessTheNumber-v0")
    _, info = guess.reset(seed=0)
    assert info["admissible_actions"] == [f"[{n}]" for n in range(1, 21)]
    _, _, _, _, info = guess.step("7")
    assert "[7]" not in info["admissible_actions"] and len(info["admissible_actions"]) == 19


def test_textarena_invalid_moves_and_error_allowance():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    _, info = env.reset(seed=0)
    anchor = info["anchor"]
    _, reward, terminated, _, info = env.step("[b c]")  # B is empty
    assert not info["action_valid"] and not terminated and reward == 0.0
    assert info["error"] == "You tried to move a disk from an empty tower."
    assert info["anchor"] != anchor  # one tolerated error is part of the state: the next one loses
    for action in ("[a c]", "[a b]", "[c b]", "[a c]"):  # a valid move clears the count; C now holds disk 3
        _, _, terminated, _, info = env.step(action)
        assert info["action_valid"] and not terminated
    _, _, terminated, _, info = env.step("[a b]")  # A is empty
    assert not info["action_valid"] and not terminated
    _, reward, terminated, _, info = env.step("[c b]")  # disk 3 onto disk 2: the second invalid move in a row loses
    assert not info["action_valid"] and terminated and not info["won"]
    assert "larger disk on a smaller disk" in info["error"]
    assert reward == pytest.approx(1 / 3)  # TextArena's partial score: 1 of the 3 disks in place on C


def test_error_allowance_can_be_raised():
    env = TextArenaEnv(game="GuessTheNumber-v0", error_allowance=3)
    env.reset(seed=0)
    for _ in range(3):
        *_, terminated, _, info = env.step("[99]")
        assert not terminated and not info["action_valid"] and "outside the range" in info["error"]
    *_, terminated, _, info = env.step("[99]")
    assert terminated and not info["won"]


def test_garbage_never_reaches_textarena(monkeypatch):
    env = TextArenaEnv(game="Minesweeper-v0-small", error_allowance=10**6)
    env.reset(seed=0)
    received = []
    original = env._game.step
    monkeypatch.setattr(env._game, "step", lambda action: (received.append(action), original(action))[1])
    for action in HOSTILE_ACTIONS:
        _, _, terminated, _, info = env.step(action)
        assert not info["action_valid"] and not terminated
        assert info["error"].startswith("'") or info["error"].startswith("You did not respond")
    assert set(received) == {""}  # TextArena only ever saw the empty move, answered by its own rule
    env.step("[2 2]")
    assert received[-1] == "[2 2]"


def test_falling_into_a_hole_ends_with_textarena_partial_reward():
    env = TextArenaEnv(game="FrozenLake-v0")
    seed = next(s for s in range(100) if "H" in (env.reset(seed=s) and env._game.state.game_state["grid"][0]))
    env.reset(seed=seed)
    hole = env._game.state.game_state["grid"][0].index("H")
    for col in range(1, hole + 1):
        _, reward, terminated, _, info = env.step("[right]")
        assert info["action_valid"] and terminated == (col == hole)
    # TextArena's completion: BFS distance travelled over the start-goal distance (6 on 4x4), at least 0.1
    assert not info["won"] and reward == pytest.approx(max(hole / 6, 0.1))


def test_anchor_is_the_game_state():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    _, info = env.reset(seed=0)
    start = info["anchor"]
    _, _, _, _, info = env.step("[a b]")
    assert info["anchor"] != start
    _, _, _, _, info = env.step("[b a]")
    assert info["anchor"] == start
    assert TextArenaEnv(game="TowerOfHanoi-v0").reset(seed=99)[1]["anchor"] == start  # one instance


@pytest.mark.parametrize("game", ["GuessTheNumber-v0", "FrozenLake-v0", "Minesweeper-v0-small", "Sokoban-v0"])
def test_evaluation_seeds_never_reach_training_instances(game):
    env = TextArenaEnv(game=game)
    n = 6 if game == "Sokoban-v0" else 60
    train, held_out = set(), set()
    for i in range(n):
        env.reset(seed=i)
        train.add(env.instance_key())
        env.reset(seed=EVAL_SEED_BASE + i)
        held_out.add(env.instance_key())
    assert not train & held_out and len(held_out) > 1
    assert {instance_split(k) for k in train} == {"train"} and {instance_split(k) for k in held_out} == {"eval"}


def test_guess_the_number_instances_split_the_20_numbers():
    env = TextArenaEnv(game="GuessTheNumber-v0")
    numbers = {}
    for seed in [*range(200), *range(EVAL_SEED_BASE, EVAL_SEED_BASE + 200)]:
        env.reset(seed=seed)
        numbers.setdefault(env.split, set()).add(env._game.game_number)
    assert numbers["train"].isdisjoint(numbers["eval"]) and numbers["train"] | numbers["eval"] == set(range(1, 21))


def test_hanoi_opts_out_of_the_split():
    env = TextArenaEnv(game="TowerOfHanoi-v0")
    env.reset(seed=EVAL_SEED_BASE)
    assert env.instance_key() is None


def test_unknown_game_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown or unadapted TextArena game 'Chess-v0'") as err:
        TextArenaEnv(game="Chess-v0")
    for game in GAMES:
        assert game in str(err.value)


def test_network_data_game_fails_at_make_time_without_importing_it():
    assert "textarena/Wordle-v0" not in envs_specs()
    with pytest.raises(EnvUnavailableError, match=r"NLTK data \(words, averaged_perceptron_tagger_eng\)"):
        gym.make("textarena/Wordle-v0")
    assert "textarena.envs.Wordle.env" not in sys.modules  # its import would try the network
    assert set(NETWORK_DATA) <= {env_id.removeprefix("textarena/") for env_id in unavailable_envs()}


def envs_specs() -> dict:
    from agent_rl.envs import text_env_specs

    return text_env_specs()


def test_sokoban_box_on_goal_stays_in_the_charset():
    env = TextArenaEnv(game="Sokoban-v0")
    env.reset(seed=0)
    for action in oracle_actions(env):
        observation, *_ = env.step(action)
    assert "*" in observation and "?" not in observation and "√" not in observation


def test_one_training_iteration_through_the_cli(tmp_path):
    from tiny_train import TINY_TRAIN  # tests/

    from agent_rl.cli import main
    from agent_rl.config import load_config
    from agent_rl.training.infra.logger import read_metrics

    run_dir = tmp_path / "hanoi"
    assert main(["train", "env.id=textarena/TowerOfHanoi-v0", f"trainer.run_dir={run_dir}", *TINY_TRAIN]) == 0
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1] and records[0]["sft/pairs"] > 0
    assert load_config(run_dir / "config.yaml").sft.mode == "oracle"  # auto: the Hanoi adapter plans
