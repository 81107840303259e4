"""The RL loop. A run is a supervised warm start (iteration 0), then iterations of

    rollout -> anchor keys -> credit -> update -> weight sync -> evaluation -> checkpoint

``Trainer.train_iteration`` holds the first five steps and ``Trainer.run`` the loop around them.
The pieces live in their own modules: ``rollout`` (the episode loop), ``anchors`` and
``agent_rl.advantages`` (credit), ``learner`` (PPO-style minibatch epochs), ``evaluation`` (held-out
seeds), ``checkpoint`` and ``logger``.

A trainer takes objects: a model and its tokenizer, an environment factory (any zero-argument
callable returning a Gymnasium text env) and optionally an engine. ``Trainer.from_config`` builds
them from the config's names, as the ``agent-rl train`` command does. Under ``torchrun`` rank 0
collects rollouts, evaluates, logs and checkpoints; every rank learns on its share of the rows.
"""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent_rl.advantages import compute_advantages
from agent_rl.anchors import batch_anchor_keys
from agent_rl.config import Config, ConfigError, config_to_dict, save_config
from agent_rl.envs import AUTO_SFT_REASONS
from agent_rl.training.infra import checkpoint
from agent_rl.training.infra.distributed import (
    broadcast_flag,
    broadcast_parameters,
    check_precision,
    init_distributed,
    resolve_device,
    shutdown_distributed,
)
from agent_rl.training.infra.logger import RunLogger
from agent_rl.training.infra.resolution import resolve
from agent_rl.training.loop.evaluation import evaluate_heldout, target_reached
from agent_rl.training.loop.learner import Learner
from agent_rl.training.loop.rollout import collect_rollouts
from agent_rl.training.loop.sft import warm_start
from agent_rl.training.models.policy import add_lora, is_lora
from agent_rl.training.serving.engines import Engine, engine_from_config
from agent_rl.training.serving.envpool import EnvFactory, env_factory, failure_kind, pool_from_config

RESUME_MAY_CHANGE = (
    "trainer.iterations",
    "trainer.run_dir",
    "trainer.target_success",
    "trainer.confirm_episodes",
    "trainer.torch_threads",
    "logging",
    "engine",
    "scale",
)
"""Config keys a resumed run may change; any other difference refuses the checkpoint."""

ROLLOUT_METRICS = {
    "success_rate": "success_rate",
    "return": "mean_return",
    "length": "mean_length",
    "invalid_rate": "invalid_action_rate",
    "overlong_rate": "overlong_rate",
    "failed_trajectories": "failed_trajectories",
    "dropped_groups": "dropped_groups",
    "rounds": "rounds",
    "rows": "batch_rows",
    "tokens_per_s": "tokens_per_s",
}
"""Logged ``rollout/<name>`` metrics and the ``collect_rollouts`` statistic each one reports."""


NONFINITE_STOP = 4
"""Optimizer steps in a row with a non-finite loss or gradient norm that stop a run."""


class NonFiniteUpdates(ValueError):
    """Several optimizer steps in a row had a non-finite loss or gradient norm."""


