"""Environment pools: the environments of a rollout, stepped as one batch, locally or on Ray actors.

Pools build their environments with an environment factory: any zero-argument callable returning a
Gymnasium text env. The episode loop reaches environments only through a pool's ``reset``, ``step``
and ``oracle`` on slot indices, so it runs unchanged on :class:`LocalEnvPool` (in-process) and :class:`RayEnvPool`
(environments spread over Ray actors, each actor holding a batch of them: one actor per
environment does not scale to hundreds of workers).

An environment that raises, or an actor that dies, never takes the rollout down: that slot returns
an :class:`EnvResult` (an :class:`OraclePlan` from ``oracle``) with ``failure`` set, and the collector
records the trajectory as failed. A dead actor is replaced by a fresh one, whose environments are
rebuilt on their next reset.

A call that hangs fails the same way once it passes the pool's time limit (``env.timeout_s``;
``agent_rl.training.infra.env_calls``): the pool stops waiting for it, abandons its environment
(rebuilt on the slot's next reset) and goes on. An actor that stops answering altogether (a call
stuck in native code that holds the GIL) is killed and replaced.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol, Sequence, runtime_checkable

import gymnasium as gym

from agent_rl.envs.oracle import has_oracle, oracle_actions
from agent_rl.envs.registration import make_text_env, return_env
from agent_rl.training.infra.env_calls import TimedCalls, build_env, failure
from agent_rl.training.infra.resolution import make_configured_env


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


@dataclass
class OraclePlan:
    """What one slot's ``oracle`` returned: a winning action sequence from its current state (empty:
    won, or no winning plan is left), or why the call failed."""

    actions: list[str] = field(default_factory=list)
    failure: str | None = None
    """Why the slot's oracle call failed (``"ExceptionType: message"``); the trajectory in it is lost."""


EnvFactory = Callable[[], gym.Env]
"""Any zero-argument callable returning a Gymnasium text environment (a class, a lambda, a
:class:`RegisteredEnv`)."""


@runtime_checkable
class EnvPool(Protocol):
    env_id: str
    """The environments' name, for progress displays."""
    n_envs: int
    has_oracle: bool
    """Whether the environments give oracle plans (``agent_rl.envs.has_oracle``)."""

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]: ...

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]: ...

    def oracle(self, slots: Sequence[int]) -> list[OraclePlan]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RegisteredEnv:
    """The factory of a registered environment: ``gymnasium.make(env_id, **kwargs)`` after importing
    ``imports`` (which register user environments). It pickles by value (without its spare), so Ray
    actors rebuild the same environments.

    It keeps one spare: an environment handed back with :meth:`keep` after a look (the config check,
    the ``sft.mode=auto`` choice, a pool's probe) is what the next call returns, so those looks cost
    one build in all, where an environment that starts a simulator (ScienceWorld's JVM) is slow to build."""

    env_id: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    imports: tuple[str, ...] = ()
    _spare: list[gym.Env] = field(default_factory=list, repr=False, compare=False)

    def __call__(self) -> gym.Env:
        if self._spare:
            return self._spare.pop()
        return make_text_env(self.env_id, self.kwargs, self.imports)

    def keep(self, env: gym.Env) -> None:
        """Hold ``env``, one of this factory's and no longer used, for the next call."""
        for old in self._spare:
            old.close()
        self._spare[:] = [env]

    def __reduce__(self):
        return RegisteredEnv, (self.env_id, self.kwargs, self.imports)


def env_factory(config) -> RegisteredEnv:
    """The factory of ``config.env``. Its first environment is built here, so an unknown ``env.id``
    or ``env.kwargs`` the environment refuses is a ``ConfigError`` naming the key before anything
    else starts (``agent_rl.training.infra.resolution.make_configured_env``); the factory keeps it as its spare."""
    factory = RegisteredEnv(config.env.id, dict(config.env.kwargs), tuple(config.env.imports))
    factory.keep(make_configured_env(config.env))
    return factory


def env_name(env: gym.Env) -> str:
    """The registered id of ``env``, or its class name."""
    return env.spec.id if env.spec is not None else type(env.unwrapped).__name__


REBUILT = "the environment was abandoned and is rebuilt on the next reset"
"""What becomes of a pool's environment whose call passed the time limit."""


