"""The RL trainer: SFT warm start, then iterations of

    rollout -> anchor keys + advantages (GRPO family, + GiGPO step credit) -> PPO-style epochs over
    shuffled minibatches with gradient accumulation (optional KL to the frozen post-SFT reference)
    -> AdamW with gradient clipping -> weight sync to the engine,

with periodic evaluation on held-out seeds, ``best``/``last`` checkpoints and exact resume.

Seeds: rollout groups draw seeds in ``[0, 2**31 - 1)`` from the seed stream; evaluation uses the
fixed seeds ``2**31 + i``, which training can never draw, so evaluation is always on held-out states.
"""

from __future__ import annotations

import copy
import random
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from agent_rl.advantages import compute_advantages
from agent_rl.batch import StepBatch
from agent_rl.config import Config, config_to_dict, save_config
from agent_rl.losses import policy_loss
from anchors import compute_anchor_keys
from envs import EVAL_SEED_BASE
from training import checkpoint
from training.distributed import (
    all_reduce_gradients,
    broadcast_flag,
    broadcast_parameters,
    broadcast_ragged,
    init_distributed,
    shutdown_distributed,
)
from training.engines import make_engine, response_logits, sequence_logprobs, shared_prefix_length, vllm_available
from training.logger import RunLogger
from training.policy import load_policy
from training.rollout import SEED_HIGH, collect_rollouts, draw_seeds, evaluate
from training.sft import collect_demonstrations, train_supervised

assert EVAL_SEED_BASE > SEED_HIGH  # training seeds are drawn below SEED_HIGH

RESUME_MAY_CHANGE = ("trainer.iterations", "trainer.run_dir", "trainer.target_success", "trainer.confirm_episodes", "trainer.torch_threads", "logging", "engine", "scale")
"""Config keys a resumed run may change; any other difference refuses the checkpoint."""


# ---- the policy-gradient step ---------------------------------------------------------------------------


