"""Shared fixtures."""

from __future__ import annotations

import pytest


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
