"""``agent-rl bench lift`` (benchmarks/lift.py): goals and run summaries by hand, the user
environments it trains on, and a --quick run end to end (runs, summary, plots, rerun and report)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import pytest

from agent_rl.benchmarks import lift
from agent_rl.benchmarks.lift_envs import DIALS, DOOR_OF_SIGN, DOORS, TURN_OF_SYMBOL
from agent_rl.envs import check_text_env
from agent_rl.training.infra.logger import read_metrics


def test_goals_by_hand():
    reach, gain, hold = lift.Goal("reach", 0.95), lift.Goal("lift", 30.0), lift.Goal("hold", -2.0)
    times = [60.0, 60.0]
    assert reach.met([0.95, 1.0], [10.0, 0.0], times) and not reach.met([0.94, 1.0], [90.0, 90.0], times)
    assert gain.met([0.5, 0.6], [30.0, 45.0], times) and not gain.met([0.9, 0.9], [29.9, 80.0], times)
    assert hold.met([0.9, 0.9], [-3.0, 0.0], times) and not hold.met([0.9, 0.9], [-3.0, -1.5], times)
    timed = lift.Goal("lift", 20.0, minutes=60.0)
    assert timed.met([0.8, 0.8], [20.0, 25.0], [3600.0, 1200.0]) and not timed.met(
        [0.8, 0.8], [20.0, 25.0], [3600.5, 1200.0]
    )
    assert timed.describe() == "greedy lift >= +20 points on every seed, within 60 min per run"


def test_run_summary_by_hand():
    records = [
        {
            "iteration": 0,
            "time/elapsed": 12.0,
            "time/eval": 2.0,
            "eval/greedy_success": 0.25,
            "eval/sampled_success": 0.5,
            "sft/steps_taken": 25.0,
        },
        {
            "iteration": 1,
            "time/elapsed": 20.0,
            "rollout/success_rate": 0.3,
            "rollout/invalid_rate": 0.1,
            "credit/zero_variance_groups": 0.75,
            "update/entropy": 0.5,
            "update/approx_kl": 0.5,
            "update/clip_frac": 0.25,
            "rollout/action_entropy": 1.5,
            "rollout/loop_rate": 0.2,
        },
        {
            "iteration": 2,
            "time/elapsed": 30.0,
            "eval/greedy_success": 1.0,
            "eval/sampled_success": 0.75,
            "rollout/success_rate": 0.6,
            "rollout/invalid_rate": 0.0,
            "credit/zero_variance_groups": 0.25,
            "update/approx_kl": 0.002,
            "rollout/action_entropy": 0.5,
        },
    ]
    summary = lift.run_summary(records)
    assert summary["iterations"] == [0, 2] and summary["greedy_success"] == [0.25, 1.0]
    assert summary["greedy_lift"] == pytest.approx(75.0) and summary["sampled_lift"] == pytest.approx(25.0)
    assert summary["first_iteration_at_95_greedy"] == 2
    assert (
        summary["warm_start_s"] == 10.0
        and summary["total_s"] == 30.0
        and summary["warm_start"] == {"sft/steps_taken": 25.0}
    )
    assert summary["training_success"] == [0.3, 0.6] and summary["training_invalid_rate"] == [0.1, 0.0]
    assert summary["greedy_minus_sampled_points"] == pytest.approx([-25.0, 25.0])
    # Medians over the RL iterations (iteration 0 is the warm start); None where no iteration logs it.
    limits = summary["limits"]
    assert limits["zero_variance_groups"] == pytest.approx(0.5) and limits["pass_rate"] == pytest.approx(0.45)
    assert limits["entropy"] == 0.5 and limits["optimizer_steps"] is None and limits.keys() == lift.LIMITS.keys()
    assert limits["action_entropy"] == pytest.approx(1.0) and limits["approx_kl"] == pytest.approx(0.251)
    assert limits["loop_rate"] == 0.2  # one iteration logs it (runs before the metric log none)
    assert limits["clip_frac"] == 0.25 and summary["largest_approx_kl"] == 0.5  # the median hides the 0.5 step
    other = {**summary, "limits": {**limits, "zero_variance_groups": 0.0, "entropy": None}}
    case = lift.Case("c", "a case", (), 2, 2, lift.Goal("lift", 20.0))
    across = lift.case_summary(case, [summary, summary, other], None)["limits"]
    assert across["zero_variance_groups"] == pytest.approx(0.5) and across["entropy"] == 0.5
    assert across["optimizer_steps"] is None
    with pytest.raises(ValueError, match="iteration-0"):
        lift.run_summary(records[1:])


def test_the_bandit_answer_is_a_table_the_text_never_shows():
    env = gym.make("lift/Bandit-v0")
    check_text_env(env)
    assert sorted(DOOR_OF_SIGN.values()) == sorted(DOORS * 2)  # every door opens for two signs
    for seed in range(16):
        observation, info = env.reset(seed=seed)
        sign = observation.split()[-1].rstrip(".")
        assert not any(door in observation.split() for door in DOORS) and info["admissible_actions"] == list(DOORS)
        _, reward, terminated, _, step_info = env.step(DOOR_OF_SIGN[sign])
        assert reward == 1.0 and terminated and step_info["won"]
    env.reset(seed=0)
    assert env.step("Z")[4]["action_valid"] is False


def test_the_combination_pays_only_four_right_turns_and_says_nothing_before():
    env = gym.make("lift/Combination-v0")
    check_text_env(env)
    wins = 0
    for seed in range(64):
        observation, info = env.reset(seed=seed)
        turns, symbols = [], []
        for dial in range(DIALS):
            symbol = observation.split()[-1].rstrip(".")
            symbols.append(symbol)
            assert observation == f"Dial {dial + 1} of {DIALS} shows {symbol}." and info["admissible_actions"] == [
                "up",
                "down",
            ]
            right = TURN_OF_SYMBOL[symbol]
            turns.append(right if seed % 2 else ("down" if right == "up" and dial == seed % 8 // 2 else right))
            observation, reward, terminated, truncated, info = env.step(turns[-1])
            assert not truncated and terminated == (dial == DIALS - 1) and (reward == 0.0 or dial == DIALS - 1)
        won = all(turn == TURN_OF_SYMBOL[symbol] for turn, symbol in zip(turns, symbols))
        assert (reward, info["won"], observation) == (
            float(won),
            won,
            "The lock opens." if won else "The lock stays shut.",
        )
        wins += won
    assert 32 <= wins < 64  # odd seeds turn every dial right; even seeds turn one "up" dial wrong when there is one
    # An invalid turn leaves the dial as it is and says so; 12 turns end the episode.
    observation, _ = env.reset(seed=0)
    observation, reward, terminated, truncated, info = env.step("sideways")
    assert info["action_valid"] is False and observation.startswith("Turn up or down. Dial 1 of 4")
    for _ in range(11):
        *_, truncated, info = env.step("sideways")
    assert truncated and not info["won"]


@pytest.mark.parametrize("dials", [1, 3])
def test_a_combination_of_fewer_dials_opens_after_that_many_right_turns(dials):
    env = gym.make("lift/Combination-v0", dials=dials)
    check_text_env(env)
    observation, _ = env.reset(seed=5)
    for dial in range(dials):
        assert observation.startswith(f"Dial {dial + 1} of {dials} shows ")
        observation, reward, terminated, _, info = env.step(TURN_OF_SYMBOL[observation.split()[-1].rstrip(".")])
    assert terminated and reward == 1.0 and info["won"] and observation == "The lock opens."
    for bad in (0, -1, 2.5, "3"):
        with pytest.raises(ValueError, match="dials must be a positive integer"):
            gym.make("lift/Combination-v0", dials=bad)


def test_the_branching_combination_goes_on_to_the_dial_its_turn_leads_to():
    env = gym.make("lift/BranchingCombination-v0")
    check_text_env(env)
    lock = env.unwrapped
    first, _ = env.reset(seed=3)
    symbols = list(lock.symbols)
    assert len(symbols) == 15 and first == f"Dial 1 of 4 (node 1) shows {symbols[0]}."
    # Up leads to node 2, down to node 3 (heap order); every turn of a path, up or down, goes one level deeper.
    after_up = env.step("up")[0]
    env.reset(seed=3)
    after_down = env.step("down")[0]
    assert after_up == f"Dial 2 of 4 (node 2) shows {symbols[1]}." and after_down.startswith("Dial 2 of 4 (node 3) ")
    # The path down, up, down visits nodes 1, 3, 6, 13; the lock opens only if each turn was the one its symbol demands.
    for turns in (("down", "up", "down", "up"), ("down", "up", "down", "down")):
        env.reset(seed=3)
        path = [0, 2, 5, 12]
        for turn in turns:
            observation, reward, terminated, _, info = env.step(turn)
        won = all(turn == TURN_OF_SYMBOL[symbols[node]] for turn, node in zip(turns, path))
        assert terminated and reward == float(won) and info["won"] == won
    # An invalid turn stays at the node.
    env.reset(seed=3)
    assert env.step("left")[0] == f"Turn up or down. {first}"
    # Over seeds, following the table wins every time.
    for seed in range(16):
        observation, _ = env.reset(seed=seed)
        for _ in range(4):
            observation, reward, *_ = env.step(TURN_OF_SYMBOL[observation.split()[-1].rstrip(".")])
        assert reward == 1.0


def test_every_case_is_a_valid_config():
    for case in (*lift.CASES, *lift.QUICK_CASES):
        config = case.config((f"trainer.iterations={case.iterations}",))
        assert config.trainer.target_success is None and config.trainer.iterations == case.iterations


def test_the_bundled_sokoban_recipe_is_the_setting_its_results_measured():
    # benchmarks/results/lift_graph_credit_sokoban: the sokoban case with the recommended setting.
    from dataclasses import asdict

    from agent_rl.config import load_config

    (case,) = [case for case in lift.CASES if case.name == "sokoban"]
    measured = case.config(("rollout.action_mode=admissible", "rollout.target_pass_rate=0.5", "algo.step_credit=graph"))
    recipe = load_config("sokoban")
    for section in ("env", "policy", "rollout", "algo", "optim", "sft"):
        assert asdict(getattr(recipe, section)) == asdict(getattr(measured, section)), section
    assert (recipe.trainer.iterations, recipe.trainer.eval_every) == (case.iterations, case.eval_every)


def test_the_panel_maze_is_won_by_reading_observations_and_rarely_by_chance():
    from agent_rl.envs.maze import MazeEnv
    from agent_rl.training.loop.evaluation import eval_seeds

    maze_cases = [c for c in lift.CASES if c.name in ("maze-random", "maze-clone")]
    assert len(maze_cases) == 2 and all(lift.PANEL_MAZE in c.overrides for c in maze_cases)  # one Maze for both
    case = maze_cases[0]
    kwargs = case.config().env.kwargs
    env = MazeEnv(**kwargs, oracle="explore")  # follows the observations alone: exits and items in sight
    for seed in eval_seeds(64):
        env.reset(seed=seed)
        plan = env.oracle()
        assert len(plan) <= kwargs["max_steps"]
        *_, (observation, reward, terminated, truncated, info) = [env.step(action) for action in plan]
        assert terminated and info["won"] and not truncated
    assert lift.random_play_success(case, episodes=128) <= 1 / 3
    # The runs' --set overrides reach random play too: with one turn no maze is solved.
    assert lift.random_play_success(case, ("rollout.max_turns=1",), episodes=32) == 0


def test_a_recipe_case_trains_with_its_recipe_and_its_own_seed_count(tmp_path):
    case = lift.Case(
        "r",
        "a recipe case",
        ("trainer.eval_sampled=false",),
        4,
        2,
        lift.Goal("lift", 20.0, 60.0),
        recipe="sokoban",
        seeds=3,
    )
    assert case.config().env.id == "agent_rl/Sokoban-v0" and case.config().trainer.eval_sampled is False
    runs = lift.plan((case, lift.CASES[0]), None, tmp_path, engine="hf")
    assert [(r.case.name, r.seed) for r in runs] == [
        ("r", 0),
        ("r", 1),
        ("r", 2),
        *(("say", k) for k in range(lift.SEEDS)),
    ]
    command = runs[0].command()
    assert command[command.index("--config") + 1] == "sokoban" and "--config" not in runs[3].command()
    assert "engine=hf" in command and "trainer.iterations=4" in command
    assert len(lift.plan((case,), 2, tmp_path)) == 2
    fresh = lift.plan((case,), 2, tmp_path, first_seed=5)
    assert [(r.seed, r.run_dir.name) for r in fresh] == [(5, "seed5"), (6, "seed6")]
    assert "trainer.seed=5" in fresh[0].command() and lift.seeds_present(tmp_path, case) == 0
    # A run is done once its metrics log its last iteration (4): nothing else marks it.
    fresh[0].run_dir.mkdir(parents=True)
    metrics = fresh[0].run_dir / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"iteration": k}) + "\n" for k in range(4)))
    assert not fresh[0].done
    metrics.write_text(metrics.read_text() + json.dumps({"iteration": 4}) + "\n")
    assert fresh[0].done and not fresh[1].done


def _processes_using(directory: Path) -> list[int]:
    """Pids whose command line names ``directory`` or that hold a file under it open (a run forked from
    the benchmark's preloading server writes its log there), from Linux /proc."""
    found = []
    for process in Path("/proc").glob("[0-9]*"):
        try:
            named = str(directory).encode() in (process / "cmdline").read_bytes()
            opened = any(str(fd.readlink()).startswith(str(directory)) for fd in (process / "fd").iterdir())
        except OSError:  # the process ended while we looked, or is not ours to read
            continue
        if named or opened:
            found.append(int(process.name))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
def test_quick_run_stops_resumes_writes_curves_lifts_and_reports_again_without_training(tmp_path, capsys):
    # SIGTERM to `agent-rl bench lift` (a scheduler's stop): the benchmark and every run it started exit;
    # none goes on training beside the rerun's copy of itself.
    bench = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("agent-rl")),
            "bench",
            "lift",
            "--quick",
            "--engine",
            "hf",
            "--out",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 600  # a loaded machine takes minutes to import and clone
    while not any(tmp_path.glob("runs/*/seed*/metrics.jsonl")) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert any(tmp_path.glob("runs/*/seed*/metrics.jsonl")), "no run started training"
    assert len(_processes_using(tmp_path)) >= 2  # the benchmark and its first run
    bench.send_signal(signal.SIGTERM)
    assert bench.wait(timeout=180) == 128 + signal.SIGTERM
    time.sleep(0.5)
    assert _processes_using(tmp_path) == []
    # The reruns finish them, the first (of one case) training another arm in the same worker pool from
    # their warm starts.
    shared = tmp_path / "shared"
    assert lift.main(["--quick", "--cases", "say", "--out", str(tmp_path), "--engine", "hf", "--arm", str(shared)]) == 0
    assert not (shared / "runs/bandit").exists()
    assert lift.main(["--quick", "--out", str(tmp_path), "--engine", "hf"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [c["case"] for c in summary["cases"]] == ["say", "bandit"]
    for case in summary["cases"]:
        assert case["seeds"] == 2 and len(case["runs"]) == 2
        assert case["random_play_success"] is not None and 0 < case["random_play_success"] < 1
        for run in case["runs"]:
            assert run["iterations"] == [0, 1, 2]
            assert run["greedy_lift"] == pytest.approx(100 * (run["greedy_success"][-1] - run["greedy_success"][0]))
        mean = case["greedy_lift"]["mean"]
        assert case["greedy_lift"]["ci_low"] <= mean <= case["greedy_lift"]["ci_high"]
    assert (tmp_path / "curves.png").stat().st_size > 0 and (tmp_path / "lifts.png").stat().st_size > 0
    assert "| say | 2 |" in (tmp_path / "summary.md").read_text()
    done = sorted(p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/*/metrics.jsonl"))
    assert lift.main(["--quick", "--out", str(tmp_path), "--report"]) == 0  # trains nothing
    assert sorted(p.stat().st_mtime_ns for p in tmp_path.glob("runs/*/*/metrics.jsonl")) == done
    assert lift.main(["--quick", "--out", str(tmp_path), "--report", "--baseline", str(tmp_path)]) == 0
    against_itself = json.loads((tmp_path / "summary.json").read_text())["cases"][0]["vs_baseline"]
    assert against_itself["seeds"] == [0, 1] and against_itself["final_greedy_points"]["mean"] == 0.0
    assert (
        against_itself["primary"]["measure"] == "final_greedy_points" and not against_itself["primary"]["significant"]
    )
    assert against_itself["primary"]["family_size"] == 2 and against_itself["primary"]["holm_t_p"] == 1.0
    assert "no difference shown at 5% family-wise" in (tmp_path / "summary.md").read_text()
    assert lift.main(["--quick", "--out", str(tmp_path / "empty"), "--report"]) == 1
    assert "no finished runs" in capsys.readouterr().err
    assert lift.main(["--quick", "--out", str(tmp_path), "--report", "--iterations", "5"]) == 1
    assert "its runs were started for 2 iterations: give that --iterations" in capsys.readouterr().err
    # The arm ran the RL phase alone, from the same iteration-0 policy and the same sampling seeds (the
    # engine's stream restarts after the warm start).
    for seed in (0, 1):
        own, reused = (read_metrics(root / f"runs/say/seed{seed}") for root in (tmp_path, shared))
        assert "sft/steps_taken" in own[0] and "sft/steps_taken" not in reused[0]  # no warm start of its own
        for key in ("eval/greedy_success", "eval/greedy_invalid_rate", "eval/greedy_length", "eval/sampled_success"):
            assert reused[0][key] == own[0][key]
        # With the same settings, the RL phase samples the same batches.
        assert [r["rollout/return"] for r in reused[1:]] == [r["rollout/return"] for r in own[1:]]
    # A fresh clone of committed results has no checkpoints: the lift trains the shared warm start
    # again from its run's config, which logs the recorded evaluation, and moves it into place.
    shutil.rmtree(tmp_path / "runs/say/seed0/checkpoints")
    rebuilt = tmp_path / "rebuilt"
    from_fresh_clone = ["--quick", "--cases", "say", "--seeds", "1", "--out", str(rebuilt), "--engine", "hf"]
    assert lift.main([*from_fresh_clone, "--warm-starts-from", str(tmp_path)]) == 0
    assert (tmp_path / "runs/say/seed0/checkpoints/sft.json").is_file()
    assert not (tmp_path / "runs/say/seed0/rebuild").exists()
    again, before = (read_metrics(root / "runs/say/seed0") for root in (rebuilt, shared))
    assert again[0]["eval/greedy_success"] == before[0]["eval/greedy_success"]
    assert [r["rollout/return"] for r in again[1:]] == [r["rollout/return"] for r in before[1:]]


def test_bad_settings_fail_before_any_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--set", "optim.lr=-1"])
    assert "optim.lr" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    # A key the benchmark sets for each run would be overridden silently: refused, named.
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--set", "trainer.eval_every=2", "trainer.seed=3"])
    assert "--set cannot change trainer.eval_every, trainer.seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--set", " trainer.seed =3"])
    assert "--set cannot change trainer.seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--set", "optim.lr"])
    assert "--set: override 'optim.lr' is not of the form key=value" in capsys.readouterr().err
    run = lift.plan(lift.QUICK_CASES[:1], 1, tmp_path, ("optim.lr=1e-4",))[0]
    set_last = {override.split("=", 1)[0] for override in run.command()[-len(lift.PER_RUN_KEYS) :]}
    assert set_last == lift.PER_RUN_KEYS
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--baseline", str(tmp_path / "other")])
    assert "holds no summary.json" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--report", "--family", "say"])
    assert "give --baseline too" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--report", "--baseline", str(tmp_path), "--family", "sya"])
    assert "--family: unknown case(s) ['sya']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--warm-starts-from", str(tmp_path / "other")])
    err = capsys.readouterr().err
    assert "--warm-starts-from: no 'sft' checkpoint" in err and not (tmp_path / "runs").exists()
    assert f"no lift is training it: start the lift with --out {tmp_path / 'other'} first" in err
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path), "--seeds", "0"])
    assert "--seeds must be at least 1" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_arms_train_in_one_pool_each_run_after_its_warm_start(tmp_path, monkeypatch):
    out, arm = tmp_path / "defaults", tmp_path / "candidate"
    pooled = {}

    def run_jobs(jobs, *, workers, ready, waits_outside, **_):
        pooled.update(jobs=list(jobs), workers=workers)
        pooled["ready"] = [ready(job) for job in jobs]
        pooled["waiting"] = [waits_outside(job) for job in jobs]

    monkeypatch.setattr(lift, "run_jobs", run_jobs)
    argv = ["--quick", "--cases", "say", "--out", str(out), "--arm", str(arm), "optim.lr=1e-4", "--workers", "2"]
    assert lift.main(argv) == 1  # nothing trained here: no finished runs to report
    jobs = pooled["jobs"]
    assert [(job.run_dir, job.settings, job.warm_starts_from) for job in jobs] == [
        (out / "runs/say/seed0", (), None),
        (arm / "runs/say/seed0", ("optim.lr=1e-4",), out),
        (out / "runs/say/seed1", (), None),
        (arm / "runs/say/seed1", ("optim.lr=1e-4",), out),
    ]
    assert pooled["workers"] == 2
    # The arm's runs wait, not fail, while this lift (holding --out) has yet to train their warm starts.
    assert pooled["ready"] == [True, False, True, False] and pooled["waiting"] == [False, True, False, True]


