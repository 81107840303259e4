"""Credit testbed: trajectory-level credit (GRPO family) against step-level credit (GiGPO's anchor
groups and graph credit) with a tabular softmax policy, many paired seeds in minutes.

The policy is one logit vector per (task, anchor state) over that state's admissible actions, trained
by the policy gradient ``logits[s, a] += lr * A * (onehot(a) - pi(.|s))``. The advantages ``A`` come
from ``agent_rl.core.advantages.compute_advantages`` with anchor keys from ``agent_rl.anchors.compute_anchor_keys``:
the credit code users train with. Only the policy and the environment stepping are replaced, by the
engine in ``agent_rl.benchmarks.testbed``; this script configures, runs and reports it:

1. Each task's reachable state graph is explored once with the real environment (breadth first over
   ``info["admissible_actions"]`` from the reset state, up to the step limit), recording per
   transition the next state, reward, termination, win, validity, the anchor string and the
   observation.
2. Rollouts for every seed and arm are simulated with numpy on those tables, all seeds at once.
3. Success is the exact probability that a trajectory sampled from the policy wins within the step
   limit (forward dynamic programming over the state graph), so no evaluation noise enters.

The policy is per task: the metric is the sampled success on the training tasks the policy was
trained on (drawn from training seeds, below ``agent_rl.envs.EVAL_SEED_BASE``). A tabular policy has nothing
to carry to an unseen task, so no held-out seed is played.

Arms are compared on the same seeds (same tasks, same sampling noise at the start: common random
numbers), by per-seed differences against GRPO at the same group size, under two views of the
advantage scale: ``equal`` rescales each seed's batch to mean |A| = 1 (arms differ only in the
direction of their advantages; the primary view), ``raw`` keeps each estimator's own scale.

    python -m agent_rl.benchmarks.credit_testbed            # the full run (128 paired seeds)
    python -m agent_rl.benchmarks.credit_testbed --quick    # a smoke run in seconds
    agent-rl bench testbed [--quick] [--envs maze,sokoban] [--arms grpo,gigpo] [--seeds N] [--out DIR]

Outputs under ``--out`` (default ``benchmarks/results/credit_testbed``): ``summary.json``,
``summary.md``, ``success_<env>.png`` (success curves) and ``paired_differences.png``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from agent_rl.anchors import compute_anchor_keys
from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, write_json
from agent_rl.benchmarks.paired_stats import PairedDifference, adjust_family, mean_interval, paired_difference
from agent_rl.benchmarks.testbed import corridor  # noqa: F401  (registers testbed/KeyCorridor-v0)
from agent_rl.benchmarks.testbed.exact import success_probability
from agent_rl.benchmarks.testbed.explore import Tables, TaskGraph, build_tables, explore, replay_check
from agent_rl.benchmarks.testbed.learner import policy_gradient_step, unit_mean_abs
from agent_rl.benchmarks.testbed.simulator import Rollout, initial_logits, rollout
from agent_rl.config import AlgorithmConfig, resolve_algorithm
from agent_rl.core.advantages import compute_advantages
from agent_rl.core.batch import StepBatch
from agent_rl.envs import EVAL_SEED_BASE

# ---- settings ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TestbedEnv:
    """One environment of the testbed."""

    env_id: str
    """Registered text-environment id."""
    kwargs: dict[str, Any]
    """Constructor arguments (``gymnasium.make(env_id, **kwargs)``)."""
    description: str
    """One line for the summary."""
    eval_every: int = 3
    """Exact success is computed every this many updates (and after the last)."""
    skip_arms: tuple[str, ...] = ()
    """Arms not run here (the reason is in ``description``)."""


ENVIRONMENTS: dict[str, TestbedEnv] = {
    "maze": TestbedEnv(
        "agent_rl/Maze-v0",
        {"n_rooms": 4, "n_locked_doors": 1, "dead_ends": 1, "extra_edges": 0, "n_distractors": 0, "max_steps": 20},
        "the README main job's Maze: 4 rooms, 1 locked door, 1 dead end, 20 steps",
    ),
    "maze-long": TestbedEnv(
        "agent_rl/Maze-v0",
        {"n_rooms": 8, "n_locked_doors": 2, "dead_ends": 2, "extra_edges": 0, "n_distractors": 0, "max_steps": 50},
        "8 rooms, 2 locked doors, 2 dead ends, 50 steps; dropping keys anywhere gives about 1000 states per task, "
        "so similarity anchors (which cluster every observation text) are not run here",
        eval_every=5,
        skip_arms=("gigpo-similarity",),
    ),
    "sokoban": TestbedEnv(
        "agent_rl/Sokoban-v0",
        {"width": 7, "height": 7, "n_boxes": 1, "reverse_steps": 50, "max_steps": 20},
        "7x7 Sokoban, 1 box scrambled by 50 reverse-play moves, 20 steps (training/configs/sokoban.yaml is 6x6 "
        "with 14 moves)",
    ),
    "corridor": TestbedEnv(
        "testbed/KeyCorridor-v0",
        {"min_length": 5, "max_length": 8, "max_steps": 20},
        "a user-registered toy: a corridor of 5-8 cells, key at one end, door at the other, 20 steps",
    ),
}


@dataclass(frozen=True)
class Arm:
    """One credit-assignment method: an ``AlgorithmConfig`` and how anchor keys are computed."""

    algo: dict[str, Any]
    """``AlgorithmConfig`` fields (the loss is not used: the policy is tabular)."""
    anchor: str = "state"
    """``agent_rl.anchors.compute_anchor_keys`` kind."""
    history_turns: int = 0
    """Turns of history for the ``context`` kind."""
    group_size: int = 4
    """Trajectories per group."""
    baseline: str = "grpo"
    """The arm this one is compared with, seed by seed (GRPO at the same group size)."""
    reference: str | None = None
    """A second arm compared seed by seed: the GiGPO arm that a variant changes one setting of."""

    def algorithm(self) -> AlgorithmConfig:
        """The resolved ``AlgorithmConfig``: ``SHARED_ALGO`` under this arm's fields."""
        return resolve_algorithm(AlgorithmConfig(**{**SHARED_ALGO, **self.algo}))


