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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", "--resume-from", "best"], "(--resume-from) applies only to a resumed run"),
        (
            ["train", "--resume", "auto", "trainer.run_dir=x", "--resume-from", "newest"],
            "must be one of ('last', 'best', 'sft')",
        ),
        (
            ["train", "--resume", "auto"],
            "config key 'trainer.run_dir': resuming with 'auto' needs a fixed run directory",
        ),
    ],
)
def test_resume_options_that_cannot_work_are_one_line_errors(capsys, argv, message):
    assert main([*argv, "engine=hf"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("agent-rl: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_the_train_command_leaves_the_sigterm_handler_as_it_found_it():
    import signal

    before = signal.getsignal(signal.SIGTERM)
    main(["train", "trainer.iteratons=5"])
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.parametrize("code, status", [(0, 0), (1, 1), (143, 143), (-15, 143), (-9, 137), (-2, 130)])
def test_a_child_killed_by_a_signal_exits_as_a_shell_reports_it(code, status):
    from agent_rl.cli import exit_status

    assert exit_status(code) == status


def test_a_benchmark_killed_by_sigterm_before_it_handles_it_exits_128_plus_15(monkeypatch):
    # A scheduler's SIGTERM that reaches the benchmark while it still imports kills it (-15): that is
    # status 143, not sys.exit(-15)'s 241.
    import subprocess

    real_popen = subprocess.Popen
    killed = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"]
    monkeypatch.setattr(subprocess, "Popen", lambda command, **kwargs: real_popen(killed, **kwargs))
    assert main(["bench", "lift", "--report"]) == 143


def test_bench_without_matplotlib_is_refused_before_any_run(monkeypatch, capsys):
    import importlib.util
    import subprocess

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real_find_spec(name, *a)
    )
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: pytest.fail("the benchmark started"))
    assert main(["bench", "lift", "--quick"]) == 2
    assert "matplotlib, which is not installed; pip install 'agent-rl[bench]'" in capsys.readouterr().err


def test_train_without_a_config_runs_the_main_job_unless_another_environment_is_named(monkeypatch, tmp_path):
    import agent_rl.training.loop.trainer
    from agent_rl.config import config_to_dict, load_config

    trained = []
    monkeypatch.setattr(agent_rl.training.loop.trainer, "train", lambda config, **kwargs: trained.append(config))
    run_dir = f"trainer.run_dir={tmp_path}"
    assert main(["train", "trainer.seed=3", run_dir]) == 0
    assert main(["train", "--config", "sokoban", run_dir]) == 0
    assert main(["train", "env=userpkg/Lock-v0", run_dir]) == 0
    expected = [
        load_config("maze", ["trainer.seed=3", run_dir]),
        load_config("sokoban", [run_dir]),
        load_config(None, ["env=userpkg/Lock-v0", run_dir]),
    ]
    assert [config_to_dict(c) for c in trained] == [config_to_dict(c) for c in expected]
    assert trained[2].env.kwargs == {} and trained[0].env.kwargs["n_rooms"] == 4


def test_a_full_disk_stops_a_run_with_one_line_that_says_how_to_go_on(monkeypatch, tmp_path, capsys):
    import errno
    import json

    import agent_rl.training.loop.trainer

    def full_disk(config, **kwargs):
        (tmp_path / "checkpoints").mkdir()
        (tmp_path / "checkpoints" / "last.json").write_text(json.dumps({"dir": "iter-000003", "iteration": 3}))
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "metrics.jsonl"))

    monkeypatch.setattr(agent_rl.training.loop.trainer, "train", full_disk)
    assert main(["train", f"trainer.run_dir={tmp_path}"]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "No space left on device (writing " in err
    assert f"the last checkpoint is iteration 3; continue with: agent-rl train --resume {tmp_path}" in err
    # Other OS errors are not this one's to explain.
    monkeypatch.setattr(
        agent_rl.training.loop.trainer,
        "train",
        lambda config, **kwargs: (_ for _ in ()).throw(OSError(errno.EIO, "I/O error")),
    )
    with pytest.raises(OSError, match="I/O error"):
        main(["train", f"trainer.run_dir={tmp_path}"])
