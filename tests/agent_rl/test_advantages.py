"""agent_rl.core.advantages: hand-computed cases, the verl-agent reference, and properties."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.config import ConfigError, load_config, resolve_algorithm
from agent_rl.core.advantages import (
    compute_advantages,
    discounted_returns,
    episode_advantages,
    group_return_spread,
    kept_groups,
    novel_steps,
    novelty_bonuses,
    step_advantages,
    trajectory_weights,
    turn_position_mass,
)
from agent_rl.core.batch import StepBatch

EPS = 1e-6


def resolved_algo(overrides):
    return resolve_algorithm(load_config(overrides=overrides).algo)


# Three trajectories of group 0 (returns 1, 0, 0.5; two rows each) and a one-row group 1.
RETURNS = np.array([1, 1, 0, 0, 0.5, 0.5, 0.25])
GROUPS = np.array([0, 0, 0, 0, 0, 0, 1])
TRAJS = np.array([0, 0, 1, 1, 2, 2, 3])


# ---- discounted_returns -------------------------------------------------------------------------
def test_discounted_returns_by_hand():
    rewards = np.array([0.0, 0.0, 1.0, 0.0, 2.0, 3.0])
    trajs = np.array([7, 7, 7, 9, 9, 4])
    # traj 7: G = [0.25, 0.5, 1]; traj 9: G = [0 + 0.5 * 2, 2]; traj 4: [3]
    np.testing.assert_allclose(discounted_returns(rewards, trajs, 0.5), [0.25, 0.5, 1.0, 1.0, 2.0, 3.0])
    np.testing.assert_allclose(discounted_returns(rewards, trajs, 1.0), [1.0, 1.0, 1.0, 2.0, 2.0, 3.0])
    np.testing.assert_allclose(discounted_returns(rewards, trajs, 0.0), rewards)


def test_discounted_returns_interleaved_rows():
    rewards = np.array([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0])
    trajs = np.array([0, 0, 0, 1, 1, 1, 2])
    expected = discounted_returns(rewards, trajs, 0.9)
    order = np.array([0, 3, 1, 4, 6, 2, 5])  # keeps time order inside each trajectory
    np.testing.assert_allclose(discounted_returns(rewards[order], trajs[order], 0.9), expected[order])
    np.testing.assert_allclose(expected[:3], [0.81, 0.9, 1.0])


def test_discounted_returns_long_trajectory_matches_recursion():
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=500)
    expected = np.zeros(500)
    running = 0.0
    for i in range(499, -1, -1):
        running = rewards[i] + 0.99 * running
        expected[i] = running
    np.testing.assert_allclose(discounted_returns(rewards, np.zeros(500, dtype=int), 0.99), expected, rtol=1e-12)


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_discounted_returns_rejects_bad_gamma(gamma):
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(np.zeros(2), np.zeros(2), gamma)


# ---- episode_advantages -------------------------------------------------------------------------
def test_episode_advantages_by_hand():
    # Group 0 trajectories: R = 1, 0, 0.5 -> mean 0.5, unbiased std 0.5.
    grpo = (np.array([1, 1, 0, 0, 0.5, 0.5]) - 0.5) / (0.5 + EPS)
    np.testing.assert_allclose(episode_advantages(RETURNS, GROUPS, TRAJS, mode="grpo"), [*grpo, 0.0])
    np.testing.assert_allclose(
        episode_advantages(RETURNS, GROUPS, TRAJS, mode="drgrpo"), [0.5, 0.5, -0.5, -0.5, 0, 0, 0]
    )
    # RLOO: 1 - mean(0, 0.5) = 0.75; 0 - mean(1, 0.5) = -0.75; 0.5 - mean(1, 0) = 0
    np.testing.assert_allclose(
        episode_advantages(RETURNS, GROUPS, TRAJS, mode="rloo"), [0.75, 0.75, -0.75, -0.75, 0, 0, 0]
    )


def test_episode_advantages_step_stats_by_hand():
    # Rows of group 0: [1, 1, 0, 0, .5, .5] -> mean .5, unbiased std sqrt(1 / 5).
    std = math.sqrt(1.0 / 5.0)
    expected = [0.5 / (std + EPS)] * 2 + [-0.5 / (std + EPS)] * 2 + [0.0, 0.0, 0.0]
    np.testing.assert_allclose(episode_advantages(RETURNS, GROUPS, TRAJS, mode="grpo", stats="step"), expected)
    # Unequal trajectory lengths make the two statistics differ: traj 0 has three rows here.
    returns = np.array([1, 1, 1, 0])
    groups = np.zeros(4, dtype=int)
    trajs = np.array([0, 0, 0, 1])
    np.testing.assert_allclose(
        episode_advantages(returns, groups, trajs, mode="drgrpo", stats="step"), [0.25, 0.25, 0.25, -0.75]
    )
    np.testing.assert_allclose(
        episode_advantages(returns, groups, trajs, mode="drgrpo", stats="trajectory"), [0.5, 0.5, 0.5, -0.5]
    )
    # RLOO over rows: the other trajectory's rows only.
    np.testing.assert_allclose(episode_advantages(returns, groups, trajs, mode="rloo", stats="step"), [1, 1, 1, -1])


def test_trajectory_stats_need_one_value_per_trajectory():
    with pytest.raises(ValueError, match="trajectory 5"):
        episode_advantages(np.array([1.0, 0.0]), np.zeros(2), np.array([5, 5]))


def test_trajectory_in_two_groups_is_an_error():
    with pytest.raises(ValueError, match="trajectory 3 has rows in more than one group"):
        episode_advantages(np.ones(2), np.array([0, 1]), np.array([3, 3]))


@pytest.mark.parametrize("mode", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize("stats", ["trajectory", "step"])
def test_degenerate_batches_give_finite_zeros(mode, stats):
    # All-equal rewards, a singleton group, one-row trajectories.
    returns = np.array([1.0, 1.0, 1.0, 1.0, 3.0])
    groups = np.array([0, 0, 0, 0, 1])
    trajs = np.array([0, 0, 1, 2, 3])
    out = episode_advantages(returns, groups, trajs, mode=mode, stats=stats)
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, 0.0)
    # One trajectory alone in its group gets 0 even with several rows.
    np.testing.assert_array_equal(episode_advantages(np.ones(3), np.zeros(3), np.zeros(3), mode=mode, stats=stats), 0.0)


def test_empty_batch():
    assert episode_advantages(np.zeros(0), np.zeros(0), np.zeros(0)).shape == (0,)
    assert step_advantages(np.zeros(0), np.zeros(0), np.zeros(0)).shape == (0,)
    assert discounted_returns(np.zeros(0), np.zeros(0)).shape == (0,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(mode="ppo"), "mode"),
        (dict(stats="rows"), "stats"),
    ],
)
def test_episode_advantages_rejects_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        episode_advantages(RETURNS, GROUPS, TRAJS, **kwargs)


def test_inputs_are_validated_by_name():
    with pytest.raises(ValueError, match="group_ids has 2 rows, expected 7"):
        episode_advantages(RETURNS, np.zeros(2), TRAJS)
    with pytest.raises(ValueError, match="returns contains non-finite"):
        episode_advantages(np.array([np.nan, 1.0]), np.zeros(2), np.array([0, 1]))
    with pytest.raises(ValueError, match="step_returns must be 1-D"):
        step_advantages(np.zeros((2, 2)), np.zeros(2), np.zeros(2))
    with pytest.raises(ValueError, match="anchor_keys has 1 rows"):
        step_advantages(np.zeros(2), np.zeros(2), np.zeros(1))
    with pytest.raises(ValueError, match="normalize"):
        step_advantages(np.zeros(2), np.zeros(2), np.zeros(2), normalize="std")


# ---- step_advantages / gigpo ----------------------------------------------------------------------
def test_step_advantages_by_hand():
    step_returns = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    groups = np.array([0, 0, 0, 1, 1])
    keys = np.array(["room-a", "room-a", "room-b", "room-a", "room-a"])
    # Anchor groups: {0, 1} (mean 1.5, std sqrt(.5)), {2} singleton, {3, 4} in group 1 (same key,
    # different group: kept apart from group 0's "room-a").
    s = math.sqrt(0.5)
    np.testing.assert_allclose(
        step_advantages(step_returns, groups, keys),
        [-0.5 / (s + EPS), 0.5 / (s + EPS), 0.0, -0.5 / (s + EPS), 0.5 / (s + EPS)],
    )
    np.testing.assert_allclose(step_advantages(step_returns, groups, keys, normalize="mean"), [-0.5, 0.5, 0, -0.5, 0.5])
    int_keys = np.array([11, 11, 12, 11, 11], dtype=np.uint64)
    np.testing.assert_allclose(
        step_advantages(step_returns, groups, int_keys), step_advantages(step_returns, groups, keys)
    )


# Rows weighted as turns, so the hand values below are the plain per-row advantages.
GIGPO_MEAN = [
    "algo=gigpo",
    "algo.advantage=drgrpo",
    "algo.step_normalize=mean",
    "algo.row_weight=turn",
    "algo.negative_weight=1",
]
"""GiGPO with mean-centred advantages at both levels (no std), whose values are easy by hand."""


def step_batch(group, traj, reward, keys, valid=None) -> StepBatch:
    return StepBatch.for_credit(group, traj, reward, anchor_key=keys, action_valid=valid)


def test_pipeline_by_hand():
    # One group, two trajectories from state s0. Trajectory 0: s0 -> s1 (reward 1). Trajectory 1:
    # s0 -> s0 -> s1 (reward 1 at the end). Episode returns 1 and 1: zero episode advantage.
    batch = step_batch([0] * 5, [0, 0, 1, 1, 1], [0, 1, 0, 0, 1], ["s0", "s1", "s0", "s0", "s1"])
    credit = compute_advantages(batch, resolved_algo([*GIGPO_MEAN, "algo.gamma=0.5"]))
    # Step returns (gamma 0.5): traj0 [0.5, 1], traj1 [0.25, 0.5, 1]. Anchor group s0 = {0.5, 0.25,
    # 0.5}, mean 5/12; s1 = {1, 1}, mean 1 (mean-centred, no std).
    expected = np.array([0.5 - 5 / 12, 0.0, 0.25 - 5 / 12, 0.5 - 5 / 12, 0.0])
    np.testing.assert_allclose(credit.advantages, expected, atol=1e-12)
    np.testing.assert_allclose(credit.episode, 0.0)
    np.testing.assert_allclose(credit.step, expected, atol=1e-12)
    np.testing.assert_array_equal(credit.step_groups, [0, 1, 0, 0, 1])
    assert credit.group_stats.n_groups == 2 and credit.group_stats.frac_rows_in_groups_ge2 == 1.0
    metrics = credit.metrics()
    assert metrics["anchors/mean_group_size"] == 2.5 and metrics["anchors/grouped_fraction"] == 1.0
    grpo = compute_advantages(batch, resolved_algo(["algo=grpo"]))
    np.testing.assert_array_equal(grpo.advantages, np.zeros(5))  # equal returns: no trajectory-level signal
    np.testing.assert_array_equal(grpo.step, np.zeros(5))
    assert grpo.group_stats.n_groups == 2  # reported without step credit too


def test_pipeline_is_episode_plus_weighted_step():
    episode_returns = np.array([1.0, 1.0, 0.0, 0.0])
    batch = step_batch([0, 0, 0, 0], [0, 0, 1, 1], [0.0, 1.0, 0.0, 0.0], ["s0", "s1", "s0", "s1"])
    step_returns = discounted_returns(batch.reward, batch.traj_id, 0.9)
    for preset, mode, normalize in (("gigpo", "drgrpo", "mean"), ("grpo", "grpo", "mean_std")):
        algo = resolved_algo(
            [
                f"algo={preset}",
                "algo.step_credit=anchor",
                "algo.step_weight=0.5",
                "algo.gamma=0.9",
                "algo.negative_weight=1",
            ]
        )
        episode = episode_advantages(episode_returns, batch.group_id, batch.traj_id, mode=mode)
        step = step_advantages(step_returns, batch.group_id, batch.anchor_key, normalize=normalize)
        np.testing.assert_allclose(compute_advantages(batch, algo).advantages, episode + 0.5 * step)
    # By hand for the mean-centred form: episode +-0.5; step returns [0.9, 1, 0, 0]: anchor groups
    # s0 {0.9, 0}, s1 {1, 0}.
    algo = resolved_algo([*GIGPO_MEAN, "algo.step_weight=0.5", "algo.gamma=0.9"])
    np.testing.assert_allclose(
        compute_advantages(batch, algo).advantages,
        [0.5 + 0.5 * 0.45, 0.5 + 0.5 * 0.5, -0.5 - 0.5 * 0.45, -0.5 - 0.5 * 0.5],
    )


def test_step_only_credit_by_hand():
    # Trajectory 0 wins (s0 -> s1, reward 1), trajectory 1 loses (s0 -> s0, reward 0). gamma 0.5.
    batch = step_batch([0] * 4, [0, 0, 1, 1], [0, 1, 0, 0], ["s0", "s1", "s0", "s0"])
    step_only = compute_advantages(batch, resolved_algo([*GIGPO_MEAN, "algo.advantage=none", "algo.gamma=0.5"]))
    # Step returns [0.5, 1, 0, 0]; anchor group s0 = {0.5, 0, 0} (mean 1/6), s1 = {1} (singleton: 0).
    np.testing.assert_allclose(step_only.advantages, [0.5 - 1 / 6, 0.0, -1 / 6, -1 / 6], atol=1e-12)
    np.testing.assert_array_equal(step_only.episode, np.zeros(4))
    np.testing.assert_array_equal(step_only.advantages, step_only.step)
    # GiGPO adds the episode part (Dr.GRPO: +-0.5) to exactly these step advantages.
    gigpo = compute_advantages(batch, resolved_algo([*GIGPO_MEAN, "algo.gamma=0.5"]))
    np.testing.assert_allclose(gigpo.advantages - step_only.advantages, [0.5, 0.5, -0.5, -0.5], atol=1e-12)
    # step_weight still scales the step part; mean_std normalization applies as usual.
    weighted = compute_advantages(
        batch, resolved_algo([*GIGPO_MEAN, "algo.advantage=none", "algo.gamma=0.5", "algo.step_weight=2"])
    )
    np.testing.assert_allclose(weighted.advantages, 2 * step_only.advantages, atol=1e-12)


def test_step_only_credit_needs_step_credit():
    with pytest.raises(ConfigError, match="algo.advantage.*algo.step_credit=anchor or algo.step_credit=graph"):
        load_config(overrides=["algo=grpo", "algo.advantage=none"])
    assert resolved_algo(["algo=grpo", "algo.advantage=none", "algo.step_credit=anchor"]).advantage == "none"


def test_invalid_penalty_is_charged_to_the_invalid_step_alone():
    # Both trajectories win (return 1). Trajectory 1 made an invalid action at its first turn.
    batch = step_batch([0] * 5, [0, 0, 1, 1, 1], [0, 1, 0, 0, 1], ["s0", "s1", "s0", "s0", "s1"], valid=[1, 1, 0, 1, 1])
    overrides = [*GIGPO_MEAN, "algo.gamma=0.5", "algo.invalid_penalty=0"]
    plain = compute_advantages(batch, resolved_algo(overrides))
    penalized = compute_advantages(batch, resolved_algo([*overrides, "algo.invalid_penalty=0.1"]))
    np.testing.assert_allclose(penalized.advantages - plain.advantages, [0, 0, -0.1, 0, 0], atol=1e-12)
    np.testing.assert_array_equal(penalized.episode, plain.episode)  # returns and group statistics untouched
    # Under std normalization an all-win group stays at the penalty's size: it enters no statistic.
    std = [
        "algo=grpo",
        "algo.step_credit=anchor",
        "algo.gamma=0.5",
        "algo.invalid_penalty=0",
        "algo.row_weight=turn",
        "algo.negative_weight=1",
    ]
    no_penalty = compute_advantages(batch, resolved_algo(std))
    with_penalty = compute_advantages(batch, resolved_algo([*std, "algo.invalid_penalty=0.01"]))
    np.testing.assert_allclose(with_penalty.advantages - no_penalty.advantages, [0, 0, -0.01, 0, 0], atol=1e-12)
    # The same penalty as an environment reward is discounted into earlier steps and changes the
    # trajectory's return: trajectory 1 now loses the episode comparison at every step.
    env_reward = step_batch(
        batch.group_id, batch.traj_id, [0, 1, -0.1, 0, 1], batch.anchor_key, valid=batch.action_valid
    )
    as_reward = compute_advantages(env_reward, resolved_algo(overrides))
    np.testing.assert_allclose(as_reward.episode, [0.05, 0.05, -0.05, -0.05, -0.05], atol=1e-12)


def test_invalid_credit_penalty_leaves_the_outcome_out_of_invalid_steps():
    # Trajectory 0 wins (return 1) with an invalid second step; trajectory 1 loses (0) with an
    # invalid second step. Dr.GRPO episode credit: +0.5 and -0.5 on every row.
    batch = step_batch([0] * 5, [0, 0, 0, 1, 1], [0, 0, 1, 0, 0], ["s0", "s1", "s1", "s0", "s0"], valid=[1, 0, 1, 1, 0])
    algo = ["algo=drgrpo", "algo.invalid_penalty=0.5", "algo.row_weight=turn", "algo.negative_weight=1"]
    outcome = compute_advantages(batch, resolved_algo(algo))
    penalty = compute_advantages(batch, resolved_algo([*algo, "algo.invalid_credit=penalty"]))
    np.testing.assert_allclose(outcome.advantages, [0.5, 0.0, 0.5, -0.5, -1.0], atol=1e-12)
    np.testing.assert_allclose(penalty.advantages, [0.5, -0.5, 0.5, -0.5, -0.5], atol=1e-12)
    np.testing.assert_array_equal(penalty.episode, outcome.episode)  # the returns' comparison is the same
    # Without a penalty an invalid step leaves the update: advantage 0.
    free = compute_advantages(batch, resolved_algo([*algo, "algo.invalid_credit=penalty", "algo.invalid_penalty=0"]))
    np.testing.assert_allclose(free.advantages, [0.5, 0.0, 0.5, -0.5, 0.0], atol=1e-12)


def test_step_credit_needs_anchor_keys():
    batch = step_batch([0, 0], [0, 1], [1.0, 0.0], ["a", "a"])
    batch.anchor_key = None
    with pytest.raises(ValueError, match="anchor_key"):
        compute_advantages(batch, resolved_algo(["algo=gigpo"]))
    grpo = compute_advantages(batch, resolved_algo(["algo=grpo"]))
    assert grpo.group_stats is None and np.all(np.isfinite(grpo.advantages))


@pytest.mark.parametrize("preset", ["gigpo", "grpo", "drgrpo", "rloo"])
def test_degenerate_groups_give_finite_advantages(preset):
    # A one-trajectory group, an all-equal group, and an empty batch.
    batch = step_batch([0, 1, 1, 1, 1], [0, 1, 1, 2, 2], [1.0, 0.0, 1.0, 0.0, 1.0], ["a", "a", "b", "a", "b"])
    algo = resolved_algo([f"algo={preset}", "algo.invalid_penalty=0.05"])
    credit = compute_advantages(batch, algo)
    assert np.all(np.isfinite(credit.advantages))
    np.testing.assert_allclose(credit.episode, 0.0, atol=1e-9)
    empty = compute_advantages(batch.select(np.zeros(5, dtype=bool)), algo)
    assert len(empty.advantages) == 0 and empty.metrics()["advantage/abs_mean"] == 0.0


# ---- the reference implementation (verl-agent gigpo/core_gigpo.py, ported verbatim in spirit) -----
def _verl_norm(scores, index, epsilon, remove_std, seen_key=None):
    """verl-agent's loop: mean/std per index (torch.std is unbiased); a singleton keeps mean 0, std 1."""
    scores = torch.tensor(scores, dtype=torch.float64)
    id2score = defaultdict(list)
    seen = set()
    for i in range(len(scores)):
        if seen_key is not None:
            if (index[i], seen_key[i]) in seen:
                continue
            seen.add((index[i], seen_key[i]))
        id2score[index[i]].append(scores[i])
    id2mean, id2std = {}, {}
    for idx, values in id2score.items():
        if len(values) == 1:
            id2mean[idx], id2std[idx] = torch.tensor(0.0, dtype=torch.float64), torch.tensor(1.0, dtype=torch.float64)
        else:
            id2mean[idx] = torch.mean(torch.tensor(values))
            id2std[idx] = torch.std(torch.tensor([values]))
    out = scores.clone()
    for i in range(len(scores)):
        if remove_std:
            out[i] = scores[i] - id2mean[index[i]]
        else:
            out[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
    return out.numpy()


def _verl_gigpo(episode_returns, step_returns, groups, trajs, keys, remove_std, step_w):
    episode = _verl_norm(episode_returns, list(groups), EPS, remove_std)  # compute_mean_std_cross_steps=True
    step_uids = [f"{g}|{k}" for g, k in zip(groups, keys)]  # build_step_group: (index, anchor_obs)
    step = _verl_norm(step_returns, step_uids, EPS, remove_std)
    return episode + step_w * step


@pytest.mark.parametrize("normalize", ["mean_std", "mean"])
def test_step_stats_reproduce_verl_agent(normalize):
    rng = np.random.default_rng(1)
    n_groups, group_size = 4, 5
    groups, trajs, keys, rewards, ep, sr = [], [], [], [], [], []
    for g in range(n_groups):
        for j in range(group_size):
            length = rng.integers(1, 6)
            traj_rewards = (rng.random(length) < 0.2).astype(float)
            states = rng.integers(0, 8, size=length)
            groups += [g] * length
            trajs += [g * 100 + j] * length
            keys += [f"s{s}" for s in states]
            rewards += list(traj_rewards)
            ep += [traj_rewards.sum()] * length
            sr += [sum(0.95**k * r for k, r in enumerate(traj_rewards[i:])) for i in range(length)]
    groups, trajs, keys, rewards, ep, sr = map(np.asarray, (groups, trajs, keys, rewards, ep, sr))
    mode = "grpo" if normalize == "mean_std" else "drgrpo"
    algo = resolved_algo(
        [
            "algo=gigpo",
            f"algo.advantage={mode}",
            f"algo.step_normalize={normalize}",
            "algo.episode_stats=step",
            "algo.step_weight=0.7",
            "algo.gamma=0.95",
            "algo.row_weight=turn",
            "algo.negative_weight=1",  # verl-agent: every turn alike, unbiased
        ]
    )
    ours = compute_advantages(step_batch(groups, trajs, rewards, keys), algo).advantages
    reference = _verl_gigpo(ep, sr, groups, trajs, keys, normalize == "mean", 0.7)
    # The only deliberate difference: a singleton anchor group gets 0 here, its raw return there.
    codes = np.unique(np.char.add(groups.astype(str), keys), return_inverse=True)[1]
    singleton = np.bincount(codes)[codes] == 1
    assert singleton.any() and (~singleton).any()
    np.testing.assert_allclose(ours[~singleton], reference[~singleton], rtol=1e-12, atol=1e-12)
    raw_step = sr / (1.0 + EPS) if normalize == "mean_std" else sr  # verl: mean 0, std 1
    np.testing.assert_allclose(ours[singleton], (reference - 0.7 * raw_step)[singleton], rtol=1e-12, atol=1e-12)


# ---- properties -----------------------------------------------------------------------------------
@st.composite
def batches(draw):
    n_traj = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(1, 5), min_size=n_traj, max_size=n_traj))
    traj_group = draw(st.lists(st.integers(0, 3), min_size=n_traj, max_size=n_traj))
    traj_return = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0, -1.0]), min_size=n_traj, max_size=n_traj))
    trajs = np.repeat(np.arange(n_traj), lengths)
    groups = np.repeat(np.asarray(traj_group), lengths)
    returns = np.repeat(np.asarray(traj_return), lengths)
    n = len(trajs)
    step_returns = np.asarray(draw(st.lists(st.sampled_from([0.0, 0.3, 1.0, 2.5]), min_size=n, max_size=n)))
    keys = np.asarray(draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)))
    return returns, groups, trajs, step_returns, keys


