"""Trajectory-only vs step-level credit with the LLM policy: a gated grid of paired seeds.

Every cell (environment, method, seed) trains from the warm start of its (environment, seed), which
all methods share, with the same seed stream and the same held-out evaluation episodes (common random
numbers), so the per-seed difference between a method and the baseline is what is tested. The warm
start's run evaluates it once (iteration 0, shared by the seed's cells, which skip that evaluation).

**Pilot gate.** Before any comparison on an environment, its pilot (the baseline cell of the first
seed) must gain at least ``--gate`` points of greedy held-out success over its warm start: the mean of
its last two evaluations minus its iteration-0 evaluation. If it does not, no other cell of that environment is
trained and the report says so. An environment marked ungated runs every seed whatever its pilot
shows. The report gives the pilot's verdict and applies the gate's rule to the baseline on every seed.

    python -m agent_rl.benchmarks.credit_assignment            # the full grid
    python -m agent_rl.benchmarks.credit_assignment --quick    # a tiny grid in a few minutes (the test suite runs it)
    agent-rl bench credit [--quick] [--envs maze] [--methods gigpo-state] [--seeds 10] [--workers 2]
                          [--gate 15] [--out DIR] [--report]

Cells run as ``agent-rl train`` processes, ``--workers`` at a time with one torch thread each.
Finished cells are skipped on a rerun and a cell killed midway resumes from its last checkpoint; in a
fresh clone of committed results (no checkpoints), a seed with cells left to train gets its warm start
trained again, which must log the evaluation recorded before (``adopt_rebuild``). A
results directory whose cells were trained with other settings is refused, never reused.
``--report`` writes the report on the cells finished so far (a grid in progress) and trains nothing.

Outputs under ``--out`` (default ``benchmarks/results/credit_grid2``): per cell ``runs/<env>/<method>/seed<k>/``
(``metrics.jsonl``, ``config.yaml``, ``settings.json``; checkpoints are not committed), ``summary.json``,
``summary.md``, ``success_<env>.png`` (curves) and ``paired_<env>.png`` (per-seed differences).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, stopped, write_json
from agent_rl.benchmarks.credit_testbed import select_names
from agent_rl.benchmarks.harness import (
    RunFailed,
    adopt_rebuilt_warm_start,
    finished,
    run_jobs,
    thread_environment,
    train_command,
)
from agent_rl.benchmarks.paired_stats import PairedDifference, adjust_family, paired_difference
from agent_rl.benchmarks.report import (
    area_under,
    logged,
    mean_plus_minus,
    mean_with_interval,
    p_value,
    plot_curves,
    plot_paired,
    seed_mean,
)


@dataclass(frozen=True)
class Environment:
    name: str
    description: str
    overrides: tuple[str, ...]
    """Config overrides shared by every method of this environment."""
    methods: tuple[str, ...]
    """Methods in the grid; the first is the baseline every other one is paired with."""
    gated: bool = True
    """Whether the pilot's gate decides if the rest of this environment runs."""


METHODS: dict[str, tuple[str, ...]] = {
    "trajectory": ("algo.step_credit=none",),
    "gigpo-state": ("algo.step_credit=anchor", "env.anchor_key=state"),
    "gigpo-context": ("algo.step_credit=anchor", "env.anchor_key=context"),
    "gigpo-observation": ("algo.step_credit=anchor", "env.anchor_key=observation"),
    "gigpo-fingerprint": ("algo.step_credit=anchor", "env.anchor_key=fingerprint"),
    "graph-state": ("algo.step_credit=graph", "env.anchor_key=state"),
    "graph-observation": ("algo.step_credit=graph", "env.anchor_key=observation"),
    "graph-fingerprint": ("algo.step_credit=graph", "env.anchor_key=fingerprint"),
}
"""Each method is config overrides on top of its environment's. Every method trains with the library's
learner (the ``gigpo`` preset's Dr.GRPO mean-centred episode advantages and GSPO-token ratio, and the
learner defaults) and differs in step credit alone: ``trajectory`` has none (trajectory-only credit),
the GiGPO methods add anchor credit, the graph methods graph credit."""

# Every cell: the hf engine, one torch thread (results do not depend on --workers), no early stop,
# greedy and sampled evaluation; otherwise the library's learner defaults.
COMMON = (
    "engine=hf",
    "trainer.torch_threads=1",
    "trainer.target_success=null",
    "trainer.eval_sampled=true",
    "logging.tensorboard=false",
    "logging.console=false",
)


