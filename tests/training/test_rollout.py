"""The multi-turn rollout collector and the evaluation helper (training/loop/rollout.py)."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.config import ConfigError, RolloutConfig, check_rollout
from agent_rl.envs import register_text_env
from agent_rl.training.loop.evaluation import evaluate
from agent_rl.training.loop.rollout import (
    action_entropy,
    choose_in_segments,
    collect_rollouts,
    constrained_choices,
    ended_in_loop,
    next_replay_share,
    overlong_shaping,
    replay_depths,
)
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import Completion, HFEngine, SamplingParams
from agent_rl.training.serving.envpool import RegisteredEnv
from agent_rl.training.serving.logprobs import sequence_logprobs


def one_round(**kwargs) -> RolloutConfig:
    """A rollout config that collects one round of groups (the default tops batches up to 256 rows)."""
    return RolloutConfig(min_batch_rows=0, **kwargs)


class CoinEnv(gym.Env):
    """A user-style text env: say "heads" ``steps`` times. The seed's parity picks the prompt mode
    the scripted engine reacts to; ``fail_modulo`` makes some seeds raise in reset or step."""

    def __init__(self, steps: int = 1, fail_modulo: int = 0):
        self.observation_space = spaces.Text(max_length=200)
        self.action_space = spaces.Text(max_length=200)
        self.steps, self.fail_modulo = steps, fail_modulo

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.seed_value, self.t = seed, 0
        if self.fail_modulo and seed % self.fail_modulo == 1:
            raise RuntimeError("reset exploded")
        mode = "same" if seed % 2 == 0 else "mixed"
        return f"mode {mode}. Say heads.", self._info(True, None, False)

    def step(self, action):
        if self.fail_modulo and self.seed_value % self.fail_modulo == 0 and self.t == 1:
            raise RuntimeError("step exploded")
        self.t += 1
        valid = action in ("heads", "tails")
        won = action == "heads" and self.t == self.steps
        done = self.t >= self.steps
        observation = f"turn {self.t}: you said {action!r}" + ("" if valid else " which is not a word I know")
        return observation, float(won), done, False, self._info(valid, None if valid else f"unknown {action}", won)

    def _info(self, valid, error, won):
        return {
            "anchor": f"t={self.t}",
            "action_valid": valid,
            "error": error,
            "won": won,
            "task": "say heads",
            "admissible_actions": ["heads", "tails"],
        }


register_text_env("test_rollout/Coin-v0", CoinEnv, description="Say heads; a test env.", default_anchor="observation")


class ScriptedEngine:
    """Answers from the prompt text: "heads" for mode-same prompts, heads/tails alternating by batch
    position for mode-mixed prompts, or fixed token ids. Records every call."""

    def __init__(self, tokenizer, token_ids: list[int] | None = None, finish_reason: str = "stop"):
        self.tokenizer, self.token_ids, self.finish_reason = tokenizer, token_ids, finish_reason
        self.calls: list[tuple[int, SamplingParams]] = []

    def generate(self, prompts_token_ids, n, sampling):
        self.calls.append((len(prompts_token_ids), sampling))
        out = []
        for position, prompt in enumerate(prompts_token_ids):
            if self.token_ids is not None:
                ids = list(self.token_ids)
            else:
                mixed = "[Current observation]\nmode mixed" in self.tokenizer.decode(prompt)
                word = "tails" if mixed and position % 2 else "heads"
                ids = self.tokenizer(word, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append([Completion(ids, [-0.5] * len(ids), self.finish_reason) for _ in range(n)])
        return out

    def update_weights(self, model):
        pass

    def close(self):
        pass


def check_batch_invariants(batch, config: RolloutConfig) -> None:
    traj = batch.traj_id
    starts = np.flatnonzero(np.r_[True, traj[1:] != traj[:-1]])
    assert len(np.unique(traj)) == len(starts)  # each trajectory's rows are contiguous
    lengths = np.diff(np.r_[starts, len(batch)])
    assert np.all(lengths <= config.max_turns)
    assert np.array_equal(batch.t, np.arange(len(batch)) - np.repeat(starts, lengths))  # t = 0, 1, 2, ...
    last = np.r_[starts[1:] - 1, len(batch) - 1]
    assert np.array_equal(np.flatnonzero(batch.done), last)  # done exactly on the last rows
    assert not np.any(batch.truncated & ~batch.done)
    # One seed per group, distinct across groups; group members share the initial observation.
    for g in np.unique(batch.group_id):
        rows = batch.group_id == g
        assert len(np.unique(batch.extras["seed"][rows])) == 1
        assert len({batch.observation[i] for i in np.flatnonzero(rows & (batch.t == 0))}) == 1
    group_seeds = [batch.extras["seed"][batch.group_id == g][0] for g in np.unique(batch.group_id)]
    assert len(set(group_seeds)) == len(group_seeds)
    assert np.all(batch.response_lengths == [len(lp) for lp in batch.old_logprobs])


def replay_matches(batch, env_id: str, env_kwargs: dict) -> None:
    """Replaying each trajectory's actions from its seed reproduces its observations and rewards."""
    env = gym.make(env_id, **env_kwargs)
    for traj in np.unique(batch.traj_id):
        rows = np.flatnonzero(batch.traj_id == traj)
        observation, info = env.reset(seed=int(batch.extras["seed"][rows[0]]))
        for i in rows:
            assert batch.observation[i] == observation and batch.anchor_state[i] == info["anchor"]
            assert batch.error[i] == info["error"]
            observation, reward, terminated, truncated, info = env.step(batch.action[i])
            assert batch.reward[i] == reward and batch.action_valid[i] == info["action_valid"]
            assert batch.won[i] == info["won"]
            if terminated or truncated:
                assert batch.done[i] and batch.truncated[i] == (not terminated)