@settings(max_examples=150, deadline=None)
@given(batches())
def test_drgrpo_trajectory_advantages_sum_to_zero_per_group(batch):
    returns, groups, trajs, _, _ = batch
    adv = episode_advantages(returns, groups, trajs, mode="drgrpo", stats="trajectory")
    _, first = np.unique(trajs, return_index=True)
    per_group = np.bincount(groups[first], weights=adv[first])
    np.testing.assert_allclose(per_group, 0.0, atol=1e-9)


@settings(max_examples=150, deadline=None)
@given(batches(), st.randoms(use_true_random=False))
def test_row_permutation_permutes_outputs(batch, rnd):
    returns, groups, trajs, step_returns, keys = batch
    # Any permutation that keeps each trajectory's rows in time order (rows of a trajectory are
    # interchangeable here anyway, except for discounted returns).
    perm = np.array(rnd.sample(range(len(trajs)), len(trajs)))
    perm = perm[np.argsort(trajs[perm], kind="stable")] if rnd.random() < 0.5 else perm
    for mode in ("grpo", "drgrpo", "rloo"):
        for stats in ("trajectory", "step"):
            full = episode_advantages(returns, groups, trajs, mode=mode, stats=stats)
            np.testing.assert_allclose(
                episode_advantages(returns[perm], groups[perm], trajs[perm], mode=mode, stats=stats),
                full[perm],
                atol=1e-12,
            )
    step = step_advantages(step_returns, groups, keys)
    np.testing.assert_allclose(step_advantages(step_returns[perm], groups[perm], keys[perm]), step[perm], atol=1e-12)


