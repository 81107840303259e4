"""The RL trainer (training/loop/trainer.py): short end-to-end runs (GRPO, GiGPO), exact resume (also of
runs written before configs were resolved), objects in (model, tokenizer, engine, environment
factory), config/env errors, a user env through the CLI, and a short run that really learns."""

from __future__ import annotations

import io
import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from agent_rl.config import ConfigError, load_config
from agent_rl.training.infra import checkpoint
from agent_rl.training.infra.logger import read_metrics
from agent_rl.training.loop.guards import NONFINITE_STOP, FaultGuard, NonFiniteUpdates
from agent_rl.training.loop.rollout import next_replay_share
from agent_rl.training.loop.trainer import Trainer, train

TESTS = Path(__file__).resolve().parents[1]  # tests/, which holds user_env_example.py
# Two rooms, no doors: the goal item lies one move away. Small enough for seconds-long runs.
TINY_MAZE = "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 4}"


def tiny_run_overrides(run_dir: Path, *extra: str) -> list[str]:
    """Two iterations of a run on any environment, with every size small enough for a test."""
    return [
        "engine=hf",
        f"trainer.run_dir={run_dir}",
        "trainer.iterations=2",
        "trainer.eval_every=2",
        "trainer.eval_episodes=2",
        "trainer.eval_sampled=false",
        "trainer.target_success=null",
        "rollout.n_groups=2",
        "rollout.group_size=2",
        "rollout.min_batch_rows=0",
        "sft.steps=2",
        "sft.episodes=2",
        "optim.micro_batch_size=4",
        "optim.minibatch_size=4",
        *extra,
    ]


def tiny_overrides(run_dir: Path, *extra: str) -> list[str]:
    """``tiny_run_overrides`` on a two-room Maze of at most 4 steps."""
    return [
        TINY_MAZE,
        *tiny_run_overrides(
            run_dir,
            "rollout.max_turns=3",
            "rollout.history_turns=1",
            "rollout.max_new_tokens=8",
            "sft.batch_size=4",
            "logging.console=false",
            "algo.kl_coef=0",
            *extra,
        ),
    ]


