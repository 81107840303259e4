"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker, and per process a test starts: one per core
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray for the session (2 CPUs, like this machine). Skips only when ray is absent."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    """The embedded policy and its tokenizer, loaded once per test module (tests may train it)."""
    from agent_rl.training.models.policy import load_policy

    return load_policy("embedded")
