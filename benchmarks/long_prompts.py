"""What a long shared prompt costs the hf engine, with what its rows share prefilled once and without.

A game whose prompt carries a rules text (TextArena FrozenLake by default) sends, at the first turn
of a GRPO batch, ``groups`` x ``group size`` prompts that all start with the same system prompt and
rules, each group's the same prompt. The hf engine prefills that prefix once and each distinct
prompt once and repeats their KV caches over the rows (``HFEngine(share_prefixes=True)``, the
default) or prefills every row whole (``share_prefixes=False``); both give the same completions.
For each it times one sampled ``generate`` of the batch (best of ``--repeats``) on the embedded
model, one torch thread, and records the prompts' length and the shared prefix's.

    python -m agent_rl.benchmarks.long_prompts                 # -> benchmarks/results/long_prompts.json
    python -m agent_rl.benchmarks.long_prompts --env agent_rl/Maze-v0 --name long_prompts_maze
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch

from agent_rl import envs  # noqa: F401  (registers the bundled environments)
from agent_rl.benchmarks.common import best_of, write_result
from agent_rl.config import RolloutConfig
from agent_rl.training.models.policy import load_policy
from agent_rl.training.models.prefix_sharing import shared_prefix_length
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import HFEngine, SamplingParams


def first_turn_prompts(env_id: str, tokenizer, seeds: list[int], group_size: int) -> list[list[int]]:
    """The turn-0 prompt of an episode per seed, each repeated ``group_size`` times (a GRPO group)."""
    env = gym.make(env_id)
    prompt_format = PromptFormat.from_rollout(RolloutConfig(history_turns=0))
    prompts = []
    for seed in seeds:
        observation, info = env.reset(seed=seed)
        prompt = prompt_format.prompt_ids(
            tokenizer, info.get("task", ""), [], observation, info.get("admissible_actions")
        )
        prompts += [prompt] * group_size
    env.close()
    return prompts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="textarena/FrozenLake-v0", help="a registered text environment")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--name", default="long_prompts", help="result file name under benchmarks/results")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    model, tokenizer = load_policy("embedded")
    prompts = first_turn_prompts(args.env, tokenizer, list(range(args.groups)), args.group_size)
    sampling = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    seconds, completions = {}, {}
    for share in (True, False):
        engine = HFEngine(model, tokenizer, seed=0, share_prefixes=share)
        key = "shared_once" if share else "every_row_whole"

        def generate(engine=engine, key=key):
            engine.calls = 0  # every repeat draws the same samples
            completions[key] = engine.generate(prompts, 1, sampling)

        seconds[key] = best_of(generate, args.repeats)
    tokens = [[c.token_ids for (c,) in completions[key]] for key in completions]
    lengths = np.array([len(p) for p in prompts])
    path = write_result(
        args.name,
        {
            "benchmark": "long_prompts",
            "env": args.env,
            "rows": len(prompts),
            "prompt_tokens_mean": float(lengths.mean()),
            "shared_prefix_tokens": shared_prefix_length(prompts),
            "max_new_tokens": args.max_new_tokens,
            "torch_threads": 1,
            "generate_seconds": seconds,
            "speedup": seconds["every_row_whole"] / seconds["shared_once"],
            "same_completions": tokens[0] == tokens[1],
        },
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