def assert_same_metrics(run_dir: Path, expected_dir: Path) -> None:
    """Equal metrics apart from timings; a failure names the first iteration and keys that differ."""

    def timeless(path: Path) -> list[dict]:
        return [
            {k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/tokens_per_s"}
            for r in read_metrics(path)
        ]

    got, expected = timeless(run_dir), timeless(expected_dir)
    assert [r["iteration"] for r in got] == [r["iteration"] for r in expected]
    for a, b in zip(got, expected):
        differing = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        assert not differing, (
            f"iteration {a['iteration']} differs in {[(k, a.get(k), b.get(k)) for k in differing[:4]]}"
        )


# ---- end to end ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "gigpo"])
def test_short_run_writes_logs_checkpoints_and_config(tmp_path, algo):
    run_dir = tmp_path / algo
    reported = []
    summary = train(
        load_config(overrides=tiny_overrides(run_dir, f"algo={algo}", "logging.tensorboard=true")),
        on_iteration=lambda iteration, metrics: reported.append((iteration, dict(metrics))),
    )
    assert summary["iterations"] == 2
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    # The callback sees every logged iteration with the metrics that were logged.
    assert [i for i, _ in reported] == [0, 1, 2]
    assert [m["time/elapsed"] for _, m in reported] == [r["time/elapsed"] for r in records]
    assert reported[0][1]["eval/greedy_success"] == records[0]["eval/greedy_success"]
    assert "eval/greedy_success" in records[0] and "eval/greedy_success" in records[2]
    assert records[2]["eval/greedy_action_entropy"] >= 0.0 and 0.0 <= records[2]["eval/greedy_loop_rate"] <= 1.0
    assert "sft/token_accuracy" in records[0]
    for key in (
        "rollout/success_rate",
        "rollout/invalid_rate",
        "rollout/explored_rate",
        "rollout/action_entropy",
        "rollout/loop_rate",
        "anchors/grouped_fraction",
        "time/rollout",
        "time/update",
        "credit/zero_variance_groups",
        "advantage/mass_early",
        "advantage/mass_late",
    ):
        assert key in records[1], key
    assert 0 <= records[1]["credit/zero_variance_groups"] <= 1
    assert load_config(run_dir / "config.yaml").algo.preset == algo
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert checkpoint.find_checkpoint(run_dir, "last").iteration == 2
    assert checkpoint.find_checkpoint(run_dir, "sft").iteration == 0
    checkpoint.find_checkpoint(run_dir, "best")


@pytest.mark.slow
def test_a_run_can_leave_the_warm_start_unevaluated(tmp_path):
    run_dir = tmp_path / "run"
    train(
        load_config(
            overrides=tiny_overrides(
                run_dir,
                "trainer.eval_first=false",
                "trainer.iterations=1",
                "trainer.eval_every=1",
                "trainer.eval_sampled=true",
            )
        )
    )
    first, last = read_metrics(run_dir)
    assert "sft/token_accuracy" in first and not [key for key in first if key.startswith("eval/")]
    assert last["eval/greedy_minus_sampled"] == last["eval/greedy_success"] - last["eval/sampled_success"]
    assert checkpoint.find_checkpoint(run_dir, "best").iteration == 1  # the first evaluation is the best so far


@pytest.mark.slow
def test_a_run_choosing_among_admissible_actions_plays_no_invalid_turn_and_learns_its_own_logprobs(tmp_path):
    run_dir = tmp_path / "run"
    train(
        load_config(
            overrides=tiny_overrides(
                run_dir, "rollout.action_mode=admissible", "trainer.iterations=1", "trainer.recompute_old_logprobs=true"
            )
        )
    )
    first, last = read_metrics(run_dir)
    assert first["eval/greedy_invalid_rate"] == last["eval/greedy_invalid_rate"] == 0.0
    assert last["rollout/invalid_rate"] == 0.0 and last["rollout/rows"] > 0
    assert last["update/logprob_mismatch_max"] < 1e-4  # the chosen replies' logprobs are the learner's


@pytest.mark.slow
@pytest.mark.parametrize("weights", ["full", "lora"])
def test_resume_continues_exactly(tmp_path, monkeypatch, weights):
    """A resumed run is bit-identical to an uninterrupted one (metrics apart from timings, and the
    weights) on the same machine, libraries and torch thread count: every RNG, the optimizer, the
    engine's sampling seeds and the data order come back from the checkpoint. The thread count
    orders float sums, so a resume under another count continues correctly but not bit-identically;
    the trainer warns then (see the --resume auto test)."""
    overrides = ["trainer.iterations=4", "trainer.eval_every=2", "rollout.n_groups=2", "rollout.group_size=3"]
    if weights == "lora":  # checkpoints hold the adapter alone; the KL reference reloads the SFT one
        pytest.importorskip("peft", reason="peft (the lora extra) is not installed")
        overrides += ["policy.lora_rank=4", "algo.kl_coef=0.01"]
    straight_dir, resumed_dir = tmp_path / "straight", tmp_path / "resumed"
    train(load_config(overrides=tiny_overrides(straight_dir, *overrides)))

    # Kill the second run right after its iteration-2 checkpoint is on disk.
    real_save = checkpoint.save_checkpoint

    def save_then_die(run_dir, iteration, **kwargs):
        path = real_save(run_dir, iteration, **kwargs)
        if iteration == 2:
            raise KeyboardInterrupt("simulated kill")
        return path

    monkeypatch.setattr(checkpoint, "save_checkpoint", save_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(load_config(overrides=tiny_overrides(resumed_dir, *overrides)))
    monkeypatch.setattr(checkpoint, "save_checkpoint", real_save)
    torch.manual_seed(123), np.random.seed(123), random.seed(123)  # the resume must restore every RNG
    train(load_config(resumed_dir / "config.yaml"), resume=True)

    assert [r["iteration"] for r in read_metrics(resumed_dir)] == [0, 1, 2, 3, 4]
    assert_same_metrics(resumed_dir, straight_dir)
    a = checkpoint.find_checkpoint(straight_dir, "last").model_dir
    b = checkpoint.find_checkpoint(resumed_dir, "last").model_dir
    from safetensors.torch import load_file

    weights_file = "adapter_model.safetensors" if weights == "lora" else "model.safetensors"
    wa, wb = load_file(str(a / weights_file)), load_file(str(b / weights_file))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_resume_refuses_a_changed_config(tmp_path):
    run_dir = tmp_path / "run"
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=1")))
    changed = load_config(run_dir / "config.yaml", ["trainer.seed=5"])
    with pytest.raises(checkpoint.CheckpointError, match="different config: trainer.seed"):
        Trainer.from_config(changed, resume=True)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer.from_config(load_config(run_dir / "config.yaml"))


@pytest.mark.slow
def test_resume_auto_starts_an_empty_run_directory_and_continues_a_saved_one(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    (run_dir / checkpoint.CHECKPOINTS / ".tmp-iter-000001-x").mkdir(parents=True)  # what a killed save leaves
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=1")), resume="auto")
    assert not list((run_dir / checkpoint.CHECKPOINTS).glob(".tmp-*"))
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1]
    saved_threads = torch.get_num_threads()
    monkeypatch.setattr(torch, "get_num_threads", lambda: saved_threads + 1)  # another machine, say
    console = Console(file=io.StringIO(), width=400)
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=2")), resume="auto", console=console)
    monkeypatch.undo()
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert (
        f"written with {saved_threads} torch threads, this process has {saved_threads + 1}: float sums are ordered "
        "differently"
    ) in console.file.getvalue()
    assert checkpoint.find_checkpoint(run_dir, "last").iteration == 2
    with pytest.raises(checkpoint.CheckpointError, match="different config: trainer.seed"):
        Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "trainer.seed=3")), resume="auto")
    with pytest.raises(ConfigError, match="trainer.run_dir"):
        Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "trainer.run_dir=null")), resume="auto")
    with pytest.raises(ValueError, match="resume_from"):
        Trainer.from_config(load_config(overrides=tiny_overrides(tmp_path / "other")), resume_from="best")


