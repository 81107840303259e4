"""``check_text_env``: does an environment keep the agent-rl text-environment contract?

It runs, in order: Gymnasium's own ``check_env``; the ``info`` contract on every transition; per-seed
determinism (a second reset and a replay of the same actions must give identical trajectories); and a
fuzz pass of hostile actions, each under a time limit, after which a valid action must still work.
The first failure raises :class:`TextEnvCheckError` naming the check.
"""

from __future__ import annotations

import random
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from agent_rl.envs.base import normalize_action
from agent_rl.envs.oracle import oracle_actions

HOSTILE_ACTIONS: tuple[Any, ...] = (
    "",
    " ",
    "\t \t",
    "\n",
    "\x00",
    "\x1b[2J",
    "\x7f",
    "look\nquit",
    "quit\nlook",
    "\r\n\r\n",
    "x" * 100_000,
    "go " * 40_000,
    "🙂🙂🙂",
    "走 北",
    "去北边",
    "שלום עולם",
    "\u202edlrow olleh",
    "ñøřţħ",
    "\ufeff\u200b",
    "quit",
    "restart",
    "save",
    "load",
    "undo",
    "restore",
    "script",
    "unscript",
    "verbose",
    "brief",
    "#",
    "# comment",
    "/quit",
    "*",
    ";",
    "*save",
    "$",
    "!",
    "\\",
    "%s%s%s",
    "{}",
    "]]",
    None,
    123,
    4.5,
    b"look",
    ["look"],
    {"action": "look"},
)
"""Actions no environment may crash or hang on. None of them is a valid game command."""

INFO_TYPES: dict[str, tuple[type, ...]] = {
    "anchor": (str,),
    "action_valid": (bool,),
    "error": (str, type(None)),
    "won": (bool,),
}
"""The ``info`` keys of the contract and their types. A key an environment never sets is no failure
(the trainer falls back: anchor = the observation, action_valid = True, error = None, won =
terminated with a positive reward); the report lists it in ``missing_info``."""


class TextEnvCheckError(AssertionError):
    """A contract check failed; ``check`` names which one."""

    def __init__(self, check: str, message: str) -> None:
        self.check = check
        super().__init__(f"[{check}] {message}")


class _StepTimeout(BaseException):
    """Raised by the alarm inside a hanging step; a BaseException so env code cannot swallow it."""


@dataclass
class CheckReport:
    """What ``check_text_env`` verified."""

    env_id: str | None
    """The registered id, when the environment has a spec."""
    checks: list[str] = field(default_factory=list)
    """The checks that passed, in order."""
    steps: int = 0
    """Environment steps taken by the determinism and fuzz checks."""
    fuzz_actions: int = 0
    """Hostile actions sent."""
    slowest_fuzz_step_s: float = 0.0
    """Wall time of the slowest fuzz step."""
    missing_info: list[str] = field(default_factory=list)
    """Contract ``info`` keys (``INFO_TYPES``) absent after the first reset: the trainer's fallbacks apply."""


def check_text_env(
    env_or_id: gym.Env | str,
    *,
    seeds: tuple[int, ...] = (0, 1, 2),
    fuzz_time_limit: float = 2.0,
    n_steps: int = 30,
    env_kwargs: dict[str, Any] | None = None,
) -> CheckReport:
    """Check an environment (instance or registered id) against the agent-rl text-env contract.

    Args:
        env_or_id: an environment, possibly wrapped, or an id for ``gymnasium.make``.
        seeds: reset seeds of the determinism check; the fuzz pass uses the first.
        fuzz_time_limit: seconds one fuzz step may take.
        n_steps: steps per determinism rollout.
        env_kwargs: constructor arguments when ``env_or_id`` is an id.
    """
    if not seeds:
        raise ValueError("seeds must not be empty")
    if fuzz_time_limit <= 0:
        raise ValueError(f"fuzz_time_limit must be > 0, got {fuzz_time_limit}")
    if isinstance(env_or_id, str):
        env = gym.make(env_or_id, **(env_kwargs or {}))
    elif env_kwargs:
        raise ValueError("env_kwargs only apply when env_or_id is an environment id")
    else:
        env = env_or_id
    env = env.unwrapped
    report = CheckReport(env_id=env.spec.id if env.spec is not None else None)

    try:
        check_env(env, skip_render_check=True)
    except Exception as exc:  # any failure of gymnasium's checker is this check failing
        raise TextEnvCheckError("gymnasium_check_env", f"{type(exc).__name__}: {exc}") from exc
    report.checks.append("gymnasium_check_env")

    for seed in seeds:
        first = _rollout(env, seed, n_steps, actions=None)
        if seed == seeds[0]:  # the contract keys the environment sets, read off its first reset
            report.missing_info = [key for key in INFO_TYPES if key not in first[0][2]]
        actions = [step[0] for step in first[1:]]
        second = _rollout(env, seed, n_steps, actions=actions)
        report.steps += 2 * len(actions)
        for t, (a, b) in enumerate(zip(first, second)):
            if a != b:
                where = "reset" if t == 0 else f"step {t} (action {actions[t - 1]!r})"
                raise TextEnvCheckError("determinism", f"seed {seed}: {where} differs between two identical runs")
    report.checks += ["info_contract", "determinism"]

    _fuzz(env, seeds[0], fuzz_time_limit, report)
    report.checks += ["fuzz", "usable_after_fuzz"]
    return report


