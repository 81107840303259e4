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
paired differences of each arm against every arm listed before it, and ``curves.png``. Runs go
``--workers`` at a time as ``agent-rl train`` processes (``benchmarks/harness.py``): a finished run (its
metrics log its last iteration) is skipped on a rerun, one stopped midway resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, stopped, write_json
from agent_rl.benchmarks.harness import RunFailed, TrainRun, run_jobs
from agent_rl.benchmarks.paired_stats import paired_difference
from agent_rl.benchmarks.report import area_under, plot_curves, seed_mean
from agent_rl.config import DEFAULT_RECIPE

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


def warm_start(seed: int, args: argparse.Namespace) -> TrainRun:
    """The seed's shared warm start, trained once: the main job's iteration 0 (``--warm-start
    default``) or ``WARM_START_BEFORE``'s."""
    before = WARM_START_BEFORE if args.warm_start == "before" else ()
    return TrainRun(
        f"warm start / seed {seed}",
        args.out / "warm_start" / f"seed{seed}",
        (*COMMON, *before, f"engine={args.engine}", f"trainer.seed={seed}"),
        0,
        recipe=DEFAULT_RECIPE,
        threads=args.threads,
    )


def sft_model(run: TrainRun) -> Path:
    """The cloned model a finished warm start saved."""
    from agent_rl.training.infra import checkpoint

    return checkpoint.find_checkpoint(run.run_dir, "sft").model_dir


def arm_run(arm: str, seed: int, args: argparse.Namespace) -> TrainRun:
    """An arm's run of a seed: from the seed's shared warm start with cloning off, or (a warm-start arm)
    from scratch with its own."""
    shared = warm_start(seed, args)
    start = None if arm in WARM_START_ARMS else (lambda: [f"policy={sft_model(shared)}", "sft.mode=none"])
    return TrainRun(
        f"{arm} / seed {seed}",
        args.out / "runs" / arm / f"seed{seed}",
        (
            *COMMON,
            *KNOWN_ARMS[arm],
            f"engine={args.engine}",
            f"trainer.seed={seed}",
            f"trainer.eval_every={args.eval_every}",
            f"trainer.eval_episodes={args.eval_episodes}",
        ),
        args.iterations,
        recipe=DEFAULT_RECIPE,
        threads=args.threads,
        start=start,
    )


def run_arms(arms: list[str], args: argparse.Namespace, progress) -> None:
    """Train every (arm, seed) not finished, ``--workers`` at a time, each learner arm once its seed's
    shared warm start has saved its model; an arm's checkpoints are deleted once it has finished (its
    metrics are the result)."""
    runs = {arm_run(arm, seed, args): seed for seed in args.seeds for arm in arms}
    shared = {seed: warm_start(seed, args) for seed in sorted({seed for run, seed in runs.items() if run.start})}
    for seed, warm in shared.items():
        waiting = [run.name for run, s in runs.items() if s == seed and run.start and not run.done]
        if waiting and warm.done and not (warm.run_dir / "checkpoints").is_dir():
            raise RunFailed(
                f"{warm.run_dir} holds a finished warm start without its checkpoint (results are committed "
                f"without checkpoints), which {', '.join(waiting)} start from: delete that directory to train it again"
            )
    run_jobs(
        [*shared.values(), *runs],
        workers=args.workers,
        progress=progress,
        title="main-job arms",
        needs=lambda run: (shared[runs[run]],) if run in runs and run.start else (),
        on_finish=lambda run: shutil.rmtree(run.run_dir / "checkpoints", ignore_errors=True) if run in runs else None,
    )


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
    """Mean greedy success over the evaluated iterations."""
    return area_under(c["iteration"], c["greedy_success"])


def summarize(curves: dict[str, dict[int, dict]], seeds: list[int]) -> dict:
    arms = list(curves)
    summary = {}
    for arm in arms:
        per_seed = curves[arm]
        summary[arm] = {
            "final_greedy_success": seed_mean([per_seed[s]["greedy_success"][-1] for s in seeds]),
            "auc_greedy_success": seed_mean([auc(per_seed[s]) for s in seeds]),
            "mean_curve": np.mean([per_seed[s]["greedy_success"] for s in seeds], axis=0).tolist(),
        }
        if all(per_seed[s].get("warm_start_s") is not None for s in seeds):
            summary[arm]["warm_start_s"] = seed_mean([per_seed[s]["warm_start_s"] for s in seeds])
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
    """Greedy success of each arm: the mean over ``seeds`` with its interval, and each seed's curve."""
    series = {
        arm: (per_seed[seeds[0]]["iteration"], [per_seed[s]["greedy_success"] for s in seeds])
        for arm, per_seed in curves.items()
    }
    plot_curves(path, {"greedy success, held-out mazes": series}, "greedy success (mean over seeds, 95% CI)")


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
    parser.add_argument("--workers", type=int, default=1, help="runs at a time (default 1)")
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
    parser.add_argument("--summarize-only", action="store_true", help="summarize the finished runs; train nothing")
    args = parser.parse_args(argv)
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in KNOWN_ARMS]
    if unknown:
        parser.error(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(KNOWN_ARMS)}")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agent_rl.training.infra.logger import read_metrics

    start = time.perf_counter()
    if not args.summarize_only:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as p:
            try:
                run_arms(arms, args, p)
            except RunFailed as exc:
                print(f"main_job_defaults: error: {exc}", file=sys.stderr)
                return 1
            except KeyboardInterrupt as exc:
                return stopped("main_job_defaults", exc)
    curves: dict[str, dict[int, dict]] = {arm: {} for arm in arms}
    for arm in arms:
        for seed in args.seeds:
            run = arm_run(arm, seed, args)
            if run.done:
                curves[arm][seed] = curve(read_metrics(run.run_dir))
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
    write_json(args.out / "summary.json", payload)
    if seeds:
        plot(curves, seeds, args.out / "curves.png")
        print(json.dumps(payload["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