@pytest.mark.slow
def test_a_corrupt_last_checkpoint_names_the_intact_ones_and_resumes_from_the_chosen_one(tmp_path):
    run_dir = tmp_path / "run"
    train(
        load_config(
            overrides=tiny_overrides(run_dir, "trainer.iterations=2", "trainer.eval_every=1", "trainer.save_every=1")
        )
    )
    last = checkpoint.find_checkpoint(run_dir, "last")
    best = checkpoint.find_checkpoint(run_dir, "best").iteration
    (last.path / "state.json").write_text("{}")
    expected = f"'sft' (iteration 0): agent-rl train --resume {run_dir} --resume-from sft"
    with pytest.raises(checkpoint.CheckpointError, match="corrupt") as refused:
        Trainer.from_config(load_config(run_dir / "config.yaml"), resume=True)
    assert expected in str(refused.value) and "nothing was loaded" in str(refused.value)
    assert ("'best'" in str(refused.value)) == (best != last.iteration)
    console = Console(file=io.StringIO(), width=400)
    train(load_config(run_dir / "config.yaml"), resume=True, resume_from="sft", console=console)
    assert "resumed" in console.file.getvalue() and "now name iteration 0" in console.file.getvalue()
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert checkpoint.find_checkpoint(run_dir, "last").iteration == 2  # written anew over the corrupt one
    assert checkpoint.intact_checkpoints(run_dir)["best"] <= 2


