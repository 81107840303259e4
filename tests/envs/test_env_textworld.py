"""TextWorldEnv on small real TextWorld games: checker, oracle wins, determinism, anchors, hostile
input, the game cache (keys, retries, concurrent generation), observation cleaning and the held-out
evaluation pool (disjoint from the training pool by game identity)."""

from __future__ import annotations

import multiprocessing
import random
import shutil
from dataclasses import replace

import gymnasium as gym
import pytest
import textworld
from textworld.generator import QuestGenerationError
from textworld.generator.game import GameOptions

import agent_rl.envs.textworld_env as tw_env
from agent_rl.envs import EVAL_SEED_BASE, check_text_env, oracle_actions
from agent_rl.envs.textworld_env import (
    GENERATION_TRIES,
    HELDOUT_TRIES,
    GameSpec,
    TextWorldEnv,
    clean_feedback,
    ensure_game,
    game_identity,
)

# Small games (1-3 rooms): each takes about 1-2 s to generate, once per test session.
COIN = dict(kind="coin_collector", level=2, n_games=2)
TREASURE = dict(kind="treasure_hunter", level=2, n_games=2)
CUSTOM = dict(kind="custom", world_size=2, nb_objects=2, quest_length=3, n_games=2)
OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


@pytest.fixture(scope="module", autouse=True)
def game_cache(tmp_path_factory):
    """One fresh game cache shared by the whole module."""
    with pytest.MonkeyPatch.context() as patch:
        root = tmp_path_factory.mktemp("agent-rl-cache")
        patch.setenv("AGENT_RL_CACHE", str(root))
        yield root / "textworld"


@pytest.fixture(scope="module")
def coin_env():
    env = TextWorldEnv(**COIN)
    yield env
    env.close()


@pytest.mark.slow
def test_checker_passes(coin_env):
    assert check_text_env(coin_env).checks[-1] == "usable_after_fuzz"


def test_checker_passes_on_a_custom_quest():
    env = TextWorldEnv(**CUSTOM)
    assert check_text_env(env, seeds=(0, 1)).checks[-1] == "usable_after_fuzz"
    env.close()


@pytest.mark.parametrize("kwargs", [COIN, TREASURE, CUSTOM], ids=["coin_collector", "treasure_hunter", "custom"])
def test_oracle_wins_on_20_seeds(kwargs):
    env = TextWorldEnv(**{**kwargs, "n_games": 4})  # 20 seeded resets over a pool of 4 generated games
    for seed in range(20):
        _, info = env.reset(seed=seed)
        assert info["task"] and info["admissible_actions"]
        plan = oracle_actions(env)
        assert 1 <= len(plan) <= env.max_steps
        for command in plan:
            assert command in info["admissible_actions"]
            observation, reward, terminated, truncated, info = env.step(command)
            assert info["action_valid"], command
        assert terminated and not truncated and info["won"] and reward == 1.0
        assert "*** The End ***" in observation
    env.close()


def test_taking_the_wrong_object_loses_treasure_hunter():
    env = TextWorldEnv(**TREASURE)
    for seed in range(3):
        _, info = env.reset(seed=seed)
        chooser = random.Random(seed)
        for _ in range(40):
            goal = env.oracle()[-1]
            wrong = [a for a in info["admissible_actions"] if a.startswith("take ") and a != goal]
            moves = [a for a in info["admissible_actions"] if a.startswith(("go ", "open "))]
            _, reward, terminated, truncated, info = env.step(wrong[0] if wrong else chooser.choice(moves))
            if terminated or truncated:
                break
        assert terminated and not info["won"] and reward == 0.0, seed
    env.close()


def test_determinism_across_instances(coin_env):
    other = gym.make("agent_rl/TextWorld-v0", **COIN)  # a second instance, through the registry
    for seed in [*range(4), EVAL_SEED_BASE, EVAL_SEED_BASE + 1]:
        first, second = coin_env.reset(seed=seed), other.reset(seed=seed)
        assert first == second
        info, chooser = first[1], random.Random(seed)
        for _ in range(8):
            command = chooser.choice(info["admissible_actions"])
            first, second = coin_env.step(command), other.step(command)
            assert first == second
            _, _, terminated, truncated, info = first
            if terminated or truncated:
                break
    other.close()