class LocalEnvPool:
    """``n_envs`` environments from ``make_env`` in this process, each built on the first reset of
    its slot and reused. With ``timeout_s``, a ``reset`` (the build included), ``step`` or ``oracle``
    that takes longer fails its slot with a ``TimeoutError`` and its environment is abandoned (see the module
    docstring); ``abandoned`` counts those calls."""

    def __init__(self, make_env: EnvFactory, n_envs: int, *, timeout_s: float | None = None):
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        self._timed = TimedCalls(timeout_s, consequence=REBUILT)
        self.make_env, self.n_envs, self.timeout_s = make_env, n_envs, timeout_s
        self._envs: list[gym.Env | None] = [None] * n_envs
        probe = build_env(make_env, timeout_s)  # a factory that raises or hangs fails here, loudly
        self.env_id, self.has_oracle = env_name(probe), has_oracle(probe)
        return_env(make_env, probe)  # a RegisteredEnv gives it to slot 0

    @property
    def abandoned(self) -> int:
        """Calls that passed the time limit."""
        return self._timed.abandoned

    def _reset_slot(self, slot: int, seed: int) -> EnvResult:
        if self._envs[slot] is None:
            self._envs[slot] = self.make_env()
        env = self._envs[slot]
        observation, info = env.reset(seed=seed)
        info = dict(info)
        info.setdefault("task", str(getattr(env.unwrapped, "task", "")))
        return EnvResult(observation=observation, info=info)

    def _step_slot(self, slot: int, action: str) -> EnvResult:
        observation, reward, terminated, truncated, info = self._envs[slot].step(action)
        return EnvResult(observation, float(reward), bool(terminated), bool(truncated), info)

    def _oracle_slot(self, slot: int, _: None) -> OraclePlan:
        if self._envs[slot] is None:
            raise RuntimeError("the environment is gone (an earlier call of this episode failed)")
        return OraclePlan(oracle_actions(self._envs[slot]))

    def _each(
        self,
        call: str,
        fn: Callable[..., Any],
        slots: Sequence[int],
        values: Sequence[Any],
        failed: Callable[..., Any] = EnvResult,
    ) -> list[Any]:
        """``fn(slot, value)`` per slot; a slot whose call raises or times out answers
        ``failed(failure=...)`` and loses its environment, without stopping the others."""
        results = []
        for slot, value in zip(slots, values, strict=True):
            try:
                results.append(self._timed(functools.partial(fn, slot, value), call))
            except Exception as exc:
                self._envs[slot] = None
                results.append(failed(failure=failure(exc, call)))
        return results

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]:
        return self._each("reset", self._reset_slot, slots, [int(seed) for seed in seeds])

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]:
        return self._each("step", self._step_slot, slots, actions)

    def oracle(self, slots: Sequence[int]) -> list[OraclePlan]:
        """A winning plan from each slot's current state (``agent_rl.envs.oracle_actions``); an oracle
        that raises or hangs, or a slot whose environment is gone, fails its slot."""
        return self._each("oracle", self._oracle_slot, slots, [None] * len(slots), failed=OraclePlan)

    def close(self) -> None:
        for env in self._envs:
            if env is not None:
                try:
                    self._timed(env.close, "close")
                except Exception:  # closing is best effort; the data is already recorded
                    pass
        self._envs = [None] * self.n_envs
        self._timed.close()


@contextlib.contextmanager
def env_pool(envs: EnvPool | EnvFactory, n_envs: int, *, timeout_s: float | None = None) -> Iterator[EnvPool]:
    """``envs`` when it is a pool (checked to hold ``n_envs`` environments), else a local pool of
    ``n_envs`` environments from the factory ``envs``, with the call time limit ``timeout_s``, for
    the duration of the block."""
    if isinstance(envs, EnvPool):
        if envs.n_envs < n_envs:
            raise ValueError(f"the pool holds {envs.n_envs} {envs.env_id!r} environments; {n_envs} are needed")
        yield envs
        return
    local = LocalEnvPool(envs, n_envs, timeout_s=timeout_s)
    try:
        yield local
    finally:
        local.close()