# The grid's environment, chosen by pilots of trajectory-only credit with the library's learner on
# seeds 100-104, none of them a grid seed (benchmarks/results/credit_pilots/combination_trajectory/):
# from the random-action warm start, with four dials it reached 100% greedy success on 4 of 5 seeds
# within 16 iterations (the fifth stayed at 3.1%); with six dials (random play wins 1/64) it learned
# on none. Step credit has room to add on four dials: trajectory-only credit gives the right turns of
# a lost episode the same blame as its wrong one, where an anchor state (a dial showing a symbol)
# recurs in every group. 30 iterations with an evaluation every 2 (16 points on each curve) give the
# slower seeds time to learn and the AUC the resolution to show speed; a cell takes a few minutes.
# Ungated: the pilots' baseline learned on 4 of 5 seeds, so one seed's verdict would stop the grid
# about one time in five; what counts is on how many of the 10 seeds it learned, which the report gives.
def combination_overrides(env_id: str) -> tuple[str, ...]:
    """A combination lock from a random-action warm start, no history turn (the observation shows
    the current dial), 30 iterations evaluated every 2 on 128 held-out episodes."""
    return (
        f"env.id=benchmarks.lift_envs:{env_id}",
        "rollout.history_turns=0",
        "sft.mode=random",
        "trainer.iterations=30",
        "trainer.eval_every=2",
        "trainer.eval_episodes=128",
    )


# The branching lock joined the grid after the first environment's results, declared before any of
# its runs (credit_grid2/PLAN.md, amendment): on Combination every trajectory of a group passes the
# same dials, so an anchor group is the whole group and GiGPO's step term repeats the episode term.
# In the branching lock a turn decides which dial comes next, so the trajectories of a group part
# ways and their later states differ. Its pilots of trajectory-only credit ran on seeds 100-104
# (benchmarks/results/credit_pilots/branching_trajectory/).
FULL_GRID = (
    Environment(
        "combination",
        "lift/Combination-v0 (four dials, each turned up or down by a table the text never shows, one reward at "
        "the end; random play wins 1/16) from a random-action warm start",
        combination_overrides("lift/Combination-v0"),
        ("trajectory", "gigpo-observation", "graph-observation"),
        gated=False,
    ),
    Environment(
        "branching",
        "lift/BranchingCombination-v0 (the same lock, its dials a binary tree: each turn decides which dial comes "
        "next; random play wins 1/16) from a random-action warm start",
        combination_overrides("lift/BranchingCombination-v0"),
        ("trajectory", "gigpo-observation", "graph-observation"),
        gated=False,
    ),
)
FULL_SEEDS = 10

QUICK_GRID = (
    Environment(
        "maze",
        "a 2-room Maze, 4 steps (a smoke test of the pipeline)",
        (
            "env.id=agent_rl/Maze-v0",
            "env.kwargs={n_rooms: 2, n_locked_doors: 0, dead_ends: 0, extra_edges: 0, n_distractors: 0, max_steps: 4}",
            "rollout.n_groups=2",
            "rollout.group_size=2",
            "rollout.max_turns=3",
            "rollout.history_turns=0",
            "rollout.max_new_tokens=8",
            "rollout.min_batch_rows=0",
            "sft.mode=oracle",
            "sft.steps=2",
            "sft.episodes=2",
            "sft.batch_size=4",
            "optim.minibatch_size=4",
            "optim.epochs=1",
            "trainer.iterations=2",
            "trainer.eval_every=1",
            "trainer.eval_episodes=2",
            "optim.micro_batch_size=8",
        ),
        ("trajectory", "gigpo-state", "graph-state"),
    ),
)
QUICK_SEEDS = 2

GATE_POINTS = 15.0
"""Points of greedy success the pilot must gain over its warm start before a comparison runs."""


class MixedSettingsError(RuntimeError):
    """A results directory holds a run trained with settings other than the grid's."""


# ---- jobs, settings and the gate ------------------------------------------------------------------


