"""Environment pools: local and Ray pools step the same environments the same way and survive failures."""

from __future__ import annotations

import functools
import threading
import time

import gymnasium as gym
import numpy as np
import pytest

from agent_rl.config import RolloutConfig
from agent_rl.envs import register_text_env
from agent_rl.training.infra.env_calls import EnvBuildError, failure_kind
from agent_rl.training.loop.rollout import collect_rollouts
from agent_rl.training.serving.envpool import LocalEnvPool, OraclePlan, RayEnvPool, RegisteredEnv


class FlakyEnv(gym.Env):
    """Raises in reset for odd seeds and in its second step for seeds divisible by 4."""

    observation_space = gym.spaces.Text(max_length=64)
    action_space = gym.spaces.Text(max_length=64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        if seed % 2:
            raise RuntimeError(f"reset exploded for seed {seed}")
        self.seed_value, self.t = seed, 0
        return f"start {seed}", {"anchor": "0", "action_valid": True, "error": None, "won": False}

    def step(self, action):
        self.t += 1
        if self.seed_value % 4 == 0 and self.t == 2:
            raise ValueError("step exploded")
        return (
            f"t={self.t}",
            0.0,
            self.t >= 3,
            False,
            {"anchor": str(self.t), "action_valid": True, "error": None, "won": False},
        )


register_text_env("test_pool/Flaky-v0", FlakyEnv, description="Raises on some seeds; a test env.")


def test_local_pool_isolates_failures_and_rebuilds_environments():
    pool = LocalEnvPool(RegisteredEnv("test_pool/Flaky-v0"), 3)
    first = pool.reset([0, 1, 2], [2, 3, 4])
    assert [r.failure is None for r in first] == [True, False, True]
    assert "RuntimeError: reset exploded for seed 3" in first[1].failure
    assert first[0].observation == "start 2" and first[0].info["task"] == ""
    steps = pool.step([0, 2], ["a", "a"])
    assert all(r.failure is None and r.observation == "t=1" for r in steps)
    steps = pool.step([0, 2], ["a", "a"])
    assert steps[0].failure is None and "ValueError: step exploded" in steps[1].failure
    # Each failure names the call and where the environment raised, outside the pool's own frames.
    reset_line = FlakyEnv.reset.__code__.co_firstlineno + 3
    step_line = FlakyEnv.step.__code__.co_firstlineno + 3
    assert (
        first[1].failure
        == f"RuntimeError: reset exploded for seed 3 (in reset(); at test_envpool.py:{reset_line} in reset)"
    )
    assert steps[1].failure == f"ValueError: step exploded (in step(); at test_envpool.py:{step_line} in step)"
    assert failure_kind(first[1].failure) == f"RuntimeError (in reset(); at test_envpool.py:{reset_line} in reset)"
    seed_5 = pool.reset([1], [5])[0].failure
    assert seed_5 != first[1].failure and failure_kind(seed_5) == failure_kind(
        first[1].failure
    )  # same kind, other values
    # The failed slot gets a fresh environment on its next reset.
    again = pool.reset([1, 2], [6, 6])
    assert all(r.failure is None and r.observation == "start 6" for r in again)
    pool.close()


def test_local_pool_rejects_bad_ids_up_front():
    failed = r"^the environment factory failed: gymnasium\.error\.NameNotFound: .*Missing.* \(in make_env\(\)\)$"
    with pytest.raises(EnvBuildError, match=failed):
        LocalEnvPool(RegisteredEnv("test_pool/Missing-v0"), 1)
    with pytest.raises(ValueError, match="n_envs"):
        LocalEnvPool(RegisteredEnv("test_pool/Flaky-v0"), 0)


def test_local_pool_gives_oracle_plans_from_the_current_state():
    from agent_rl import envs

    pool = LocalEnvPool(RegisteredEnv("agent_rl/Maze-v0", {"n_rooms": 4, "n_locked_doors": 1}), 2)
    assert pool.has_oracle and pool.env_id == "agent_rl/Maze-v0"
    pool.reset([0, 1], [5, 6])
    plans = pool.oracle([1, 0])
    reference = envs.oracle_actions  # the same plan as the environment's own oracle from the same state
    direct = [RegisteredEnv("agent_rl/Maze-v0", {"n_rooms": 4, "n_locked_doors": 1})() for _ in range(2)]
    for env, seed, plan in zip(direct, (6, 5), plans):
        env.reset(seed=seed)
        assert plan.failure is None and plan.actions == reference(env) and plan.actions
    pool.step([0], [plans[1].actions[0]])
    assert len(pool.oracle([0])[0].actions) == len(plans[1].actions) - 1
    pool.close()


class ReplayEngine:
    """Deterministic stand-in for a policy: answers every prompt with the same token ids."""

    def __init__(self, token_ids):
        self.token_ids = token_ids

    def generate(self, prompts_token_ids, n, sampling):
        from agent_rl.training.serving.engines import Completion

        return [[Completion(list(self.token_ids), [-0.5] * len(self.token_ids), "stop")] * n for _ in prompts_token_ids]


@pytest.fixture(scope="module")
def tokenizer():
    from agent_rl.training.models.policy import load_policy

    return load_policy("embedded")[1]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_pool_gives_the_same_rollouts_as_the_local_pool(ray_local, tokenizer):
    engine = ReplayEngine(tokenizer.encode("go north", add_special_tokens=False) + [tokenizer.eos_token_id])
    config = RolloutConfig(n_groups=3, group_size=2, max_turns=4, max_new_tokens=8)
    env_kwargs = {"n_rooms": 5, "n_locked_doors": 1}
    make_env = RegisteredEnv("agent_rl/Maze-v0", env_kwargs)
    local, local_stats = collect_rollouts(make_env, engine, tokenizer, config, np.random.default_rng(7))
    pool = RayEnvPool(make_env, 6, n_actors=2)
    try:
        remote, remote_stats = collect_rollouts(pool, engine, tokenizer, config, np.random.default_rng(7))
        same_pool = LocalEnvPool(make_env, 6)
        for envs_ in (pool, same_pool):
            envs_.reset([0, 5], [11, 12])
        assert pool.oracle([0, 5]) == same_pool.oracle([0, 5]) and pool.has_oracle
    finally:
        pool.close()
    assert len(local) == len(remote) > 0
    assert local.observation == remote.observation and local.action == remote.action
    np.testing.assert_array_equal(local.reward, remote.reward)
    np.testing.assert_array_equal(local.traj_id, remote.traj_id)
    assert all(np.array_equal(a, b) for a, b in zip(local.prompt_ids, remote.prompt_ids))
    assert local_stats["success_rate"] == remote_stats["success_rate"]


@pytest.mark.ray
@pytest.mark.slow
def test_ray_pool_recovers_a_killed_actor(ray_local):
    with pytest.raises(EnvBuildError, match="n_locked_doors"):
        RayEnvPool(RegisteredEnv("agent_rl/Maze-v0", {"n_rooms": 4, "n_locked_doors": 2}), 4)
    pool = RayEnvPool(RegisteredEnv("agent_rl/Maze-v0", {"n_rooms": 4, "n_locked_doors": 1}), 4, n_actors=2)
    try:
        assert all(r.failure is None for r in pool.reset(range(4), [1, 1, 2, 2]))
        pool.kill_actor(1)
        results = pool.step(range(4), ["look"] * 4)
        assert [r.failure is None for r in results] == [True, True, False, False]
        assert "environment actor died" in results[2].failure
        assert pool.restarts == 1
        # The replacement actor serves its slots again after a reset.
        assert all(r.failure is None for r in pool.reset(range(4), [3, 3, 4, 4]))
        assert all(r.failure is None for r in pool.step(range(4), ["look"] * 4))
    finally:
        pool.close()


class CountedEnv(FlakyEnv):
    """FlakyEnv that counts how often it is built, and lists admissible actions (sft.mode=auto: random)."""

    built = 0

    def __init__(self):
        type(self).built += 1

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed, options=options)
        return observation, {**info, "admissible_actions": ["a"]}


