"""The RL trainer: advantages on a hand-built batch, micro-batch invariance of the gradient, short
end-to-end runs (GRPO, GiGPO), exact resume, config/env errors, a user env through the CLI, and a
short run that really learns."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from agent_rl.batch import StepBatch
from agent_rl.config import load_config
from training import checkpoint
from training.logger import read_metrics
from training.trainer import Trainer, accumulate_policy_gradient, minibatch_count, train

TESTS = Path(__file__).resolve().parent
# Two rooms, no doors: the goal item lies one move away. Small enough for seconds-long runs.
TINY_MAZE = "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 4}"


def tiny_overrides(run_dir: Path, *extra: str) -> list[str]:
    return [
        TINY_MAZE, "engine=hf", f"trainer.run_dir={run_dir}", "trainer.iterations=2", "trainer.eval_every=2",
        "trainer.eval_episodes=2", "trainer.eval_sampled=false", "trainer.target_success=null",
        "rollout.n_groups=2", "rollout.group_size=2", "rollout.max_turns=3", "rollout.history_turns=1",
        "rollout.max_new_tokens=8", "sft.steps=2", "sft.episodes=2", "sft.batch_size=4",
        "optim.micro_batch_size=4", "logging.console=false", "algo.kl_coef=0", *extra,
    ]


# ---- minibatch updates -----------------------------------------------------------------------------------


def test_minibatch_count():
    optim = load_config().optim
    assert optim.minibatches == 4 and optim.minibatch_size == 0
    assert minibatch_count(10, optim) == 4
    assert minibatch_count(3, optim) == 3  # never more minibatches than rows
    optim.minibatch_size = 4
    assert minibatch_count(10, optim) == 2
    assert minibatch_count(3, optim) == 1


def _synthetic_rows(tokenizer, n: int, seed: int):
    rng = np.random.default_rng(seed)
    vocab = len(tokenizer)
    prompts = [rng.integers(8, vocab, size=rng.integers(4, 12)) for _ in range(n)]
    responses = [rng.integers(8, vocab, size=rng.integers(1, 5)) for _ in range(n)]
    return prompts, responses, rng.normal(size=n)


@pytest.mark.slow
def test_minibatch_update_does_not_depend_on_the_micro_batch_split_and_moves_the_ratios(tmp_path):
    """Two trainers from the same seed run the same update (3 minibatches x 2 epochs) with different
    micro-batch sizes: every optimizer step sees the same minibatch gradient. The rows are on-policy
    for the first step only: the ratios must leave 1 afterwards and the clip act. (A small lr and
    GRPO's token clip: at lr 3e-4 one step moves these random rows so far that every later token
    is clipped and the later gradients are all zero.)"""
    from training.engines import sequence_logprobs

    trainers = [
        Trainer(load_config(overrides=tiny_overrides(tmp_path / f"m{size}", "optim.minibatches=3", "optim.epochs=2",
                                                     "algo.loss=grpo", "optim.lr=1e-5", f"optim.micro_batch_size={size}")))
        for size in (1, 64)
    ]
    prompts, responses, advantages = _synthetic_rows(trainers[0].tokenizer, 9, seed=0)
    with torch.no_grad():
        logp, _ = sequence_logprobs(trainers[0].model, prompts, responses, 1.0)
    old = [row[: len(r)].numpy() for row, r in zip(logp, responses)]
    results, gradients = [], []
    for trainer in trainers:
        seen, step = [], trainer.optimizer.step

        def record(*args, seen=seen, step=step, model=trainer.model, **kwargs):
            seen.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
            return step(*args, **kwargs)

        trainer.optimizer.step = record
        with trainer._progress() as progress:
            results.append(trainer.update(prompts, responses, old, advantages, progress))
        gradients.append(seen)
        trainer.close()
    assert len(gradients[0]) == len(gradients[1]) == 6
    for small, large in zip(*gradients):
        assert float(large.norm()) > 0
        assert float((small - large).norm() / large.norm()) < 1e-3
    for metrics in results:
        assert metrics["update/optimizer_steps"] == 6.0
        assert metrics["update/ratio_max"] > 1.0 + 1e-4 or metrics["update/ratio_min"] < 1.0 - 1e-4
        assert metrics["update/clip_frac"] > 0.0


# ---- micro-batch invariance -----------------------------------------------------------------------------


def _tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128,
    )
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("loss", ["grpo", "dapo", "drgrpo", "gspo", "gspo_token", "cispo"])
def test_gradient_does_not_depend_on_micro_batch_split(loss):
    from agent_rl.losses import LOSS_PRESETS

    model = _tiny_model()
    rng = np.random.default_rng(0)
    n = 7
    # Two tasks behind one system prompt: micro-batches forward shared prefixes once.
    system, tasks = [1, 2, 3], [[4, 5, 6, 7], [8, 9]]
    prompts = [np.array(system + tasks[i % 2] + list(rng.integers(3, 40, size=rng.integers(1, 6)))) for i in range(n)]
    responses = [rng.integers(3, 40, size=rng.integers(1, 6)) for _ in range(n)]
    old = [rng.normal(-2.5, 0.3, size=len(r)).astype(np.float32) for r in responses]
    advantages = rng.normal(size=n)
    advantages[[1, 4]] = 0.0  # zero-advantage rows are skipped but still count in the normalizers
    kwargs = {**LOSS_PRESETS[loss], "kl_coef": 0.0}
    if kwargs["loss_agg"] == "seq_mean_token_sum_norm":
        kwargs["norm_length"] = 8

    def gradient(micro_batch_size: int) -> torch.Tensor:
        model.zero_grad(set_to_none=True)
        accumulate_policy_gradient(
            model, prompts, responses, old, advantages, loss_kwargs=kwargs, temperature=1.0,
            micro_batch_size=micro_batch_size,
        )
        return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    whole, split_one, split_three = gradient(n), gradient(1), gradient(3)
    assert whole.abs().sum() > 0
    torch.testing.assert_close(split_one, whole, rtol=1e-4, atol=1e-7)
    torch.testing.assert_close(split_three, whole, rtol=1e-4, atol=1e-7)

    # The same gradient as the plain full-batch loss over every row (zero-advantage rows included).
    from agent_rl.losses import policy_loss
    from training.engines import sequence_logprobs

    model.zero_grad(set_to_none=True)
    logp, mask = sequence_logprobs(model, prompts, responses)
    old_padded = torch.zeros_like(logp)
    for i, row in enumerate(old):
        old_padded[i, : len(row)] = torch.as_tensor(row)
    policy_loss(logp, old_padded, torch.as_tensor(advantages, dtype=torch.float32), mask, **kwargs).loss.backward()
    reference = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    torch.testing.assert_close(whole, reference, rtol=1e-4, atol=1e-7)


def _length_plan(prompts, responses, rows, size):
    order = rows[np.argsort([len(prompts[i]) + len(responses[i]) for i in rows], kind="stable")]
    return np.split(order, np.arange(size, len(order), size))


def _tokens(plan, prompts, responses):
    """Forwarded tokens, counted row by row: the micro-batch's shared prefix once, the rest padded."""
    total = 0
    for batch in plan:
        shared = 0
        if len(batch) > 1:
            first = prompts[batch[0]]
            shared = min(min(next((k for k, (a, b) in enumerate(zip(first, prompts[i])) if a != b),
                                  min(len(first), len(prompts[i]))) for i in batch),
                         min(len(prompts[i]) for i in batch) - 1)
        rest = max(len(prompts[i]) for i in batch) - shared + max(len(responses[i]) for i in batch)
        total += shared + len(batch) * rest
    return total


