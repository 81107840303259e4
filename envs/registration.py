"""Registration of text environments: the bundled ones and any user or third-party ones.

``register_text_env`` registers with Gymnasium *and* records the metadata agent-rl needs (a one-line
description and the default anchor key). Third-party packages expose a zero-argument function under
the ``agent_rl.envs`` entry-point group; :func:`load_plugins` calls them all once. The third-party
suites (ScienceWorld, TextArena) are registered when their extras are installed; what is not
available here, and why, is listed by :func:`unavailable_envs`.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any, Callable

import gymnasium as gym

from agent_rl.core.presets import KEY_KINDS
from agent_rl.envs.base import EnvUnavailableError  # noqa: F401  (raised by the suites' environments, exported here)

NAMESPACE = "agent_rl"


@dataclass(frozen=True)
class TextEnvSpec:
    id: str
    description: str
    default_anchor: str
    kwargs: dict[str, Any] = field(default_factory=dict)


_TEXT_ENVS: dict[str, TextEnvSpec] = {}
_UNAVAILABLE: dict[str, str] = {}
_plugins_loaded = False


def register_text_env(
    id: str,
    entry_point: str | Callable[..., gym.Env],
    *,
    description: str,
    default_anchor: str = "state",
    **kwargs: Any,
) -> None:
    """Register a text environment under ``id`` (e.g. ``"myorg/Foo-v0"``).

    ``entry_point`` is ``"module:Class"`` or a callable; ``kwargs`` are the default constructor
    arguments, overridable in ``gymnasium.make(id, **overrides)``.
    """
    if default_anchor not in KEY_KINDS:
        raise ValueError(f"default_anchor must be one of {KEY_KINDS}, got {default_anchor!r}")
    if not description.strip():
        raise ValueError(f"register_text_env({id!r}): description must not be empty")
    # The TimeLimit/env-checker wrappers are not needed: TextEnv truncates by itself and
    # envs.check_text_env is the stricter checker.
    gym.register(id=id, entry_point=entry_point, kwargs=dict(kwargs), disable_env_checker=True)
    _TEXT_ENVS[id] = TextEnvSpec(
        id=id, description=" ".join(description.split()), default_anchor=default_anchor, kwargs=dict(kwargs)
    )


def register_bundled() -> None:
    """Register the environments that ship with agent-rl."""
    register_text_env(
        f"{NAMESPACE}/Maze-v0",
        "agent_rl.envs.maze:MazeEnv",
        description="Rooms on a graph with locked doors, keys and a goal item; loops and dead ends.",
        default_anchor="state",
    )
    register_text_env(
        f"{NAMESPACE}/Sokoban-v0",
        "agent_rl.envs.sokoban:SokobanEnv",
        description="Push every box onto a target on a procedurally generated, solvable text grid.",
        default_anchor="state",
    )
    register_text_env(
        f"{NAMESPACE}/TextWorld-v0",
        "agent_rl.envs.textworld_env:TextWorldEnv",
        description="Real TextWorld games (coin_collector, treasure_hunter, custom quests), generated offline.",
        default_anchor="state",
    )
    register_text_env(
        f"{NAMESPACE}/MiniCode-v0",
        "agent_rl.envs.minicode:MiniCodeEnv",
        description="Write a tiny stack-language program that passes hidden tests; compiler-style feedback.",
        default_anchor="fingerprint",
    )
    register_suites()


def register_suites() -> None:
    """Register the third-party suites whose extras are installed; record the others as unavailable.
    Neither suite is imported here: ``gymnasium.make`` imports it."""
    if importlib.util.find_spec("scienceworld") is not None:
        register_text_env(
            f"{NAMESPACE}/ScienceWorld-v0",
            "agent_rl.envs.scienceworld_env:ScienceWorldEnv",
            description="ScienceWorld's 30 science tasks (boil, grow a plant, build a circuit, ...) in its Java "
            "simulator; train/dev/test variations; gold-path oracle.",
            default_anchor="state",
        )
    else:
        _UNAVAILABLE[f"{NAMESPACE}/ScienceWorld-v0"] = "pip install 'agent-rl[scienceworld]' (it also needs Java)"
    if importlib.util.find_spec("textarena") is not None:
        from agent_rl.envs.textarena_env import register_textarena

        _UNAVAILABLE.update(register_textarena(register_text_env))
    else:
        _UNAVAILABLE["textarena/*"] = "pip install 'agent-rl[textarena]'"


def load_plugins() -> None:
    """Call every ``agent_rl.envs`` entry point once (the bundled set is one of them)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    register_bundled()
    for ep in entry_points(group="agent_rl.envs"):
        if ep.value == "agent_rl.envs.registration:register_bundled":
            continue
        try:
            ep.load()()
        except Exception as exc:  # a broken plugin must not hide the others
            raise RuntimeError(f"agent_rl.envs entry point {ep.name!r} ({ep.value}) failed: {exc}") from exc


