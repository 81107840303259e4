"""Trajectory-only vs step-level credit: environments x methods x seeds at an equal budget.

Every cell trains from the same warm-start checkpoint of its (environment, seed) for the same
number of iterations, trajectories and environment steps limit (no early stop), and is evaluated on
the same held-out seeds. Finished cells are skipped on a rerun; a cell killed midway resumes from its
last checkpoint.

    python -m benchmarks.credit_assignment             # the full grid (about 2 hours on 2 CPU cores)
    python -m benchmarks.credit_assignment --quick     # 1 env x 2 methods x 2 seeds, a few minutes
    agent-rl bench credit [--quick]                    # the same, from a source checkout

Outputs under ``--out`` (default ``benchmarks/results/credit_assignment``): each cell's run directory
(``metrics.jsonl``, checkpoints), ``summary.json``, ``summary.md`` and ``success_<env>.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from benchmarks.common import RESULTS_DIR, machine_info


@dataclass(frozen=True)
class Environment:
    name: str
    overrides: tuple[str, ...]
    """Recipe overrides shared by every method (environment, rollout size, SFT, iterations)."""
    methods: tuple[str, ...]


METHODS: dict[str, tuple[str, ...]] = {
    "grpo": ("algo=grpo", "algo.kl_coef=0"),
    "gigpo-state": ("algo=gigpo", "env.anchor_key=state"),
    "gigpo-observation": ("algo=gigpo", "env.anchor_key=observation"),
    "gigpo-fingerprint": ("algo=gigpo", "env.anchor_key=fingerprint"),
    "gigpo-similarity": ("algo=gigpo", "env.anchor_key=similarity"),
    "drgrpo": ("algo=drgrpo",),
    "gspo": ("algo=gspo",),
}
"""Each method is a set of config overrides on top of the environment's recipe."""

# RL lr 1e-4 rather than the main job's 3e-4: from these weaker warm starts, two Adam steps at 3e-4
# took grpo on Maze from 53% to 3% sampled success (the step size, not the credit, decided the run).
# Every environment also charges 0.01 per invalid action, as verl-agent does (0.1 against a success
# reward of 10): without it both methods drifted into invalid actions on Maze even at 1e-4.
# The warm start's schedule, batch, demonstration count and perturbation (none) are those the committed grid ran with.
COMMON = (
    "engine=hf", "sft.mode=random", "sft.episodes=400", "sft.lr_schedule=constant", "sft.batch_size=16", "sft.perturb=0",
    "optim.lr=1e-4", "trainer.target_success=null", "trainer.eval_sampled=false",
    "logging.tensorboard=false", "logging.console=false",
)

