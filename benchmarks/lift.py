"""What RL adds: held-out success before and after the RL phase, per case and seed.

Every case trains the embedded model as ``agent-rl train`` does without ``--config`` on one
environment (only what the case is about is overridden: the environment, and the warm start where the
case names one): the main job's Maze recipe on the Maze, the library defaults on any other environment. Each
(case, seed) is one ``agent-rl train`` run: its iteration 0 is the warm start, evaluated on 128
held-out episodes greedily and sampled at the rollout temperature, then the RL iterations, evaluated
the same way every ``eval_every`` iterations, with no early stop. The RL lift of a run is its final
success minus its iteration-0 success (the same run, the same held-out episodes), in points.

    python -m agent_rl.benchmarks.lift                 # every case on 5 seeds (hours)
    python -m agent_rl.benchmarks.lift --quick         # two tiny cases on 2 seeds, for the tests (a minute)
    agent-rl bench lift [--cases bandit,maze-clone] [--seeds 5] [--workers 2] [--engine auto] [--out DIR] [--report]
    agent-rl bench lift --cases bandit --set optim.lr=1e-4 algo.negative_weight=1 --out DIR   # other settings
    agent-rl bench lift --cases maze-hold --set optim.target_kl=0.1 --out DIR --warm-starts-from OTHER  # RL only
    agent-rl bench lift --cases maze-clone --out DIR --arm OTHER optim.lr=5e-5   # two arms, one worker pool
    agent-rl bench lift --cases maze-random --iterations 20 --out DIR   # shorter runs (the same with --report)

Runs go ``--workers`` at a time, one torch thread each; finished runs are skipped on a rerun and a
run killed midway resumes from its last checkpoint. Stopping the benchmark (Ctrl-C, SIGTERM) stops its
runs, each saving a checkpoint. ``--report`` summarizes the finished runs and
trains nothing. Outputs under ``--out`` (default ``benchmarks/results/lift``): per run
``runs/<case>/seed<k>/`` (``metrics.jsonl``, ``config.yaml``; checkpoints are not committed),
``summary.json``, ``summary.md``, ``curves.png`` and ``lifts.png``. In a fresh clone of committed
results, a ``--warm-starts-from`` lift with runs left to train first trains again each warm start
they share (from its run's ``config.yaml``), which must log the iteration-0 evaluation recorded.
``--arm OTHER KEY=VALUE ...`` trains another arm in the same worker pool, each of its runs from this
lift's warm start of the same case and seed (as a lift with ``--out OTHER --warm-starts-from`` this
one's ``--out`` would): a worker idles only while every run left waits for a warm start in training.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from agent_rl.benchmarks.common import RESULTS_DIR, machine_info, stopped, write_json
from agent_rl.benchmarks.harness import (
    RunFailed,
    adopt_rebuilt_warm_start,
    finished,
    recorded_iterations,
    run_jobs,
    thread_environment,
    threads_override,
    train_command,
)
from agent_rl.benchmarks.paired_stats import PairedDifference, adjust_family, mean_interval, paired_difference
from agent_rl.benchmarks.report import (
    logged,
    mean_with_interval,
    p_value,
    percent,
    plot_curves,
    plot_paired,
    signed_points,
)

OUT_DIR = RESULTS_DIR / "lift"
REACH = 0.95
"""Greedy success the `reach` cases must reach by their last iteration."""


@dataclass(frozen=True)
class Goal:
    """What a case must show: ``reach`` (greedy success >= ``value`` by the last iteration on every
    seed), ``lift`` (greedy lift >= ``value`` points on every seed) or ``hold`` (mean greedy lift over
    the seeds >= ``value`` points); with ``minutes``, also every run done within that many minutes in
    all (warm start, evaluations and RL)."""

    kind: str
    value: float
    minutes: float | None = None

    def describe(self) -> str:
        what = {
            "reach": f"greedy success >= {self.value:.0%} on every seed",
            "lift": f"greedy lift >= {self.value:+.0f} points on every seed",
            "hold": f"mean greedy lift >= {self.value:+.0f} points",
        }[self.kind]
        return what if self.minutes is None else f"{what}, within {self.minutes:.0f} min per run"

    def met(self, finals: list[float], lifts: list[float], total_s: list[float]) -> bool:
        if self.minutes is not None and max(total_s) > 60 * self.minutes:
            return False
        if self.kind == "reach":
            return min(finals) >= self.value
        if self.kind == "lift":
            return min(lifts) >= self.value
        return float(np.mean(lifts)) >= self.value


SEEDS, QUICK_SEEDS = 5, 2
PER_RUN_KEYS = frozenset({"trainer.iterations", "trainer.eval_every", "trainer.seed", "trainer.run_dir"})
"""Config keys the benchmark sets for each run, after ``--set``'s overrides: ``--set`` may not name them."""


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    overrides: tuple[str, ...]
    """Config overrides on top of what ``agent-rl train`` starts from (``load_default_config``)."""
    iterations: int
    eval_every: int
    goal: Goal
    recipe: str | None = None
    """Bundled recipe or YAML file the case starts from (``agent-rl train --config``); None starts
    where ``agent-rl train`` without ``--config`` does."""
    seeds: int = SEEDS
    """Seeds a full run of the case has, and its goal is judged on."""
    threads: int | None = 1
    """Torch threads per run (runs go ``--workers`` at a time); None gives each run every core, for
    cases timed alone (run them with ``--workers 1``)."""

    @property
    def threads_override(self) -> str:
        return threads_override(self.threads)

    def config(self, extra: tuple[str, ...] = ()):
        """The resolved config of the case's runs, with ``extra`` overrides on top."""
        from agent_rl.config import load_config, load_default_config

        overrides = [*COMMON, self.threads_override, *self.overrides, *extra]
        return load_config(self.recipe, overrides) if self.recipe else load_default_config(overrides)


