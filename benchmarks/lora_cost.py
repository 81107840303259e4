"""What LoRA adapters cost and save against full fine-tuning, on one learner batch of a real policy.

Each arm (full fine-tuning, then LoRA on every linear layer at each ``--ranks``) runs in a process of
its own, so its peak memory is its own. On one fixed batch shaped like the ``smollm2-maze`` recipe's
(turn-0 Maze prompts of that recipe's format, ``--groups`` seeds x 4 copies, each copy replying with a
different admissible action), each arm records
- trained parameters, and the bytes their gradients and AdamW state take;
- the learner: seconds per ``Learner.optimize`` call (two AdamW steps, ``MEASURED_WITH``; best of ``--updates``
  after a warm-up) and forwarded tokens per second;
- the engine sync: seconds to build and write the weights the engine reloads (LoRA merges its
  adapters into them first: ``agent_rl.training.models.policy.serving_state_dict``);
- the checkpoint: bytes of the model directory (LoRA: the adapter alone) and of the optimizer state;
- the process's peak resident memory.

    python -m agent_rl.benchmarks.lora_cost            # SmolLM2-135M-Instruct -> benchmarks/results/lora_cost.json
    python -m agent_rl.benchmarks.lora_cost --quick    # the embedded policy, a small batch (seconds)
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agent_rl import envs  # noqa: F401  (registers the bundled environments)
from agent_rl.benchmarks.common import write_result
from agent_rl.config import load_config
from agent_rl.training.infra import checkpoint
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.learner import Learner
from agent_rl.training.models.policy import add_lora, load_policy
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import write_untied_checkpoint

RECIPE = "smollm2-maze"
MEASURED_WITH = (
    "policy.precision=fp32",
    "optim.epochs=1",
    "optim.minibatches=2",
    "optim.minibatch_size=0",
    "optim.warmup_steps=0",
)
"""The recipe's update as the committed result measured it: float32, two AdamW steps per batch."""
COPIES = 4  # trajectories per group: the recipe's group size