# Sizes chosen for ~2 hours on a 2-core CPU, each at a setting where the shared warm start wins some
# but far from all sampled episodes (a group whose members all fail carries no signal for any method):
# - Maze: four rooms, a locked door whose key may lie in a dead end, 20 steps. Its warm start is a
#   short oracle clone (200 steps): a random-action clone of the tiny model won 0 of 32 sampled
#   episodes even in 3-room mazes, because it spends half its turns on `look`/`inventory` and almost
#   never copies the `take <goal>` command from the admissible list. (150 oracle steps left every
#   method at 0% greedy, with sampled success falling to 0.)
# - Sokoban: one box in a 7x7 room scrambled by 20 reverse moves, 16 steps (random clone: ~25%).
# - TextWorld: coin collector level 3, 12 steps (uniformly random play: ~30%).
# - MiniCode level 1, whose feedback never repeats verbatim. It has no admissible-action list to
#   sample random actions from, so its warm start clones the oracle too.
FULL_GRID = (
    Environment(
        "maze",
        ("env.id=agent_rl/Maze-v0",
         "env.kwargs={n_rooms: 4, n_locked_doors: 1, dead_ends: 1, extra_edges: 0, n_distractors: 0, max_steps: 20, invalid_action_penalty: 0.01}",
         "rollout.n_groups=8", "rollout.group_size=4", "rollout.max_turns=20", "rollout.history_turns=0",
         "sft.mode=oracle", "sft.steps=200", "trainer.iterations=15", "trainer.eval_every=3", "trainer.eval_episodes=32"),
        ("grpo", "drgrpo", "gigpo-state", "gigpo-similarity"),
    ),
    Environment(
        "sokoban",
        ("env.id=agent_rl/Sokoban-v0",
         "env.kwargs={width: 7, height: 7, n_boxes: 1, reverse_steps: 20, max_steps: 16, invalid_action_penalty: 0.01}",
         "rollout.n_groups=8", "rollout.group_size=4", "rollout.max_turns=16", "rollout.history_turns=0",
         "sft.steps=150", "trainer.iterations=15", "trainer.eval_every=3", "trainer.eval_episodes=32"),
        ("grpo", "gigpo-state"),
    ),
    Environment(
        "textworld",
        ("env.id=agent_rl/TextWorld-v0", "env.kwargs={kind: coin_collector, level: 3, n_games: 8, max_steps: 12, invalid_action_penalty: 0.01}",
         "rollout.n_groups=4", "rollout.group_size=4", "rollout.max_turns=12", "rollout.history_turns=0",
         "rollout.max_prompt_tokens=768", "sft.steps=150", "trainer.iterations=12", "trainer.eval_every=3",
         "trainer.eval_episodes=16"),
        ("grpo", "drgrpo", "gigpo-observation"),
    ),
    Environment(
        "minicode",
        ("env.id=agent_rl/MiniCode-v0", "env.kwargs={level: 1, n_tests: 3, max_steps: 4, invalid_action_penalty: 0.01}",
         "rollout.n_groups=8", "rollout.group_size=4", "rollout.max_turns=4", "rollout.history_turns=1",
         "rollout.max_new_tokens=24", "sft.mode=oracle", "sft.steps=150", "trainer.iterations=12",
         "trainer.eval_every=3", "trainer.eval_episodes=32"),
        ("grpo", "gigpo-fingerprint"),
    ),
)
FULL_SEEDS = (0, 1, 2)

QUICK_GRID = (
    Environment(
        "maze",
        ("env.id=agent_rl/Maze-v0",
         "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 4}",
         "rollout.n_groups=2", "rollout.group_size=2", "rollout.max_turns=3", "rollout.history_turns=0",
         "rollout.max_new_tokens=8", "sft.steps=2", "sft.episodes=2", "sft.batch_size=4", "trainer.iterations=2",
         "trainer.eval_every=1", "trainer.eval_episodes=2", "optim.micro_batch_size=8"),
        ("grpo", "gigpo-state"),
    ),
)
QUICK_SEEDS = (0, 1)

# Two-sided 95% Student-t quantiles by degrees of freedom (1..10), then the normal value.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def confidence_interval(values: np.ndarray) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval (0 for a single value)."""
    values = np.asarray(values, dtype=np.float64)
    if len(values) < 2:
        return float(values.mean()), 0.0
    t = T95[len(values) - 2] if len(values) - 1 <= len(T95) else 1.96
    return float(values.mean()), float(t * values.std(ddof=1) / math.sqrt(len(values)))


@dataclass
class Cell:
    env: Environment
    method: str
    seed: int
    run_dir: Path
    records: list[dict] = field(default_factory=list)


def sft_checkpoint(env: Environment, seed: int, out: Path, on_iteration=None) -> Path:
    """The shared warm start of (env, seed) (``sft=random`` unless the environment's recipe says
    otherwise): trained once, reused by every method."""
    from agent_rl.config import load_config
    from training import checkpoint
    from training.trainer import train

    run_dir = out / "sft" / f"{env.name}-seed{seed}"
    if not (run_dir / "DONE").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        train(load_config(overrides=[*COMMON, *env.overrides, f"trainer.seed={seed}", f"trainer.run_dir={run_dir}",
                                     "trainer.iterations=0"]), on_iteration=on_iteration)
        (run_dir / "DONE").touch()
    return checkpoint.find_checkpoint(run_dir, "sft").model_dir


