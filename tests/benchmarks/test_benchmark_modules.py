"""Every benchmark script imports (a figure in the docs must trace to a script that still runs), and
the credit-ops benchmark times the same numbers as its per-row loop."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pytest

BENCHMARKS = sorted(p.stem for p in (Path(__file__).resolve().parents[2] / "benchmarks").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_module_imports(name):
    importlib.import_module(f"benchmarks.{name}")


def test_credit_ops_vectorized_credit_equals_the_per_row_loop():
    from benchmarks.credit_ops import per_row_loop, synthetic_batch, vectorized

    batch = synthetic_batch(2_000, seed=3)
    expected = per_row_loop(*(batch[k].tolist() for k in ("rewards", "traj", "group", "keys")))
    np.testing.assert_allclose(vectorized(batch), expected, rtol=1e-9, atol=1e-9)
    assert np.abs(vectorized(batch)).max() > 0.1  # credit that is not all zero