@pytest.mark.parametrize("env_id", ["agent_rl/Maze-v0", "agent_rl/MiniCode-v0"])
def test_rollouts_on_bundled_envs_keep_the_step_batch_contract(policy, env_id):
    model, tokenizer = policy
    engine = HFEngine(model, tokenizer, seed=0)
    config = one_round(n_groups=2, group_size=2, max_turns=3, history_turns=1, max_new_tokens=6, max_prompt_tokens=640)
    batch, stats = collect_rollouts(RegisteredEnv(env_id, {}), engine, tokenizer, config, np.random.default_rng(0))
    assert len(np.unique(batch.group_id)) == 2 and len(np.unique(batch.traj_id)) == 4
    check_batch_invariants(batch, config)
    replay_matches(batch, env_id, {})
    # Prompts show the observation; Maze lists admissible actions, MiniCode has none.
    first_prompt = tokenizer.decode(batch.prompt_ids[0])
    assert batch.observation[0].strip() in first_prompt
    assert ("Admissible actions:" in first_prompt) == (env_id == "agent_rl/Maze-v0")
    assert all(len(p) <= config.max_prompt_tokens for p in batch.prompt_ids)
    # The stored logprobs are the policy's own logprobs of the stored tokens.
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, config.temperature)
    for i, old in enumerate(batch.old_logprobs):
        assert np.allclose(logp[i, : len(old)].numpy(), old, atol=1e-3)
    assert stats["tokens_generated"] == batch.response_lengths.sum()
    assert stats["invalid_action_rate"] == pytest.approx(np.mean(~batch.action_valid))
    assert stats["trajectories"] == 4 and stats["failed_trajectories"] == 0


def test_one_batched_generate_call_per_turn_and_rewards(policy):
    _, tokenizer = policy
    engine = ScriptedEngine(tokenizer)
    config = one_round(n_groups=3, group_size=2, max_turns=5)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {"steps": 3}), engine, tokenizer, config, np.random.default_rng(1)
    )
    assert [size for size, _ in engine.calls] == [6, 6, 6]  # every active env, one call per turn
    check_batch_invariants(batch, config)
    replay_matches(batch, "test_rollout/Coin-v0", {"steps": 3})
    assert len(batch) == 18 and not batch.truncated.any()
    # Each trajectory returns 1 exactly when its final word was heads.
    finals = batch.done
    assert np.array_equal(batch.reward[finals] == 1.0, np.array(batch.action)[finals] == "heads")
    assert stats["success_rate"] == pytest.approx(np.mean(batch.won[finals]))
    assert stats["mean_length"] == 3.0 and stats["mean_return"] == pytest.approx(batch.reward.sum() / 6)


@pytest.mark.parametrize("history_observations", [True, False])
def test_history_observations_reach_the_prompts(policy, history_observations):
    _, tokenizer = policy
    config = one_round(
        n_groups=1, group_size=1, max_turns=3, history_turns=2, history_observations=history_observations
    )
    batch, _ = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {"steps": 3}),
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(0),
    )
    last_prompt = tokenizer.decode(batch.prompt_ids[-1])
    assert "[Action 2]" in last_prompt
    assert ("[Observation 2]" in last_prompt) == history_observations


@pytest.mark.parametrize("system_prompt", [None, ""])
def test_system_prompt_reaches_rollout_and_warm_start_prompts_alike(policy, system_prompt):
    from agent_rl.training.loop.rollout import draw_seeds
    from agent_rl.training.loop.sft import collect_demonstrations

    _, tokenizer = policy
    config = one_round(n_groups=1, group_size=1, max_turns=2, history_turns=1, system_prompt=system_prompt)
    make_env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 2})
    batch, _ = collect_rollouts(make_env, ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(0))
    demos = collect_demonstrations(
        make_env,
        tokenizer,
        config,
        mode="random",
        rng=np.random.default_rng(0),
        seeds=draw_seeds(np.random.default_rng(0), 1, set()),  # the seed the rollout drew
    )
    assert demos.prompts[0] == batch.prompt_ids[0].tolist()  # the first turn: no history, same observation
    assert ("<|system|>" in tokenizer.decode(batch.prompt_ids[0])) == (system_prompt is None)


def test_max_turns_cuts_and_marks_truncation(policy):
    _, tokenizer = policy
    config = one_round(n_groups=1, group_size=2, max_turns=2)
    batch, _ = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {"steps": 5}),
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(0),
    )
    assert batch.t.tolist() == [0, 1, 0, 1] and batch.done.tolist() == [False, True, False, True]
    assert batch.truncated.tolist() == [False, True, False, True]


def test_dynamic_sampling_drops_only_zero_variance_groups(policy):
    _, tokenizer = policy
    config = one_round(n_groups=4, group_size=4, max_turns=2, dynamic_sampling=True, max_resample_rounds=20)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {}),
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(0),
    )
    assert stats["batch_groups"] == 4 and len(np.unique(batch.group_id)) == 4
    for g in np.unique(batch.group_id):
        assert np.ptp(batch.reward[batch.group_id == g]) > 0  # mixed groups only
    kept_seeds = np.unique(batch.extras["seed"])
    assert np.all(kept_seeds % 2 == 1)
    # Every "same" (even-seed) group played was dropped, and nothing else. Each round draws only the
    # missing number of groups, so play stops at the 4th odd seed of the stream.
    rng = np.random.default_rng(0)
    stream = [int(rng.integers(0, 2**31 - 1)) for _ in range(100)]
    fourth_odd = [i for i, seed in enumerate(stream) if seed % 2][3]
    expected_dropped = sum(seed % 2 == 0 for seed in stream[: fourth_odd + 1])
    assert stats["dropped_groups"] == expected_dropped > 0
    assert stats["trajectories"] == config.group_size * (fourth_odd + 1) and stats["rounds"] >= 2
    # Without dynamic sampling every group stays.
    plain = one_round(n_groups=4, group_size=4, max_turns=2)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {}), ScriptedEngine(tokenizer), tokenizer, plain, np.random.default_rng(0)
    )
    assert stats["dropped_groups"] == 0 and len(np.unique(batch.group_id)) == 4


def test_dynamic_sampling_stops_at_the_round_cap(policy):
    _, tokenizer = policy
    engine = ScriptedEngine(tokenizer, token_ids=tokenizer("heads", add_special_tokens=False)["input_ids"])
    config = one_round(n_groups=2, group_size=2, dynamic_sampling=True, max_resample_rounds=2)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {}), engine, tokenizer, config, np.random.default_rng(0)
    )
    assert len(batch) == 0 and stats["rounds"] == 3 and stats["dropped_groups"] == 6