def test_iterations_replace_every_cases_own_in_both_arms(tmp_path, monkeypatch, capsys):
    pooled = []
    monkeypatch.setattr(lift, "run_jobs", lambda jobs, **_: pooled.extend(jobs))
    argv = ["--quick", "--out", str(tmp_path / "a"), "--arm", str(tmp_path / "b"), "optim.lr=1e-4", "--iterations", "3"]
    assert lift.main(argv) == 1  # nothing trained here: no finished runs to report
    assert len(pooled) == 8 and all(job.iterations == 3 for job in pooled)
    own = [job for job in pooled if job.warm_starts_from is None]  # the arm's need a trained warm start
    assert len(own) == 4 and all(job.command().count("trainer.iterations=3") == 1 for job in own)
    assert {job.case.eval_every for job in pooled} == {case.eval_every for case in lift.QUICK_CASES}
    with pytest.raises(SystemExit):
        lift.main(["--quick", "--out", str(tmp_path / "a"), "--iterations", "0"])
    assert "--iterations must be at least 1" in capsys.readouterr().err


def test_bad_arms_fail_before_any_run(tmp_path, capsys):
    out = ["--quick", "--out", str(tmp_path / "defaults")]
    for arm, named in (
        ([str(tmp_path / "arm"), "optim.lr=-1"], f"--arm {tmp_path / 'arm'}: config key 'optim.lr'"),
        ([str(tmp_path / "arm"), "trainer.seed=3"], f"--arm {tmp_path / 'arm'} cannot change trainer.seed"),
        ([str(tmp_path / "defaults"), "optim.lr=1e-4"], "every arm needs a directory of its own"),
    ):
        with pytest.raises(SystemExit):
            lift.main([*out, "--arm", *arm])
        assert named in capsys.readouterr().err
    with pytest.raises(SystemExit):
        lift.main([*out, "--arm", str(tmp_path / "arm"), "--report"])
    assert "not with --report" in capsys.readouterr().err
    assert not any(tmp_path.rglob("runs"))