def run_requeued_job(run_dir: Path, **env: str) -> subprocess.CompletedProcess:
    """What a requeued job runs each time: the same command with --resume auto, on the interrupting Maze."""
    overrides = tiny_overrides(
        run_dir, "trainer.iterations=3", "trainer.eval_every=1", "env.id=usertest/InterruptedMaze-v0"
    )
    command = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        "--import",
        "interrupting_env",
        "--resume",
        "auto",
        *overrides,
    ]
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **env}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def uninterrupted_requeued_job(tmp_path_factory) -> Path:
    """The requeued job run once without a signal (shared): what every stopped and resumed run must match."""
    run_dir = tmp_path_factory.mktemp("requeued") / "straight"
    run = run_requeued_job(run_dir)
    assert run.returncode == 0, run.stderr[-2000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.parametrize("signal_name, status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_stops_the_run_with_how_to_go_on_and_resume_auto_finishes_it_exactly(
    tmp_path, uninterrupted_requeued_job, signal_name, status
):
    """A requeued job stopped by a signal inside an iteration (the 13th environment reset, in the
    rollout of iteration 2), then run again."""
    stopped = tmp_path / "stopped"
    first = run_requeued_job(stopped, AGENT_RL_TEST_SIGNAL=f"{signal_name}:13")
    assert first.returncode == status, first.stderr[-2000:]
    assert "Traceback" not in first.stderr
    assert first.stderr.strip().splitlines()[-1] == (
        f"agent-rl: stopped by {signal_name}: the last checkpoint is iteration 1; "
        f"continue with: agent-rl train --resume {stopped}"
    )
    assert [r["iteration"] for r in read_metrics(stopped)] == [0, 1]
    second = run_requeued_job(stopped)
    assert second.returncode == 0, second.stderr[-2000:]
    assert_same_metrics(stopped, uninterrupted_requeued_job)


@pytest.mark.slow
def test_only_rank_zero_decides_whether_the_run_directory_is_taken(tmp_path, monkeypatch):
    """Rank 0 writes its iteration-0 checkpoint before a slow rank 1 may look; rank 1 must follow rank
    0's "fresh directory" verdict instead of refusing the checkpoint rank 0 just wrote (CI race)."""
    import agent_rl.training.loop.trainer as trainer_module
    from agent_rl.training.infra.distributed import DistContext

    run_dir = tmp_path / "run"
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=0")))
    verdicts = []
    monkeypatch.setattr(trainer_module, "init_distributed", lambda device: DistContext(rank=1, world_size=2))
    monkeypatch.setattr(checkpoint, "broadcast_flag", lambda value, ctx: verdicts.append(value) or False)
    Trainer.from_config(load_config(run_dir / "config.yaml"))
    assert verdicts == [False]  # rank 1 offered no verdict of its own


def _as_written_before_resolution(run_dir: Path, config: dict) -> None:
    """Rewrite a run directory's config.yaml and last checkpoint the way the trainer wrote them before
    configs were resolved: ``config`` as given (``auto``, nulls), the manifest updated to match."""
    import hashlib

    import yaml

    (run_dir / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    path = checkpoint.find_checkpoint(run_dir, "last").path
    state = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps({**state, "config": config}, indent=1, sort_keys=True))
    manifest = json.loads((path / checkpoint.MANIFEST).read_text())
    data = (path / "state.json").read_bytes()
    manifest["files"]["state.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    (path / checkpoint.MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True))


@pytest.mark.slow
def test_a_run_written_before_configs_were_resolved_still_resumes(tmp_path):
    from agent_rl.config import config_to_dict

    run_dir = tmp_path / "old"
    overrides = tiny_overrides(run_dir, "trainer.iterations=1")
    train(load_config(overrides=overrides))
    assert load_config(run_dir / "config.yaml").algo.advantage == "drgrpo"  # written resolved
    old = config_to_dict(load_config(overrides=[*overrides, "engine=auto"]))  # what a default run recorded
    assert old["engine"]["kind"] == "auto" and old["env"]["anchor_key"] is None and old["algo"]["loss"] is None
    _as_written_before_resolution(run_dir, old)

    summary = train(load_config(run_dir / "config.yaml", ["trainer.iterations=2", "engine=hf"]), resume=True)
    assert summary["iterations"] == 2
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1, 2]
    assert load_config(run_dir / "config.yaml").env.anchor_key == "state"  # rewritten resolved
    # A real difference is still refused, named by its resolved key.
    _as_written_before_resolution(run_dir, {**old, "algo": {**old["algo"], "preset": "grpo"}})
    with pytest.raises(
        checkpoint.CheckpointError, match="different config: algo.advantage, algo.loss, .*algo.step_credit"
    ):
        Trainer.from_config(
            load_config(run_dir / "config.yaml", ["algo=gigpo", "engine=hf", "trainer.iterations=3"]), resume=True
        )


class _GuessEnv(gym.Env):
    """A plain Gymnasium text env, never registered: name the seeded number from 1 to 3."""

    observation_space = action_space = gym.spaces.Text(64, charset="0123456789 .:abcdefghijklmnopqrstuvwxyzGRW!")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = str(self.np_random.integers(1, 4))
        return "guess a number: 1 2 3", {"admissible_actions": ["1", "2", "3"]}

    def step(self, action):
        won = action == self.target
        return (
            ("Right!" if won else "Wrong."),
            float(won),
            True,
            False,
            {"won": won, "admissible_actions": ["1", "2", "3"]},
        )


@pytest.mark.slow
def test_trainer_takes_a_model_tokenizer_engine_and_environment_factory(tmp_path):
    from agent_rl.training.models.policy import load_policy
    from agent_rl.training.serving.engines import HFEngine

    model, tokenizer = load_policy("embedded")
    engine = HFEngine(model, tokenizer, seed=7)
    config = load_config(
        overrides=tiny_overrides(tmp_path / "objects", "env.id=Guess", "sft.mode=random", "trainer.iterations=1")
    )
    trainer = Trainer(config, model=model, tokenizer=tokenizer, make_env=_GuessEnv, engine=engine)
    try:
        assert trainer.engine is engine and trainer.pool.env_id == "_GuessEnv"
        assert trainer.config.env.anchor_key == "observation"  # an unregistered env: the generic key
        summary = trainer.run()
    finally:
        trainer.close()
    assert summary["iterations"] == 1 and engine.calls > 0
    records = read_metrics(tmp_path / "objects")
    assert [r["iteration"] for r in records] == [0, 1] and records[1]["rollout/length"] == 1.0
    # train() builds only what is not given.
    summary = train(
        load_config(
            overrides=tiny_overrides(tmp_path / "factory", "env.id=Guess", "sft.mode=random", "trainer.iterations=1")
        ),
        make_env=_GuessEnv,
    )
    assert summary["iterations"] == 1
    with pytest.raises(ValueError, match="sft.mode=oracle needs an environment with an oracle"):
        train(
            load_config(overrides=tiny_overrides(tmp_path / "oracle", "env.id=Guess", "sft.mode=oracle")),
            make_env=_GuessEnv,
        )


@pytest.mark.parametrize(
    "metrics, target, reached",
    [
        ({"eval/greedy_success": 0.97, "eval/confirm_greedy_success": 0.93}, 0.95, False),  # not confirmed
        ({"eval/greedy_success": 0.97, "eval/confirm_greedy_success": 0.95}, 0.95, True),
        ({"eval/greedy_success": 0.97}, 0.95, True),  # confirm_episodes=0: the periodic evaluation decides
        ({"eval/greedy_success": 0.91}, 0.95, False),
        ({"eval/greedy_success": 1.0}, None, False),  # no target: train every iteration
        ({"rollout/success_rate": 1.0}, 0.95, False),  # no evaluation this iteration
    ],
)
def test_the_stopping_rule_lets_the_confirmation_decide(metrics, target, reached):
    from agent_rl.training.loop.evaluation import target_reached

    assert target_reached(metrics, target) is reached


@pytest.mark.parametrize(
    ("iterations", "every", "due"),
    [(10, 4, [4, 8, 10]), (10, 0, [10]), (8, 4, [4, 8]), (3, 5, [3]), (6, 1, [1, 2, 3, 4, 5, 6])],
)
def test_evaluations_fall_every_eval_every_iterations_and_after_the_last(iterations, every, due):
    from agent_rl.training.loop.evaluation import eval_due

    trainer = load_config(overrides=[f"trainer.iterations={iterations}", f"trainer.eval_every={every}"]).trainer
    assert [i for i in range(1, iterations + 1) if eval_due(i, trainer)] == due


def test_skipped_non_finite_steps_are_reported_and_several_in_a_row_stop_the_run(tmp_path):
    console = Console(file=io.StringIO(), width=300)
    watch = FaultGuard(load_config(), console, lambda: checkpoint.how_to_go_on(tmp_path))

    def guard(skipped: float, taken: float) -> int:
        watch.check_updates(3, {"update/nonfinite_steps": skipped, "update/optimizer_steps": taken})
        return watch.nonfinite_streak

    assert guard(1, 1) == 1  # skipped after the last step taken, at worst
    assert guard(0, 2) == 0  # a finite step ends the streak
    assert guard(2, 0) == 2 and guard(NONFINITE_STOP - 3, 0) == NONFINITE_STOP - 1
    assert (
        "iteration 3: 2 optimizer step(s) skipped: the loss or the gradient norm was not finite"
        in console.file.getvalue()
    )
    with pytest.raises(
        NonFiniteUpdates,
        match=f"{NONFINITE_STOP} optimizer steps in a row had a non-finite loss or gradient "
        "norm at iteration 3; they changed no weight and the run stops "
        "\\(no checkpoint was saved yet\\)",
    ):
        guard(1, 0)


class NeverPays(gym.Env):
    """Every action is valid and none pays: every group's returns are equal."""

    observation_space = action_space = gym.spaces.Text(32, charset=string.printable)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "A door.", {"admissible_actions": ["knock", "wait"]}

    def step(self, action):
        return "Nothing.", 0.0, False, False, {"admissible_actions": ["knock", "wait"], "won": False}


gym.register("trainer_test/NeverPays-v0", entry_point=NeverPays)


def test_an_iteration_whose_groups_the_variance_filter_all_drops_takes_no_step_and_says_why(tmp_path):
    console = Console(file=io.StringIO(), width=300)
    overrides = [
        o
        for o in tiny_overrides(
            tmp_path / "run", "trainer.iterations=1", "algo.keep_groups=0.5", "algo.invalid_penalty=0"
        )
        if not o.startswith("env.kwargs")
    ]
    train(load_config(overrides=["env.id=trainer_test/NeverPays-v0", *overrides]), console=console)
    last = read_metrics(tmp_path / "run")[-1]
    assert last["update/skipped"] == 1.0 and last["credit/kept_groups"] == 0.0
    assert last["credit/zero_variance_groups"] == 1.0
    assert (
        "iteration 1: the variance filter (algo.keep_groups, algo.drop_flat_groups) dropped every group: "
        "each group's returns were all equal; no optimizer step"
    ) in console.file.getvalue()


@pytest.mark.parametrize("setting", ["rollout.target_pass_rate=0.5", "rollout.progress_reward=0.1"])
def test_the_reverse_curriculum_and_progress_shaping_need_oracle_plans(tmp_path, setting):
    overrides = [o for o in tiny_overrides(tmp_path, setting) if not o.startswith("env.kwargs")]
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=f"config key '{key}': it needs oracle plans.*NeverPays.*gives none"):
        Trainer.from_config(load_config(overrides=["env.id=trainer_test/NeverPays-v0", *overrides]))


