"""The choices a config leaves open, made once for every consumer (:func:`resolve`): the engine,
the precision, the environment's anchor key, the warm start's mode and the algorithm preset's
parts. Making them looks at the machine (does vLLM import? does the device run bf16?) and builds an
environment, so it lives here, above the config (``agent_rl.config``), which only describes and
checks values."""

from __future__ import annotations

import copy
import importlib
from typing import Any, Callable

import torch

from agent_rl import envs
from agent_rl.config import Config, ConfigError, EnvConfig, resolve_algorithm, validate
from agent_rl.training.infra.distributed import bf16_supported, check_precision, resolve_device
from agent_rl.training.infra.env_calls import TimedCalls, failure


def vllm_available() -> bool:
    """Whether ``vllm`` imports in this environment (what ``engine=auto`` picks)."""
    try:
        importlib.import_module("vllm")
    except Exception:  # a broken install (e.g. CUDA-only torchvision) counts as absent
        return False
    return True


def make_configured_env(env: EnvConfig) -> Any:
    """``gymnasium.make(env.id, **env.kwargs)`` after importing ``env.imports``, within ``env.timeout_s``.
    An id that names no registered environment (or a ``module:`` that does not import), one that
    cannot run here (``envs.unavailable_reason``: a suite whose extra is missing), and an
    environment that refuses its kwargs, raises while it is built or passes the time limit, raise a
    :class:`ConfigError` naming the keys (and the error, with the user's frames)."""
    import gymnasium as gym

    try:
        envs.import_modules(env.imports)
        registered = envs.registry_id(env.id)
    except ImportError as exc:
        raise ConfigError(f"config key 'env.id' {env.id!r}: {exc}") from None
    if reason := envs.unavailable_reason(registered):
        raise ConfigError(f"config key 'env.id': {env.id!r} is not available here: {reason}")
    if registered not in gym.registry:
        raise ConfigError(
            f"config key 'env.id': unknown environment {env.id!r}; registered text environments: "
            f"{', '.join(envs.text_env_specs())} (gym.register it in a module and name it as module:{registered}, "
            "or import that module with env.imports=[module] or --import)"
        )
    try:
        with TimedCalls(env.timeout_s) as calls:
            return calls(lambda: envs.make_text_env(env.id, env.kwargs), "gymnasium.make")
    except Exception as exc:
        raise ConfigError(
            f"config keys 'env.id' and 'env.kwargs': gymnasium.make({env.id!r}, **{env.kwargs!r}) failed: "
            f"{failure(exc, 'gymnasium.make')}"
        ) from None


def probe_sft_mode(env: EnvConfig, make_env: Callable[[], Any] | None = None) -> str:
    """What ``sft.mode=auto`` warm-starts with: ``agent_rl.envs.auto_sft_mode`` of one environment from
    ``make_env`` (the trainer's environment factory, which takes it back when it has a ``keep(env)``
    method) or, without one, of :func:`make_configured_env`. Building and probing it is one call under
    ``env.timeout_s``; an environment that raises or hangs there is a :class:`ConfigError` that names
    the key, the error and the user's frames, and a hung one is abandoned."""

    def build_and_probe() -> tuple[Any, str]:
        probed = make_env() if make_env is not None else make_configured_env(env)
        return probed, envs.auto_sft_mode(probed)

    try:
        with TimedCalls(env.timeout_s) as calls:
            probed, mode = calls(build_and_probe, "auto_sft_mode")
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"config key 'sft.mode': auto chooses the warm start by probing one {env.id!r} environment (its "
            f"reset(seed=0), then its oracle() when it has one), and the environment failed: "
            f"{failure(exc, 'auto_sft_mode')}; fix it, or set sft.mode to oracle, random or none"
        ) from None
    envs.return_env(make_env, probed)
    return mode


def resolve(config: Config, make_env: Callable[[], Any] | None = None) -> Config:
    """A copy of ``config`` with every open choice made, once for every consumer:

    - ``engine.kind``: ``auto`` is ``vllm`` when it imports, else ``hf``;
    - ``policy.precision``: ``auto`` is ``bf16`` where ``policy.device`` runs it natively, else ``fp32``;
    - ``env.anchor_key``: None is the environment's registered default (after ``env.imports``);
    - ``sft.mode``: ``auto`` is :func:`probe_sft_mode`'s choice;
    - ``algo``: the preset's parts (:func:`resolve_algorithm`), with Dr.GRPO's ``norm_length`` set to
      ``rollout.max_new_tokens``.

    Resolving a resolved config changes nothing, so configs written before resolution existed (with
    ``auto`` and nulls) compare equal to their resolved form once resolved."""
    resolved = copy.deepcopy(config)
    if resolved.engine.kind == "auto":
        resolved.engine.kind = "vllm" if vllm_available() else "hf"
    if resolved.policy.precision == "auto":
        resolved.policy.precision = "bf16" if bf16_supported(resolve_device(resolved.policy.device)) else "fp32"
    if resolved.env.anchor_key is None:
        envs.import_modules(resolved.env.imports)
        resolved.env.anchor_key = envs.default_anchor_key(resolved.env.id)
    if resolved.sft.mode == "auto":
        resolved.sft.mode = probe_sft_mode(resolved.env, make_env)
    resolved.algo = resolve_algorithm(resolved.algo, norm_length=resolved.rollout.max_new_tokens)
    validate(resolved)
    return resolved


def report_choices(config: Config, resolved: Config, device: torch.device, say: Callable[[str], Any]) -> None:
    """Say (one line each) what :func:`resolve` chose for ``config``'s ``auto`` settings and why, then
    raise ``ConfigError`` when ``policy.precision`` cannot run on ``device``."""
    if config.sft.mode == "auto":
        say(f"sft.mode=auto chose {resolved.sft.mode}: {envs.AUTO_SFT_REASONS[resolved.sft.mode]}")
    if config.policy.precision == "auto":
        native = "runs" if resolved.policy.precision == "bf16" else "has no native"
        say(f"policy.precision=auto chose {resolved.policy.precision}: {device} {native} bfloat16 matrix products")
    try:
        check_precision(resolved.policy.precision, device)
    except ValueError as exc:
        raise ConfigError(f"config key 'policy.precision': {exc}") from None
