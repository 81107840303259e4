"""The RL loop. A run is a supervised warm start (iteration 0), then iterations of

    rollout -> anchor keys -> credit -> update -> weight sync -> evaluation -> checkpoint

``Trainer.train_iteration`` holds the first five steps and ``Trainer.run`` the loop around them;
each step is a call into the module that owns it.

A trainer takes objects: a model and its tokenizer, an environment factory (any zero-argument
callable returning a Gymnasium text env) and optionally an engine. ``Trainer.from_config`` builds
them from the config's names, as the ``agent-rl train`` command does. Under ``torchrun`` rank 0
collects rollouts, evaluates, logs and checkpoints; every rank learns on its share of the rows.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from rich.console import Console
from rich.progress import Progress

from agent_rl.config import Config, ConfigError, config_to_dict, save_config
from agent_rl.training.infra import checkpoint
from agent_rl.training.infra.distributed import (
    broadcast_flag,
    broadcast_parameters,
    init_distributed,
    resolve_device,
    shutdown_distributed,
)
from agent_rl.training.infra.logger import RunLogger, progress_bar, run_footer, run_header, timed
from agent_rl.training.infra.resolution import report_choices, resolve
from agent_rl.training.loop.credit import assign_credit
from agent_rl.training.loop.evaluation import eval_due, evaluate_heldout, target_reached
from agent_rl.training.loop.guards import FaultGuard
from agent_rl.training.loop.learner import Learner, adamw
from agent_rl.training.loop.rollout import collect_rollouts, next_replay_share, rollout_metrics
from agent_rl.training.loop.run_dir import open_run_dir
from agent_rl.training.loop.sft import warm_start
from agent_rl.training.models.policy import with_lora
from agent_rl.training.serving.engines import Engine, engine_from_config
from agent_rl.training.serving.envpool import EnvFactory, env_factory, pool_from_config


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


RL_FIRST_ENGINE_CALL = 1 << 32
"""The engine's call count at the first evaluation after the warm start (the per-call sampling seeds
of ``HFEngine``), beyond any count a warm start reaches."""


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
        model = with_lora(model, cfg.policy)
        self.model, self.tokenizer, self.make_env = model.eval(), tokenizer, make_env  # eval: no dropout
        self.on_iteration = on_iteration
        self.console = console if console is not None else Console(quiet=not cfg.logging.console)
        if cfg.trainer.torch_threads:
            torch.set_num_threads(cfg.trainer.torch_threads)
        device = next(model.parameters()).device
        report_choices(config, cfg, device, self.console.print)
        self.dist = init_distributed(device)
        if self.dist.enabled and not cfg.trainer.run_dir:
            raise ValueError("config key 'trainer.run_dir' must be set when training on several processes")
        if not self.dist.is_main:
            self.console = Console(quiet=True)  # rank 0 reports for everyone
        self.optimizer = adamw(model, cfg.optim)
        self.seed_stream = np.random.default_rng([cfg.trainer.seed, 1])
        self.learner = Learner(model, self.optimizer, cfg, np.random.default_rng([cfg.trainer.seed, 2]), self.dist)
        self.iteration = 0
        self.state: dict[str, Any] = {"best_success": -1.0, "best_iteration": -1, "elapsed_s": 0.0, "engine_calls": 0}
        self.engine, self.pool, self.logger = engine, None, None
        self._owns_engine = engine is None
        self.run_dir, resumed, self._run_dir_lock = open_run_dir(
            cfg,
            resume=resume,
            resume_from=resume_from,
            model=model,
            optimizer=self.optimizer,
            generators=self._generators(),
            dist=self.dist,
            console=self.console,
        )
        try:
            self._open(resumed)
        except BaseException:
            self.close()  # a retry in this process finds the run directory free
            raise

    def _open(self, resumed: tuple[int, dict[str, Any]] | None) -> None:
        """Continue a resumed run's state, write the config, and build the engine, environments and logger."""
        cfg = self.config
        if resumed is not None:
            self.iteration, self.state = resumed
        if cfg.rollout.target_pass_rate is not None:
            self.state.setdefault("replay_share", cfg.rollout.replay_start)
        self.started = resumed is not None
        self.guard = FaultGuard(cfg, self.console, lambda: checkpoint.how_to_go_on(self.run_dir))
        if self.dist.is_main:  # rank 0 generates, evaluates, logs and checkpoints
            save_config(cfg, self.run_dir / "config.yaml")
            if self.engine is None:
                self.engine = engine_from_config(cfg, self.model, self.tokenizer)
            elif self.started:
                self.engine.update_weights(self.model)  # the engine was built before the checkpoint was loaded
            if hasattr(self.engine, "calls"):
                self.engine.calls = int(self.state["engine_calls"])  # the per-call sampling seeds continue
            self.pool = pool_from_config(self.make_env, cfg)
            for key, uses_oracle, off in (
                ("rollout.target_pass_rate", cfg.rollout.target_pass_rate is not None, "null"),
                ("rollout.progress_reward", cfg.rollout.progress_reward > 0, "0"),
            ):
                if uses_oracle and not self.pool.has_oracle:
                    raise ConfigError(
                        f"config key '{key}': it needs oracle plans, and {self.pool.env_id} gives none "
                        f"(set it to {off})"
                    )
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

        from agent_rl.training.models.embedded import tokenizer_env_ids
        from agent_rl.training.models.policy import load_policy

        hf_logging.disable_progress_bar()  # our own progress display replaces the per-shard bars
        make_env = make_env or env_factory(config)  # the constructor resolves the config
        seed_everything(config.trainer.seed)
        if model is None:
            device = resolve_device(config.policy.device)
            model, tokenizer = load_policy(
                config.policy.name_or_path,
                device=device,
                cache_dir=config.policy.cache_dir,
                env_ids=tokenizer_env_ids(config.policy.tokenizer_envs),
            )
        if tokenizer is None:
            raise ValueError("a model needs its tokenizer: pass both")
        return cls(config, model=model, tokenizer=tokenizer, make_env=make_env, engine=engine, **kwargs)

    # ---- one iteration ----------------------------------------------------------------------------
    def train_iteration(self, progress: Progress) -> dict[str, float]:
        """Rollout -> anchor keys -> credit -> update -> weight sync; returns the iteration's metrics."""
        cfg = self.config
        metrics: dict[str, float] = {}
        batch = advantages = credit = None
        if self.dist.is_main:
            target, share = cfg.rollout.target_pass_rate, self.state.get("replay_share", 0.0)  # 0: no curriculum
            with timed(metrics, "time/rollout"):
                batch, stats = collect_rollouts(
                    self.pool,
                    self.engine,
                    self.tokenizer,
                    cfg.rollout,
                    self.seed_stream,
                    progress=progress,
                    replay_share=share,
                )
            metrics.update(rollout_metrics(stats))
            if target is not None:
                metrics["rollout/replay_share"] = share
                self.state["replay_share"] = next_replay_share(
                    share, stats["success_rate"], target, cfg.rollout.replay_step
                )
            self.guard.check_environments(self.iteration, stats)
            if len(batch):  # dynamic sampling may keep no group: nothing to learn from this round
                with timed(metrics, "time/advantage"):
                    credit = assign_credit(batch, cfg)
                metrics.update(credit.metrics())
                self.guard.check_credit(self.iteration, credit.blind_step_credit())
                advantages = credit.advantages
            else:
                batch = None
        with timed(metrics, "time/update"):
            learned = self.learner.update(batch, advantages, progress)
        metrics.update(learned)
        self.guard.check_updates(self.iteration, learned)
        if not learned or learned.get("update/skipped"):  # nothing was learned, nothing to sync
            if learned and credit is not None:
                self.console.print(f"iteration {self.iteration}: {credit.why_no_step()}; no optimizer step")
            return metrics
        if self.dist.is_main:
            with timed(metrics, "time/sync"):
                self.engine.update_weights(self.model)
        return metrics

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
        self.console.print(run_header(cfg, self.model, self.run_dir))
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
                    if self.dist.is_main and eval_due(self.iteration, cfg.trainer):
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
        self.console.print(run_footer(summary))
        return summary

    def _warm_start(self) -> bool:
        """Iteration 0: the supervised warm start on rank 0, its evaluation, then every rank takes its weights."""
        clock = time.perf_counter()
        reached = False
        if self.dist.is_main:
            metrics = warm_start(self.model, self.tokenizer, self.make_env, self.config, self.console, self.engine)
            self.engine.update_weights(self.model)
            if hasattr(self.engine, "calls"):
                # Sampling from here on does not depend on how many calls the warm start made, so runs
                # that share a warm start (one trained it, the others load it) share their sampling seeds.
                self.engine.calls = RL_FIRST_ENGINE_CALL
            if self.config.trainer.eval_first:
                with self._progress() as progress:
                    metrics.update(self.evaluate(progress))
            reached = self._finish_iteration(metrics, clock)
        broadcast_parameters(self.model, self.dist)
        self.started = True
        return broadcast_flag(reached, self.dist)

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

    def _generators(self) -> dict[str, Any]:
        return {"seed_stream": self.seed_stream, "shuffle": self.learner.shuffle_rng}

    def _save(self, best: bool) -> None:
        self.state["engine_calls"] = int(getattr(self.engine, "calls", 0))
        self.state["torch_threads"] = torch.get_num_threads()  # sums depend on it: a resume checks it
        checkpoint.save_checkpoint(
            self.run_dir,
            self.iteration,
            model=self.model,
            tokenizer=self.tokenizer,
            optimizer=self.optimizer,
            config=config_to_dict(self.config),
            trainer_state=self.state,
            generators=self._generators(),
            pointers=("last",) + ("best",) * best + ("sft",) * (self.iteration == 0),
        )

    def _progress(self) -> Progress:
        return progress_bar(self.console, enabled=self.config.logging.console)

    def close(self) -> None:
        """Release what the trainer built: its engine (not one passed in), its environments, the process group."""
        if self.engine is not None and self._owns_engine:
            self.engine.close()
        if self.pool is not None:
            self.pool.close()
        if self._run_dir_lock is not None:
            self._run_dir_lock.release()
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