def import_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Import user modules (``--import`` / ``env.imports``) whose import registers environments."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ImportError(f"could not import environment module {module!r}: {exc}") from exc


def registry_id(env_id: str) -> str:
    """The registry key of ``env_id``. Gymnasium's ``module:ns/Name-vN`` form imports ``module`` first
    (as ``gymnasium.make`` does; importing it registers the environment) and names ``ns/Name-vN``."""
    module, sep, name = env_id.partition(":")
    if not sep:
        return env_id
    import_modules([module])
    return name


def make_text_env(
    env_id: str, env_kwargs: dict[str, Any] | None = None, imports: list[str] | tuple[str, ...] = ()
) -> gym.Env:
    """``gymnasium.make(env_id, **env_kwargs)`` after registering the bundled envs, entry-point plugins
    and ``imports`` (``env_id`` may be ``module:ns/Name-vN``)."""
    import_modules(list(imports))
    load_plugins()
    return gym.make(env_id, **(env_kwargs or {}))


def return_env(make_env: Callable[[], gym.Env] | None, env: gym.Env) -> None:
    """Hand ``env``, looked at and no longer needed, back to the factory that built it when the
    factory keeps one for its next call (``agent_rl.training.serving.envpool.RegisteredEnv.keep``); else close it."""
    keep = getattr(make_env, "keep", None)
    if keep is not None:
        keep(env)
    else:
        env.close()


def text_env_specs() -> dict[str, TextEnvSpec]:
    """All registered text environments, bundled and plugins, by id."""
    load_plugins()
    return dict(sorted(_TEXT_ENVS.items()))


def unavailable_envs() -> dict[str, str]:
    """Ids (or id groups) that are not registered here, or registered only to explain why they cannot
    run, with the reason and the way to get them."""
    load_plugins()
    return dict(sorted(_UNAVAILABLE.items()))


def unavailable_reason(env_id: str) -> str | None:
    """Why ``env_id`` (a registry key) cannot run here and how to get it, from :func:`unavailable_envs`
    (its own entry, or its namespace's ``ns/*``); None when nothing is recorded against it."""
    left_out = unavailable_envs()
    return left_out.get(env_id) or left_out.get(env_id.split("/")[0] + "/*")


def default_anchor_key(env_id: str) -> str:
    """The anchor key kind registered for ``env_id`` (``register_text_env``; ``module:ns/Name-vN``
    imports ``module`` first); ``observation`` for any other environment (a plain Gymnasium env, or a
    label for a user's environment factory)."""
    name = registry_id(env_id)  # before the lookup: importing the module registers the environment
    spec = text_env_specs().get(name)
    return spec.default_anchor if spec is not None else "observation"


def text_env_spec(env_id: str) -> TextEnvSpec:
    specs = text_env_specs()
    if env_id not in specs:
        known = ", ".join(specs) or "none"
        raise KeyError(f"unknown text environment {env_id!r}; registered: {known}")
    return specs[env_id]