def test_micro_batch_plan_keeps_each_task_together_sorted_by_length():
    from training.trainer import plan_micro_batches

    system = [1, 2, 3]
    task_a, task_b = [10, 11, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25]
    prompts = [np.array(system + (task_a if i % 2 else task_b) + [30] * (i % 5)) for i in range(12)]
    responses = [np.array([7] * (1 + i % 3)) for i in range(12)]
    plan = plan_micro_batches(prompts, responses, np.arange(12), size=4)
    assert sorted(np.concatenate(plan).tolist()) == list(range(12))
    assert [len(b) for b in plan] == [4, 2, 4, 2]  # no micro-batch spans the two tasks
    for batch in plan:
        assert len({i % 2 for i in batch}) == 1
        totals = [len(prompts[i]) + len(responses[i]) for i in batch]
        assert totals == sorted(totals)
    assert _tokens(plan, prompts, responses) < _tokens(_length_plan(prompts, responses, np.arange(12), 4), prompts, responses)


def test_micro_batch_plan_sorts_by_length_when_prompts_share_nothing():
    from training.trainer import plan_micro_batches

    prompts = [np.array([i + 1] + [5] * (i % 4)) for i in range(9)]
    responses = [np.array([7, 8]) for _ in range(9)]
    rows = np.array([0, 2, 3, 5, 6, 8])
    plan = plan_micro_batches(prompts, responses, rows, size=4)
    assert [b.tolist() for b in plan] == [b.tolist() for b in _length_plan(prompts, responses, rows, 4)]
    assert plan_micro_batches(prompts, responses, np.array([3]), size=4)[0].tolist() == [3]
    assert plan_micro_batches(prompts, responses, np.array([], dtype=np.int64), size=4) == []


