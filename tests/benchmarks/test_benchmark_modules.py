"""Every benchmark script imports (a figure in the docs must trace to a script that still runs) and is
installed with the project, and the credit-ops benchmark times the same numbers as its per-row loop."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_module_imports(name):
    importlib.import_module(f"agent_rl.benchmarks.{name}")


def test_credit_ops_vectorized_credit_equals_the_per_row_loop():
    from agent_rl.benchmarks.credit_ops import per_row_loop, synthetic_batch, vectorized

    batch = synthetic_batch(2_000, seed=3)
    expected = per_row_loop(*(batch[k].tolist() for k in ("rewards", "traj", "group", "keys")))
    np.testing.assert_allclose(vectorized(batch), expected, rtol=1e-9, atol=1e-9)
    assert np.abs(vectorized(batch)).max() > 0.1  # credit that is not all zero


def test_credit_ops_graph_credit_sees_merged_groups():
    from agent_rl.benchmarks.credit_ops import graph_credit, synthetic_batch

    batch = synthetic_batch(2_000, seed=3)
    advantages = graph_credit(batch)
    assert advantages.shape == (2_000,) and np.isfinite(advantages).all()
    assert np.count_nonzero(advantages) > 1_000  # states recur, so most groups' trajectories meet


def test_the_benchmarks_are_installed_with_the_project_and_their_results_are_not():
    import tomllib

    from agent_rl.cli import BENCHMARKS as CLI_BENCHMARKS

    setuptools_table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools_table["package-dir"]["agent_rl.benchmarks"] == "benchmarks"
    assert "agent_rl.benchmarks" in setuptools_table["packages"]
    assert not [p for p in setuptools_table["packages"] if "results" in p]
    assert set(CLI_BENCHMARKS.values()) <= set(BENCHMARKS)


def test_suite_time_sums_each_module_from_pytests_junit_xml(tmp_path):
    from agent_rl.benchmarks.suite_time import by_module, seconds_by_test

    junit = tmp_path / "junit.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a.test_x" name="test_one" time="1.5"/>'
        '<testcase classname="tests.a.test_x" name="test_two[grpo]" time="2.25"/>'
        '<testcase classname="tests.test_y" name="test_three" time="4.0"><skipped/></testcase>'
        "</testsuite></testsuites>"
    )
    times = seconds_by_test(junit)
    assert times == {
        "tests/a/test_x.py::test_one": 1.5,
        "tests/a/test_x.py::test_two[grpo]": 2.25,
        "tests/test_y.py::test_three": 4.0,
    }
    assert list(by_module(times).items()) == [("tests/test_y.py", 4.0), ("tests/a/test_x.py", 3.8)]
