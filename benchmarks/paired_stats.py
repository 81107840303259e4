"""Paired statistics for benchmark arms run on the same seeds.

Two arms of a benchmark that share a seed share everything random that the seed decides (tasks,
initial states, sampling noise where it is common), so the per-seed difference between them is
the quantity to test. :func:`paired_difference` reports its mean with a Student-t confidence
interval and the two-sided Wilcoxon signed-rank p-value (no normality assumption).

The Wilcoxon test follows the usual conventions (those of ``scipy.stats.wilcoxon``'s defaults):
zero differences are dropped; the exact null distribution is used for at most 50 non-zero
differences without ties, otherwise the normal approximation with the tie correction of the
variance and no continuity correction. numpy and the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

EXACT_WILCOXON_MAX_N = 50
"""Largest number of non-zero differences for which the exact Wilcoxon distribution is used."""


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


def _signed_rank_counts(n: int) -> np.ndarray:
    """Number of subsets of {1..n} with each rank sum 0..n(n+1)/2: the exact null distribution of
    the Wilcoxon statistic W+ times 2**n."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=np.float64)
    counts[0] = 1.0
    for rank in range(1, n + 1):  # one pass per rank (n <= EXACT_WILCOXON_MAX_N), not per sample
        counts[rank:] += counts[:-rank].copy()
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
    if n <= EXACT_WILCOXON_MAX_N and np.all(tie_sizes == 1):
        counts = _signed_rank_counts(n)
        p = 2.0 * float(counts[: int(statistic) + 1].sum()) / 2.0**n
        return statistic, min(1.0, p)
    mean = n * (n + 1) / 4.0
    variance = n * (n + 1) * (2 * n + 1) / 24.0 - float((tie_sizes**3 - tie_sizes).sum()) / 48.0
    z = (statistic - mean) / math.sqrt(variance)
    return statistic, min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


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
        raise ValueError(f"paired_difference needs one value per seed in both arms, got {len(treatment)} and {len(baseline)}")
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
        n=n, mean=mean, std=std, ci_low=mean - half, ci_high=mean + half, confidence=confidence,
        wilcoxon_statistic=statistic, wilcoxon_p=p, wins=int((differences > 0).sum()), losses=int((differences < 0).sum()),
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