@settings(max_examples=150, deadline=None)
@given(batches())
def test_singleton_anchor_groups_get_zero(batch):
    _, groups, _, step_returns, keys = batch
    adv = step_advantages(step_returns, groups, keys)
    pair = groups * 10 + keys
    counts = np.unique(pair, return_counts=True)
    singleton = np.isin(pair, counts[0][counts[1] == 1])
    np.testing.assert_array_equal(adv[singleton], 0.0)
    assert np.all(np.isfinite(adv))


@settings(max_examples=100, deadline=None)
@given(batches(), st.lists(st.booleans(), min_size=60, max_size=60))
def test_invalid_credit_penalty_never_pushes_an_invalid_step_up(batch, valid_draw):
    returns, groups, trajs, _, keys = batch
    reward = np.where(np.r_[trajs[1:] != trajs[:-1], True], returns, 0.0)  # each return on its last row
    valid = np.asarray(valid_draw[: len(trajs)])
    rows = step_batch(groups, trajs, reward, keys.astype(str), valid=valid)
    algo = ["algo=gigpo", "algo.invalid_penalty=0.3"]
    outcome = compute_advantages(rows, resolved_algo(algo)).advantages
    penalty = compute_advantages(rows, resolved_algo([*algo, "algo.invalid_credit=penalty"])).advantages
    assert np.all(penalty[~valid] < 0)
    np.testing.assert_array_equal(penalty[valid], outcome[valid])


