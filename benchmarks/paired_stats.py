"""Paired statistics for benchmark arms run on the same seeds.

Two arms of a benchmark that share a seed share everything random that the seed decides (tasks,
initial states, sampling noise where it is common), so the per-seed difference between them is
the quantity to test. :func:`paired_difference` reports its mean with a Student-t confidence
interval, the paired t-test's p-value and the two-sided Wilcoxon signed-rank p-value (no normality
assumption). :func:`holm_adjusted` and :func:`adjust_family` correct a benchmark's declared family of
comparisons for multiplicity.

The Wilcoxon test drops zero differences and gives tied |differences| their average rank. For at
most 50 non-zero differences its p-value is exact: the null distribution of the signed-rank sum
given those ranks, ties included (the sign of each rank flips with probability 1/2), as R's
``exactRankTests::wilcox.exact`` computes it; above 50, the normal approximation with the tie
correction of the variance and no continuity correction. numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

EXACT_WILCOXON_MAX_N = 50
"""Largest number of non-zero differences for which the exact Wilcoxon distribution is used (ties
or not)."""


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta function I_x(a, b), by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):  # the fraction converges fast below this point; use the symmetry
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def student_t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t distribution with ``df`` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
    return 1.0 - tail if t > 0 else tail


def student_t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (bisection on the CDF)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1), got {p}")
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if p < 0.5:
        return -student_t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while student_t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        middle = 0.5 * (low + high)
        if student_t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
        if high - low <= 1e-13 * max(1.0, high):
            break
    return 0.5 * (low + high)


def _average_ranks(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranks 1..n of ``values`` with ties sharing their average rank, and the size of each tie group."""
    uniques, inverse, counts = np.unique(values, return_inverse=True, return_counts=True)
    last_rank = np.cumsum(counts)
    return (last_rank - (counts - 1) / 2.0)[inverse], counts


def _signed_rank_counts(weights: np.ndarray) -> np.ndarray:
    """Number of subsets of the positive integer ``weights`` with each sum 0..sum(weights): the exact
    null distribution of a signed-rank sum times 2**n."""
    counts = np.zeros(int(weights.sum()) + 1, dtype=np.float64)
    counts[0] = 1.0
    for weight in weights.astype(int):  # one pass per rank (n <= EXACT_WILCOXON_MAX_N), not per sample
        counts[weight:] += counts[:-weight].copy()
    return counts


def wilcoxon_signed_rank(differences: np.ndarray) -> tuple[float, float]:
    """``(statistic, p)`` of the two-sided Wilcoxon signed-rank test that ``differences`` are
    symmetric about 0. The statistic is min(W+, W-), the smaller signed-rank sum; p is 1.0 when
    every difference is 0. See the module docstring for zeros, ties and the exact/normal choice."""
    d = np.asarray(differences, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(d)):
        raise ValueError("wilcoxon_signed_rank: differences contain non-finite values")
    d = d[d != 0.0]
    n = len(d)
    if n == 0:
        return 0.0, 1.0
    ranks, tie_sizes = _average_ranks(np.abs(d))
    w_plus = float(ranks[d > 0].sum())
    statistic = min(w_plus, n * (n + 1) / 2.0 - w_plus)
    if n <= EXACT_WILCOXON_MAX_N:
        counts = _signed_rank_counts(2 * ranks)  # average ranks are whole or halves: doubled, integers
        p = 2.0 * float(counts[: int(round(2 * statistic)) + 1].sum()) / 2.0**n
        return statistic, min(1.0, p)
    mean = n * (n + 1) / 4.0
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - float((tie_sizes**3 - tie_sizes).sum()) / 48.0
    z = (statistic - mean) / math.sqrt(variance)
    return statistic, min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


def paired_t_p(differences: np.ndarray) -> float:
    """Two-sided p-value of the paired t-test that the mean of ``differences`` is 0 (n - 1 degrees
    of freedom): the test whose confidence interval :func:`paired_difference` reports. Differences
    that are all equal give 1.0 when they are 0 and 0.0 otherwise."""
    d = np.asarray(differences, dtype=np.float64).reshape(-1)
    std = float(d.std(ddof=1))
    if std == 0.0:
        return 1.0 if float(d.mean()) == 0.0 else 0.0
    t = abs(float(d.mean())) / (std / math.sqrt(len(d)))
    return min(1.0, 2.0 * (1.0 - student_t_cdf(t, len(d) - 1)))


def holm_adjusted(p_values: np.ndarray) -> np.ndarray:
    """Holm's step-down adjustment of a family of p-values, in their order: the i-th smallest of m
    is multiplied by m - i + 1, then made non-decreasing in that order and capped at 1. A comparison
    is significant at level alpha, with the family-wise error held at alpha, when its adjusted p is
    below alpha."""
    p = np.asarray(p_values, dtype=np.float64).reshape(-1)
    if len(p) == 0 or not np.all((p >= 0) & (p <= 1)):
        raise ValueError(f"holm_adjusted needs p-values in [0, 1], got {p.tolist()}")
    order = np.argsort(p, kind="stable")
    stepped = np.minimum(1.0, np.maximum.accumulate((len(p) - np.arange(len(p))) * p[order]))
    adjusted = np.empty_like(p)
    adjusted[order] = stepped
    return adjusted