@dataclass
class Job:
    """One ``agent-rl train`` run: a warm start (``method`` None) or a cell."""

    env: Environment
    seed: int
    method: str | None
    run_dir: Path
    warm_start: Job | None = None
    rebuilds: Job | None = None
    """For a warm start trained again: the finished warm start whose checkpoint it recreates."""

    @property
    def name(self) -> str:
        return f"{self.env.name} / {self.method or 'warm start'} / seed {self.seed}"

    @property
    def done(self) -> bool:
        return finished(self.run_dir, self.iterations)

    @property
    def lacks_model(self) -> bool:
        """A finished warm start without its checkpoint, as in a fresh clone of committed results
        (checkpoints are not committed): the seed's cells still to train need it trained again."""
        return self.method is None and not (self.run_dir / "checkpoints").is_dir() and self.done

    @cached_property
    def iterations(self) -> int:
        return 0 if self.method is None else config_of(self).trainer.iterations

    def overrides(self) -> list[str]:
        """The job's config overrides, without its run directory and start model (which move with ``--out``)."""
        if self.method is None:  # its iteration-0 evaluation is every cell's of the seed
            return [*COMMON, *self.env.overrides, f"trainer.seed={self.seed}", "trainer.iterations=0"]
        return [
            *COMMON,
            *self.env.overrides,
            *METHODS[self.method],
            "sft.mode=none",
            f"trainer.seed={self.seed}",
            "trainer.eval_first=false",
        ]

    def command(self) -> list[str]:
        overrides = [*self.overrides(), f"trainer.run_dir={self.run_dir}"]
        if self.warm_start is not None:
            from agent_rl.training.infra import checkpoint

            overrides.append(f"policy={checkpoint.find_checkpoint(self.warm_start.run_dir, 'sft').model_dir}")
        return train_command(overrides)

    def environment(self) -> dict[str, str]:
        return thread_environment(1)


def config_of(job: Job):
    from agent_rl.config import load_default_config

    return load_default_config(job.overrides())  # what ``agent-rl train`` trains with


MOVING_SETTINGS = ("trainer.run_dir", "policy.name_or_path")
"""Settings that move with ``--out`` (the run directory and the warm start's path), never compared."""


def settings_of(job: Job) -> dict[str, Any]:
    """Every config value the job trains with (defaults included, so a changed default shows), as
    dotted keys, the way JSON gives them back."""
    from agent_rl.config import config_to_dict
    from agent_rl.training.infra.checkpoint import flatten_config

    flat = json.loads(json.dumps(flatten_config(config_to_dict(config_of(job)))))
    return {key: value for key, value in flat.items() if key not in MOVING_SETTINGS}


def added_since(key: str, recorded: dict[str, Any], wanted: dict[str, Any]) -> bool:
    """Whether ``key`` is a config key added after the run was recorded, at its default: new keys
    default to what the code did before they existed, so such a run trained with that value."""
    from agent_rl.config import Config, config_to_dict
    from agent_rl.training.infra.checkpoint import flatten_config

    defaults = json.loads(json.dumps(flatten_config(config_to_dict(Config()))))
    return key not in recorded and key in defaults and wanted.get(key) == defaults[key]


def check_settings(job: Job, *, record: bool = False) -> None:
    """Check the job's settings against those recorded in its run directory (if any); ``record``
    writes them there when none are."""
    from agent_rl.training.infra.checkpoint import config_differences

    path = job.run_dir / "settings.json"
    wanted = settings_of(job)
    if not path.exists():
        if job.run_dir.exists() and any(job.run_dir.iterdir()):
            raise MixedSettingsError(
                f"{job.run_dir} holds a run with no settings.json; move it away or use another --out"
            )
        if record:
            job.run_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(wanted, indent=1, sort_keys=True) + "\n")
        return
    recorded = json.loads(path.read_text())
    changed = [
        key for key in config_differences(recorded, wanted, MOVING_SETTINGS) if not added_since(key, recorded, wanted)
    ]
    if changed:
        shown = "; ".join(f"{key}: {recorded.get(key)!r} there, {wanted.get(key)!r} now" for key in changed[:6])
        raise MixedSettingsError(
            f"{job.run_dir} was trained with other settings ({len(changed)} differ: {shown}). Results of different "
            "settings are never mixed: use another --out, or delete that directory to retrain it."
        )


def cell_records(job: Job) -> list[dict]:
    """A cell's metrics with its iteration 0 as its warm start's run logged it (with the evaluation the
    seed's cells share; the cell itself skips it)."""
    from agent_rl.training.infra.logger import read_metrics

    return [read_metrics(job.warm_start.run_dir)[0], *read_metrics(job.run_dir)[1:]]


def evaluations(records: list[dict]) -> list[dict]:
    """The records that hold a sampled evaluation, in order."""
    return [r for r in records if r.get("eval/sampled_success") is not None]