SHARED_ALGO = {"gamma": 0.95, "invalid_penalty": 0.0}
"""``AlgorithmConfig`` fields every arm shares, whatever the embedded defaults are: step returns
discounted by 0.95, and no invalid-action penalty (the tabular policy only plays admissible actions)."""


GIGPO = {"preset": "gigpo", "advantage": "drgrpo", "step_normalize": "mean"}
"""The testbed's GiGPO: Dr.GRPO's mean-centred advantages at both levels, omega 1 (the variants
change one setting of it; ``gigpo-mean_std`` is the std-normalized form)."""

ARMS: dict[str, Arm] = {
    "grpo": Arm({"preset": "grpo"}),
    "drgrpo": Arm({"preset": "drgrpo"}),
    "rloo": Arm({"preset": "rloo"}),
    "gigpo": Arm(GIGPO),
    "gigpo-mean_std": Arm({**GIGPO, "advantage": "grpo", "step_normalize": "mean_std"}, reference="gigpo"),
    "step-only": Arm({**GIGPO, "advantage": "none"}, reference="gigpo"),
    "gigpo-w0.5": Arm({**GIGPO, "step_weight": 0.5}, reference="gigpo"),
    "gigpo-w2": Arm({**GIGPO, "step_weight": 2.0}, reference="gigpo"),
    "gigpo-similarity": Arm(GIGPO, anchor="similarity", reference="gigpo"),
    "gigpo-context1": Arm(GIGPO, anchor="context", history_turns=1, reference="gigpo"),
    "gigpo-context2": Arm(GIGPO, anchor="context", history_turns=2, reference="gigpo"),
    "graph": Arm({**GIGPO, "step_credit": "graph"}, reference="gigpo"),
    "graph-mean_std": Arm(
        {**GIGPO, "advantage": "grpo", "step_normalize": "mean_std", "step_credit": "graph"}, reference="gigpo-mean_std"
    ),
    "grpo-g8": Arm({"preset": "grpo"}, group_size=8, baseline="grpo-g8"),
    "gigpo-g8": Arm(GIGPO, group_size=8, baseline="grpo-g8"),
    "graph-g8": Arm({**GIGPO, "step_credit": "graph"}, group_size=8, baseline="grpo-g8", reference="gigpo-g8"),
}
"""Every arm uses ``SHARED_ALGO`` and ``AlgorithmConfig``'s defaults otherwise (trajectory statistics)."""

MAX_GROUP_SIZE = max(arm.group_size for arm in ARMS.values())