@settings(max_examples=100, deadline=None)
@given(batches())
def test_grpo_trajectory_advantages_are_standardized(batch):
    returns, groups, trajs, _, _ = batch
    adv = episode_advantages(returns, groups, trajs, mode="grpo")
    _, first = np.unique(trajs, return_index=True)
    for g in np.unique(groups[first]):
        members = adv[first][groups[first] == g]
        values = returns[first][groups[first] == g]
        if len(members) < 2 or np.ptp(values) == 0:
            np.testing.assert_allclose(members, 0.0, atol=1e-9)
        else:
            assert abs(members.mean()) < 1e-9
            std = values.std(ddof=1)
            np.testing.assert_allclose(members.std(ddof=1), std / (std + EPS), rtol=1e-9)


# ---- row weights ------------------------------------------------------------------------------------


def test_trajectory_weights_by_hand():
    # Trajectories of 2, 3 and 1 rows: 6 rows, 3 trajectories, mean length 2.
    np.testing.assert_allclose(trajectory_weights(np.array([0, 0, 1, 1, 1, 2])), [1, 1, 2 / 3, 2 / 3, 2 / 3, 2])


def test_trajectory_row_weight_makes_every_trajectory_weigh_the_same():
    # A short win (2 rows) and a long loss (4 rows) from one seed: Dr.GRPO's +-0.5 per row sums to
    # 2 * 0.5 - 4 * 0.5 = -1 over rows, a net push away from what was sampled; weighted by mean
    # length (3) over length, each trajectory's rows sum to 3 * (+-0.5) and the group to 0.
    batch = step_batch([0] * 6, [0, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0], ["a", "b", "a", "c", "d", "e"])
    episode_only = ["algo=drgrpo", "algo.invalid_penalty=0", "algo.negative_weight=1"]
    turns = compute_advantages(batch, resolved_algo([*episode_only, "algo.row_weight=turn"]))
    np.testing.assert_allclose(turns.advantages, [0.5, 0.5, -0.5, -0.5, -0.5, -0.5])
    weighted = compute_advantages(batch, resolved_algo([*episode_only, "algo.row_weight=trajectory"]))
    np.testing.assert_allclose(weighted.advantages, [0.75, 0.75, -0.375, -0.375, -0.375, -0.375])
    assert weighted.advantages.sum() == pytest.approx(0.0) and turns.advantages.sum() == pytest.approx(-1.0)
    np.testing.assert_array_equal(weighted.episode, turns.episode)  # the parts stay unweighted