def run_cell(cell: Cell, out: Path, on_iteration=None) -> None:
    """Train ``cell`` unless it is done; ``on_iteration(iteration, metrics)`` reports its progress."""
    from agent_rl.config import load_config
    from training import checkpoint
    from training.logger import read_metrics
    from training.trainer import train

    done = cell.run_dir / "DONE"
    if not done.exists():
        start_model = sft_checkpoint(cell.env, cell.seed, out, on_iteration)
        overrides = [*COMMON, *cell.env.overrides, *METHODS[cell.method], f"policy={start_model}", "sft.mode=none",
                     f"trainer.seed={cell.seed}", f"trainer.run_dir={cell.run_dir}"]
        checkpoints = cell.run_dir / checkpoint.CHECKPOINTS
        resume = checkpoints.is_dir() and any(checkpoints.iterdir())  # a cell killed midway continues
        train(load_config(overrides=overrides), resume=resume, on_iteration=on_iteration)
        done.touch()
    cell.records = read_metrics(cell.run_dir)


def cell_summary(cell: Cell) -> dict:
    evals = [r for r in cell.records if r.get("eval/greedy_success") is not None]
    iterations = np.array([r["iteration"] for r in evals], dtype=np.float64)
    success = np.array([r["eval/greedy_success"] for r in evals], dtype=np.float64)
    rows_per_iteration = {r["iteration"]: r.get("rollout/rows", 0.0) for r in cell.records}
    env_steps = np.array([sum(v for k, v in rows_per_iteration.items() if k <= it) for it in iterations])
    trained = [r for r in cell.records if r["iteration"] > 0]
    phase = {p: float(np.mean([r.get(f"time/{p}", 0.0) or 0.0 for r in trained])) if trained else 0.0
             for p in ("rollout", "advantage", "update", "sync")}
    iteration_seconds = sum(phase.values())

    def first_reaching(level: float) -> float | None:
        hits = iterations[success >= level]
        return float(hits[0]) if len(hits) else None

    return {
        "iterations": iterations.tolist(),
        "env_steps": env_steps.tolist(),
        "greedy_success": success.tolist(),
        "final_success": float(success[-1]) if len(success) else 0.0,
        "auc": float(np.trapezoid(success, iterations) / max(iterations[-1] - iterations[0], 1.0)) if len(success) > 1 else 0.0,
        "iterations_to_50": first_reaching(0.5),
        "iterations_to_90": first_reaching(0.9),
        "grouped_fraction": float(np.mean([r.get("anchors/grouped_fraction", 0.0) for r in trained])) if trained else 0.0,
        "mean_anchor_group_size": float(np.mean([r.get("anchors/mean_group_size", 0.0) for r in trained])) if trained else 0.0,
        "phase_seconds_per_iteration": phase,
        "training_seconds": float(cell.records[-1].get("time/elapsed", 0.0)) if cell.records else 0.0,
        "advantage_share_of_iteration": phase["advantage"] / iteration_seconds if iteration_seconds else 0.0,
    }


def aggregate(cells: list[Cell]) -> dict:
    summary: dict = {}
    for cell in cells:
        summary.setdefault(cell.env.name, {}).setdefault(cell.method, {"seeds": {}})["seeds"][cell.seed] = cell_summary(cell)
    for methods in summary.values():
        for result in methods.values():
            seeds = list(result["seeds"].values())
            for key in ("final_success", "auc", "grouped_fraction", "advantage_share_of_iteration"):
                mean, half = confidence_interval(np.array([s[key] for s in seeds]))
                result[key] = {"mean": mean, "ci95": half}
            for level in ("50", "90"):
                reached = [s[f"iterations_to_{level}"] for s in seeds if s[f"iterations_to_{level}"] is not None]
                result[f"iterations_to_{level}"] = {"mean": float(np.mean(reached)) if reached else None,
                                                    "seeds_reaching": len(reached), "seeds": len(seeds)}
            curves = np.array([s["greedy_success"] for s in seeds])
            result["curve"] = {"iterations": seeds[0]["iterations"], "env_steps": seeds[0]["env_steps"],
                               "mean": curves.mean(0).tolist(),
                               "ci95": [confidence_interval(curves[:, i])[1] for i in range(curves.shape[1])]}
    return summary


