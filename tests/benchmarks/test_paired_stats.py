"""agent_rl.benchmarks.paired_stats: t quantiles, the Wilcoxon signed-rank and paired t-tests, paired
differences and Holm's adjustment, against hand-computed and tabulated values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.benchmarks.paired_stats import (
    adjust_family,
    holm_adjusted,
    mean_interval,
    paired_difference,
    paired_t_p,
    student_t_cdf,
    student_t_quantile,
    wilcoxon_signed_rank,
)

# Two-sided 95% (p = 0.975) and 99% (p = 0.995) quantiles of Student's t from the standard tables.
T_TABLE = [
    (0.975, 1, 12.706204736),
    (0.975, 2, 4.302652730),
    (0.975, 4, 2.776445105),
    (0.975, 10, 2.228138852),
    (0.975, 30, 2.042272456),
    (0.975, 99, 1.984216952),
    (0.975, 127, 1.978819535),
    (0.995, 7, 3.499483297),
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


def test_wilcoxon_exact_with_ties_by_hand():
    # |d| = 1, 1, 1, 2, 2, 2: average ranks 2 and 5; W+ = 2 + 2 + 5 + 5 + 5 = 19, W- = 2. Under the
    # null W- = 2a + 5b with a, b in 0..3 ranks of each kind negative, C(3, a) C(3, b) of 64 ways:
    # W- <= 2 for (a, b) = (0, 0) and (1, 0), 1 + 3 = 4 ways, so p = 2 * 4/64.
    assert wilcoxon_signed_rank([1, 1, -1, 2, 2, 2]) == (2.0, 0.125)


@settings(deadline=None, max_examples=30)
@given(st.lists(st.integers(-4, 4), min_size=1, max_size=10))
def test_wilcoxon_exact_with_ties_matches_enumeration(values):
    d = np.array([v for v in values if v != 0], dtype=float)
    statistic, p = wilcoxon_signed_rank(np.array(values, dtype=float))
    if len(d) == 0:
        assert (statistic, p) == (0.0, 1.0)
        return
    absolute = np.abs(d)
    ranks = np.array([(absolute < a).sum() + ((absolute == a).sum() + 1) / 2 for a in absolute])
    sums = [
        sum(r for r, negative in zip(ranks, signs) if negative) for signs in itertools.product((0, 1), repeat=len(d))
    ]
    assert statistic == min(ranks[d < 0].sum(), ranks[d > 0].sum())
    assert p == pytest.approx(min(1.0, 2 * np.mean(np.array(sums) <= statistic + 1e-9)))


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


def test_paired_t_p_by_hand():
    # Differences 1..5: t = 3 / (sqrt(2.5) / sqrt(5)) = sqrt(18). With 4 degrees of freedom the t CDF
    # has the closed form F(t) = 1/2 + (3/8) * (t / sqrt(1 + t^2/4)) * (1 - t^2 / (12 (1 + t^2/4))).
    t = math.sqrt(18.0)
    cdf = 0.5 + 3 / 8 * t / math.sqrt(1 + t * t / 4) * (1 - t * t / (12 * (1 + t * t / 4)))
    assert paired_t_p([1, 2, 3, 4, 5]) == pytest.approx(2 * (1 - cdf), rel=1e-9)
    assert paired_difference([2, 3, 4, 5, 6], [1, 1, 1, 1, 1]).t_p == pytest.approx(2 * (1 - cdf), rel=1e-9)
    assert paired_t_p([0.0, 0.0, 0.0]) == 1.0 and paired_t_p([2.0, 2.0]) == 0.0


def test_holm_by_hand():
    # Sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1: 0.02, 0.03, 0.06, 0.04; made non-decreasing:
    # 0.02, 0.03, 0.06, 0.06; back in the given order.
    np.testing.assert_allclose(holm_adjusted([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm_adjusted([0.3, 0.5]), [0.6, 0.6])
    assert holm_adjusted([0.04])[0] == 0.04
    with pytest.raises(ValueError, match=r"p-values in \[0, 1\]"):
        holm_adjusted([0.5, 1.5])


@settings(deadline=None, max_examples=60)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=12))
def test_holm_lies_between_the_raw_and_the_bonferroni_p_and_keeps_the_order(values):
    raw = np.array(values)
    adjusted = holm_adjusted(raw)
    assert np.all(adjusted >= raw - 1e-12) and np.all(adjusted <= np.minimum(1.0, len(raw) * raw) + 1e-12)
    order = np.argsort(raw, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= -1e-12)


def test_a_family_gets_holm_p_values_and_bonferroni_intervals():
    strong = paired_difference([2, 3, 4, 5, 6], [1, 1, 1, 1, 1])
    weak = paired_difference([1, -1, 2, 0.5, -0.5], [0, 0, 0, 0, 0])
    family = adjust_family({"strong": strong, "weak": weak})
    assert family["strong"].family_size == 2
    assert family["strong"].holm_t_p == pytest.approx(2 * strong.t_p)  # the smaller p, times 2
    assert family["weak"].holm_t_p == pytest.approx(max(weak.t_p, 2 * strong.t_p))
    assert family["strong"].holm_wilcoxon_p == pytest.approx(min(1.0, 2 * strong.wilcoxon_p))
    # Bonferroni for 2: t(1 - 0.05/4, 4) = 3.495406 (tables), times std / sqrt(n).
    half = 3.4954059 * math.sqrt(2.5) / math.sqrt(5)
    assert family["strong"].ci_low == pytest.approx(3 - half, rel=1e-6) and family["strong"].ci_high == pytest.approx(
        3 + half, rel=1e-6
    )
    assert family["strong"].significant() and not family["weak"].significant()
    assert family["strong"].as_dict()["adjusted_ci_low"] == family["strong"].ci_low
    with pytest.raises(ValueError, match="share one confidence"):
        adjust_family({"a": strong, "b": paired_difference([2, 3, 4, 5, 6], [1, 1, 1, 1, 1], confidence=0.9)})


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