def test_seed_picks_a_game_from_the_pool(coin_env, game_cache):
    tasks = {coin_env.reset(seed=seed)[1]["task"] for seed in range(12)}
    assert 2 <= len(tasks) <= COIN["n_games"]
    assert len([p for p in game_cache.iterdir() if p.is_dir()]) >= len(tasks)


def test_anchor_returns_after_going_back(coin_env):
    _, info = coin_env.reset(seed=0)
    start = info["anchor"]
    move = next(a for a in info["admissible_actions"] if a.startswith("go "))
    _, _, _, _, info = coin_env.step(move)
    moved = info["anchor"]
    assert moved != start
    for command in ("look", "inventory"):  # no change to the world
        assert coin_env.step(command)[4]["anchor"] == moved
    back = "go " + OPPOSITE[move.split()[1]]
    assert back in info["admissible_actions"]
    _, _, _, _, info = coin_env.step(back)
    assert info["action_valid"] and info["anchor"] == start


HOSTILE = [
    "",
    "   ",
    "quit",
    "restart",
    "save",
    "restore",
    "undo",
    "script",
    "verbose",
    "again",
    "q",
    "tw-extra-infos moves",
    "tw-trace-actions",
    ">look",
    "*save",
    "#quit",
    "/quit",
    "take the moon",
    "go nowhere",
    "x" * 100_000,
    "\x00\x1b[2J",
    "🙂",
    "look\nquit",
]


def test_hostile_input_is_rejected_without_reaching_the_interpreter(coin_env):
    _, info = coin_env.reset(seed=1)
    anchor = info["anchor"]
    sent = []
    interpreter = coin_env._game
    original_step = interpreter.step
    interpreter.step = lambda command: sent.append(command) or original_step(command)
    try:
        for action in HOSTILE:
            observation, reward, terminated, truncated, info = coin_env.step(action)
            if action == "look\nquit":  # the first line is a valid command, the rest is dropped
                assert info["action_valid"] and sent == ["look"]
                continue
            assert not info["action_valid"] and info["error"], action
            assert observation in coin_env.observation_space and "Admissible commands:" in observation
            assert info["anchor"] == anchor and not (terminated or truncated)
        assert (
            coin_env.step("quit")[4]["error"] == "'quit' is an interpreter command; it is disabled in this environment."
        )
    finally:
        interpreter.step = original_step
    assert sent == ["look"]
    for command in oracle_actions(coin_env):  # the game is still intact
        _, reward, terminated, *_ = coin_env.step(command)
    assert terminated and reward == 1.0


def test_observations_drop_banner_and_prompt(coin_env):
    observation, info = coin_env.reset(seed=2)
    assert "$$" not in observation and "\\$" not in observation
    assert observation.startswith(info["task"][:30])
    assert not any(line.startswith(">") for line in observation.splitlines())


def test_clean_feedback():
    raw = (
        "\n\n   ________\n  |  \\$$$  |\n   \\$$/ \n\nWelcome! Do things.\n\n-= Attic =-\nAn attic.\n\n\n\n\n"
        "There is an exit.\n\n>                     -= Attic =-0/3"
    )
    assert clean_feedback(raw) == "Welcome! Do things.\n\n-= Attic =-\nAn attic.\n\nThere is an exit."
    end = (
        "You win.\n\n        *** The End ***\n"
        "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>  -= A =-1/2"
    )
    assert clean_feedback(end) == "You win.\n\n*** The End ***"


def test_cache_key_covers_every_parameter(monkeypatch):
    base = GameSpec(kind="custom", level=0, world_size=2, nb_objects=2, quest_length=3, game_seed=0, index=0)
    variants = [
        dict(kind="coin_collector"),
        dict(level=1),
        dict(world_size=3),
        dict(nb_objects=1),
        dict(quest_length=2),
        dict(game_seed=1),
        dict(index=1),
        dict(split="eval"),
        dict(redraw=1),
    ]
    keys = {base.key()} | {GameSpec(**{**base.__dict__, **change}).key() for change in variants}
    assert len(keys) == len(variants) + 1
    assert GameSpec(**base.__dict__).key() == base.key()
    monkeypatch.setattr(textworld, "__version__", "0.0.0")
    assert base.key() not in keys