PANEL_MAZE = "env.kwargs={n_rooms: 5, n_locked_doors: 0, dead_ends: 1, extra_edges: 0, n_distractors: 1, max_steps: 8}"
"""The multi-step cases' Maze: five rooms on a tree, no locked door, one dead end, one distractor, an
8-step limit. A policy that reads each observation (the explorer: take the goal in sight, else follow
the right-hand wall) wins every episode within the limit, and random play seldom does (the lift
summary's random play). On the main job's Maze (8 rooms, 2 locked doors, 50 steps) a weak policy
plays most episodes to the limit, and a run of 30 iterations took 80-130 minutes on one thread."""
GREEDY_EVAL_ONLY = ("trainer.eval_sampled=false",)
"""SmolLM2 cases evaluate greedily only, as their recipes do."""

CASES = (
    Case(
        "say",
        "the README quickstart's SayTheNumber (say the number 1-3 you are shown; random play wins 1/3)",
        ("env.id=benchmarks.lift_envs:lift/SayTheNumber-v0",),
        10,
        2,
        Goal("reach", REACH),
    ),
    Case(
        "bandit",
        "a one-step bandit: 8 signs, each opening one of 4 doors by a table the text never shows (random play wins "
        "1/4)",
        ("env.id=benchmarks.lift_envs:lift/Bandit-v0",),
        10,
        2,
        Goal("reach", REACH),
    ),
    Case(
        "maze-random",
        "a small Maze (5 rooms on a tree, no locked door, 8 steps) from a random-action warm start",
        (PANEL_MAZE, "sft.mode=random"),
        30,
        10,
        Goal("lift", 30.0, minutes=20.0),
    ),
    # The observation shows the current dial (the whole state a policy needs), so no history turn;
    # the default 16 groups: a random-action warm start wins 1/16, most groups none.
    Case(
        "combination",
        "lift/Combination-v0: four dials, each turned up or down by a table the text never shows, one reward "
        "at the end (random play wins 1/16)",
        ("env.id=benchmarks.lift_envs:lift/Combination-v0", "rollout.history_turns=0"),
        16,
        4,
        Goal("reach", REACH),
    ),
    # 100 cloning steps gave a clone that wins 24.2% greedily and 21.1% sampled (seed 100, not a
    # panel seed; benchmarks/results/lift_pilots/panel_maze_clone100/).
    Case(
        "maze-clone",
        "the small Maze of maze-random from a short oracle clone (100 cloning steps)",
        (PANEL_MAZE, "sft.steps=100"),
        30,
        10,
        Goal("lift", 30.0, minutes=20.0),
    ),
    # 40 reverse steps and a 14-step limit: oracle plans of 4.3 moves on average and at most 12, and
    # random play wins about a fifth (20 and 20 let it win 36%). The board is the whole state, so
    # the prompt shows no history.
    Case(
        "sokoban",
        "Sokoban (6x6, one box, 40 reverse steps, 14 steps) from a random-action warm start",
        (
            "env.id=agent_rl/Sokoban-v0",
            "env.kwargs={width: 6, height: 6, n_boxes: 1, reverse_steps: 40, max_steps: 14}",
            "sft.mode=random",
            "rollout.history_turns=0",
        ),
        30,
        10,
        Goal("lift", 30.0, minutes=20.0),
    ),
    # Random play wins about 2%; the board (the whole state) is long text, so no history turns. The
    # embedded tokenizer also covers the game: its prompts shrink from 577 tokens to 313
    # (benchmarks/results/long_prompt_run.json), which keeps a run near the panel's 15 minutes.
    Case(
        "frozenlake",
        "TextArena FrozenLake-v0 (third-party, 4x4, 3 holes) from a random-action warm start",
        (
            "env.id=textarena/FrozenLake-v0",
            "policy.tokenizer_envs=[textarena/FrozenLake-v0]",
            "sft.mode=random",
            "rollout.history_turns=0",
        ),
        30,
        10,
        Goal("lift", 30.0, minutes=20.0),
    ),
    Case(
        "maze-hold",
        "the main job's Maze from a clone that already wins about 95% (1,200 cloning steps on 4,000 episodes)",
        ("sft.steps=1200", "sft.episodes=4000"),
        20,
        5,
        Goal("hold", -2.0),
    ),
    # The main job as an RL job: a warm start of a fifth of the main job's cloning steps (about two
    # minutes on 2 threads) whose clones win 26-69% of held-out mazes greedily (seeds 0-2;
    # benchmarks/results/lift_pilots/main_job_rl_*, lift_invalid_credit_main_job), then RL towards
    # the main job's 95%.
    Case(
        "main-job-rl",
        "the main job's Maze from a short clone (250 cloning steps on 500 episodes)",
        ("sft.steps=250", "sft.episodes=500"),
        10,
        5,
        Goal("reach", REACH),
    ),
    # SmolLM2-135M-Instruct (agent-rl models install smollm2-135m-instruct), timed alone: run these
    # with --workers 1, every core to the one run.
    Case(
        "smollm2-maze",
        "SmolLM2-135M-Instruct on the main job's Maze from its oracle clone (the smollm2-maze recipe)",
        GREEDY_EVAL_ONLY,
        36,
        18,
        Goal("lift", 20.0, minutes=60.0),
        recipe="smollm2-maze",
        seeds=3,
        threads=None,
    ),
    Case(
        "smollm2-sokoban",
        "SmolLM2-135M-Instruct on Sokoban from zero-shot, no demonstrations (the smollm2-sokoban recipe)",
        GREEDY_EVAL_ONLY,
        24,
        12,
        Goal("lift", 20.0, minutes=60.0),
        recipe="smollm2-sokoban",
        seeds=3,
        threads=None,
    ),
)
QUICK_CASES = (
    Case(
        "say",
        "SayTheNumber, tiny sizes (a smoke test)",
        (
            "env.id=benchmarks.lift_envs:lift/SayTheNumber-v0",
            "sft.steps=25",
            "sft.episodes=160",
            "rollout.min_batch_rows=64",
            "trainer.eval_episodes=8",
        ),
        2,
        1,
        Goal("reach", REACH),
    ),
    Case(
        "bandit",
        "the bandit, tiny sizes (a smoke test)",
        (
            "env.id=benchmarks.lift_envs:lift/Bandit-v0",
            "sft.steps=25",
            "sft.episodes=160",
            "rollout.min_batch_rows=64",
            "trainer.eval_episodes=8",
        ),
        2,
        1,
        Goal("reach", REACH),
    ),
)
RANDOM_PLAY_EPISODES = 512