def test_negative_weight_scales_only_negative_advantages_after_the_penalty():
    # A win (1 row) and a loss (2 rows, the second invalid) from one seed; Dr.GRPO gives +-0.5, the
    # penalty 0.5 takes the invalid row to -1; a quarter weight then gives [0.5, -0.125, -0.25].
    batch = step_batch([0, 0, 0], [0, 1, 1], [1, 0, 0], ["a", "a", "b"], valid=[True, True, False])
    algo = ["algo=drgrpo", "algo.invalid_penalty=0.5", "algo.row_weight=turn"]
    full = compute_advantages(batch, resolved_algo([*algo, "algo.negative_weight=1"]))
    np.testing.assert_allclose(full.advantages, [0.5, -0.5, -1.0])
    quarter = compute_advantages(batch, resolved_algo([*algo, "algo.negative_weight=0.25"]))
    np.testing.assert_allclose(quarter.advantages, [0.5, -0.125, -0.25])
    positive_only = compute_advantages(batch, resolved_algo([*algo, "algo.negative_weight=0"]))
    np.testing.assert_allclose(positive_only.advantages, [0.5, 0.0, 0.0])


@pytest.mark.parametrize("value", [-0.1, 1.5])
def test_negative_weight_outside_the_unit_interval_is_a_config_error(value):
    with pytest.raises(ConfigError, match="algo.negative_weight"):
        load_config(overrides=[f"algo.negative_weight={value}"])


