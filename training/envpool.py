"""Environment pools: the environments of a rollout, stepped as one batch, locally or on Ray actors.

The rollout collector reaches environments only through a pool's ``reset`` and ``step`` on slot
indices, so it runs unchanged on :class:`LocalEnvPool` (in-process) and :class:`RayEnvPool`
(environments spread over Ray actors, each actor holding a batch of them: one actor per
environment does not scale to hundreds of workers).

An environment that raises, or an actor that dies, never takes the rollout down: that slot returns
an :class:`EnvResult` with ``failure`` set, and the collector records the trajectory as failed. A
dead actor is replaced by a fresh one, whose environments are rebuilt on their next reset.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import gymnasium as gym


@dataclass
class EnvResult:
    """What one slot returned from ``reset`` (reward 0, not done) or ``step``."""

    observation: str = ""
    reward: float = 0.0
    terminated: bool = False
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    failure: str | None = None
    """Why the slot failed (``"ExceptionType: message"``); the trajectory in it is lost."""


class EnvPool(Protocol):
    env_id: str
    n_envs: int

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]: ...

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]: ...

    def close(self) -> None: ...


def make_text_env(env_id: str, env_kwargs: dict[str, Any] | None = None, imports: Sequence[str] = ()) -> gym.Env:
    """``gymnasium.make`` after registering the bundled envs, entry-point plugins and ``imports``."""
    import envs

    envs.import_modules(list(imports))
    envs.load_plugins()
    return gym.make(env_id, **(env_kwargs or {}))


def _failure(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()


class LocalEnvPool:
    """``n_envs`` environments in this process, each built on the first reset of its slot and reused."""

    def __init__(self, env_id: str, env_kwargs: dict[str, Any] | None, n_envs: int, imports: Sequence[str] = ()):
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        self.env_id, self.env_kwargs, self.imports = env_id, dict(env_kwargs or {}), tuple(imports)
        self.n_envs = n_envs
        self._envs: list[gym.Env | None] = [None] * n_envs
        make_text_env(env_id, self.env_kwargs, self.imports).close()  # a bad id or kwargs fail here, loudly

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]:
        results = []
        for slot, seed in zip(slots, seeds, strict=True):
            try:
                if self._envs[slot] is None:
                    self._envs[slot] = make_text_env(self.env_id, self.env_kwargs, self.imports)
                env = self._envs[slot]
                observation, info = env.reset(seed=int(seed))
                info = dict(info)
                info.setdefault("task", str(getattr(env.unwrapped, "task", "")))
                results.append(EnvResult(observation=observation, info=info))
            except Exception as exc:  # one broken environment must not stop the others
                self._envs[slot] = None
                results.append(EnvResult(failure=_failure(exc)))
        return results

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]:
        results = []
        for slot, action in zip(slots, actions, strict=True):
            try:
                observation, reward, terminated, truncated, info = self._envs[slot].step(action)
                results.append(EnvResult(observation, float(reward), bool(terminated), bool(truncated), info))
            except Exception as exc:
                self._envs[slot] = None
                results.append(EnvResult(failure=_failure(exc)))
        return results

    def close(self) -> None:
        for env in self._envs:
            if env is not None:
                try:
                    env.close()
                except Exception:  # closing is best effort; the data is already recorded
                    pass
        self._envs = [None] * self.n_envs


class RayEnvPool:
    """``n_envs`` environments over ``n_actors`` Ray actors, each a :class:`LocalEnvPool` of a
    contiguous block of slots. Calls go to all actors at once and are gathered in slot order.

    ``address`` connects to a running cluster (``"auto"`` or ``"ray://host:port"``); ``None`` starts a
    local Ray (or reuses the one this process already started)."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None,
        n_envs: int,
        *,
        n_actors: int = 2,
        imports: Sequence[str] = (),
        address: str | None = None,
        num_cpus_per_actor: float = 1.0,
        init_kwargs: dict[str, Any] | None = None,
    ):
        import ray

        if n_envs < 1 or n_actors < 1:
            raise ValueError(f"n_envs and n_actors must be >= 1, got {n_envs} and {n_actors}")
        make_text_env(env_id, env_kwargs, imports).close()  # a bad id or kwargs fail here, not in an actor
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        self._ray = ray
        self.env_id, self.env_kwargs, self.imports = env_id, dict(env_kwargs or {}), tuple(imports)
        self.n_envs = n_envs
        n_actors = min(n_actors, n_envs)
        self._per_actor = -(-n_envs // n_actors)
        self._blocks = [range(start, min(start + self._per_actor, n_envs)) for start in range(0, n_envs, self._per_actor)]
        self._actor_class = ray.remote(num_cpus=num_cpus_per_actor)(LocalEnvPool)
        self._actors = [self._new_actor(block) for block in self._blocks]
        self.restarts = 0
        """How many dead actors were replaced."""

    def _new_actor(self, block: range):
        return self._actor_class.remote(self.env_id, self.env_kwargs, len(block), self.imports)

    def _call(self, method: str, slots: Sequence[int], values: Sequence[Any]) -> list[EnvResult]:
        per_actor: dict[int, list[tuple[int, int, Any]]] = {}
        for position, (slot, value) in enumerate(zip(slots, values, strict=True)):
            actor = slot // self._per_actor
            per_actor.setdefault(actor, []).append((position, slot - self._blocks[actor].start, value))
        futures = {
            actor: getattr(self._actors[actor], method).remote([s for _, s, _ in calls], [v for _, _, v in calls])
            for actor, calls in per_actor.items()
        }
        results: list[EnvResult | None] = [None] * len(slots)
        for actor, future in futures.items():
            try:
                answers = self._ray.get(future)
            except self._ray.exceptions.RayActorError as exc:
                # The actor (and its environments) are gone: fail its trajectories, start a new one.
                self.restarts += 1
                self._actors[actor] = self._new_actor(self._blocks[actor])
                answers = [EnvResult(failure=f"environment actor died: {_failure(exc)}")] * len(per_actor[actor])
            for (position, _, _), answer in zip(per_actor[actor], answers):
                results[position] = answer
        return results

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]:
        return self._call("reset", slots, [int(s) for s in seeds])

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]:
        return self._call("step", slots, list(actions))

    def kill_actor(self, index: int, timeout_s: float = 30.0) -> None:
        """Kill one actor (a failure drill for tests and operators) and wait until it is gone: a kill
        is asynchronous, and a call sent before it lands would still be served. The next call
        replaces the actor."""
        actor = self._actors[index]
        self._ray.kill(actor, no_restart=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                self._ray.get(actor.__ray_ready__.remote(), timeout=max(deadline - time.monotonic(), 0.0))
            except self._ray.exceptions.RayActorError:
                return
            except self._ray.exceptions.GetTimeoutError:
                break
            time.sleep(0.05)
        raise TimeoutError(f"environment actor {index} was still alive {timeout_s} s after ray.kill")

    def close(self) -> None:
        for actor in self._actors:
            try:
                self._ray.get(actor.close.remote())
                self._ray.kill(actor)
            except self._ray.exceptions.RayActorError:
                pass
        self._actors = []