VIEWS = ("equal", "raw")
"""``equal``: each seed's batch rescaled to mean |A| = 1 every update; ``raw``: the estimator's own scale."""


@dataclass(frozen=True)
class Settings:
    """One run of the testbed."""

    seeds: int = 128
    """Paired seeds: every arm trains each seed's tasks from the same start with the same noise."""
    tasks: int = 8
    """Tasks per seed; every update plays one group of each (the batch's groups)."""
    updates: int = 15
    """Policy-gradient updates (one per batch)."""
    lr: float = 0.1
    """Step size of the tabular policy gradient."""
    arms: tuple[str, ...] = tuple(ARMS)
    """Arms to train (names in ``ARMS``; their baselines are added)."""
    envs: tuple[str, ...] = tuple(ENVIRONMENTS)
    """Environments (names in ``ENVIRONMENTS``)."""
    workers: int = 2
    """Processes exploring tasks and training arms (1: all in this process)."""


QUICK = Settings(
    seeds=6,
    tasks=2,
    updates=3,
    workers=1,
    arms=("grpo", "gigpo", "step-only", "gigpo-similarity", "gigpo-context1", "graph", "grpo-g8", "gigpo-g8"),
)


def select_names(kind: str, requested: list[str], valid: dict[str, Any]) -> tuple[str, ...]:
    """``requested`` without repeats, or a ValueError naming every unknown name and listing the valid ones."""
    unknown = [name for name in requested if name not in valid]
    if unknown:
        raise ValueError(f"unknown {kind} {', '.join(map(repr, unknown))}; valid {kind}s: {', '.join(valid)}")
    return tuple(dict.fromkeys(requested))


def with_baselines(arms: tuple[str, ...]) -> tuple[str, ...]:
    """The arms and the baselines they are compared with, baselines first."""
    return tuple(dict.fromkeys([*(ARMS[arm].baseline for arm in arms), *arms]))


def task_seed(seed: int, task: int, tasks: int) -> int:
    """The training reset seed of task ``task`` of paired seed ``seed`` (distinct per pair, < 2**31)."""
    value = seed * tasks + task
    if value >= EVAL_SEED_BASE:
        raise ValueError(f"task seed {value} would be an evaluation seed; use fewer seeds or tasks")
    return value


# ---- the engine's jobs -------------------------------------------------------------------------------


def explore_task(job: tuple[str, int, bool]) -> TaskGraph:
    """Explore and replay-check one task of testbed environment ``job[0]`` (a worker's job); the
    observation texts are dropped unless ``job[2]`` (only similarity anchors read them)."""
    name, seed, keep_observations = job
    spec = ENVIRONMENTS[name]
    graph = explore(spec.env_id, spec.kwargs, seed)
    replay_check(spec.env_id, spec.kwargs, seed, graph, np.random.default_rng(seed))
    if not keep_observations:
        graph.observation_texts, graph.observation_id = [""], np.zeros_like(graph.observation_id)
    return graph


def anchor_keys(arm: Arm, tables: Tables, batch: Rollout) -> np.ndarray:
    """``agent_rl.anchors.compute_anchor_keys`` on the rows' recorded strings, as the trainer calls it."""
    if arm.anchor == "similarity":
        return compute_anchor_keys(
            "similarity", observations=tables.observations[batch.observation_id].tolist(), group_ids=batch.task
        )
    states = tables.anchors[tables.anchor_id[batch.state]].tolist()
    if arm.anchor == "context":
        actions = tables.actions[tables.action_id[batch.state, batch.action]].tolist()
        return compute_anchor_keys(
            "context", states=states, actions=actions, traj_ids=batch.traj, history_turns=arm.history_turns
        )
    return compute_anchor_keys(arm.anchor, states=states)


# ---- training ---------------------------------------------------------------------------------------


@dataclass
class ArmResult:
    """What one arm's training under one view measured."""

    success: np.ndarray
    """(seeds, evaluations): mean exact success over each seed's tasks."""
    raw_abs_advantage: list[float] = field(default_factory=list)
    """Mean |A| of each update's batch before any rescaling."""
    grouped_fraction: list[float] = field(default_factory=list)
    """Fraction of rows in anchor groups of two or more, per update."""
    mean_group_size: list[float] = field(default_factory=list)
    """Mean rows per anchor group, per update."""