class EnvironmentFailures(ValueError):
    """Too many of an iteration's trajectories failed because their environment raised."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def default_run_dir(config: Config) -> Path:
    name = config.env.id.split("/")[-1].lower()
    return Path("runs") / f"{name}-{config.algo.preset}-{time.strftime('%Y%m%d-%H%M%S')}"


@contextlib.contextmanager
def timed(metrics: dict[str, float], key: str):
    """Record the seconds the block took as ``metrics[key]``."""
    start = time.perf_counter()
    yield
    metrics[key] = time.perf_counter() - start


class Trainer:
    """One training run: the model, optimizer, engine, environments, RNG streams and run directory."""

    def __init__(
        self,
        config: Config,
        *,
        model: torch.nn.Module,
        tokenizer,
        make_env: EnvFactory,
        engine: Engine | None = None,
        resume: bool | str = False,
        resume_from: str = "last",
        console: Console | None = None,
        on_iteration: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        """``config`` is resolved here (``agent_rl.training.infra.resolution.resolve``). ``engine`` generates with
        ``model``'s weights (synced after every update); None builds ``config.engine``'s.
        With ``policy.lora_rank`` > 0 a model without adapters gets fresh LoRA adapters (peft injects
        them into its modules) and only they train.
        ``resume`` continues the run in ``trainer.run_dir`` from its checkpoint ``resume_from``
        (last, best or sft); ``resume="auto"`` does so when the directory holds checkpoints and
        starts afresh when it does not, so a requeued job reruns its own command unchanged.
        ``on_iteration(iteration, metrics)`` is called on the main process after every logged
        iteration (0 is the warm start and its evaluation)."""
        cfg = self.config = resolve(config, make_env)
        if cfg.policy.lora_rank > 0 and not is_lora(model):
            model = add_lora(
                model,
                rank=cfg.policy.lora_rank,
                alpha=cfg.policy.lora_alpha,
                target_modules=cfg.policy.lora_target_modules,
            )
        self.model, self.tokenizer, self.make_env = model.eval(), tokenizer, make_env  # eval: no dropout
        self.on_iteration = on_iteration
        self.console = console if console is not None else Console(quiet=not cfg.logging.console)
        if config.sft.mode == "auto":
            self.console.print(f"sft.mode=auto chose {cfg.sft.mode}: {AUTO_SFT_REASONS[cfg.sft.mode]}")
        if cfg.trainer.torch_threads:
            torch.set_num_threads(cfg.trainer.torch_threads)
        device = next(model.parameters()).device
        if config.policy.precision == "auto":
            native = "runs" if cfg.policy.precision == "bf16" else "has no native"
            self.console.print(
                f"policy.precision=auto chose {cfg.policy.precision}: {device} {native} bfloat16 matrix products"
            )
        try:
            check_precision(cfg.policy.precision, device)
        except ValueError as exc:
            raise ConfigError(f"config key 'policy.precision': {exc}") from None
        self.dist = init_distributed(device)
        if self.dist.enabled and not cfg.trainer.run_dir:
            raise ValueError("config key 'trainer.run_dir' must be set when training on several processes")
        if not self.dist.is_main:
            self.console = Console(quiet=True)  # rank 0 reports for everyone
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=cfg.optim.lr,
            betas=cfg.optim.betas,
            eps=cfg.optim.adam_eps,
            weight_decay=cfg.optim.weight_decay,
        )
        self.seed_stream = np.random.default_rng([cfg.trainer.seed, 1])
        self.learner = Learner(model, self.optimizer, cfg, np.random.default_rng([cfg.trainer.seed, 2]), self.dist)
        self.iteration = 0
        self.warned_blind_step_credit = False  # said once per run: it is the environment's nature, not an event
        self.nonfinite_streak = 0  # optimizer steps skipped for a non-finite loss or gradient since the last one taken
        self.env_failure_kinds: set[str] = set()  # environment errors already printed (envpool.failure_kind)
        self.failing_streak = 0  # iterations running in which more than half of the trajectories failed
        self.state: dict[str, Any] = {"best_success": -1.0, "best_iteration": -1, "elapsed_s": 0.0, "engine_calls": 0}
        self.started = self._open_run_dir(resume, resume_from)
        if self.dist.is_main:
            save_config(cfg, self.run_dir / "config.yaml")
        # Rank 0 generates, evaluates, logs and checkpoints.
        self.engine, self.pool, self.logger = engine, None, None
        self._owns_engine = engine is None
        if self.dist.is_main:
            if engine is None:
                self.engine = engine_from_config(cfg, model, tokenizer)
            elif self.started:
                self.engine.update_weights(model)  # the engine was built before the checkpoint was loaded
            if hasattr(self.engine, "calls"):
                self.engine.calls = int(self.state["engine_calls"])  # the per-call sampling seeds continue
            self.pool = pool_from_config(make_env, cfg)
            self.logger = RunLogger(
                self.run_dir,
                tensorboard=cfg.logging.tensorboard,
                console=self.console,
                resume_iteration=self.iteration if self.started else None,
            )

    @classmethod
    def from_config(
        cls,
        config: Config,
        *,
        model: torch.nn.Module | None = None,
        tokenizer=None,
        make_env: EnvFactory | None = None,
        engine: Engine | None = None,
        **kwargs: Any,
    ) -> Trainer:
        """A trainer whose objects are built from ``config``'s names (the policy, ``env.id`` with
        ``env.kwargs`` and ``env.imports``, the engine), except those passed in. Seeds python, numpy
        and torch with ``trainer.seed`` first. ``kwargs`` go to the constructor (``resume``, ...)."""
        from transformers.utils import logging as hf_logging

        from agent_rl.training.models.policy import load_policy

        hf_logging.disable_progress_bar()  # our own progress display replaces the per-shard bars
        make_env = make_env or env_factory(config)  # the constructor resolves the config
        seed_everything(config.trainer.seed)
        if model is None:
            device = resolve_device(config.policy.device)
            model, tokenizer = load_policy(config.policy.name_or_path, device=device, cache_dir=config.policy.cache_dir)
        if tokenizer is None:
            raise ValueError("a model needs its tokenizer: pass both")
        return cls(config, model=model, tokenizer=tokenizer, make_env=make_env, engine=engine, **kwargs)

    # ---- one iteration ----------------------------------------------------------------------------
    def train_iteration(self, progress: Progress) -> dict[str, float]:
        """Rollout -> anchor keys -> credit -> update -> weight sync; returns the iteration's metrics."""
        cfg = self.config
        metrics: dict[str, float] = {}
        batch = advantages = None
        why_skipped = "every row has zero advantage"
        if self.dist.is_main:
            with timed(metrics, "time/rollout"):
                batch, stats = collect_rollouts(
                    self.pool, self.engine, self.tokenizer, cfg.rollout, self.seed_stream, progress=progress
                )
            metrics.update({f"rollout/{name}": stats[key] for name, key in ROLLOUT_METRICS.items()})
            self._report_env_failures(stats)
            if len(batch):  # dynamic sampling may keep no group: nothing to learn from this round
                with timed(metrics, "time/advantage"):
                    batch.anchor_key = batch_anchor_keys(
                        batch,
                        cfg.env.anchor_key,
                        history_turns=cfg.rollout.history_turns,
                        history_observations=cfg.rollout.history_observations,
                    )
                    credit = compute_advantages(batch, cfg.algo)
                metrics.update(credit.metrics())
                blind = credit.blind_step_credit()
                if blind and not self.warned_blind_step_credit:
                    self.warned_blind_step_credit = True
                    self.console.print(
                        f"[yellow]warning[/]: iteration {self.iteration}: {blind}; env.anchor_key="
                        f"{cfg.env.anchor_key} may never repeat in {cfg.env.id} (see anchors/grouped_fraction)"
                    )
                advantages = credit.advantages
                if credit.filtered_out():
                    why_skipped = (
                        "the variance filter (algo.keep_groups) dropped every group: each group's returns "
                        "were all equal"
                    )
            else:
                batch = None
        with timed(metrics, "time/update"):
            learned = self.learner.update(batch, advantages, progress)
        metrics.update(learned)
        self._guard_nonfinite(learned)
        if not learned or learned.get("update/skipped"):  # nothing was learned, nothing to sync
            if learned:
                self.console.print(f"iteration {self.iteration}: {why_skipped}; no optimizer step")
            return metrics
        if self.dist.is_main:
            with timed(metrics, "time/sync"):
                self.engine.update_weights(self.model)
        return metrics

    def _report_env_failures(self, stats: dict[str, Any]) -> None:
        """Print the first environment error of each kind once and the iteration's count of failed
        trajectories; stop the run when ``trainer.max_failed_share`` of them failed, or more than
        half in two iterations running."""
        failures = stats["failures"]
        for failure in failures:
            if (kind := failure_kind(failure)) not in self.env_failure_kinds:
                self.env_failure_kinds.add(kind)
                self.console.print(f"[yellow]environment error[/] in {self.config.env.id}: {failure}")
        played = len(failures) + int(stats["trajectories"])
        share = len(failures) / max(played, 1)
        self.failing_streak = self.failing_streak + 1 if share > 0.5 else 0
        if not failures:
            return
        self.console.print(
            f"iteration {self.iteration}: {len(failures)} of {played} trajectories failed in the environment "
            "and are left out"
        )
        limit = self.config.trainer.max_failed_share
        if share >= limit or self.failing_streak >= 2:
            count = f"{len(failures)} of {played} trajectories failed at iteration {self.iteration}"
            why = (
                f"{count} (trainer.max_failed_share={limit})"
                if share >= limit
                else f"more than half of the trajectories failed in two iterations running ({count})"
            )
            raise EnvironmentFailures(f"{why}; the first error: {failures[0]}; the run stops ({self._how_to_go_on()})")

    def _how_to_go_on(self) -> str:
        """What the last checkpoint holds and the command that continues from it."""
        saved = checkpoint.saved_iteration(self.run_dir)
        return (
            "no checkpoint was saved yet"
            if saved is None
            else f"the last checkpoint is iteration {saved}; continue with: {checkpoint.resume_command(self.run_dir)}"
        )

    def _guard_nonfinite(self, learned: dict[str, float]) -> None:
        """Say when the learner skipped steps whose loss or gradient norm was not finite, and stop the
        run once ``NONFINITE_STOP`` such steps came with no finite step between them: the skipped steps
        changed no weight, so the last checkpoint holds the last good ones."""
        skipped = int(learned.get("update/nonfinite_steps", 0))
        if not skipped:
            if learned.get("update/optimizer_steps"):
                self.nonfinite_streak = 0
            return
        self.nonfinite_streak = skipped if learned.get("update/optimizer_steps") else self.nonfinite_streak + skipped
        self.console.print(
            f"[yellow]warning[/]: iteration {self.iteration}: {skipped} optimizer step(s) skipped: "
            "the loss or the gradient norm was not finite"
        )
        if self.nonfinite_streak >= NONFINITE_STOP:
            raise NonFiniteUpdates(
                f"{self.nonfinite_streak} optimizer steps in a row had a non-finite loss or gradient "
                f"norm at iteration {self.iteration}; they changed no weight and the run stops "
                f"({self._how_to_go_on()})"
            )

    def evaluate(self, progress: Progress) -> dict[str, float]:
        """Held-out evaluation (``agent_rl.training.loop.evaluation.evaluate_heldout``), timed."""
        metrics: dict[str, float] = {}
        with timed(metrics, "time/eval"):
            metrics.update(evaluate_heldout(self.pool, self.engine, self.tokenizer, self.config, progress))
        return metrics

    # ---- the loop ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        """Train to ``trainer.iterations`` (or the target success); returns a summary."""
        cfg = self.config
        n_params = sum(p.numel() for p in self.model.parameters())
        n_trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        trained = f" (trained {n_trained / 1e6:.2f}M)" if n_trained < n_params else ""
        self.console.print(
            f"[bold]agent-rl train[/] env={cfg.env.id} algo={cfg.algo.preset} engine={cfg.engine.kind} "
            f"device={next(self.model.parameters()).device} params={n_params / 1e6:.2f}M{trained} "
            f"anchor={cfg.env.anchor_key} "
            f"run_dir={self.run_dir}"
        )
        reached = False
        try:
            if not self.started:
                reached = self._warm_start()
            if cfg.algo.kl_coef > 0:  # the KL reference: the post-SFT policy
                sft = checkpoint.find_checkpoint(self.run_dir, "sft").model_dir if self.iteration > 0 else None
                self.learner.freeze_reference(sft)
            while not reached and self.iteration < cfg.trainer.iterations:
                clock = time.perf_counter()
                self.iteration += 1
                with self._progress() as progress:
                    progress.add_task(f"iteration {self.iteration}/{cfg.trainer.iterations}", total=None)
                    metrics = self.train_iteration(progress)
                    if self.dist.is_main and self._eval_due(self.iteration):
                        metrics.update(self.evaluate(progress))
                if self.dist.is_main:
                    reached = self._finish_iteration(metrics, clock)
                reached = broadcast_flag(reached, self.dist)
        finally:
            if self.logger is not None:
                self.logger.close()
        summary = {
            "run_dir": str(self.run_dir),
            "iterations": self.iteration,
            "best_greedy_success": self.state["best_success"],
            "best_iteration": self.state["best_iteration"],
            "reached_target": reached,
            "elapsed_s": self.state["elapsed_s"],
        }
        self.console.print(
            f"[bold green]done[/]: best greedy eval success {summary['best_greedy_success']:.2f} at iteration "
            f"{summary['best_iteration']} ({summary['elapsed_s']:.0f} s); checkpoints in {self.run_dir / 'checkpoints'}"
        )
        return summary

    def _warm_start(self) -> bool:
        """Iteration 0: the supervised warm start on rank 0, its evaluation, then every rank takes its weights."""
        clock = time.perf_counter()
        reached = False
        if self.dist.is_main:
            metrics = warm_start(self.model, self.tokenizer, self.make_env, self.config, self.console, self.engine)
            self.engine.update_weights(self.model)
            if self.config.trainer.eval_first:
                with self._progress() as progress:
                    metrics.update(self.evaluate(progress))
            reached = self._finish_iteration(metrics, clock)
        broadcast_parameters(self.model, self.dist)
        self.started = True
        return broadcast_flag(reached, self.dist)

    def _eval_due(self, iteration: int) -> bool:
        every = self.config.trainer.eval_every
        return iteration == self.config.trainer.iterations or (every > 0 and iteration % every == 0)

    def _finish_iteration(self, metrics: dict[str, float], clock: float) -> bool:
        """Track the best eval, log, checkpoint; True when the target success is reached (and
        confirmed, see ``trainer.confirm_episodes``)."""
        cfg = self.config
        success = metrics.get("eval/greedy_success")
        improved = success is not None and success > self.state["best_success"]
        if improved:
            self.state["best_success"], self.state["best_iteration"] = success, self.iteration
        self.state["elapsed_s"] += time.perf_counter() - clock
        metrics["time/elapsed"] = self.state["elapsed_s"]
        self.logger.log(self.iteration, metrics)
        if self.on_iteration is not None:
            self.on_iteration(self.iteration, metrics)
        if improved or self.iteration % cfg.trainer.save_every == 0 or self.iteration == cfg.trainer.iterations:
            self._save(best=improved)
        return target_reached(metrics, cfg.trainer.target_success)

    # ---- run directory and checkpoints ----------------------------------------------------------------
    def _open_run_dir(self, resume: bool | str, resume_from: str) -> bool:
        """Set ``run_dir``, remove leftovers of interrupted saves, then restore the checkpoint
        ``resume_from`` (``resume``: True, or "auto" when the directory holds checkpoints) or claim
        the directory for a new run; True when the run was resumed."""
        cfg = self.config
        if resume not in (False, True, "auto"):
            raise ValueError(f"resume must be False, True or 'auto', got {resume!r}")
        if resume_from not in checkpoint.POINTERS:
            raise ValueError(f"resume_from (--resume-from) must be one of {checkpoint.POINTERS}, got {resume_from!r}")
        if resume_from != "last" and not resume:
            raise ValueError(
                f"resume_from={resume_from!r} (--resume-from) applies only to a resumed run: resume=True "
                "or 'auto' (--resume RUN_DIR or --resume auto)"
            )
        if resume == "auto" and not cfg.trainer.run_dir:
            raise ConfigError(
                "config key 'trainer.run_dir': resuming with 'auto' needs a fixed run directory, "
                "the one a restarted job looks in"
            )
        self.run_dir = Path(cfg.trainer.run_dir) if cfg.trainer.run_dir else default_run_dir(cfg)
        cfg.trainer.run_dir = str(self.run_dir)
        if self.dist.is_main and (left := checkpoint.remove_leftovers(self.run_dir)):
            self.console.print(f"removed {len(left)} leftover(s) of an interrupted save from {self.run_dir}")
        if resume == "auto":
            resume = broadcast_flag(self.dist.is_main and checkpoint.holds_checkpoints(self.run_dir), self.dist)
            if not resume:
                self.console.print(f"no checkpoint in {self.run_dir}: starting a new run")
        if not resume:
            checkpoint.claim_run_dir(self.run_dir, self.dist)
            return False
        self.iteration, self.state = checkpoint.resume_run(
            self.run_dir,
            cfg,
            model=self.model,
            optimizer=self.optimizer,
            generators=self._generators(),
            may_change=RESUME_MAY_CHANGE,
            which=resume_from,
        )
        self.console.print(
            f"[bold]resumed[/] {self.run_dir} at iteration {self.iteration} ({resume_from!r} checkpoint)"
        )
        if self.dist.is_main and (moved := checkpoint.rewind(self.run_dir, resume_from)):
            self.console.print(
                f"pointers {', '.join(moved)} now name iteration {self.iteration}; the iterations after it run again"
            )
        saved_threads = self.state.get("torch_threads")
        if saved_threads is not None and saved_threads != torch.get_num_threads():
            self.console.print(
                f"[yellow]warning[/]: the checkpoint was written with {saved_threads} torch threads, this process has "
                f"{torch.get_num_threads()}: float sums are ordered differently, so the run continues correctly "
                "but not bit-identically to an uninterrupted one"
            )
        return True

    def _generators(self) -> dict[str, Any]:
        return {"seed_stream": self.seed_stream, "shuffle": self.learner.shuffle_rng}

    def _save(self, best: bool) -> None:
        self.state["engine_calls"] = int(getattr(self.engine, "calls", 0))
        self.state["torch_threads"] = torch.get_num_threads()  # sums depend on it: a resume checks it
        pointers = ("last", "best") if best else ("last",)
        if self.iteration == 0:
            pointers += ("sft",)
        checkpoint.save_checkpoint(
            self.run_dir,
            self.iteration,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            config=config_to_dict(self.config),
            trainer_state=self.state,
            generators=self._generators(),
            pointers=pointers,
        )

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold blue]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
            disable=not self.config.logging.console,
        )

    def close(self) -> None:
        """Release what the trainer built: its engine (not one passed in), its environments, the process group."""
        if self.engine is not None and self._owns_engine:
            self.engine.close()
        if self.pool is not None:
            self.pool.close()
        shutdown_distributed(self.dist)


def train(config: Config, **kwargs: Any) -> dict[str, Any]:
    """Build a trainer with :meth:`Trainer.from_config` (``kwargs``: objects replacing what the
    config names, ``resume``, ``resume_from``, ``console``, ``on_iteration``), run it and close it;
    returns the summary."""
    trainer = Trainer.from_config(config, **kwargs)
    try:
        return trainer.run()
    finally:
        trainer.close()