@pytest.mark.slow
def test_greedy_members_turns_are_scored_at_the_sampling_temperature_before_the_update(tmp_path):
    """Greedy decoding reports logprobs at temperature 1; the learner scores those turns at the
    rollout's 0.5, so the update's first step starts where the policy is: ratios 1, KL 0."""
    run_dir = tmp_path / "run"
    train(load_config(overrides=tiny_overrides(run_dir, "rollout.greedy_members=1", "rollout.temperature=0.5")))
    first = read_metrics(run_dir)[1]
    assert first["update/first_step_approx_kl"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.slow
def test_the_reverse_curriculum_moves_its_share_toward_the_target_and_checkpoints_it(tmp_path):
    """Each iteration logs the share it replayed; the next one replays a step more or less, as that
    iteration's training success was below or above the target; the share goes on from the checkpoint."""
    run_dir = tmp_path / "run"
    curriculum = ("rollout.target_pass_rate=0.5", "rollout.replay_start=0.5", "rollout.replay_step=0.25")
    train(load_config(overrides=tiny_overrides(run_dir, *curriculum)))
    first, second = read_metrics(run_dir)[1:]
    assert first["rollout/replay_share"] == 0.5 and first["rollout/replayed_turns"] > 0
    expected = 0.5 + 0.25 * np.sign(0.5 - first["rollout/success_rate"])
    assert second["rollout/replay_share"] == expected
    state = checkpoint.find_checkpoint(run_dir, "last").state
    assert state["trainer"]["replay_share"] == next_replay_share(expected, second["rollout/success_rate"], 0.5, 0.25)


def test_unknown_environment_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="config key 'env.id': unknown environment 'nope/Nothing-v0'"):
        Trainer.from_config(load_config(overrides=tiny_overrides(tmp_path, "env.id=nope/Nothing-v0", "env.kwargs={}")))


