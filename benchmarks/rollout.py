"""Rollout speed of the two generation engines on the same model and prompts, in one process.

For each engine (hf, then vllm when importable) it measures
- generation throughput: one batched ``generate`` (sampled at temperature 1, best of a few repeats)
  on two request shapes built from real Maze rollout prompts (task, observation, admissible actions):
  - ``group``: what the rollout collector sends at turn 0, ``groups`` seeds x ``group size`` copies
    (a GRPO group starts from one state);
  - ``distinct``: ``groups x group size`` different seeds, no two prompts alike.
  vllm's prefix cache is emptied before every timed call: otherwise a repeat would find the previous
  repeat's prompts cached, which no rollout does;
- rollout throughput: ``collect_rollouts`` on Maze with the same seeds (turns/s and tokens/s);
- weight-sync latency: ``update_weights`` after a perturbation (free for hf: it samples from the
  training module itself).
The hf engine runs with torch's default thread count and with one thread; the ratios use the faster of
the two. vllm runs with the default thread count. Run it with the Python that has vllm (see the README):

    python benchmarks/rollout.py                # -> benchmarks/results/rollout.json
    python benchmarks/rollout.py --groups 4 --max-new-tokens 16
    # a real instruct model, with its parser and the SmolLM2 recipe's reply length
    python benchmarks/rollout.py --policy smollm2-135m-instruct --parser admissible --groups 4 \
        --max-new-tokens 12 --repeats 3 --rollout-repeats 2   # -> results/rollout_smollm2-135m-instruct.json
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from agent_rl import envs  # noqa: F401  (registers the bundled environments)
from agent_rl.benchmarks.common import best_of, write_result
from agent_rl.config import ACTION_PARSERS, RolloutConfig
from agent_rl.training.infra.resolution import vllm_available
from agent_rl.training.loop.rollout import collect_rollouts
from agent_rl.training.models.policy import load_policy
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import SamplingParams, make_engine
from agent_rl.training.serving.envpool import RegisteredEnv

ENV_ID = "agent_rl/Maze-v0"
GROUP_SIZE = 8


def maze_prompts(tokenizer, seeds: list[int], config: RolloutConfig) -> list[list[int]]:
    """The turn-0 prompt of a Maze episode per seed."""
    env = gym.make(ENV_ID)
    prompt_format = PromptFormat.from_rollout(config)
    prompts = []
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        prompts.append(
            prompt_format.prompt_ids(tokenizer, info["task"], [], observation, info.get("admissible_actions"))
        )
    return prompts


def measure_generate(engine, prompts: list[list[int]], sampling: SamplingParams, repeats: int) -> dict:
    llm = getattr(engine, "llm", None)
    empty_cache = llm.reset_prefix_cache if llm is not None else None
    engine.generate(prompts, 1, sampling)  # warm-up (compilation, allocator)
    tokens = []

    def generate_once():
        tokens.append(sum(len(c.token_ids) for group in engine.generate(prompts, 1, sampling) for c in group))

    seconds = best_of(generate_once, repeats, setup=empty_cache)
    return {"seconds": seconds, "tokens": int(np.median(tokens)), "tokens_per_s": float(np.median(tokens)) / seconds}


def measure_engine(
    engine,
    model,
    tokenizer,
    workloads: dict[str, list[list[int]]],
    config: RolloutConfig,
    repeats: int,
    rollout_repeats: int,
) -> dict:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=config.max_new_tokens)
    generate = {name: measure_generate(engine, prompts, sampling, repeats) for name, prompts in workloads.items()}
    stats = max(
        (
            collect_rollouts(RegisteredEnv(ENV_ID), engine, tokenizer, config, np.random.default_rng(0))[1]
            for _ in range(rollout_repeats)
        ),
        key=lambda s: s["turns_per_s"],
    )
    perturbed = {name: p.detach() + 1e-3 * torch.randn_like(p) for name, p in model.state_dict().items()}
    original = {name: p.detach().clone() for name, p in model.state_dict().items()}
    sync = []
    for state in (perturbed, original, perturbed, original):
        model.load_state_dict(state)
        start = time.perf_counter()
        engine.update_weights(model)
        sync.append(time.perf_counter() - start)
    return {
        "generate": generate,
        "rollout_turns_per_s": stats["turns_per_s"],
        "rollout_tokens_per_s": stats["tokens_per_s"],
        "rollout_turns": int(stats["trajectories"] * stats["mean_length"]),
        "weight_sync_seconds": float(np.median(sync)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=8, help="rollout groups (x group size 8)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4, help="rollout max turns")
    parser.add_argument(
        "--repeats", type=int, default=6, help="timed generate calls per workload (hf speeds up over the first few)"
    )
    parser.add_argument(
        "--rollout-repeats", type=int, default=3, help="rollout collections per engine (the best counts)"
    )
    parser.add_argument("--policy", default="embedded", help="policy name or path (training.models.policy.load_policy)")
    parser.add_argument("--parser", default="first_line", choices=ACTION_PARSERS, help="rollout.parser of the prompts")
    parser.add_argument("--out", type=Path, default=None, help="results folder (default benchmarks/results)")
    args = parser.parse_args()

    console = Console()
    model, tokenizer = load_policy(args.policy)
    config = RolloutConfig(
        n_groups=args.groups,
        group_size=GROUP_SIZE,
        max_turns=args.turns,
        history_turns=2,
        max_new_tokens=args.max_new_tokens,
        max_prompt_tokens=1024,
        parser=args.parser,
    )
    n_prompts = args.groups * GROUP_SIZE
    workloads = {
        "group": [p for p in maze_prompts(tokenizer, list(range(args.groups)), config) for _ in range(GROUP_SIZE)],
        "distinct": maze_prompts(tokenizer, list(range(n_prompts)), config),
    }
    default_threads = torch.get_num_threads()
    runs = [("hf", default_threads), ("hf", 1)] + ([("vllm", default_threads)] if vllm_available() else [])
    results: dict[str, dict] = {}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("engines", total=len(runs))
        for kind, threads in runs:
            name = kind if kind == "vllm" else f"hf_{threads}_threads"
            progress.update(task, description=name)
            torch.set_num_threads(threads)
            start = time.perf_counter()
            engine = make_engine(kind, model, tokenizer, seed=0)
            init_seconds = time.perf_counter() - start
            results[name] = {
                "engine": kind,
                "torch_threads": torch.get_num_threads(),
                "init_seconds": init_seconds,
                **measure_engine(engine, model, tokenizer, workloads, config, args.repeats, args.rollout_repeats),
            }
            engine.close()
            progress.advance(task)
    hf_runs = [r for r in results.values() if r["engine"] == "hf"]
    payload = {
        "model": {"name": args.policy, "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32"},
        "workload": {
            "env": ENV_ID,
            "prompts": n_prompts,
            "group_size": GROUP_SIZE,
            "mean_prompt_tokens": {k: float(np.mean([len(p) for p in v])) for k, v in workloads.items()},
            "max_new_tokens": args.max_new_tokens,
            "rollout_groups": args.groups,
            "rollout_max_turns": args.turns,
            "parser": args.parser,
            "temperature": 1.0,
            "generate": "best of %d calls, vllm's prefix cache emptied before each" % args.repeats,
            "rollout": f"best of {args.rollout_repeats} collections",
        },
        "engines": results,
        "default_torch_threads": default_threads,
    }
    if "vllm" in results:
        vllm = results["vllm"]
        payload["vllm_over_hf"] = {
            **{
                f"generate_{name}_tokens_per_s": vllm["generate"][name]["tokens_per_s"]
                / max(r["generate"][name]["tokens_per_s"] for r in hf_runs)
                for name in workloads
            },
            "rollout_turns_per_s": vllm["rollout_turns_per_s"] / max(r["rollout_turns_per_s"] for r in hf_runs),
            "target": 4.0,
        }
    stem = "rollout" if args.policy == "embedded" else f"rollout_{Path(args.policy).stem}"
    path = write_result(stem, payload, args.out)
    table = Table(title=f"rollout engines ({ENV_ID}, {n_prompts} prompts x {args.max_new_tokens} tokens)")
    for column in (
        "engine",
        "threads",
        "gen tok/s (group)",
        "gen tok/s (distinct)",
        "rollout turns/s",
        "rollout tok/s",
        "sync s",
        "init s",
    ):
        table.add_column(column)
    for name, r in results.items():
        table.add_row(
            name,
            str(r["torch_threads"]),
            *(f"{r['generate'][w]['tokens_per_s']:.0f}" for w in workloads),
            f"{r['rollout_turns_per_s']:.2f}",
            f"{r['rollout_tokens_per_s']:.0f}",
            f"{r['weight_sync_seconds']:.3f}",
            f"{r['init_seconds']:.1f}",
        )
    console.print(table)
    if "vllm_over_hf" in payload:
        ratios = payload["vllm_over_hf"]
        console.print(
            f"vllm / best hf: {ratios['generate_group_tokens_per_s']:.2f}x generate (group prompts), "
            f"{ratios['generate_distinct_tokens_per_s']:.2f}x (distinct prompts), "
            f"{ratios['rollout_turns_per_s']:.2f}x rollout turns/s (target 4x)"
        )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
