"""Bundled Gymnasium text environments, their registration, oracles and the text-env checker.

Importing ``envs`` registers ``agent_rl/Maze-v0``, ``agent_rl/Sokoban-v0``, ``agent_rl/TextWorld-v0``
and ``agent_rl/MiniCode-v0``, the third-party suites whose extras are installed
(``agent_rl/ScienceWorld-v0``, ``textarena/<game>``) and every ``agent_rl.envs`` entry-point plugin
with Gymnasium. Reset seeds from ``EVAL_SEED_BASE`` on are evaluation seeds: they never reach a
training instance.
"""

from agent_rl.envs.base import (
    EVAL_SEED_BASE,
    TextEnv,
    Transition,
    instance_split,
    normalize_action,
    play_through,
    plays_to_a_win,
    seed_split,
    step_won,
)
from agent_rl.envs.checker import CheckReport, TextEnvCheckError, check_text_env
from agent_rl.envs.oracle import AUTO_SFT_REASONS, auto_sft_mode, has_oracle, oracle_actions
from agent_rl.envs.registration import (
    EnvUnavailableError,
    TextEnvSpec,
    default_anchor_key,
    import_modules,
    load_plugins,
    make_text_env,
    register_text_env,
    registry_id,
    return_env,
    text_env_spec,
    text_env_specs,
    unavailable_envs,
    unavailable_reason,
)

load_plugins()

__all__ = [
    "EVAL_SEED_BASE",
    "instance_split",
    "seed_split",
    "play_through",
    "plays_to_a_win",
    "step_won",
    "CheckReport",
    "EnvUnavailableError",
    "TextEnvCheckError",
    "check_text_env",
    "AUTO_SFT_REASONS",
    "auto_sft_mode",
    "has_oracle",
    "oracle_actions",
    "TextEnv",
    "Transition",
    "normalize_action",
    "TextEnvSpec",
    "default_anchor_key",
    "import_modules",
    "load_plugins",
    "make_text_env",
    "register_text_env",
    "registry_id",
    "return_env",
    "text_env_spec",
    "text_env_specs",
    "unavailable_envs",
    "unavailable_reason",
]
