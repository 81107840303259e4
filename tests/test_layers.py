"""The layers of the code base hold, one folder each: every import of the project's own modules, at
module level, inside a function or under ``if TYPE_CHECKING:``, points down or sideways within a
layer, and no chain of imports comes back to where it started.

    core        agent_rl.core.* (agent_rl/core/)                          numpy and torch only
    envs        agent_rl.envs.* (envs/)                                   and the core
    anchors     agent_rl.anchors.* (anchors/)                             and the core
    config      agent_rl.config.*                                         and the core
    training    agent_rl.training.* (training/)                           and the above
    top         agent_rl (the lazy facade), agent_rl.cli,
                agent_rl.benchmarks.* (benchmarks/)                       anything

Inside ``agent_rl.training`` its rooms are layered too, bottom up: ``models`` (policies, prompts), ``infra``
(resolution, checkpoints, distributed, logging), ``serving`` (engines, environment pools), ``loop``
(trainer, rollout, learner, warm start, evaluation).

An annotation-only import is still a dependency of the module's meaning, so it counts.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_rl", "envs", "anchors", "training", "benchmarks")
"""The repository's package folders; all but agent_rl/ install as subpackages of agent_rl."""
MAY_IMPORT = {
    "core": {"core"},
    "envs": {"core", "envs"},
    "anchors": {"core", "anchors"},
    "config": {"core", "config"},
    "training": {"core", "envs", "anchors", "config", "training"},
    "top": {"core", "envs", "anchors", "config", "training", "top"},
}


TRAINING_ROOMS = ("models", "infra", "serving", "loop")
"""``training``'s subpackages, bottom up: a room imports its own and the ones before it."""


def room(module: str) -> int | None:
    """The rank of ``module``'s room in ``TRAINING_ROOMS``; None outside them."""
    parts = module.split(".")[1:]
    return (
        TRAINING_ROOMS.index(parts[1])
        if parts[:1] == ["training"] and len(parts) > 2 and parts[1] in TRAINING_ROOMS
        else None
    )


def layer(module: str) -> str:
    """The layer of ``module``: the folder under ``agent_rl`` it lives in; the package's own modules
    (the facade, the CLI) and the benchmarks are the top."""
    package = module.split(".")[1] if module.count(".") else ""
    return {"core": "core", "envs": "envs", "anchors": "anchors", "config": "config", "training": "training"}.get(
        package, "top"
    )


def module_name(path: Path) -> str:
    """The installed name of the module in ``path``: ``training/loop/trainer.py`` is
    ``agent_rl.training.loop.trainer``."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    parts = parts[:-1] if parts[-1] == "__init__" else parts
    return ".".join(parts if parts[0] == "agent_rl" else ("agent_rl", *parts))


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project's modules ``path`` imports anywhere in its body (``from package import name``
    counts as the submodule when ``name`` is one, and as the package only for names it defines)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names}
            found.update(submodules)
            if not submodules <= known:  # names defined in the package itself
                found.add(node.module)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), filename=str(path)))
    return {name for name in found if name in known}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    return {module: imported_modules(path, set(files)) - {module} for module, path in files.items()}


GRAPH = import_graph()


def test_the_graph_sees_the_project():
    assert "agent_rl.config" in GRAPH["agent_rl.training.loop.trainer"]
    assert "agent_rl.training.loop.learner" in GRAPH["agent_rl.training.loop.trainer"]
    assert len(GRAPH) > 40
    assert {layer(m) for m in GRAPH} == set(MAY_IMPORT)  # every layer has a folder with modules in it
    assert {m for m in GRAPH if layer(m) == "core"} >= {"agent_rl.core.batch", "agent_rl.core.advantages"}


def test_annotation_only_and_function_level_imports_count(tmp_path):
    module = tmp_path / "knot.py"
    module.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from agent_rl.config import Config\n"
        "def f():\n    import agent_rl.training.loop.trainer\n"
    )
    known = {"agent_rl.config", "agent_rl.training.loop.trainer"}
    assert imported_modules(module, known) == known


def test_the_core_imports_numpy_and_torch_only():
    allowed = {"numpy", "torch", "agent_rl", "__future__", *sys.stdlib_module_names}
    for path in (ROOT / "agent_rl" / "core").glob("*.py"):
        tree = ast.parse(path.read_text())
        names = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        names |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        outside = sorted(name for name in names if name.split(".")[0] not in allowed)
        assert not outside, f"{path.name} imports {outside}"


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_down(module):
    upward = sorted(target for target in GRAPH[module] if layer(target) not in MAY_IMPORT[layer(module)])
    assert not upward, f"{module} ({layer(module)}) imports {[(t, layer(t)) for t in upward]}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if room(m) is not None))
def test_training_rooms_import_down(module):
    upward = sorted(t for t in GRAPH[module] if room(t) is not None and room(t) > room(module))
    assert not upward, f"{module} imports {upward}, in rooms above its own ({TRAINING_ROOMS})"


def test_no_import_cycles():
    """Depth-first search; a back edge is a cycle, reported as the chain of modules."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                cycles.append(path[path.index(target) :] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(GRAPH):
        if module not in state:
            visit(module)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)
