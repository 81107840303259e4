"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # one thread per worker, and per process a test starts: one per core
    import torch

    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


SPLIT_MODULES = frozenset(
    {
        "tests/training/test_trainer.py",
        "tests/training/test_learning.py",
        "tests/training/test_env_faults.py",
        "tests/benchmarks/test_bench_credit.py",
        "tests/benchmarks/test_lift.py",
    }
)
"""Modules of long tests that share no costly fixture: each test function (its parametrizations
together) is a unit of work of its own, so the two workers share these modules' time."""
SHARED_SCOPES = {"tests/training/test_envpool.py": "ray", "tests/training/test_distributed.py": "ray"}
"""Modules that share one costly session fixture (a local Ray): one unit of work, on one worker."""


def work_unit(nodeid: str) -> str:
    """The unit of work a test belongs to: tests of one unit run on one worker, one after another, so
    a module fixture is built once. A module is a unit unless it is split or shares a scope."""
    module = nodeid.split("::", 1)[0]
    if module in SPLIT_MODULES:
        return nodeid.split("[", 1)[0]
    return SHARED_SCOPES.get(module, module)


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class WorkUnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    return WorkUnitScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The slow tests first: the units of work start in this order (pyproject.toml turns off xdist's
    own reordering), so the long ones start early and the short ones fill the gaps at the end. In one
    process (``-n 0``) the order stays as collected: a module's tests together."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


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