def test_min_batch_rows_plays_rounds_until_the_batch_is_that_long(policy):
    _, tokenizer = policy
    # One-step episodes: 2 groups x 2 = 4 rows a round, so 10 rows take 3 rounds: 12 rows in 6 groups.
    config = RolloutConfig(n_groups=2, group_size=2, max_turns=2, min_batch_rows=10, max_resample_rounds=5)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {}),
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(0),
    )
    check_batch_invariants(batch, config)
    assert stats["rounds"] == 3 and len(batch) == 12 and len(np.unique(batch.group_id)) == 6
    assert stats["batch_rows"] == 12 and stats["trajectories"] == 12
    # Two-step episodes fill 8 rows a round: 10 rows take 2 rounds; the round cap bounds it.
    two_step = RegisteredEnv("test_rollout/Coin-v0", {"steps": 2})
    batch, stats = collect_rollouts(two_step, ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(0))
    assert stats["rounds"] == 2 and len(batch) == 16
    capped = RolloutConfig(n_groups=2, group_size=2, max_turns=2, min_batch_rows=100, max_resample_rounds=1)
    _, stats = collect_rollouts(two_step, ScriptedEngine(tokenizer), tokenizer, capped, np.random.default_rng(0))
    assert stats["rounds"] == 2 and stats["batch_rows"] == 16


def test_an_environment_that_raises_fails_only_its_trajectory(policy):
    _, tokenizer = policy
    kwargs = {"steps": 3, "fail_modulo": 3}  # seed % 3 == 1 raises in reset, seed % 3 == 0 in step 2
    config = one_round(n_groups=9, group_size=2, max_turns=4)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", kwargs),
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(5),
    )
    rng = np.random.default_rng(5)
    seeds = np.array([int(rng.integers(0, 2**31 - 1)) for _ in range(9)])
    bad = np.isin(seeds % 3, [0, 1])
    assert 0 < bad.sum() < 9
    assert stats["failed_trajectories"] == 2 * bad.sum() and stats["trajectories"] == 2 * (~bad).sum()
    assert sorted(np.unique(batch.extras["seed"])) == sorted(seeds[~bad])
    check_batch_invariants(batch, config)
    assert len(batch) == 3 * 2 * (~bad).sum()


def test_garbage_output_is_an_invalid_action(policy):
    _, tokenizer = policy
    garbage = tokenizer("\n\n<|user|>\x00 ### ???", add_special_tokens=False)["input_ids"]
    config = one_round(n_groups=1, group_size=2, max_turns=2)
    for parser in ("first_line", "action_tag"):
        engine = ScriptedEngine(tokenizer, token_ids=garbage)
        batch, stats = collect_rollouts(
            RegisteredEnv("test_rollout/Coin-v0", {"steps": 2}),
            engine,
            tokenizer,
            RolloutConfig(**{**config.__dict__, "parser": parser}),
            np.random.default_rng(0),
        )
        assert not batch.action_valid.any() and stats["invalid_action_rate"] == 1.0
        if parser == "action_tag":
            assert set(batch.action) == {""}


def test_overlong_responses_are_marked_and_shaped(policy):
    _, tokenizer = policy
    assert overlong_shaping(np.array([5, 6, 8, 10]), 10, 1.0, 4).tolist() == [0.0, 0.0, -0.5, -1.0]
    assert overlong_shaping(np.array([9, 10]), 10, 0.5, 0).tolist() == [0.0, -0.5]
    heads = tokenizer("heads", add_special_tokens=False)["input_ids"]
    engine = ScriptedEngine(tokenizer, token_ids=heads, finish_reason="length")
    config = one_round(n_groups=1, group_size=2, max_new_tokens=len(heads), overlong_penalty=0.25)
    batch, stats = collect_rollouts(
        RegisteredEnv("test_rollout/Coin-v0", {}), engine, tokenizer, config, np.random.default_rng(0)
    )
    assert batch.overlong.all() and stats["overlong_rate"] == 1.0
    assert batch.reward.tolist() == [0.75, 0.75] and batch.extras["overlong_penalty"].tolist() == [-0.25, -0.25]


def test_exploration_plays_random_admissible_actions_written_as_the_policy_writes_them(policy):
    _, tokenizer = policy
    env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 4})
    config = one_round(n_groups=4, group_size=4, max_turns=4, explore_rate=0.5)
    engine = ScriptedEngine(tokenizer)
    rng = np.random.default_rng(7)
    batch, stats = collect_rollouts(env, engine, tokenizer, config, rng)
    check_batch_invariants(batch, config)
    replay_matches(batch, "test_rollout/Coin-v0", {"steps": 4})
    explored = batch.extras["explored"]
    assert len(batch) == 64 and 16 <= explored.sum() <= 48
    assert stats["explored_rate"] == pytest.approx(explored.mean())
    assert sum(size for size, _ in engine.calls) == np.sum(~explored)  # the engine answers only the others
    eos = tokenizer.eos_token_id
    for i in np.flatnonzero(explored):
        assert batch.action[i] in ("heads", "tails") and batch.action_valid[i]
        assert batch.response_ids[i].tolist() == tokenizer(batch.action[i], add_special_tokens=False)["input_ids"] + [
            eos
        ]
        assert not batch.old_logprobs[i].any()  # placeholders: the learner scores them
    assert all(np.all(batch.old_logprobs[i] == -0.5) for i in np.flatnonzero(~explored))
    # Generated, so no row is a choice among the listed actions, whatever choice_logprobs says.
    assert config.choice_logprobs == "choice"
    assert batch.choice_ids is None or not any(ids.size for ids in batch.choice_ids)
    # Both words are explored: mode-same prompts, where the policy only ever says heads, also say tails.
    same = np.array(["mode same" in o for o in batch.observation]) | (batch.t > 0)
    assert "tails" in {batch.action[i] for i in np.flatnonzero(explored & same)}
    # The same seed stream draws the same seeds and the same explored turns; exploration draws none of its numbers.
    plain_rng = np.random.default_rng(7)
    plain_config = dataclasses.replace(config, explore_rate=0.0)
    plain, plain_stats = collect_rollouts(env, ScriptedEngine(tokenizer), tokenizer, plain_config, plain_rng)
    np.testing.assert_array_equal(plain.extras["seed"], batch.extras["seed"])
    assert rng.integers(1 << 30) == plain_rng.integers(1 << 30)
    assert not plain.extras["explored"].any() and plain_stats["explored_rate"] == 0.0
    again, _ = collect_rollouts(env, ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(7))
    np.testing.assert_array_equal(again.extras["explored"], explored)


