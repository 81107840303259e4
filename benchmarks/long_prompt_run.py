"""What a long-prompt game costs to train: the random warm start and the RL iterations of TextArena
FrozenLake (its rules text and its board in every prompt) on the embedded model with the library
defaults, once with the bundled tokenizer and once with one that also covers the game
(``policy.tokenizer_envs``); ``covering-bf16`` is the covering arm with bf16 forward passes
(``policy.precision=bf16``: the warm start, the learner and the hf engine).

Each arm is one ``agent-rl train`` run with the ``frozenlake`` lift case's settings (a random-action
warm start, no history turn) at ``--groups`` groups of 8, ``--iterations`` RL iterations and a
32-episode greedy evaluation before them. From its ``metrics.jsonl`` the result records the warm
start's seconds (its evaluation left out), each iteration's rollout, update and total seconds and
the tokens the learner forwarded, and the first prompt's length in tokens; ``library_commit`` names
the code that ran (a worktree on ``PYTHONPATH`` runs an older commit's library, ``--arms bundled``
where it has no ``policy.tokenizer_envs``).

    python -m agent_rl.benchmarks.long_prompt_run                 # -> benchmarks/results/long_prompt_run.json
    python -m agent_rl.benchmarks.long_prompt_run --threads 2 --name long_prompt_run_2threads
    python -m agent_rl.benchmarks.long_prompt_run --threads 2 --arms covering,covering-bf16 --name long_prompt_run_bf16
    python -m agent_rl.benchmarks.long_prompt_run --threads 2 --arms covering --groups 16 --name long_prompt_16groups
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import gymnasium as gym

import agent_rl
from agent_rl import envs  # noqa: F401  (registers the bundled environments)
from agent_rl.benchmarks.common import write_result
from agent_rl.benchmarks.harness import thread_environment, threads_override, train_command
from agent_rl.benchmarks.lift import CASES
from agent_rl.config import RolloutConfig
from agent_rl.training.models.policy import load_tokenizer, policy_dir
from agent_rl.training.models.prompts import PromptFormat

FROZENLAKE_CASE = tuple(
    override
    for override in next(case for case in CASES if case.name == "frozenlake").overrides
    if not override.startswith(("env.id=", "policy.tokenizer_envs="))
)
"""The ``frozenlake`` lift case's settings besides its env id and tokenizer, which the arms set."""
GROUPS = 4
"""Groups an iteration (``--groups``): the 4 the lift case played when the committed results before
``long_prompt_run_nofloor`` were measured; the library's default is 16."""


ARMS = ("bundled", "covering", "covering-bf16")
"""The runs the benchmark can make: the default embedded model, its tokenizer also trained on the
game, and the latter with bf16 forward passes."""


def arm_overrides(arm: str, env_id: str) -> tuple[str, ...]:
    """The overrides of ``arm`` (one of ``ARMS``) on top of the case's settings."""
    covering = () if arm == "bundled" else (f"policy.tokenizer_envs=[{env_id}]",)
    return (*covering, "policy.precision=bf16") if arm == "covering-bf16" else covering


def first_prompt_tokens(env_id: str, arm: str) -> int:
    """Tokens of the first turn's prompt of seed 0 with the arm's tokenizer."""
    env_ids = None
    if arm != "bundled":
        # Imported here: an older commit's library (--arms bundled) has no policy.tokenizer_envs.
        from agent_rl.training.models.embedded import tokenizer_env_ids

        env_ids = tokenizer_env_ids([env_id])
    tokenizer = load_tokenizer(policy_dir("embedded", env_ids=env_ids))
    env = gym.make(env_id)
    observation, info = env.reset(seed=0)
    env.close()
    prompt_format = PromptFormat.from_rollout(RolloutConfig(history_turns=0))
    return len(
        prompt_format.prompt_ids(tokenizer, info.get("task", ""), [], observation, info.get("admissible_actions"))
    )


def run_costs(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The warm start's seconds and each RL iteration's, from a run's metrics records."""
    first, rest = records[0], records[1:]
    elapsed = [float(r["time/elapsed"]) - float(r.get("time/eval") or 0.0) for r in records]
    return {
        "warm_start_s": elapsed[0],
        "sft_steps": first.get("sft/steps_taken"),
        "format_accuracy": first.get("sft/format_accuracy"),
        "iterations": [
            {
                "rollout_s": r["time/rollout"],
                "update_s": r["time/update"],
                "total_s": elapsed[i + 1] - float(records[i]["time/elapsed"]),
                "rows": r.get("rollout/rows"),
                "forwarded_tokens": r.get("update/forwarded_tokens"),
            }
            for i, r in enumerate(rest)
        ],
    }


def library_commit() -> str:
    """The commit of the ``agent_rl`` that this process imports, ``+`` when its tree has edits."""
    root = Path(agent_rl.__file__).resolve().parents[1]
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root, capture_output=True)
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="textarena/FrozenLake-v0", help="a registered text environment")
    parser.add_argument("--arms", default="bundled,covering", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of each run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--groups", type=int, default=GROUPS, help="rollout.n_groups of each run")
    parser.add_argument("--name", default="long_prompt_run", help="result file name under benchmarks/results")
    args = parser.parse_args(argv)
    arms = [arm.strip() for arm in args.arms.split(",")]
    unknown = sorted(set(arms) - set(ARMS))
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}: use {', '.join(ARMS)}")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="long_prompt_run-") as work:
        for arm in arms:
            run_dir = Path(work) / arm
            command = train_command(
                [
                    f"env.id={args.env}",
                    *FROZENLAKE_CASE,
                    f"rollout.n_groups={args.groups}",
                    *arm_overrides(arm, args.env),
                    threads_override(args.threads),
                    "engine=hf",
                    "trainer.target_success=null",
                    "trainer.eval_sampled=false",
                    "trainer.eval_episodes=32",
                    f"trainer.eval_every={args.iterations + 1}",
                    f"trainer.iterations={args.iterations}",
                    f"trainer.seed={args.seed}",
                    f"trainer.run_dir={run_dir}",
                    "logging.tensorboard=false",
                    "logging.console=false",
                ]
            )
            print(f"{arm}: {' '.join(command[3:])}", flush=True)
            subprocess.run(command, check=True, env={**os.environ, **thread_environment(args.threads)})
            records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
            results[arm] = {
                "overrides": list(arm_overrides(arm, args.env)),
                "prompt_tokens": first_prompt_tokens(args.env, arm),
                **run_costs(records),
            }
    path = write_result(
        args.name,
        {
            "benchmark": "long_prompt_run",
            "env": args.env,
            "library_commit": library_commit(),
            "torch_threads": args.threads,
            "seed": args.seed,
            "n_groups": args.groups,
            "arms": results,
        },
    )
    print(path.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
