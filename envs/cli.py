"""``agent-rl envs`` (list the registered text environments) and ``agent-rl play`` (play one)."""

from __future__ import annotations

import sys
from typing import Any

import gymnasium as gym
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from agent_rl.envs.base import step_won
from agent_rl.envs.registration import (
    EnvUnavailableError,
    import_modules,
    registry_id,
    text_env_specs,
    unavailable_envs,
    unavailable_reason,
)

QUIT_COMMAND = ":quit"


def list_envs(imports: list[str] | tuple[str, ...] = ()) -> int:
    """Print every registered text environment with its one-line description."""
    try:
        import_modules(list(imports))
    except ImportError as exc:
        Console(stderr=True, soft_wrap=True).print(str(exc), style="red", markup=False)
        return 2
    table = Table(title="Registered text environments")
    table.add_column("id", overflow="fold")
    table.add_column("anchor")
    table.add_column("description")
    for spec in text_env_specs().values():
        table.add_row(escape(spec.id), spec.default_anchor, escape(spec.description))  # "[up]" is text, not markup
    console = Console()
    console.print(table)
    left_out = unavailable_envs()
    if left_out:
        missing = Table(title="Not available here")
        missing.add_column("id", overflow="fold")
        missing.add_column("why / how to get it")
        for env_id, reason in left_out.items():
            missing.add_row(escape(env_id), escape(reason))
        console.print(missing)
    return 0


def parse_env_kwargs(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``["n_rooms=12", "name=foo"]`` -> ``{"n_rooms": 12, "name": "foo"}`` (values read as YAML scalars)."""
    kwargs: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"environment argument {pair!r} is not of the form key=value")
        try:
            kwargs[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"environment argument {pair!r}: cannot read the value: {exc}") from None
    return kwargs


def play(
    env_id: str,
    seed: int = 0,
    imports: list[str] | tuple[str, ...] = (),
    env_kwargs: list[str] | tuple[str, ...] = (),
) -> int:
    """Play ``env_id`` in the terminal: show the observation and admissible actions, read commands
    from stdin until the episode ends, end of input, or ``:quit``. Returns the exit status."""
    console = Console(highlight=False, soft_wrap=True)
    errors = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        import_modules(list(imports))
        registered = registry_id(env_id)  # Gymnasium's module:ns/Name-vN form imports the module
    except ImportError as exc:
        errors.print(str(exc), style="red", markup=False)
        return 2
    reason = unavailable_reason(registered)
    if registered not in gym.registry or reason:
        known = ", ".join(text_env_specs())
        message = (
            f"{env_id} is not available here: {reason}"
            if reason
            else f"unknown text environment {env_id!r}; registered: {known}"
        )
        errors.print(message, style="red", markup=False)
        return 2
    try:
        env = gym.make(env_id, **parse_env_kwargs(env_kwargs))
    except (ValueError, TypeError, EnvUnavailableError) as exc:
        errors.print(f"cannot create {env_id}: {exc}", style="red", markup=False)
        return 2
    observation, info = env.reset(seed=seed)
    console.print(f"{env_id}  seed={seed}", style="bold", markup=False)
    if info.get("task"):
        console.print(f"Task: {info['task']}", style="cyan", markup=False)
    total_reward, steps = 0.0, 0
    while True:
        console.print(observation, markup=False)
        if "admissible_actions" in info:
            console.print("Actions: " + " | ".join(info["admissible_actions"]), style="dim", markup=False)
        console.print(f"[{steps}]> ", end="", markup=False)
        line = sys.stdin.readline()
        if not line or line.strip() == QUIT_COMMAND:
            console.print("\nbye", markup=False)
            return 0
        observation, reward, terminated, truncated, info = env.step(line.rstrip("\n"))
        total_reward, steps = total_reward + reward, steps + 1
        if terminated or truncated:
            console.print(observation, markup=False)
            outcome = "won" if step_won(info, terminated, reward) else ("out of steps" if truncated else "episode over")
            console.print(f"{outcome}: return {total_reward:g} after {steps} steps", style="bold", markup=False)
            return 0