COMMON = (
    "trainer.target_success=null",
    "trainer.eval_sampled=true",
    "trainer.eval_episodes=128",
    "logging.tensorboard=false",
    "logging.console=false",
)
"""Every run: no early stop, greedy and sampled evaluation on 128 held-out episodes (a case may
shrink them); its torch threads come from the case (``Case.threads``)."""


# ---- runs -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    """One (case, seed): a :class:`~agent_rl.benchmarks.harness.Job`."""

    case: Case
    seed: int
    run_dir: Path
    settings: tuple[str, ...] = ()
    """Overrides on top of the case's (``--set``)."""
    engine: str = "auto"
    warm_starts_from: Path | None = None
    """Another lift's ``--out`` (``--warm-starts-from``): this run starts from the warm-start checkpoint
    (``sft``) of that lift's run of the same case and seed instead of training its own."""

    @property
    def name(self) -> str:
        return f"{self.case.name} seed {self.seed}"

    @property
    def warm_start(self) -> Path | None:
        """The run directory whose warm start this run shares (None without ``warm_starts_from``)."""
        return None if self.warm_starts_from is None else run_path(self.warm_starts_from, self.case, self.seed)

    def warm_start_problem(self) -> str | None:
        """Why the shared warm start cannot be used yet (its checkpoint is missing or broken); None
        without one, or once it is saved."""
        from agent_rl.training.infra.checkpoint import CheckpointError, find_checkpoint

        if self.warm_start is None:
            return None
        try:
            find_checkpoint(self.warm_start, "sft")
        except CheckpointError as exc:
            return str(exc)
        return None

    @property
    def warm_start_in_training(self) -> bool:
        """Whether another process is training the shared warm start: a run in its directory or its
        rebuild's, or a lift that holds ``warm_starts_from`` (its ``--out``) and has yet to start that run."""
        from agent_rl.training.loop.run_dir import run_dir_in_use

        return self.warm_start is not None and (
            run_dir_in_use(self.warm_start)
            or run_dir_in_use(self.rebuild.run_dir)
            or run_dir_in_use(self.warm_starts_from)
        )

    @property
    def rebuild(self) -> WarmStartRebuild | None:
        """How this lift trains the shared warm start again if its run lost it (None without one)."""
        return None if self.warm_start is None else WarmStartRebuild(self.warm_start, self.case.threads)

    @property
    def warm_start_lost(self) -> bool:
        """Whether the shared warm start's run finished without its checkpoint, as in a fresh clone of
        committed results: this lift trains it again (:class:`WarmStartRebuild`). Finished means the
        iterations that run was started for, which may differ from this run's (``--iterations``)."""
        return (
            self.warm_start is not None
            and (source_iterations := recorded_iterations(self.warm_start)) is not None
            and finished(self.warm_start, source_iterations)
            and self.warm_start_problem() is not None
        )

    def warm_start_overrides(self) -> tuple[str, ...]:
        """``policy=`` the shared warm start, whose saved tokenizer replaces the one a case's
        ``policy.tokenizer_envs`` builds, and no warm start of its own (none without ``warm_starts_from``)."""
        if self.warm_start is None:
            return ()
        from agent_rl.training.infra.checkpoint import find_checkpoint

        model_dir = find_checkpoint(self.warm_start, "sft").model_dir
        return (f"policy={model_dir}", "policy.tokenizer_envs=[]", "sft.mode=none")

    def own_overrides(self) -> tuple[str, ...]:
        """The case's overrides and the lift's settings; from a shared warm start, less their ``sft.*``
        keys: they describe a warm start this run does not train (``sft.targets=listed`` would fail
        with ``sft.mode=none``)."""
        own = (*self.case.overrides, *self.settings)
        if self.warm_start is None:
            return own
        from agent_rl.config import parse_override

        return tuple(o for o in own if parse_override(o)[0].split(".", 1)[0] != "sft")

    @property
    def iterations(self) -> int:
        return self.case.iterations

    @property
    def done(self) -> bool:
        return finished(self.run_dir, self.iterations)

    def command(self) -> list[str]:
        # The per-run keys come last, so PER_RUN_KEYS must name every one of them.
        return train_command(
            [
                *COMMON,
                self.case.threads_override,
                f"engine={self.engine}",
                *self.own_overrides(),
                *self.warm_start_overrides(),
                f"trainer.iterations={self.case.iterations}",
                f"trainer.eval_every={self.case.eval_every}",
                f"trainer.seed={self.seed}",
                f"trainer.run_dir={self.run_dir}",
            ],
            self.case.recipe,
        )

    def environment(self) -> dict[str, str]:
        return thread_environment(self.case.threads)