@dataclass(frozen=True)
class Gate:
    env: str
    start: float
    """Greedy success of the warm start (the pilot's iteration 0)."""
    end: float
    """Mean greedy success of the pilot's last two evaluations."""
    points: float
    """The gain needed, in points."""
    binding: bool = True
    """Whether a failed gate stops the environment (False for an ungated one)."""

    @property
    def gain(self) -> float:
        return 100.0 * (self.end - self.start)

    @property
    def passed(self) -> bool:
        return self.gain >= self.points

    def describe(self) -> str:
        failed = "failed: no comparison was run" if self.binding else "not met; this environment runs ungated"
        verdict = "passed" if self.passed else failed
        return (
            f"pilot gate {verdict} (the baseline went from {100 * self.start:.1f}% to {100 * self.end:.1f}% "
            f"greedy success, {self.gain:+.1f} points; {self.points:g} needed)"
        )


def gate_ends(greedy: Sequence[float]) -> tuple[float, float]:
    """What the gate compares on a greedy-success curve: its start (iteration 0) and the mean of its
    last two evaluations."""
    return float(greedy[0]), float(np.mean(greedy[-2:]))


def pilot_gate(env: str, records: list[dict], points: float, binding: bool = True) -> Gate:
    """The gate on a finished pilot's metrics: last two evaluations' mean against iteration 0."""
    evals = evaluations(records)
    if len(evals) < 3 or evals[0]["iteration"] != 0:
        raise ValueError(
            f"{env}: the pilot needs its iteration-0 evaluation and two more, got {len(evals)} evaluations"
        )
    return Gate(env, *gate_ends([r["eval/greedy_success"] for r in evals]), points, binding)


# ---- running ------------------------------------------------------------------------------------------


def plan(grid: tuple[Environment, ...], seeds: int, out: Path) -> dict[str, list[Job]]:
    """Per environment: the warm starts and cells in the order they run (seed by seed, the pilot first)."""
    jobs: dict[str, list[Job]] = {}
    for env in grid:
        env_jobs = []
        for seed in range(seeds):
            warm = Job(env, seed, None, out / "sft" / env.name / f"seed{seed}")
            env_jobs += [
                warm,
                *(
                    Job(env, seed, method, out / "runs" / env.name / method / f"seed{seed}", warm)
                    for method in env.methods
                ),
            ]
        jobs[env.name] = env_jobs
    return jobs


def pilot_of(env_jobs: list[Job]) -> Job:
    """An environment's pilot: the baseline cell of its first seed (right after that seed's warm start)."""
    return env_jobs[1]


def launch_order(env_jobs: list[Job]) -> list[Job]:
    """The order in which ready jobs start: every warm start before any cell (seed by seed within
    each), so once the gate has passed no worker sits idle waiting for a seed's warm start."""
    return sorted(env_jobs, key=lambda job: job.warm_start is not None)


def finished_gates(jobs: dict[str, list[Job]], gate_points: float) -> dict[str, Gate]:
    """The gates of the environments whose pilot has finished."""
    return {
        name: pilot_gate(name, cell_records(pilot_of(env_jobs)), gate_points, env_jobs[0].env.gated)
        for name, env_jobs in jobs.items()
        if pilot_of(env_jobs).done
    }


def rebuilds_needed(pending: list[Job]) -> list[Job]:
    """Warm starts to train again: those that lack their checkpoint while a cell of theirs is pending."""
    lacking = {
        id(job.warm_start): job.warm_start
        for job in pending
        if job.warm_start is not None and job.warm_start.lacks_model
    }
    return [Job(warm.env, warm.seed, None, warm.run_dir / "rebuild", rebuilds=warm) for warm in lacking.values()]


def adopt_rebuild(job: Job) -> None:
    """Give a finished rebuild's checkpoint to the warm start it recreates, once it logs the recorded
    iteration-0 evaluation (otherwise the seed's later cells would not share their warm start with
    its earlier ones)."""
    adopt_rebuilt_warm_start(
        job.run_dir,
        job.rebuilds.run_dir,
        job.name,
        "the seed's cells would not share one warm start. Retrain the whole seed: delete its warm start's and "
        "cells' directories.",
    )