def common_noise(settings: Settings, env_index: int, max_steps: int) -> list[np.ndarray]:
    """Per update, the uniforms every arm samples its actions with, (seeds x tasks, MAX_GROUP_SIZE,
    max_steps): common random numbers, so arms differ only where their policies differ. Seed
    ``s``'s numbers depend on (environment, s, update) only, not on how many seeds run."""
    return [
        np.concatenate(
            [
                np.random.default_rng([env_index, seed, update]).random((settings.tasks, MAX_GROUP_SIZE, max_steps))
                for seed in range(settings.seeds)
            ]
        )
        for update in range(settings.updates)
    ]


def evaluation_points(settings: Settings, env: TestbedEnv) -> list[int]:
    return [u for u in range(settings.updates + 1) if u % env.eval_every == 0 or u == settings.updates]


def per_seed(values: np.ndarray, settings: Settings) -> np.ndarray:
    return values.reshape(settings.seeds, settings.tasks).mean(axis=1)


def train_arm(
    arm: Arm,
    view: str,
    tables: Tables,
    settings: Settings,
    noise: list[np.ndarray],
    evaluations: list[int],
    initial_success: np.ndarray,
) -> ArmResult:
    """Train every seed's policy with one arm for ``settings.updates`` updates; exact success at
    each of the ``evaluations`` (update counts; the first, 0, is the uniform policy's
    ``initial_success``, the same for every arm)."""
    algo = arm.algorithm()
    logits = initial_logits(tables)
    result = ArmResult(np.zeros((settings.seeds, len(evaluations))))
    result.success[:, 0] = initial_success
    for update in range(settings.updates):
        batch = rollout(tables, logits, noise[update][:, : arm.group_size])  # a smaller group: the first members
        steps = StepBatch.for_credit(
            batch.task,
            batch.traj,
            batch.reward,
            anchor_key=anchor_keys(arm, tables, batch),
            action_valid=batch.valid,
            won=batch.won,
            truncated=~batch.terminated,
        )
        credit = compute_advantages(steps, algo)
        advantages = credit.advantages
        metrics = credit.metrics()
        result.raw_abs_advantage.append(metrics["advantage/abs_mean"])
        result.grouped_fraction.append(metrics["anchors/grouped_fraction"])
        result.mean_group_size.append(metrics["anchors/mean_group_size"])
        if view == "equal":
            advantages = unit_mean_abs(advantages, batch.task // settings.tasks, settings.seeds)
        policy_gradient_step(logits, batch.state, batch.action, advantages, settings.lr)
        if update + 1 in evaluations:
            result.success[:, evaluations.index(update + 1)] = per_seed(success_probability(tables, logits), settings)
    return result


_WORKER_STATE: dict[str, Any] = {}
"""What forked workers read (inherited, not pickled): the environment's tables, noise and settings."""


def _train_job(job: tuple[str, str]) -> tuple[str, str, ArmResult]:
    view, name = job
    shared = _WORKER_STATE
    return (
        view,
        name,
        train_arm(
            ARMS[name],
            view,
            shared["tables"],
            shared["settings"],
            shared["noise"],
            shared["evaluations"],
            shared["initial_success"],
        ),
    )


def _pool(workers: int):
    """A pool of forked workers, or None to work in this process (one worker, or no fork here)."""
    import multiprocessing

    if workers <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork").Pool(workers)


# ---- summary ----------------------------------------------------------------------------------------


PRIMARY_MEASURE = "final_success"
"""What the testbed's comparisons test, declared before its runs: each arm's exact success on its
trained tasks after the last update, paired by seed against its baseline (``Arm.baseline``), in the
``equal`` view. A tabular policy has no held-out task to play and its success is computed exactly
(no sampling noise), so the exact final success stands where the LLM benchmarks use greedy held-out
success. Every arm against its baseline in every environment run is one family, Holm-corrected
(``paired_stats.adjust_family``); the ``raw`` view and the comparisons with ``Arm.reference`` are
reported beside it and never called significant."""
PRIMARY_VIEW = "equal"


def add_primary(envs: dict[str, dict[str, Any]]) -> None:
    """Give every primary comparison (each arm against its baseline in the primary view, in every
    environment of ``envs``) its Holm-adjusted p-values, family interval and verdict."""
    family = {
        (env, arm): PairedDifference(**{f.name: entry["vs_baseline"][f.name] for f in fields(PairedDifference)})
        for env, data in envs.items()
        for arm, entry in data["views"][PRIMARY_VIEW].items()
        if "vs_baseline" in entry
    }
    for (env, arm), adjusted in (adjust_family(family) if family else {}).items():
        envs[env]["views"][PRIMARY_VIEW][arm]["primary"] = {
            "measure": PRIMARY_MEASURE,
            **adjusted.as_dict(),
            "significant": adjusted.significant(),
        }


def summarize_env(results: dict[str, dict[str, ArmResult]], evaluations: list[int]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for view, arms in results.items():
        summary[view] = {}
        for name, result in arms.items():
            final = result.success[:, -1]
            mean, half = mean_interval(final)
            curve = [mean_interval(result.success[:, i]) for i in range(result.success.shape[1])]
            entry = {
                "final_success": {"mean": mean, "ci95": half},
                "curve": {"updates": evaluations, "mean": [c[0] for c in curve], "ci95": [c[1] for c in curve]},
                "raw_mean_abs_advantage": float(np.mean(result.raw_abs_advantage)),
                "grouped_fraction": float(np.mean(result.grouped_fraction)),
                "mean_anchor_group_size": float(np.mean(result.mean_group_size)),
                "per_seed_final_success": final.tolist(),
            }
            baseline, reference = ARMS[name].baseline, ARMS[name].reference
            if baseline != name:
                entry["vs_baseline"] = {
                    "baseline": baseline,
                    **paired_difference(final, arms[baseline].success[:, -1]).as_dict(),
                }
            if reference in arms:
                entry["vs_reference"] = {
                    "reference": reference,
                    **paired_difference(final, arms[reference].success[:, -1]).as_dict(),
                }
            summary[view][name] = entry
    return summary


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    settings = summary["settings"]
    lines = [
        f"Credit testbed: {settings['seeds']} paired seeds x {settings['tasks']} tasks, {settings['updates']} "
        f"updates, lr {settings['lr']}. Success is the exact sampled success on the trained tasks after the last "
        "update (percent); differences are paired per seed against the baseline (points).",
        "",
    ]
    for env, data in summary["envs"].items():
        states = data["states_per_task"]
        lines += [
            f"### {env}",
            "",
            f"{data['description']}. States per task: {states['mean']:.0f} (min {states['min']}, "
            f"max {states['max']}); uniform-policy success {100 * data['uniform_success']:.1f}%.",
            "",
        ]
        for view, arms in data["views"].items():
            title = "Equal mean |A| per batch (primary view)" if view == "equal" else "Raw advantage scale"
            lines += [
                f"{title}:",
                "",
                "| arm | final success (95% CI) | difference vs baseline (95% CI) | Wilcoxon p | wins/losses "
                "| difference vs reference (95% CI), p | rows in anchor groups >= 2 | raw mean abs(A) |",
                "|---|---|---|---|---|---|---|---|",
            ]
            for arm, r in arms.items():
                diff, ref = r.get("vs_baseline"), r.get("vs_reference")
                cells = (
                    ("-", "-", "-")
                    if diff is None
                    else (
                        f"{100 * diff['mean']:+.1f} [{100 * diff['ci_low']:+.1f}, {100 * diff['ci_high']:+.1f}] vs "
                        f"{diff['baseline']}",
                        f"{diff['wilcoxon_p']:.2g}",
                        f"{diff['wins']}/{diff['losses']}",
                    )
                )
                versus = (
                    "-"
                    if ref is None
                    else (
                        f"{100 * ref['mean']:+.1f} [{100 * ref['ci_low']:+.1f}, {100 * ref['ci_high']:+.1f}] vs "
                        f"{ref['reference']}, "
                        f"{ref['wilcoxon_p']:.2g}"
                    )
                )
                lines.append(
                    f"| {arm} | {100 * r['final_success']['mean']:.1f} ± {100 * r['final_success']['ci95']:.1f} | "
                    f"{' | '.join(cells)} | {versus} | {100 * r['grouped_fraction']:.0f}% | "
                    f"{r['raw_mean_abs_advantage']:.3f} |"
                )
            lines.append("")
    primary = [
        (env, arm, r["vs_baseline"]["baseline"], r["primary"])
        for env, data in summary["envs"].items()
        for arm, r in data["views"][PRIMARY_VIEW].items()
        if "primary" in r
    ]
    if primary:
        lines += [
            f"### Primary comparisons ({PRIMARY_MEASURE}, {PRIMARY_VIEW} view, Holm over the "
            f"{primary[0][3]['family_size']} declared comparisons)",
            "",
            "| environment | arm | vs | difference (95% CI) | t p | Holm t p | Holm Wilcoxon p | family interval "
            "| verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for env, arm, baseline, d in primary:
            verdict = ("better" if d["mean"] > 0 else "worse") if d["significant"] else "no difference shown"
            lines.append(
                f"| {env} | {arm} | {baseline} | {100 * d['mean']:+.1f} [{100 * d['ci_low']:+.1f}, "
                f"{100 * d['ci_high']:+.1f}] | {d['t_p']:.2g} | {d['holm_t_p']:.2g} | {d['holm_wilcoxon_p']:.2g} | "
                f"[{100 * d['adjusted_ci_low']:+.1f}, {100 * d['adjusted_ci_high']:+.1f}] | {verdict} |"
            )
        lines.append("")
    path.write_text("\n".join(lines))


def plot(summary: dict[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    envs = summary["envs"]
    colors = {arm: plt.cm.tab20(i % 20) for i, arm in enumerate(ARMS)}
    for env, data in envs.items():
        fig, axes = plt.subplots(1, len(data["views"]), figsize=(6 * len(data["views"]), 4.2), squeeze=False)
        for ax, (view, arms) in zip(axes[0], data["views"].items()):
            for arm, r in arms.items():
                mean, half = np.array(r["curve"]["mean"]), np.array(r["curve"]["ci95"])
                ax.plot(
                    r["curve"]["updates"],
                    100 * mean,
                    label=arm,
                    marker=".",
                    color=colors[arm],
                    linestyle="--" if ARMS[arm].group_size > 4 else "-",
                )
                ax.fill_between(
                    r["curve"]["updates"], 100 * (mean - half), 100 * (mean + half), alpha=0.1, color=colors[arm]
                )
            ax.set_title(f"{env}: {'equal mean |A|' if view == 'equal' else 'raw advantage scale'}")
            ax.set_xlabel("update")
            ax.set_ylabel("exact sampled success on the trained tasks (%)")
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, ncol=2)
        fig.tight_layout()
        paths.append(out / f"success_{env}.png")
        fig.savefig(paths[-1], dpi=110)
        plt.close(fig)
    fig, axes = plt.subplots(1, len(envs), figsize=(4.5 * len(envs), 5), squeeze=False)
    for ax, (env, data) in zip(axes[0], envs.items()):
        names = [arm for arm in data["views"]["equal"] if "vs_baseline" in data["views"]["equal"][arm]]
        for offset, color, (view, arms) in zip((-0.15, 0.15), ("C0", "C1"), data["views"].items()):
            diffs = [arms[arm]["vs_baseline"] for arm in names]
            means = np.array([100 * d["mean"] for d in diffs])
            errors = np.array([[100 * (d["mean"] - d["ci_low"]), 100 * (d["ci_high"] - d["mean"])] for d in diffs]).T
            ax.errorbar(
                means,
                np.arange(len(names)) + offset,
                xerr=errors,
                fmt="o",
                color=color,
                markersize=4,
                capsize=2,
                label="equal mean |A|" if view == "equal" else "raw scale",
            )
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_title(env)
        ax.set_xlabel("final success minus baseline (points)")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Paired differences against GRPO at the same group size (95% t-intervals)")
    fig.tight_layout()
    paths.append(out / "paired_differences.png")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


# ---- main -------------------------------------------------------------------------------------------


def run(settings: Settings, out: Path, progress=None) -> dict[str, Any]:
    """Explore, train every arm under both views, write the outputs; returns the summary."""
    start, cpu_start = time.perf_counter(), sum(os.times()[:4])  # this process and its finished workers
    arms = with_baselines(settings.arms)
    for name in arms:  # bad arm settings fail here, before any work
        ARMS[name].algorithm()
    summary: dict[str, Any] = {
        "settings": {
            **vars(settings),
            "arms": list(arms),
            "envs": list(settings.envs),
            "views": list(VIEWS),
            "advantage_target_mean_abs": 1.0,
        },
        "arms": {
            name: {
                "algo": ARMS[name].algo,
                "anchor": ARMS[name].anchor,
                "history_turns": ARMS[name].history_turns,
                "group_size": ARMS[name].group_size,
                "baseline": ARMS[name].baseline,
                "reference": ARMS[name].reference,
            }
            for name in arms
        },
        "envs": {},
    }
    for env_index, env_name in enumerate(settings.envs):
        spec = ENVIRONMENTS[env_name]
        env_arms = [arm for arm in arms if arm not in spec.skip_arms]
        keep_observations = any(ARMS[arm].anchor == "similarity" for arm in env_arms)
        env_start = time.perf_counter()
        jobs = [
            (env_name, task_seed(seed, task, settings.tasks), keep_observations)
            for seed in range(settings.seeds)
            for task in range(settings.tasks)
        ]
        task = progress.add_task(f"{env_name}: exploring task state graphs", total=len(jobs)) if progress else None
        pool = _pool(settings.workers)
        graphs = []
        for graph in pool.imap(explore_task, jobs, chunksize=8) if pool else map(explore_task, jobs):
            graphs.append(graph)
            if progress:
                progress.advance(task)
        if pool:
            pool.close()
            pool.join()
        tables = build_tables(graphs)
        states = np.array([len(g.anchors) for g in graphs])
        del graphs
        explore_s = time.perf_counter() - env_start
        evaluations = evaluation_points(settings, spec)
        initial_success = per_seed(success_probability(tables, initial_logits(tables)), settings)
        _WORKER_STATE.update(
            tables=tables,
            settings=settings,
            evaluations=evaluations,
            initial_success=initial_success,
            noise=common_noise(settings, env_index, tables.max_steps),
        )
        jobs = [(view, name) for view in VIEWS for name in env_arms]
        if progress:
            progress.update(task, description=f"{env_name}: training arms x views", completed=0, total=len(jobs))
        pool = _pool(settings.workers)  # forked now, so the workers see this environment's tables
        results: dict[str, dict[str, ArmResult]] = {view: {} for view in VIEWS}
        for view, name, result in pool.imap_unordered(_train_job, jobs) if pool else map(_train_job, jobs):
            results[view][name] = result
            if progress:
                progress.advance(task)
        if pool:
            pool.close()
            pool.join()
        results = {view: {name: results[view][name] for name in env_arms} for view in VIEWS}
        summary["envs"][env_name] = {
            "env_id": spec.env_id,
            "kwargs": spec.kwargs,
            "description": spec.description,
            "skipped_arms": [arm for arm in arms if arm in spec.skip_arms],
            "states_per_task": {"mean": float(states.mean()), "min": int(states.min()), "max": int(states.max())},
            "uniform_success": float(initial_success.mean()),
            "explore_s": explore_s,
            "train_s": time.perf_counter() - env_start - explore_s,
            "views": summarize_env(results, evaluations),
        }
        _WORKER_STATE.clear()
    add_primary(summary["envs"])
    summary["wall_s"] = time.perf_counter() - start
    summary["cpu_s"] = sum(os.times()[:4]) - cpu_start
    summary["machine"] = machine_info()
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "summary.json", summary)
    write_markdown(summary, out / "summary.md")
    plot(summary, out)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run: few seeds, tasks, updates and arms")
    parser.add_argument("--envs", help=f"comma-separated subset of: {', '.join(ENVIRONMENTS)}")
    parser.add_argument("--arms", help=f"comma-separated subset of: {', '.join(ARMS)} (their baselines are added)")
    parser.add_argument("--seeds", type=int, help="paired seeds (default 128; --quick 6)")
    parser.add_argument("--workers", type=int, help="worker processes (default 2; --quick 1)")
    parser.add_argument("--out", type=Path, help="output directory")
    args = parser.parse_args(argv)
    settings = QUICK if args.quick else Settings()
    overrides: dict[str, Any] = {}
    try:
        if args.envs:
            overrides["envs"] = select_names("environment", args.envs.split(","), ENVIRONMENTS)
        if args.arms:
            overrides["arms"] = select_names("arm", args.arms.split(","), ARMS)
        for name in ("seeds", "workers"):
            value = getattr(args, name)
            if value is not None and value < {"seeds": 2, "workers": 1}[name]:
                raise ValueError(f"--{name} must be >= {({'seeds': 2, 'workers': 1})[name]}, got {value}")
            if value is not None:
                overrides[name] = value
    except ValueError as exc:
        parser.error(str(exc))
    settings = Settings(**{**vars(settings), **overrides})
    out = args.out or RESULTS_DIR / ("credit_testbed_quick" if args.quick else "credit_testbed")
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as progress:
        run(settings, out, progress)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
