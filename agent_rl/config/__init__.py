"""Typed training configuration: one dataclass per component, loadable from YAML, overridable with
``key=value`` on the command line.

Resolution order: dataclass defaults (the library's: the learner's measured settings, and neutral
ones for anything that belongs to an environment) <- a YAML file or bundled recipe (``maze``, the
main job, is what ``agent-rl train`` runs when given none: :func:`load_default_config`) <-
command-line overrides. Dotted keys address fields
(``trainer.iterations=50``); values are parsed with ``yaml.safe_load`` (``true``, ``1e-4``,
``[a, b]``). A section name with a plain value sets that section's shorthand field:
``env=ID`` is ``env.id=ID``, ``algo=gigpo`` is ``algo.preset=gigpo``, ``engine=hf`` is
``engine.kind=hf``, ``policy=PATH`` is ``policy.name_or_path=PATH``. Free-form dict fields take
dotted sub-keys (``env.kwargs.max_steps=40``). Unknown keys and invalid values raise
:class:`ConfigError` naming the key.

A module per concern: :mod:`.schema` (the dataclasses), :mod:`.loading` (files, overrides, types)
and :mod:`.validation` (every value check). The config describes and checks values and does no
runtime work: it imports only the core (numpy), never torch, an environment or ``training``.
The choices a config leaves open (``engine=auto``, the environment's default anchor key,
``sft.mode=auto``, the algorithm preset's parts) are made by ``agent_rl.training.infra.resolution.resolve``, which
looks at the machine and builds an environment.
"""

from agent_rl.config.loading import (
    DEFAULT_RECIPE,
    config_from_dict,
    config_to_dict,
    load_config,
    load_default_config,
    parse_override,
    resolve_config_path,
    save_config,
)
from agent_rl.config.schema import (
    ACTION_PARSERS,
    PRECISIONS,
    RESPELLED,
    SFT_MODES,
    AlgorithmConfig,
    Config,
    ConfigError,
    EngineConfig,
    EnvConfig,
    LoggingConfig,
    OptimizerConfig,
    PolicyConfig,
    RolloutConfig,
    ScaleConfig,
    SFTConfig,
    TrainerConfig,
    respelled,
)
from agent_rl.config.validation import check_rollout, resolve_algorithm, validate
from agent_rl.core.presets import ALGORITHM_PRESETS, LOSS_KWARGS, LOSS_PRESETS

__all__ = [
    "ACTION_PARSERS",
    "ALGORITHM_PRESETS",
    "DEFAULT_RECIPE",
    "LOSS_KWARGS",
    "LOSS_PRESETS",
    "PRECISIONS",
    "RESPELLED",
    "SFT_MODES",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "EngineConfig",
    "EnvConfig",
    "LoggingConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "RolloutConfig",
    "SFTConfig",
    "ScaleConfig",
    "TrainerConfig",
    "check_rollout",
    "config_from_dict",
    "config_to_dict",
    "load_config",
    "load_default_config",
    "parse_override",
    "resolve_algorithm",
    "resolve_config_path",
    "respelled",
    "save_config",
    "validate",
]