def test_a_second_lift_on_the_same_out_stops_before_training(tmp_path, capsys):
    from filelock import FileLock

    from agent_rl.training.loop.run_dir import LOCK_FILE

    with FileLock(tmp_path / LOCK_FILE), pytest.raises(SystemExit):  # as a running lift holds its --out
        lift.main(["--quick", "--out", str(tmp_path)])
    assert "is in use by another lift" in capsys.readouterr().err and not (tmp_path / "runs").exists()


def test_a_run_waits_for_a_warm_start_only_while_another_process_trains_it(tmp_path):
    from filelock import FileLock

    from agent_rl.training.loop.run_dir import LOCK_FILE

    other = tmp_path / "defaults" / "runs" / "say" / "seed0"
    (run,) = lift.plan(lift.QUICK_CASES[:1], 1, tmp_path / "pilot", warm_starts_from=tmp_path / "defaults")
    assert run.warm_start == other and "no 'sft' checkpoint" in run.warm_start_problem()
    assert not run.warm_start_in_training
    with FileLock(tmp_path / "defaults" / LOCK_FILE):  # a lift holds its --out before it starts this run
        assert run.warm_start_in_training
    assert not run.warm_start_in_training
    with FileLock(other / LOCK_FILE):  # the run training the defaults' warm start holds its directory
        assert run.warm_start_in_training
    assert not run.warm_start_in_training
    (alone,) = lift.plan(lift.QUICK_CASES[:1], 1, tmp_path / "own")
    assert alone.warm_start_problem() is None and not alone.warm_start_in_training


