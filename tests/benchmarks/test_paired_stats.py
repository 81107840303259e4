"""benchmarks.paired_stats: t quantiles, the Wilcoxon signed-rank test and paired differences,
against hand-computed and tabulated values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.paired_stats import (
    mean_interval,
    paired_difference,
    student_t_cdf,
    student_t_quantile,
    wilcoxon_signed_rank,
)

# Two-sided 95% (p = 0.975) and 99% (p = 0.995) quantiles of Student's t from the standard tables.
T_TABLE = [
    (0.975, 1, 12.706204736), (0.975, 2, 4.302652730), (0.975, 4, 2.776445105), (0.975, 10, 2.228138852),
    (0.975, 30, 2.042272456), (0.975, 99, 1.984216952), (0.975, 127, 1.978819535), (0.995, 7, 3.499483297),
    (0.975, 1e7, 1.959964222),  # the normal quantile 1.959963985 + (z^3 + z) / (4 df)
]


@pytest.mark.parametrize(("p", "df", "expected"), T_TABLE)
def test_t_quantiles_match_the_tables(p, df, expected):
    assert student_t_quantile(p, df) == pytest.approx(expected, abs=2e-8)
    assert student_t_quantile(1 - p, df) == pytest.approx(-expected, abs=2e-8)


def test_t_cdf_by_hand():
    assert student_t_cdf(0.0, 5) == pytest.approx(0.5)
    assert student_t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert student_t_cdf(-1.0, 2) == pytest.approx(0.5 - 1 / (2 * math.sqrt(3)))  # df 2: 1/2 + t / (2 sqrt(2 + t^2))


def test_wilcoxon_exact_by_hand():
    # All five positive: W- = 0; only 1 of the 2**5 sign patterns has W- = 0, two-sided p = 2/32.
    assert wilcoxon_signed_rank([1, 2, 3, 4, 5]) == (0.0, 0.0625)
    # Zeros are dropped: the same test.
    assert wilcoxon_signed_rank([0, 5, 4, 0, 3, 2, 1]) == (0.0, 0.0625)
    # W- = 2 (the rank of -2); subsets of {1..6} with sum <= 2: {}, {1}, {2}: p = 2 * 3/64.
    assert wilcoxon_signed_rank([1, -2, 3, 4, 5, 6]) == (2.0, 0.09375)
    # W+ = 1 + 4 = W- = 2 + 3: 9 of the 16 subsets of {1..4} sum to <= 5, so p = 2 * 9/16, capped at 1.
    assert wilcoxon_signed_rank([1, -2, -3, 4]) == (5.0, 1.0)
    assert wilcoxon_signed_rank([0, 0, 0]) == (0.0, 1.0)


def test_wilcoxon_exact_matches_enumeration():
    rng = np.random.default_rng(0)
    d = rng.normal(0.3, 1.0, size=9)
    statistic, p = wilcoxon_signed_rank(d)
    ranks = np.argsort(np.argsort(np.abs(d))) + 1
    sums = [sum(r for r, sign in zip(ranks, signs) if sign) for signs in itertools.product((0, 1), repeat=9)]
    assert p == pytest.approx(min(1.0, 2 * np.mean(np.array(sums) <= statistic)))


def test_wilcoxon_normal_approximation_with_ties_by_hand():
    # |d| = 1, 1, 1, 2, 2, 2: average ranks 2 and 5; W+ = 2 + 2 + 5 + 5 + 5 = 19, W- = 2.
    # mean n(n+1)/4 = 10.5; variance n(n+1)(2n+1)/24 - sum(t^3 - t)/48 = 22.75 - (24 + 24)/48 = 21.75.
    statistic, p = wilcoxon_signed_rank([1, 1, -1, 2, 2, 2])
    assert statistic == 2.0
    assert p == pytest.approx(math.erfc(abs(2 - 10.5) / math.sqrt(21.75) / math.sqrt(2)))


def test_wilcoxon_normal_approximation_above_the_exact_limit():
    # 60 distinct positive differences: W- = 0, mean 915, variance 60 * 61 * 121 / 24 = 18452.5.
    statistic, p = wilcoxon_signed_rank(np.arange(1, 61))
    assert statistic == 0.0
    assert p == pytest.approx(math.erfc(915 / math.sqrt(18452.5) / math.sqrt(2)), rel=1e-12)


def test_paired_difference_by_hand():
    result = paired_difference([2, 3, 4, 5, 6], [1, 1, 1, 1, 1])
    # Differences 1..5: mean 3, std sqrt(2.5), t(0.975, 4) = 2.776445105, half-width t * std / sqrt(5).
    half = 2.776445105 * math.sqrt(2.5) / math.sqrt(5)
    assert result.n == 5 and result.mean == 3.0 and result.std == pytest.approx(math.sqrt(2.5))
    assert result.ci_low == pytest.approx(3 - half) and result.ci_high == pytest.approx(3 + half)
    assert result.wilcoxon_p == 0.0625 and (result.wins, result.losses) == (5, 0)
    assert set(result.as_dict()) >= {"mean", "ci_low", "ci_high", "wilcoxon_p"}
    flipped = paired_difference([1, 1, 1, 1, 1], [2, 3, 4, 5, 6])
    assert flipped.mean == -3.0 and flipped.ci_high == pytest.approx(-3 + half) and flipped.wilcoxon_p == 0.0625


def test_mean_interval_by_hand():
    mean, half = mean_interval([1.0, 2.0, 3.0])
    assert mean == 2.0 and half == pytest.approx(4.302652730 * 1.0 / math.sqrt(3))
    assert mean_interval([0.5]) == (0.5, 0.0)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="one value per seed in both arms, got 3 and 2"):
        paired_difference([1, 2, 3], [1, 2])
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_difference([1], [0])
    with pytest.raises(ValueError, match="non-finite"):
        wilcoxon_signed_rank([1.0, float("nan")])
    with pytest.raises(ValueError, match="p must be in"):
        student_t_quantile(1.0, 3)


@settings(deadline=None, max_examples=40)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=2, max_size=40), st.floats(0.5, 0.99))
def test_interval_contains_the_mean_and_grows_with_confidence(values, confidence):
    result = paired_difference(np.array(values), np.zeros(len(values)), confidence=confidence)
    assert result.ci_low <= result.mean <= result.ci_high
    wider = paired_difference(np.array(values), np.zeros(len(values)), confidence=min(0.999, confidence + 0.005))
    assert wider.ci_high - wider.ci_low >= result.ci_high - result.ci_low - 1e-12
    assert 0.0 <= result.wilcoxon_p <= 1.0
