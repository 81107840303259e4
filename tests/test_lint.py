"""The tree passes ruff's lint and format checks (configured in pyproject.toml; ruff is in the dev extra)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff_finds_nothing_to_change(command):
    done = subprocess.run([sys.executable, "-m", "ruff", *command, str(ROOT)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