@settings(max_examples=60, deadline=None)
@given(
    prefixes=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=6), min_size=1, max_size=4),
    rows=st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(1, 6), max_size=5), st.integers(1, 4)),
                  min_size=1, max_size=30),
    size=st.integers(1, 7),
)
def test_micro_batch_plan_is_a_partition_that_forwards_no_more_than_sorting_by_length(prefixes, rows, size):
    from training.trainer import plan_micro_batches

    prompts = [np.array([9, *prefixes[k % len(prefixes)], *tail]) for k, tail, _ in rows]
    responses = [np.array([1] * n) for _, _, n in rows]
    picked = np.arange(len(rows))[::-1]
    plan = plan_micro_batches(prompts, responses, picked, size)
    assert sorted(np.concatenate(plan).tolist()) == sorted(picked.tolist())
    assert all(1 <= len(batch) <= size for batch in plan)
    assert _tokens(plan, prompts, responses) <= _tokens(_length_plan(prompts, responses, picked, size), prompts, responses)


# ---- end to end ------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "gigpo"])
def test_short_run_writes_logs_checkpoints_and_config(tmp_path, algo):
    run_dir = tmp_path / algo
    reported = []
    summary = train(load_config(overrides=tiny_overrides(run_dir, f"algo={algo}", "logging.tensorboard=true")),
                    on_iteration=lambda iteration, metrics: reported.append((iteration, dict(metrics))))
    assert summary["iterations"] == 2
    records = read_metrics(run_dir)
    assert [r["iteration"] for r in records] == [0, 1, 2]
    # The callback sees every logged iteration with the metrics that were logged.
    assert [i for i, _ in reported] == [0, 1, 2]
    assert [m["time/elapsed"] for _, m in reported] == [r["time/elapsed"] for r in records]
    assert reported[0][1]["eval/greedy_success"] == records[0]["eval/greedy_success"]
    assert "eval/greedy_success" in records[0] and "eval/greedy_success" in records[2]
    assert "sft/token_accuracy" in records[0]
    for key in ("rollout/success_rate", "rollout/invalid_rate", "anchors/grouped_fraction", "time/rollout", "time/update"):
        assert key in records[1], key
    assert load_config(run_dir / "config.yaml").algo.preset == algo
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    assert checkpoint.find_checkpoint(run_dir, "last").iteration == 2
    assert checkpoint.find_checkpoint(run_dir, "sft").iteration == 0
    checkpoint.find_checkpoint(run_dir, "best")


