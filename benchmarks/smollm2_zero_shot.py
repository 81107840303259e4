"""Zero-shot SmolLM2-135M-Instruct on the bundled environments: held-out success and invalid actions.

Each cell is an environment and an action parser (``rollout.parser``). Its held-out episodes
(seeds 2**31 + i, the trainer's evaluation seeds) are played greedily and sampled at temperature 1,
with the chat template and the parser's system prompt, at most ``--max-turns`` turns each.
Reported per cell and mode: success rate, invalid-action rate (turns whose reply the parser could
not read, or that the environment refused), mean return and episode length, plus a few greedy
replies to the first observations, so the numbers can be read against what the model wrote.

    python -m agent_rl.benchmarks.smollm2_zero_shot                    # -> benchmarks/results/smollm2_zero_shot.json
    python -m agent_rl.benchmarks.smollm2_zero_shot --quick --policy embedded --out /tmp/zs   # smoke test
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from rich.console import Console

from agent_rl.benchmarks.common import write_result
from agent_rl.config import load_config
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.evaluation import eval_seeds, evaluate
from agent_rl.training.loop.rollout import Episode, PlayStats, PolicyActor, sampling_params
from agent_rl.training.models.policy import load_policy
from agent_rl.training.models.prompts import PromptFormat
from agent_rl.training.serving.engines import engine_from_config
from agent_rl.training.serving.envpool import env_factory

SMALL_MAZE = "{n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 10}"
MAIN_JOB_MAZE = "{n_rooms: 4, n_locked_doors: 1, dead_ends: 1, extra_edges: 0, n_distractors: 0, max_steps: 20}"
ENVS = {
    "maze-small": ("agent_rl/Maze-v0", SMALL_MAZE),
    "maze-main-job": ("agent_rl/Maze-v0", MAIN_JOB_MAZE),
    "sokoban": ("agent_rl/Sokoban-v0", "{width: 6, height: 6, n_boxes: 1, reverse_steps: 20, max_steps: 20}"),
    "textworld-coin": ("agent_rl/TextWorld-v0", "{kind: coin_collector, level: 3, n_games: 8, max_steps: 20}"),
    "minicode": ("agent_rl/MiniCode-v0", "{level: 1, n_tests: 3, max_steps: 6}"),
}
# Every parser on the small maze (the rule's effect on the invalid-action rate); the recipe's parser elsewhere.
CELLS = [("maze-small", parser) for parser in ("first_line", "action_tag", "admissible")] + [
    (env, "admissible") for env in ("maze-main-job", "sokoban", "textworld-coin", "minicode")
]
REPORTED = ("success_rate", "invalid_action_rate", "mean_return", "mean_length")


def cell_config(env: str, parser: str, policy: str, engine: str, episodes: int, max_turns: int, max_new_tokens: int):
    env_id, kwargs = ENVS[env]
    overrides = [
        f"env.id={env_id}",
        f"env.kwargs={kwargs}",
        f"policy={policy}",
        f"engine={engine}",
        f"rollout.parser={parser}",
        f"rollout.max_turns={max_turns}",
        f"rollout.max_new_tokens={max_new_tokens}",
        "rollout.history_turns=1",
        "rollout.max_admissible_actions=12",
        "rollout.max_prompt_tokens=768",
        f"trainer.eval_episodes={episodes}",
    ]
    config = load_config(None, overrides)
    make_env = env_factory(config)
    return resolve(config, make_env), make_env


def first_replies(engine, tokenizer, make_env, config, n: int) -> list[dict]:
    """The greedy reply to the first observation of the first ``n`` held-out episodes, and the action
    the policy's actor (the one rollouts and evaluation use) reads in it."""
    episodes = []
    for slot, seed in enumerate(eval_seeds(n)):
        env = make_env()
        observation, info = env.reset(seed=seed)
        env.close()
        episodes.append(Episode(slot, seed, slot, task=str(info.get("task", "")), observation=observation, info=info))
    actor = PolicyActor(
        engine,
        tokenizer,
        PromptFormat.from_rollout(config.rollout),
        sampling_params(config.rollout, greedy=True),
        PlayStats(),
    )
    return [
        {
            "observation": e.observation,
            "admissible": e.admissible_actions,
            "action": move.action,
            "named": move.parsed,
            "reply": tokenizer.decode(move.response_ids, skip_special_tokens=True),
        }
        for e, move in zip(episodes, actor.act(episodes))
    ]


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", default="smollm2-135m-instruct", help="policy to evaluate (policy=...)")
    parser.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"))
    parser.add_argument("--episodes", type=int, default=32, help="held-out episodes per cell and mode")
    parser.add_argument("--max-turns", type=int, default=10, help="turn cap per episode")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="reply length cap")
    parser.add_argument("--quick", action="store_true", help="the small maze only, 2 episodes of 2 turns")
    parser.add_argument("--out", type=Path, help="results directory (default benchmarks/results)")
    args = parser.parse_args(argv)
    cells = [c for c in CELLS if c[0] == "maze-small"] if args.quick else CELLS
    episodes, max_turns = (2, 2) if args.quick else (args.episodes, args.max_turns)
    console = Console()

    first, _ = cell_config(*cells[0], args.policy, args.engine, episodes, max_turns, args.max_new_tokens)
    model, tokenizer = load_policy(first.policy.name_or_path)
    engine = engine_from_config(first, model, tokenizer)
    result: dict = {
        "policy": args.policy,
        "engine": first.engine.kind,
        "episodes": episodes,
        "max_turns": max_turns,
        "max_new_tokens": args.max_new_tokens,
        "cells": [],
    }
    try:
        for env, action_parser in cells:
            config, make_env = cell_config(
                env, action_parser, args.policy, args.engine, episodes, max_turns, args.max_new_tokens
            )
            cell: dict = {"env": env, "env_id": config.env.id, "env_kwargs": config.env.kwargs, "parser": action_parser}
            start = time.perf_counter()
            for mode in ("greedy", "sampled"):
                stats = evaluate(
                    make_env, engine, tokenizer, eval_seeds(episodes), greedy=mode == "greedy", config=config.rollout
                )
                cell[mode] = {key: stats[key] for key in REPORTED}
            cell["first_greedy_replies"] = first_replies(engine, tokenizer, make_env, config, min(3, episodes))
            cell["seconds"] = time.perf_counter() - start
            result["cells"].append(cell)
            console.print(
                f"{env} / {action_parser}: greedy {cell['greedy']}, sampled {cell['sampled']} ({cell['seconds']:.0f} s)"
            )
    finally:
        engine.close()
    path = write_result("smollm2_zero_shot", result, args.out)
    console.print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
