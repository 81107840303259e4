"""The shared machinery of agent-rl text environments.

A subclass implements the game: ``_new_game`` (seeded start), ``_apply`` (one normalized command),
``admissible_actions``, ``anchor``, ``oracle`` and, to hold evaluation instances out of training,
``instance_key``. This base class owns everything the DESIGN contract promises for every environment:
text spaces, action normalization (any string in, never an exception), the ``info`` keys, sparse
configurable rewards, the max-steps truncation, the behaviour after the episode ended and the split
of instances between training seeds (below ``EVAL_SEED_BASE``) and evaluation seeds.
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any, ClassVar

import gymnasium as gym
from gymnasium import spaces

# Printable ASCII plus the few typographic characters real game text uses. Observations are cleaned
# to this set so they always lie in the observation space.
TEXT_CHARSET = frozenset(string.printable) | frozenset("’‘“”—–…•·°×")
MAX_OBSERVATION_CHARS = 8192
MAX_ACTION_CHARS = 256
EVAL_SEED_BASE = 2**31
"""Reset seeds at or above this are evaluation seeds (``EVAL_SEED_BASE + i``); training seeds lie below."""
MAX_SPLIT_DRAWS = 1000
"""Instances a reset may draw before it gives up on reaching its seed's split."""


class EnvUnavailableError(RuntimeError):
    """An environment cannot run on this machine (a missing system dependency or data); the message
    says what is missing and how to get it."""


def step_won(info: dict[str, Any], terminated: bool, reward: float) -> bool:
    """Whether a step's result is a win: ``info["won"]``, or without the key, ending with a positive reward."""
    return bool(info.get("won", terminated and reward > 0))


def play_through(env: gym.Env, actions: Iterable[str]) -> tuple[list[str], bool]:
    """Step ``env`` from its current state through ``actions``, stopping where the episode ends: the
    actions played, and whether the last of them is a win (:func:`step_won`; no action played is none)."""
    played, won = [], False
    for action in actions:
        _, reward, terminated, truncated, info = env.step(action)
        played.append(action)
        won = step_won(info, terminated, float(reward))
        if terminated or truncated:
            break
    return played, won


def plays_to_a_win(env: gym.Env, actions: Iterable[str]) -> bool:
    """Whether stepping ``env`` through ``actions`` (:func:`play_through`) ends on a win."""
    return play_through(env, actions)[1]


def seed_split(seed: int | None) -> str:
    """The split a reset seed belongs to: ``"eval"`` from ``EVAL_SEED_BASE`` on, else ``"train"`` (also None)."""
    return "eval" if seed is not None and seed >= EVAL_SEED_BASE else "train"


def instance_split(instance_key: str) -> str:
    """The split an instance belongs to: one bit of a stable hash of its canonical key."""
    return "eval" if blake2b(instance_key.encode(), digest_size=1).digest()[0] & 1 else "train"


def normalize_action(action: Any) -> str:
    """Reduce raw model output to one command: first line, no control characters, single spaces,
    lower case, at most ``MAX_ACTION_CHARS`` characters. Non-strings become ``""``."""
    if not isinstance(action, str):
        return ""
    first_line = action.lstrip("\r\n").splitlines()[0] if action.strip() else ""
    printable = "".join(ch if ch.isprintable() else " " for ch in first_line[: 4 * MAX_ACTION_CHARS])
    return " ".join(printable.split()).lower()[:MAX_ACTION_CHARS]


def clean_observation(text: str) -> str:
    """Keep ``text`` inside the observation space: known characters only, bounded length."""
    cleaned = text if TEXT_CHARSET.issuperset(text) else "".join(ch if ch in TEXT_CHARSET else "?" for ch in text)
    if len(cleaned) > MAX_OBSERVATION_CHARS:
        cleaned = cleaned[: MAX_OBSERVATION_CHARS - 3] + "..."
    return cleaned


@dataclass
class Transition:
    """What a game returns for one normalized command."""

    observation: str
    valid: bool = True
    error: str | None = None
    terminated: bool = False
    reward: float | None = None
    """Extra shaped reward from the game on top of the base rewards (None = 0)."""


