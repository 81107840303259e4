"""A plain Gymnasium environment (no agent-rl base class, no agent-rl info keys) registered with
``gym.register`` and named in Gymnasium's ``module:ns/Name-vN`` form: it trains, evaluates, plays and
passes the checker through the CLI; ``sft.mode=auto`` picks the warm start each kind of environment
supports; the trainer's fallbacks for the missing info keys; a constructor refusing ``env.kwargs``
is a one-line config error."""

from __future__ import annotations

import io
import json
import string

import gymnasium as gym
import pytest
import yaml
from gymnasium import spaces
from tiny_train import TINY_TRAIN  # tests/

from agent_rl.cli import main
from agent_rl.config import Config, ConfigError, load_config
from agent_rl.envs import EVAL_SEED_BASE, auto_sft_mode, check_text_env, plays_to_a_win, step_won
from agent_rl.training.infra.logger import read_metrics
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.rollout import Move, PlayStats, play_episodes
from agent_rl.training.serving.envpool import LocalEnvPool, env_factory

LOCK_ID = f"{__name__}:userpkg/Lock-v0"
"""Gymnasium imports this module (which registers the env), then makes it."""


class Lock(gym.Env):
    """Open a seeded 3-digit combination lock; each guess tells how many digits are in place."""

    def __init__(self, max_attempts: int = 4):
        self.max_attempts = max_attempts
        self.observation_space = spaces.Text(max_length=200, charset=string.printable)
        self.action_space = spaces.Text(max_length=200, charset=string.printable)
        self.code, self.attempts = "000", 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.code = "".join(str(d) for d in self.np_random.integers(0, 10, size=3))
        self.attempts = 0
        return "A lock with 3 digits. Guess the code, e.g. 123.", {}

    def step(self, action):
        guess = str(action).strip()
        self.attempts += 1
        if guess == self.code:
            return "The lock opens.", 1.0, True, False, {}
        shown = "".join(c for c in guess if c in string.digits)[:3] or "no digits"  # echo only what the space admits
        in_place = sum(a == b for a, b in zip(guess, self.code))
        return f"Guess {shown}: {in_place} digit(s) in place.", 0.0, False, self.attempts >= self.max_attempts, {}


class ListedLock(Lock):
    """The same lock listing ten admissible guesses (the code among them), still without an oracle."""

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, {"admissible_actions": self._choices()}

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        return observation, reward, terminated, truncated, {"admissible_actions": self._choices()}

    def _choices(self) -> list[str]:
        return sorted({self.code, *(f"{i}{i}{i}" for i in range(10))})


gym.register("userpkg/Lock-v0", entry_point=f"{__name__}:Lock")
gym.register("userpkg/ListedLock-v0", entry_point=f"{__name__}:ListedLock")


def test_plain_gymnasium_env_trains_evaluates_and_plays_through_the_cli(tmp_path, capsys, monkeypatch):
    run_dir = tmp_path / "lock"
    assert main(["train", f"env.id={LOCK_ID}", f"trainer.run_dir={run_dir}", *TINY_TRAIN]) == 0
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1]
    assert "eval/greedy_success" in records[0] and "rollout/success_rate" in records[1]
    assert "sft/pairs" not in records[0]  # no oracle, no admissible actions: no warm start
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert (
        saved["sft"]["mode"] == "none" and saved["env"]["kwargs"] == {} and saved["env"]["anchor_key"] == "observation"
    )
    out = tmp_path / "eval.json"
    capsys.readouterr()
    assert (
        main(["eval", str(run_dir), "--checkpoint", "last", "--episodes", "2", "--show", "1", "--json", str(out)]) == 0
    )
    results = json.loads(out.read_text())
    assert results["env"] == LOCK_ID and [t["seed"] for t in results["greedy_transcripts"]] == [EVAL_SEED_BASE]
    (shown,) = results["greedy_transcripts"]
    assert isinstance(shown["won"], bool) and shown["actions"] and all(isinstance(a, str) for a in shown["actions"])
    assert len(shown["valid"]) == len(shown["actions"])
    played = [a if valid else f"{a} (invalid)" for a, valid in zip(shown["actions"], shown["valid"])]
    outcome = "won " if shown["won"] else "lost"
    assert f"greedy seed {EVAL_SEED_BASE} {outcome}: {' | '.join(played)}" in capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", io.StringIO("999\n:quit\n"))
    assert main(["play", LOCK_ID, "--seed", "3"]) == 0
    assert "digit(s) in place" in capsys.readouterr().out


def test_listed_actions_without_an_oracle_warm_start_on_random_actions(tmp_path):
    run_dir = tmp_path / "listed"
    assert (
        main(
            [
                "train",
                f"env.id={__name__}:userpkg/ListedLock-v0",
                f"trainer.run_dir={run_dir}",
                *[o for o in TINY_TRAIN if o != "trainer.iterations=1"],
                "trainer.iterations=0",
            ]
        )
        == 0
    )
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["sft"]["mode"] == "random"
    (record,) = read_metrics(run_dir)
    assert record["sft/pairs"] > 0