def test_a_lost_warm_start_is_trained_again_from_its_runs_config_and_must_match(tmp_path):
    from filelock import FileLock

    from agent_rl.training.loop.run_dir import LOCK_FILE

    def evaluated(run_dir, iterations, success, **more):
        run_dir.mkdir(parents=True, exist_ok=True)
        records = [{"iteration": i, "eval/greedy_success": success, **more} for i in range(iterations + 1)]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    def started_for(run_dir, iterations):
        (run_dir / "config.yaml").write_text(f"trainer:\n  iterations: {iterations}\n")

    (run,) = lift.plan(lift.QUICK_CASES[:1], 1, tmp_path / "pilot", warm_starts_from=tmp_path / "defaults")
    assert not run.warm_start_lost and lift.rebuilds_needed([run]) == []  # not trained yet: wait for it
    evaluated(run.warm_start, run.iterations - 1, 0.5)
    started_for(run.warm_start, run.iterations)
    assert not run.warm_start_lost  # still training
    started_for(run.warm_start, run.iterations - 1)  # a shorter run (this lift gave more --iterations): finished
    assert run.warm_start_lost and run.warm_start_problem() is not None
    started_for(run.warm_start, run.iterations)
    evaluated(run.warm_start, run.iterations, 0.5)  # finished; its checkpoint is not there
    assert run.warm_start_lost and run.warm_start_problem() is not None
    (rebuild,) = lift.rebuilds_needed([run, run])  # once per warm start
    assert rebuild.run_dir == run.warm_start / "rebuild" and rebuild.iterations == 0
    command = rebuild.command()
    assert command[command.index("--config") + 1] == str(run.warm_start / "config.yaml")
    assert command[-2:] == ["trainer.iterations=0", f"trainer.run_dir={rebuild.run_dir}"]
    with FileLock(rebuild.run_dir / LOCK_FILE):  # another lift is rebuilding it: this one waits
        assert lift.rebuilds_needed([run]) == [] and run.warm_start_in_training
    # A rebuild that logs another evaluation is refused, and nothing moves.
    evaluated(rebuild.run_dir, 0, 0.25)
    (rebuild.run_dir / "checkpoints").mkdir()
    with pytest.raises(lift.RunFailed, match="iteration-0 evaluation differs"):
        rebuild.adopt()
    assert not (run.warm_start / "checkpoints").exists()
    # One that logs the recorded evaluation (and more measures) gives the run its checkpoints.
    evaluated(rebuild.run_dir, 0, 0.5, **{"eval/greedy_loop_rate": 0.1})
    rebuild.adopt()
    assert (run.warm_start / "checkpoints").is_dir() and not rebuild.run_dir.exists()