@settings(max_examples=150, deadline=None)
@given(batches())
def test_trajectory_weighted_drgrpo_advantages_sum_to_zero_over_each_groups_rows(batch):
    returns, groups, trajs, _, _ = batch
    rewards = np.where(np.r_[trajs[1:] != trajs[:-1], True], returns, 0.0)  # each trajectory's return on its last row
    credit = compute_advantages(
        StepBatch.for_credit(groups, trajs, rewards),
        resolved_algo(["algo=drgrpo", "algo.invalid_penalty=0", "algo.negative_weight=1"]),
    )
    np.testing.assert_allclose(np.bincount(groups, weights=credit.advantages), 0.0, atol=1e-9)


# ---- diagnostics and the variance filter ------------------------------------------------------------
def test_group_return_spread_by_hand():
    # Group 0: trajectory returns 1, 0, 0.5 (rows repeat them): mean 0.5, unbiased std 0.5. Group 1:
    # one trajectory: 0.
    np.testing.assert_allclose(group_return_spread(RETURNS, GROUPS, TRAJS), [0.5, 0.0])
    # Groups are indexed by their ids' dense codes, whatever the row order; rows of one trajectory
    # count once however many there are.
    order = np.array([6, 4, 0, 2, 5, 1, 3])
    np.testing.assert_allclose(group_return_spread(RETURNS[order], GROUPS[order], TRAJS[order]), [0.5, 0.0])


@pytest.mark.parametrize(
    "keep, expected",
    [
        (1.0, [True, True, True, True, True]),  # 1 keeps every group, equal returns too
        (0.5, [True, False, True, False, False]),  # ceil(2.5) = 3 by spread: 0.9, 0.4, then 0.0 (never kept)
        (0.4, [True, False, True, False, False]),  # ceil(2.0) = 2
        (0.2, [True, False, False, False, False]),
    ],
)
def test_kept_groups_by_hand(keep, expected):
    spread = np.array([0.9, 0.0, 0.4, 0.0, 0.0])
    np.testing.assert_array_equal(kept_groups(spread, keep), expected)


def test_dropping_flat_groups_keeps_every_group_with_spread_and_no_other():
    spread = np.array([0.9, 0.0, 0.4, 0.0, 1e-12])
    np.testing.assert_array_equal(kept_groups(spread, 1.0, drop_flat=True), [True, False, True, False, True])
    np.testing.assert_array_equal(kept_groups(spread, 0.4, drop_flat=True), kept_groups(spread, 0.4))  # implied


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.0, 0.1, 0.5, 1.0]), min_size=1, max_size=999))
def test_dropping_flat_groups_is_a_share_just_below_one_for_fewer_than_1000_groups(spread):
    spread = np.array(spread)
    np.testing.assert_array_equal(kept_groups(spread, 1.0, drop_flat=True), kept_groups(spread, 0.999))


def test_kept_groups_ties_go_to_the_earlier_group():
    np.testing.assert_array_equal(kept_groups(np.array([0.5, 0.5, 0.5]), 0.5), [True, True, False])


