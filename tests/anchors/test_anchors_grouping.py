"""The step grouper: (group_id, anchor key) groups and their statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.anchors import GroupStats, compute_anchor_keys, group_steps


def reference_groups(group_ids, anchor_keys) -> list[frozenset[int]]:
    """The partition of row indices by (group_id, key), with a plain dict."""
    members: dict[tuple, list[int]] = {}
    for row, pair in enumerate(zip(group_ids, anchor_keys)):
        members.setdefault(pair, []).append(row)
    return sorted((frozenset(rows) for rows in members.values()), key=min)


def partition(ids: np.ndarray) -> list[frozenset[int]]:
    members: dict[int, list[int]] = {}
    for row, step_group in enumerate(ids.tolist()):
        members.setdefault(step_group, []).append(row)
    return sorted((frozenset(rows) for rows in members.values()), key=min)


rows = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5)), max_size=60)


def test_hand_computed_groups_and_stats():
    group_ids = np.array([0, 0, 0, 1, 1, 1, 1])
    keys = np.array([7, 7, 9, 7, 7, 7, 2], dtype=np.uint64)
    ids, stats = group_steps(group_ids, keys)
    assert ids.dtype == np.int64
    # Sorted by (group, key): (0,7)->0, (0,9)->1, (1,2)->2, (1,7)->3.
    assert ids.tolist() == [0, 0, 1, 3, 3, 3, 2]
    assert stats == GroupStats(
        n_rows=7,
        n_groups=4,
        mean_size=7 / 4,
        max_size=3,
        frac_rows_in_groups_ge2=5 / 7,
        size_histogram={1: 2, 2: 1, 3: 1},
    )
    assert stats.as_dict() == {
        "n_rows": 7,
        "n_groups": 4,
        "mean_size": 1.75,
        "max_size": 3,
        "frac_rows_in_groups_ge2": 5 / 7,
        "size_histogram": {"1": 2, "2": 1, "3": 1},
    }


def test_empty_batch():
    ids, stats = group_steps(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.uint64))
    assert ids.shape == (0,)
    assert (stats.n_groups, stats.mean_size, stats.frac_rows_in_groups_ge2, stats.size_histogram) == (0, 0.0, 0.0, {})


def test_works_with_keys_from_every_kind():
    observations = ["room A", "room A", "room B", "room  A"]
    errors = [None, None, "error: 1:2: unknown word 'x'", None]
    states = ["a", "a", "b", "a"]
    group_ids = [0, 0, 0, 1]
    for kind in ("state", "observation", "fingerprint", "similarity"):
        keys = compute_anchor_keys(kind, observations, errors, states, group_ids=group_ids)
        ids, stats = group_steps(group_ids, keys)
        assert partition(ids) == [frozenset({0, 1}), frozenset({2}), frozenset({3})], kind
        assert stats.frac_rows_in_groups_ge2 == 0.5


def test_mismatched_lengths_and_shapes_are_named():
    with pytest.raises(ValueError, match="group_ids has 3 rows but anchor_keys has 2"):
        group_steps([0, 0, 1], [1, 2])
    with pytest.raises(ValueError, match="must be 1-D"):
        group_steps(np.zeros((2, 2)), np.zeros((2, 2)))


@settings(deadline=None)
@given(rows)
def test_matches_dict_reference(pairs):
    group_ids = np.array([g for g, _ in pairs], dtype=np.int64)
    keys = np.array([k * 0x9E3779B97F4A7C15 % 2**64 for _, k in pairs], dtype=np.uint64)
    ids, stats = group_steps(group_ids, keys)
    expected = reference_groups(group_ids.tolist(), keys.tolist())
    assert partition(ids) == expected
    sizes = [len(members) for members in expected]
    assert stats.n_groups == len(expected) and sum(stats.size_histogram.values()) == len(expected)
    assert stats.frac_rows_in_groups_ge2 == (sum(s for s in sizes if s >= 2) / len(pairs) if pairs else 0.0)


@settings(deadline=None)
@given(rows, st.randoms(use_true_random=False))
def test_permutation_invariant_up_to_relabeling(pairs, random):
    group_ids = np.array([g for g, _ in pairs], dtype=np.int64)
    keys = np.array([k for _, k in pairs], dtype=np.uint64)
    order = list(range(len(pairs)))
    random.shuffle(order)
    ids, stats = group_steps(group_ids, keys)
    shuffled_ids, shuffled_stats = group_steps(group_ids[order], keys[order])
    assert partition(ids[order]) == partition(shuffled_ids)
    assert stats == shuffled_stats


@settings(deadline=None)
@given(rows)
def test_singletons_stay_singletons_when_more_rows_join(pairs):
    """A row alone in its (group, key) stays alone when rows of other (group, key) pairs are added."""
    group_ids = np.array([g for g, _ in pairs] + [9, 9], dtype=np.int64)
    keys = np.array([k for _, k in pairs] + [100, 101], dtype=np.uint64)
    ids, stats = group_steps(group_ids, keys)
    assert ids[-1] != ids[-2] and np.sum(ids == ids[-1]) == 1 and np.sum(ids == ids[-2]) == 1
    base_ids, base_stats = group_steps(group_ids[:-2], keys[:-2])
    assert partition(base_ids) == partition(ids[:-2])
    assert stats.size_histogram.get(1, 0) == base_stats.size_histogram.get(1, 0) + 2


@settings(deadline=None)
@given(st.lists(st.text(max_size=8), max_size=30), st.lists(st.integers(0, 2), max_size=30))
def test_state_keys_group_like_strings(states, groups):
    n = min(len(states), len(groups))
    states, groups = states[:n], groups[:n]
    ids, _ = group_steps(groups, compute_anchor_keys("state", states=states))
    assert partition(ids) == reference_groups(groups, states)


def test_step_advantages_accept_group_steps_output():
    """step_advantages takes the grouper's ids as keys and groups exactly as with the raw keys."""
    from agent_rl.core.advantages import step_advantages

    rng = np.random.default_rng(3)
    group_ids = rng.integers(0, 4, 300)
    observations = [f"room {k}" for k in rng.integers(0, 6, 300)]
    keys = compute_anchor_keys("observation", observations=observations)
    step_groups, _ = group_steps(group_ids, keys)
    returns = rng.random(300)
    np.testing.assert_array_equal(
        step_advantages(returns, group_ids, step_groups), step_advantages(returns, group_ids, keys)
    )