class TextEnv(gym.Env[str, str]):
    """Base class of every agent-rl text environment. See the module docstring."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"]}
    task: str = ""
    """Natural-language instruction of the current episode, shown to the policy in every prompt."""
    split: str = "train"
    """Split of the current episode, from its reset seed (see ``seed_split``)."""
    split_by_instance_key: ClassVar[bool] = True
    """Whether ``reset`` redraws until ``instance_split(instance_key())`` equals ``self.split``. An
    environment whose ``_new_game`` keeps the splits apart itself (reading ``self.split``) sets False."""

    def __init__(
        self,
        *,
        max_steps: int = 50,
        success_reward: float = 1.0,
        step_penalty: float = 0.0,
        invalid_action_penalty: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        if max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {max_steps}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        self.max_steps = int(max_steps)
        self.success_reward = float(success_reward)
        self.step_penalty = float(step_penalty)
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.render_mode = render_mode
        charset = "".join(sorted(TEXT_CHARSET))
        self.observation_space = spaces.Text(max_length=MAX_OBSERVATION_CHARS, min_length=0, charset=charset)
        self.action_space = spaces.Text(max_length=MAX_ACTION_CHARS, min_length=0, charset=charset)
        self._steps = 0
        self._finished = True
        self._won = False
        self._last_observation = ""

    # ---- to implement -------------------------------------------------------------------------
    def _new_game(self, options: dict[str, Any] | None) -> str:
        """Build the episode from ``self.np_random``; set ``self.task``; return the first observation."""
        raise NotImplementedError

    def _apply(self, command: str) -> Transition:
        """Apply one normalized command (possibly empty or unknown) and return what happened."""
        raise NotImplementedError

    def admissible_actions(self) -> list[str] | None:
        """The valid commands in the current state, or None where the action set is not finite."""
        raise NotImplementedError

    def anchor(self) -> str:
        """Canonical key of the current state: equal keys mean the same state."""
        raise NotImplementedError

    def oracle(self) -> list[str]:
        """A shortest (or walkthrough) command sequence that wins from the current state; an empty list
        when no winning plan is left from it (a dead state). The warm start ends a
        demonstration there, DAgger leaves such a turn unlabelled. An environment without oracle plans
        raises ``NotImplementedError``."""
        raise NotImplementedError

    def is_won(self) -> bool:
        """Whether the task is solved in the current state."""
        raise NotImplementedError

    def instance_key(self) -> str | None:
        """Canonical key of the whole instance of this episode, as generated: equal keys mean the same
        instance. The default None opts out of the held-out split; an environment that returns a key
        gets it: training seeds (and None) only ever reach instances whose key hashes to ``"train"``,
        evaluation seeds only those that hash to ``"eval"``."""
        return None

    # ---- the Gymnasium API ----------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._steps = 0
        self._finished = False
        self.split = seed_split(seed)
        # Redraws come from the seeded generator, so a seed still gives one instance.
        for _ in range(MAX_SPLIT_DRAWS):
            observation = self._new_game(options)
            key = self.instance_key() if self.split_by_instance_key else None
            if key is None or instance_split(key) == self.split:
                break
        else:
            name = self.spec.id if self.spec is not None else type(self).__name__
            raise RuntimeError(
                f"{name}: none of {MAX_SPLIT_DRAWS} generated instances falls in the {self.split} split; this "
                "configuration has too few distinct instances to hold evaluation instances out of training"
            )
        observation = clean_observation(observation)
        self._won = self.is_won()
        self._last_observation = observation
        return observation, self._info(valid=True, error=None)

    def step(self, action: Any):
        if self._finished:
            observation = "The episode is over. Call reset() to start a new one."
            return observation, 0.0, True, False, self._info(valid=False, error=None)
        command = normalize_action(action)
        transition = self._apply(command)
        self._steps += 1
        self._won = self.is_won()
        reward = -self.step_penalty + (transition.reward or 0.0)
        if not transition.valid:
            reward -= self.invalid_action_penalty
        terminated = bool(transition.terminated or self._won)
        if self._won:
            reward += self.success_reward
        truncated = not terminated and self._steps >= self.max_steps
        self._finished = terminated or truncated
        observation = clean_observation(transition.observation)
        self._last_observation = observation
        return observation, float(reward), terminated, truncated, self._info(transition.valid, transition.error)

    def render(self) -> str | None:
        if self.render_mode == "ansi":
            return self._last_observation
        return None

    def _info(self, valid: bool, error: str | None) -> dict[str, Any]:
        info: dict[str, Any] = {
            "anchor": self.anchor(),
            "action_valid": bool(valid),
            "error": error,
            "won": bool(self._won),
            "task": self.task,
            "steps": self._steps,
        }
        admissible = self.admissible_actions()
        if admissible is not None:
            info["admissible_actions"] = list(admissible)
        return info
