"""Every check of a config's values, in one place, each a :class:`ConfigError` naming its key; and
:func:`resolve_algorithm`, which fills in the parts an algorithm preset decides (and refuses parts
that do not combine)."""

from __future__ import annotations

import dataclasses
import math

from agent_rl.config.schema import ACTION_PARSERS, AlgorithmConfig, Config, ConfigError, RolloutConfig
from agent_rl.core.presets import ALGORITHM_PRESETS, KEY_KINDS, LOSS_KWARGS, LOSS_PRESETS

MAX_EVAL_OFFSET = 2**30
"""Largest ``trainer.eval_offset``: held-out seeds (from ``EVAL_SEED_BASE``, 2**31) stay below the 2**32
that environments' seeding accepts for any evaluation of up to 2**30 episodes."""


def _require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"config key {key!r}: {message}")


def check_rollout(rollout: RolloutConfig) -> None:
    """The checks of the ``rollout`` section alone: :func:`validate` runs them, and so does
    ``agent_rl.training.loop.rollout.collect_rollouts`` for a section built in Python."""
    for name in ("n_groups", "group_size", "max_turns", "max_prompt_tokens", "max_new_tokens"):
        _require(getattr(rollout, name) >= 1, f"rollout.{name}", f"must be >= 1, got {getattr(rollout, name)}")
    for name in ("history_turns", "max_admissible_actions", "min_batch_rows", "max_resample_rounds", "overlong_buffer"):
        _require(getattr(rollout, name) >= 0, f"rollout.{name}", f"must be >= 0, got {getattr(rollout, name)}")
    _require(
        rollout.overlong_buffer <= rollout.max_new_tokens,
        "rollout.overlong_buffer",
        f"{rollout.overlong_buffer} exceeds rollout.max_new_tokens ({rollout.max_new_tokens})",
    )
    _require(rollout.overlong_penalty >= 0, "rollout.overlong_penalty", f"must be >= 0, got {rollout.overlong_penalty}")
    _require(
        0 <= rollout.progress_reward < float("inf"),
        "rollout.progress_reward",
        f"must be a finite number >= 0, got {rollout.progress_reward}",
    )
    _require(
        rollout.parser in ACTION_PARSERS,
        "rollout.parser",
        f"must be one of {list(ACTION_PARSERS)}, got {rollout.parser!r}",
    )
    _require(rollout.temperature > 0, "rollout.temperature", f"must be > 0, got {rollout.temperature}")
    _require(0 < rollout.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {rollout.top_p}")
    _require(0 <= rollout.explore_rate < 1, "rollout.explore_rate", f"must be in [0, 1), got {rollout.explore_rate}")
    _require(
        0 <= rollout.greedy_members < rollout.group_size,
        "rollout.greedy_members",
        f"must be in [0, rollout.group_size) (a group needs a sampled member), got {rollout.greedy_members} "
        f"with group_size {rollout.group_size}",
    )
    _require(
        rollout.target_pass_rate is None or 0 < rollout.target_pass_rate < 1,
        "rollout.target_pass_rate",
        f"must be in (0, 1), or null for no curriculum, got {rollout.target_pass_rate}",
    )
    _require(0 <= rollout.replay_start <= 1, "rollout.replay_start", f"must be in [0, 1], got {rollout.replay_start}")
    _require(0 < rollout.replay_step <= 1, "rollout.replay_step", f"must be in (0, 1], got {rollout.replay_step}")


def validate(config: Config) -> None:
    """Range and consistency checks that types alone cannot express."""
    _require(bool(config.env.id.strip()), "env.id", "must not be empty")
    if config.env.anchor_key is not None:
        _require(
            config.env.anchor_key in KEY_KINDS,
            "env.anchor_key",
            f"{config.env.anchor_key!r} is not one of {list(KEY_KINDS)} (or null for the environment's default)",
        )
    _require(
        config.env.timeout_s is None or config.env.timeout_s > 0,
        "env.timeout_s",
        f"must be > 0 seconds, or null for no limit, got {config.env.timeout_s}",
    )
    _require(
        not config.policy.tokenizer_envs or config.policy.name_or_path == "embedded",
        "policy.tokenizer_envs",
        f"only the embedded policy's tokenizer is built; {config.policy.name_or_path!r} brings its own",
    )
    _require(config.policy.lora_rank >= 0, "policy.lora_rank", "must be >= 0 (0 = full fine-tuning)")
    _require(config.policy.lora_alpha > 0, "policy.lora_alpha", "must be > 0")
    _require(
        bool(config.policy.lora_target_modules) and all(m.strip() for m in config.policy.lora_target_modules),
        "policy.lora_target_modules",
        "must name at least one module, e.g. [all-linear] or [q_proj, v_proj]",
    )
    _require(config.engine.kv_cache_memory_bytes > 0, "engine.kv_cache_memory_bytes", "must be > 0")
    _require(config.engine.max_batch_size >= 1, "engine.max_batch_size", "must be >= 1")
    algo = config.algo
    _require(0 <= algo.gamma <= 1, "algo.gamma", f"must be in [0, 1], got {algo.gamma}")
    _require(algo.step_weight >= 0, "algo.step_weight", "must be >= 0")
    _require(algo.eps > 0, "algo.eps", "must be > 0")
    _require(algo.kl_coef is None or algo.kl_coef >= 0, "algo.kl_coef", "must be >= 0")
    _require(algo.kl_clamp is None or algo.kl_clamp > 0, "algo.kl_clamp", f"must be > 0 or null, got {algo.kl_clamp}")
    _require(algo.invalid_penalty >= 0, "algo.invalid_penalty", "must be >= 0")
    _require(
        math.isfinite(algo.novelty_bonus) and algo.novelty_bonus >= 0,
        "algo.novelty_bonus",
        f"must be a finite number >= 0, got {algo.novelty_bonus}",
    )
    _require(
        0 < algo.keep_groups <= 1,
        "algo.keep_groups",
        f"must be in (0, 1] (1 keeps every group; 0 would keep none), got {algo.keep_groups}",
    )
    _require(0 <= algo.negative_weight <= 1, "algo.negative_weight", f"must be in [0, 1], got {algo.negative_weight}")
    for name in algo.loss_kwargs:
        _require(
            name in LOSS_KWARGS, f"algo.loss_kwargs.{name}", f"unknown loss argument; choose from {list(LOSS_KWARGS)}"
        )
    _require(
        algo.loss is None or algo.loss in LOSS_PRESETS,
        "algo.loss",
        f"unknown loss preset {algo.loss!r}; choose one of {sorted(LOSS_PRESETS)}",
    )
    resolve_algorithm(algo)  # the parts the preset leaves open must combine (algo.advantage=none needs step credit)
    optim = config.optim
    _require(optim.lr > 0, "optim.lr", f"must be > 0, got {optim.lr}")
    _require(all(0 <= b < 1 for b in optim.betas), "optim.betas", "each beta must be in [0, 1)")
    _require(optim.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
    _require(optim.adam_eps > 0, "optim.adam_eps", "must be > 0")
    _require(optim.grad_clip >= 0, "optim.grad_clip", "must be >= 0")
    _require(optim.epochs >= 1, "optim.epochs", "must be >= 1")
    _require(optim.min_steps >= 0, "optim.min_steps", f"must be >= 0 (0 keeps optim.epochs), got {optim.min_steps}")
    _require(
        optim.target_kl is None or optim.target_kl > 0,
        "optim.target_kl",
        f"must be > 0, or null to never stop early, got {optim.target_kl}",
    )
    _require(optim.minibatches >= 1, "optim.minibatches", "must be >= 1")
    _require(optim.minibatch_size >= 0, "optim.minibatch_size", "must be >= 0 (0 = use optim.minibatches)")
    rollout = config.rollout
    check_rollout(rollout)
    trajectories = rollout.n_groups * rollout.group_size
    if optim.minibatch_size == 0:
        _require(
            optim.minibatches <= trajectories,
            "optim.minibatches",
            f"{optim.minibatches} minibatches exceed the {trajectories} trajectories of a round "
            "(rollout.n_groups x rollout.group_size)",
        )
    _require(
        optim.minibatch_size <= trajectories,
        "optim.minibatch_size",
        f"{optim.minibatch_size} trajectories leave no full minibatch: a round holds {trajectories} trajectories "
        "(rollout.n_groups x rollout.group_size)",
    )
    _require(optim.micro_batch_size >= 1, "optim.micro_batch_size", "must be >= 1")
    _require(optim.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0 (0 = no warmup)")
    sft = config.sft
    _require(sft.steps >= 0, "sft.steps", "must be >= 0")
    _require(sft.lr > 0, "sft.lr", "must be > 0")
    _require(sft.batch_size >= 1, "sft.batch_size", "must be >= 1")
    _require(sft.episodes >= 1, "sft.episodes", "must be >= 1")
    _require(0.0 <= sft.perturb < 1.0, "sft.perturb", "must be in [0, 1)")
    _require(0.0 <= sft.epsilon <= 1.0, "sft.epsilon", "must be in [0, 1]")
    _require(sft.dagger_episodes >= 0, "sft.dagger_episodes", "must be >= 0")
    _require(0.0 < sft.dagger_fraction < 1.0, "sft.dagger_fraction", "must be in (0, 1)")
    _require(
        sft.targets == "played" or sft.mode in ("auto", "random"),
        "sft.targets",
        f"listed applies to sft.mode=random (the actions a turn lists); sft.mode is {sft.mode}",
    )
    if sft.format_target is not None:
        _require(
            0.0 < sft.format_target <= 1.0, "sft.format_target", f"must be in (0, 1] or null, got {sft.format_target}"
        )
    if sft.max_seconds is not None:
        _require(sft.max_seconds > 0, "sft.max_seconds", f"must be > 0 or null, got {sft.max_seconds}")
    trainer = config.trainer
    _require(trainer.iterations >= 0, "trainer.iterations", "must be >= 0")
    _require(trainer.eval_every >= 0, "trainer.eval_every", "must be >= 0")
    _require(trainer.eval_episodes >= 1, "trainer.eval_episodes", "must be >= 1")
    _require(
        0 <= trainer.eval_offset <= MAX_EVAL_OFFSET,
        "trainer.eval_offset",
        f"must be in [0, {MAX_EVAL_OFFSET}], got {trainer.eval_offset}",
    )
    _require(trainer.confirm_episodes >= 0, "trainer.confirm_episodes", "must be >= 0 (0 = no confirmation)")
    _require(trainer.save_every >= 1, "trainer.save_every", "must be >= 1")
    _require(
        0 < trainer.max_failed_share <= 1,
        "trainer.max_failed_share",
        f"must be in (0, 1] (1 stops when every trajectory failed), got {trainer.max_failed_share}",
    )
    if trainer.target_success is not None:
        _require(0 < trainer.target_success <= 1, "trainer.target_success", "must be in (0, 1] or null")
    if trainer.torch_threads is not None:
        _require(trainer.torch_threads >= 1, "trainer.torch_threads", "must be >= 1 or null")
    scale = config.scale
    _require(scale.env_actors >= 0, "scale.env_actors", "must be >= 0 (0 = in-process environments)")
    _require(scale.engine_replicas >= 0, "scale.engine_replicas", "must be >= 0 (0 = one in-process engine)")
    _require(scale.num_cpus_per_actor > 0, "scale.num_cpus_per_actor", "must be > 0")
    _require(scale.num_gpus_per_replica >= 0, "scale.num_gpus_per_replica", "must be >= 0")


def resolve_algorithm(algo: AlgorithmConfig, norm_length: int | None = None) -> AlgorithmConfig:
    """A copy of ``algo`` with every part its preset decides filled in: ``advantage``, ``loss``,
    ``step_credit``, ``step_normalize``, ``kl_coef``, ``kl_estimator`` and all of ``loss_kwargs``
    (the loss preset under the given overrides). ``norm_length`` is Dr.GRPO's constant normalizer
    (``seq_mean_token_sum_norm``) when none is set. Resolving a resolved config changes nothing."""
    base = ALGORITHM_PRESETS[algo.preset]
    loss = algo.loss if algo.loss is not None else base["loss"]
    advantage = algo.advantage if algo.advantage is not None else base["advantage"]
    step_credit = algo.step_credit if algo.step_credit is not None else base["step_credit"]
    if advantage == "none" and step_credit == "none":
        raise ConfigError(
            "config key 'algo.advantage': 'none' leaves step credit as the only advantage, but step credit is "
            f"off for preset {algo.preset!r}; set algo.step_credit=anchor or algo.step_credit=graph"
        )
    preset = {"cispo_cap": None, "norm_length": None, "kl_estimator": "k3", **LOSS_PRESETS[loss]}
    loss_kwargs = {key: algo.loss_kwargs.get(key, preset[key]) for key in LOSS_KWARGS}
    if loss_kwargs["norm_length"] is None and loss_kwargs["loss_agg"] == "seq_mean_token_sum_norm":
        loss_kwargs["norm_length"] = norm_length
    return dataclasses.replace(
        algo,
        advantage=advantage,
        loss=loss,
        step_credit=step_credit,
        step_normalize=algo.step_normalize if algo.step_normalize is not None else base["step_normalize"],
        loss_kwargs=loss_kwargs,
        kl_coef=float(algo.kl_coef if algo.kl_coef is not None else preset["kl_coef"]),
        kl_estimator=algo.kl_estimator if algo.kl_estimator is not None else preset["kl_estimator"],
    )