def test_changed_parameter_generates_a_new_game(game_cache):
    a = TextWorldEnv(**{**CUSTOM, "n_games": 1})
    b = TextWorldEnv(**{**CUSTOM, "n_games": 1, "game_seed": 5})
    assert a.specs[0].key() != b.specs[0].key()
    path_a, path_b = ensure_game(a.specs[0]), ensure_game(b.specs[0])
    assert path_a != path_b and path_a.is_file() and path_b.is_file()
    assert path_a.parent.name == a.specs[0].key() and path_a.parent.parent == game_cache
    assert ensure_game(a.specs[0]) == path_a  # cached: the same file again


def test_generation_retries_other_seeds_then_fails_clearly(monkeypatch):
    spec = GameSpec(kind="custom", level=0, world_size=1, nb_objects=1, quest_length=2, game_seed=3, index=0)
    real = tw_env.make_textworld_game
    seeds = []

    def flaky(spec_, options):
        seeds.append(options.seeds)
        if len(seeds) < 3:
            raise QuestGenerationError("no quest")
        return real(spec_, options)

    monkeypatch.setattr(tw_env, "make_textworld_game", flaky)
    assert ensure_game(spec).is_file()
    expected = []
    for attempt in range(3):
        options = GameOptions()
        options.seeds = spec.internal_seed(attempt)
        expected.append(options.seeds)
    assert seeds == expected and len({spec.internal_seed(k) for k in range(3)}) == 3

    def never(spec_, options):
        raise QuestGenerationError("no quest")

    monkeypatch.setattr(tw_env, "make_textworld_game", never)
    broken = GameSpec(**{**spec.__dict__, "index": 1})
    with pytest.raises(RuntimeError, match=f"after {GENERATION_TRIES} internal seeds"):
        ensure_game(broken)
    assert not (tw_env.cache_dir() / broken.key()).exists()
    assert not [p for p in tw_env.cache_dir().iterdir() if p.name.startswith(".")]  # no staging left


def _generate_in_subprocess(args):
    cache, spec_fields = args
    import os

    os.environ["AGENT_RL_CACHE"] = cache
    from agent_rl.envs.textworld_env import GameSpec, ensure_game

    return str(ensure_game(GameSpec(**spec_fields)))


@pytest.mark.filterwarnings("ignore::jericho.UnsupportedGameWarning")
@pytest.mark.slow
def test_concurrent_generation_of_one_game(tmp_path):
    spec = GameSpec(kind="coin_collector", level=1, world_size=0, nb_objects=0, quest_length=0, game_seed=9, index=0)
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        paths = pool.map(_generate_in_subprocess, [(str(tmp_path), spec.__dict__)] * 2)
    assert paths[0] == paths[1]
    entries = sorted(p.name for p in (tmp_path / "textworld").iterdir())
    assert entries == [spec.key(), f"{spec.key()}.lock"]  # one game, no staging folders left
    game = textworld.start(paths[0], textworld.EnvInfos(policy_commands=True))
    assert game.reset()["policy_commands"] == ["take coin"]
    game.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(kind="zork"), "kind must be one of"),
        (dict(kind="coin_collector", level=0), "level of coin_collector must be in \\[1, 300\\]"),
        (dict(kind="coin_collector", level=250), "more than the 100 rooms"),
        (dict(kind="treasure_hunter", level=31), "level of treasure_hunter must be in \\[1, 30\\]"),
        (dict(kind="treasure_hunter", world_size=3), "apply to kind='custom' only"),
        (dict(kind="custom", level=2), "level applies to coin_collector/treasure_hunter"),
        (dict(kind="custom", quest_length=25), "quest_length must be in \\[1, 20\\]"),
        (dict(kind="custom", n_games=0), "n_games must be >= 1"),
        (dict(kind="custom", world_size=0), "world_size must be in \\[1, 100\\]"),
    ],
)
def test_bad_knobs_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TextWorldEnv(**kwargs)