def _rollout(env: gym.Env, seed: int, n_steps: int, actions: list[Any] | None) -> list[tuple]:
    """Reset with ``seed`` and step ``actions`` (or seeded choices); return every transition."""
    observation, info = env.reset(seed=seed)
    _check_transition(env, "reset", observation, info)
    trajectory: list[tuple] = [(None, observation, info)]
    chooser = random.Random(seed)
    fallback = [] if "admissible_actions" in info else _fallback_actions(env)
    for t in range(n_steps if actions is None else len(actions)):
        if actions is not None:
            action = actions[t]
        else:
            action = chooser.choice(info.get("admissible_actions") or fallback)
        observation, reward, terminated, truncated, info = env.step(action)
        _check_transition(env, f"step {t + 1} ({action!r})", observation, info, reward, terminated, truncated)
        trajectory.append((action, observation, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return trajectory


def _fallback_actions(env: gym.Env) -> list[str]:
    """Actions for an environment without an admissible list (call right after reset): the oracle's
    first step, when it has an oracle, and some junk."""
    try:
        plan = oracle_actions(env)
    except (TypeError, NotImplementedError):
        plan = []
    return [*plan[:1], "look", "help", "1 2 +"]


def _check_transition(
    env: gym.Env,
    where: str,
    observation: Any,
    info: Any,
    reward: Any = 0.0,
    terminated: Any = False,
    truncated: Any = False,
) -> None:
    if not isinstance(observation, str) or observation not in env.observation_space:
        raise TextEnvCheckError(
            "info_contract", f"{where}: observation {observation!r:.200} is not in the observation space"
        )
    if not isinstance(info, dict):
        raise TextEnvCheckError("info_contract", f"{where}: info is {type(info).__name__}, not dict")
    for key, types in INFO_TYPES.items():
        if key in info and not isinstance(info[key], types):
            raise TextEnvCheckError(
                "info_contract", f"{where}: info[{key!r}] is {type(info[key]).__name__}, expected {types[0].__name__}"
            )
    admissible = info.get("admissible_actions")
    if admissible is not None and not (isinstance(admissible, list) and all(isinstance(a, str) for a in admissible)):
        raise TextEnvCheckError("info_contract", f"{where}: info['admissible_actions'] must be a list of str")
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise TextEnvCheckError("info_contract", f"{where}: reward is {type(reward).__name__}, not float")
    if not isinstance(terminated, bool) or not isinstance(truncated, bool):
        raise TextEnvCheckError("info_contract", f"{where}: terminated/truncated must be bool")


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    """Interrupt a hanging step after ``seconds`` (main thread on POSIX only; elsewhere only timed)."""
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_alarm(signum: int, frame: Any) -> None:
        raise _StepTimeout

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _fuzz(env: gym.Env, seed: int, time_limit: float, report: CheckReport) -> None:
    observation, info = env.reset(seed=seed)
    fallback = [] if "admissible_actions" in info else _fallback_actions(env)
    for action in HOSTILE_ACTIONS:
        where = f"fuzz action {action!r:.40}"
        admissible_before = info.get("admissible_actions")
        start = time.perf_counter()
        try:
            with _alarm(2 * time_limit):
                observation, reward, terminated, truncated, info = env.step(action)
        except _StepTimeout:
            raise TextEnvCheckError("fuzz", f"{where}: step did not return within {2 * time_limit:g} s") from None
        except Exception as exc:
            raise TextEnvCheckError("fuzz", f"{where}: step raised {type(exc).__name__}: {exc}") from exc
        elapsed = time.perf_counter() - start
        report.fuzz_actions += 1
        report.steps += 1
        report.slowest_fuzz_step_s = max(report.slowest_fuzz_step_s, elapsed)
        if elapsed > time_limit:
            raise TextEnvCheckError("fuzz", f"{where}: step took {elapsed:.3f} s (limit {time_limit:g} s)")
        _check_transition(env, where, observation, info, reward, terminated, truncated)
        if (
            admissible_before is not None
            and normalize_action(action) not in admissible_before
            and info.get("action_valid", True)
        ):
            raise TextEnvCheckError("fuzz", f"{where}: not an admissible action, yet info['action_valid'] is True")
        if terminated or truncated:
            observation, info = env.reset(seed=seed)
    # The environment must still play normally after all that.
    admissible = info.get("admissible_actions")
    action = admissible[0] if admissible else (fallback or _fallback_actions(env))[0]
    observation, reward, terminated, truncated, info = env.step(action)
    report.steps += 1
    _check_transition(env, f"valid action {action!r} after the fuzz", observation, info, reward, terminated, truncated)
    if admissible and not info.get("action_valid", True):
        raise TextEnvCheckError("usable_after_fuzz", f"admissible action {action!r} was rejected after the fuzz pass")