@dataclass(frozen=True)
class PairedDifference:
    """Summary of per-seed differences ``treatment - baseline``."""

    n: int
    """Number of pairs (seeds)."""
    mean: float
    """Mean difference."""
    std: float
    """Sample standard deviation (n - 1) of the differences."""
    ci_low: float
    """Lower end of the two-sided Student-t confidence interval of the mean."""
    ci_high: float
    """Upper end of that interval."""
    confidence: float
    """Coverage of the interval (0.95 by default)."""
    wilcoxon_statistic: float
    """min(W+, W-), the smaller signed-rank sum of the non-zero differences."""
    wilcoxon_p: float
    """Two-sided Wilcoxon signed-rank p-value."""
    t_p: float
    """Two-sided paired t-test p-value (the test of the interval)."""
    wins: int
    """Pairs where the treatment is higher."""
    losses: int
    """Pairs where the treatment is lower."""

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def paired_difference(treatment: np.ndarray, baseline: np.ndarray, *, confidence: float = 0.95) -> PairedDifference:
    """Paired comparison of two arms measured on the same seeds (element ``i`` of both arrays
    belongs to seed ``i``): mean difference, its t-interval and the Wilcoxon signed-rank p-value."""
    treatment = np.asarray(treatment, dtype=np.float64).reshape(-1)
    baseline = np.asarray(baseline, dtype=np.float64).reshape(-1)
    if len(treatment) != len(baseline):
        raise ValueError(
            f"paired_difference needs one value per seed in both arms, got {len(treatment)} and {len(baseline)}"
        )
    if len(treatment) < 2:
        raise ValueError(f"paired_difference needs at least 2 pairs, got {len(treatment)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    differences = treatment - baseline
    n = len(differences)
    mean = float(differences.mean())
    std = float(differences.std(ddof=1))
    half = student_t_quantile(0.5 + confidence / 2.0, n - 1) * std / math.sqrt(n)
    statistic, p = wilcoxon_signed_rank(differences)
    return PairedDifference(
        n=n,
        mean=mean,
        std=std,
        ci_low=mean - half,
        ci_high=mean + half,
        confidence=confidence,
        wilcoxon_statistic=statistic,
        wilcoxon_p=p,
        t_p=paired_t_p(differences),
        wins=int((differences > 0).sum()),
        losses=int((differences < 0).sum()),
    )


def mean_interval(values: np.ndarray, *, confidence: float = 0.95) -> tuple[float, float]:
    """Mean of ``values`` and the half-width of its Student-t confidence interval (0 for one value)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    if len(values) == 0:
        raise ValueError("mean_interval needs at least one value")
    if len(values) == 1:
        return float(values[0]), 0.0
    half = student_t_quantile(0.5 + confidence / 2.0, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean()), float(half)


@dataclass(frozen=True)
class AdjustedComparison:
    """One comparison of a declared family, corrected for the family's size."""

    difference: PairedDifference
    """The comparison alone (unadjusted interval and p-values)."""
    family_size: int
    """How many comparisons the family declares."""
    holm_t_p: float
    """Holm-adjusted paired t-test p-value."""
    holm_wilcoxon_p: float
    """Holm-adjusted Wilcoxon p-value."""
    ci_low: float
    """Lower end of the Bonferroni interval (confidence 1 - alpha / m), which holds for every member
    of the family at once; Holm's p-values are never larger than Bonferroni's."""
    ci_high: float
    """Upper end of that interval."""

    def significant(self, alpha: float = 0.05) -> bool:
        """Whether the family-wise test rejects a zero mean difference (Holm, on the t-test)."""
        return self.holm_t_p < alpha

    def as_dict(self) -> dict[str, float | int]:
        return {
            **self.difference.as_dict(),
            "family_size": self.family_size,
            "holm_t_p": self.holm_t_p,
            "holm_wilcoxon_p": self.holm_wilcoxon_p,
            "adjusted_ci_low": self.ci_low,
            "adjusted_ci_high": self.ci_high,
        }


def adjust_family(family: dict[str, PairedDifference]) -> dict[str, AdjustedComparison]:
    """Each comparison of ``family`` (all the comparisons a benchmark declared, by name, each from
    :func:`paired_difference` at one confidence) with Holm-adjusted p-values and a Bonferroni
    interval."""
    if not family:
        raise ValueError("adjust_family needs at least one comparison")
    names, results = list(family), list(family.values())
    confidence = {r.confidence for r in results}
    if len(confidence) != 1:
        raise ValueError(f"the comparisons of one family share one confidence, got {sorted(confidence)}")
    m, alpha = len(results), 1.0 - results[0].confidence
    holm_t = holm_adjusted(np.array([r.t_p for r in results]))
    holm_w = holm_adjusted(np.array([r.wilcoxon_p for r in results]))
    adjusted = {}
    for name, r, t_p, w_p in zip(names, results, holm_t, holm_w):
        half = student_t_quantile(1.0 - alpha / (2 * m), r.n - 1) * r.std / math.sqrt(r.n)
        adjusted[name] = AdjustedComparison(r, m, float(t_p), float(w_p), r.mean - half, r.mean + half)
    return adjusted
