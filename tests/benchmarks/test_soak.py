"""benchmarks/soak.py: the growth fit (hand-computed), the flat verdicts, and a short soak run."""

from __future__ import annotations

import numpy as np
import pytest
from rich.console import Console

from agent_rl.benchmarks.soak import growth_per_100, process_sample, soak, verdict


def test_growth_is_the_least_squares_slope_per_100_iterations_with_its_t_interval():
    exact = growth_per_100(np.arange(4), np.array([1.0, 3.0, 5.0, 7.0]))
    assert exact == {"per_100": 200.0, "low": 200.0, "high": 200.0, "mean": 4.0}
    # Slope 1/5 (cov 1, var 5); residuals -.2, .6, -.6, .2: stderr sqrt(0.8 / 2 / 5); t(0.975, 2) = 4.3027.
    noisy = growth_per_100(np.arange(4), np.array([0.0, 1.0, 0.0, 1.0]))
    assert noisy["per_100"] == pytest.approx(20.0)
    assert noisy["high"] - noisy["per_100"] == pytest.approx(100 * 4.302653 * np.sqrt(0.08), rel=1e-5)
    with pytest.raises(ValueError, match="at least 3 samples"):
        growth_per_100(np.arange(2), np.ones(2))


def test_counts_must_come_back_and_memory_may_wobble_or_shrink():
    climbing, wobbling = np.array([58.0, 58, 59, 60]), np.array([58.0, 59, 58, 59])
    x = np.arange(4)
    for count in ("open_fds", "threads", "child_processes", "python_objects"):
        assert not verdict(count, climbing, growth_per_100(x, climbing))
        assert verdict(count, wobbling, growth_per_100(x, wobbling))
    rss = np.array([1000.0, 1002, 1004, 1006])  # exact growth of 200 MB per 100 iterations: 20% of the mean
    assert not verdict("rss_mb", rss, growth_per_100(x, rss))
    slow = np.array([1000.0, 1000.02, 1000.04, 1000.06])  # 2 MB per 100 iterations: under 1% of the mean
    assert verdict("rss_mb", slow, growth_per_100(x, slow))
    assert verdict("rss_mb", rss[::-1], growth_per_100(x, rss[::-1]))  # shrinking is no leak


def test_a_process_sample_reads_this_process():
    sample = process_sample()
    assert sample["rss_mb"] > 10 and sample["open_fds"] >= 3 and sample["threads"] >= 1 and sample["python_objects"] > 0


@pytest.mark.slow
def test_a_short_soak_records_every_iteration_and_holds_its_descriptors(tmp_path):
    tiny_maze = (
        "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 4}"
    )
    overrides = [
        tiny_maze,
        "engine=hf",
        "rollout.max_turns=3",
        "rollout.max_new_tokens=8",
        "sft.steps=2",
        "sft.episodes=2",
        "trainer.eval_episodes=2",
        "trainer.eval_every=2",
        "logging.tensorboard=true",
    ]
    result = soak(6, 1, overrides, tmp_path / "run", Console(quiet=True))
    assert [s["iteration"] for s in result["samples"]] == [0, 1, 2, 3, 4, 5, 6]
    assert result["summary"]["iterations"] == 6
    assert result["flat"]["open_fds"] and result["flat"]["child_processes"] and result["flat"]["threads"]
    assert set(result["growth_per_100_iterations"]) == set(result["flat"])
