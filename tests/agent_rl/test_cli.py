"""The agent-rl command line: argument handling shared by the subcommands."""

from __future__ import annotations

import io
import sys

import pytest

from agent_rl.cli import main


def test_play_takes_key_values_before_and_after_options(monkeypatch, capsys):
    for argv in (
        ["play", "agent_rl/Maze-v0", "--seed", "3", "n_rooms=6"],
        ["play", "agent_rl/Maze-v0", "n_rooms=6", "--seed", "3"],
    ):
        monkeypatch.setattr(sys, "stdin", io.StringIO(":quit\n"))
        assert main(argv) == 0
        out = capsys.readouterr().out
        assert "seed=3" in out and "You are in" in out


def test_unknown_options_are_rejected(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["play", "agent_rl/Maze-v0", "--bogus"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
