"""The main job's learner settings compared as an experiment: arms x paired seeds on the README Maze.

Every arm of a seed starts from that seed's one warm start (the main job's clone, or with
``--warm-start before`` the one the committed learner comparisons used, trained once; the arms of
``WARM_START_ARMS`` train their own instead), draws the same training seed stream and is
evaluated greedily on the same held-out mazes, so the arms differ only in their settings (common
random numbers). No early stop: every run trains
``--iterations`` iterations and is evaluated every ``--eval-every`` on ``--eval-episodes`` mazes.

    python -m agent_rl.benchmarks.main_job_defaults --arms previous,mission --iterations 12 --eval-every 4 --threads 1 \
        --engine hf --out benchmarks/results/learner_defaults    # the embedded learner before and after
    python -m agent_rl.benchmarks.main_job_defaults --warm-start before     # the first learner comparison
    python -m agent_rl.benchmarks.main_job_defaults --arms previous,new --seeds 0 1 --iterations 10
    python -m agent_rl.benchmarks.main_job_defaults --arms env-penalty,credit-penalty --iterations 6 --eval-every 3 \
        --warm-start before --out benchmarks/results/invalid_penalty  # the two forms of the invalid-action penalty
    python -m agent_rl.benchmarks.main_job_defaults --arms shortest-900,explore-900,shortest-300,explore-900-cosine \
        --iterations 0 --out benchmarks/results/warm_start_teacher  # the warm start's teacher, length, schedule
    python -m agent_rl.benchmarks.main_job_defaults --arms precision-fp32,precision-bf16 --iterations 0 --engine hf \
        --out benchmarks/results/main_job_precision                   # the main job's warm start in fp32 and bf16

Outputs under ``--out`` (default ``benchmarks/results/main_job_defaults``): each run's
``metrics.jsonl`` and ``config.yaml`` (no checkpoints), ``summary.json`` with every curve and the
paired differences of each arm against every arm listed before it, and ``curves.png``. Finished
runs are skipped on a rerun.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info
from agent_rl.benchmarks.paired_stats import mean_interval, paired_difference

COMMON = (
    "trainer.target_success=null",
    "trainer.eval_sampled=false",
    "logging.tensorboard=false",
    "logging.console=false",
    "trainer.save_every=1000",
)
PREVIOUS = (
    "algo=gigpo",
    "algo.advantage=grpo",
    "algo.step_normalize=mean_std",
    "algo.loss=grpo",
    "optim.minibatches=1",
    "optim.lr=3e-4",
    "algo.gamma=0.95",
    "algo.invalid_penalty=0",
)
"""The main job's learner before both comparisons: GRPO's std-normalized advantages at both levels,
GRPO's token-level loss, one optimizer step per batch at lr 3e-4, step returns discounted by 0.95,
no invalid-action penalty. At one step per batch GSPO-token's gradient is GRPO's, so this is also
the embedded learner that ``mission`` replaced."""
NEW = (
    "algo=gigpo",
    "algo.advantage=drgrpo",
    "algo.step_normalize=mean",
    "algo.loss=gspo_token",
    "optim.minibatches=4",
    "optim.lr=3e-4",
    "algo.gamma=0.95",
    "algo.invalid_penalty=0",
)
"""The mission's stack: Dr.GRPO advantages (mean-centred, no std) at both levels and GSPO-token,
4 minibatches per batch."""
EMBEDDED_BEFORE = (
    "algo=gigpo",
    "algo.advantage=grpo",
    "algo.step_normalize=mean_std",
    "algo.loss=gspo_token",
    "optim.minibatches=1",
    "optim.lr=3e-4",
    "algo.gamma=0.95",
    "algo.invalid_penalty=0",
)
"""The embedded learner when the penalty and episode-statistics arms ran (``previous`` with
GSPO-token, whose gradient at one step per batch is GRPO's)."""
MISSION = (*NEW[:4], "optim.minibatches=4", "optim.lr=1e-4", "algo.gamma=1.0", "algo.invalid_penalty=0.5")
"""The mission's stack with the changes that keep a strong clone: lr 1e-4 (AdamW moves every
parameter by about lr per step, whatever the gradient's size), undiscounted step returns (with a
discount, all-win groups reward whatever walk was shortest in that maze, which a policy that sees
one room cannot know), and a 0.5 penalty on each invalid action in credit (an all-fail group's
repeated invalid command gets no other signal)."""
LEARNER_OF_THEN = (
    "optim.minibatch_size=0",
    "optim.epochs=1",
    "optim.warmup_steps=0",
    "algo.negative_weight=1",
    "algo.row_weight=turn",
    "rollout.temperature=1",
    "rollout.min_batch_rows=0",
)
"""The update schedule and credit weighting every arm below ran with: minibatches counted, one
epoch, no warmup, negative advantages at full weight, every turn weighing the same, sampling at
temperature 1. The main job's recipe has since changed them (``current`` runs it). The update
itself now leaves zero-advantage rows out and deals whole trajectories into the minibatches, so a
rerun of an arm is close to the committed runs, not identical with them."""
ARMS: dict[str, tuple[str, ...]] = {
    "current": (),
    "previous": PREVIOUS,
    "previous-mb4": (*PREVIOUS, "optim.minibatches=4"),  # the schedule alone
    "new": NEW,
    "new-lr1e-4": (*NEW, "optim.lr=1e-4"),
    "mission": MISSION,
    # The two forms of the invalid-action penalty: an environment reward (discounted into earlier
    # steps' returns, normalized with them) or the algorithm's step credit.
    "env-penalty": (*EMBEDDED_BEFORE, "env.kwargs.invalid_action_penalty=0.1"),
    "credit-penalty": (*EMBEDDED_BEFORE, "algo.invalid_penalty=0.1"),
    # Episode statistics over rows (verl-agent) instead of trajectories: a group's advantages then sum
    # to 0 over its rows, however much longer its failing trajectories are.
    "step-stats": (*EMBEDDED_BEFORE, "algo.episode_stats=step"),
}
ARMS = {name: (*LEARNER_OF_THEN, *arm) if arm else arm for name, arm in ARMS.items()}
"""Each arm is a set of config overrides on top of the main job's recipe (``maze``); each names
every learner setting it depends on (with ``LEARNER_OF_THEN``), so it reproduces whatever the
recipe holds; ``current`` is the recipe itself."""
WARM_START_BEFORE = (
    "env.kwargs.oracle=shortest",
    "sft.steps=300",
    "sft.episodes=400",
    "sft.lr_schedule=constant",
    "sft.batch_size=16",
    "sft.perturb=0",
)
"""The main job's warm start when the learner arms were compared (``--warm-start before``): 300
constant-rate steps of 16 pairs cloning 400 episodes of the shortest-path oracle."""
WARM_START_ARMS: dict[str, tuple[str, ...]] = {
    # The clone's teacher and length: the Maze's shortest plans (made with the whole map) or the
    # explorer's (made from the current observation alone, so clonable exactly), cloned for 300
    # steps or for 900, at a constant learning rate or with a cosine decay.
    "shortest-300": WARM_START_BEFORE,
    "shortest-900": (*WARM_START_BEFORE, "sft.steps=900"),
    "explore-900": (*WARM_START_BEFORE, "sft.steps=900", "env.kwargs.oracle=explore"),
    "explore-900-cosine": (*WARM_START_BEFORE, "sft.steps=900", "env.kwargs.oracle=explore", "sft.lr_schedule=cosine"),
    # The main job's own recipe with its forward passes in float32 or under bfloat16 autocast.
    "precision-fp32": ("policy.precision=fp32",),
    "precision-bf16": ("policy.precision=bf16",),
}
"""Arms that change the warm start: each trains its own, with these overrides, instead of starting
from the seed's shared one (with ``--iterations 0`` they compare warm starts alone)."""
KNOWN_ARMS = {**ARMS, **WARM_START_ARMS}


def mean_ci(values) -> dict[str, float]:
    """Mean and the half-width of its 95% t-interval (0 for a single value)."""
    mean, half = mean_interval(np.asarray(values, dtype=np.float64))
    return {"mean": mean, "ci95": half, "n": len(values)}


def warm_start(seed: int, args: argparse.Namespace) -> Path:
    """The seed's shared warm start, trained once: the main job's iteration 0 (``--warm-start
    default``) or ``WARM_START_BEFORE``'s."""
    from agent_rl.config import DEFAULT_RECIPE, load_config
    from agent_rl.training.infra import checkpoint
    from agent_rl.training.loop.trainer import train

    run_dir = args.out / "warm_start" / f"seed{seed}"
    if not (run_dir / "DONE").exists():
        shutil.rmtree(run_dir, ignore_errors=True)
        before = WARM_START_BEFORE if args.warm_start == "before" else ()
        train(
            load_config(
                DEFAULT_RECIPE,
                [
                    *COMMON,
                    *before,
                    f"engine={args.engine}",
                    f"trainer.seed={seed}",
                    f"trainer.run_dir={run_dir}",
                    "trainer.iterations=0",
                    f"trainer.torch_threads={args.threads}",
                ],
            )
        )
        (run_dir / "DONE").touch()
    return checkpoint.find_checkpoint(run_dir, "sft").model_dir


def run_arm(arm: str, seed: int, args: argparse.Namespace) -> list[dict]:
    from agent_rl.config import DEFAULT_RECIPE, load_config
    from agent_rl.training.infra.logger import read_metrics
    from agent_rl.training.loop.trainer import train

    run_dir = args.out / "runs" / arm / f"seed{seed}"
    if not (run_dir / "DONE").exists():
        start = [] if arm in WARM_START_ARMS else [f"policy={warm_start(seed, args)}", "sft.mode=none"]
        shutil.rmtree(run_dir, ignore_errors=True)
        train(
            load_config(
                DEFAULT_RECIPE,
                [
                    *COMMON,
                    *KNOWN_ARMS[arm],
                    f"engine={args.engine}",
                    *start,
                    f"trainer.seed={seed}",
                    f"trainer.run_dir={run_dir}",
                    f"trainer.iterations={args.iterations}",
                    f"trainer.eval_every={args.eval_every}",
                    f"trainer.eval_episodes={args.eval_episodes}",
                    f"trainer.torch_threads={args.threads}",
                ],
            )
        )
        shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
        (run_dir / "DONE").touch()
    return read_metrics(run_dir)


def curve(records: list[dict]) -> dict[str, list[float]]:
    evals = [r for r in records if r.get("eval/greedy_success") is not None]
    trained = [r for r in records if r["iteration"] > 0]
    start = records[0]
    return {
        # Seconds of the warm start: demonstrations and cloning, not the evaluation after it.
        "warm_start_s": start["time/elapsed"] - start.get("time/eval", 0.0) if "time/elapsed" in start else None,
        "iteration": [r["iteration"] for r in evals],
        "greedy_success": [r["eval/greedy_success"] for r in evals],
        "greedy_invalid_rate": [r["eval/greedy_invalid_rate"] for r in evals],
        "sampled_rollout_success": [r.get("rollout/success_rate") for r in trained],
        "clip_frac": [r.get("update/clip_frac") for r in trained],
        "approx_kl": [r.get("update/approx_kl") for r in trained],
        "seconds_per_iteration": float(
            np.mean([r.get("time/rollout", 0) + r.get("time/update", 0) + r.get("time/advantage", 0) for r in trained])
        )
        if trained
        else None,
    }


def auc(c: dict[str, list[float]]) -> float:
    """Mean greedy success over the evaluated iterations (trapezoid, normalized to the span)."""
    x, y = np.asarray(c["iteration"], dtype=float), np.asarray(c["greedy_success"], dtype=float)
    return float(np.trapezoid(y, x) / (x[-1] - x[0])) if len(x) > 1 else float(y.mean())


def summarize(curves: dict[str, dict[int, dict]], seeds: list[int]) -> dict:
    arms = list(curves)
    summary = {}
    for arm in arms:
        per_seed = curves[arm]
        summary[arm] = {
            "final_greedy_success": mean_ci([per_seed[s]["greedy_success"][-1] for s in seeds]),
            "auc_greedy_success": mean_ci([auc(per_seed[s]) for s in seeds]),
            "mean_curve": np.mean([per_seed[s]["greedy_success"] for s in seeds], axis=0).tolist(),
        }
        if all(per_seed[s].get("warm_start_s") is not None for s in seeds):
            summary[arm]["warm_start_s"] = mean_ci([per_seed[s]["warm_start_s"] for s in seeds])
        for baseline in arms[: arms.index(arm)]:
            base = curves[baseline]
            finals = [[c[s]["greedy_success"][-1] for s in seeds] for c in (per_seed, base)]
            aucs = [[auc(c[s]) for s in seeds] for c in (per_seed, base)]
            summary[arm]["paired_vs_" + baseline] = {
                "final": paired_difference(*finals).as_dict() if len(seeds) > 1 else None,
                "auc": paired_difference(*aucs).as_dict() if len(seeds) > 1 else None,
                "per_seed_final": (np.subtract(*finals)).tolist(),
            }
    return summary


def plot(curves: dict[str, dict[int, dict]], seeds: list[int], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(seeds) + 1, figsize=(3.2 * (len(seeds) + 1), 3.2), sharey=True)
    for arm, per_seed in curves.items():
        for ax, seed in zip(axes, seeds):
            ax.plot(per_seed[seed]["iteration"], per_seed[seed]["greedy_success"], marker=".", label=arm)
            ax.set_title(f"seed {seed}")
        mean = np.mean([per_seed[s]["greedy_success"] for s in seeds], axis=0)
        axes[-1].plot(per_seed[seeds[0]]["iteration"], mean, marker=".", label=arm)
    axes[-1].set_title("mean over seeds")
    for ax in axes:
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("greedy success, held-out mazes")
    axes[-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--arms",
        default="previous,new",
        help=f"comma-separated; each is paired with every arm before it; known: {', '.join(KNOWN_ARMS)}",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per run")
    parser.add_argument(
        "--warm-start",
        default="default",
        choices=["default", "before"],
        help="the learner arms' shared warm start: the main job's, or WARM_START_BEFORE's (the committed comparisons)",
    )
    parser.add_argument(
        "--engine", default="auto", choices=["auto", "hf", "vllm"], help="rollout engine (auto: vLLM when installed)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "main_job_defaults")
    parser.add_argument("--summarize-only", action="store_true", help="write the summary of finished runs")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in KNOWN_ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(KNOWN_ARMS)}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    start = time.perf_counter()
    curves: dict[str, dict[int, dict]] = {arm: {} for arm in arms}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        task = progress.add_task("runs", total=len(arms) * len(args.seeds))
        for seed in args.seeds:
            for arm in arms:
                progress.update(task, description=f"{arm} / seed {seed}")
                done = (args.out / "runs" / arm / f"seed{seed}" / "DONE").exists()
                if done or not args.summarize_only:
                    curves[arm][seed] = curve(run_arm(arm, seed, args))
                progress.advance(task)
    seeds = [s for s in args.seeds if all(s in curves[a] for a in arms)]
    payload = {
        "benchmark": "main_job_defaults",
        "machine": machine_info(),
        "arms": {a: list(KNOWN_ARMS[a]) for a in arms},
        "common": [*COMMON, f"engine={args.engine}"],
        "seeds": seeds,
        "iterations": args.iterations,
        "eval_every": args.eval_every,
        "eval_episodes": args.eval_episodes,
        "wall_s_of_this_invocation": time.perf_counter() - start,
        "summary": summarize(curves, seeds) if seeds else {},
        "curves": curves,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "summary.json").write_text(json.dumps(payload, indent=2) + "\n")
    if seeds:
        plot(curves, seeds, args.out / "curves.png")
        print(json.dumps(payload["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
