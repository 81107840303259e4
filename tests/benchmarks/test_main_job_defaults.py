"""The main-job comparison's statistics, on hand-made curves (no training)."""

from __future__ import annotations

import pytest

from benchmarks.main_job_defaults import auc, main, summarize


def curve(values):
    return {"iteration": [0, 2, 4], "greedy_success": values}


def test_auc_is_the_trapezoid_mean_over_the_span():
    # (0.5 + 0.7) / 2 * 2 + (0.7 + 0.3) / 2 * 2 = 2.2 over a span of 4
    assert auc(curve([0.5, 0.7, 0.3])) == pytest.approx(0.55)


def test_summary_pairs_each_seed_with_the_baseline():
    curves = {
        "previous": {0: curve([0.5, 0.6, 0.6]), 1: curve([0.4, 0.4, 0.5]), 2: curve([0.6, 0.7, 0.7])},
        "new": {0: curve([0.5, 0.6, 0.7]), 1: curve([0.4, 0.5, 0.7]), 2: curve([0.6, 0.6, 0.6])},
    }
    summary = summarize(curves, [0, 1, 2])
    assert summary["previous"]["final_greedy_success"]["mean"] == pytest.approx(0.6)
    assert summary["new"]["mean_curve"] == pytest.approx([0.5, 17 / 30, 2 / 3])
    paired = summary["new"]["paired_vs_previous"]
    assert paired["per_seed_final"] == pytest.approx([0.1, 0.2, -0.1])
    assert paired["final"]["mean"] == pytest.approx(0.2 / 3)
    assert (paired["final"]["wins"], paired["final"]["losses"]) == (2, 1)
    assert paired["final"]["ci_low"] < paired["final"]["mean"] < paired["final"]["ci_high"]
    assert "paired_vs_previous" not in summary["previous"]


def test_unknown_arm_is_an_error_naming_it(capsys):
    with pytest.raises(SystemExit):
        main(["--arms", "previous,bogus", "--summarize-only"])
    assert "unknown arm(s) bogus" in capsys.readouterr().err
