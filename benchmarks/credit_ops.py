"""Time the credit-assignment core against a straightforward per-row dict-and-loop version.

Synthetic batches look like agent rollouts: groups of 8 trajectories of 5-15 turns, sparse terminal
rewards, and anchor states drawn from a small per-group set so that states recur (revisits).

    python -m agent_rl.benchmarks.credit_ops            # 10k, 100k, 1M rows -> benchmarks/results/credit_ops.json

``graph_credit_s`` times graph credit (:func:`agent_rl.core.advantages.graph_progress` and
``graph_advantages``: step credit only, no episode term) on the same batches.
"""

from __future__ import annotations

import argparse
import math
from collections import defaultdict
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from agent_rl.benchmarks.common import best_of, write_result
from agent_rl.core.advantages import (
    discounted_returns,
    episode_advantages,
    graph_advantages,
    graph_progress,
    step_advantages,
)

GAMMA = 0.95
STEP_WEIGHT = 1.0
EPS = 1e-6
GROUP_SIZE = 8
STATES_PER_GROUP = 24
LOOP_REPEATS = 3


def synthetic_batch(n_rows: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 16, size=n_rows // 5 + 8)
    lengths = lengths[: np.searchsorted(np.cumsum(lengths), n_rows) + 1]
    lengths[-1] -= lengths.sum() - n_rows
    n_traj = len(lengths)
    traj = np.repeat(np.arange(n_traj), lengths)
    group = traj // GROUP_SIZE
    last = np.r_[traj[1:] != traj[:-1], True]
    rewards = np.where(last & (rng.random(n_rows) < 0.5), 1.0, 0.0)
    keys = (group.astype(np.uint64) * np.uint64(1_000_003)) + rng.integers(0, STATES_PER_GROUP, n_rows).astype(
        np.uint64
    )
    # Interleave trajectories the way a batched rollout does: ordered by turn, then trajectory.
    t = np.arange(n_rows) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    order = np.lexsort((traj, t))
    return {
        "rewards": rewards[order],
        "traj": traj[order],
        "group": group[order],
        "keys": keys[order],
        "done": last[order],
    }


def vectorized(batch: dict[str, np.ndarray]) -> np.ndarray:
    """GiGPO credit with the library's functions: GRPO episode advantages (one member per
    trajectory) plus ``STEP_WEIGHT`` x step advantages normalized within anchor groups."""
    traj, group, rewards = batch["traj"], batch["group"], batch["rewards"]
    step_returns = discounted_returns(rewards, traj, GAMMA)
    episode_returns = np.bincount(traj, weights=rewards)[traj]
    episode = episode_advantages(episode_returns, group, traj, mode="grpo", stats="trajectory", eps=EPS)
    return episode + STEP_WEIGHT * step_advantages(step_returns, group, batch["keys"], normalize="mean_std", eps=EPS)


def graph_credit(batch: dict[str, np.ndarray]) -> np.ndarray:
    """Graph credit on the same batch: a rewarded last turn won, an unrewarded one was cut."""
    won = batch["rewards"] > 0
    graph = graph_progress(batch["group"], batch["traj"], batch["keys"], won, batch["done"], batch["done"] & ~won)
    return graph_advantages(graph, normalize="mean_std", eps=EPS)


def per_row_loop(rewards, traj, group, keys) -> list:
    """The same math written the obvious way: dicts and one Python iteration per row."""
    n = len(rewards)
    running: dict = {}
    step_returns = [0.0] * n
    for i in range(n - 1, -1, -1):
        running[traj[i]] = rewards[i] + GAMMA * running.get(traj[i], 0.0)
        step_returns[i] = running[traj[i]]
    episode_return: dict = defaultdict(float)
    traj_group: dict = {}
    for i in range(n):
        episode_return[traj[i]] += rewards[i]
        traj_group[traj[i]] = group[i]
    group_returns: dict = defaultdict(list)
    for tid, value in episode_return.items():
        group_returns[traj_group[tid]].append(value)

    def mean_std(values: list) -> tuple[float, float]:
        mean = sum(values) / len(values)
        if len(values) < 2:
            return mean, 0.0
        return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))

    group_stats = {g: (len(v), *mean_std(v)) for g, v in group_returns.items()}
    anchor_values: dict = defaultdict(list)
    for i in range(n):
        anchor_values[(group[i], keys[i])].append(step_returns[i])
    anchor_stats = {k: (len(v), *mean_std(v)) for k, v in anchor_values.items()}
    out = [0.0] * n
    for i in range(n):
        count, mean, std = group_stats[group[i]]
        episode = 0.0 if count < 2 else (episode_return[traj[i]] - mean) / (std + EPS)
        count, mean, std = anchor_stats[(group[i], keys[i])]
        step = 0.0 if count < 2 else (step_returns[i] - mean) / (std + EPS)
        out[i] = episode + STEP_WEIGHT * step
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--out", type=Path, default=None, help="results directory")
    args = parser.parse_args()
    console = Console()
    rows = []
    for n in args.sizes:
        batch = synthetic_batch(n)
        fast = vectorized(batch)
        inputs = [batch[k] for k in ("rewards", "traj", "group", "keys")]
        as_lists = [column.tolist() for column in inputs]
        for other in (per_row_loop(*inputs), per_row_loop(*as_lists)):
            if not np.allclose(fast, other, rtol=1e-9, atol=1e-9):
                raise SystemExit(f"vectorized and loop results differ at {n} rows")
        # The same statistic for both sides: the least disturbed of several runs.
        loop_seconds = best_of(lambda: per_row_loop(*inputs), repeats=LOOP_REPEATS)
        lists_seconds = best_of(lambda: per_row_loop(*as_lists), repeats=LOOP_REPEATS)
        vector_seconds = best_of(lambda: vectorized(batch), repeats=20 if n <= 100_000 else 5)
        graph_seconds = best_of(lambda: graph_credit(batch), repeats=20 if n <= 100_000 else 5)
        frac_revisited = float(
            np.mean(np.unique(np.c_[batch["group"], batch["keys"]], axis=0, return_counts=True)[1] > 1)
        )
        rows.append(
            {
                "rows": n,
                "trajectories": int(len(np.unique(batch["traj"]))),
                "vectorized_s": vector_seconds,
                "loop_s": loop_seconds,
                "speedup": loop_seconds / vector_seconds,
                "loop_on_python_lists_s": lists_seconds,
                "speedup_vs_python_lists": lists_seconds / vector_seconds,
                "rows_per_s": n / vector_seconds,
                "graph_credit_s": graph_seconds,
                "frac_anchor_groups_revisited": frac_revisited,
            }
        )
        console.log(
            f"{n:>9,} rows: vectorized {vector_seconds * 1e3:.1f} ms, loop {loop_seconds * 1e3:.1f} ms "
            f"({loop_seconds / vector_seconds:.1f}x), loop on lists {lists_seconds * 1e3:.1f} ms "
            f"({lists_seconds / vector_seconds:.1f}x); graph credit {graph_seconds * 1e3:.1f} ms"
        )
    table = Table(title="discounted_returns + episode_advantages + step_advantages")
    for column in ("rows", "vectorized (ms)", "loop (ms)", "speedup", "loop on lists (ms)", "speedup"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            f"{r['rows']:,}",
            f"{r['vectorized_s'] * 1e3:.1f}",
            f"{r['loop_s'] * 1e3:.1f}",
            f"{r['speedup']:.1f}x",
            f"{r['loop_on_python_lists_s'] * 1e3:.1f}",
            f"{r['speedup_vs_python_lists']:.1f}x",
        )
    console.print(table)
    path = write_result(
        "credit_ops",
        {
            "benchmark": "credit_ops",
            "gamma": GAMMA,
            "group_size": GROUP_SIZE,
            "states_per_group": STATES_PER_GROUP,
            "timing": f"best of {LOOP_REPEATS} runs for the loops, of 20 (5 at 1M rows) for the vectorized code",
            "loop": "per_row_loop iterates the same numpy input arrays row by row with dicts; "
            "loop_on_python_lists_s runs it on .tolist() copies (conversion not timed)",
            "results": rows,
        },
        args.out,
    )
    console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