def test_a_case_without_sampled_evaluation_reports_dashes(tmp_path):
    def run(seed, start, end):
        return {
            "seed": seed,
            **lift.run_summary(
                [
                    {"iteration": 0, "time/elapsed": 60.0, "time/eval": 10.0, "eval/greedy_success": start},
                    {
                        "iteration": 2,
                        "time/elapsed": 600.0,
                        "eval/greedy_success": end,
                        "rollout/success_rate": 0.5,
                        "rollout/invalid_rate": 0.1,
                    },
                ]
            ),
        }

    case = lift.Case("r", "greedy only", (), 2, 2, lift.Goal("lift", 20.0, minutes=60.0), recipe="sokoban", seeds=2)
    summary = {"cases": [lift.case_summary(case, [run(0, 0.25, 0.5), run(1, 0.25, 0.75)], None)]}
    assert summary["cases"][0]["goal_met"] is True and summary["cases"][0]["greedy_lift"]["mean"] == pytest.approx(37.5)
    lift.write_markdown(summary, tmp_path / "summary.md")
    text = (tmp_path / "summary.md").read_text()
    assert "| r | 2 | - | 25.0% -> 62.5% | +37.5 [" in text and "| - -> - | - | 10.0 |" in text
    assert "(lift +25.0; sampled -; largest approx KL -;" in text and "nan" not in text
    assert (
        "groups without return spread -, pass rate 50%, invalid actions 10%, episodes ending in a loop -, entropy -, "
        "action entropy - bits, approx KL - in - optimizer steps with - of tokens clipped" in text
    )
    one_seed = {"cases": [lift.case_summary(case, [run(0, 0.25, 0.5)], None)]}
    lift.write_markdown(one_seed, tmp_path / "one_seed.md")
    text = (tmp_path / "one_seed.md").read_text()
    assert "| r | 1 | - | 25.0% -> 50.0% | +25.0 (one seed, no interval) |" in text and "[+25.0, +25.0]" not in text


