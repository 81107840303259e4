"""Every paired figure the README and docs/benchmarks.md quote, ``estimate [low, high]``, comes
from a committed result: a summary under ``benchmarks/results/`` (not a run's own files) states
all three numbers together (one figure of a markdown summary, one JSON object) at the precision
quoted, in points or as fractions. A figure with no source fails."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ("README.md", "docs/benchmarks.md")
FIGURE = re.compile(r"([+-]?\d+(?:\.\d+)?)(?: [a-z]+)? \[(?:95% CI )?([+-]?\d+(?:\.\d+)?), ([+-]?\d+(?:\.\d+)?)\]")
"""``+93.1 [+88.9, +97.4]``, ``+93.1 points [+88.9, +97.4]``, ``-0.21 attempts [-0.40, -0.02]``."""


def number_groups(path: Path) -> list[list[float]]:
    """The numbers a summary states together: each figure of a markdown summary, each JSON object's
    own numeric values (an estimate with its interval bounds, say)."""
    text = path.read_text(errors="ignore")
    if path.suffix == ".md":
        return [[float(part) for part in figure] for figure in FIGURE.findall(text)]
    groups: list[list[float]] = []

    def walk(value) -> None:
        if isinstance(value, dict):
            groups.append([float(v) for v in value.values() if isinstance(v, (int, float)) and not isinstance(v, bool)])
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(json.loads(text))
    return groups


def holds_figure(group: list[float], figure: tuple[str, ...]) -> bool:
    """Whether ``group`` holds every part of ``figure`` rounded as quoted, all as stated or all as
    percentages of fractions."""

    def rounded(quoted: str) -> tuple[float, int]:
        places = len(quoted.partition(".")[2])
        return round(float(quoted), places), places

    parts = [rounded(quoted) for quoted in figure]
    return any(
        all(any(round(scale * x, places) == target for x in group) for target, places in parts) for scale in (1, 100)
    )


@pytest.fixture(scope="module")
def summaries() -> list[list[float]]:
    files = [
        p for p in RESULTS.rglob("*") if p.suffix in (".md", ".json") and "runs" not in p.relative_to(RESULTS).parts
    ]
    return [group for path in files for group in number_groups(path)]


def test_the_checks_can_fail():
    assert holds_figure([0.931, 0.889, 0.974], ("+93.1", "+88.9", "+97.4"))  # fractions, quoted in points
    assert holds_figure([-0.21, -0.4, -0.02], ("-0.21", "-0.40", "-0.02"))
    assert not holds_figure([0.931, 0.889], ("+93.1", "+88.9", "+97.4"))  # one bound has no source
    assert not holds_figure([0.931, 0.889, 97.4], ("+93.1", "+88.9", "+97.4"))  # one scale for all three
    assert not holds_figure([93.14, 88.9, 97.4], ("+93.2", "+88.9", "+97.4"))  # rounds to 93.1
    assert FIGURE.findall("by +93.1 points [+88.9, +97.4], and -0.3 [-5.6, +5.0]") == [
        ("+93.1", "+88.9", "+97.4"),
        ("-0.3", "-5.6", "+5.0"),
    ]


@pytest.mark.parametrize("doc", DOCS)
def test_every_quoted_interval_has_a_committed_source(doc, summaries):
    figures = [match for match in FIGURE.finditer((ROOT / doc).read_text())]
    assert figures or doc == "README.md"
    unsourced = [m.group(0) for m in figures if not any(holds_figure(group, m.groups()) for group in summaries)]
    assert not unsourced, f"{doc} quotes figures no summary under benchmarks/results holds: {unsourced}"