@pytest.mark.parametrize("keep", [0.0, -0.1, 1.5])
def test_kept_groups_refuses_a_share_outside_the_unit_interval(keep):
    with pytest.raises(ValueError, match="keep must be in"):
        kept_groups(np.array([0.5]), keep)


@pytest.mark.parametrize("value", ["0", "1.2", "-0.5"])
def test_keep_groups_outside_the_unit_interval_is_a_config_error(value):
    with pytest.raises(ConfigError, match="algo.keep_groups"):
        load_config(overrides=[f"algo.keep_groups={value}"])


def test_the_variance_filter_zeroes_the_groups_it_drops():
    # Group 0: returns 1 and 0 (spread); group 1: both 0 (no spread) with an invalid action, which
    # the penalty alone would charge.
    batch = step_batch(
        [0, 0, 1, 1], [0, 1, 2, 3], [1.0, 0.0, 0.0, 0.0], ["a", "a", "b", "b"], valid=[True, True, False, True]
    )
    overrides = ["algo=grpo", "algo.row_weight=turn", "algo.negative_weight=1", "algo.invalid_penalty=0.5"]
    everything = compute_advantages(batch, resolved_algo(overrides))
    filtered = compute_advantages(batch, resolved_algo([*overrides, "algo.keep_groups=0.5"]))
    np.testing.assert_allclose(everything.advantages[2:], [-0.5, 0.0])
    np.testing.assert_allclose(filtered.advantages, [*everything.advantages[:2], 0.0, 0.0])
    flat_dropped = compute_advantages(batch, resolved_algo([*overrides, "algo.drop_flat_groups=true"]))
    np.testing.assert_allclose(flat_dropped.advantages, filtered.advantages)
    assert not filtered.filtered_out() and not everything.filtered_out()
    assert filtered.metrics()["credit/kept_groups"] == 0.5 and everything.metrics()["credit/kept_groups"] == 1.0
    assert filtered.metrics()["credit/zero_variance_groups"] == 0.5
    # A batch in which no group has spread keeps none.
    flat = step_batch([0, 0], [0, 1], [0.0, 0.0], ["a", "a"])
    dropped = compute_advantages(flat, resolved_algo([*overrides, "algo.keep_groups=0.5"]))
    assert dropped.filtered_out() and not dropped.advantages.any()
    assert dropped.why_no_step().startswith(
        "the variance filter (algo.keep_groups, algo.drop_flat_groups) dropped every group"
    )
    unfiltered = compute_advantages(flat, resolved_algo(overrides))
    assert not unfiltered.advantages.any() and unfiltered.why_no_step() == "every row has zero advantage"


def test_masking_overlong_rows_zeroes_them_and_no_other():
    # One group: trajectory 0 wins (return 1), its second reply hit the token limit and was invalid;
    # trajectory 1 loses (return 0), its second reply hit the limit. Dr.GRPO: episode advantages
    # +0.5 and -0.5; the invalid row is charged 1 more.
    batch = step_batch([0, 0, 0, 0], [0, 0, 1, 1], [0.0, 1.0, 0.0, 0.0], ["a", "b", "a", "b"], [1, 0, 1, 1])
    batch = dataclasses.replace(batch, overlong=np.array([False, True, False, True]))
    overrides = ["algo=drgrpo", "algo.row_weight=turn", "algo.negative_weight=1", "algo.invalid_penalty=1"]
    everything = compute_advantages(batch, resolved_algo(overrides))
    masked = compute_advantages(batch, resolved_algo([*overrides, "algo.mask_overlong=true"]))
    np.testing.assert_allclose(everything.advantages, [0.5, -0.5, -0.5, -0.5])
    np.testing.assert_allclose(masked.advantages, [0.5, 0.0, -0.5, 0.0])
    assert masked.masked_overlong == 2 and everything.masked_overlong == 0
    assert load_config().algo.mask_overlong is False  # off unless asked for


def test_a_batch_whose_every_learnable_reply_is_overlong_says_so():
    batch = step_batch([0, 0], [0, 1], [1.0, 0.0], ["a", "a"])
    batch = dataclasses.replace(batch, overlong=np.array([True, True]))
    credit = compute_advantages(batch, resolved_algo(["algo=drgrpo", "algo.mask_overlong=true"]))
    assert not credit.advantages.any()
    assert credit.why_no_step() == (
        "every row has zero advantage once algo.mask_overlong left out the 2 whose reply hit rollout.max_new_tokens"
    )


def test_turn_position_mass_by_hand():
    # Trajectory 0 has 3 turns (one per third), trajectory 1 has 6 (two per third).
    advantages = np.array([1.0, -2.0, 1.0, 0.5, 0.5, 0.0, 0.0, 1.0, -1.0])
    t = np.array([0, 1, 2, 0, 1, 2, 3, 4, 5])
    trajs = np.array([0, 0, 0, 1, 1, 1, 1, 1, 1])
    np.testing.assert_allclose(turn_position_mass(advantages, t, trajs), np.array([2.0, 2.0, 3.0]) / 7)
    np.testing.assert_array_equal(turn_position_mass(np.zeros(3), t[:3], trajs[:3]), [0.0, 0.0, 0.0])
    credit = compute_advantages(StepBatch.for_credit([0] * 9, trajs, np.zeros(9)), resolved_algo(["algo=grpo"]))
    metrics = credit.metrics()
    assert metrics["advantage/mass_early"] == metrics["advantage/mass_late"] == 0.0  # equal returns: no signal
    assert metrics["credit/zero_variance_groups"] == 1.0


