"""``agent_rl.training.infra.resolution.resolve``: every choice a config leaves open, made once."""

from __future__ import annotations

import agent_rl.training.infra.resolution as resolution
from agent_rl.config import Config, config_to_dict, load_config, save_config
from agent_rl.training.infra.resolution import resolve


def test_resolve_makes_every_open_choice_once(monkeypatch):
    for importable, kind in ((True, "vllm"), (False, "hf")):
        monkeypatch.setattr(resolution, "vllm_available", lambda importable=importable: importable)
        assert resolve(Config()).engine.kind == kind
    assert resolve(load_config(overrides=["engine=hf"])).engine.kind == "hf"
    # The anchor kind: the environment's registered default, unless one is set.
    assert resolve(Config()).env.anchor_key == "state"
    assert resolve(load_config("minicode")).env.anchor_key == "fingerprint"
    assert resolve(load_config("minicode", ["env.anchor_key=observation"])).env.anchor_key == "observation"
    # A label for a user's environment factory: no registered default (sft.mode=auto would need the env).
    assert (
        resolve(load_config(overrides=["env.id=label/NotRegistered-v0", "sft.mode=none"])).env.anchor_key
        == "observation"
    )
    # Dr.GRPO's constant normalizer is the generation limit, unless set.
    drgrpo = load_config(overrides=["algo=drgrpo", "rollout.max_new_tokens=7"])
    assert resolve(drgrpo).algo.loss_kwargs["norm_length"] == 7
    assert (
        resolve(load_config(overrides=["algo=drgrpo", "algo.loss_kwargs.norm_length=30"])).algo.loss_kwargs[
            "norm_length"
        ]
        == 30
    )
    assert resolve(Config()).algo.loss_kwargs["norm_length"] is None  # gigpo's gspo_token needs none
    # The input is left alone, and resolving twice changes nothing.
    config = Config()
    once = resolve(config)
    assert config.algo.advantage is None and config.env.anchor_key is None and config.sft.mode == "auto"
    assert once.sft.mode == "oracle"  # the Maze gives oracle plans
    assert config_to_dict(resolve(once)) == config_to_dict(once)
    assert (once.algo.advantage, once.algo.loss, once.algo.step_normalize) == ("drgrpo", "gspo_token", "mean")


def test_resolved_config_round_trips_through_yaml(tmp_path):
    resolved = resolve(load_config(overrides=["algo=dapo", "engine=hf"]))
    save_config(resolved, tmp_path / "config.yaml")
    assert config_to_dict(load_config(tmp_path / "config.yaml")) == config_to_dict(resolved)
