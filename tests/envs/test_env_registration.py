"""Registration of bundled and user environments; ``agent-rl envs`` and ``agent-rl play``."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import gymnasium as gym
import pytest

from agent_rl import envs
from agent_rl.cli import main
from agent_rl.envs.cli import parse_env_kwargs
from agent_rl.envs.maze import MazeEnv

TESTS_DIR = Path(__file__).resolve().parents[1]  # tests/, which holds user_env_example.py
BUNDLED = ["agent_rl/Maze-v0", "agent_rl/Sokoban-v0", "agent_rl/TextWorld-v0", "agent_rl/MiniCode-v0"]


@pytest.fixture
def user_module(monkeypatch):
    """Make ``tests/user_env_example.py`` importable as ``user_env_example`` and import it."""
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    envs.import_modules(["user_env_example"])
    monkeypatch.setenv("COLUMNS", "200")  # rich tables: no wrapped ids in captured output
    return "user_env_example"


def _subprocess_env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
        "COLUMNS": "200",
    }


def test_bundled_envs_are_registered_with_descriptions():
    specs = envs.text_env_specs()
    for env_id in BUNDLED:
        assert env_id in specs and specs[env_id].description and env_id in gym.registry
    assert any(ep.value == "agent_rl.envs.registration:register_bundled" for ep in entry_points(group="agent_rl.envs"))
    env = gym.make("agent_rl/Maze-v0", n_rooms=5, n_locked_doors=1)
    assert isinstance(env.unwrapped, MazeEnv) and env.unwrapped.n_rooms == 5
    assert env.spec.id == "agent_rl/Maze-v0"


def test_default_anchor_key_is_the_registered_kind_else_observation(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS_DIR))
    assert envs.default_anchor_key("agent_rl/MiniCode-v0") == "fingerprint"
    assert envs.default_anchor_key("agent_rl/Maze-v0") == "state"
    assert envs.default_anchor_key("user_env_example:usertest/Counter-v0") == "state"  # the module is imported first
    assert envs.default_anchor_key("CartPole-v1") == "observation"  # a plain Gymnasium env
    with pytest.raises(ValueError, match="default_anchor must be one of"):
        envs.register_text_env("test_reg/Bad-v0", MazeEnv, description="x", default_anchor="exact")


def test_gymnasium_make_works_without_importing_envs_first():
    code = (
        "import sys, gymnasium as gym\n"
        "assert 'agent_rl.envs' not in sys.modules\n"
        "env = gym.make('agent_rl.envs:agent_rl/Sokoban-v0')\n"
        "obs, info = env.reset(seed=0)\n"
        "print(type(env.unwrapped).__name__, info['admissible_actions'] != [])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "SokobanEnv True"


def test_user_env_works_with_gymnasium_make_checker_and_oracle(user_module):
    env = gym.make("usertest/Counter-v0", max_target=3)
    _, info = env.reset(seed=11)
    assert info["task"].startswith("Make the counter equal")
    for command in envs.oracle_actions(env):
        _, reward, terminated, _, info = env.step(command)
    assert terminated and info["won"] and reward == 1.0
    assert envs.check_text_env("usertest/Counter-v0", seeds=(0,)).env_id == "usertest/Counter-v0"
    assert envs.text_env_spec("usertest/Counter-v0").kwargs == {"max_target": 5}


def test_agent_rl_envs_lists_bundled_and_user_envs(user_module, capsys):
    assert main(["envs", "--import", user_module]) == 0
    out = capsys.readouterr().out
    for env_id in [*BUNDLED, "usertest/Counter-v0"]:
        assert env_id in out
    assert "Count up or down to a seeded target" in out
    assert "Push every box onto a target" in out


def test_agent_rl_envs_with_an_unknown_module_fails_clearly(capsys):
    assert main(["envs", "--import", "no_such_env_module"]) == 2
    assert "could not import environment module 'no_such_env_module'" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        [str(Path(sys.executable).parent / "agent-rl"), "envs", "--import", "user_env_example"],
        [sys.executable, "-m", "agent_rl.cli", "envs", "--import", "user_env_example"],
    ],
    ids=["console-script", "python-m"],
)
def test_agent_rl_envs_as_a_real_process(command):
    if not Path(command[0]).exists():
        pytest.skip(f"{command[0]} is not installed")
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, env=_subprocess_env())
    assert result.returncode == 0, result.stderr
    assert "usertest/Counter-v0" in result.stdout and "agent_rl/Maze-v0" in result.stdout


def _play(monkeypatch, capsys, argv: list[str], typed: str) -> tuple[int, str]:
    """Run ``agent-rl play`` with ``typed`` as stdin; return the exit code and stdout + stderr."""
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    code = main(["play", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_play_a_maze_to_the_win(monkeypatch, capsys):
    reference = MazeEnv(n_rooms=6, n_locked_doors=1)
    reference.reset(seed=3)
    plan = reference.oracle()
    typed = "dance\n" + "\n".join(plan) + "\n"
    code, out = _play(monkeypatch, capsys, ["agent_rl/Maze-v0", "n_rooms=6", "n_locked_doors=1", "--seed", "3"], typed)
    assert code == 0
    assert "Task: Find the" in out and "Actions: " in out and "I don't understand 'dance'" in out
    assert f"won: return 1 after {len(plan) + 1} steps" in out


def test_play_stops_at_quit_and_at_end_of_input(monkeypatch, capsys, user_module):
    code, out = _play(monkeypatch, capsys, ["usertest/Counter-v0", "--import", user_module], "inc\n:quit\ninc\n")
    assert code == 0 and "The counter shows 1." in out and "bye" in out and "The counter shows 2." not in out
    code, out = _play(monkeypatch, capsys, ["agent_rl/Sokoban-v0", "--seed", "1"], "up\n")
    assert code == 0 and out.count("Boxes on targets") == 2 and "bye" in out


def test_play_rejects_unknown_envs_and_bad_arguments(monkeypatch, capsys):
    code, out = _play(monkeypatch, capsys, ["agent_rl/Nope-v0"], "")
    assert code == 2 and "unknown text environment 'agent_rl/Nope-v0'" in out
    code, out = _play(monkeypatch, capsys, ["agent_rl/Maze-v0", "n_rooms"], "")
    assert code == 2 and "not of the form key=value" in out
    code, out = _play(monkeypatch, capsys, ["agent_rl/Maze-v0", "n_rooms=1"], "")
    assert code == 2 and "n_rooms must be in" in out
    code, out = _play(monkeypatch, capsys, ["agent_rl/Maze-v0", "n_rooms=[1"], "")
    assert code == 2 and "environment argument 'n_rooms=[1': cannot read the value" in out


def test_play_as_a_real_process_reads_stdin():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_rl.cli",
            "play",
            "agent_rl/Sokoban-v0",
            "width=6",
            "height=6",
            "n_boxes=1",
            "--seed",
            "2",
        ],
        input="left\nright\n",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "Task: Push every box" in result.stdout and result.stdout.count("Boxes on targets:") == 3


def test_parse_env_kwargs_reads_yaml_scalars():
    assert parse_env_kwargs(["n_rooms=12", "ratio=0.5", "flag=true", "name=foo", "empty="]) == {
        "n_rooms": 12,
        "ratio": 0.5,
        "flag": True,
        "name": "foo",
        "empty": "",
    }
    with pytest.raises(ValueError, match="key=value"):
        parse_env_kwargs(["=3"])