@dataclass(frozen=True)
class WarmStartRebuild:
    """The warm start of a finished run trained again, its checkpoint being gone (checkpoints are not
    committed): that run's own ``config.yaml`` with no RL iteration, in ``<run>/rebuild``. Its
    checkpoints move into the run once it logs the run's recorded iteration-0 evaluation
    (:func:`~agent_rl.benchmarks.harness.adopt_rebuilt_warm_start`), so the runs started from it
    still share one warm start."""

    source: Path
    """The finished run whose warm start this recreates."""
    threads: int | None
    """Torch threads, the case's (the run's config records them too)."""
    iterations = 0

    @property
    def name(self) -> str:
        return f"warm start of {self.source}"

    @property
    def done(self) -> bool:
        return finished(self.run_dir, self.iterations)

    @property
    def run_dir(self) -> Path:
        return self.source / "rebuild"

    def command(self) -> list[str]:
        overrides = ["trainer.iterations=0", f"trainer.run_dir={self.run_dir}"]
        return train_command(overrides, str(self.source / "config.yaml"))

    def environment(self) -> dict[str, str]:
        return thread_environment(self.threads)

    def adopt(self) -> None:
        adopt_rebuilt_warm_start(
            self.run_dir,
            self.source,
            self.name,
            "the runs started from it would not share one warm start. Train that run again (delete its "
            "directory and rerun its lift) or start these runs without --warm-starts-from.",
        )


def rebuilds_needed(runs: list[Run]) -> list[WarmStartRebuild]:
    """The shared warm starts to train again: those lost (:attr:`Run.warm_start_lost`) by a pending run,
    each once, unless another process is rebuilding it already."""
    from agent_rl.training.loop.run_dir import run_dir_in_use

    rebuilds = {run.warm_start: run.rebuild for run in runs if not run.done and run.warm_start_lost}
    return [rebuild for rebuild in rebuilds.values() if not run_dir_in_use(rebuild.run_dir)]


def run_path(out: Path, case: Case, seed: int) -> Path:
    """Where a lift keeps its run of ``case`` and ``seed``: ``<out>/runs/<case>/seed<k>``."""
    return out / "runs" / case.name / f"seed{seed}"


def seeds_present(out: Path, case: Case) -> int:
    """One more than the highest ``seed<k>`` directory of ``case`` under ``out`` (0 when none)."""
    found = [int(p.name[4:]) for p in (out / "runs" / case.name).glob("seed*") if p.name[4:].isdigit()]
    return max(found, default=-1) + 1


def plan(
    cases: tuple[Case, ...],
    seeds: int | None,
    out: Path,
    settings: tuple[str, ...] = (),
    first_seed: int = 0,
    engine: str = "auto",
    warm_starts_from: Path | None = None,
) -> list[Run]:
    """Every (case, seed) run: ``seeds`` per case, or each case's own count when None, from ``first_seed``
    (fresh seeds confirm a setting that was chosen by looking at others); with ``warm_starts_from``
    (another ``--out``), each starts from the warm start of that one's run of the same case and seed."""
    return [
        Run(case, seed, run_path(out, case, seed), settings, engine, warm_starts_from)
        for case in cases
        for seed in range(first_seed, first_seed + (case.seeds if seeds is None else seeds))
    ]


@dataclass(frozen=True)
class Arm:
    """Another setting trained in a lift's worker pool (``--arm``): its runs go to ``out`` and start
    from the lift's warm starts, with ``settings`` in place of the lift's ``--set``."""

    out: Path
    settings: tuple[str, ...] = ()


# ---- summaries -----------------------------------------------------------------------------------------


LIMITS = {
    "zero_variance_groups": "credit/zero_variance_groups",
    "pass_rate": "rollout/success_rate",
    "invalid_rate": "rollout/invalid_rate",
    "loop_rate": "rollout/loop_rate",
    "entropy": "update/entropy",
    "action_entropy": "rollout/action_entropy",
    "approx_kl": "update/approx_kl",
    "clip_frac": "update/clip_frac",
    "optimizer_steps": "update/optimizer_steps",
    "advantage_mass_early": "advantage/mass_early",
    "advantage_mass_late": "advantage/mass_late",
}
"""What limits multi-turn learning, read from each RL iteration's metrics: the share of groups
without return spread, the training pass rate, the invalid-action rate, the share of episodes that
ran out of turns in a loop, the reply entropy (per token), the entropy of the actions played (bits;
near 0 is one action whatever the state), how far and in how many steps an update moves the
policy, the share of its tokens the loss clips, and the advantage mass on the first and last third
of the turns. A run's summary holds the median of each over its RL iterations."""


def iteration_medians(records: list[dict], keys: dict[str, str]) -> dict[str, float | None]:
    """The median of each metric over the records that log it (None where none does)."""
    values = {name: logged(records, key) for name, key in keys.items()}
    return {name: float(np.median(v)) if v else None for name, v in values.items()}