def run_grid(jobs: dict[str, list[Job]], *, workers: int, gate_points: float, progress) -> dict[str, Gate]:
    """Train every job not done yet, ``workers`` at a time; after each environment's pilot, its gate
    decides whether the rest of that environment runs. Returns the gates."""
    for job in (job for env_jobs in jobs.values() for job in env_jobs):
        check_settings(job)  # before anything trains, so a mismatch costs nothing
    gates = finished_gates(jobs, gate_points)
    order = []
    for env_jobs in jobs.values():
        pending = [job for job in env_jobs if not job.done]
        order += launch_order(rebuilds_needed(pending) + env_jobs)

    def ready(job: Job) -> bool:
        pilot = pilot_of(jobs[job.env.name])
        pilots_warm_start = job.method is None and job.seed == pilot.seed
        gated = job.env.gated and job is not pilot and not pilots_warm_start
        warm = job.warm_start
        return (warm is None or not warm.lacks_model) and (not gated or job.env.name in gates)

    def wanted(job: Job) -> bool:
        gate = gates.get(job.env.name)
        return gate is None or gate.passed or not gate.binding

    def on_finish(job: Job) -> None:
        if job.rebuilds is not None:
            adopt_rebuild(job)
        if job is pilot_of(jobs[job.env.name]):
            gates.update(finished_gates({job.env.name: jobs[job.env.name]}, gate_points))

    run_jobs(
        order,
        workers=workers,
        progress=progress,
        title="grid",
        needs=lambda job: (job.warm_start,) if job.warm_start else (),
        ready=ready,
        wanted=wanted,
        on_start=lambda job: check_settings(job, record=True),
        on_finish=on_finish,
    )
    return gates


# ---- summaries -----------------------------------------------------------------------------------------


def cell_summary(records: list[dict]) -> dict[str, Any]:
    """Curves and scalar metrics of one finished cell."""
    evals = evaluations(records)
    iterations = np.array([r["iteration"] for r in evals], dtype=np.float64)
    sampled = np.array([r["eval/sampled_success"] for r in evals])
    greedy = np.array([r["eval/greedy_success"] for r in evals])
    trained = [r for r in records if r["iteration"] > 0]

    def mean_of(key: str) -> float | None:
        values = logged(trained, key)
        return float(np.mean(values)) if values else None

    phases = {p: mean_of(f"time/{p}") or 0.0 for p in ("rollout", "advantage", "update", "sync")}
    start, end = gate_ends(greedy)
    return {
        "gain_points": 100.0 * (end - start),
        "iterations": iterations.tolist(),
        "sampled_success": sampled.tolist(),
        "greedy_success": greedy.tolist(),
        "sampled_auc": area_under(iterations, sampled),
        "greedy_auc": area_under(iterations, greedy),
        "final_sampled_success": float(sampled[-1]),
        "final_greedy_success": float(greedy[-1]),
        "final_invalid_rate": float(evals[-1]["eval/sampled_invalid_rate"]),
        "final_episode_length": float(evals[-1]["eval/sampled_length"]),
        "train_invalid_rate": mean_of("rollout/invalid_rate"),
        "grouped_fraction": mean_of("anchors/grouped_fraction"),
        "mean_anchor_group_size": mean_of("anchors/mean_group_size"),
        "credit_share_of_iteration": phases["advantage"] / sum(phases.values()) if sum(phases.values()) else 0.0,
        "training_seconds": float(records[-1]["time/elapsed"]),
    }


PAIRED_METRICS = (
    "greedy_auc",
    "sampled_auc",
    "final_greedy_success",
    "final_sampled_success",
    "final_invalid_rate",
    "final_episode_length",
)
"""Per-seed metrics compared by paired differences."""
PRIMARY_MEASURE = "greedy_auc"
"""What the grid's comparisons test, declared before any of its runs: the AUC of greedy held-out
success (the measure the library's targets and the lift benchmark use), paired by seed; the AUC
rather than the final value because step credit is expected to change how fast a policy learns,
which a final value taken after both methods have learned does not show. Every method against its
environment's baseline, in every environment the summary holds, is one family, Holm-corrected
(``paired_stats.adjust_family``); the other measures are reported beside it and never called
significant."""
SECONDARY_AUC = "sampled_auc"
"""The other success curve's AUC, shown beside the primary measure."""
MEASURE_NAMES = {"greedy_auc": "greedy AUC", "sampled_auc": "sampled AUC"}


def interval(difference: dict[str, float]) -> str:
    """A paired difference as points with its 95% interval: ``+1.2 [-0.3, +2.7]``."""
    return mean_with_interval(
        {**{key: 100 * difference[key] for key in ("mean", "ci_low", "ci_high")}, "n": difference["n"]}
    )