class RayEnvPool:
    """``n_envs`` environments from ``make_env`` over ``n_actors`` Ray actors, each a
    :class:`LocalEnvPool` of a contiguous block of slots. Calls go to all actors at once and are
    gathered in slot order. ``make_env`` travels to the actors pickled (Ray's cloudpickle): a
    :class:`RegisteredEnv` rebuilds a registered environment there, importing its modules.

    ``address`` connects to a running cluster (``"auto"`` or ``"ray://host:port"``); ``None`` starts a
    local Ray (or reuses the one this process already started). ``timeout_s`` is each actor's call
    time limit (:class:`LocalEnvPool`); an actor that does not answer a batch of calls within that
    limit per call plus ``ACTOR_GRACE_S`` (``ACTOR_START_S`` for its first answer) is killed and
    replaced, failing its slots."""

    def __init__(
        self,
        make_env: EnvFactory,
        n_envs: int,
        *,
        n_actors: int = 2,
        address: str | None = None,
        num_cpus_per_actor: float = 1.0,
        init_kwargs: dict[str, Any] | None = None,
        timeout_s: float | None = None,
    ):
        import ray

        if n_envs < 1 or n_actors < 1:
            raise ValueError(f"n_envs and n_actors must be >= 1, got {n_envs} and {n_actors}")
        probe = build_env(make_env, timeout_s)  # a factory that raises or hangs fails here, not in an actor
        self.env_id, self.has_oracle = env_name(probe), has_oracle(probe)
        probe.close()
        if not ray.is_initialized():
            ray.init(address=address, include_dashboard=False, log_to_driver=False, **(init_kwargs or {}))
        self._ray = ray
        self.make_env, self.n_envs, self.timeout_s = make_env, n_envs, timeout_s
        n_actors = min(n_actors, n_envs)
        self._per_actor = -(-n_envs // n_actors)
        self._blocks = [
            range(start, min(start + self._per_actor, n_envs)) for start in range(0, n_envs, self._per_actor)
        ]
        self._actor_class = ray.remote(num_cpus=num_cpus_per_actor)(LocalEnvPool)
        self._actors = [self._new_actor(block) for block in self._blocks]
        self._started = [False] * len(self._actors)
        """Whether each actor has answered once: until then its process may still be starting."""
        self.restarts = 0
        """How many dead actors were replaced."""

    def _new_actor(self, block: range):
        return self._actor_class.remote(self.make_env, len(block), timeout_s=self.timeout_s)

    def _call(self, method: str, slots: Sequence[int], *columns: Sequence[Any], lost: Any) -> list[Any]:
        """``method(local slots, *columns)`` on every actor holding some of ``slots``; a dead
        actor's slots answer ``lost(message)``."""
        per_actor: dict[int, list[tuple[int, int, tuple]]] = {}
        for position, (slot, *values) in enumerate(zip(slots, *columns, strict=True)):
            actor = slot // self._per_actor
            per_actor.setdefault(actor, []).append((position, slot - self._blocks[actor].start, tuple(values)))
        calls = {
            actor: getattr(self._actors[actor], method).remote(
                [local for _, local, _ in calls], *([values[k] for _, _, values in calls] for k in range(len(columns)))
            )
            for actor, calls in per_actor.items()
        }
        results: list[Any] = [None] * len(slots)
        sent = time.monotonic()
        for actor, future in calls.items():
            deadline = (
                None
                if self.timeout_s is None
                else (
                    sent
                    + self.timeout_s * len(per_actor[actor])
                    + (ACTOR_GRACE_S if self._started[actor] else ACTOR_START_S)
                )
            )
            try:
                answers = self._ray.get(
                    future, timeout=None if deadline is None else max(deadline - time.monotonic(), 0.0)
                )
                self._started[actor] = True
            except (self._ray.exceptions.RayActorError, self._ray.exceptions.GetTimeoutError) as exc:
                # The actor (and its environments) are gone or stuck: fail its trajectories, start a new one.
                if isinstance(exc, self._ray.exceptions.GetTimeoutError):
                    self._ray.kill(self._actors[actor], no_restart=True)
                    why = (
                        f"TimeoutError: the environment actor gave no answer within {self.timeout_s:g} s per call "
                        f"(env.timeout_s) and was replaced (in {method}())"
                    )
                else:
                    why = f"environment actor died: {failure(exc, method)}"
                self.restarts += 1
                self._actors[actor], self._started[actor] = self._new_actor(self._blocks[actor]), False
                answers = [lost(why)] * len(per_actor[actor])
            for (position, _, _), answer in zip(per_actor[actor], answers):
                results[position] = answer
        return results

    def reset(self, slots: Sequence[int], seeds: Sequence[int]) -> list[EnvResult]:
        return self._call("reset", slots, [int(s) for s in seeds], lost=lambda message: EnvResult(failure=message))

    def step(self, slots: Sequence[int], actions: Sequence[str]) -> list[EnvResult]:
        return self._call("step", slots, list(actions), lost=lambda message: EnvResult(failure=message))

    def oracle(self, slots: Sequence[int]) -> list[OraclePlan]:
        return self._call("oracle", slots, lost=lambda message: OraclePlan(failure=message))

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


ACTOR_GRACE_S = 30.0
"""How much longer than its calls' time limits an environment actor may take to answer (Ray's own
latency)."""
ACTOR_START_S = 600.0
"""The same for an actor's first answer, which waits for its process to start (a free CPU, the
imports, its first environment)."""


def pool_from_config(make_env: EnvFactory, config) -> EnvPool:
    """The pool a training run keeps for its rollouts and evaluations: enough environments for
    either, in-process or on ``scale.env_actors`` Ray actors."""
    rollout, trainer, scale = config.rollout, config.trainer, config.scale
    n_envs = max(
        rollout.n_groups * rollout.group_size, trainer.eval_episodes
    )  # a confirmation plays eval_episodes at a time
    if scale.env_actors == 0:
        return LocalEnvPool(make_env, n_envs, timeout_s=config.env.timeout_s)
    return RayEnvPool(
        make_env,
        n_envs,
        n_actors=scale.env_actors,
        address=scale.ray_address,
        num_cpus_per_actor=scale.num_cpus_per_actor,
        timeout_s=config.env.timeout_s,
    )
