"""One installed namespace: everything installs under ``agent_rl``, so a user project with its own
``envs/`` or ``training/`` package on the path trains as any other."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest
from tiny_train import TINY_TRAIN  # tests/

ROOT = Path(__file__).resolve().parents[1]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def installed_name(folder: Path) -> str:
    """The name a package folder installs as (by the package-dir mapping)."""
    top, *rest = folder.relative_to(ROOT).parts
    mapped = {directory: name for name, directory in SETUPTOOLS["package-dir"].items()}
    return ".".join([mapped[top], *rest])


def test_every_package_folder_installs_under_agent_rl_and_nothing_else_does():
    folders = [
        p.parent
        for top in SETUPTOOLS["package-dir"].values()
        for p in (ROOT / top).rglob("__init__.py")
        if "results" not in p.parts
    ]
    assert sorted(SETUPTOOLS["packages"]) == sorted(installed_name(folder) for folder in folders)
    assert all(name == "agent_rl" or name.startswith("agent_rl.") for name in SETUPTOOLS["packages"])
    assert set(SETUPTOOLS["package-dir"].values()) == {"agent_rl", "envs", "anchors", "training", "benchmarks"}


USER_ENV = '''
import gymnasium as gym


class Lock(gym.Env):
    """Say the code, 7, to open the lock."""

    observation_space = action_space = gym.spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "A lock. Say a digit.", {"admissible_actions": [str(d) for d in range(10)]}

    def step(self, action):
        won = action.strip() == "7"
        return "Open." if won else "Shut.", float(won), True, False, {"won": won, "action_valid": True}


gym.register("mine/Lock-v0", entry_point=Lock)
'''


@pytest.mark.slow
def test_a_user_project_with_its_own_envs_and_training_packages_trains_through_the_cli_and_the_api(tmp_path):
    project = tmp_path / "project"
    for package in ("envs", "training"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text('"""A package of the user project."""\n')
    (project / "envs" / "lock.py").write_text(USER_ENV)
    env = {**os.environ, "PYTHONPATH": str(project), "COLUMNS": "200"}
    cli = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_rl.cli",
            "train",
            "env.id=envs.lock:mine/Lock-v0",
            f"trainer.run_dir={tmp_path / 'cli'}",
            *TINY_TRAIN,
        ],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert cli.returncode == 0, cli.stderr[-3000:]
    assert (tmp_path / "cli" / "metrics.jsonl").is_file()
    script = textwrap.dedent(f"""
        import envs, training
        assert envs.__file__.startswith({str(project)!r}) and training.__file__.startswith({str(project)!r})
        from agent_rl import load_config, train
        train(load_config(overrides=["env.id=envs.lock:mine/Lock-v0", "trainer.run_dir={tmp_path / "api"}",
                                     *{TINY_TRAIN!r}]))
        import envs.lock
        assert envs.lock.Lock.__module__ == "envs.lock"
        print("trained")
    """)
    api = subprocess.run(
        [sys.executable, "-c", script], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )
    assert api.returncode == 0, api.stderr[-3000:]
    assert api.stdout.strip().endswith("trained") and (tmp_path / "api" / "metrics.jsonl").is_file()


def test_a_checkout_on_the_path_imports_its_own_subpackages_whichever_checkout_is_installed(tmp_path):
    checkout = tmp_path / "worktree"
    (checkout / "agent_rl").mkdir(parents=True)
    (checkout / "training").mkdir()
    (checkout / "pyproject.toml").write_text("")
    (checkout / "agent_rl" / "__init__.py").write_text((ROOT / "agent_rl" / "__init__.py").read_text())
    (checkout / "training" / "__init__.py").write_text("WHERE = 'worktree'\n")
    code = "import agent_rl.training; print(agent_rl.training.WHERE, agent_rl.training.__file__)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["worktree", str(checkout / "training" / "__init__.py")]