def summarize(jobs: dict[str, list[Job]], gates: dict[str, Gate], gate_points: float = GATE_POINTS) -> dict[str, Any]:
    """Per environment: the gate, per-method cell summaries and means, and every method's paired
    differences against the baseline over the seeds where both finished. The pilot's gate is one
    seed's; the baseline's gain by the gate's rule on every seed says where it learned, and where it
    did not on some, the AUC differences on the seeds where it did are reported too (a sensitivity
    check, chosen after the fact)."""
    from agent_rl.training.infra.logger import read_metrics

    summary: dict[str, Any] = {}
    family: dict[tuple[str, str], PairedDifference] = {}
    for name, env_jobs in jobs.items():
        env = env_jobs[0].env
        cells = {
            m: {job.seed: cell_summary(cell_records(job)) for job in env_jobs if job.method == m and job.done}
            for m in env.methods
        }
        learned_seeds = sorted(s for s, cell in cells[env.methods[0]].items() if cell["gain_points"] >= gate_points)
        methods = {}
        for method, seeds in cells.items():
            result: dict[str, Any] = {"seeds": seeds}
            if seeds:
                for key in (
                    *PAIRED_METRICS,
                    "train_invalid_rate",
                    "grouped_fraction",
                    "mean_anchor_group_size",
                    "credit_share_of_iteration",
                ):
                    values = [s[key] for s in seeds.values() if s[key] is not None]
                    result[key] = seed_mean(values) if values else None
                curves = np.array([s["sampled_success"] for s in seeds.values()])
                result["curve"] = {
                    "iterations": next(iter(seeds.values()))["iterations"],
                    "sampled_mean": curves.mean(0).tolist(),
                    "greedy_mean": np.array([s["greedy_success"] for s in seeds.values()]).mean(0).tolist(),
                }
            baseline = cells[env.methods[0]]
            paired = sorted(set(seeds) & set(baseline))

            def difference(key: str, on: list[int]) -> PairedDifference:
                return paired_difference(
                    np.array([seeds[s][key] for s in on]), np.array([baseline[s][key] for s in on])
                )

            def reported(key: str, on: list[int], found: PairedDifference) -> dict[str, Any]:
                return {**found.as_dict(), "per_seed": [seeds[s][key] - baseline[s][key] for s in on]}

            if method != env.methods[0] and len(paired) >= 2:
                differences = {key: difference(key, paired) for key in PAIRED_METRICS}
                result["paired"] = {
                    "seeds": paired,
                    **{key: reported(key, paired, found) for key, found in differences.items()},
                }
                family[(name, method)] = differences[PRIMARY_MEASURE]
                where_learned = [s for s in paired if s in learned_seeds]
                if len(where_learned) >= 2 and where_learned != paired:
                    result["paired_where_baseline_learned"] = {
                        "seeds": where_learned,
                        PRIMARY_MEASURE: reported(
                            PRIMARY_MEASURE, where_learned, difference(PRIMARY_MEASURE, where_learned)
                        ),
                    }
            methods[method] = result
        warm_starts = [read_metrics(job.run_dir) for job in env_jobs if job.method is None and job.done]
        gate = gates.get(name)
        summary[name] = {
            "description": env.description,
            "baseline": env.methods[0],
            "gate": None
            if gate is None
            else {**vars(gate), "gain": gate.gain, "passed": gate.passed, "text": gate.describe()},
            "baseline_gain_points": {seed: cell["gain_points"] for seed, cell in sorted(cells[env.methods[0]].items())},
            "baseline_learned_seeds": learned_seeds,
            "gate_points": gate_points,
            "methods": methods,
            "compute_seconds": {  # as the runs log it, each on one torch thread
                "cells": sum(
                    cell["training_seconds"] for method_cells in cells.values() for cell in method_cells.values()
                ),
                "warm_starts": sum(records[-1]["time/elapsed"] for records in warm_starts),
            },
        }
    for (name, method), adjusted in (adjust_family(family) if family else {}).items():
        summary[name]["methods"][method]["paired"]["primary"] = {
            "measure": PRIMARY_MEASURE,
            **adjusted.as_dict(),
            "significant": adjusted.significant(),
        }
    return summary


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    lines = ["# Trajectory-only vs step-level credit (LLM policy)", ""]
    for name, env in summary.items():
        lines += [f"## {name}", "", f"{env['description']}.", ""]
        lines.append(f"- {env['gate']['text']}." if env["gate"] else "- The pilot has not finished.")
        gains = env["baseline_gain_points"]
        if gains:
            learned = len(env["baseline_learned_seeds"])
            lines.append(
                f"- The baseline's gain by the gate's rule, per seed: "
                f"{', '.join(f'seed {seed} {g:+.1f}' for seed, g in gains.items())} points; "
                f"{env['gate_points']:g} or more on {learned} of {len(gains)} seeds."
            )
        compute, n_cells = env["compute_seconds"], sum(len(r["seeds"]) for r in env["methods"].values())
        lines.append(
            f"- Compute: {n_cells} cells and their warm starts took {sum(compute.values()) / 3600:.2f} core-hours "
            f"(cells {compute['cells'] / 3600:.2f}, warm starts {compute['warm_starts'] / 3600:.2f}), one torch "
            "thread each."
        )
        lines += [
            "",
            f"| method | seeds | {MEASURE_NAMES[PRIMARY_MEASURE]} | vs baseline (95% CI) | Wilcoxon p | wins/losses | "
            f"per-seed difference | {MEASURE_NAMES[SECONDARY_AUC]} vs baseline | final greedy | final sampled | "
            "final invalid rate | training invalid rate | steps in anchor groups >= 2 | credit's share of time |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for method, r in env["methods"].items():
            if not r["seeds"]:
                continue
            paired = r.get("paired")
            if paired:
                primary = paired[PRIMARY_MEASURE]
                versus = (
                    f"{interval(primary)} | {primary['wilcoxon_p']:.2g} | {primary['wins']}/{primary['losses']} | "
                    f"{', '.join(f'{100 * d:+.1f}' for d in primary['per_seed'])} | {interval(paired[SECONDARY_AUC])}"
                )
            else:
                versus = "- | - | - | - | -"
            grouped = "-" if r["grouped_fraction"] is None else f"{100 * r['grouped_fraction']['mean']:.0f}%"
            lines.append(
                f"| {method} | {len(r['seeds'])} | {mean_plus_minus(r[PRIMARY_MEASURE])} | {versus} | "
                f"{mean_plus_minus(r['final_greedy_success'])} | {mean_plus_minus(r['final_sampled_success'])} | "
                f"{mean_plus_minus(r['final_invalid_rate'])} | {mean_plus_minus(r['train_invalid_rate'])} | "
                f"{grouped} | "
                f"{100 * r['credit_share_of_iteration']['mean']:.2f}% |"
            )
        primary = {m: r["paired"]["primary"] for m, r in env["methods"].items() if "primary" in r.get("paired", {})}
        if primary:
            lines += ["", f"The primary measure ({PRIMARY_MEASURE}) over the grid's family of comparisons:", ""]
            for method, p in primary.items():
                verdict = "a difference" if p["significant"] else "no difference shown"
                lines.append(
                    f"- {method}: {100 * p['mean']:+.1f} points; Holm over the {p['family_size']} comparisons: t-test "
                    f"p {p_value(p['holm_t_p'])}, Wilcoxon p {p_value(p['holm_wilcoxon_p'])}, family interval "
                    f"[{100 * p['adjusted_ci_low']:+.1f}, {100 * p['adjusted_ci_high']:+.1f}]: {verdict} at 5% "
                    "family-wise."
                )
        sensitivity = {
            m: r["paired_where_baseline_learned"]
            for m, r in env["methods"].items()
            if "paired_where_baseline_learned" in r
        }
        if sensitivity:
            lines += [
                "",
                f"{MEASURE_NAMES[PRIMARY_MEASURE].capitalize()} vs baseline on the seeds where the baseline gained "
                f"{env['gate_points']:g} points or more "
                "(a sensitivity check, chosen after the fact):",
                "",
                "| method | seeds | vs baseline (95% CI) | Wilcoxon p | per-seed difference |",
                "|---|---|---|---|---|",
            ]
            for method, view in sensitivity.items():
                auc = view[PRIMARY_MEASURE]
                lines.append(
                    f"| {method} | {', '.join(map(str, view['seeds']))} | {interval(auc)} | "
                    f"{auc['wilcoxon_p']:.2g} | {', '.join(f'{100 * d:+.1f}' for d in auc['per_seed'])} |"
                )
        lines.append("")
    lines.append(
        "Success in percent; differences in points, method minus baseline on the same seed. AUC: the mean "
        "height of a success curve over the evaluated iterations."
    )
    path.write_text("\n".join(lines) + "\n")


PLOTTED = ("per_seed", "mean", "ci_low", "ci_high")


def plot(summary: dict[str, Any], out: Path) -> None:
    """Per environment, ``success_<env>.png`` (sampled and greedy success of each method over its seeds)
    and ``paired_<env>.png`` (each method's per-seed difference from the baseline in the primary measure)."""
    for name, env in summary.items():
        methods = {m: r for m, r in env["methods"].items() if r["seeds"]}
        if not methods:
            continue
        panels = {
            f"{kind} success, held-out episodes": {
                method: (r["curve"]["iterations"], [s[f"{kind}_success"] for s in r["seeds"].values()])
                for method, r in methods.items()
            }
            for kind in ("sampled", "greedy")
        }
        plot_curves(out / f"success_{name}.png", panels, "success (mean over seeds, 95% CI)")
        paired = {
            method: {key: np.multiply(100, r["paired"][PRIMARY_MEASURE][key]) for key in PLOTTED}
            for method, r in methods.items()
            if r.get("paired")
        }
        if paired:
            xlabel = f"{MEASURE_NAMES[PRIMARY_MEASURE]} minus {env['baseline']}'s (points): seeds, mean and 95% CI"
            plot_paired(out / f"paired_{name}.png", paired, xlabel)


# ---- command line ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny Maze, 3 methods, 2 seeds, 2 iterations")
    parser.add_argument("--envs", help="comma-separated subset of the grid's environments")
    parser.add_argument("--methods", help="comma-separated subset of the methods (each environment keeps its baseline)")
    parser.add_argument("--seeds", type=int, help=f"paired seeds 0..N-1 (default {FULL_SEEDS}; --quick {QUICK_SEEDS})")
    parser.add_argument(
        "--workers", type=int, default=2, help="cells trained at once, one torch thread each (default 2)"
    )
    parser.add_argument(
        "--gate", type=float, default=GATE_POINTS, help=f"points the pilot must gain (default {GATE_POINTS:g})"
    )
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument(
        "--report", action="store_true", help="write the report on the cells finished so far; train nothing"
    )
    args = parser.parse_args(argv)
    grid, seeds = (QUICK_GRID, QUICK_SEEDS) if args.quick else (FULL_GRID, FULL_SEEDS)
    try:
        if args.envs:
            names = select_names("environment", args.envs.split(","), {env.name: env for env in grid})
            grid = tuple(env for env in grid if env.name in names)
        if args.methods:
            names = select_names("method", args.methods.split(","), {m: m for env in grid for m in env.methods})
            grid = tuple(
                Environment(
                    env.name,
                    env.description,
                    env.overrides,
                    tuple(m for m in env.methods if m == env.methods[0] or m in names),
                )
                for env in grid
            )
        seeds = args.seeds if args.seeds is not None else seeds
        if seeds < 2 or args.workers < 1:
            raise ValueError(
                f"need --seeds >= 2 (paired differences) and --workers >= 1, got {seeds} and {args.workers}"
            )
    except ValueError as exc:
        parser.error(str(exc))
    out = args.out or RESULTS_DIR / ("credit_grid_quick" if args.quick else "credit_grid2")
    out.mkdir(parents=True, exist_ok=True)
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    jobs = plan(grid, seeds, out)
    start = time.perf_counter()
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    try:
        if args.report:
            for job in (job for env_jobs in jobs.values() for job in env_jobs):
                check_settings(job)
            gates = finished_gates(jobs, args.gate)
        else:
            with Progress(*columns) as progress:
                gates = run_grid(jobs, workers=args.workers, gate_points=args.gate, progress=progress)
    except (MixedSettingsError, RunFailed) as exc:
        print(f"credit_assignment: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        return stopped("credit_assignment", exc)
    summary = summarize(jobs, gates, args.gate)
    payload = {
        "machine": machine_info(),
        "quick": args.quick,
        "seeds": seeds,
        "gate_points": args.gate,
        "workers": args.workers,
        "wall_s_of_this_invocation": time.perf_counter() - start,
        "grid": {
            env.name: {"overrides": [*COMMON, *env.overrides], "methods": {m: list(METHODS[m]) for m in env.methods}}
            for env in grid
        },
        "results": summary,
    }
    write_json(out / "summary.json", payload)
    write_markdown(summary, out / "summary.md")
    plot(summary, out)
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