@pytest.mark.slow
def test_user_registered_env_trains_through_the_cli(tmp_path):
    run_dir = tmp_path / "counter"
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    overrides = [o for o in tiny_overrides(run_dir, "trainer.iterations=1") if not o.startswith("env.kwargs")]
    command = [
        sys.executable,
        "-m",
        "agent_rl.cli",
        "train",
        "--import",
        "user_env_example",
        "env.id=usertest/Counter-v0",
        "env.kwargs={max_target: 2, max_steps: 3}",
        *overrides,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1]
    assert load_config(run_dir / "config.yaml").env.imports == ["user_env_example"]
    # And it evaluates through the CLI, its warm start too.
    out = tmp_path / "eval.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent_rl.cli",
            "eval",
            str(run_dir),
            "--episodes",
            "2",
            "--checkpoint",
            "sft",
            "--json",
            str(out),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    evaluated = json.loads(out.read_text())
    assert evaluated["env"] == "usertest/Counter-v0" and Path(evaluated["model"]).parent.name == "iter-000000"


def test_cli_reports_bad_config_in_one_line(capsys):
    from agent_rl.cli import main

    assert main(["train", "trainer.iteratons=5"]) == 2
    assert "unknown config key 'trainer.iteratons' (did you mean 'trainer.iterations'?)" in capsys.readouterr().err


def test_a_run_directory_in_use_is_refused_in_one_line_and_free_once_its_run_ends(tmp_path, capsys):
    from filelock import FileLock

    from agent_rl.cli import main
    from agent_rl.training.loop.run_dir import LOCK_FILE, run_dir_in_use

    run_dir = tmp_path / "run"
    assert not run_dir_in_use(run_dir) and not run_dir.exists()  # asking creates nothing
    first = Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "sft.mode=none")))
    assert run_dir_in_use(run_dir)
    try:
        # A second trainer (in this process or another) would delete the first one's saves in progress.
        with pytest.raises(FileExistsError, match="in use by another training process"):
            Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "sft.mode=none")), resume="auto")
    finally:
        first.close()
    assert not run_dir_in_use(run_dir)
    with FileLock(run_dir / LOCK_FILE):  # as another process training there holds it
        assert run_dir_in_use(run_dir)
        assert main(["train", "--resume", "auto", *tiny_overrides(run_dir, "sft.mode=none")]) == 2
    assert "is in use by another training process" in capsys.readouterr().err
    assert not list(run_dir.glob("*.jsonl"))  # the refused runs wrote nothing
    Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "sft.mode=none")), resume="auto").close()


@pytest.mark.vllm
@pytest.mark.slow
def test_short_run_with_vllm(tmp_path):
    # One preset: the engine serves rollouts and takes weight syncs the same way whatever the loss,
    # and each start of vLLM's compiled engine costs half a minute here.
    pytest.importorskip("vllm")
    run_dir = tmp_path / "vllm"
    summary = train(load_config(overrides=tiny_overrides(run_dir, "engine=vllm", "algo=gigpo")))
    assert summary["iterations"] == 2
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1, 2]


