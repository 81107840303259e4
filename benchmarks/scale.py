"""Scale-out costs on this machine: Ray environment actors and data-parallel learners.

1. Rollout throughput (turns/s) with environments in-process vs on 1 and 2 Ray actors. The policy is a
   scripted engine that costs nothing, so the numbers isolate environment stepping plus pool
   overhead; Maze (fast steps: overhead dominates) and TextWorld (slow steps: actors run in parallel).
2. Learner update time for one fixed minibatch (forward + backward of the embedded policy, then the
   gradient all-reduce) in 1 process vs 2 processes under torchrun (gloo).

    python -m agent_rl.benchmarks.scale            # -> benchmarks/results/scale.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from agent_rl.benchmarks.common import write_result

ENVS = {
    "agent_rl/Maze-v0": {"n_rooms": 6, "n_locked_doors": 1, "max_steps": 20},
    "agent_rl/TextWorld-v0": {"kind": "coin_collector", "level": 3, "n_games": 4, "max_steps": 20},
}


class FirstAdmissibleEngine:
    """Zero-cost policy: always answers "look" (valid everywhere it matters, never ends an episode early)."""

    def __init__(self, tokenizer):
        self.token_ids = tokenizer.encode("look", add_special_tokens=False) + [tokenizer.eos_token_id]

    def generate(self, prompts_token_ids, n, sampling):
        from agent_rl.training.serving.engines import Completion

        return [[Completion(list(self.token_ids), [0.0] * len(self.token_ids), "stop")] * n for _ in prompts_token_ids]


def rollout_throughput(repeats: int) -> dict:
    import ray

    from agent_rl.config import RolloutConfig
    from agent_rl.training.loop.rollout import collect_rollouts
    from agent_rl.training.models.policy import load_policy
    from agent_rl.training.serving.envpool import RayEnvPool, RegisteredEnv

    _, tokenizer = load_policy("embedded")
    engine = FirstAdmissibleEngine(tokenizer)
    config = RolloutConfig(n_groups=8, group_size=4, max_turns=20, history_turns=0, max_new_tokens=4)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    results = {}
    try:
        for env_id, kwargs in ENVS.items():
            row = {}
            make_env = RegisteredEnv(env_id, kwargs)
            for name, actors in (("local", 0), ("ray_1_actor", 1), ("ray_2_actors", 2)):
                # In-process: a fresh local pool per collection, as rollouts without Ray actors once built.
                pool = RayEnvPool(make_env, 32, n_actors=actors) if actors else None
                envs = pool or make_env
                collect_rollouts(envs, engine, tokenizer, config, np.random.default_rng(0))  # warm-up
                best = None
                for repeat in range(repeats):
                    start = time.perf_counter()
                    _, stats = collect_rollouts(envs, engine, tokenizer, config, np.random.default_rng(repeat + 1))
                    seconds = time.perf_counter() - start
                    turns = stats["mean_length"] * stats["trajectories"]
                    best = max(best or 0.0, turns / seconds)
                if pool is not None:
                    pool.close()
                row[name] = {"turns_per_s": best, "ms_per_turn": 1e3 / best}
            row["ray_overhead_ms_per_turn_1_actor"] = row["ray_1_actor"]["ms_per_turn"] - row["local"]["ms_per_turn"]
            row["speedup_2_actors_over_local"] = row["ray_2_actors"]["turns_per_s"] / row["local"]["turns_per_s"]
            results[env_id] = row
    finally:
        ray.shutdown()
    return results


def ddp_worker(out_path: str, repeats: int) -> None:
    """One learner process: time accumulate_policy_gradient + all-reduce on a fixed minibatch."""
    import torch

    from agent_rl.core.losses import LOSS_PRESETS, LossSpec
    from agent_rl.training.infra.distributed import all_reduce_gradients, init_distributed
    from agent_rl.training.loop.learner import accumulate_policy_gradient
    from agent_rl.training.models.policy import load_policy

    torch.set_num_threads(1)
    model, _ = load_policy("embedded")
    ctx = init_distributed(torch.device("cpu"))
    rng = np.random.default_rng(0)
    rows = 64
    prompts = [rng.integers(5, model.config.vocab_size, 160) for _ in range(rows)]
    responses = [rng.integers(5, model.config.vocab_size, 6) for _ in range(rows)]
    old = [np.full(6, -3.0, dtype=np.float32) for _ in range(rows)]
    advantages = rng.normal(size=rows)
    params = list(model.parameters())
    timings = {"backward_s": [], "all_reduce_s": []}
    for _ in range(repeats + 1):  # the first round warms up
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        accumulate_policy_gradient(
            model,
            prompts,
            responses,
            old,
            advantages,
            loss=LossSpec(**{**LOSS_PRESETS["grpo"], "kl_coef": 0.0}),
            temperature=1.0,
            micro_batch_size=16,
            shard=(ctx.rank, ctx.world_size),
        )
        middle = time.perf_counter()
        all_reduce_gradients(params, ctx)
        timings["backward_s"].append(middle - start)
        timings["all_reduce_s"].append(time.perf_counter() - middle)
    if ctx.is_main:
        Path(out_path).write_text(json.dumps({k: min(v[1:]) for k, v in timings.items()}))
    if ctx.enabled:
        torch.distributed.destroy_process_group()


def ddp_overhead(repeats: int) -> dict:
    results = {}
    for nproc in (1, 2):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nproc_per_node",
                str(nproc),
                "--master_addr",
                "127.0.0.1",
                "--master_port",
                str(port),
                "-m",
                "agent_rl.benchmarks.scale",
                "--ddp-worker",
                out.name,
                "--repeats",
                str(repeats),
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
            subprocess.run(command, check=True, env=env, capture_output=True)
            timing = json.loads(Path(out.name).read_text())
        results[f"{nproc}_process"] = {**timing, "update_s": timing["backward_s"] + timing["all_reduce_s"]}
    results["speedup_2_over_1"] = results["1_process"]["update_s"] / results["2_process"]["update_s"]
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    parser.add_argument("--ddp-worker", metavar="OUT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ddp_worker:
        ddp_worker(args.ddp_worker, args.repeats)
        return
    from rich.console import Console

    console = Console()
    with console.status("rollout throughput: local vs Ray actors"):
        rollouts = rollout_throughput(args.repeats)
    console.print_json(json.dumps(rollouts))
    with console.status("learner update: 1 vs 2 processes"):
        ddp = ddp_overhead(args.repeats)
    console.print_json(json.dumps(ddp))
    path = write_result(
        "scale",
        {
            "rollout": {"n_envs": 32, "max_turns": 20, "policy": "scripted, zero cost", "results": rollouts},
            "ddp": {
                "minibatch_rows": 64,
                "prompt_tokens": 160,
                "response_tokens": 6,
                "torch_threads_per_process": 1,
                "backend": "gloo",
                "results": ddp,
            },
        },
        args.out,
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
