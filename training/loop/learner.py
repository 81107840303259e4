"""The learner: the PPO-style policy-gradient update of one iteration.

- ``accumulate_policy_gradient``: one minibatch's gradient, micro-batch by micro-batch
  (``agent_rl.training.loop.micro_batches`` plans them, ``agent_rl.training.serving.logprobs``
  forwards them); it does not depend on the split.
- :class:`Learner`: epochs of shuffled minibatches, one AdamW step each, gradients summed over
  data-parallel ranks.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import Progress

from agent_rl.config import Config, OptimizerConfig
from agent_rl.core.batch import StepBatch
from agent_rl.core.losses import LossSpec, combine_loss_metrics
from agent_rl.training.infra.checkpoint import load_model_weights
from agent_rl.training.infra.distributed import DistContext, all_reduce_gradients, broadcast_flag, broadcast_ragged
from agent_rl.training.loop.micro_batches import (
    forwarded_tokens,
    learnable_rows,
    merge_repeated_rows,
    plan_micro_batches,
)
from agent_rl.training.models.policy import is_lora
from agent_rl.training.serving.logprobs import (
    offered_entropy,
    offered_logprobs,
    padded_choices,
    recompute_logprobs,
    response_logits,
    sequence_logprobs,
    unsampled_rows,
)


def _pad(rows: list[np.ndarray], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out.to(device)


def minibatch_count(units: int, optim) -> int:
    """Minibatches per epoch for ``units`` learnable trajectories: ``units // optim.minibatch_size`` when
    a size is set, else ``optim.minibatches``; at least 1 and at most ``units``."""
    wanted = units // optim.minibatch_size if optim.minibatch_size else optim.minibatches
    return max(1, min(wanted, units))


def step_scale(units: int, optim) -> float:
    """The share of a full step a minibatch of ``units`` learnable trajectories takes: ``units /
    optim.minibatch_size``, at most 1; 1 when minibatches are counted (``optim.minibatches``)."""
    return min(1.0, units / optim.minibatch_size) if optim.minibatch_size else 1.0


def warmup_lr(step: int, lr: float, warmup_steps: int) -> float:
    """The learning rate of optimizer step ``step`` (1-based): linear warmup to ``lr`` over
    ``warmup_steps`` steps, then ``lr``."""
    return lr * min(1.0, step / warmup_steps) if warmup_steps else lr


def accumulate_policy_gradient(
    model: torch.nn.Module,
    prompts: list[np.ndarray],
    responses: list[np.ndarray],
    old_logprobs: list[np.ndarray],
    advantages: np.ndarray,
    *,
    loss: LossSpec,
    temperature: float,
    micro_batch_size: int,
    reference: torch.nn.Module | None = None,
    shard: tuple[int, int] = (0, 1),
    precision: str = "fp32",
    choice_ids: list[np.ndarray] | None = None,
) -> dict[str, float]:
    """Backpropagate the policy loss of one minibatch, ``micro_batch_size`` rows at a time.

    The gradient does not depend on the split: every micro-batch is normalized by the minibatch's
    global token count (``token_mean``) or row count (``seq_mean_*``), and a fixed ``norm_length``.
    Rows with zero advantage and no KL term have exactly zero gradient, so they are counted in the
    normalizers but never forwarded; without a KL term, repeated rows are forwarded once
    (:func:`merge_repeated_rows`). ``shard=(rank, world_size)`` forwards only this rank's share of
    the rows (normalizers stay global), so summing the ranks' gradients gives the full gradient.
    Returns token-weighted metrics over the rows this call stands for, the rows it forwarded
    (``active_rows``) and merged (``repeated_rows``), and the tokens the model forwarded for them
    (``forwarded_tokens``: prompts and responses, padding included). Rows with ``choice_ids``
    (``StepBatch.choice_ids``) are learned with the logprobs of their choice among listed actions."""
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    kl_on = loss.kl_on
    if kl_on and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if loss.loss_agg == "seq_mean_token_sum_norm" and loss.norm_length is None:
        # The default (each micro-batch's padded width) would make the gradient depend on the split.
        raise ValueError("loss_agg 'seq_mean_token_sum_norm' needs a fixed norm_length")
    num_tokens = float(lengths.sum())
    num_rows = float((lengths > 0).sum() if loss.loss_agg == "seq_mean_token_mean" else len(lengths))
    learnable = learnable_rows(responses, advantages, kl_on)
    merged, counts = np.asarray(advantages, dtype=np.float64).copy(), np.ones(len(advantages), dtype=np.int64)
    active = learnable
    if not kl_on:  # a KL term is not linear in the advantage: repeated rows then go one by one
        active, merged_advantages, active_counts = merge_repeated_rows(
            prompts, responses, learnable, merged, choice_ids
        )
        merged[active], counts[active] = merged_advantages, active_counts
    # Planned over all ranks, then each micro-batch is dealt round-robin: balanced and prefix-sharing.
    plan = plan_micro_batches(prompts, responses, active, micro_batch_size * shard[1])
    device = next(model.parameters()).device
    parts: list[dict[str, float]] = []
    weights: list[float] = []
    losses: list[float] = []
    forwarded = forwarded_count = 0
    for rows in (batch[shard[0] :: shard[1]] for batch in plan):
        if len(rows) == 0:
            continue
        forwarded += len(rows)
        batch_prompts = [prompts[i] for i in rows]
        batch_responses = [responses[i] for i in rows]
        batch_choices = None if choice_ids is None else [choice_ids[i] for i in rows]
        forwarded_count += forwarded_tokens(
            [np.arange(len(rows))], batch_prompts, np.array([len(p) for p in batch_prompts]), lengths[rows]
        )
        logits, targets, mask = response_logits(model, batch_prompts, batch_responses, precision)
        token_logp = F.log_softmax(logits.float() / temperature, dim=-1)
        offered = padded_choices(batch_choices, targets.shape[1], device)
        logp = offered_logprobs(token_logp, targets, offered) * mask
        with torch.no_grad():
            entropy = offered_entropy(token_logp, offered)
            ref_logp = (
                sequence_logprobs(reference, batch_prompts, batch_responses, temperature, precision, batch_choices)[0]
                if kl_on
                else None
            )
        out = loss(
            logp,
            _pad([old_logprobs[i] for i in rows], mask.shape[1], device),
            torch.as_tensor(merged[rows], dtype=torch.float32, device=device),
            mask,
            ref_logp=ref_logp,
            entropy=entropy,
            num_tokens=num_tokens,
            num_rows=num_rows,
        )
        out.loss.backward()
        weights.append(float((mask.sum(1).cpu() * torch.as_tensor(counts[rows], dtype=torch.float32)).sum()))
        parts.append(out.metrics)
        losses.append(float(out.loss.detach()))
    metrics = combine_loss_metrics(parts, weights)  # weighted by the tokens each micro-batch stands for
    # Each micro-batch's loss is its share of the minibatch's; a rank dealt no row adds 0 and still steps.
    metrics["loss"] = float(sum(losses))
    metrics["active_rows"] = float(forwarded)
    metrics["repeated_rows"] = float(len(learnable) - len(active))
    metrics["forwarded_tokens"] = float(forwarded_count)
    return metrics


# ---- the update of one iteration -------------------------------------------------------------------------


def no_step_metrics(learnable_rows: int, rows: int) -> dict[str, float]:
    """The metrics of an update that took no optimizer step (``update/skipped``)."""
    return {
        "update/skipped": 1.0,
        "update/optimizer_steps": 0.0,
        "update/learnable_rows": float(learnable_rows),
        "update/learnable_fraction": learnable_rows / rows,
        "update/forwarded_tokens": 0.0,
    }


def adamw(model: torch.nn.Module, optim: OptimizerConfig) -> torch.optim.AdamW:
    """AdamW over the parameters that train (all, or a LoRA model's adapters) with ``optim``'s settings."""
    return torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=optim.lr,
        betas=optim.betas,
        eps=optim.adam_eps,
        weight_decay=optim.weight_decay,
    )


class Learner:
    """Updates ``model`` with ``optimizer`` on the rows of each iteration (``config.optim``, the
    resolved ``config.algo``'s loss). Under several processes (``dist``) rank 0 passes the rows,
    every rank receives them, draws the same shuffle and backpropagates its share of each minibatch;
    the summed gradient is the single-process one."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        config: Config,
        shuffle_rng: np.random.Generator,
        dist: DistContext = DistContext(),
    ):
        self.model, self.optimizer, self.config, self.shuffle_rng, self.dist = (
            model,
            optimizer,
            config,
            shuffle_rng,
            dist,
        )
        algo = config.algo
        self.loss = LossSpec(
            **algo.loss_kwargs, kl_coef=algo.kl_coef, kl_estimator=algo.kl_estimator, kl_clamp=algo.kl_clamp
        )
        self.reference: torch.nn.Module | None = None
        """The frozen policy the KL term measures against (needed when ``algo.kl_coef`` > 0)."""

    @property
    def steps_taken(self) -> int:
        """Optimizer steps taken so far: AdamW's own count, which a checkpoint restores."""
        counts = [int(state["step"]) for state in self.optimizer.state.values() if "step" in state]
        return max(counts, default=0)

    def freeze_reference(self, weights_dir: Path | None = None) -> None:
        """Freeze a copy of the model (with the weights in ``weights_dir`` when given, e.g. the
        post-SFT checkpoint of a resumed run) as the reference of the KL term."""
        reference = copy.deepcopy(self.model)
        if weights_dir is not None:
            load_model_weights(reference, weights_dir)
        if is_lora(reference):  # merged: the reference's forward passes skip the adapter branches
            reference = reference.merge_and_unload()
        self.reference = reference.requires_grad_(False).eval()

    def update(self, batch: StepBatch | None, advantages: np.ndarray | None, progress: Progress) -> dict[str, float]:
        """Learn from ``batch`` (rank 0; None on the other ranks, or when there is nothing to learn);
        returns the update metrics, empty when there were no rows."""
        cfg = self.config
        prompts: list[np.ndarray] = []
        responses: list[np.ndarray] = []
        old_logprobs: list[np.ndarray] = []
        choice_ids: list[np.ndarray] = []
        rows_advantages: list[np.ndarray] = []
        rows_trajectories: list[np.ndarray] = []
        metrics: dict[str, float] = {}
        if batch is not None:
            prompts, responses, old_logprobs = batch.prompt_ids, batch.response_ids, batch.old_logprobs
            choice_ids = batch.choice_ids or []
            rows_advantages, rows_trajectories = [advantages], [np.asarray(batch.traj_id, dtype=np.int64)]
            rescore = cfg.trainer.recompute_old_logprobs | unsampled_rows(batch)
            if np.any(rescore):
                old_logprobs, metrics = recompute_logprobs(
                    self.model,
                    batch,
                    cfg.optim.micro_batch_size,
                    cfg.rollout.temperature,
                    cfg.policy.precision,
                    rescore,
                )
        prompts = broadcast_ragged(prompts, torch.int64, self.dist)
        if not prompts:
            return metrics
        responses = broadcast_ragged(responses, torch.int64, self.dist)
        old_logprobs = broadcast_ragged(old_logprobs, torch.float32, self.dist)
        offered: list[np.ndarray] | None = None  # rows learned as choices, if any row was chosen so
        if broadcast_flag(any(ids.size for ids in choice_ids), self.dist):
            # Each row's (tokens, K) offered ids go flat, after their shape.
            shapes = broadcast_ragged([np.array(ids.shape) for ids in choice_ids], torch.int64, self.dist)
            flat = broadcast_ragged([ids.reshape(-1) for ids in choice_ids], torch.int64, self.dist)
            offered = [ids.reshape(shape) for ids, shape in zip(flat, shapes)]
        (advantages,) = broadcast_ragged(rows_advantages, torch.float64, self.dist)
        (trajectories,) = broadcast_ragged(rows_trajectories, torch.int64, self.dist)
        return {
            **metrics,
            **self.optimize(prompts, responses, old_logprobs, advantages, progress, trajectories, offered),
        }

    def optimize(
        self,
        prompts: list[np.ndarray],
        responses: list[np.ndarray],
        old_logprobs: list[np.ndarray],
        advantages: np.ndarray,
        progress: Progress,
        trajectories: np.ndarray | None = None,
        choice_ids: list[np.ndarray] | None = None,
    ) -> dict[str, float]:
        """PPO-style: ``optim.epochs`` passes over the rows that carry a gradient, each shuffled and
        split into minibatches; one AdamW step (after clipping) per minibatch, so every step after the
        first learns from rows sampled by an older policy and the importance ratios and clip terms act.

        Steps follow signal: rows with zero advantage (and no KL term) have exactly zero gradient, so
        they are left out, and the trajectories that keep a row are the units the minibatches are
        made of (``trajectories``: each row's trajectory id; None counts every row as its own): the
        rows of one trajectory share its outcome, so a trajectory, not a row, is one sample of
        evidence. Their number sets the minibatch count (``minibatch_count``), and with
        ``optim.minibatch_size`` set, a minibatch of k trajectories short of it steps at ``lr * k /
        minibatch_size`` (``step_scale``): AdamW moves every weight by about lr whatever the
        gradient's size, so a batch with three learnable trajectories would otherwise move the
        policy as far as one with hundreds. A batch with no learnable row takes no step
        (``update/skipped``). A step whose loss or gradient norm is not finite is not taken: its
        gradient is dropped and ``update/nonfinite_steps`` counts it, so no NaN reaches a weight or
        AdamW's moments. ``choice_ids`` (``StepBatch.choice_ids``) has rows learned as choices among
        listed actions."""
        optim = self.config.optim
        learnable = learnable_rows(responses, advantages, self.loss.kl_on)
        if len(learnable) == 0:
            return no_step_metrics(0, len(prompts))
        owners = np.arange(len(prompts)) if trajectories is None else np.asarray(trajectories)
        units, unit_of_row = np.unique(owners[learnable], return_inverse=True)
        rows_of_unit = np.split(
            learnable[np.argsort(unit_of_row, kind="stable")], np.cumsum(np.bincount(unit_of_row))[:-1]
        )
        parts = minibatch_count(len(units), optim)
        extra_rows = rows_of_unit
        if optim.extra_passes_on == "positive":
            extra_rows = [rows[advantages[rows] > 0] for rows in rows_of_unit]
        extra_units = np.flatnonzero([len(rows) > 0 for rows in extra_rows])
        extra_parts = minibatch_count(len(extra_units), optim) if len(extra_units) else 0
        missing = optim.min_steps - optim.epochs * parts
        extra_epochs = -(-missing // extra_parts) if missing > 0 and extra_parts else 0  # ceil
        task = progress.add_task("update", total=optim.epochs * parts + extra_epochs * extra_parts)
        step_metrics: list[dict[str, float]] = []
        nonfinite = 0
        kl_stopped = False
        params = [p for p in self.model.parameters() if p.requires_grad]
        passes = [(rows_of_unit, np.arange(len(units)), parts)] * optim.epochs
        passes += [(extra_rows, extra_units, extra_parts)] * extra_epochs
        minibatches = (
            (pass_rows, pass_units[chosen])
            for pass_rows, pass_units, pass_parts in passes
            for chosen in np.array_split(self.shuffle_rng.permutation(len(pass_units)), pass_parts)
        )
        for index, (pass_rows, chosen) in enumerate(minibatches):
            rows = np.concatenate([pass_rows[u] for u in chosen])
            self.optimizer.zero_grad(set_to_none=True)
            metrics = accumulate_policy_gradient(
                self.model,
                [prompts[i] for i in rows],
                [responses[i] for i in rows],
                [old_logprobs[i] for i in rows],
                advantages[rows],
                loss=self.loss,
                temperature=self.config.rollout.temperature,
                micro_batch_size=optim.micro_batch_size,
                reference=self.reference,
                shard=(self.dist.rank, self.dist.world_size),
                precision=self.config.policy.precision,
                choice_ids=None if choice_ids is None else [choice_ids[i] for i in rows],
            )
            if optim.target_kl is not None and index > 0:
                # Not at the first minibatch, whose KL measures only engine/learner numerics; rank 0's
                # measure decides for every rank, so all of them stop at the same step.
                kl_stopped = broadcast_flag(metrics.get("approx_kl", 0.0) > optim.target_kl, self.dist)
                if kl_stopped:
                    self.optimizer.zero_grad(set_to_none=True)
                    break
            all_reduce_gradients(params, self.dist)
            clip = optim.grad_clip if optim.grad_clip > 0 else float("inf")
            metrics["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(params, clip))
            progress.update(task, advance=1)
            if not (math.isfinite(metrics["grad_norm"]) and math.isfinite(metrics["loss"])):
                # AdamW would spread a NaN or inf into every weight and its own moments: skip the step.
                self.optimizer.zero_grad(set_to_none=True)
                nonfinite += 1
                continue
            for group in self.optimizer.param_groups:
                base = group.setdefault("initial_lr", group["lr"])  # the optimizer's own rate, saved with it
                group["lr"] = warmup_lr(self.steps_taken + 1, base, optim.warmup_steps) * step_scale(len(chosen), optim)
            metrics["lr"] = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            step_metrics.append(metrics)
        progress.remove_task(task)
        if not step_metrics:
            return {**no_step_metrics(len(learnable), len(prompts)), "update/nonfinite_steps": float(nonfinite)}
        # A minibatch whose rows all have zero advantage forwards nothing and reports no loss terms:
        # each metric aggregates over the steps that report it.
        combined = combine_loss_metrics(step_metrics)
        combined["optimizer_steps"] = float(len(step_metrics))
        combined["nonfinite_steps"] = float(nonfinite)
        combined["skipped"] = 0.0
        if optim.target_kl is not None:
            combined["kl_stopped"] = float(kl_stopped)
        if optim.min_steps:
            combined["epochs"] = float(optim.epochs + extra_epochs)
        combined["learnable_rows"] = float(len(learnable))
        combined["learnable_fraction"] = len(learnable) / len(prompts)  # the share of rows with a gradient
        combined["learnable_trajectories"] = float(len(units))
        # The first step moves the policy that sampled the batch: its KL and entropy show how far.
        for key in ("approx_kl", "entropy"):
            if key in step_metrics[0]:
                combined[f"first_step_{key}"] = step_metrics[0][key]
        # This process's total over the update (under torch.distributed, its share of the rows).
        combined["forwarded_tokens"] = float(sum(m["forwarded_tokens"] for m in step_metrics))
        return {f"update/{k}": v for k, v in combined.items()}
