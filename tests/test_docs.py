"""The docs' code: every Python block of README.md and docs/*.md compiles, the quickstart runs, and
the reference tables agree with the code."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_train import TINY_TRAIN  # tests/

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.name)
def test_python_blocks_compile(path):
    for number, code in enumerate(python_blocks(path)):
        compile(code, f"{path.name} block {number}", "exec")


def test_the_quickstart_block_declares_its_sizes_on_one_line():
    (code,) = python_blocks(ROOT / "docs" / "quickstart.md")
    assert len(re.findall(r"^sizes = \[.*\]", code, flags=re.M)) == 1
    assert len(code.splitlines()) <= 30


def test_the_readme_quickstart_is_the_docs_quickstart():
    assert python_blocks(ROOT / "README.md")[0] == python_blocks(ROOT / "docs" / "quickstart.md")[0]


@pytest.mark.slow
def test_the_quickstart_runs(tmp_path):
    """The quickstart's code (the README's) with its sizes shrunk: both runs train and write their run
    directory."""
    (code,) = python_blocks(ROOT / "docs" / "quickstart.md")
    code = re.sub(r"^sizes = \[.*\]", f"sizes = {TINY_TRAIN!r}", code, flags=re.M)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for run in ("quickstart-maze", "quickstart-say"):
        records = [json.loads(line) for line in (tmp_path / "runs" / run / "metrics.jsonl").read_text().splitlines()]
        assert [r["iteration"] for r in records] == [0, 1] and "eval/greedy_success" in records[-1]


def test_the_preset_table_is_the_code():
    from agent_rl.config import ALGORITHM_PRESETS

    text = (ROOT / "docs" / "algorithms.md").read_text()
    for name, parts in ALGORITHM_PRESETS.items():
        step = (
            f"yes ({parts['step_normalize']})"
            if parts["step_credit"] != "none"
            else f"no ({parts['step_normalize']} when turned on)"
        )
        assert f"| `{name}` | {parts['advantage']} | {step} | `{parts['loss']}` |" in text, name


def test_the_config_reference_is_the_schema():
    # Regenerate with: python -m agent_rl.config.reference --write docs/training.md
    from agent_rl.config.reference import between_markers, markdown

    text = (ROOT / "docs" / "training.md").read_text()
    start, end = between_markers(text)
    assert text[start:end].strip() == markdown().strip()
    assert all(f"| `{key}` |" in text for key in ("env.id", "algo.step_credit", "scale.num_gpus_per_replica"))


def test_links_between_pages_resolve():
    for path in PAGES:
        for target in re.findall(r"\]\(([^)#]+\.md)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).is_file(), f"{path.name} links to missing {target}"
