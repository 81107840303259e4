"""What a fixed sequence of actions wins, and how closely a policy's held-out play follows one.

A policy that plays the same actions whatever it observes wins exactly the episodes its sequence
happens to win. For each ``--route`` (actions separated by ``|``) this replays the route in the
environment on every held-out seed of the given ``agent-rl eval --show N --json`` files, and counts,
per file, the distinct action sequences played, the episodes whose play follows the route (its
actions are a prefix of the route's: an episode may end before the route does), how many of those
the route wins, and the wins off every route.

    python -m agent_rl.benchmarks.fixed_routes RUN/routes_seed0_last.json ... --env textarena/FrozenLake-v0 \\
      --route "[right]|[right]|[right]|[down]|[down]|[down]" --route "[down]|[down]|[down]|[right]|[right]|[right]" \\
      --out RUN/fixed_routes.json
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
from agent_rl.envs import make_text_env, plays_to_a_win


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


def route_wins(env: gym.Env, route: Sequence[str], seeds: Sequence[int]) -> list[int]:
    """The seeds on which playing ``route`` from the reset state wins (the route stops where the episode ends)."""
    winning = []
    for seed in seeds:
        env.reset(seed=int(seed))
        if plays_to_a_win(env, route):
            winning.append(int(seed))
    return winning


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
    parser.add_argument("evals", nargs="+", type=Path, help="agent-rl eval --show N --json files")
    parser.add_argument("--env", required=True, help="the environment id the evaluations played")
    parser.add_argument("--route", action="append", required=True, help="actions separated by '|' (repeatable)")
    parser.add_argument("--mode", default="greedy", choices=("greedy", "sampled"))
    parser.add_argument("--out", type=Path, required=True, help="where to write the JSON result")
    args = parser.parse_args(argv)
    try:
        routes = {text: parse_route(text) for text in args.route}
        shown = {str(path): json.loads(path.read_text())[f"{args.mode}_transcripts"] for path in args.evals}
    except (ValueError, KeyError, OSError) as exc:
        print(f"fixed_routes: {exc!r} (evaluations need --show N, and --sampled for the sampled mode)", file=sys.stderr)
        return 2
    seeds = sorted({t["seed"] for transcripts in shown.values() for t in transcripts})
    env = make_text_env(args.env)
    try:
        wins = {name: set(route_wins(env, route, seeds)) for name, route in routes.items()}
    finally:
        env.close()
    payload = {
        "machine": machine_info(),
        "env": args.env,
        "mode": args.mode,
        "seeds": len(seeds),
        "route_wins": {name: len(won_seeds) for name, won_seeds in wins.items()},
        "any_route_wins": len(set().union(*wins.values())),
        "evaluations": {path: census(transcripts, routes, wins) for path, transcripts in shown.items()},
    }
    write_json(args.out, payload)
    print(json.dumps({k: payload[k] for k in ("route_wins", "any_route_wins")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
