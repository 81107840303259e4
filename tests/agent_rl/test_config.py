"""Config: defaults, YAML + overrides, presets, and errors that name the key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agent_rl.config import (
    ALGORITHM_PRESETS,
    LOSS_PRESETS,
    Config,
    ConfigError,
    config_to_dict,
    load_config,
    parse_override,
    resolve_algorithm,
)

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "training" / "configs"


def test_overrides_parse_with_yaml_types():
    config = load_config(
        overrides=[
            "trainer.iterations=50",
            "optim.lr=1e-4",
            "env.imports=[a, b]",
            "logging.tensorboard=false",
            "optim.betas=[0.9, 0.95]",
            "env.kwargs.n_rooms=9",
            "trainer.target_success=null",
        ]
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
        ("optim.warmup_steps=-1", "config key 'optim.warmup_steps': must be >= 0 (0 = no warmup)"),
        ("sft.perturb=1", "config key 'sft.perturb': must be in [0, 1)"),
        ("sft.epsilon=1.5", "config key 'sft.epsilon': must be in [0, 1]"),
        ("sft.dagger_episodes=-1", "config key 'sft.dagger_episodes': must be >= 0"),
        ("sft.dagger_fraction=0", "config key 'sft.dagger_fraction': must be in (0, 1)"),
        ("sft.dagger_fraction=1", "config key 'sft.dagger_fraction': must be in (0, 1)"),
        ("sft.lr_schedule=linear", "config key 'sft.lr_schedule': 'linear' is not one of"),
        ("logging.console=maybe", "config key 'logging.console' expects true/false"),
        ("optim.betas=[0.9]", "config key 'optim.betas' expects a list of 2 values"),
        ("trainer.iterations", "is not of the form key=value"),
        ("optim=adam", "config key 'optim' is a section"),
        ("env.anchor_key=exact", "config key 'env.anchor_key': 'exact' is not one of ['state', "),
        ("rollout.parser=regex", "config key 'rollout.parser': 'regex' is not one of"),
        ("rollout.temperature=0", "config key 'rollout.temperature': must be > 0"),
        ("rollout.top_p=1.5", "config key 'rollout.top_p': must be in (0, 1]"),
        ("rollout.min_batch_rows=-1", "config key 'rollout.min_batch_rows': must be >= 0"),
        ("optim.lr=-1e-4", "config key 'optim.lr': must be > 0"),
        (
            "optim.minibatch_size=129",
            "config key 'optim.minibatch_size': 129 trajectories leave no full minibatch: a round holds 128",
        ),
        ("optim.minibatch_size=-1", "config key 'optim.minibatch_size': must be >= 0"),
        ("algo.negative_weight=2", "config key 'algo.negative_weight': must be in [0, 1]"),
        ("algo.row_weight=token", "config key 'algo.row_weight': 'token' is not one of"),
        ("sft.format_target=0", "config key 'sft.format_target': must be in (0, 1] or null"),
        ("sft.format_target=1.5", "config key 'sft.format_target': must be in (0, 1] or null"),
        ("sft.max_seconds=0", "config key 'sft.max_seconds': must be > 0 or null"),
        ("algo.kl_clamp=0", "config key 'algo.kl_clamp': must be > 0 or null, got 0"),
    ],
)
def test_bad_values_name_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[override])
    assert message in str(info.value)


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trainer:\n  eval_evry: 3\n")
    with pytest.raises(
        ConfigError, match=r"unknown config key 'trainer.eval_evry' \(did you mean 'trainer.eval_every'\?\)"
    ):
        load_config(path)


@pytest.mark.parametrize("preset", sorted(ALGORITHM_PRESETS))
def test_presets_resolve_to_loss_presets(preset):
    algo = resolve_algorithm(load_config(overrides=[f"algo={preset}", "algo.kl_coef=null"]).algo)
    assert algo.loss == ALGORITHM_PRESETS[preset]["loss"]
    assert algo.step_credit == ("anchor" if preset == "gigpo" else "none")
    assert algo.advantage == ALGORITHM_PRESETS[preset]["advantage"]
    assert algo.kl_coef == LOSS_PRESETS[algo.loss]["kl_coef"] and algo.kl_estimator == "k3"
    for key, value in LOSS_PRESETS[algo.loss].items():
        if key not in ("kl_coef", "kl_estimator"):
            assert algo.loss_kwargs[key] == value
    assert set(algo.loss_kwargs) == {"ratio_level", "clip_low", "clip_high", "cispo_cap", "loss_agg", "norm_length"}


def test_step_credit_combines_with_any_loss():
    algo = resolve_algorithm(load_config(overrides=["algo=dapo", "algo.step_credit=anchor", "algo.kl_coef=0.01"]).algo)
    assert (algo.loss, algo.advantage, algo.step_credit) == ("dapo", "grpo", "anchor")
    assert algo.loss_kwargs["clip_high"] == 0.28 and algo.kl_coef == 0.01
    algo = resolve_algorithm(
        load_config(overrides=["algo=gigpo", "algo.loss=gspo", "algo.loss_kwargs.clip_high=0.001"]).algo
    )
    assert algo.loss_kwargs["ratio_level"] == "sequence" and algo.loss_kwargs["clip_high"] == 0.001
    assert algo.loss_kwargs["clip_low"] == 3e-4 and algo.step_credit == "anchor"


def test_every_recipe_loads_and_the_maze_recipe_adds_only_what_belongs_to_its_environment():
    recipes = sorted(RECIPES.glob("*.yaml"))
    assert {p.stem for p in recipes} >= {"maze", "sokoban", "textworld", "minicode"}
    for path in recipes:
        load_config(path)

    # The library defaults are the main job's learner; the recipe adds its Maze, warm start and prompt.
    def keys(config):
        return {
            f"{section}.{key}": value
            for section, values in config_to_dict(config).items()
            for key, value in values.items()
        }

    recipe, library = keys(load_config("maze")), keys(Config())
    assert {key for key in library if recipe[key] != library[key]} == {
        "env.kwargs",
        "rollout.history_turns",
        "rollout.max_new_tokens",
        "sft.steps",
        "sft.episodes",
    }
    assert (library["env.kwargs"], library["sft.steps"], library["sft.episodes"]) == ({}, 300, 500)
    assert recipe["env.id"] == library["env.id"] == "agent_rl/Maze-v0"


def test_the_default_config_is_the_main_job_unless_the_overrides_name_another_environment():
    from agent_rl.config import DEFAULT_RECIPE, load_default_config

    main_job = config_to_dict(load_config(DEFAULT_RECIPE))
    assert config_to_dict(load_default_config()) == main_job
    assert config_to_dict(load_default_config(["env=agent_rl/Maze-v0"])) == main_job
    seeded = load_default_config(["trainer.seed=3", "env.kwargs.n_rooms=6"])
    assert seeded.trainer.seed == 3 and seeded.env.kwargs == {**main_job["env"]["kwargs"], "n_rooms": 6}
    for overrides in (["env.id=userpkg/Lock-v0"], ["env=userpkg/Lock-v0", "sft.steps=7"]):
        assert config_to_dict(load_default_config(overrides)) == config_to_dict(load_config(None, overrides)), overrides
    user = load_default_config(["env.id=userpkg/Lock-v0"])
    assert (user.env.kwargs, user.sft.steps, user.rollout.max_new_tokens) == ({}, 300, 24)


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


def test_building_a_config_imports_neither_torch_nor_training_nor_an_environment():
    code = (
        "import sys; from agent_rl.config import load_config; "
        "load_config('sokoban', ['algo=drgrpo', 'rollout.parser=action_tag', 'env.anchor_key=similarity']); "
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('torch', 'training', 'envs', 'anchors', "
        "'gymnasium')]; "
        "assert not loaded, loaded"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize("recipe", ["maze", "sokoban", "minicode"])
def test_recipe_environments_construct(recipe):
    import gymnasium as gym

    from agent_rl import envs  # noqa: F401  (registers the bundled environments)

    config = load_config(recipe)
    env = gym.make(config.env.id, **config.env.kwargs)
    observation, info = env.reset(seed=0)
    assert observation and "won" in info


@pytest.mark.parametrize("recipe", ["minicode", "smollm2-maze"])
def test_oracle_recipes_keep_the_warm_start_their_committed_results_used(recipe):
    # They clone without perturbation (the default perturbs).
    assert (load_config(recipe).sft.mode, load_config(recipe).sft.perturb) == ("oracle", 0.0)
    assert Config().sft.perturb > 0


def test_env_kwargs_start_empty_and_take_sub_keys():
    assert Config().env.kwargs == {} and load_config(overrides=["env.id=userpkg/Lock-v0"]).env.kwargs == {}
    for overrides in (
        ["env.id=userpkg/Lock-v0", "env.kwargs.digits=4"],
        ["env.kwargs.digits=4", "env.id=userpkg/Lock-v0"],
    ):
        assert load_config(overrides=overrides).env.kwargs == {"digits": 4}, overrides
    maze = load_config("maze", ["env.kwargs.n_rooms=9"]).env.kwargs
    assert maze["n_rooms"] == 9 and maze["oracle"] == "explore"
    assert load_config("maze", ["env.kwargs={}"]).env.kwargs == {}  # a whole mapping replaces the recipe's
    # Recipes that name their environment and its kwargs keep them.
    for name in ("sokoban", "minicode"):
        assert load_config(name).env.kwargs == yaml.safe_load((RECIPES / f"{name}.yaml").read_text())["env"]["kwargs"]
    assert load_config(base={"env": {"id": "agent_rl/Sokoban-v0"}}).env.kwargs == {}