register_text_env("test_pool/Counted-v0", CountedEnv, description="Counts its builds; a test env.")


def test_the_config_check_the_sft_choice_and_the_probe_build_one_environment():
    import pickle

    from agent_rl.config import load_config
    from agent_rl.training.infra.resolution import resolve
    from agent_rl.training.serving.envpool import env_factory

    config = load_config(overrides=["env=test_pool/Counted-v0", "sft.mode=auto", "engine=hf"])
    CountedEnv.built = 0
    factory = env_factory(config)  # checks env.id and env.kwargs by building one
    resolved = resolve(config, factory)  # sft.mode=auto looks at one
    pool = LocalEnvPool(factory, 3)  # and so does the pool's probe
    assert resolved.sft.mode == "random" and CountedEnv.built == 1
    assert all(r.failure is None for r in pool.reset([0, 1, 2], [0, 2, 4]))
    assert CountedEnv.built == 3  # slot 0 got the spare
    pool.close()
    # Ray actors receive the factory pickled: without its spare, equal to the original.
    factory.keep(CountedEnv())
    copy = pickle.loads(pickle.dumps(factory))
    assert copy == factory and copy._spare == [] and len(factory._spare) == 1


@pytest.fixture(scope="module")
def faulty():
    """tests/faulty_env_example, loaded from its file without putting tests/ on the path."""
    import importlib.util
    import sys
    from pathlib import Path

    if "faulty_env_example" not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            "faulty_env_example", Path(__file__).parents[1] / "faulty_env_example.py"
        )
        module = sys.modules["faulty_env_example"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules["faulty_env_example"]


def test_a_step_over_the_time_limit_fails_its_slot_and_the_pool_goes_on(faulty):
    pool = LocalEnvPool(functools.partial(faulty.Lever, fault="hang_at_2"), 2, timeout_s=0.2)
    assert all(r.failure is None for r in pool.reset([0, 1], [0, 1]))
    assert all(r.failure is None for r in pool.step([0, 1], ["pull", "pull"]))  # turn 1 answers
    assert all(r.failure is None for r in pool.reset([1], [2]))  # slot 1 starts again, at turn 0
    hung, answered = pool.step([0, 1], ["pull", "pull"])
    assert hung.failure == (
        "TimeoutError: step() gave no answer within 0.2 s (env.timeout_s); the environment was "
        "abandoned and is rebuilt on the next reset (in step())"
    )
    assert answered.failure is None and answered.observation == "Click."
    assert pool.abandoned == 1 and pool._envs[0] is None
    # The slot gets a new environment, served by a new call thread.
    again = pool.reset([0], [3])[0]
    assert again.failure is None and pool.step([0], ["pull"])[0].observation == "Click."
    # Closing ends the call thread; a closed pool that is used again starts another.
    serving = [t for t in threading.enumerate() if t.name == "agent-rl-env-calls"]
    pool.close()
    time.sleep(0.05)
    assert len([t for t in threading.enumerate() if t.name == "agent-rl-env-calls"]) == len(serving) - 1
    assert pool.reset([1], [4])[0].failure is None
    pool.close()


def test_an_oracle_that_raises_or_hangs_fails_its_slot_and_the_pool_goes_on(faulty):
    raises = LocalEnvPool(functools.partial(faulty.PlannedLever, fault="oracle_raises"), 1)
    raises.reset([0], [0])
    line = faulty.PlannedLever.oracle.__code__.co_firstlineno + 2
    assert raises.oracle([0]) == [
        OraclePlan(
            failure=f"RuntimeError: {faulty.ORACLE_CRASH} (in oracle(); at faulty_env_example.py:{line} in oracle)"
        )
    ]
    raises.close()
    pool = LocalEnvPool(functools.partial(faulty.PlannedLever, fault="oracle_hangs_at_1"), 2, timeout_s=0.2)
    pool.reset([0, 1], [0, 1])
    assert pool.oracle([0, 1]) == [OraclePlan(["pull"] * 3)] * 2
    pool.step([0], ["pull"])
    hung, answered = pool.oracle([0, 1])
    assert hung == OraclePlan(
        failure="TimeoutError: oracle() gave no answer within 0.2 s (env.timeout_s); the environment was "
        "abandoned and is rebuilt on the next reset (in oracle())"
    )
    assert answered == OraclePlan(["pull"] * 3) and pool.abandoned == 1 and pool._envs[0] is None
    assert pool.oracle([0])[0].failure == (
        "RuntimeError: the environment is gone (an earlier call of this episode failed) (in oracle())"
    )
    # The slot gets a new environment on its next reset.
    assert pool.reset([0], [2])[0].failure is None and pool.oracle([0]) == [OraclePlan(["pull"] * 3)]
    pool.close()


def test_an_environment_that_raises_timeout_error_itself_is_not_abandoned_for_it():
    class RaisesTimeout(FlakyEnv):
        def step(self, action):
            raise TimeoutError("backend timed out")

    pool = LocalEnvPool(RaisesTimeout, 1, timeout_s=5.0)
    pool.reset([0], [0])
    assert pool.step([0], ["a"])[0].failure.startswith(
        "TimeoutError: backend timed out (in step(); at test_envpool.py:"
    )
    assert pool.abandoned == 0
    pool.close()


@pytest.mark.parametrize("timeout_s", [0, -1.0])
def test_a_time_limit_must_be_positive(timeout_s):
    with pytest.raises(ValueError, match="timeout_s must be > 0 seconds or None"):
        LocalEnvPool(RegisteredEnv("test_pool/Flaky-v0"), 1, timeout_s=timeout_s)


@pytest.mark.ray
@pytest.mark.slow
def test_ray_pool_fails_a_hung_step_and_replaces_an_actor_stuck_holding_the_gil(ray_local, faulty, monkeypatch):
    import agent_rl.training.serving.envpool as envpool

    monkeypatch.setattr(envpool, "ACTOR_GRACE_S", 2.0)
    ray_local.cloudpickle.register_pickle_by_value(faulty)  # the actors need not import tests/
    sleeps, spins = (
        RayEnvPool(
            functools.partial(faulty.Lever, fault=fault), 2, n_actors=n_actors, timeout_s=0.5, num_cpus_per_actor=0.5
        )
        for fault, n_actors in (("hang_at_2", 1), ("spin_at_2", 2))
    )
    try:
        for pool in (sleeps, spins):
            assert all(r.failure is None for r in pool.reset([0, 1], [0, 1]))
            assert all(r.failure is None for r in pool.step([0, 1], ["pull", "pull"]))
            assert all(r.failure is None for r in pool.reset([1], [2]))
        # A sleeping step: the actor's own limit fails its slot; the actor stays.
        hung, answered = sleeps.step([0, 1], ["pull", "pull"])
        assert hung.failure.startswith("TimeoutError: step() gave no answer within 0.5 s") and answered.failure is None
        assert sleeps.restarts == 0
        # A step stuck in C holding the GIL: the actor cannot answer, so it is killed and replaced.
        stuck, answered = spins.step([0, 1], ["pull", "pull"])
        assert stuck.failure == (
            "TimeoutError: the environment actor gave no answer within 0.5 s per call "
            "(env.timeout_s) and was replaced (in step())"
        )
        assert answered.failure is None and spins.restarts == 1
        assert all(r.failure is None for r in spins.reset([0, 1], [3, 4]))
    finally:
        sleeps.close()
        spins.close()
