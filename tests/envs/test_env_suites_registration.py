"""Registration of the third-party suites (ScienceWorld, TextArena): present when their extras are
installed, listed as not available when not; ``agent-rl envs`` and ``agent-rl play`` on them."""

from __future__ import annotations

import importlib.util
import io
import shutil
import subprocess
import sys

import gymnasium as gym
import pytest

import agent_rl.envs.registration as registration
from agent_rl.cli import main
from agent_rl.config import ConfigError, EnvConfig
from agent_rl.envs import text_env_specs, unavailable_envs
from agent_rl.training.infra.resolution import make_configured_env

pytest.importorskip("textarena")
pytest.importorskip("scienceworld")

from agent_rl.envs.textarena_env import GAMES, TextArenaEnv  # noqa: E402


def _run(monkeypatch, capsys, argv: list[str], typed: str = "") -> tuple[int, str]:
    monkeypatch.setattr(sys, "stdin", io.StringIO(typed))
    monkeypatch.setenv("COLUMNS", "250")
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_installed_suites_are_registered():
    specs = text_env_specs()
    assert "agent_rl/ScienceWorld-v0" in specs and specs["agent_rl/ScienceWorld-v0"].default_anchor == "state"
    for game in GAMES:
        assert f"textarena/{game}" in specs and f"textarena/{game}" in gym.registry
    assert "textarena/Wordle-v0" in gym.registry and "textarena/Wordle-v0" not in specs  # registered only to refuse
    assert "textarena/Sokoban-v0-medium" in unavailable_envs()


def test_missing_extras_are_listed_as_unavailable(monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("scienceworld", "textarena") else real_find_spec(name, *a),
    )
    monkeypatch.setattr(registration, "_UNAVAILABLE", {})
    registration.register_suites()
    assert registration._UNAVAILABLE == {
        "agent_rl/ScienceWorld-v0": "pip install 'agent-rl[scienceworld]' (it also needs Java)",
        "textarena/*": "pip install 'agent-rl[textarena]'",
    }
    code, out = _run(monkeypatch, capsys, ["play", "textarena/Chess-v0"])  # any id of the missing suite
    assert code == 2 and "textarena/Chess-v0 is not available here: pip install 'agent-rl[textarena]'" in out
    with pytest.raises(ConfigError) as refused:  # the trainer's check names the extra too
        make_configured_env(EnvConfig(id="textarena/FrozenLake-v0"))
    assert str(refused.value) == (
        "config key 'env.id': 'textarena/FrozenLake-v0' is not available here: pip install 'agent-rl[textarena]'"
    )


def test_registering_imports_neither_suite():
    code = "import sys, envs; print('textarena' in sys.modules, 'scienceworld' in sys.modules, 'py4j' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"]


def test_agent_rl_envs_lists_the_suites_and_what_is_left_out(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, ["envs"])
    assert code == 0
    for env_id in (
        "agent_rl/ScienceWorld-v0",
        "textarena/Sokoban-v0",
        "textarena/GuessTheNumber-v0",
        "textarena/Minesweeper-v0-small",
    ):
        assert env_id in out
    assert "Not available here" in out and "textarena/Wordle-v0" in out and "needs NLTK data from the network" in out
    assert "two or more players" in out
    assert "moves [up] [down] [left] [right]" in out  # bracketed moves are text, not rich markup


def test_play_a_textarena_game_to_the_win(monkeypatch, capsys):
    reference = TextArenaEnv(game="TowerOfHanoi-v0")
    reference.reset(seed=0)
    plan = reference.oracle()
    typed = "hello\n" + "\n".join(plan) + "\n"
    code, out = _run(monkeypatch, capsys, ["play", "textarena/TowerOfHanoi-v0"], typed)
    assert code == 0 and "Tower of Hanoi with 3 disks" in out and "Actions: [a b] | [a c]" in out
    assert f"won: return 1 after {len(plan) + 1} steps" in out


def test_play_refuses_a_network_data_game_clearly(monkeypatch, capsys):
    code, out = _run(monkeypatch, capsys, ["play", "textarena/Wordle-v0"])
    assert code == 2 and "textarena/Wordle-v0 is not available here: needs NLTK data from the network" in out
    assert "Traceback" not in out


def test_train_refuses_a_network_data_game_with_a_config_error_before_the_run_starts(tmp_path, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "env.id=textarena/Wordle-v0", f"trainer.run_dir={run_dir}", "engine=hf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "agent-rl: error: config key 'env.id': 'textarena/Wordle-v0' is not available here: "
        "needs NLTK data from the network (words, averaged_perceptron_tagger_eng)"
    )
    assert "Traceback" not in err and not run_dir.exists()


@pytest.mark.skipif(shutil.which("java") is None, reason="ScienceWorld needs Java")
def test_play_scienceworld(monkeypatch, capsys):
    code, out = _run(
        monkeypatch, capsys, ["play", "agent_rl/ScienceWorld-v0", "task=boil"], "look around\nquit\n:quit\n"
    )
    assert code == 0 and "Task: Your task is to boil" in out and "Actions: inventory | look around" in out
    assert "is not a ScienceWorld action here" in out and "bye" in out