# ---- learning is real --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_policy_dir(tmp_path_factory) -> Path:
    """A 0.15M-parameter Qwen2 with the embedded tokenizer: the same code path as the embedded model,
    fast enough to learn within a test."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agent_rl.training.models.policy import load_policy

    embedded, tokenizer = load_policy("embedded")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=embedded.config.vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=embedded.config.bos_token_id,
        eos_token_id=embedded.config.eos_token_id,
        pad_token_id=embedded.config.pad_token_id,
    )
    path = tmp_path_factory.mktemp("small_policy")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_learning_is_real_on_a_tiny_maze(tmp_path, small_policy_dir):
    # Two rooms: move once, then take the goal item. SFT on random admissible actions teaches the
    # format only; greedy decoding of that policy wins a quarter of the training mazes. GiGPO must
    # learn the task. The 2-room Maze has 4 layouts and 3 of them are held out, so a 0.15M-parameter
    # policy that learns its one training layout still fails the held-out ones: the test measures
    # greedy success on training seeds, before (the sft checkpoint) and after (the last).
    from agent_rl.training.loop.evaluation import evaluate
    from agent_rl.training.models.policy import load_policy
    from agent_rl.training.serving.engines import make_engine
    from agent_rl.training.serving.envpool import env_factory

    run_dir = tmp_path / "learn"
    overrides = [
        "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 6}",
        "engine=hf",
        f"policy={small_policy_dir}",
        f"trainer.run_dir={run_dir}",
        "trainer.iterations=12",
        "trainer.eval_every=12",
        "trainer.eval_episodes=32",
        "trainer.eval_sampled=false",
        "trainer.target_success=null",
        "rollout.n_groups=4",
        "rollout.group_size=8",
        "rollout.max_turns=6",
        "rollout.history_turns=0",
        "rollout.max_new_tokens=8",
        "sft.mode=random",
        "sft.steps=300",
        "sft.episodes=32",
        "sft.batch_size=16",
        "sft.lr=3e-3",
        "sft.lr_schedule=constant",
        "optim.lr=1e-3",
        "algo=gigpo",
        "algo.kl_coef=0",
        "logging.console=false",
        "logging.tensorboard=false",
        # The learner it was calibrated with: std-normalized GiGPO, one step per batch of all rows, gamma
        # 0.95, no penalty, full-weight negative advantages, every turn alike, temperature 1, no warmup.
        "algo.advantage=grpo",
        "algo.step_normalize=mean_std",
        "optim.minibatches=1",
        "optim.minibatch_size=0",
        "optim.epochs=1",
        "optim.min_steps=0",
        "optim.warmup_steps=0",
        "algo.gamma=0.95",
        "algo.invalid_penalty=0",
        "algo.negative_weight=1",
        "algo.row_weight=turn",
        "rollout.temperature=1",
        "rollout.min_batch_rows=0",
    ]
    config = load_config(overrides=overrides)
    train(config)
    assert read_metrics(run_dir)[-1]["iteration"] == 12
    success = {}
    for name in ("sft", "last"):
        model, tokenizer = load_policy(str(checkpoint.find_checkpoint(run_dir, name).model_dir))
        stats = evaluate(
            env_factory(config),
            make_engine("hf", model, tokenizer),
            tokenizer,
            list(range(32)),
            greedy=True,
            config=config.rollout,
        )
        success[name] = stats["success_rate"]
    assert success["last"] >= success["sft"] + 0.25, success


def _greedy_player(outcomes, calls):
    """A greedy evaluation with one fixed outcome per held-out seed; records the seeds of each call."""
    from agent_rl.envs import EVAL_SEED_BASE

    def play(seeds):
        calls.append([s - EVAL_SEED_BASE for s in seeds])
        return sum(outcomes[s - EVAL_SEED_BASE] for s in seeds)

    return play


@pytest.mark.parametrize(
    "losses, expected_calls, expected",
    [
        (
            {5},
            [range(32, 64), range(64, 96), range(96, 128)],
            {"eval/confirm_greedy_success": 127 / 128, "eval/confirm_greedy_episodes": 128.0},
        ),
        # 2 periodic losses, 4 more in the first chunk (6 of 128 allowed at 95%), a 7th in the second: stop there.
        (
            {0, 1, 40, 41, 42, 43, 70},
            [range(32, 64), range(64, 96)],
            {"eval/confirm_greedy_success": 89 / 96, "eval/confirm_greedy_episodes": 96.0},
        ),
        (set(range(7)), [], {}),  # 7 periodic losses: 95% of 128 is out of reach, nothing more is played
    ],
)
def test_the_confirmation_extends_the_periodic_evaluation_while_the_target_is_within_reach(
    losses, expected_calls, expected
):
    from agent_rl.training.loop.evaluation import confirm

    outcomes = [i not in losses for i in range(128)]
    calls = []
    result = confirm(_greedy_player(outcomes, calls), 32, sum(outcomes[:32]), 128, 0.95)
    assert result == pytest.approx(expected) and calls == [list(r) for r in expected_calls]


def test_the_confirmation_plays_a_short_last_chunk_and_needs_a_periodic_evaluation():
    from agent_rl.training.loop.evaluation import confirm

    calls = []
    assert confirm(_greedy_player([True] * 100, calls), 32, 32, 100, 0.9)["eval/confirm_greedy_episodes"] == 100.0
    assert [len(c) for c in calls] == [32, 32, 4]
    with pytest.raises(ValueError, match="played=0"):
        confirm(_greedy_player([True] * 100, []), 0, 0, 100, 0.9)


def test_an_eval_offset_moves_the_evaluation_and_its_confirmation_to_other_held_out_seeds():
    from agent_rl.config import ConfigError, load_default_config
    from agent_rl.envs import EVAL_SEED_BASE
    from agent_rl.training.loop.evaluation import confirm, eval_seeds

    assert eval_seeds(3) == [EVAL_SEED_BASE, EVAL_SEED_BASE + 1, EVAL_SEED_BASE + 2]
    assert eval_seeds(3, 128) == [EVAL_SEED_BASE + 128, EVAL_SEED_BASE + 129, EVAL_SEED_BASE + 130]
    assert not set(eval_seeds(128)) & set(eval_seeds(128, 128))  # disjoint held-out episodes
    # Seeds 128-159 were played (all won); the confirmation goes on from 160, not from 32.
    calls = []
    result = confirm(_greedy_player([True] * 256, calls), 32, 32, 64, 0.9, offset=128)
    assert calls == [list(range(160, 192))] and result["eval/confirm_greedy_episodes"] == 64.0
    for bad in (-1, 2**30 + 1):
        with pytest.raises(ConfigError, match="trainer.eval_offset"):
            load_default_config([f"trainer.eval_offset={bad}"])


def test_the_periodic_evaluation_plays_the_held_out_seeds_from_the_offset(monkeypatch):
    from agent_rl.config import load_default_config
    from agent_rl.envs import EVAL_SEED_BASE
    from agent_rl.training.loop import evaluation

    played = []

    def evaluate(envs, engine, tokenizer, seeds, *, greedy, config, progress):
        played.append(([s - EVAL_SEED_BASE for s in seeds], greedy))
        return {
            "success_rate": 0.5,
            "mean_length": 3.0,
            "invalid_action_rate": 0.0,
            "action_entropy": 0.1,
            "loop_rate": 0.25,
            "trajectories": len(seeds),
        }

    monkeypatch.setattr(evaluation, "evaluate", evaluate)
    config = load_default_config(["trainer.eval_episodes=4", "trainer.eval_offset=128", "trainer.target_success=null"])
    metrics = evaluation.evaluate_heldout(None, None, None, config)
    assert played == [([128, 129, 130, 131], True), ([128, 129, 130, 131], False)]
    assert metrics["eval/greedy_success"] == 0.5 and metrics["eval/greedy_minus_sampled"] == 0.0


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_the_confirmation_decides_as_a_fresh_evaluation_of_every_seed(data):
    from agent_rl.training.loop.evaluation import confirm, target_reached

    episodes = data.draw(st.integers(2, 80))
    played = data.draw(st.integers(1, episodes - 1))
    target = data.draw(st.sampled_from([0.5, 0.8, 0.9, 0.95, 1.0]))
    outcomes = data.draw(st.lists(st.booleans(), min_size=episodes, max_size=episodes))
    periodic = {"eval/greedy_success": sum(outcomes[:played]) / played}
    metrics = periodic | confirm(_greedy_player(outcomes, []), played, sum(outcomes[:played]), episodes, target)
    assert target_reached(metrics, target) is (sum(outcomes) / episodes >= target)


def test_blind_step_credit_is_said_once_per_run(tmp_path):
    console = Console(file=io.StringIO(), width=300)
    watch = FaultGuard(load_config(overrides=["env.anchor_key=observation"]), console, lambda: "")
    watch.check_credit(1, None)
    assert console.file.getvalue() == ""
    watch.check_credit(2, "no anchor state recurs within a group")
    watch.check_credit(3, "no anchor state recurs within a group")
    said = console.file.getvalue()
    assert said.count("warning") == 1 and "iteration 2: no anchor state recurs within a group" in said
    assert "env.anchor_key=observation may never repeat" in said


def test_a_trainer_that_fails_to_start_frees_its_run_directory(tmp_path, monkeypatch):
    """The environments fail to start (a Ray cluster out of reach) after the run directory was taken:
    the error reaches the caller, and a retry in the same process (a notebook's next cell) finds the
    directory free."""
    import agent_rl.training.loop.trainer as trainer_module

    def unreachable(*args):
        raise ConnectionError("no Ray cluster at ray://head:10001")

    run_dir = tmp_path / "run"
    with monkeypatch.context() as patched:
        patched.setattr(trainer_module, "pool_from_config", unreachable)
        with pytest.raises(ConnectionError, match="no Ray cluster") as failure:
            Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "sft.mode=none")))
    # The traceback stays alive (as a notebook keeps its last one), and with it the failed trainer.
    Trainer.from_config(load_config(overrides=tiny_overrides(run_dir, "sft.mode=none")), resume="auto").close()
    assert failure.traceback
