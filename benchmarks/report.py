"""What the benchmarks that train report with: curve areas, seed means, text formats and the two plots
(learning curves with their seed interval, and paired per-seed differences)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from agent_rl.benchmarks.paired_stats import mean_interval


def area_under(iterations: Sequence[float], values: Sequence[float]) -> float:
    """Mean height of the piecewise-linear curve through the points (the AUC over the iteration span)."""
    x, y = np.asarray(iterations, dtype=np.float64), np.asarray(values, dtype=np.float64)
    if len(y) < 2:
        return float(y[0]) if len(y) else 0.0
    return float(np.trapezoid(y, x) / (x[-1] - x[0]))


def logged(records: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """The values of metric ``key`` in the records (``metrics.jsonl`` lines) that log it, in order."""
    return [float(r[key]) for r in records if r.get(key) is not None]


def seed_mean(values: Sequence[float]) -> dict[str, float]:
    """Mean over seeds with the half-width of its 95% t-interval (0 for one seed) and the seed count."""
    mean, half = mean_interval(np.asarray(values, dtype=np.float64))
    return {"mean": mean, "ci95": half, "n": len(values)}


def percent(x: float | None) -> str:
    """A fraction as a percentage; "-" where it was not measured."""
    return "-" if x is None or np.isnan(x) else f"{100 * x:.1f}%"


def p_value(p: float) -> str:
    """A p-value to three decimals; one that rounds to zero as "< 0.001" (a p-value is never 0)."""
    return "< 0.001" if p < 0.0005 else f"= {p:.3f}"


def signed_points(x: float) -> str:
    return "-" if np.isnan(x) else f"{x:+.1f}"


def mean_with_interval(i: Mapping[str, float]) -> str:
    """A mean in points with its interval (``ci_low``, ``ci_high``); "-" when not measured, no interval
    from a single seed (``n``)."""
    if np.isnan(i["mean"]):
        return "-"
    if i["n"] < 2:
        return f"{i['mean']:+.1f} (one seed, no interval)"
    return f"{i['mean']:+.1f} [{i['ci_low']:+.1f}, {i['ci_high']:+.1f}]"


def mean_plus_minus(x: Mapping[str, float] | None) -> str:
    """A :func:`seed_mean` of fractions in points, ``mean ± half-width``; "-" for none."""
    if x is None:
        return "-"
    return f"{100 * x['mean']:.1f}" + (f" ± {100 * x['ci95']:.1f}" if x["n"] > 1 else " (one seed)")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(
    path: Path,
    panels: Mapping[str, Mapping[str, tuple[Sequence[float], Sequence[Sequence[float]]]]],
    ylabel: str,
) -> None:
    """One panel per title; in each, one line per series: ``(iterations, per-seed curves)``, drawn as
    the mean over seeds with its 95% interval band and each seed's curve faintly."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels) + 1, 3.4), squeeze=False, sharey=True)
    for ax, (title, series) in zip(axes[0], panels.items()):
        for color, (label, (x, curves)) in enumerate(series.items()):
            curves = np.asarray(curves, dtype=np.float64)
            mean = curves.mean(axis=0)
            ax.plot(x, mean, marker=".", color=f"C{color}", label=f"{label} ({len(curves)} seeds)")
            for curve in curves:
                ax.plot(x, curve, color=f"C{color}", alpha=0.2, lw=0.8)
            if len(curves) > 1:
                half = np.array([mean_interval(column)[1] for column in curves.T])
                ax.fill_between(x, mean - half, mean + half, color=f"C{color}", alpha=0.15)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_paired(path: Path, rows: Mapping[str, Mapping[str, Any]], xlabel: str) -> None:
    """One row per comparison: each seed's difference (``per_seed``) and their ``mean`` with its
    interval (``ci_low``, ``ci_high``), in the units given."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 0.9 + 0.6 * len(rows)))
    for row, d in enumerate(rows.values()):
        ax.scatter(d["per_seed"], np.full(len(d["per_seed"]), row), color="0.5", s=14, zorder=2)
        error = [[d["mean"] - d["ci_low"]], [d["ci_high"] - d["mean"]]]
        ax.errorbar(d["mean"], row, xerr=error, fmt="o", color="C0", capsize=4, zorder=3)
    ax.axvline(0, color="k", lw=0.8)
    ax.set_yticks(range(len(rows)), list(rows))
    ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
