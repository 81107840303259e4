"""What a fixed sequence of actions wins, and how closely a policy's held-out play follows one.

A policy that plays the same actions whatever it observes wins exactly the episodes its sequence
happens to win. For each ``--route`` (actions separated by ``|``) this replays the route in the
environment on every held-out seed of the given ``agent-rl eval --show N --json`` files, and counts,
per file, the distinct action sequences played, the episodes whose play follows the route (its
actions are a prefix of the route's: an episode may end before the route does), how many of those
the route wins, and the wins off every route. Without evaluation files, ``--episodes N
--eval-offset K`` replays the routes on the held-out seeds a run's evaluation plays
(``trainer.eval_episodes``, ``trainer.eval_offset``), so a run that kept no checkpoint can be compared
by its logged metrics: per route, what an evaluation of a policy that plays it would log as greedy
success, mean length and action entropy.

    python -m agent_rl.benchmarks.fixed_routes RUN/routes_seed0_last.json ... --env textarena/FrozenLake-v0 \\
      --route "[right]|[right]|[right]|[down]|[down]|[down]" --route "[down]|[down]|[down]|[right]|[right]|[right]" \\
      --out RUN/fixed_routes.json
    python -m agent_rl.benchmarks.fixed_routes --episodes 128 --eval-offset 128 --env textarena/FrozenLake-v0 \\
      --route "[down]|[down]|[down]|[right]|[right]|[right]" --out RESULTS/fixed_routes_held_out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym

from agent_rl.benchmarks.common import machine_info, write_json
from agent_rl.envs import make_text_env, play_through
from agent_rl.training.loop.evaluation import eval_seeds
from agent_rl.training.loop.rollout import action_entropy


def parse_route(text: str) -> tuple[str, ...]:
    """The actions of ``a|b|c``; an empty action is an error that names the route."""
    actions = tuple(action.strip() for action in text.split("|"))
    if not all(actions):
        raise ValueError(f"route {text!r} has an empty action: separate actions with '|'")
    return actions


def follows(played: Sequence[str] | None, route: Sequence[str]) -> bool:
    """Whether an episode's actions are the route's first ones (an episode whose environment failed,
    ``None``, or that played nothing follows no route)."""
    return bool(played) and len(played) <= len(route) and tuple(played) == tuple(route[: len(played)])


def play_route(env: gym.Env, route: Sequence[str], seed: int) -> tuple[list[str], bool]:
    """The actions of ``route`` played from the reset state of ``seed`` until the episode ends (or the
    route does), and whether the last of them won."""
    env.reset(seed=int(seed))
    return play_through(env, route)


def route_plays(env: gym.Env, route: Sequence[str], seeds: Sequence[int]) -> dict[int, tuple[list[str], bool]]:
    """:func:`play_route` on each of ``seeds``, by seed."""
    return {int(seed): play_route(env, route, seed) for seed in seeds}


def route_wins(plays: dict[int, tuple[list[str], bool]]) -> list[int]:
    """The seeds of ``plays`` (:func:`route_plays`) on which the route won."""
    return [seed for seed, (_, won) in plays.items() if won]


def route_evaluation(plays: dict[int, tuple[list[str], bool]]) -> dict[str, float]:
    """What an evaluation on the seeds of ``plays`` (:func:`route_plays`) logs for a policy that plays
    the route whatever it is shown: its success rate, mean episode length and the entropy in bits of
    its actions (``eval/greedy_*``)."""
    return {
        "success": sum(won for _, won in plays.values()) / len(plays),
        "length": sum(len(played) for played, _ in plays.values()) / len(plays),
        "action_entropy": action_entropy([action for played, _ in plays.values() for action in played]),
    }


def census(transcripts: Sequence[dict[str, Any]], routes: dict[str, Sequence[str]], wins: dict[str, set[int]]) -> dict:
    """How many distinct action sequences the episodes play; per route, the episodes that follow it and
    how many of those it wins; then the episodes that follow no route and how many the policy won there."""
    followed = [{name for name, route in routes.items() if follows(t["actions"], route)} for t in transcripts]
    on_route = {name: [t for t, names in zip(transcripts, followed) if name in names] for name in routes}
    off = [t for t, names in zip(transcripts, followed) if not names]
    return {
        "episodes": len(transcripts),
        "policy_wins": sum(bool(t["won"]) for t in transcripts),
        "distinct_plays": len({tuple(t["actions"] or ()) for t in transcripts}),
        "routes": {
            name: {"follows": len(followed), "route_wins_there": sum(t["seed"] in wins[name] for t in followed)}
            for name, followed in on_route.items()
        },
        "off_routes": {"episodes": len(off), "policy_wins": sum(bool(t["won"]) for t in off)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("evals", nargs="*", type=Path, help="agent-rl eval --show N --json files")
    parser.add_argument("--episodes", type=int, help="without evaluation files: this many held-out seeds")
    parser.add_argument("--eval-offset", type=int, default=0, help="where those seeds start (trainer.eval_offset)")
    parser.add_argument("--env", required=True, help="the environment id the evaluations played")
    parser.add_argument("--route", action="append", required=True, help="actions separated by '|' (repeatable)")
    parser.add_argument("--mode", default="greedy", choices=("greedy", "sampled"))
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    if bool(args.evals) == (args.episodes is not None):
        parser.error("give evaluation files or --episodes, not both")
    if args.episodes is not None and (args.episodes < 1 or args.eval_offset < 0):
        parser.error("--episodes must be at least 1 and --eval-offset at least 0")
    try:
        routes = {text: parse_route(text) for text in args.route}
        shown = {str(path): json.loads(path.read_text())[f"{args.mode}_transcripts"] for path in args.evals}
    except (ValueError, KeyError, OSError) as exc:
        print(f"fixed_routes: {exc!r} (evaluations need --show N, and --sampled for the sampled mode)", file=sys.stderr)
        return 2
    seeds = sorted({t["seed"] for transcripts in shown.values() for t in transcripts}) or eval_seeds(
        args.episodes, args.eval_offset
    )
    env = make_text_env(args.env)
    try:
        plays = {name: route_plays(env, route, seeds) for name, route in routes.items()}
    finally:
        env.close()
    wins = {name: set(route_wins(played)) for name, played in plays.items()}
    payload = {
        "machine": machine_info(),
        "env": args.env,
        "mode": args.mode,
        "seeds": len(seeds),
        "route_wins": {name: len(won_seeds) for name, won_seeds in wins.items()},
        "any_route_wins": len(set().union(*wins.values())),
        "route_evaluations": {name: route_evaluation(played) for name, played in plays.items()},
        "evaluations": {path: census(transcripts, routes, wins) for path, transcripts in shown.items()},
    }
    write_json(args.out, payload)
    print(json.dumps({k: payload[k] for k in ("route_wins", "any_route_wins")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