def finals_summary(finals: dict[str, list[float]]) -> dict:
    """A lift summary whose runs of each case end at ``finals`` (seeds 0, 1, ...), from 0."""
    return {
        "cases": [
            {
                "case": name,
                "runs": [
                    {"seed": seed, "greedy_success": [0.0, final], "greedy_lift": 100 * final}
                    for seed, final in enumerate(values)
                ],
            }
            for name, values in finals.items()
        ]
    }


# a: differences 0.8, 0.6, 0.8, 0.8, 0.8 (mean 76 points); b: 0.05, -0.1, 0.05, 0.1, 0.05.
OURS = {"a": [0.9, 0.8, 0.95, 0.85, 0.9], "b": [0.5, 0.2, 0.4, 0.3, 0.6], "c": [0.5]}
THEIRS = {"a": [0.1, 0.2, 0.15, 0.05, 0.1], "b": [0.45, 0.3, 0.35, 0.2, 0.55], "c": [0.1]}


def test_the_baseline_comparison_tests_final_greedy_success_with_holm_over_the_compared_cases():
    ours, theirs = finals_summary(OURS), finals_summary(THEIRS)
    lift.compare(ours, theirs, Path("base"))
    a, b = (ours["cases"][i]["vs_baseline"]["primary"] for i in (0, 1))
    assert "vs_baseline" not in ours["cases"][2]  # one shared seed: not compared, not in the family
    assert a["family_size"] == b["family_size"] == 2
    # Holm by hand: the smaller raw p times 2, the larger times 1 but never below the first.
    assert a["holm_t_p"] == pytest.approx(min(1.0, 2 * a["t_p"])) and a["significant"]
    assert b["holm_t_p"] == pytest.approx(max(b["t_p"], a["holm_t_p"])) and not b["significant"]
    assert a["mean"] == pytest.approx(76.0) and a["adjusted_ci_low"] < a["ci_low"]