def run_summary(records: list[dict]) -> dict[str, Any]:
    """Curves, start, end, lifts and times of one finished run (success as fractions, lifts in points)."""
    evals = [r for r in records if r.get("eval/greedy_success") is not None]
    if not evals or evals[0]["iteration"] != 0:
        raise ValueError("a run needs its iteration-0 evaluation")
    greedy = [float(r["eval/greedy_success"]) for r in evals]
    sampled = [float(r.get("eval/sampled_success", np.nan)) for r in evals]
    first = records[0]
    reached = next((r["iteration"] for r in evals if r["eval/greedy_success"] >= REACH), None)
    return {
        "iterations": [r["iteration"] for r in evals],
        "elapsed_s": [float(r["time/elapsed"]) for r in evals],
        "greedy_success": greedy,
        "sampled_success": sampled,
        "greedy_lift": 100.0 * (greedy[-1] - greedy[0]),
        "sampled_lift": 100.0 * (sampled[-1] - sampled[0]),
        "first_iteration_at_95_greedy": reached,
        "warm_start_s": float(first["time/elapsed"]) - float(first.get("time/eval") or 0.0),
        "total_s": float(records[-1]["time/elapsed"]),
        "warm_start": {k: v for k, v in first.items() if k.startswith("sft/")},
        "training_success": logged(records, "rollout/success_rate"),
        "training_invalid_rate": logged(records, "rollout/invalid_rate"),
        "greedy_minus_sampled_points": [100.0 * (g - s) for g, s in zip(greedy, sampled)],
        "limits": iteration_medians(records[1:], LIMITS),
        "largest_approx_kl": max(logged(records, "update/approx_kl"), default=None),
    }


def random_play_success(
    case: Case, settings: tuple[str, ...] = (), episodes: int = RANDOM_PLAY_EPISODES
) -> float | None:
    """Success of uniformly random admissible actions on the case's held-out seeds, with the runs'
    ``--set`` overrides (None where the environment lists no admissible actions)."""
    from agent_rl.training.loop.evaluation import eval_seeds
    from agent_rl.training.loop.sft import collect_demonstrations
    from agent_rl.training.models.policy import load_tokenizer, policy_dir
    from agent_rl.training.serving.envpool import env_factory

    config = case.config(settings)
    tokenizer = load_tokenizer(policy_dir(config.policy.name_or_path))  # the tokenizer alone, not the weights
    try:
        demos = collect_demonstrations(
            env_factory(config),
            tokenizer,
            config.rollout,
            mode="random",
            seeds=eval_seeds(episodes),
            rng=np.random.default_rng(0),
        )
    except ValueError:
        return None
    return demos.successes / demos.episodes


def case_summary(case: Case, runs: list[dict[str, Any]], random_play: float | None) -> dict[str, Any]:
    lifts = [r["greedy_lift"] for r in runs]
    finals = [r["greedy_success"][-1] for r in runs]
    totals = [r["total_s"] for r in runs]

    def interval(values: list[float]) -> dict[str, float]:
        mean, half = mean_interval(np.asarray(values))
        return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "n": len(values)}

    return {
        "case": case.name,
        "description": case.description,
        "overrides": list(case.overrides),
        "iterations": case.iterations,
        "eval_every": case.eval_every,
        "goal": case.goal.describe(),
        "goal_met": case.goal.met(finals, lifts, totals)
        if len(runs) >= case.seeds
        else None,  # on the full seed count only
        "seeds": len(runs),
        "random_play_success": random_play,
        "start_greedy": interval([r["greedy_success"][0] for r in runs]),
        "final_greedy": interval(finals),
        "greedy_lift": interval(lifts),
        "start_sampled": interval([r["sampled_success"][0] for r in runs]),
        "final_sampled": interval([r["sampled_success"][-1] for r in runs]),
        "sampled_lift": interval([r["sampled_lift"] for r in runs]),
        "total_s": interval(totals),
        "warm_start_s": interval([r["warm_start_s"] for r in runs]),
        "limits": iteration_medians([r["limits"] for r in runs], {name: name for name in LIMITS}),
        "runs": runs,
    }


def summarize(runs: list[Run], random_play: dict[str, float | None], settings: tuple[str, ...] = ()) -> dict[str, Any]:
    from agent_rl.training.infra.logger import read_metrics

    cases: dict[str, list[dict[str, Any]]] = {}
    by_name = {}
    for run in runs:
        if run.done:
            cases.setdefault(run.case.name, []).append({"seed": run.seed, **run_summary(read_metrics(run.run_dir))})
            by_name[run.case.name] = run.case
    return {
        "machine": machine_info(),
        "settings": list(settings),
        "cases": [case_summary(by_name[name], results, random_play.get(name)) for name, results in cases.items()],
    }


PRIMARY_MEASURE = "final_greedy_points"
"""What a comparison against ``--baseline`` tests, declared before any run: final greedy held-out
success in points, paired by seed, over the declared family (``--family``; without it every case
both summaries hold), Holm-corrected (``paired_stats.adjust_family``). Greedy lift, and the paired
difference of a case outside the family, are reported beside it and never called significant."""