# ---- novelty in the groups the task leaves silent ----------------------------------------------------
def test_novel_steps_by_hand():
    # Trajectory 0 walks a -> b -> a -> c; trajectory 1 (rows interleaved with 0's) stays at a once
    # (an invalid action), then reaches b. A row is novel when the state it led to is new to its
    # trajectory; a last row never is (the batch does not hold where it led).
    trajs = np.array([0, 1, 0, 1, 0, 0, 1])
    keys = np.array(["a", "a", "b", "a", "a", "c", "b"])
    np.testing.assert_array_equal(novel_steps(trajs, keys), [True, False, False, True, True, False, False])
    assert novel_steps(np.zeros(0, dtype=int), np.zeros(0, dtype=int)).shape == (0,)


def test_novelty_bonuses_reach_only_groups_without_a_win_or_a_return_spread():
    # Group 0: two losses with equal returns (silent). Group 1: a win and a loss. Group 2: returns
    # 0.5 and 0, no win (a spread: the task speaks). Every first row leads somewhere new.
    batch = StepBatch.for_credit(
        [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2],
        [0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5],
        [0, 0, 0, 0, 0, 1, 0, 0, 0, 0.5, 0, 0],
        anchor_key=["a", "b", "a", "a", "a", "b", "a", "b", "a", "b", "a", "b"],
        won=[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0],
    )
    traj_code = batch.traj_id
    spread = group_return_spread(np.bincount(traj_code, weights=batch.reward)[traj_code], batch.group_id, batch.traj_id)
    np.testing.assert_allclose(novelty_bonuses(batch, spread, 0.1), [0.1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])


def test_novelty_bonus_is_added_to_the_exploring_steps_of_a_silent_group_alone_by_hand():
    # One silent group: trajectory 0 explores a -> b -> c -> d, trajectory 1 paces a -> b -> a -> b
    # and makes one invalid move. Every return is 0, so episode and step credit give 0 and the
    # bonus (0.1) reaches the steps that led somewhere new, on those steps alone, as the invalid-action
    # penalty (0.5, at negative weight 0.25) reaches the invalid one.
    batch = step_batch(
        [0] * 8, [0] * 4 + [1] * 4, [0] * 8, ["a", "b", "c", "d", "a", "b", "b", "a"], valid=[1, 1, 1, 1, 1, 0, 1, 1]
    )
    algo = [*GIGPO_MEAN, "algo.negative_weight=0.25", "algo.invalid_penalty=0.5"]
    credit = compute_advantages(batch, resolved_algo([*algo, "algo.novelty_bonus=0.1"]))
    np.testing.assert_allclose(credit.novelty, [0.1, 0.1, 0.1, 0, 0.1, 0, 0, 0])
    np.testing.assert_array_equal(credit.episode, np.zeros(8))
    np.testing.assert_array_equal(credit.step, np.zeros(8))
    np.testing.assert_allclose(credit.advantages, [0.1, 0.1, 0.1, 0, 0.1, -0.125, 0, 0], atol=1e-12)
    assert credit.metrics()["credit/novel_rows"] == 0.5
    np.testing.assert_array_equal(credit.group_spread, [0.0])  # the task's spread, which the filter reads
    without = compute_advantages(batch, resolved_algo(algo))
    np.testing.assert_allclose(without.advantages, [0, 0, 0, 0, 0, -0.125, 0, 0], atol=1e-12)
    assert without.novelty is None and "credit/novel_rows" not in without.metrics()


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from([0.05, 0.3, 2.0]))
def test_novelty_bonus_leaves_every_group_with_a_win_or_a_spread_as_it_was(batch, bonus):
    returns, groups, trajs, _, keys = batch
    rewards = np.where(np.r_[trajs[1:] != trajs[:-1], True], returns, 0.0)  # each return on its last row
    won = np.where(np.r_[trajs[1:] != trajs[:-1], True], rewards >= 1.0, False)
    steps = StepBatch.for_credit(groups, trajs, rewards, anchor_key=keys, won=won)
    algo = [*GIGPO_MEAN, "algo.invalid_penalty=0"]
    plain = compute_advantages(steps, resolved_algo(algo))
    novel = compute_advantages(steps, resolved_algo([*algo, f"algo.novelty_bonus={bonus}"]))
    group_code = np.unique(groups, return_inverse=True)[1]
    silent = (plain.group_spread == 0) & (np.bincount(group_code, weights=won) == 0)
    spoken = ~silent[group_code]
    np.testing.assert_array_equal(novel.advantages[spoken], plain.advantages[spoken])
    np.testing.assert_array_equal(novel.novelty[spoken], 0.0)
    assert set(np.unique(novel.novelty)) <= {0.0, bonus}
    np.testing.assert_allclose(novel.advantages - plain.advantages, novel.novelty, atol=1e-12)
    np.testing.assert_array_equal(novel.group_spread, plain.group_spread)


def test_novelty_bonus_needs_anchor_keys_and_a_finite_non_negative_value():
    batch = step_batch([0, 0], [0, 1], [0.0, 0.0], ["a", "a"])
    batch.anchor_key = None
    with pytest.raises(ValueError, match="novelty_bonus needs StepBatch.anchor_key"):
        compute_advantages(batch, resolved_algo(["algo=grpo", "algo.novelty_bonus=0.1"]))
    for value in ("-0.1", ".inf", ".nan"):
        with pytest.raises(ConfigError, match="algo.novelty_bonus.*finite number >= 0"):
            load_config(overrides=[f"algo.novelty_bonus={value}"])


def test_novelty_bonus_on_an_empty_batch_gives_empty_advantages():
    empty = step_batch(np.zeros(0, dtype=int), np.zeros(0, dtype=int), np.zeros(0), np.zeros(0, dtype=int))
    credit = compute_advantages(empty, resolved_algo(["algo.novelty_bonus=0.2"]))
    assert credit.advantages.shape == (0,) and credit.novelty.shape == (0,)
    assert "credit/novel_rows" not in credit.metrics()