def test_greedy_members_play_greedily_and_are_marked_for_the_learner(policy):
    _, tokenizer = policy
    env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 3})
    config = one_round(n_groups=3, group_size=4, max_turns=3, greedy_members=1)
    engine = ScriptedEngine(tokenizer)
    batch, _ = collect_rollouts(env, engine, tokenizer, config, np.random.default_rng(5))
    check_batch_invariants(batch, config)
    greedy = batch.extras["greedy"]
    # Each group's first trajectory, all of its turns, and no other.
    first_of_group = np.array(
        [t == batch.traj_id[batch.group_id == g].min() for t, g in zip(batch.traj_id, batch.group_id)]
    )
    np.testing.assert_array_equal(greedy, first_of_group)
    assert greedy.sum() == 9 and not batch.extras["explored"].any()
    # Every turn, one greedy call for the 3 greedy members and one sampled call for the other 9.
    assert [(size, sampling.greedy) for size, sampling in engine.calls] == [(3, True), (9, False)] * 3
    plain, _ = collect_rollouts(
        env,
        ScriptedEngine(tokenizer),
        tokenizer,
        one_round(n_groups=3, group_size=4, max_turns=3),
        np.random.default_rng(5),
    )
    np.testing.assert_array_equal(plain.extras["seed"], batch.extras["seed"])  # the same seed stream
    assert not plain.extras["greedy"].any()


def test_explored_replies_are_not_shaped_as_overlong(policy):
    """Replies at the token limit are shaped when the policy wrote them, not when exploration did."""
    _, tokenizer = policy
    limit = len(tokenizer("heads", add_special_tokens=False)["input_ids"]) + 1  # the policy's "heads" + EOS
    config = one_round(
        n_groups=2, group_size=4, max_turns=2, max_new_tokens=limit, overlong_penalty=1.0, explore_rate=0.5
    )
    env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 2})
    batch, _ = collect_rollouts(env, ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(3))
    explored, at_limit = batch.extras["explored"], batch.response_lengths >= limit
    assert (explored & at_limit).any() and (~explored & at_limit).any()
    np.testing.assert_array_equal(batch.extras["overlong_penalty"], np.where(~explored & at_limit, -1.0, 0.0))


class UnlistedCoinEnv(CoinEnv):
    """CoinEnv whose infos list no admissible actions."""

    def _info(self, valid, error, won):
        return {k: v for k, v in super()._info(valid, error, won).items() if k != "admissible_actions"}


def test_exploration_leaves_turns_without_admissible_actions_to_the_policy(policy):
    _, tokenizer = policy
    engine = ScriptedEngine(tokenizer)
    config = one_round(n_groups=2, group_size=4, max_turns=3, explore_rate=0.9)
    batch, stats = collect_rollouts(
        lambda: UnlistedCoinEnv(steps=3), engine, tokenizer, config, np.random.default_rng(0)
    )
    assert len(batch) == 24 and not batch.extras["explored"].any() and stats["explored_rate"] == 0.0
    assert sum(size for size, _ in engine.calls) == 24


def test_choose_in_segments_by_hand():
    scores, counts = np.array([0.0, 2.0, 1.0, 5.0, 3.0, 3.0]), [3, 1, 2]
    np.testing.assert_array_equal(choose_in_segments(scores, counts, None), [1, 3, 4])  # ties: the first listed
    rng = np.random.default_rng(0)
    draws = np.array([choose_in_segments(np.log([1.0, 3.0, 6.0]), [3], rng)[0] for _ in range(20_000)])
    np.testing.assert_allclose(np.bincount(draws, minlength=3) / draws.size, [0.1, 0.3, 0.6], atol=0.012)
    assert choose_in_segments(np.zeros(0), [], rng).size == 0
    with pytest.raises(ValueError, match="at least one score"):
        choose_in_segments(np.zeros(2), [2, 0], None)
    with pytest.raises(ValueError, match="cover all 3 scores"):
        choose_in_segments(np.zeros(3), [2], None)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-50, 50), min_size=1, max_size=6), min_size=1, max_size=8), st.integers(0, 9))
def test_each_choice_lies_in_its_own_run_and_greedy_takes_its_largest(runs, seed):
    scores, counts = np.concatenate([np.array(r) for r in runs]), [len(r) for r in runs]
    starts = np.cumsum(counts) - counts
    for rng in (None, np.random.default_rng(seed)):
        picks = choose_in_segments(scores, counts, rng)
        assert ((starts <= picks) & (picks < starts + counts)).all()
    greedy = choose_in_segments(scores, counts, None)
    assert [scores[i] for i in greedy] == [max(r) for r in runs]


def test_constrained_logprobs_renormalize_at_each_branch_by_hand():
    # One run: 1 2 9 | 1 3 9 | 4 9, then a run of one reply. Tokens 1 and 4 branch at the start (0.5
    # and 0.2), 2 and 3 after 1 (0.3 and 0.1); the rest is forced and counts 0 whatever its logprob.
    replies = [[1, 2, 9], [1, 3, 9], [4, 9], [5, 9]]
    logps = [np.log([0.5, 0.3, 0.9]), np.log([0.5, 0.1, 0.8]), np.log([0.2, 0.7]), np.log([0.01, 0.5])]
    chances = constrained_logprobs(replies, logps, [3, 1])
    np.testing.assert_allclose(np.exp(chances), [5 / 7 * 0.75, 5 / 7 * 0.25, 2 / 7, 1.0])