def compare(
    summary: dict[str, Any], baseline: dict[str, Any], baseline_path: Path, family: tuple[str, ...] | None = None
) -> None:
    """Add to each case of ``summary`` that ``baseline`` (another ``--out``'s summary) also ran its
    paired difference on the seeds both hold: final greedy success and greedy lift, in points. The
    cases of ``family`` (None: every compared case) also get the primary test: Holm-adjusted p-values,
    a Bonferroni interval and a verdict over the family. A case of ``family`` without two paired seeds
    is a ``ValueError``: the family was declared before the runs."""
    primary: dict[str, PairedDifference] = {}
    for case in summary["cases"]:
        other = next((c for c in baseline["cases"] if c["case"] == case["case"]), None)
        if other is None:
            continue
        theirs = {r["seed"]: r for r in other["runs"]}
        pairs = [(r, theirs[r["seed"]]) for r in case["runs"] if r["seed"] in theirs]
        if len(pairs) < 2:
            continue
        primary[case["case"]] = paired_difference(
            np.array([100 * r["greedy_success"][-1] for r, _ in pairs]),
            np.array([100 * b["greedy_success"][-1] for _, b in pairs]),
        )
        case["vs_baseline"] = {
            "baseline": str(baseline_path),
            "baseline_settings": baseline.get("settings", []),
            "seeds": [r["seed"] for r, _ in pairs],
            PRIMARY_MEASURE: asdict(primary[case["case"]]),
            "greedy_lift_points": asdict(
                paired_difference(
                    np.array([r["greedy_lift"] for r, _ in pairs]), np.array([b["greedy_lift"] for _, b in pairs])
                )
            ),
        }
    if family is not None:
        if missing := [name for name in family if name not in primary]:
            raise ValueError(f"declared case(s) {missing} have fewer than 2 seeds paired with the baseline")
        primary = {name: primary[name] for name in family}
    for name, adjusted in (adjust_family(primary) if primary else {}).items():
        case = next(c for c in summary["cases"] if c["case"] == name)
        case["vs_baseline"]["primary"] = {
            "measure": PRIMARY_MEASURE,
            **adjusted.as_dict(),
            "significant": adjusted.significant(),
        }


def _verdict(met: bool | None) -> str:
    return "not judged (fewer seeds than the case's)" if met is None else ("yes" if met else "no")


