"""Shared benchmark plumbing: the runs a benchmark starts stop with it; result files say what machine ran them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agent_rl.benchmarks.common import cpu_model, machine_info, runs_stop_with_this_process, stopped

SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]
STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)",
]


def test_sigterm_stops_the_benchmark_like_ctrl_c_and_its_runs_with_it():
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    runs = [subprocess.Popen(SLEEPER) for _ in range(2)]
    with pytest.raises(KeyboardInterrupt):
        with runs_stop_with_this_process(lambda: runs):
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)  # interrupted at once
    assert [run.poll() for run in runs] == [-signal.SIGTERM, -signal.SIGTERM]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # both restored


def test_a_failure_stops_the_runs_and_one_that_ignores_sigterm_is_killed_after_the_grace():
    stubborn = subprocess.Popen(STUBBORN, stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"  # its SIGTERM handler is in place
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="a run failed"):
        with runs_stop_with_this_process(lambda: [stubborn, finished], grace_s=0.5):
            raise RuntimeError("a run failed")
    assert stubborn.poll() == -signal.SIGKILL and finished.returncode == 0
    assert time.monotonic() - start < 30


def test_runs_that_finished_are_left_alone():
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    with runs_stop_with_this_process(lambda: [done]):
        done.wait()
    assert done.returncode == 0


def test_a_stopped_benchmark_says_how_to_go_on(capsys):
    from agent_rl.cli import _Stopped

    assert stopped("lift", _Stopped(signal.SIGTERM)) == 143 and stopped("lift", KeyboardInterrupt()) == 130
    assert capsys.readouterr().err.splitlines()[0] == (
        "lift: stopped by SIGTERM: finished runs are kept; the same command resumes the others"
    )


def test_result_json_writes_a_measure_not_taken_as_null(tmp_path):
    """A greedy-only run has no sampled success: its NaN means (and infinities) are written as null,
    so the file is standard JSON, and every other value is written as it was."""
    import json
    import math

    from agent_rl.benchmarks.common import write_json

    payload = {"mean": math.nan, "bounds": [1.5, -math.inf, (math.inf, 2)], "n": 3, "name": "say", "ok": True}
    write_json(tmp_path / "summary.json", payload)
    text = (tmp_path / "summary.json").read_text()

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    assert json.loads(text, parse_constant=refuse) == {
        "mean": None,
        "bounds": [1.5, None, [None, 2]],
        "n": 3,
        "name": "say",
        "ok": True,
    }


def test_result_json_names_paths_inside_the_checkout_relative_to_it(tmp_path):
    import json

    from agent_rl.benchmarks.common import CHECKOUT, RESULTS_DIR, write_json

    run = RESULTS_DIR / "lift" / "runs" / "say" / "seed0"
    payload = {"run_dir": str(run), "models": [str(CHECKOUT / "model")], "elsewhere": "/opt/model", "name": "say"}
    write_json(tmp_path / "summary.json", payload)
    assert json.loads((tmp_path / "summary.json").read_text()) == {
        "run_dir": "benchmarks/results/lift/runs/say/seed0",
        "models": ["model"],
        "elsewhere": "/opt/model",  # outside the checkout: as it was
        "name": "say",
    }


def test_cpu_model_is_read_from_the_first_processor_entry(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9B14 96-Core Processor \nflags\t\t: avx2\n\n"
        "processor\t: 1\nmodel name\t: another\n"
    )
    assert cpu_model(cpuinfo) == "AMD EPYC 9B14 96-Core Processor"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: avx2\n")  # some kernels (arm64) name no model
    assert cpu_model(cpuinfo) is None
    assert cpu_model(tmp_path / "absent") is None


def test_machine_info_names_the_instruction_set_torch_runs_on():
    info = machine_info()
    assert info["torch_cpu_capability"] in {"DEFAULT", "VSX", "Z VECTOR", "NO AVX", "AVX2", "AVX512", "SVE256"}
    assert info["cpu_model"] is None or info["cpu_model"].strip() == info["cpu_model"] != ""