def test_a_declared_family_is_tested_alone_and_the_other_cases_are_reported_untested():
    """``--family a``: Holm over one comparison is the raw p-value, and ``b``'s paired difference is
    written beside it, never with a verdict; a declared case without paired seeds is an error."""
    ours, theirs = finals_summary(OURS), finals_summary(THEIRS)
    lift.compare(ours, theirs, Path("base"), family=("a",))
    a, b = (ours["cases"][i]["vs_baseline"] for i in (0, 1))
    assert a["primary"]["family_size"] == 1 and a["primary"]["holm_t_p"] == pytest.approx(a["primary"]["t_p"])
    assert "primary" not in b and b["final_greedy_points"]["mean"] == pytest.approx(3.0)
    lines = lift.comparison_lines(ours)
    assert any(line.startswith("a against `base`") and "Holm over the 1 declared case(s)" in line for line in lines)
    assert any(line.startswith("b against `base`") and "not tested" in line and "Holm" not in line for line in lines)
    with pytest.raises(ValueError, match=r"declared case\(s\) \['c'\] have fewer than 2 seeds"):
        lift.compare(finals_summary(OURS), finals_summary(THEIRS), Path("base"), family=("a", "c"))


def test_every_case_runs_from_another_lifts_warm_start(tmp_path, monkeypatch):
    # The warm start's saved tokenizer replaces the one a case builds (frozenlake's tokenizer_envs).
    from types import SimpleNamespace

    from agent_rl.training.infra import checkpoint

    model_dir = tmp_path / "defaults" / "model"
    monkeypatch.setattr(checkpoint, "find_checkpoint", lambda run_dir, name: SimpleNamespace(model_dir=model_dir))
    # The warm start's own settings (sft.*) are left out: sft.targets=listed fails with sft.mode=none.
    settings = ("sft.targets=listed", "sft.steps=300", "rollout.action_mode=admissible")
    runs = lift.plan(lift.CASES, 1, tmp_path / "candidate", settings, warm_starts_from=tmp_path / "defaults")
    assert any("policy.tokenizer_envs" in override for run in runs for override in run.case.overrides)
    for run in runs:
        config = run.case.config((*run.own_overrides(), *run.warm_start_overrides()))
        assert config.policy.name_or_path == str(model_dir) and config.policy.tokenizer_envs == []
        assert config.sft.mode == "none" and config.rollout.action_mode == "admissible"
        assert not any(o.startswith("sft.") for o in run.own_overrides())
        assert "rollout.action_mode=admissible" in run.command()
    (own,) = lift.plan(lift.CASES[:1], 1, tmp_path / "own", settings)
    assert own.own_overrides() == (*own.case.overrides, *settings)  # a run that trains its warm start keeps them