def test_constrained_choices_give_each_tokens_share_and_the_tokens_offered_by_hand():
    replies = [[1, 2, 9], [1, 3, 9], [4, 9], [5, 9]]
    logps = [np.log([0.5, 0.3, 0.9]), np.log([0.5, 0.1, 0.8]), np.log([0.2, 0.7]), np.log([0.01, 0.5])]
    chosen, offered = constrained_choices(replies, logps, [3, 1])
    np.testing.assert_allclose(chosen[0], np.log([5 / 7, 0.75, 1.0]))
    np.testing.assert_allclose(chosen[2], np.log([2 / 7, 1.0]))
    np.testing.assert_allclose(chosen[3], [0.0, 0.0])  # a run of one: nothing to choose
    assert offered[0].tolist() == [[1, 4], [2, 3], [9, -1]]  # padded to the run's widest position
    assert offered[1].tolist() == [[1, 4], [2, 3], [9, -1]]
    assert offered[2].tolist() == [[1, 4], [9, -1]]
    assert offered[3].tolist() == [[5], [9]]
    assert constrained_choices([], [], []) == ([], [])


def constrained_logprobs(replies, logps, counts) -> np.ndarray:
    """Each reply's logprob under decoding constrained to its run."""
    return np.array([values.sum() for values in constrained_choices(replies, logps, counts)[0]])


@st.composite
def reply_runs(draw):
    """Runs of distinct replies ending in EOS (0), with logprobs that agree wherever replies share a
    prefix (one model scores them all)."""
    runs = draw(
        st.lists(
            st.sets(st.tuples(*[st.integers(1, 3)] * 3).map(lambda t: t[: 1 + t[0] % 3]), min_size=1, max_size=6),
            min_size=1,
            max_size=4,
        )
    )
    node_logp = {}
    replies, logps = [], []
    for run, stems in enumerate(runs):
        for stem in sorted(stems):
            reply = [*stem, 0]
            replies.append(reply)
            logps.append(
                np.array(
                    [node_logp.setdefault((run, *reply[: t + 1]), draw(st.floats(-8, 0))) for t in range(len(reply))]
                )
            )
    return replies, logps, [len(stems) for stems in runs]


@settings(max_examples=60, deadline=None)
@given(reply_runs())
def test_constrained_chances_of_each_run_sum_to_one(case):
    replies, logps, counts = case
    chances = np.exp(constrained_logprobs(replies, logps, counts))
    starts = np.cumsum(counts) - counts
    np.testing.assert_allclose(np.add.reduceat(chances, starts), 1.0, rtol=1e-9)
    assert (chances > 0).all()


def test_admissible_mode_plays_listed_actions_with_the_policys_own_logprobs(policy):
    model, tokenizer = policy
    env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 3})
    config = one_round(
        n_groups=2, group_size=4, max_turns=3, action_mode="admissible", temperature=0.7, choice_logprobs="reply"
    )
    batch, stats = collect_rollouts(env, HFEngine(model, tokenizer), tokenizer, config, np.random.default_rng(5))
    check_batch_invariants(batch, config)
    replay_matches(batch, "test_rollout/Coin-v0", {"steps": 3})
    assert len(batch) == 24 and set(batch.action) <= {"heads", "tails"} and batch.action_valid.all()
    assert stats["invalid_action_rate"] == 0.0 and not batch.extras["explored"].any()
    eos = tokenizer.eos_token_id
    for i in range(len(batch)):
        assert batch.response_ids[i].tolist() == tokenizer(batch.action[i], add_special_tokens=False)["input_ids"] + [
            eos
        ]
    # Learned as replies: their logprobs are the learner's of the free reply, so the ratio starts at 1.
    logp, mask = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7)
    for i in range(len(batch)):
        np.testing.assert_allclose(batch.old_logprobs[i], logp[i][mask[i].bool()].detach().numpy(), atol=1e-5)
    # The seed stream is the generating mode's, and a rerun chooses the same.
    generated, _ = collect_rollouts(
        env,
        ScriptedEngine(tokenizer),
        tokenizer,
        dataclasses.replace(config, action_mode="generate"),
        np.random.default_rng(5),
    )
    np.testing.assert_array_equal(generated.extras["seed"], batch.extras["seed"])
    again, _ = collect_rollouts(env, HFEngine(model, tokenizer), tokenizer, config, np.random.default_rng(5))
    assert list(again.action) == list(batch.action)


