"""Wall and CPU time of the test suite as the README runs it (``python -m pytest`` from the checkout's root,
the two xdist workers of ``pyproject.toml``), with each module's and the slowest tests' share.

    python -m agent_rl.benchmarks.suite_time                  # -> benchmarks/results/suite_time.json
    python -m agent_rl.benchmarks.suite_time -- -m "not slow"  # pytest arguments after --

CPU time is that of pytest and the processes it waited for (its workers and what they started); the
machine's load average is recorded with it, since other work on the cores lengthens the wall time.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

from agent_rl.benchmarks.common import write_result
from agent_rl.cli import exit_status

CHECKOUT = Path(__file__).resolve().parent.parent
SLOWEST = 25
"""Tests listed one by one, the longest first."""


def seconds_by_test(junit_xml: Path) -> dict[str, float]:
    """Seconds of each test (setup, call and teardown) by node id, from pytest's JUnit XML."""
    return {
        f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}": float(case.get("time", 0.0))
        for case in ElementTree.parse(junit_xml).iter("testcase")
    }


def by_module(times: dict[str, float]) -> dict[str, float]:
    """Seconds summed over each module's tests, the largest first."""
    totals: dict[str, float] = defaultdict(float)
    for nodeid, seconds in times.items():
        totals[nodeid.split("::", 1)[0]] += seconds
    return {module: round(seconds, 1) for module, seconds in sorted(totals.items(), key=lambda kv: -kv[1])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="suite_time", help="result file name (default suite_time)")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("pytest_args", nargs="*", help="arguments passed on to pytest (after --)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as scratch:
        junit = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        run = subprocess.run([*command, *args.pytest_args], cwd=CHECKOUT, capture_output=True, text=True)
        wall_s = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        times = seconds_by_test(junit) if junit.exists() else {}
    summary_line = next((line for line in reversed(run.stdout.splitlines()) if " in " in line), "")
    payload = {
        "command": " ".join(["python -m pytest", *args.pytest_args]),
        "exit_code": run.returncode,
        "summary": summary_line.strip("= "),
        "wall_s": round(wall_s, 1),
        "cpu_s": round((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), 1),
        "tests": len(times),
        "test_seconds_total": round(sum(times.values()), 1),
        "modules": by_module(times),
        "slowest": {nodeid: round(s, 1) for nodeid, s in sorted(times.items(), key=lambda kv: -kv[1])[:SLOWEST]},
    }
    path = write_result(args.name, payload, args.out)
    print(f"{payload['summary']}; wall {wall_s / 60:.1f} min, CPU {payload['cpu_s'] / 60:.1f} min -> {path}")
    return exit_status(run.returncode)


if __name__ == "__main__":
    raise SystemExit(main())