def test_auto_sft_mode_follows_what_the_environment_offers():
    assert resolve(Config()).sft.mode == "oracle"  # the Maze plans
    assert resolve(load_config(overrides=[f"env.id={__name__}:userpkg/ListedLock-v0"])).sft.mode == "random"
    assert resolve(load_config(overrides=[f"env.id={LOCK_ID}"])).sft.mode == "none"
    assert (
        resolve(load_config(overrides=[f"env.id={LOCK_ID}", "sft.mode=random"])).sft.mode == "random"
    )  # explicit stays
    textarena = pytest.importorskip("textarena")
    del textarena
    # An oracle() that raises NotImplementedError (a TextArena game without one) is no oracle.
    assert auto_sft_mode(gym.make("textarena/Minesweeper-v0-small")) == "random"
    assert auto_sft_mode(gym.make("textarena/TowerOfHanoi-v0")) == "oracle"


def test_the_trainer_falls_back_for_missing_info_keys():
    """No ``won``: a termination with a positive reward is a win; no ``action_valid``: valid; no
    ``anchor``: the observation; no ``error``: None."""

    class Opener:  # plays the code on the first turn of slot 0, a wrong guess elsewhere
        def __init__(self, pool):
            self.pool = pool

        def act(self, episodes):
            return [Move(self.pool._envs[e.slot].unwrapped.code if e.slot == 0 else "xyz") for e in episodes]

    pool = LocalEnvPool(lambda: gym.make("userpkg/Lock-v0", max_attempts=2), 2)
    config = load_config(overrides=[f"env.id={LOCK_ID}", "rollout.max_turns=3"]).rollout
    opened, stuck = play_episodes(pool, Opener(pool), [5, 5], [0, 0], config, PlayStats())
    assert [row["won"] for row in opened.rows] == [True]
    assert [row["won"] for row in stuck.rows] == [False, False]  # truncated after 2 attempts, reward 0
    rows = opened.rows + stuck.rows
    assert all(row["action_valid"] for row in rows) and all(row["error"] is None for row in rows)
    assert [row["anchor_state"] for row in stuck.rows] == [
        "A lock with 3 digits. Guess the code, e.g. 123.",
        "Guess no digits: 0 digit(s) in place.",
    ]


@pytest.mark.parametrize(
    "info, terminated, reward, won",
    [
        ({}, True, 1.0, True),
        ({}, True, 0.0, False),  # ended without a reward
        ({}, False, 1.0, False),  # a reward on the way
        ({}, True, -1.0, False),
        ({"won": False}, True, 1.0, False),  # the key decides where it is set
        ({"won": True}, False, 0.0, True),
    ],
)
def test_the_win_rule_the_trainer_and_play_share(info, terminated, reward, won):
    assert step_won(info, terminated, reward) is won


class _Corridor(gym.Env):
    """Three cells: ``right`` twice reaches the goal (reward 1, no ``won`` key); ``jump`` ends the episode lost."""

    def reset(self, *, seed=None, options=None):
        self.cell = 0
        return "cell 0", {}

    def step(self, action):
        self.cell += action == "right"
        ended = self.cell == 2 or action == "jump"
        return f"cell {self.cell}", float(self.cell == 2), ended, False, {}


@pytest.mark.parametrize(
    "actions, won, cell",
    [
        (["right", "right"], True, 2),
        (["right", "right", "jump"], True, 2),  # the win ends the episode: "jump" never plays
        (["right", "jump", "right"], False, 1),  # the loss ends it first
        (["right"], False, 1),  # still under way
        ([], False, 0),
    ],
)
def test_plays_to_a_win_stops_where_the_episode_ends(actions, won, cell):
    env = _Corridor()
    env.reset(seed=0)
    assert plays_to_a_win(env, actions) is won
    assert env.cell == cell


def test_checker_takes_the_module_form_and_lists_the_missing_info_keys():
    report = check_text_env(LOCK_ID)
    assert report.checks[-1] == "usable_after_fuzz"
    assert report.missing_info == ["anchor", "action_valid", "error", "won"]


def test_kwargs_the_environment_refuses_are_a_config_error(tmp_path, capsys):
    config = load_config(overrides=[f"env.id={LOCK_ID}", "env.kwargs.n_rooms=4"])
    with pytest.raises(
        ConfigError,
        match=r"config keys 'env.id' and 'env.kwargs': gymnasium.make\(.*\) failed: "
        r"TypeError: .*unexpected keyword argument 'n_rooms'",
    ):
        env_factory(config)
    run_dir = tmp_path / "refused"
    assert (
        main(
            [
                "train",
                "--import",
                __name__,
                "env.id=userpkg/Lock-v0",
                "env.kwargs={n_rooms: 4}",
                f"trainer.run_dir={run_dir}",
                *TINY_TRAIN,
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("agent-rl: error: config keys 'env.id' and 'env.kwargs'") and "Traceback" not in err
    assert "n_rooms" in err and not run_dir.exists()  # refused before the run directory is claimed


def test_an_unknown_module_or_id_is_a_config_error():
    with pytest.raises(
        ConfigError, match="config key 'env.id' 'no_such_module_xyz:userpkg/Lock-v0'.*no_such_module_xyz"
    ):
        env_factory(load_config(overrides=["env.id=no_such_module_xyz:userpkg/Lock-v0"]))
    with pytest.raises(ConfigError, match=f"unknown environment '{__name__}:userpkg/Nope-v0'"):
        env_factory(load_config(overrides=[f"env.id={__name__}:userpkg/Nope-v0"]))