# ---- the held-out evaluation pool ---------------------------------------------------------------------


def test_evaluation_seeds_play_a_pool_disjoint_from_training(coin_env):
    training = {game_identity(spec) for spec in coin_env.specs}
    held_out_specs = [coin_env.eval_spec(i) for i in range(COIN["n_games"])]
    held_out = {game_identity(spec) for spec in held_out_specs}
    assert all(spec.split == "eval" for spec in held_out_specs) and not training & held_out
    train_keys = {_instance_after_reset(coin_env, seed) for seed in range(8)}
    eval_keys = {_instance_after_reset(coin_env, seed) for seed in range(EVAL_SEED_BASE, EVAL_SEED_BASE + 8)}
    assert train_keys == training and eval_keys == held_out  # these 8 seeds reach both games of each pool
    assert _instance_after_reset(coin_env, None) in training


def _instance_after_reset(env: TextWorldEnv, seed: int | None) -> str:
    env.reset(seed=seed)
    return env.instance_key()


def test_game_identity_is_the_game_not_the_file(coin_env, game_cache):
    spec = coin_env.specs[0]
    folder = ensure_game(spec).parent
    copy = replace(spec, game_seed=77)  # another spec whose folder holds the very same game
    shutil.copytree(folder, game_cache / copy.key())
    assert game_identity(copy) == game_identity(spec)
    games = [textworld.Game.load(str(ensure_game(s).with_name("game.json"))) for s in coin_env.specs]
    worlds = [
        (
            sorted(map(str, game.world.facts)),
            {k: v.name for k, v in game.infos.items()},
            [q.commands for q in game.quests],
        )
        for game in games
    ]
    assert (worlds[0] == worlds[1]) == (game_identity(coin_env.specs[0]) == game_identity(coin_env.specs[1]))
    corrupt = replace(spec, game_seed=78)
    shutil.copytree(folder, game_cache / corrupt.key())
    (game_cache / corrupt.key() / "game.json").write_text("{not json")
    with pytest.raises(RuntimeError, match=f"corrupt cached TextWorld game .*{corrupt.key()}/game.json"):
        game_identity(corrupt)


def test_a_held_out_candidate_equal_to_a_training_game_is_regenerated(monkeypatch):
    env = TextWorldEnv(**COIN)
    candidate = [replace(env.specs[0], split="eval", redraw=redraw) for redraw in range(3)]
    fake = {
        env.specs[0]: "game A",
        env.specs[1]: "game B",
        candidate[0]: "game B",
        candidate[1]: "game A",
        candidate[2]: "C",
    }
    asked = []
    monkeypatch.setattr(tw_env, "game_identity", lambda spec: asked.append(spec) or fake[spec])
    assert env.eval_spec(0) == candidate[2]
    assert env.eval_spec(0) == candidate[2] and len(asked) == 5  # remembered
    monkeypatch.setattr(tw_env, "game_identity", lambda spec: asked.append(spec) or "game A")
    with pytest.raises(
        RuntimeError, match=f"{HELDOUT_TRIES} candidates for held-out game 1 all equal a game of the training pool"
    ):
        env.eval_spec(1)
    assert len(asked) == 5 + HELDOUT_TRIES


def test_held_out_games_use_their_own_internal_seeds():
    spec = GameSpec(kind="coin_collector", level=2, world_size=0, nb_objects=0, quest_length=0, game_seed=0, index=1)
    assert [spec.internal_seed(k) for k in range(3)] == [1538626058, 2039154174, 484808835]  # training games unchanged
    held_out = {
        replace(spec, split="eval", redraw=r).internal_seed(k) for r in range(4) for k in range(GENERATION_TRIES)
    }
    assert len(held_out) == 4 * GENERATION_TRIES and not held_out & {
        spec.internal_seed(k) for k in range(GENERATION_TRIES)
    }
    with pytest.raises(ValueError, match="split must be 'train' or 'eval'"):
        replace(spec, split="test")