def write_markdown(summary: dict, path: Path) -> None:
    lines = ["| env | method | final greedy success (95% CI) | AUC | iters to 50% | iters to 90% | steps in anchor groups >= 2 | step credit's share of iteration time |",
             "|---|---|---|---|---|---|---|---|"]
    for env, methods in summary.items():
        for method, r in methods.items():
            def reach(level: str) -> str:
                x = r[f"iterations_to_{level}"]
                return "-" if x["mean"] is None else f"{x['mean']:.1f} ({x['seeds_reaching']}/{x['seeds']})"

            lines.append(
                f"| {env} | {method} | {r['final_success']['mean']:.2f} ± {r['final_success']['ci95']:.2f} | "
                f"{r['auc']['mean']:.2f} | {reach('50')} | {reach('90')} | {100 * r['grouped_fraction']['mean']:.0f}% | "
                f"{100 * r['advantage_share_of_iteration']['mean']:.2f}% |"
            )
    path.write_text("\n".join(lines) + "\n")


def plot(summary: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for env, methods in summary.items():
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
        for method, r in methods.items():
            mean, half = np.array(r["curve"]["mean"]), np.array(r["curve"]["ci95"])
            for ax, x in zip(axes, (r["curve"]["iterations"], r["curve"]["env_steps"])):
                ax.plot(x, mean, marker="o", label=method)
                ax.fill_between(x, np.clip(mean - half, 0, 1), np.clip(mean + half, 0, 1), alpha=0.2)
        for ax, label in zip(axes, ("iteration", "environment steps")):
            ax.set_xlabel(label)
            ax.set_ylabel("greedy eval success")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=8)
        fig.suptitle(f"{env}: mean over seeds, 95% CI band")
        fig.tight_layout()
        path = out / f"success_{env}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)
    return paths


def iteration_reporter(progress, task_id, total: int):
    """An ``on_iteration`` callback that shows a cell's iteration and its last greedy eval."""
    last_eval = ""

    def report(iteration: int, metrics: dict) -> None:
        nonlocal last_eval
        if metrics.get("eval/greedy_success") is not None:
            last_eval = f", last greedy success {metrics['eval/greedy_success']:.2f}"
        progress.update(task_id, completed=iteration, description=f"  iteration {iteration}/{total}{last_eval}")

    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 env x 2 methods x 2 seeds, a few iterations")
    parser.add_argument("--out", type=Path, default=None, help="output directory")
    args = parser.parse_args(argv)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from agent_rl.config import load_config

    grid, seeds = (QUICK_GRID, QUICK_SEEDS) if args.quick else (FULL_GRID, FULL_SEEDS)
    out = args.out or RESULTS_DIR / ("credit_assignment_quick" if args.quick else "credit_assignment")
    out.mkdir(parents=True, exist_ok=True)
    cells = [Cell(env, method, seed, out / "runs" / env.name / method / f"seed{seed}")
             for env in grid for seed in seeds for method in env.methods]
    start = time.perf_counter()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())
    with Progress(*columns) as progress:
        task = progress.add_task("grid", total=len(cells))
        iteration_task = progress.add_task("iteration", total=None)
        for cell in cells:
            name = f"{cell.env.name} / {cell.method} / seed {cell.seed}"
            progress.update(task, description=name)
            total = int(load_config(overrides=[*COMMON, *cell.env.overrides]).trainer.iterations)
            finished = (cell.run_dir / "DONE").exists()
            progress.reset(iteration_task, total=total, completed=total if finished else 0,
                           description="  finished in an earlier run" if finished else "  warm start / iteration 0")
            run_cell(cell, out, iteration_reporter(progress, iteration_task, total))
            progress.advance(task)
    summary = aggregate(cells)
    from training.logger import read_metrics

    # Training time of every cell and warm start (kept in checkpoints, so it spans resumed runs);
    # the warm starts' run directories are not committed, so a rerun elsewhere reports them as null.
    warm_starts = [read_metrics(out / "sft" / f"{env.name}-seed{seed}") for env in grid for seed in seeds]
    compute = {"cells_s": sum(seed["training_seconds"] for methods in summary.values() for result in methods.values()
                              for seed in result["seeds"].values()),
               "warm_starts_s": sum(r[-1]["time/elapsed"] for r in warm_starts) if all(warm_starts) else None}
    payload = {"machine": machine_info(), "quick": args.quick, "seeds": list(seeds),
               "wall_s_of_this_invocation": time.perf_counter() - start, "training_seconds": compute,
               "grid": {env.name: {"overrides": [*COMMON, *env.overrides], "methods": {m: list(METHODS[m]) for m in env.methods}}
                        for env in grid},
               "results": summary}
    (out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
    write_markdown(summary, out / "summary.md")
    plot(summary, out)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