def recipe_batch(tokenizer, config, groups: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Turn-0 prompts of ``groups`` Maze seeds, ``COPIES`` rows each, replying with different
    admissible actions (each reply ends with EOS, as generated replies do)."""
    env = gym.make(config.env.id, **config.env.kwargs)
    prompt_format = PromptFormat.from_rollout(config.rollout)
    prompts, responses = [], []
    for seed in range(groups):
        observation, info = env.reset(seed=seed)
        actions = info["admissible_actions"]
        prompt = prompt_format.prompt_ids(tokenizer, info["task"], [], observation, actions)
        for copy in range(COPIES):
            reply = tokenizer(actions[copy % len(actions)], add_special_tokens=False)["input_ids"] + [
                tokenizer.eos_token_id
            ]
            prompts.append(np.asarray(prompt, dtype=np.int64))
            responses.append(np.asarray(reply, dtype=np.int64))
    return prompts, responses


def directory_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def measure_arm(policy: str, rank: int, groups: int, updates: int) -> dict[str, Any]:
    """One arm in this process: ``rank`` 0 is full fine-tuning."""
    config = resolve(load_config(RECIPE, [*MEASURED_WITH, f"policy={policy}", "engine=hf", f"policy.lora_rank={rank}"]))
    torch.manual_seed(0)
    model, tokenizer = load_policy(policy)
    if rank:
        model = add_lora(
            model, rank=rank, alpha=config.policy.lora_alpha, target_modules=config.policy.lora_target_modules
        )
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=config.optim.lr)
    learner = Learner(model, optimizer, config, np.random.default_rng(0))
    prompts, responses = recipe_batch(tokenizer, config, groups)
    old_logprobs = [np.zeros(len(r), dtype=np.float32) for r in responses]  # ratios are irrelevant to the cost
    advantages = np.random.default_rng(0).standard_normal(len(prompts))
    seconds, tokens = [], 0.0
    with Progress(transient=True) as progress:
        for update in range(updates + 1):  # the first one warms up (allocator, kernels)
            start = time.perf_counter()
            metrics = learner.optimize(prompts, responses, old_logprobs, advantages, progress)
            if update:
                seconds.append(time.perf_counter() - start)
            tokens = metrics["update/forwarded_tokens"]
    with tempfile.TemporaryDirectory() as directory:
        start = time.perf_counter()
        write_untied_checkpoint(model, directory)
        sync_seconds = time.perf_counter() - start
        saved = checkpoint.save_checkpoint(
            directory, 1, model=model, tokenizer=tokenizer, optimizer=optimizer, config={}, trainer_state={}
        )
        model_bytes, optimizer_bytes = (
            directory_bytes(saved / "model"),
            (saved / "optimizer.safetensors").stat().st_size,
        )
    update_seconds = min(seconds)
    return {
        "lora_rank": rank,
        "parameters": sum(p.numel() for p in model.parameters()),
        "trained_parameters": sum(p.numel() for p in trained),
        "gradient_and_adamw_bytes": 3 * sum(p.numel() * p.element_size() for p in trained),
        "update_seconds": update_seconds,
        "optimizer_steps_per_update": metrics["update/optimizer_steps"],
        "forwarded_tokens_per_update": tokens,
        "forwarded_tokens_per_s": tokens / update_seconds,
        "engine_sync_write_seconds": sync_seconds,
        "checkpoint_model_bytes": model_bytes,
        "checkpoint_optimizer_bytes": optimizer_bytes,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="smollm2-135m-instruct")
    parser.add_argument(
        "--ranks", type=int, nargs="+", default=[8, 32], help="LoRA ranks (full fine-tuning always runs)"
    )
    parser.add_argument("--groups", type=int, default=16, help="Maze seeds in the batch (x 4 rows)")
    parser.add_argument("--updates", type=int, default=3, help="timed learner updates per arm")
    parser.add_argument("--quick", action="store_true", help="the embedded policy, 2 seeds, 1 update")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    parser.add_argument("--arm", type=int, default=None, help=argparse.SUPPRESS)  # internal: run one arm, print JSON
    args = parser.parse_args(argv)
    if args.quick:
        args.policy, args.groups, args.updates = "embedded", 2, 1
    if args.arm is not None:
        print(json.dumps(measure_arm(args.policy, args.arm, args.groups, args.updates)))
        return Path()

    console = Console()
    arms: list[dict[str, Any]] = []
    for rank in [0, *args.ranks]:
        name = "full fine-tuning" if rank == 0 else f"LoRA rank {rank}"
        with console.status(f"{name}: {args.updates} learner updates on {args.groups * COPIES} rows"):
            command = [
                sys.executable,
                "-m",
                "agent_rl.benchmarks.lora_cost",
                "--arm",
                str(rank),
                "--policy",
                args.policy,
                "--groups",
                str(args.groups),
                "--updates",
                str(args.updates),
            ]
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
        arms.append(json.loads(done.stdout.strip().splitlines()[-1]))
    full, policy_config = arms[0], load_config(RECIPE).policy
    for arm in arms:
        arm["relative_to_full"] = {
            key: arm[key] / full[key]
            for key in (
                "trained_parameters",
                "gradient_and_adamw_bytes",
                "update_seconds",
                "engine_sync_write_seconds",
                "checkpoint_model_bytes",
                "peak_rss_bytes",
            )
        }
    payload = {
        "policy": args.policy,
        "batch": {
            "recipe": RECIPE,
            "rows": args.groups * COPIES,
            "groups": args.groups,
            "copies": COPIES,
            "timing": f"best of {args.updates} Learner.optimize calls after one warm-up",
        },
        "lora": {"alpha": policy_config.lora_alpha, "target_modules": policy_config.lora_target_modules},
        "arms": arms,
    }
    path = write_result("lora_cost" if not args.quick else "lora_cost_quick", payload, args.out)
    table = Table(title=f"LoRA vs full fine-tuning ({args.policy}, {args.groups * COPIES} rows)")
    for column in (
        "arm",
        "trained params",
        "grad+AdamW MB",
        "update s",
        "fwd tok/s",
        "sync s",
        "ckpt MB",
        "peak RSS GB",
    ):
        table.add_column(column)
    for arm in arms:
        table.add_row(
            "full" if arm["lora_rank"] == 0 else f"r={arm['lora_rank']}",
            f"{arm['trained_parameters'] / 1e6:.2f}M",
            f"{arm['gradient_and_adamw_bytes'] / 2**20:.0f}",
            f"{arm['update_seconds']:.2f}",
            f"{arm['forwarded_tokens_per_s']:.0f}",
            f"{arm['engine_sync_write_seconds']:.2f}",
            f"{(arm['checkpoint_model_bytes'] + arm['checkpoint_optimizer_bytes']) / 2**20:.1f}",
            f"{arm['peak_rss_bytes'] / 2**30:.2f}",
        )
    console.print(table)
    console.print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