@pytest.mark.slow
def test_resume_continues_exactly(tmp_path, monkeypatch):
    overrides = ["trainer.iterations=4", "trainer.eval_every=2", "rollout.n_groups=2", "rollout.group_size=3"]
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

    def comparable(run_dir):
        return [{k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/tokens_per_s"} for r in read_metrics(run_dir)]

    assert [r["iteration"] for r in read_metrics(resumed_dir)] == [0, 1, 2, 3, 4]
    assert comparable(resumed_dir) == comparable(straight_dir)
    a = checkpoint.find_checkpoint(straight_dir, "last").model_dir
    b = checkpoint.find_checkpoint(resumed_dir, "last").model_dir
    from safetensors.torch import load_file

    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_resume_refuses_a_changed_config(tmp_path):
    run_dir = tmp_path / "run"
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=1")))
    changed = load_config(run_dir / "config.yaml", ["trainer.seed=5"])
    with pytest.raises(checkpoint.CheckpointError, match="different config: trainer.seed"):
        Trainer(changed, resume=True)
    with pytest.raises(FileExistsError, match="--resume"):
        Trainer(load_config(run_dir / "config.yaml"))


@pytest.mark.slow
def test_only_rank_zero_decides_whether_the_run_directory_is_taken(tmp_path, monkeypatch):
    """Rank 0 writes its iteration-0 checkpoint before a slow rank 1 may look; rank 1 must follow rank
    0's "fresh directory" verdict instead of refusing the checkpoint rank 0 just wrote (CI race)."""
    import training.trainer as trainer_module
    from training.distributed import DistContext

    run_dir = tmp_path / "run"
    train(load_config(overrides=tiny_overrides(run_dir, "trainer.iterations=0")))
    verdicts = []
    monkeypatch.setattr(trainer_module, "init_distributed", lambda device: DistContext(rank=1, world_size=2))
    monkeypatch.setattr(trainer_module, "broadcast_flag", lambda value, ctx: verdicts.append(value) or False)
    Trainer(load_config(run_dir / "config.yaml"))
    assert verdicts == [False]  # rank 1 offered no verdict of its own


def test_unknown_environment_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="config key 'env.id': unknown environment 'nope/Nothing-v0'"):
        Trainer(load_config(overrides=tiny_overrides(tmp_path, "env.id=nope/Nothing-v0", "env.kwargs={}")))


class _BareTextEnv(gym.Env):
    """A plain Gymnasium text env: no admissible actions in ``info`` and no oracle."""

    observation_space = gym.spaces.Text(16)
    action_space = gym.spaces.Text(16)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "start", {}

    def step(self, action):
        return "start", 0.0, False, False, {}


@pytest.mark.parametrize(
    "mode, message",
    [("oracle", "sft.mode=oracle needs an environment with an oracle"), ("random", "sft.mode=random needs an environment")],
)
def test_warm_start_names_what_the_environment_lacks(mode, message):
    from training.policy import load_policy
    from training.sft import collect_demonstrations

    _, tokenizer = load_policy("embedded")
    with pytest.raises(ValueError, match=message):
        collect_demonstrations(
            _BareTextEnv(), tokenizer, mode=mode, episodes=1, seeds=np.array([0]), rng=np.random.default_rng(0),
            max_turns=2, history_turns=0, parser="first_line", max_prompt_tokens=256,
        )


def _counter_demonstrations(perturb: float, episodes: int = 20):
    import re

    import user_env_example  # noqa: F401  (registers usertest/Counter-v0)
    from training.policy import load_policy
    from training.sft import collect_demonstrations

    _, tokenizer = load_policy("embedded")
    env = gym.make("usertest/Counter-v0", max_target=5, max_steps=40)
    demos = collect_demonstrations(
        env, tokenizer, mode="oracle", episodes=episodes, seeds=np.arange(episodes), rng=np.random.default_rng(0),
        max_turns=40, history_turns=40, parser="first_line", max_prompt_tokens=2048, perturb=perturb,
    )
    pairs = []
    for prompt, response in zip(demos.prompts, demos.responses):
        text = tokenizer.decode(prompt, skip_special_tokens=True)
        target = int(re.search(r"equal (\d+)", text).group(1))
        value = int(re.search(r"\[Current observation\]\s*The counter shows (-?\d+)", text).group(1))
        history = re.findall(r"\[Action \d+\]\s*(\w+)", text)
        pairs.append((target, value, history, tokenizer.decode(response, skip_special_tokens=True)))
    return demos, pairs


def test_oracle_demonstrations_clone_the_plan():
    demos, pairs = _counter_demonstrations(perturb=0.0)
    assert demos.successes == demos.episodes
    assert all(action == "inc" and history == ["inc"] * value for _, value, history, action in pairs)
    # One pair per step of each episode's plan: 0 -> target.
    assert len(pairs) == sum(target for target, value, _, _ in pairs if value == 0)


def test_perturbed_demonstrations_clone_the_oracle_from_where_a_random_action_led():
    demos, pairs = _counter_demonstrations(perturb=0.4)
    assert demos.successes == demos.episodes
    # Every cloned action is the oracle's from the state shown, even after detours ...
    assert all(action == ("inc" if value < target else "dec") for target, value, _, action in pairs)
    # ... and the histories hold random actions that were played but not cloned.
    assert any("dec" in history for _, _, history, _ in pairs)
    with pytest.raises(ValueError, match="perturb must be in"):
        _counter_demonstrations(perturb=1.0, episodes=1)


@pytest.mark.slow
def test_user_registered_env_trains_through_the_cli(tmp_path):
    run_dir = tmp_path / "counter"
    env = {**os.environ, "PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    overrides = [o for o in tiny_overrides(run_dir, "trainer.iterations=1") if not o.startswith("env.kwargs")]
    command = [sys.executable, "-m", "agent_rl.cli", "train", "--import", "user_env_example",
               "env.id=usertest/Counter-v0", "env.kwargs={max_target: 2, max_steps: 3}", *overrides]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1]
    assert load_config(run_dir / "config.yaml").env.imports == ["user_env_example"]
    # And it evaluates through the CLI.
    out = tmp_path / "eval.json"
    result = subprocess.run(
        [sys.executable, "-m", "agent_rl.cli", "eval", str(run_dir), "--episodes", "2", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(out.read_text())["env"] == "usertest/Counter-v0"


def test_cli_reports_bad_config_in_one_line(capsys):
    from agent_rl.cli import main

    assert main(["train", "trainer.iteratons=5"]) == 2
    assert "unknown config key 'trainer.iteratons' (did you mean 'trainer.iterations'?)" in capsys.readouterr().err


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.parametrize("algo", ["grpo", "gigpo"])
def test_short_run_with_vllm(tmp_path, algo):
    pytest.importorskip("vllm")
    run_dir = tmp_path / "vllm"
    summary = train(load_config(overrides=tiny_overrides(run_dir, "engine=vllm", f"algo={algo}")))
    assert summary["iterations"] == 2
    assert [r["iteration"] for r in read_metrics(run_dir)] == [0, 1, 2]


# ---- learning is real --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_policy_dir(tmp_path_factory) -> Path:
    """A 0.15M-parameter Qwen2 with the embedded tokenizer: the same code path as the embedded model,
    fast enough to learn within a test."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from training.policy import load_policy

    embedded, tokenizer = load_policy("embedded")
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=embedded.config.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=embedded.config.bos_token_id, eos_token_id=embedded.config.eos_token_id,
        pad_token_id=embedded.config.pad_token_id,
    )
    path = tmp_path_factory.mktemp("small_policy")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.slow
def test_learning_is_real_on_a_tiny_maze(tmp_path, small_policy_dir):
    # Three rooms (24 layouts, about half of them held out): move once or twice, then take the goal
    # item. SFT on random admissible actions teaches the format only; greedy decoding of that policy
    # rarely wins. GiGPO must learn the task, and on layouts it never trained on.
    run_dir = tmp_path / "learn"
    overrides = [
        "env.kwargs={n_rooms: 3, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 6}",
        "engine=hf", f"policy={small_policy_dir}", f"trainer.run_dir={run_dir}", "trainer.iterations=12",
        "trainer.eval_every=12", "trainer.eval_episodes=32", "trainer.eval_sampled=false", "trainer.target_success=null",
        "rollout.n_groups=4", "rollout.group_size=8", "rollout.max_turns=6", "rollout.history_turns=0",
        "rollout.max_new_tokens=8", "sft.mode=random", "sft.steps=300", "sft.episodes=32", "sft.batch_size=16", "sft.lr=3e-3",
        "optim.lr=1e-3", "algo=gigpo", "algo.kl_coef=0", "logging.console=false", "logging.tensorboard=false",
    ]
    train(load_config(overrides=overrides))
    records = read_metrics(run_dir)
    before, after = records[0]["eval/greedy_success"], records[-1]["eval/greedy_success"]
    assert records[-1]["iteration"] == 12
    assert after >= before + 0.5, (before, after)


def test_context_anchor_keys_follow_the_prompt_history():
    from training.trainer import anchor_keys

    # One trajectory revisits state s0 after different actions; a prompt with one history turn
    # tells the two visits apart, a prompt with none does not.
    batch = StepBatch.for_credit([0, 0, 0, 0], [0, 0, 0, 0], [0.0, 0.0, 0.0, 1.0])
    batch.anchor_state = ["s0", "s1", "s0", "s0"]
    batch.observation = ["o0", "o1", "o0", "o0"]
    batch.action = ["go north", "go south", "look", "take key"]
    one = load_config(overrides=["rollout.history_turns=1"]).rollout
    keys = anchor_keys(batch, "context", one)
    assert keys[2] != keys[3] and len(set(keys.tolist())) == 4
    none = load_config(overrides=["rollout.history_turns=0"]).rollout
    np.testing.assert_array_equal(anchor_keys(batch, "context", none), anchor_keys(batch, "state", none))
