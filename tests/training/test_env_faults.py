"""Faults of a user's environment: the cause is shown, failed trajectories are counted and left out,
and too many failures stop the run with the resume command (tests/faulty_env_example.py)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from agent_rl.config import ConfigError, RolloutConfig, load_config
from agent_rl.training.infra.env_calls import EnvBuildError
from agent_rl.training.infra.logger import read_metrics
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.guards import EnvironmentFailures
from agent_rl.training.loop.sft import collect_demonstrations
from agent_rl.training.loop.trainer import train
from agent_rl.training.models.policy import load_tokenizer, policy_dir
from agent_rl.training.serving.envpool import env_factory

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
import faulty_env_example  # noqa: E402  (registers faulty/Lever-v0)
from test_trainer import tiny_run_overrides  # noqa: E402  (tests/training/ is on the path)

STEP_LINE = faulty_env_example.Lever.step.__code__.co_firstlineno + 4  # the line that raises
ERROR = f"RuntimeError: {faulty_env_example.CRASH} (in step(); at faulty_env_example.py:{STEP_LINE} in step)"


def overrides(run_dir: Path, fault: str, *extra: str) -> list[str]:
    return [
        "env.id=faulty/Lever-v0",
        f"env.kwargs={{fault: {fault}}}",
        *tiny_run_overrides(
            run_dir,
            "rollout.max_turns=4",
            "rollout.max_new_tokens=6",
            "sft.batch_size=2",
            "logging.tensorboard=false",
            *extra,
        ),
    ]


def run_cli(run_dir: Path, fault: str, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "COLUMNS": "400"}
    command = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        "--import",
        "faulty_env_example",
        *overrides(run_dir, fault, *extra),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


def run_cli_stopped_at_iteration_1(run_dir: Path, fault: str, error: str, *extra: str) -> subprocess.CompletedProcess:
    """Run the CLI without a warm start, where every trajectory of iteration 1 fails with ``error``:
    it stops with status 2, that error and the resume command, with only iteration 0 logged."""
    result = run_cli(run_dir, fault, "sft.mode=none", *extra)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"agent-rl: error: 4 of 4 trajectories failed at iteration 1 (trainer.max_failed_share=1.0); the first error: "
        f"{error}; the run stops (the last checkpoint is iteration 0; continue with: agent-rl train --resume {run_dir})"
    )
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0]
    return result


@pytest.mark.slow
def test_an_environment_that_always_raises_stops_the_warm_start_with_its_error(tmp_path):
    result = run_cli(tmp_path / "run", "always")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"agent-rl: error: no SFT demonstrations were collected: 2 of 2 demonstration episodes failed in "
        f"faulty/Lever-v0; the first error: {ERROR}"
    )


@pytest.mark.slow
def test_an_iteration_whose_trajectories_all_fail_stops_the_run_with_a_checkpoint_and_the_resume_command(tmp_path):
    result = run_cli_stopped_at_iteration_1(tmp_path / "run", "always", ERROR)
    # The first error of its kind is printed once, though every episode of the evaluation and the rollout raised.
    assert result.stdout.count("environment error in faulty/Lever-v0") == 1
    assert f"environment error in faulty/Lever-v0: {ERROR}" in result.stdout


@pytest.mark.slow
def test_failures_under_the_limit_are_counted_reported_once_and_the_run_goes_on(tmp_path):
    run_dir = tmp_path / "run"
    console = Console(file=io.StringIO(), width=400)
    faulty_env_example.Lever.calls = 0
    train(load_config(overrides=overrides(run_dir, "sometimes", "sft.mode=none")), console=console)
    failed = [r["rollout/failed_trajectories"] for r in read_metrics(run_dir)[1:]]
    assert len(failed) == 2 and sum(failed) > 0
    printed = console.file.getvalue()
    assert printed.count("environment error in faulty/Lever-v0") == 1
    for iteration, count in enumerate(failed, start=1):
        assert (f"iteration {iteration}: {int(count)} of 4 trajectories failed" in printed) == (count > 0)


@pytest.mark.slow
def test_a_lower_failed_share_stops_the_run_at_the_first_iteration_that_reaches_it(tmp_path):
    run_dir = tmp_path / "run"
    faulty_env_example.Lever.calls = 0  # the same faults as the run above, which went on at the default share
    with pytest.raises(
        EnvironmentFailures,
        match=r"^2 of 4 trajectories failed at iteration 1 \(trainer.max_failed_share="
        r"0.5\); the first error: RuntimeError: simulator crashed",
    ):
        train(
            load_config(overrides=overrides(run_dir, "sometimes", "sft.mode=none", "trainer.max_failed_share=0.5")),
            console=Console(file=io.StringIO()),
        )
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0]


@pytest.mark.parametrize("value", ["0", "1.5"])
def test_a_failed_share_outside_the_unit_interval_is_a_config_error(value):
    with pytest.raises(ConfigError, match="trainer.max_failed_share"):
        load_config(overrides=[f"trainer.max_failed_share={value}"])


def test_a_missing_admissible_action_list_names_the_call_and_the_turn():
    tokenizer = load_tokenizer(policy_dir("embedded"))
    make_env = lambda: faulty_env_example.Lever(fault="no_actions_at_2")  # noqa: E731
    with pytest.raises(
        ValueError,
        match=r"sft.mode=random needs info\['admissible_actions'\] at every turn, and the info "
        r"Lever's step\(\) returned for turn 2 has none",
    ):
        collect_demonstrations(
            make_env, tokenizer, RolloutConfig(max_turns=4), mode="random", seeds=[0], rng=np.random.default_rng(0)
        )


def test_more_than_half_failed_in_two_iterations_running_stops_the_run(tmp_path):
    from agent_rl.training.infra.checkpoint import how_to_go_on
    from agent_rl.training.loop.guards import FaultGuard

    console = Console(file=io.StringIO(), width=400)
    config = load_config(overrides=["env.id=faulty/Lever-v0"])
    guard = FaultGuard(config, console, lambda: how_to_go_on(tmp_path))
    iteration = 1

    def report(failed: int, played: int) -> int:
        nonlocal iteration
        stats = {"failures": [f"{ERROR}"] * failed, "trajectories": float(played - failed)}
        guard.check_environments(iteration, stats)
        iteration += 1
        return guard.failing_streak

    assert report(5, 8) == 1 and report(4, 8) == 0  # exactly half does not count
    assert report(5, 8) == 1
    with pytest.raises(
        EnvironmentFailures,
        match=r"^more than half of the trajectories failed in two iterations running "
        r"\(6 of 8 trajectories failed at iteration 4\); the first error: ",
    ):
        report(6, 8)
    assert console.file.getvalue().count("environment error in faulty/Lever-v0") == 1


@pytest.mark.parametrize(
    "fault, error",
    [
        ("nan_reward", "ContractError: step() returned the reward nan, not a finite number, at turn 1 (in step())"),
        (
            "number_observation",
            "ContractError: reset() returned an observation of type int, not str, at turn 0 (in reset())",
        ),
    ],
)
def test_a_contract_breach_fails_its_trajectory_with_a_message_naming_the_call_and_turn(tmp_path, fault, error):
    console = Console(file=io.StringIO(), width=400)
    with pytest.raises(
        EnvironmentFailures,
        match=r"^4 of 4 trajectories failed at iteration 1 .*; the first error: " + re.escape(error),
    ):
        train(
            load_config(overrides=overrides(tmp_path / "run", fault, "sft.mode=none", "trainer.iterations=1")),
            console=console,
        )
    assert f"environment error in faulty/Lever-v0: {error}" in console.file.getvalue()


@pytest.mark.slow
def test_a_hung_step_fails_its_trajectory_at_the_time_limit_instead_of_hanging_the_run(tmp_path):
    error = (
        "TimeoutError: step() gave no answer within 0.3 s (env.timeout_s); the environment was abandoned and is "
        "rebuilt on the next reset (in step())"
    )
    result = run_cli_stopped_at_iteration_1(
        tmp_path / "run", "hang_at_2", error, "env.timeout_s=0.3"
    )  # a hung step sleeps an hour
    assert result.stdout.count(f"environment error in faulty/Lever-v0: {error}") == 1


ORACLE_LINE = faulty_env_example.PlannedLever.oracle.__code__.co_firstlineno + 2  # the line that raises
ORACLE_ERROR = (
    f"RuntimeError: {faulty_env_example.ORACLE_CRASH} (in oracle(); at faulty_env_example.py:{ORACLE_LINE} in oracle)"
)
ORACLE_HANG = (
    "TimeoutError: oracle() gave no answer within 0.3 s (env.timeout_s); the environment was abandoned and is "
    "rebuilt on the next reset (in oracle())"
)


@pytest.mark.parametrize("fault, error", [("oracle_raises", ORACLE_ERROR), ("oracle_hangs_at_1", ORACLE_HANG)])
def test_an_oracle_that_raises_or_hangs_fails_its_trajectory_under_progress_shaping(tmp_path, fault, error):
    console = Console(file=io.StringIO(), width=400)
    extra = ("env.id=faulty/PlannedLever-v0", "sft.mode=none", "trainer.iterations=1", "rollout.progress_reward=0.1")
    with pytest.raises(
        EnvironmentFailures,
        match=r"^4 of 4 trajectories failed at iteration 1 .*; the first error: " + re.escape(error),
    ):
        train(load_config(overrides=overrides(tmp_path / "run", fault, *extra, "env.timeout_s=0.3")), console=console)
    assert f"environment error in faulty/PlannedLever-v0: {error}" in console.file.getvalue()


BUILD_LINE = faulty_env_example.Lever.__init__.__code__.co_firstlineno + 2  # the line that raises


@pytest.mark.parametrize(
    "fault, error",
    [
        (
            "build_raises",
            f"RuntimeError: {faulty_env_example.BUILD_CRASH} (in gymnasium.make(); at faulty_env_example.py:"
            f"{BUILD_LINE} in __init__)",
        ),
        (
            "build_hangs",
            "TimeoutError: gymnasium.make() gave no answer within 0.3 s (env.timeout_s); the environment was "
            "abandoned (in gymnasium.make())",
        ),
    ],
)
def test_an_environment_that_raises_or_hangs_while_it_is_built_is_a_config_error_naming_the_keys(fault, error):
    config = load_config(overrides=["env.id=faulty/Lever-v0", f"env.kwargs={{fault: {fault}}}", "env.timeout_s=0.3"])
    with pytest.raises(ConfigError) as raised:
        env_factory(config)
    assert str(raised.value) == (
        f"config keys 'env.id' and 'env.kwargs': gymnasium.make('faulty/Lever-v0', **{{'fault': '{fault}'}}) "
        f"failed: {error}"
    )


def probe_failure(error: str) -> str:
    return (
        "config key 'sft.mode': auto chooses the warm start by probing one 'faulty/PlannedLever-v0' environment "
        f"(its reset(seed=0), then its oracle() when it has one), and the environment failed: {error}; fix it, "
        "or set sft.mode to oracle, random or none"
    )


@pytest.mark.parametrize(
    "fault, error",
    [
        ("oracle_raises", ORACLE_ERROR.replace("(in oracle()", "(in auto_sft_mode()")),
        (
            "oracle_hangs_at_0",
            "TimeoutError: auto_sft_mode() gave no answer within 0.3 s (env.timeout_s); the environment was "
            "abandoned (in auto_sft_mode())",
        ),
    ],
)
def test_sft_mode_auto_names_an_oracle_that_raises_or_hangs_when_it_probes_the_environment(fault, error):
    overrides = ["env.id=faulty/PlannedLever-v0", f"env.kwargs={{fault: {fault}}}", "env.timeout_s=0.3", "engine=hf"]
    with pytest.raises(ConfigError) as raised:
        resolve(load_config(overrides=[*overrides, "sft.mode=auto"]))
    assert str(raised.value) == probe_failure(error)
    assert resolve(load_config(overrides=[*overrides, "sft.mode=none"])).sft.mode == "none"  # nothing probed
    assert resolve(load_config(overrides=[*overrides[:1], "engine=hf", "sft.mode=auto"])).sft.mode == "oracle"


@pytest.mark.slow
def test_an_oracle_that_raises_at_the_start_stops_the_cli_with_its_message_before_anything_is_written(tmp_path):
    result = run_cli(tmp_path / "run", "oracle_raises", "env.id=faulty/PlannedLever-v0", "sft.mode=auto")
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == "agent-rl: error: " + probe_failure(
        ORACLE_ERROR.replace("(in oracle()", "(in auto_sft_mode()")
    )
    assert not (tmp_path / "run").exists()


def test_an_oracle_warm_start_leaves_out_an_episode_whose_oracle_raised_and_names_the_error():
    tokenizer = load_tokenizer(policy_dir("embedded"))
    faults = iter(["never", "oracle_raises", "never"])  # the pool's probe, then the environment of each episode
    demos = collect_demonstrations(
        lambda: faulty_env_example.PlannedLever(fault=next(faults)),
        tokenizer,
        RolloutConfig(max_turns=4),
        mode="oracle",
        seeds=[0, 1],
        rng=np.random.default_rng(0),
    )
    assert demos.failures == [ORACLE_ERROR] and demos.episodes == 2
    assert demos.successes == 1 and len(demos.prompts) == 3  # the other episode pulls three times and wins


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_time_limit_that_is_not_positive_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"config key 'env.timeout_s': must be > 0 seconds, or null for no limit"):
        load_config(overrides=[f"env.timeout_s={value}"])


@pytest.mark.slow
def test_a_contract_breach_at_the_second_step_stops_the_cli_with_its_message(tmp_path):
    run_cli_stopped_at_iteration_1(
        tmp_path / "run",
        "nan_reward",
        "ContractError: step() returned the reward nan, not a finite number, at turn 1 (in step())",
    )


@pytest.mark.parametrize("fault", ["build_raises", "build_hangs"])
def test_a_factory_given_to_train_that_raises_or_hangs_is_an_error_naming_it_whatever_the_sft_mode(tmp_path, fault):
    def make_env():
        return faulty_env_example.Lever(fault=fault)

    config = load_config(overrides=[*overrides(tmp_path / "run", "never"), "env.timeout_s=0.3", "sft.mode=none"])
    with pytest.raises(EnvBuildError) as raised:
        train(config, make_env=make_env)
    here = f"test_env_faults.py:{make_env.__code__.co_firstlineno + 1} in make_env"
    build = f"faulty_env_example.py:{BUILD_LINE} in __init__"
    assert (
        str(raised.value)
        == "the environment factory failed: "
        + {
            "build_raises": f"RuntimeError: {faulty_env_example.BUILD_CRASH} (in make_env(); at {here}; {build})",
            "build_hangs": "TimeoutError: make_env() gave no answer within 0.3 s (env.timeout_s); the environment was "
            "abandoned (in make_env())",
        }[fault]
    )