def comparison_lines(summary: dict[str, Any]) -> list[str]:
    """The markdown paragraphs of the comparisons against ``--baseline`` (``compare``): the declared
    family's cases with their Holm verdict, any other compared case reported untested."""
    lines: list[str] = []
    for c in (c for c in summary["cases"] if "vs_baseline" in c):
        d = c["vs_baseline"].get("primary") or c["vs_baseline"][PRIMARY_MEASURE]
        line = (
            f"{c['case']} against `{c['vs_baseline']['baseline']}` (paired on seeds {c['vs_baseline']['seeds']}): "
            f"final greedy success {d['mean']:+.1f} points [{d['ci_low']:+.1f}, {d['ci_high']:+.1f}], "
            f"{d['wins']} wins, {d['losses']} losses, Wilcoxon p {p_value(d['wilcoxon_p'])}"
        )
        if "primary" in c["vs_baseline"]:
            line += (
                f"; Holm over the {d['family_size']} declared case(s): t-test p {p_value(d['holm_t_p'])}, Wilcoxon "
                f"p {p_value(d['holm_wilcoxon_p'])}, family interval [{d['adjusted_ci_low']:+.1f}, "
                f"{d['adjusted_ci_high']:+.1f}]: {'a difference' if d['significant'] else 'no difference shown'} at "
                "5% family-wise."
            )
        else:
            line += " (outside the declared family: reported, not tested)."
        lines += ["", line]
    return lines


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    lines = [
        "# What RL adds (`agent-rl bench lift`)",
        "",
        "Held-out success on 128 episodes at iteration 0 (the warm start) and at the last iteration; lift = last - "
        "start, "
        "in points, per seed; mean with a 95% t-interval over seeds.",
        "",
        "| case | seeds | random play | greedy start -> end | greedy lift | sampled start -> end | sampled lift | "
        "minutes per run | goal | met |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in summary["cases"]:
        g, s = c["greedy_lift"], c["sampled_lift"]
        lines.append(
            f"| {c['case']} | {c['seeds']} | {percent(c['random_play_success'])} | "
            f"{percent(c['start_greedy']['mean'])} -> {percent(c['final_greedy']['mean'])} | {mean_with_interval(g)} | "
            f"{percent(c['start_sampled']['mean'])} -> {percent(c['final_sampled']['mean'])} | "
            f"{mean_with_interval(s)} | "
            f"{c['total_s']['mean'] / 60:.1f} | {c['goal']} | {_verdict(c['goal_met'])} |"
        )
    if summary.get("settings"):
        lines += ["", f"Settings on top of each case's own: `{' '.join(summary['settings'])}`."]
    lines += comparison_lines(summary)
    lines += ["", "Per seed (greedy success at each evaluation, %; lift in points; minutes):", ""]
    for c in summary["cases"]:
        lines.append(
            f"**{c['case']}**: {c['description']}; {c['iterations']} iterations, evaluated every {c['eval_every']}."
        )
        lines.append("")
        for r in c["runs"]:
            curve = ", ".join(f"{100 * v:.1f}" for v in r["greedy_success"])
            lines.append(
                f"- seed {r['seed']}: {curve} (lift {r['greedy_lift']:+.1f}; "
                f"sampled {signed_points(r['sampled_lift'])}; "
                f"largest approx KL {_number(r['largest_approx_kl'], '.1e')}; "
                f"warm start {r['warm_start_s'] / 60:.1f} of {r['total_s'] / 60:.1f} min)"
            )
        lines += ["", f"What limits it (medians over each run's RL iterations, then over seeds): {_limits(c)}", ""]
    path.write_text("\n".join(lines))


def _limits(case: dict[str, Any]) -> str:
    m = case.get("limits") or {}

    def shown(name: str, form: str) -> str:
        return _number(m.get(name), form)

    return (
        f"groups without return spread {shown('zero_variance_groups', '.0%')}, pass rate {shown('pass_rate', '.0%')}, "
        f"invalid actions {shown('invalid_rate', '.0%')}, episodes ending in a loop {shown('loop_rate', '.0%')}, "
        f"entropy {shown('entropy', '.2f')}, action entropy {shown('action_entropy', '.2f')} bits, approx KL "
        f"{shown('approx_kl', '.1e')} in {shown('optimizer_steps', '.0f')} optimizer steps with "
        f"{shown('clip_frac', '.0%')} of tokens clipped, advantage mass on the first/last third of the turns "
        f"{shown('advantage_mass_early', '.0%')}/{shown('advantage_mass_late', '.0%')}."
    )


def _number(value: float | None, form: str) -> str:
    """``value`` formatted, or "-" for a run or case that never logged it (older runs lack some metrics)."""
    return "-" if value is None else format(value, form)


def plot(summary: dict[str, Any], out: Path) -> None:
    """``curves.png`` (greedy and sampled success of each case over its seeds) and ``lifts.png`` (each
    seed's greedy lift with the mean and its interval)."""
    panels = {
        c["case"]: {
            kind: (c["runs"][0]["iterations"], [r[f"{kind}_success"] for r in c["runs"]])
            for kind in ("greedy", "sampled")
        }
        for c in summary["cases"]
    }
    plot_curves(out / "curves.png", panels, "held-out success")
    lifts = {
        c["case"]: {"per_seed": [r["greedy_lift"] for r in c["runs"]], **c["greedy_lift"]} for c in summary["cases"]
    }
    plot_paired(out / "lifts.png", lifts, "greedy RL lift (points): seeds, mean and 95% CI")


def main(argv: list[str] | None = None) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from agent_rl.config import ConfigError, parse_override

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two tiny cases on 2 seeds (a smoke test)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument(
        "--seeds", type=int, help=f"seeds per case (default: the case's, {SEEDS} for most; {QUICK_SEEDS} with --quick)"
    )
    parser.add_argument(
        "--first-seed", type=int, default=0, help="the first trainer.seed of every case (default 0); seeds are paired"
    )
    parser.add_argument(
        "--iterations",
        type=int,
        help="RL iterations of every case's runs in place of the case's own (evaluated every eval_every as before, "
        "and after the last); give the same with --report and to every lift that continues this --out",
    )
    parser.add_argument("--workers", type=int, default=2, help="runs at a time (default 2)")
    parser.add_argument("--engine", default="auto", choices=("auto", "hf", "vllm"), help="engine of every run")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help=f"results directory (default {OUT_DIR})")
    parser.add_argument("--report", action="store_true", help="summarize the finished runs; train nothing")
    parser.add_argument(
        "--baseline", type=Path, help="another --out whose summary.json to compare with, paired by seed"
    )
    parser.add_argument(
        "--family",
        help="with --baseline: the comma-separated cases whose final greedy success is tested, Holm over them "
        "alone, as a plan declared them (default: every case both summaries hold)",
    )
    parser.add_argument(
        "--warm-starts-from",
        type=Path,
        help="another --out whose runs of the same case and seed hold (or, while another lift trains them, will "
        "hold) their warm-start checkpoints: start from those instead of training each warm start again (the RL "
        "phase alone; pilots of settings); a run waits for a warm start that is still being trained, and one "
        "whose run finished without its checkpoint (a fresh clone) is trained again first, which must log the "
        "recorded iteration-0 evaluation",
    )
    parser.add_argument(
        "--set",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides on top of every case's (compare other settings in another --out)",
    )
    parser.add_argument(
        "--arm",
        nargs="+",
        action="append",
        default=[],
        metavar=("DIR", "KEY=VALUE"),
        help="another arm, in this lift's worker pool: its runs go to DIR and start from this lift's warm start "
        "of the same case and seed (as a lift with --out DIR --warm-starts-from this --out would), with these "
        "overrides in place of --set's; repeatable. Report it with --report --out DIR",
    )
    args = parser.parse_args(argv)
    every_case = cases = QUICK_CASES if args.quick else CASES
    if args.iterations is not None:
        if args.iterations < 1:
            parser.error("--iterations must be at least 1")
        every_case = cases = tuple(replace(case, iterations=args.iterations) for case in every_case)
    if args.cases:
        known = {c.name: c for c in cases}
        unknown = [n for n in args.cases.split(",") if n not in known]
        if unknown:
            parser.error(f"unknown case(s) {unknown}; choose from {list(known)}")
        cases = tuple(known[n] for n in args.cases.split(","))
    seeds = args.seeds if args.seeds is not None else (QUICK_SEEDS if args.quick else None)
    if seeds is not None and seeds < 1:
        parser.error("--seeds must be at least 1 (a single seed is a pilot: its lifts get no interval)")

    def checked(option: str, settings: tuple[str, ...]) -> tuple[str, ...]:
        try:  # a bad key or value fails here, before any run starts
            if owned := sorted({parse_override(s)[0] for s in settings} & PER_RUN_KEYS):
                parser.error(
                    f"{option} cannot change {', '.join(owned)}: the benchmark sets them for each run (the "
                    "case's iterations or --iterations, its evaluation interval, --first-seed, --out); give the "
                    "case another evaluation interval in benchmarks/lift.py"
                )
            for case in cases:
                case.config(settings)
        except ConfigError as exc:
            parser.error(f"{option}: {exc}")
        return settings

    settings = checked("--set", tuple(args.set))
    arms = tuple(Arm(Path(out), checked(f"--arm {out}", tuple(arm))) for out, *arm in args.arm)
    if arms and (args.report or args.warm_starts_from):
        parser.error(
            "--arm trains another arm from this lift's own warm starts: not with --report (report each arm with "
            "--report --out DIR) or --warm-starts-from"
        )
    outs = [args.out.resolve(), *(arm.out.resolve() for arm in arms)]
    if len(set(outs)) < len(outs):
        parser.error("--arm: every arm needs a directory of its own, other than --out")
    if args.first_seed < 0:
        parser.error("--first-seed must be >= 0")
    family = tuple(args.family.split(",")) if args.family else None
    if family and not args.baseline:
        parser.error("--family names the cases tested against --baseline: give --baseline too")
    if family and (unknown := [n for n in family if n not in {c.name for c in every_case}]):
        parser.error(f"--family: unknown case(s) {unknown}")
    if args.baseline and not (args.baseline / "summary.json").is_file():
        parser.error(f"--baseline {args.baseline} holds no summary.json: run --report --out {args.baseline} first")
    runs = plan(cases, seeds, args.out, settings, args.first_seed, args.engine, args.warm_starts_from)
    if not args.report:
        for run in runs:  # a missing warm start that no process is training fails here, before any run starts
            lost_or_training = run.warm_start_lost or run.warm_start_in_training
            if not run.done and (problem := run.warm_start_problem()) and not lost_or_training:
                parser.error(
                    f"--warm-starts-from: {problem}, and no lift is training it: start the lift with "
                    f"--out {args.warm_starts_from} first (this one then waits for its warm starts)"
                )
        from agent_rl.training.loop.run_dir import hold_dir

        out_locks = []
        try:  # held while training, so that a lift started --warm-starts-from this --out waits for its runs
            for out in (args.out, *(arm.out for arm in arms)):
                out_locks.append(hold_dir(out, f"--out {out} is in use by another lift; wait for it or choose another"))
        except FileExistsError as exc:
            for lock in out_locks:
                lock.release()
            parser.error(str(exc))
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns) as progress:
            try:
                arm_runs = [plan(cases, seeds, a.out, a.settings, args.first_seed, args.engine, args.out) for a in arms]
                # Each arm's run of a case and seed right after this lift's: next in line once its warm start is saved.
                jobs = [job for same_seed in zip(runs, *arm_runs) for job in same_seed]
                rebuilds = rebuilds_needed(jobs)
                for rebuild in [rebuild for rebuild in rebuilds if rebuild.done]:  # a stop came before its adoption
                    rebuild.adopt()
                rebuild_of = {rebuild.source: rebuild for rebuild in rebuilds if not rebuild.done}

                def needs(job: Run | WarmStartRebuild) -> tuple[WarmStartRebuild, ...]:
                    rebuild = rebuild_of.get(job.warm_start) if isinstance(job, Run) else None
                    return (rebuild,) if rebuild else ()

                run_jobs(
                    [*rebuild_of.values(), *jobs],
                    workers=args.workers,
                    progress=progress,
                    title="lift",
                    needs=needs,
                    ready=lambda job: not isinstance(job, Run) or job.warm_start_problem() is None,
                    waits_outside=lambda job: isinstance(job, Run) and job.warm_start_in_training,
                    on_finish=lambda job: None if isinstance(job, Run) else job.adopt(),
                )
            except RunFailed as exc:
                print(f"lift: error: {exc}", file=sys.stderr)
                return 1
            except KeyboardInterrupt as exc:
                return stopped("lift", exc)
            finally:
                for lock in out_locks:
                    lock.release()
    # The summary covers every finished run under --out, whichever cases and seeds this call named.
    present = [run for case in every_case for run in plan((case,), seeds_present(args.out, case), args.out, settings)]
    finished = [run for run in present if run.done]
    cases_finished = {run.case.name: run.case for run in finished}
    random_play = {name: random_play_success(case, settings) for name, case in cases_finished.items()}
    summary = summarize(finished, random_play, settings)
    if not summary["cases"]:
        recorded = {recorded_iterations(run.run_dir) for run in present}
        started_for = sorted(recorded - {None, *(run.iterations for run in present)})
        hint = (
            f"; its runs were started for {', '.join(map(str, started_for))} iterations: give that --iterations"
            if started_for
            else ""
        )
        print(f"lift: no finished runs to report under {args.out}{hint}", file=sys.stderr)
        return 1
    if args.baseline:
        try:
            compare(summary, json.loads((args.baseline / "summary.json").read_text()), args.baseline, family)
        except ValueError as exc:
            print(f"lift: error: --family: {exc}", file=sys.stderr)
            return 1
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "summary.json", summary, indent=1)
    write_markdown(summary, args.out / "summary.md")
    plot(summary, args.out)
    print((args.out / "summary.md").read_text())
    for arm in arms:
        also = f" --set {' '.join(arm.settings)}" if arm.settings else ""
        report = f"agent-rl bench lift --report --out {arm.out} --baseline {args.out}{also}"
        print(f"lift: report the arm {arm.out} with: {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
