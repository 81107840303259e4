"""agent_rl.core.grouping: exact grouping on every path of dense_ids (compact table, hashed sort and its
collision fallback, lexsort for strings), and rows_by_group."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.core import grouping
from agent_rl.core.grouping import dense_ids, rows_by_group


def _reference(*columns):
    """Dict-based grouping, ids in order of the sorted distinct row tuples."""
    rows = list(zip(*[list(c) for c in columns]))
    index = {key: i for i, key in enumerate(sorted(set(rows)))}
    return np.array([index[r] for r in rows], dtype=np.int64), len(index)


def assert_same_grouping(codes, expected, n, expected_n):
    """Equal partitions: ids may be numbered differently, but must be 0..n-1 and map one to one."""
    assert n == expected_n and codes.dtype == np.int64
    assert set(codes.tolist()) == set(range(n))
    assert len(set(zip(codes.tolist(), expected.tolist()))) == n


@pytest.mark.parametrize(
    "columns",
    [
        (np.array([3, 1, 3, 2, 1]),),  # compact ints
        (np.array([2**63, 5, 2**63, 7], dtype=np.uint64),),  # wide uint64 hashes -> hashed sort
        (np.array([0, 0, 1, 1]), np.array(["a", "b", "a", "a"])),  # ints x strings
        (np.array([1, 1, 2, 2]), np.array([2**60, 2**60, 2**60, 3], dtype=np.uint64)),
        (np.array([True, False, True]), np.array([-5, -5, -5])),  # bools and negatives
        (np.array([22, 91, -95], dtype=np.int8),),  # 91 - (-95) overflows int8
        (np.array(["x", "y", "x"], dtype=object),),
    ],
)
def test_matches_dict_reference(columns):
    codes, n = dense_ids(*columns)
    expected, expected_n = _reference(*columns)
    assert_same_grouping(codes, expected, n, expected_n)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([np.int8, np.int16, np.uint8, np.uint64]), st.data())
def test_narrow_and_unsigned_dtypes_group_exactly(dtype, data):
    # The offsets from the minimum must not wrap around in the column's own dtype.
    info = np.iinfo(dtype)
    values = data.draw(st.lists(st.integers(int(info.min), int(info.max)), min_size=1, max_size=12))
    column = np.array(values, dtype=dtype)
    codes, n = dense_ids(column)
    expected, expected_n = _reference(column)
    assert_same_grouping(codes, expected, n, expected_n)


def test_compact_pairs_that_overflow_the_table_take_the_hashed_sort():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3000, 5000)
    b = rng.integers(0, 3000, 5000)  # 9M combinations > the table bound for 5k rows
    codes, n = dense_ids(a, b)
    expected, expected_n = _reference(a, b)
    assert_same_grouping(codes, expected, n, expected_n)


@pytest.mark.parametrize("collide", ["all", "pairs"])
def test_hash_collisions_fall_back_to_an_exact_grouping(monkeypatch, collide):
    rng = np.random.default_rng(1)
    groups = rng.integers(0, 4, 300)
    keys = rng.integers(-(2**62), 2**62, 300) // 7 * 7
    keys[::3] = keys[0]  # revisits
    # Every row (or every pair of key values) mixes to the same word: distinct rows now share a key.
    fake = (
        (lambda arrays: np.zeros(len(arrays[0]), dtype=np.uint64))
        if collide == "all"
        else (lambda arrays: (arrays[1] // 2).astype(np.uint64) << np.uint64(40))
    )
    monkeypatch.setattr(grouping, "_mixed_key", fake)
    codes, n = dense_ids(groups, keys)
    expected, expected_n = _reference(groups, keys)
    assert_same_grouping(codes, expected, n, expected_n)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 40) | st.integers(2**40, 2**40 + 3), max_size=80))
def test_rows_by_group_is_a_stable_argsort(values):
    codes, n = dense_ids(np.array(values, dtype=np.int64))
    np.testing.assert_array_equal(rows_by_group(codes, n), np.argsort(codes, kind="stable"))


def test_rows_by_group_beyond_16_bit_codes():
    # Over 2**16 groups the radix path does not apply: the packed-word sort must agree too.
    rng = np.random.default_rng(0)
    codes, n = dense_ids(rng.integers(0, 3 * 2**16, size=400_000))
    assert n > 2**16
    np.testing.assert_array_equal(rows_by_group(codes, n), np.argsort(codes, kind="stable"))


def test_errors_and_empty():
    with pytest.raises(ValueError, match="at least one column"):
        dense_ids()
    with pytest.raises(ValueError, match="differ in length"):
        dense_ids(np.zeros(2), np.zeros(3))
    with pytest.raises(ValueError, match="1-D"):
        dense_ids(np.zeros((2, 2)))
    codes, n = dense_ids(np.zeros(0, dtype=np.int64))
    assert codes.shape == (0,) and n == 0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(-(2**63), 2**63 - 1) | st.integers(0, 4)), min_size=1, max_size=60
    ),
    st.randoms(use_true_random=False),
)
def test_grouping_is_exact_and_permutation_invariant(rows, rnd):
    groups = np.array([r[0] for r in rows])
    keys = np.array([r[1] for r in rows], dtype=np.int64)
    codes, n = dense_ids(groups, keys)
    expected, expected_n = _reference(groups, keys)
    assert_same_grouping(codes, expected, n, expected_n)
    perm = np.array(rnd.sample(range(len(rows)), len(rows)))
    np.testing.assert_array_equal(dense_ids(groups[perm], keys[perm])[0], codes[perm])