@pytest.mark.parametrize("explore_rate", [0.0, 0.5])
def test_choice_logprobs_learn_the_choice_the_rollout_drew(policy, explore_rate):
    """``rollout.choice_logprobs=choice``: each row carries the tokens its choice offered and the
    choice's logprobs, which the learner's model recomputes from them (explored rows included); the
    two listed actions' chances sum to 1 and their forced EOS counts 0."""
    model, tokenizer = policy
    env = RegisteredEnv("test_rollout/Coin-v0", {"steps": 3})
    config = one_round(
        n_groups=2,
        group_size=4,
        max_turns=3,
        action_mode="admissible",
        temperature=0.7,
        choice_logprobs="choice",
        explore_rate=explore_rate,
    )
    batch, _ = collect_rollouts(env, HFEngine(model, tokenizer), tokenizer, config, np.random.default_rng(5))
    check_batch_invariants(batch, config)
    replies = [
        [*tokenizer(a, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id] for a in ("heads", "tails")
    ]
    _, offered = constrained_choices(replies, [np.zeros(len(r)) for r in replies], [2])
    assert replies[0][0] != replies[1][0]  # the first token decides; the rest is forced
    assert batch.extras["explored"].any() == (explore_rate > 0)
    for i in range(len(batch)):
        assert batch.choice_ids[i].tolist() == offered[batch.action[i] == "tails"].tolist()
    with torch.no_grad():
        logp, mask = sequence_logprobs(model, batch.prompt_ids, batch.response_ids, 0.7, choice_ids=batch.choice_ids)
        both, _ = sequence_logprobs(model, batch.prompt_ids[:1] * 2, replies, 0.7, choice_ids=offered)
    for i in np.flatnonzero(~batch.extras["explored"]):
        np.testing.assert_allclose(batch.old_logprobs[i], logp[i][mask[i].bool()].numpy(), atol=1e-5)
    assert (logp[:, 1:] == 0).all() and (logp[:, 0] < 0).all()
    assert np.exp(both[:, 0].numpy()).sum() == pytest.approx(1.0, abs=1e-6)


def test_admissible_mode_greedy_plays_the_action_the_policy_most_likely_writes(policy):
    model, tokenizer = policy
    config = RolloutConfig(max_turns=1, action_mode="admissible")
    stats = evaluate(
        RegisteredEnv("test_rollout/Coin-v0"),
        HFEngine(model, tokenizer),
        tokenizer,
        [0, 1],
        config=config,
        transcripts=2,
    )
    env = CoinEnv()
    for seed, played in zip([0, 1], stats["transcripts"]):
        observation, info = env.reset(seed=seed)
        prompt = PromptFormat.from_rollout(config).prompt_ids(
            tokenizer, "say heads", [], observation, ["heads", "tails"]
        )
        replies = [
            tokenizer(w, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for w in ("heads", "tails")
        ]
        logp, mask = sequence_logprobs(model, [prompt, prompt], replies, 1.0)
        chances = constrained_logprobs(replies, [row[m.bool()].detach().numpy() for row, m in zip(logp, mask)], [2])
        assert played["actions"] == [("heads", "tails")[int(chances.argmax())]]
    assert stats["invalid_action_rate"] == 0.0


class ScoringScriptedEngine(ScriptedEngine):
    """ScriptedEngine with a ``score`` that must not be called."""

    def score(self, prompts_token_ids, continuations_token_ids, temperature):
        raise AssertionError("no admissible list, nothing to score")


def test_admissible_mode_generates_where_no_list_is_given_and_needs_an_engine_that_scores(policy):
    _, tokenizer = policy
    engine = ScoringScriptedEngine(tokenizer)
    config = one_round(n_groups=2, group_size=2, max_turns=2, action_mode="admissible")
    batch, _ = collect_rollouts(lambda: UnlistedCoinEnv(steps=2), engine, tokenizer, config, np.random.default_rng(0))
    assert len(batch) == 8 and sum(size for size, _ in engine.calls) == 8
    with pytest.raises(
        ValueError, match=r"action_mode=admissible scores .* engine.score\(\), and ScriptedEngine has none"
    ):
        collect_rollouts(
            RegisteredEnv("test_rollout/Coin-v0"),
            ScriptedEngine(tokenizer),
            tokenizer,
            config,
            np.random.default_rng(0),
        )


class PlannedCoinEnv(CoinEnv):
    """CoinEnv with an oracle: "heads" for every turn left (``plan_extra`` more than that)."""

    def __init__(self, steps: int = 1, plan_extra: int = 0):
        super().__init__(steps)
        self.plan_extra = plan_extra

    def oracle(self):
        return ["heads"] * (self.steps - self.t + self.plan_extra)


def test_replay_depths_and_the_share_controller_by_hand():
    assert replay_depths(np.array([0, 1, 2, 5, 10]), 0.5).tolist() == [0, 0, 1, 2, 5]
    assert replay_depths(np.array([4, 4]), 0.99).tolist() == [3, 3]  # the last action is the policy's
    assert replay_depths(np.array([7]), 0.0).tolist() == [0]
    assert next_replay_share(0.5, 0.2, 0.5, 0.1) == pytest.approx(0.6)  # below the target: replay more
    assert next_replay_share(0.5, 0.8, 0.5, 0.1) == pytest.approx(0.4)
    assert next_replay_share(0.5, 0.5, 0.5, 0.1) == 0.5
    assert next_replay_share(0.95, 0.0, 0.5, 0.1) == 1.0 and next_replay_share(0.05, 1.0, 0.5, 0.1) == 0.0
    share = 0.5
    for _ in range(3):
        share = next_replay_share(share, 0.0, 0.5, 0.1)
    assert share == 0.8 and replay_depths(np.array([5]), share).tolist() == [4]  # no float drift below 0.8


@given(st.lists(st.integers(0, 50), min_size=1, max_size=20), st.floats(0, 1), st.floats(0, 1))
def test_replay_depths_leave_the_policy_a_move_and_grow_with_the_share(lengths, low, high):
    low, high = sorted((low, high))
    lengths = np.array(lengths)
    shallow, deep = replay_depths(lengths, low), replay_depths(lengths, high)
    assert np.all(shallow >= 0) and np.all(shallow <= deep) and np.all(deep <= np.maximum(lengths - 1, 0))


def test_the_reverse_curriculum_replays_the_oracle_plan_into_the_history_not_the_batch(policy):
    _, tokenizer = policy
    config = one_round(n_groups=2, group_size=2, max_turns=4, history_turns=3)
    engine = ScriptedEngine(tokenizer)
    batch, stats = collect_rollouts(
        lambda: PlannedCoinEnv(steps=4), engine, tokenizer, config, np.random.default_rng(0), replay_share=0.5
    )
    # Plans of 4 actions: 2 replayed, 2 played by the policy; the trajectories still win.
    assert len(batch) == 8 and batch.t.tolist() == [0, 1] * 4 and stats["replayed_turns"] == 2.0
    assert stats["success_rate"] == 1.0 and sum(size for size, _ in engine.calls) == 8
    first = np.flatnonzero(batch.t == 0)
    assert all(batch.observation[i] == "turn 2: you said 'heads'" for i in first)
    prompt = tokenizer.decode(batch.prompt_ids[first[0]])
    assert prompt.count("heads") >= 2  # the replayed turns are in the history the policy sees
    plain, plain_stats = collect_rollouts(
        lambda: PlannedCoinEnv(steps=4), ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(0)
    )
    assert len(plain) == 16 and plain_stats["replayed_turns"] == 0.0


def test_a_replay_that_ends_the_episode_fails_that_trajectory(policy):
    _, tokenizer = policy
    config = one_round(n_groups=1, group_size=2, max_turns=4)
    batch, stats = collect_rollouts(
        lambda: PlannedCoinEnv(steps=2, plan_extra=4),  # a plan of 6 actions for an episode of 2
        ScriptedEngine(tokenizer),
        tokenizer,
        config,
        np.random.default_rng(0),
        replay_share=0.9,
    )
    assert len(batch) == 0 and stats["failed_trajectories"] == 2
    assert all(
        f.startswith("ReplayError: the oracle plan's action 2 ('heads') ended the episode") for f in stats["failures"]
    )


class LineEnv(gym.Env):
    """Walk a line from 2 to the goal at 4: ``right``/``left`` move, anything else is invalid; 0 is a pit
    (the episode ends, lost, and no plan is left). The oracle's plan: ``right`` to the goal."""

    def __init__(self):
        self.observation_space = spaces.Text(max_length=50)
        self.action_space = spaces.Text(max_length=50)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.at = 2
        return "at 2", {}

    def step(self, action):
        moves = {"right": 1, "left": -1}
        self.at += moves.get(action, 0)
        won, lost = self.at == 4, self.at == 0
        return f"at {self.at}", float(won), won or lost, False, {"won": won, "action_valid": action in moves}

    def oracle(self):
        return ["right"] * (4 - self.at) if self.at > 0 else []


class ScriptEngine:
    """Answers every prompt of the n-th call with the n-th word of ``script``."""

    def __init__(self, tokenizer, script: list[str]):
        self.tokenizer, self.script, self.calls = tokenizer, script, 0

    def generate(self, prompts_token_ids, n, sampling):
        word = self.tokenizer(self.script[self.calls], add_special_tokens=False)["input_ids"]
        ids = [*word, self.tokenizer.eos_token_id]
        self.calls += 1
        return [[Completion(ids, [-0.5] * len(ids), "stop") for _ in range(n)] for _ in prompts_token_ids]


def _line_rollout(tokenizer, script: list[str], progress_reward: float):
    config = one_round(n_groups=1, group_size=1, max_turns=6, progress_reward=progress_reward)
    return collect_rollouts(LineEnv, ScriptEngine(tokenizer, script), tokenizer, config, np.random.default_rng(0))


def test_progress_shaping_pays_each_step_toward_a_win_by_hand(policy):
    _, tokenizer = policy
    batch, stats = _line_rollout(tokenizer, ["right", "stay", "left", "right", "right"], 0.25)
    # Distances 2 -> 1 -> 1 -> 2 -> 1 -> 0 (won): +0.25, 0, -0.25, +0.25, +0.25, and the win's 1.
    np.testing.assert_allclose(batch.extras["progress_reward"], [0.25, 0.0, -0.25, 0.25, 0.25])
    np.testing.assert_allclose(batch.reward, [0.25, 0.0, -0.25, 0.25, 1.25])
    assert stats["progress_reward"] == pytest.approx(0.5) and stats["success_rate"] == 1.0
    # Into the pit: 2 -> 3, then ended without a win, counted max_turns (6) away: -0.25, then -0.75.
    batch, _ = _line_rollout(tokenizer, ["left", "left"], 0.25)
    np.testing.assert_allclose(batch.reward, [-0.25, -0.75])
    batch, stats = _line_rollout(tokenizer, ["right", "stay", "left", "right", "right"], 0.0)
    np.testing.assert_allclose(batch.reward, [0, 0, 0, 0, 1])
    assert stats["progress_reward"] == 0.0


@settings(deadline=None, max_examples=40)  # each example is a whole rollout
@given(st.lists(st.sampled_from(["right", "left", "stay"]), min_size=6, max_size=6), st.floats(0.01, 2.0))
def test_progress_shaping_telescopes_to_the_distance_gained(policy, script, progress_reward):
    """Over a trajectory the shaping sums to progress_reward x (d(start) - d(end)), whatever was played."""
    _, tokenizer = policy
    batch, _ = _line_rollout(tokenizer, script, progress_reward)
    at = 2 + np.cumsum([{"right": 1, "left": -1}.get(a, 0) for a in script])
    end = at[np.flatnonzero((at == 0) | (at == 4))[0]] if ((at == 0) | (at == 4)).any() else at[-1]
    distance = {0: 6, 4: 0}.get(int(end), 4 - int(end))
    assert batch.extras["progress_reward"].sum() == pytest.approx(progress_reward * (2 - distance))
    assert batch.reward.sum() == pytest.approx(progress_reward * (2 - distance) + float(end == 4))


def test_evaluate_reports_success_and_uses_greedy_decoding(policy):
    _, tokenizer = policy
    engine = ScriptedEngine(tokenizer)
    result = evaluate(RegisteredEnv("test_rollout/Coin-v0", {"steps": 2}), engine, tokenizer, [2, 4, 6])
    assert result["n"] == 3 and result["success_rate"] == 1.0 and result["mean_length"] == 2.0
    assert result["mean_return"] == 1.0 and all(sampling.greedy for _, sampling in engine.calls)
    assert "transcripts" not in result and result["action_entropy"] == 0.0  # heads, whatever the state
    result = evaluate(
        RegisteredEnv("test_rollout/Coin-v0", {}),
        ScriptedEngine(tokenizer),
        tokenizer,
        [1, 3],
        greedy=False,
        transcripts=5,
    )
    assert result["success_rate"] == 0.5  # mixed mode: positions 0/1 say heads/tails
    assert result["action_entropy"] == 1.0
    assert result["transcripts"] == [
        {"seed": 1, "won": True, "actions": ["heads"], "valid": [True]},
        {"seed": 3, "won": False, "actions": ["tails"], "valid": [True]},
    ]
    garbage = ScriptedEngine(tokenizer, token_ids=tokenizer("blah", add_special_tokens=False)["input_ids"])
    result = evaluate(RegisteredEnv("test_rollout/Coin-v0", {}), garbage, tokenizer, [1], transcripts=1)
    assert result["transcripts"] == [{"seed": 1, "won": False, "actions": ["blah"], "valid": [False]}]
    with pytest.raises(ValueError, match="seed"):
        evaluate(RegisteredEnv("test_rollout/Coin-v0", {}), engine, tokenizer, [])


def test_rollout_config_is_validated(policy):
    from agent_rl.config import load_config

    for bad, key in (
        ({"n_groups": 0}, "rollout.n_groups"),
        ({"parser": "xml"}, "rollout.parser"),
        ({"max_new_tokens": 4, "overlong_buffer": 5}, "rollout.overlong_buffer"),
        ({"top_p": 0.0}, "rollout.top_p"),
        ({"explore_rate": -0.1}, "rollout.explore_rate"),
        ({"explore_rate": 1.0}, "rollout.explore_rate"),
        ({"explore_rate": float("nan")}, "rollout.explore_rate"),
        ({"greedy_members": -1}, "rollout.greedy_members"),
        ({"greedy_members": 8, "group_size": 8}, "rollout.greedy_members"),
        ({"target_pass_rate": 0.0}, "rollout.target_pass_rate"),
        ({"target_pass_rate": 1.0}, "rollout.target_pass_rate"),
        ({"target_pass_rate": float("nan")}, "rollout.target_pass_rate"),
        ({"replay_start": 1.5}, "rollout.replay_start"),
        ({"replay_start": -0.1}, "rollout.replay_start"),
        ({"replay_step": 0.0}, "rollout.replay_step"),
        ({"replay_step": 1.5}, "rollout.replay_step"),
    ):
        with pytest.raises(ConfigError, match=f"config key '{key}'"):
            check_rollout(RolloutConfig(**bad))
    with pytest.raises(ConfigError, match="config key 'rollout.n_groups': must be >= 1, got 0"):
        load_config(overrides=["rollout.n_groups=0"])
    # A section built in Python is checked where rollouts start.
    _, tokenizer = policy
    with pytest.raises(ConfigError, match="rollout.top_p"):
        collect_rollouts(
            lambda: CoinEnv(steps=2),
            ScriptedEngine(tokenizer),
            tokenizer,
            RolloutConfig(top_p=2.0),
            np.random.default_rng(0),
        )


def test_rollouts_take_any_environment_factory_or_a_pool(policy):
    """A plain class (no registration) is a factory; a pool is reused and must be big enough."""
    from agent_rl.training.serving.envpool import LocalEnvPool

    _, tokenizer = policy
    config = one_round(n_groups=2, group_size=2, max_turns=3)
    by_class, _ = collect_rollouts(
        lambda: CoinEnv(steps=2), ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(3)
    )
    pool = LocalEnvPool(lambda: CoinEnv(steps=2), 4)
    by_pool, _ = collect_rollouts(pool, ScriptedEngine(tokenizer), tokenizer, config, np.random.default_rng(3))
    assert by_class.action == by_pool.action and by_class.observation == by_pool.observation
    assert pool.env_id == "CoinEnv" and pool.has_oracle is False
    with pytest.raises(ValueError, match="the pool holds 4 'CoinEnv' environments; 6 are needed"):
        collect_rollouts(
            pool, ScriptedEngine(tokenizer), tokenizer, one_round(n_groups=3, group_size=2), np.random.default_rng(3)
        )
    pool.close()


def _rows(*turns, truncated=True, won=False):
    rows = [{"anchor_state": state, "action": action, "truncated": False, "won": False} for state, action in turns]
    rows[-1].update(truncated=truncated, won=won)
    return rows


def test_an_episode_ended_in_a_loop_when_it_ran_out_repeating_a_state_and_action_by_hand():
    assert ended_in_loop(_rows(("room", "take key"), ("room", "take key")))  # one invalid command again
    assert ended_in_loop(_rows(("a", "go east"), ("b", "go west"), ("a", "go east"), ("b", "go west")))
    assert ended_in_loop(_rows(("a", "look"), ("a", "go east"), ("b", "go west"), ("a", "go east")))
    assert not ended_in_loop(_rows(("a", "go east"), ("b", "go east"), ("c", "go east")))  # ran out, no repeat
    assert not ended_in_loop(_rows(("a", "go east"), ("a", "look")))  # same state, another action
    assert not ended_in_loop(_rows(("a", "look"), ("b", "look")))  # same action, another state
    assert not ended_in_loop(_rows(("a", "look"), ("a", "look"), truncated=False))  # it ended (terminated)
    assert not ended_in_loop(_rows(("a", "look"), ("a", "look"), won=True))
    assert not ended_in_loop([])


@pytest.mark.parametrize(
    ("script", "loop_rate"),
    [
        (["stay"] * 6, 1.0),  # invalid, in place, to the turn limit
        (["right", "left"] * 3, 1.0),  # back and forth
        (["right", "left", "right", "left", "left", "left"], 0.0),  # back and forth, then into the pit
        (["stay", "right", "left", "right", "left", "left"], 0.0),  # ran out, its last move a new one
        (["right", "right"], 0.0),  # won
    ],
)
def test_rollouts_report_the_share_of_episodes_that_ended_in_a_loop(policy, script, loop_rate):
    _, tokenizer = policy
    _, stats = _line_rollout(tokenizer, script, 0.0)
    assert stats["loop_rate"] == loop_rate


def test_action_entropy_in_bits():
    assert action_entropy([]) == 0.0 and action_entropy(["look"] * 7) == 0.0
    assert action_entropy(["go east", "go west"]) == 1.0
    # 3/4 and 1/4: 0.75 log2(4/3) + 0.25 log2(4)
    assert action_entropy(["a", "a", "a", "b"]) == pytest.approx(0.75 * np.log2(4 / 3) + 0.5)


@given(st.lists(st.sampled_from(["look", "inventory", "go east", "take cup", ""]), max_size=40), st.randoms())
def test_action_entropy_is_bounded_and_ignores_order_and_names(actions, random):
    entropy = action_entropy(actions)
    assert 0.0 <= entropy <= np.log2(max(len(set(actions)), 1)) + 1e-12
    shuffled = random.sample(actions, len(actions))
    assert action_entropy(shuffled) == pytest.approx(entropy)
    assert action_entropy([f"renamed {a}" for a in actions]) == pytest.approx(entropy)
    if actions:  # k equally played actions: log2 k
        k = len(set(actions))
        assert action_entropy(sorted(set(actions)) * 3) == pytest.approx(np.log2(k))