def _pad(rows: list[np.ndarray], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out.to(device)


def _forwarded_tokens(batches: list[np.ndarray], prompts: list[np.ndarray], prompt_lengths: np.ndarray,
                      response_lengths: np.ndarray) -> int:
    """Tokens ``response_logits`` forwards for ``batches``: the shared prefix once, then every row
    padded to the batch's longest rest of prompt and longest response."""
    total = 0
    for batch in batches:
        shared = shared_prefix_length([prompts[i] for i in batch])
        rest = int(prompt_lengths[batch].max()) - shared + int(response_lengths[batch].max())
        total += shared + len(batch) * rest
    return total


def anchor_keys(batch: StepBatch, kind: str, rollout) -> np.ndarray:
    """The anchor key of every row: what ``kind`` reads of the batch, and for ``context`` the history
    the prompts showed (their observations only when ``rollout.history_observations``)."""
    context = kind == "context"
    return compute_anchor_keys(
        kind, observations=batch.observation if rollout.history_observations or not context else None,
        errors=batch.error, states=batch.anchor_state, group_ids=batch.group_id if kind == "similarity" else None,
        actions=batch.action if context else None, traj_ids=batch.traj_id if context else None,
        history_turns=rollout.history_turns if context else None,
    )


RATIO_EXTREMES = {"ratio_max": max, "log_ratio_abs_max": max, "ratio_min": min}
"""Metrics reported as the extreme over an update's micro-batches and optimizer steps, not a mean."""


def minibatch_count(rows: int, optim) -> int:
    """Minibatches per epoch for a batch of ``rows`` rows: ``optim.minibatches``, or ``rows //
    optim.minibatch_size`` when a size is set; at least 1 and at most ``rows``."""
    wanted = rows // optim.minibatch_size if optim.minibatch_size else optim.minibatches
    return max(1, min(wanted, rows))


def plan_micro_batches(prompts: list[np.ndarray], responses: list[np.ndarray], rows: np.ndarray,
                       size: int) -> list[np.ndarray]:
    """Split ``rows`` into micro-batches of at most ``size`` rows that forward the fewest tokens.

    Two plans are costed (``_forwarded_tokens``) and the cheaper one wins:
    - rows sorted by length: the least padding;
    - rows clustered by the prompt prefix they share beyond the one common to all (the task of one
      group's episodes, say), length-sorted within a cluster, no micro-batch spanning two clusters:
      the longest prefixes that ``response_logits`` forwards once per micro-batch."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) <= 1:
        return [rows] if len(rows) else []
    selected = [prompts[i] for i in rows]
    prompt_lengths = np.array([len(p) for p in selected])
    response_lengths = np.array([len(responses[i]) for i in rows])
    prompt_matrix = np.full((len(rows), int(prompt_lengths.max())), -1, dtype=np.int64)  # -1: past the end
    prompt_matrix[np.arange(prompt_matrix.shape[1]) < prompt_lengths[:, None]] = np.concatenate(selected)
    total_lengths = prompt_lengths + response_lengths

    by_length = np.argsort(total_lengths, kind="stable")
    length_plan = np.split(by_length, np.arange(size, len(rows), size))

    lexical = np.lexsort(prompt_matrix.T[::-1])  # column 0 is the primary key
    differs = prompt_matrix[lexical[1:]] != prompt_matrix[lexical[:-1]]
    neighbour_prefix = np.where(differs.any(axis=1), differs.argmax(axis=1), prompt_matrix.shape[1])
    # A new cluster wherever neighbours share no more than every row does (no clusters if none do).
    splits = (neighbour_prefix == neighbour_prefix.min()) & (neighbour_prefix.max() > neighbour_prefix.min())
    cluster = np.empty(len(rows), dtype=np.int64)
    cluster[lexical] = np.concatenate([[0], np.cumsum(splits)])
    by_cluster = np.lexsort((total_lengths, cluster))
    cluster_sizes = np.bincount(cluster)
    rank_in_cluster = np.arange(len(rows)) - np.repeat(np.cumsum(cluster_sizes) - cluster_sizes, cluster_sizes)
    cluster_plan = np.split(by_cluster, np.flatnonzero(rank_in_cluster % size == 0)[1:])

    costs = [_forwarded_tokens(plan, selected, prompt_lengths, response_lengths) for plan in (length_plan, cluster_plan)]
    return [rows[batch] for batch in (length_plan, cluster_plan)[int(np.argmin(costs))]]


def accumulate_policy_gradient(
    model: torch.nn.Module,
    prompts: list[np.ndarray],
    responses: list[np.ndarray],
    old_logprobs: list[np.ndarray],
    advantages: np.ndarray,
    *,
    loss_kwargs: dict[str, Any],
    temperature: float,
    micro_batch_size: int,
    reference: torch.nn.Module | None = None,
    shard: tuple[int, int] = (0, 1),
) -> dict[str, float]:
    """Backpropagate the policy loss of one minibatch, ``micro_batch_size`` rows at a time.

    The gradient does not depend on the split: every micro-batch is normalized by the minibatch's
    global token count (``token_mean``) or row count (``seq_mean_*``), and a fixed ``norm_length``.
    Rows with zero advantage and no KL term have exactly zero gradient, so they are counted in the
    normalizers but never forwarded. ``shard=(rank, world_size)`` forwards only this rank's share of
    the rows (normalizers stay global), so summing the ranks' gradients gives the full gradient.
    Returns token-weighted metrics over the rows this call forwarded."""
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    kl_on = loss_kwargs.get("kl_coef", 0.0) > 0
    if kl_on and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if loss_kwargs["loss_agg"] == "seq_mean_token_sum_norm" and loss_kwargs.get("norm_length") is None:
        # The default (each micro-batch's padded width) would make the gradient depend on the split.
        raise ValueError("loss_agg 'seq_mean_token_sum_norm' needs a fixed norm_length")
    num_tokens = float(lengths.sum())
    num_rows = float((lengths > 0).sum() if loss_kwargs["loss_agg"] == "seq_mean_token_mean" else len(lengths))
    active = np.flatnonzero(((advantages != 0) | kl_on) & (lengths > 0))
    # Planned over all ranks, then each micro-batch is dealt round-robin: balanced and prefix-sharing.
    plan = plan_micro_batches(prompts, responses, active, micro_batch_size * shard[1])
    device = next(model.parameters()).device
    sums: dict[str, float] = defaultdict(float)
    tokens_seen = 0.0
    forwarded = 0
    for rows in (batch[shard[0] :: shard[1]] for batch in plan):
        if len(rows) == 0:
            continue
        forwarded += len(rows)
        batch_prompts = [prompts[i] for i in rows]
        batch_responses = [responses[i] for i in rows]
        logits, targets, mask = response_logits(model, batch_prompts, batch_responses)
        token_logp = F.log_softmax(logits.float() / temperature, dim=-1)
        logp = token_logp.gather(2, targets[..., None])[..., 0] * mask
        with torch.no_grad():
            entropy = -(token_logp.exp() * token_logp).sum(-1)
            ref_logp = sequence_logprobs(reference, batch_prompts, batch_responses, temperature)[0] if kl_on else None
        out = policy_loss(
            logp,
            _pad([old_logprobs[i] for i in rows], mask.shape[1], device),
            torch.as_tensor(advantages[rows], dtype=torch.float32, device=device),
            mask,
            ref_logp=ref_logp,
            entropy=entropy,
            num_tokens=num_tokens,
            num_rows=num_rows,
            **loss_kwargs,
        )
        out.loss.backward()
        weight = float(mask.sum())
        tokens_seen += weight
        sums["loss"] += float(out.loss.detach())
        for key, value in out.metrics.items():
            if key in RATIO_EXTREMES:
                sums[key] = RATIO_EXTREMES[key](sums.get(key, value), value)
            else:
                sums[key] += value * weight
    metrics = {k: (v if k in RATIO_EXTREMES or k == "loss" else v / max(tokens_seen, 1.0)) for k, v in sums.items()}
    metrics["active_rows"] = float(forwarded)
    return metrics


# ---- the trainer -------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def default_run_dir(config: Config) -> Path:
    name = config.env.id.split("/")[-1].lower()
    return Path("runs") / f"{name}-{config.algo.preset}-{time.strftime('%Y%m%d-%H%M%S')}"


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def env_anchor_default(env_id: str) -> str:
    """The registered default anchor key of ``env_id``; a clear error if it is not registered."""
    import gymnasium as gym

    from envs import text_env_specs

    specs = text_env_specs()
    if env_id in specs:
        return specs[env_id].default_anchor
    if env_id in gym.registry:  # a plain Gymnasium text env registered without register_text_env
        return "observation"
    raise ValueError(
        f"config key 'env.id': unknown environment {env_id!r}; registered text environments: "
        f"{', '.join(specs)} (import your module with env.imports=[module] or --import)"
    )


class Trainer:
    """Owns the model, optimizer, engine, RNG streams and run directory of one training run."""

    def __init__(
        self,
        config: Config,
        *,
        resume: bool = False,
        console: Console | None = None,
        on_iteration: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        """``on_iteration(iteration, metrics)`` is called on the main process after every logged
        iteration (0 is the warm start and its evaluation), e.g. to drive an outer progress display."""
        from transformers.utils import logging as hf_logging

        from envs import import_modules, load_plugins

        hf_logging.disable_progress_bar()  # our own progress display replaces the per-shard bars
        self.config = config
        cfg = config
        self.on_iteration = on_iteration
        self.console = console if console is not None else Console(quiet=not cfg.logging.console)
        if cfg.trainer.torch_threads:
            torch.set_num_threads(cfg.trainer.torch_threads)
        import_modules(cfg.env.imports)
        load_plugins()
        self.anchor_kind = cfg.env.anchor_key or env_anchor_default(cfg.env.id)
        self.loss_kwargs = cfg.algo.resolved()["loss_kwargs"]
        if self.loss_kwargs.get("norm_length") is None and self.loss_kwargs["loss_agg"] == "seq_mean_token_sum_norm":
            self.loss_kwargs["norm_length"] = cfg.rollout.max_new_tokens  # Dr.GRPO's constant normalizer
        self.device = resolve_device(cfg.policy.device)
        self.dist = init_distributed(self.device)
        if self.dist.enabled and not cfg.trainer.run_dir:
            raise ValueError("config key 'trainer.run_dir' must be set when training on several processes")
        if not self.dist.is_main:
            self.console = Console(quiet=True)  # rank 0 reports for everyone
        self.run_dir = Path(cfg.trainer.run_dir) if cfg.trainer.run_dir else default_run_dir(cfg)
        cfg.trainer.run_dir = str(self.run_dir)

        seed_everything(cfg.trainer.seed)
        self.model, self.tokenizer = load_policy(cfg.policy.name_or_path, device=self.device, cache_dir=cfg.policy.cache_dir)
        self.model.eval()  # no dropout: the learner's logprobs must match the engine's
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=cfg.optim.lr, betas=cfg.optim.betas, eps=cfg.optim.adam_eps,
            weight_decay=cfg.optim.weight_decay,
        )
        self.seed_stream = np.random.default_rng([cfg.trainer.seed, 1])
        self.shuffle_rng = np.random.default_rng([cfg.trainer.seed, 2])
        self.iteration = 0
        self.state: dict[str, Any] = {"best_success": -1.0, "best_iteration": -1, "elapsed_s": 0.0, "engine_calls": 0}
        engine_kind = cfg.engine.kind if cfg.engine.kind != "auto" else ("vllm" if vllm_available() else "hf")
        self.engine_kind = engine_kind

        checkpoint_dir = self.run_dir / checkpoint.CHECKPOINTS
        if resume:
            self._resume()
        else:
            # Rank 0 decides for everyone: it may write its first checkpoint before another rank looks.
            occupied = self.dist.is_main and checkpoint_dir.exists() and any(checkpoint_dir.iterdir())
            if broadcast_flag(occupied, self.dist):
                raise FileExistsError(
                    f"run directory {str(self.run_dir)!r} already holds checkpoints; resume it with "
                    f"--resume {self.run_dir} or choose another trainer.run_dir"
                )
            if self.dist.is_main:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                save_config(cfg, self.run_dir / "config.yaml")
        self.reference: torch.nn.Module | None = None  # built after the warm start, see run()
        # Rank 0 generates, evaluates, logs and checkpoints; every rank learns on its share of the rows.
        self.engine = self._make_engine() if self.dist.is_main else None
        self.pool = self._make_pool() if self.dist.is_main else None
        self.logger = RunLogger(
            self.run_dir, tensorboard=cfg.logging.tensorboard, console=self.console,
            resume_iteration=self.iteration if resume else None,
        ) if self.dist.is_main else None
        self.started = resume

    # ---- setup --------------------------------------------------------------------------------------
    def _make_engine(self):
        cfg = self.config
        if cfg.scale.engine_replicas > 0:
            from training.distributed import RayEngine

            return RayEngine(
                self.model, self.tokenizer, n_replicas=cfg.scale.engine_replicas, kind=self.engine_kind,
                seed=cfg.trainer.seed, address=cfg.scale.ray_address, num_cpus_per_replica=cfg.scale.num_cpus_per_actor,
                num_gpus_per_replica=cfg.scale.num_gpus_per_replica,
            )
        if self.engine_kind == "hf":
            engine = make_engine("hf", self.model, self.tokenizer, max_batch_size=cfg.engine.max_batch_size, seed=cfg.trainer.seed)
            engine.calls = int(self.state["engine_calls"])  # the per-call sampling seeds continue after a resume
            return engine
        return make_engine(
            "vllm", self.model, self.tokenizer, seed=cfg.trainer.seed,
            kv_cache_memory_bytes=cfg.engine.kv_cache_memory_bytes, enforce_eager=cfg.engine.enforce_eager,
        )

    def _make_pool(self):
        """Ray environment actors when ``scale.env_actors`` > 0; None keeps environments in-process."""
        cfg = self.config
        if cfg.scale.env_actors == 0:
            return None
        from training.envpool import RayEnvPool

        n_envs = max(cfg.rollout.n_groups * cfg.rollout.group_size, cfg.trainer.eval_episodes, cfg.trainer.confirm_episodes)
        return RayEnvPool(
            cfg.env.id, cfg.env.kwargs, n_envs, n_actors=cfg.scale.env_actors, imports=cfg.env.imports,
            address=cfg.scale.ray_address, num_cpus_per_actor=cfg.scale.num_cpus_per_actor,
        )

    def _generators(self) -> dict[str, Any]:
        return {"seed_stream": self.seed_stream, "shuffle": self.shuffle_rng}

    def _resume(self) -> None:
        found = checkpoint.find_checkpoint(self.run_dir, "last")
        self.state = checkpoint.restore(
            found, model=self.model, optimizer=self.optimizer, generators=self._generators(),
            config=config_to_dict(self.config), ignore_config=RESUME_MAY_CHANGE,
        )
        self.iteration = found.iteration
        if self.dist.is_main:
            save_config(self.config, self.run_dir / "config.yaml")
        self.console.print(f"[bold]resumed[/] {self.run_dir} at iteration {self.iteration}")

    def _reference_model(self) -> torch.nn.Module:
        """The frozen post-SFT policy (from the ``sft`` checkpoint when resuming)."""
        reference = copy.deepcopy(self.model)
        if self.iteration > 0:
            checkpoint.load_model_weights(reference, checkpoint.find_checkpoint(self.run_dir, "sft").model_dir)
        reference.requires_grad_(False)
        return reference.eval()

    def _progress(self) -> Progress:
        return Progress(
            TextColumn("[bold blue]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=self.console, transient=True, disable=not self.config.logging.console,
        )

    def warm_start(self) -> dict[str, float]:
        """Supervised warm start (``sft.mode``) on demonstrations in the rollout prompt format."""
        import gymnasium as gym

        cfg = self.config
        if cfg.sft.mode == "none" or cfg.sft.steps == 0:
            return {}
        rng = np.random.default_rng([cfg.trainer.seed, 3])
        env = gym.make(cfg.env.id, **cfg.env.kwargs)
        demos = collect_demonstrations(
            env, self.tokenizer, mode=cfg.sft.mode, episodes=cfg.sft.episodes,
            seeds=np.array(draw_seeds(rng, cfg.sft.episodes, set())), rng=rng, max_turns=cfg.rollout.max_turns,
            history_turns=cfg.rollout.history_turns, parser=cfg.rollout.parser,
            max_prompt_tokens=cfg.rollout.max_prompt_tokens, show_admissible=cfg.rollout.show_admissible_actions,
            history_observations=cfg.rollout.history_observations, system_prompt=cfg.rollout.system_prompt,
            perturb=cfg.sft.perturb,
        )
        env.close()
        metrics = train_supervised(
            self.model, demos, steps=cfg.sft.steps, lr=cfg.sft.lr, batch_size=cfg.sft.batch_size, rng=rng,
            progress=cfg.logging.console,
        )
        self.model.eval()
        self.console.print(
            f"SFT ({cfg.sft.mode}): {int(metrics['sft/pairs'])} pairs, {cfg.sft.steps} steps, "
            f"token accuracy {metrics['sft/token_accuracy']:.3f}, loss {metrics['sft/loss']:.3f}"
        )
        return metrics

    # ---- one iteration ----------------------------------------------------------------------------
    def train_iteration(self, progress: Progress) -> dict[str, float]:
        cfg = self.config
        metrics, timings = {}, {}
        rows: tuple[list, list, list, list] = ([], [], [], [])
        if self.dist.is_main:
            start = time.perf_counter()
            batch, stats = collect_rollouts(
                cfg.env.id, cfg.env.kwargs, self.engine, self.tokenizer, cfg.rollout, self.seed_stream,
                progress=progress, pool=self.pool,
            )
            timings["time/rollout"] = time.perf_counter() - start
            metrics = {
                "rollout/success_rate": stats["success_rate"],
                "rollout/return": stats["mean_return"],
                "rollout/length": stats["mean_length"],
                "rollout/invalid_rate": stats["invalid_action_rate"],
                "rollout/overlong_rate": stats["overlong_rate"],
                "rollout/failed_trajectories": stats["failed_trajectories"],
                "rollout/dropped_groups": stats["dropped_groups"],
                "rollout/rows": float(len(batch)),
                "rollout/tokens_per_s": stats["tokens_per_s"],
            }
            if len(batch):  # dynamic sampling may keep no group: nothing to learn from this round
                start = time.perf_counter()
                batch.anchor_key = anchor_keys(batch, self.anchor_kind, cfg.rollout)
                credit = compute_advantages(batch, cfg.algo)
                advantages = credit.advantages
                timings["time/advantage"] = time.perf_counter() - start
                metrics.update(credit.metrics())
                old_logprobs = batch.old_logprobs
                if cfg.trainer.recompute_old_logprobs:
                    old_logprobs, mismatch = self.recompute_logprobs(batch)
                    metrics.update(mismatch)
                rows = (batch.prompt_ids, batch.response_ids, old_logprobs, [advantages])
        prompts = broadcast_ragged(rows[0], torch.int64, self.dist)
        if not prompts:
            return {**metrics, **timings}
        responses = broadcast_ragged(rows[1], torch.int64, self.dist)
        old_logprobs = broadcast_ragged(rows[2], torch.float32, self.dist)
        (advantages,) = broadcast_ragged(rows[3], torch.float64, self.dist)

        start = time.perf_counter()
        metrics.update(self.update(prompts, responses, old_logprobs, advantages, progress))
        timings["time/update"] = time.perf_counter() - start

        if self.dist.is_main:
            start = time.perf_counter()
            self.engine.update_weights(self.model)
            timings["time/sync"] = time.perf_counter() - start
        return {**metrics, **timings}

    def update(
        self, prompts: list[np.ndarray], responses: list[np.ndarray], old_logprobs: list[np.ndarray],
        advantages: np.ndarray, progress: Progress,
    ) -> dict[str, float]:
        """PPO-style: ``optim.epochs`` passes over the rows, each shuffled and split into minibatches;
        one AdamW step (after clipping) per minibatch, so every step after the first learns from
        rows sampled by an older policy and the importance ratios and clip terms act. Under several
        processes every rank draws the same shuffle and backpropagates its share of each minibatch;
        the summed gradient is the single-process one."""
        cfg = self.config
        n = len(prompts)
        parts = minibatch_count(n, cfg.optim)
        task = progress.add_task("update", total=cfg.optim.epochs * parts)
        step_metrics: list[dict[str, float]] = []
        params = [p for p in self.model.parameters() if p.requires_grad]
        for _ in range(cfg.optim.epochs):
            for rows in np.array_split(self.shuffle_rng.permutation(n), parts):
                self.optimizer.zero_grad(set_to_none=True)
                metrics = accumulate_policy_gradient(
                    self.model,
                    [prompts[i] for i in rows],
                    [responses[i] for i in rows],
                    [old_logprobs[i] for i in rows],
                    advantages[rows],
                    loss_kwargs=self.loss_kwargs,
                    temperature=cfg.rollout.temperature,
                    micro_batch_size=cfg.optim.micro_batch_size,
                    reference=self.reference,
                    shard=(self.dist.rank, self.dist.world_size),
                )
                all_reduce_gradients(params, self.dist)
                clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
                metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, clip))
                self.optimizer.step()
                step_metrics.append(metrics)
                progress.update(task, advance=1)
        progress.remove_task(task)
        combined = {key: float(np.mean([m[key] for m in step_metrics if key in m])) for key in step_metrics[0]}
        for key, extreme in RATIO_EXTREMES.items():
            if key in combined:
                combined[key] = float(extreme(m[key] for m in step_metrics))
        combined["optimizer_steps"] = float(len(step_metrics))
        return {f"update/{k}": v for k, v in combined.items()}

    @torch.no_grad()
    def recompute_logprobs(self, batch: StepBatch) -> tuple[list[np.ndarray], dict[str, float]]:
        """Old logprobs from the training model, and how far the engine's were from them."""
        cfg = self.config
        recomputed, diffs = [], []
        for start in range(0, len(batch), cfg.optim.micro_batch_size):
            rows = range(start, min(start + cfg.optim.micro_batch_size, len(batch)))
            logp, mask = sequence_logprobs(
                self.model, [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows], cfg.rollout.temperature
            )
            for row, values, valid in zip(rows, logp.cpu().numpy(), mask.cpu().numpy().astype(bool)):
                recomputed.append(values[valid].astype(np.float32))
                diffs.append(np.abs(recomputed[-1] - batch.old_logprobs[row]))
        flat = np.concatenate(diffs) if diffs else np.zeros(1)
        return recomputed, {
            "update/logprob_mismatch_mean": float(flat.mean()),
            "update/logprob_mismatch_max": float(flat.max()),
        }

    def evaluate(self, progress: Progress) -> dict[str, float]:
        """Greedy (and sampled) success on the held-out seeds; when greedy success reaches the
        target, a greedy confirmation on ``trainer.confirm_episodes`` held-out seeds."""
        cfg = self.config
        modes = ("greedy", "sampled") if cfg.trainer.eval_sampled else ("greedy",)
        metrics = {}
        for mode in modes:
            metrics.update(self._evaluate_on(cfg.trainer.eval_episodes, mode, mode, progress))
        target = cfg.trainer.target_success
        if cfg.trainer.confirm_episodes and target is not None and metrics["eval/greedy_success"] >= target:
            metrics.update(self._evaluate_on(cfg.trainer.confirm_episodes, "greedy", "confirm_greedy", progress))
        return metrics

    def _evaluate_on(self, episodes: int, mode: str, name: str, progress: Progress) -> dict[str, float]:
        cfg = self.config
        stats = evaluate(
            cfg.env.id, cfg.env.kwargs, self.engine, self.tokenizer, [EVAL_SEED_BASE + i for i in range(episodes)],
            greedy=mode == "greedy", config=cfg.rollout, progress=progress, pool=self.pool,
        )
        return {
            f"eval/{name}_success": stats["success_rate"],
            f"eval/{name}_length": stats["mean_length"],
            f"eval/{name}_invalid_rate": stats["invalid_action_rate"],
        }

    # ---- the loop ---------------------------------------------------------------------------------
    def _save(self, best: bool) -> None:
        self.state["engine_calls"] = int(getattr(self.engine, "calls", 0))
        pointers = ("last", "best") if best else ("last",)
        if self.iteration == 0:
            pointers += ("sft",)
        checkpoint.save_checkpoint(
            self.run_dir, self.iteration, model=self.model, tokenizer=self.tokenizer, optimizer=self.optimizer,
            config=config_to_dict(self.config), trainer_state=self.state, generators=self._generators(), pointers=pointers,
        )

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
        target = cfg.trainer.target_success
        decisive = metrics.get("eval/confirm_greedy_success", success)  # present when a confirmation ran
        return decisive is not None and target is not None and decisive >= target

    def run(self) -> dict[str, Any]:
        """Train to ``trainer.iterations`` (or the target success); returns a summary."""
        cfg = self.config
        n_params = sum(p.numel() for p in self.model.parameters())
        self.console.print(
            f"[bold]agent-rl train[/] env={cfg.env.id} algo={cfg.algo.preset} engine={self.engine_kind} "
            f"device={self.device} params={n_params / 1e6:.2f}M anchor={self.anchor_kind} run_dir={self.run_dir}"
        )
        reached = False
        try:
            if not self.started:
                clock = time.perf_counter()
                if self.dist.is_main:
                    metrics = self.warm_start()
                    self.engine.update_weights(self.model)
                    with self._progress() as progress:
                        start = time.perf_counter()
                        metrics.update(self.evaluate(progress))
                        metrics["time/eval"] = time.perf_counter() - start
                    reached = self._finish_iteration(metrics, clock)
                broadcast_parameters(self.model, self.dist)  # every learner starts from rank 0's warm start
                reached = broadcast_flag(reached, self.dist)
                self.started = True
            if self.loss_kwargs.get("kl_coef", 0.0) > 0:
                self.reference = self._reference_model()
            while not reached and self.iteration < cfg.trainer.iterations:
                clock = time.perf_counter()
                self.iteration += 1
                with self._progress() as progress:
                    progress.add_task(f"iteration {self.iteration}/{cfg.trainer.iterations}", total=None)
                    metrics = self.train_iteration(progress)
                    if self.dist.is_main and self._eval_due(self.iteration):
                        start = time.perf_counter()
                        metrics.update(self.evaluate(progress))
                        metrics["time/eval"] = time.perf_counter() - start
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

    def close(self) -> None:
        if self.engine is not None:
            self.engine.close()
        if self.pool is not None:
            self.pool.close()
        shutdown_distributed(self.dist)


def train(
    config: Config,
    *,
    resume: bool = False,
    console: Console | None = None,
    on_iteration: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    """Build a :class:`Trainer` for ``config`` (or resume the run in ``config.trainer.run_dir``) and run it."""
    trainer = Trainer(config, resume=resume, console=console, on_iteration=on_iteration)
    try:
        return trainer.run()
    finally:
        trainer.close()


def evaluate_policy(
    target: str | Path,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    env_id: str | None = None,
    episodes: int | None = None,
    which: str = "best",
    sampled: bool = False,
    console: Console | None = None,
) -> dict[str, Any]:
    """Evaluate a run directory (its ``best``/``last`` checkpoint, its config) or a model directory
    (embedded/default config) on held-out seeds; returns the eval metrics."""
    from agent_rl.config import load_config
    from envs import import_modules, load_plugins

    target = Path(target)
    console = console or Console()
    is_run = (target / "config.yaml").is_file()
    base = list(overrides)
    if env_id is not None:
        base.insert(0, f"env.id={env_id}")
        if is_run and env_id != load_config(target / "config.yaml").env.id:
            base.insert(0, "env.kwargs={}")  # another environment's constructor arguments do not carry over
    config = load_config(target / "config.yaml" if is_run else None, base)
    if episodes is not None:
        config.trainer.eval_episodes = episodes
    config.trainer.eval_sampled = sampled
    import_modules(config.env.imports)
    load_plugins()
    model_dir = checkpoint.find_checkpoint(target, which).model_dir if is_run else target
    model, tokenizer = load_policy(model_dir, device=resolve_device(config.policy.device))
    kind = config.engine.kind if config.engine.kind != "auto" else ("vllm" if vllm_available() else "hf")
    engine_kwargs = (
        {"max_batch_size": config.engine.max_batch_size, "seed": config.trainer.seed}
        if kind == "hf"
        else {"seed": config.trainer.seed, "kv_cache_memory_bytes": config.engine.kv_cache_memory_bytes}
    )
    engine = make_engine(kind, model, tokenizer, **engine_kwargs)
    try:
        seeds = [EVAL_SEED_BASE + i for i in range(config.trainer.eval_episodes)]
        results: dict[str, Any] = {"model": str(model_dir), "env": config.env.id, "episodes": len(seeds)}
        for mode in ("greedy", "sampled") if sampled else ("greedy",):
            stats = evaluate(
                config.env.id, config.env.kwargs, engine, tokenizer, seeds,
                greedy=mode == "greedy", config=config.rollout,
            )
            results.update({f"{mode}_{k}": v for k, v in stats.items() if k in ("success_rate", "mean_length", "mean_return", "invalid_action_rate")})
    finally:
        engine.close()
    for key, value in results.items():
        console.print(f"{key:>28}: {value:.3f}" if isinstance(value, float) else f"{key:>28}: {value}")
    return results
