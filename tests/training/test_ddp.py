"""Data-parallel learners: 2 processes under torchrun (gloo) give the single-process gradient."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ddp_worker import fixed_minibatch, gradients  # beside this file, on pytest's path
from safetensors.torch import load_file

from agent_rl.training.models.policy import load_policy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOSSES = ("grpo", "dapo", "drgrpo")


@pytest.fixture(scope="module")
def two_process_gradients(tmp_path_factory) -> Path:
    """One 2-process launch computes every loss's summed gradients (a launch costs more than a loss)."""
    out = tmp_path_factory.mktemp("ddp_gradients")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(_free_port()),
        str(Path(__file__).parent / "ddp_worker.py"),
        str(out),
        *LOSSES,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.slow
def test_two_process_gradient_equals_single_process_gradient(two_process_gradients, loss):
    distributed = load_file(two_process_gradients / f"{loss}.safetensors")

    torch.manual_seed(0)
    model, _ = load_policy("embedded")
    gradients(model, *fixed_minibatch(model.config.vocab_size), loss)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(distributed[name], parameter.grad, rtol=1e-5, atol=1e-7)


def _train_cli(args: list[str], nproc: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_PORT": str(_free_port())}
    command = [sys.executable, "-m", "agent_rl.cli", "train", "--nproc", str(nproc), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from agent_rl.training.infra import checkpoint

    return load_file(checkpoint.find_checkpoint(run_dir, "last").model_dir / "model.safetensors")


@pytest.mark.slow
@pytest.mark.parametrize(
    "mode",
    # With the tiny clone every chosen episode wins; a KL term gives the rows of flat groups a gradient.
    [(), ("rollout.action_mode=admissible", "rollout.choice_logprobs=choice", "algo.kl_coef=0.01")],
    ids=["generate", "choice"],
)
def test_two_learners_train_like_one_and_resume(tmp_path, mode):
    """Rank 0 collects the same rollouts as a single process; the summed gradients are the same, so
    after 2 iterations the weights agree; a 2-process run started and continued with --resume auto
    ends the same. Learning choices among listed actions, the offered ids reach every rank."""
    from test_trainer import tiny_overrides

    from agent_rl.training.infra.logger import read_metrics

    # Both evaluate after every iteration: an evaluation draws engine calls, which seed later sampling.
    single, double = tmp_path / "single", tmp_path / "double"
    settings = ("algo=gigpo", "trainer.eval_every=1", *mode)
    assert _train_cli(tiny_overrides(single, *settings), nproc=1).returncode == 0
    # A requeued job: the same command with --resume auto starts the run, then continues it.
    first = _train_cli(["--resume", "auto", *tiny_overrides(double, *settings, "trainer.iterations=1")], nproc=2)
    assert first.returncode == 0, first.stderr[-3000:]
    resumed = _train_cli(["--resume", "auto", *tiny_overrides(double, *settings)], nproc=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert all(record["update/active_rows"] > 0 for record in read_metrics(single)[1:])  # both iterations learned
    expected, got = _weights(single), _weights(double)
    for name, tensor in expected.items():
        # Summation order differs between ranks; AdamW steps are lr = 1e-4 in size, far above this.
        torch.testing.assert_close(got[name], tensor, rtol=1e-4, atol=1e-5, msg=name)
    assert [record["iteration"] for record in read_metrics(double)] == [0, 1, 2]
