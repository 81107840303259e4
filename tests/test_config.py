"""Config: defaults, YAML + overrides, presets, and errors that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_rl.config import (
    ALGORITHM_PRESETS,
    Config,
    ConfigError,
    config_to_dict,
    load_config,
    parse_override,
)

RECIPES = Path(__file__).resolve().parent.parent / "training" / "configs"


def test_overrides_parse_with_yaml_types():
    config = load_config(
        overrides=["trainer.iterations=50", "optim.lr=1e-4", "env.imports=[a, b]", "logging.tensorboard=false",
                   "optim.betas=[0.9, 0.95]", "env.kwargs.n_rooms=9", "trainer.target_success=null"]
    )
    assert config.trainer.iterations == 50
    assert config.optim.lr == pytest.approx(1e-4)  # YAML 1.1 reads "1e-4" as a string
    assert config.env.imports == ["a", "b"]
    assert config.logging.tensorboard is False
    assert config.optim.betas == (0.9, 0.95)
    assert config.env.kwargs["n_rooms"] == 9
    assert config.trainer.target_success is None
    assert parse_override("env.id=agent_rl/Maze-v0") == ("env.id", "agent_rl/Maze-v0")


def test_section_shorthands():
    config = load_config(overrides=["env=agent_rl/Sokoban-v0", "algo=dapo", "engine=hf", "policy=/models/x"])
    assert config.env.id == "agent_rl/Sokoban-v0"
    assert config.algo.preset == "dapo"
    assert config.engine.kind == "hf"
    assert config.policy.name_or_path == "/models/x"


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"algo": "grpo", "trainer": {"iterations": 7, "seed": 3}}))
    config = load_config(path, overrides=["trainer.iterations=9"])
    assert (config.algo.preset, config.trainer.iterations, config.trainer.seed) == ("grpo", 9, 3)


@pytest.mark.parametrize(
    "override, message",
    [
        ("trainer.iteratons=5", "unknown config key 'trainer.iteratons' (did you mean 'trainer.iterations'?)"),
        ("trainr.iterations=5", "unknown config key 'trainr.iterations'"),
        ("trainer.iterations=abc", "config key 'trainer.iterations' expects an integer, got 'abc'"),
        ("trainer.iterations=-1", "config key 'trainer.iterations': must be >= 0"),
        ("optim.lr=fast", "config key 'optim.lr' expects a number"),
        ("optim.lr=0", "config key 'optim.lr': must be > 0"),
        ("algo=ppo", "config key 'algo.preset': 'ppo' is not one of"),
        ("algo.loss=nope", "config key 'algo.loss': unknown loss preset 'nope'"),
        ("algo.loss_kwargs.clip=0.1", "config key 'algo.loss_kwargs.clip': unknown loss argument"),
        ("algo.gamma=1.5", "config key 'algo.gamma': must be in [0, 1]"),
        ("engine.kind=tpu", "config key 'engine.kind': 'tpu' is not one of"),
        ("sft.mode=expert", "config key 'sft.mode': 'expert' is not one of"),
        ("sft.perturb=1", "config key 'sft.perturb': must be in [0, 1)"),
        ("logging.console=maybe", "config key 'logging.console' expects true/false"),
        ("optim.betas=[0.9]", "config key 'optim.betas' expects a list of 2 values"),
        ("trainer.iterations", "is not of the form key=value"),
        ("optim=adam", "config key 'optim' is a section"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert message in str(info.value)


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  eval_evry: 3\n")
    with pytest.raises(ConfigError, match=r"unknown config key 'trainer.eval_evry' \(did you mean 'trainer.eval_every'\?\)"):
        load_config(path)


@pytest.mark.parametrize("preset", sorted(ALGORITHM_PRESETS))
def test_presets_resolve_to_loss_presets(preset):
    from agent_rl.losses import LOSS_PRESETS

    resolved = load_config(overrides=[f"algo={preset}", "algo.kl_coef=null"]).algo.resolved()
    assert resolved["loss"] in LOSS_PRESETS
    assert resolved["step_credit"] is (preset == "gigpo")
    for key, value in LOSS_PRESETS[resolved["loss"]].items():
        assert resolved["loss_kwargs"][key] == value


def test_step_credit_combines_with_any_loss():
    resolved = load_config(overrides=["algo=dapo", "algo.step_credit=true", "algo.kl_coef=0.01"]).algo.resolved()
    assert (resolved["loss"], resolved["advantage"], resolved["step_credit"]) == ("dapo", "grpo", True)
    assert resolved["loss_kwargs"]["clip_high"] == 0.28 and resolved["loss_kwargs"]["kl_coef"] == 0.01
    resolved = load_config(overrides=["algo=gigpo", "algo.loss=gspo", "algo.loss_kwargs.clip_high=0.001"]).algo.resolved()
    assert resolved["loss_kwargs"]["ratio_level"] == "sequence" and resolved["loss_kwargs"]["clip_high"] == 0.001
    assert resolved["step_credit"] is True


def test_every_recipe_loads_and_maze_recipe_is_the_embedded_default():
    recipes = sorted(RECIPES.glob("*.yaml"))
    assert {p.stem for p in recipes} >= {"maze", "sokoban", "textworld", "minicode"}
    for path in recipes:
        load_config(path)
    assert config_to_dict(load_config("maze")) == config_to_dict(Config())


def test_round_trip_through_yaml(tmp_path):
    from agent_rl.config import save_config

    config = load_config(overrides=["algo=rloo", "env.kwargs.n_rooms=5", "optim.betas=[0.8, 0.9]"])
    save_config(config, tmp_path / "c.yaml")
    assert config_to_dict(load_config(tmp_path / "c.yaml")) == config_to_dict(config)


def test_save_config_replaces_the_file_atomically(tmp_path):
    """A reader that opened the old file (a learner resuming beside the one rewriting it) reads it whole."""
    from agent_rl.config import save_config

    path = tmp_path / "config.yaml"
    old, new = load_config(overrides=["algo=rloo"]), load_config(overrides=["algo=gigpo"])
    save_config(old, path)
    with open(path) as reader:
        save_config(new, path)
        assert yaml.safe_load(reader.read()) == config_to_dict(old)
    assert config_to_dict(load_config(path)) == config_to_dict(new)
    assert list(tmp_path.iterdir()) == [path]


def test_config_module_does_not_import_torch():
    code = "import agent_rl.config, sys; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("recipe", ["maze", "sokoban", "minicode"])
def test_recipe_environments_construct(recipe):
    import gymnasium as gym

    import envs  # noqa: F401  (registers the bundled environments)

    config = load_config(recipe)
    env = gym.make(config.env.id, **config.env.kwargs)
    observation, info = env.reset(seed=0)
    assert observation and "won" in info
