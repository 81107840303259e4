"""The learner: teacher-forced logprobs of responses, and the policy-gradient update.

- ``response_logits`` / ``sequence_logprobs``: the logits and logprobs of response tokens given
  their prompts, forwarding the prefix that all prompts of a batch share once.
- ``plan_micro_batches``: rows split into micro-batches that forward the fewest tokens.
- ``accumulate_policy_gradient``: one minibatch's gradient, micro-batch by micro-batch; it does not
  depend on the split.
- :class:`Learner`: the PPO-style update of one iteration: epochs of shuffled minibatches, one AdamW
  step each, gradients summed over data-parallel ranks.
"""

from __future__ import annotations

import copy
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from rich.progress import Progress

from agent_rl.batch import StepBatch
from agent_rl.config import Config
from agent_rl.losses import policy_loss
from agent_rl.training.infra.checkpoint import load_model_weights
from agent_rl.training.infra.distributed import DistContext, all_reduce_gradients, broadcast_ragged, forward_precision
from agent_rl.training.models.policy import is_lora

# ---- teacher-forced logprobs --------------------------------------------------------------------------


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens at the start of every prompt that ``response_logits`` forwards once for the batch: their
    longest common prefix, short of the shortest prompt's last token (whose logits predict its
    response); 0 for a single prompt."""
    if len(prompts) < 2:
        return 0
    width = min(len(p) for p in prompts) - 1
    matrix = np.array([p[:width] for p in prompts]).reshape(len(prompts), width)
    differs = (matrix != matrix[0]).any(axis=0)
    return int(differs.argmax()) if differs.any() else width


def _shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether a prefix's KV cache can stand in for the prefix: every layer attends to all earlier
    tokens (a sliding-window cache would drop some of them)."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    return all(kind == "full_attention" for kind in layer_types) and not sliding


def response_logits(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token logits at every response position: ``(logits, targets, mask)`` with
    shapes ``(B, T, V)``, ``(B, T)``, ``(B, T)``; ``T`` is the longest response and ``mask`` is 1.0 on
    real response tokens.

    The prefix that all prompts share (a system prompt, a task) is forwarded once and its KV cache
    repeated over the batch; gradients flow back through that cache, so the result equals B separate
    forward passes. The rest of each prompt is left-padded and its response right-padded, so every
    response starts at the same column and only the last ``T + 1`` positions need logits. Gradients
    flow when grad mode is on. ``precision`` ``bf16`` runs the body under bfloat16 autocast and the
    output head in float32 (``agent_rl.training.infra.distributed.forward_precision``)."""
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(f"{len(prompt_ids_list)} prompts but {len(response_ids_list)} responses")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    batch = len(prompt_ids_list)
    shared = shared_prefix_length(prompt_ids_list) if _shares_prefixes(model) else 0
    suffixes = [p[shared:] for p in prompt_ids_list]
    prompt_width = max(len(p) for p in suffixes)
    response_width = max((len(r) for r in response_ids_list), default=0)
    input_ids = torch.zeros((batch, prompt_width + response_width), dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for i, (p, r) in enumerate(zip(suffixes, response_ids_list)):
        input_ids[i, prompt_width - len(p) : prompt_width + len(r)] = torch.tensor([*p, *r], dtype=torch.long)
        attention_mask[i, prompt_width - len(p) : prompt_width + len(r)] = 1
    mask = attention_mask[:, prompt_width:].to(device=device, dtype=torch.float32)
    targets = input_ids[:, prompt_width:].to(device)
    if response_width == 0:
        return torch.zeros((batch, 0, model.config.vocab_size), device=device), targets, mask
    input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
    position_ids = shared + (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    past = None
    with forward_precision(model, device, precision):
        if shared:
            prefix = torch.tensor([list(prompt_ids_list[0][:shared])], dtype=torch.long, device=device)
            past = model(input_ids=prefix, use_cache=True).past_key_values
            past.batch_repeat_interleave(batch)
            attention_mask = torch.cat([attention_mask.new_ones((batch, shared)), attention_mask], dim=1)
        logits = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past,
            logits_to_keep=response_width + 1,
            use_cache=past is not None,
        ).logits[:, :-1]
    return logits, targets, mask


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each response token given its prompt at ``temperature``: ``(logp, mask)``, both
    ``(B, T)``, in float32; padded positions hold 0. Gradients flow when grad mode is on."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits, targets, mask = response_logits(model, prompt_ids_list, response_ids_list, precision)
    logp = F.log_softmax(logits.float() / temperature, dim=-1).gather(2, targets[..., None])[..., 0]
    return logp * mask, mask


@torch.no_grad()
def recompute_logprobs(
    model: torch.nn.Module, batch: StepBatch, micro_batch_size: int, temperature: float, precision: str = "fp32"
) -> tuple[list[np.ndarray], dict[str, float]]:
    """Old logprobs of ``batch``'s responses from ``model``, and how far the engine's were from them."""
    recomputed, diffs = [], []
    for start in range(0, len(batch), micro_batch_size):
        rows = range(start, min(start + micro_batch_size, len(batch)))
        logp, mask = sequence_logprobs(
            model, [batch.prompt_ids[i] for i in rows], [batch.response_ids[i] for i in rows], temperature, precision
        )
        for row, values, valid in zip(rows, logp.cpu().numpy(), mask.cpu().numpy().astype(bool)):
            recomputed.append(values[valid].astype(np.float32))
            diffs.append(np.abs(recomputed[-1] - batch.old_logprobs[row]))
    flat = np.concatenate(diffs) if diffs else np.zeros(1)
    return recomputed, {
        "update/logprob_mismatch_mean": float(flat.mean()),
        "update/logprob_mismatch_max": float(flat.max()),
    }


# ---- the policy-gradient step ---------------------------------------------------------------------------


def _pad(rows: list[np.ndarray], width: int, device: torch.device) -> torch.Tensor:
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.as_tensor(row, dtype=torch.float32)
    return out.to(device)


def _forwarded_tokens(
    batches: list[np.ndarray], prompts: list[np.ndarray], prompt_lengths: np.ndarray, response_lengths: np.ndarray
) -> int:
    """Tokens ``response_logits`` forwards for ``batches``: the shared prefix once, then every row
    padded to the batch's longest rest of prompt and longest response."""
    total = 0
    for batch in batches:
        shared = shared_prefix_length([prompts[i] for i in batch])
        rest = int(prompt_lengths[batch].max()) - shared + int(response_lengths[batch].max())
        total += shared + len(batch) * rest
    return total


RATIO_EXTREMES = {"ratio_max": max, "log_ratio_abs_max": max, "ratio_min": min}
"""Metrics reported as the extreme over an update's micro-batches and optimizer steps, not a mean."""


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


def plan_micro_batches(
    prompts: list[np.ndarray], responses: list[np.ndarray], rows: np.ndarray, size: int
) -> list[np.ndarray]:
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

    costs = [
        _forwarded_tokens(plan, selected, prompt_lengths, response_lengths) for plan in (length_plan, cluster_plan)
    ]
    return [rows[batch] for batch in (length_plan, cluster_plan)[int(np.argmin(costs))]]


def learnable_rows(responses: list[np.ndarray], advantages: np.ndarray, kl_on: bool) -> np.ndarray:
    """Indices of the rows with a gradient: a response token and a non-zero advantage (any advantage
    with a KL term, which pulls every row towards the reference)."""
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    return np.flatnonzero(((np.asarray(advantages) != 0) | kl_on) & (lengths > 0))


def merge_repeated_rows(
    prompts: list[np.ndarray], responses: list[np.ndarray], rows: np.ndarray, advantages: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(representatives, advantages, counts)``: one row for each group of ``rows`` with the same
    prompt, the same response and the same sign of advantage, carrying the group's summed advantage
    and its size. A policy stuck in a loop writes the same reply to the same prompt turn after turn;
    such rows have the same logprobs and ratios, and the clipped surrogate is linear in the
    advantage on either side of 0 (as CISPO's is everywhere), so the representative's loss is the
    sum of theirs and each group is forwarded once."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) < 2:
        return rows, advantages[rows], np.ones(len(rows), dtype=np.int64)
    pieces = [piece for i in rows for piece in (prompts[i], (-1,), responses[i])]  # -1: no token id
    lengths = np.array([len(prompts[i]) + 1 + len(responses[i]) for i in rows])
    matrix = np.full((len(rows), int(lengths.max()) + 1), -2, dtype=np.int64)
    matrix[:, :-1][np.arange(matrix.shape[1] - 1) < lengths[:, None]] = np.concatenate(pieces)
    matrix[:, -1] = np.sign(advantages[rows])
    _, first, inverse, counts = np.unique(matrix, axis=0, return_index=True, return_inverse=True, return_counts=True)
    return rows[first], np.bincount(inverse.reshape(-1), weights=advantages[rows]), counts


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
    precision: str = "fp32",
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
    (``forwarded_tokens``: prompts and responses, padding included)."""
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    kl_on = loss_kwargs.get("kl_coef", 0.0) > 0
    if kl_on and reference is None:
        raise ValueError("kl_coef > 0 needs a reference model")
    if loss_kwargs["loss_agg"] == "seq_mean_token_sum_norm" and loss_kwargs.get("norm_length") is None:
        # The default (each micro-batch's padded width) would make the gradient depend on the split.
        raise ValueError("loss_agg 'seq_mean_token_sum_norm' needs a fixed norm_length")
    num_tokens = float(lengths.sum())
    num_rows = float((lengths > 0).sum() if loss_kwargs["loss_agg"] == "seq_mean_token_mean" else len(lengths))
    learnable = learnable_rows(responses, advantages, kl_on)
    merged, counts = np.asarray(advantages, dtype=np.float64).copy(), np.ones(len(advantages), dtype=np.int64)
    active = learnable
    if not kl_on:  # a KL term is not linear in the advantage: repeated rows then go one by one
        active, merged_advantages, active_counts = merge_repeated_rows(prompts, responses, learnable, merged)
        merged[active], counts[active] = merged_advantages, active_counts
    # Planned over all ranks, then each micro-batch is dealt round-robin: balanced and prefix-sharing.
    plan = plan_micro_batches(prompts, responses, active, micro_batch_size * shard[1])
    device = next(model.parameters()).device
    sums: dict[str, float] = defaultdict(float)
    tokens_seen = 0.0
    forwarded = forwarded_tokens = 0
    for rows in (batch[shard[0] :: shard[1]] for batch in plan):
        if len(rows) == 0:
            continue
        forwarded += len(rows)
        batch_prompts = [prompts[i] for i in rows]
        batch_responses = [responses[i] for i in rows]
        forwarded_tokens += _forwarded_tokens(
            [np.arange(len(rows))], batch_prompts, np.array([len(p) for p in batch_prompts]), lengths[rows]
        )
        logits, targets, mask = response_logits(model, batch_prompts, batch_responses, precision)
        token_logp = F.log_softmax(logits.float() / temperature, dim=-1)
        logp = token_logp.gather(2, targets[..., None])[..., 0] * mask
        with torch.no_grad():
            entropy = -(token_logp.exp() * token_logp).sum(-1)
            ref_logp = (
                sequence_logprobs(reference, batch_prompts, batch_responses, temperature, precision)[0]
                if kl_on
                else None
            )
        out = policy_loss(
            logp,
            _pad([old_logprobs[i] for i in rows], mask.shape[1], device),
            torch.as_tensor(merged[rows], dtype=torch.float32, device=device),
            mask,
            ref_logp=ref_logp,
            entropy=entropy,
            num_tokens=num_tokens,
            num_rows=num_rows,
            **loss_kwargs,
        )
        out.loss.backward()
        weight = float((mask.sum(1).cpu() * torch.as_tensor(counts[rows], dtype=torch.float32)).sum())
        tokens_seen += weight
        sums["loss"] += float(out.loss.detach())
        for key, value in out.metrics.items():
            if key in RATIO_EXTREMES:
                sums[key] = RATIO_EXTREMES[key](sums.get(key, value), value)
            else:
                sums[key] += value * weight
    metrics = {k: (v if k in RATIO_EXTREMES or k == "loss" else v / max(tokens_seen, 1.0)) for k, v in sums.items()}
    metrics["active_rows"] = float(forwarded)
    metrics["repeated_rows"] = float(len(learnable) - len(active))
    metrics["forwarded_tokens"] = float(forwarded_tokens)
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
        self.loss_kwargs = {**algo.loss_kwargs, "kl_coef": algo.kl_coef, "kl_estimator": algo.kl_estimator}
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
        rows_advantages: list[np.ndarray] = []
        rows_trajectories: list[np.ndarray] = []
        metrics: dict[str, float] = {}
        if batch is not None:
            prompts, responses, old_logprobs = batch.prompt_ids, batch.response_ids, batch.old_logprobs
            rows_advantages, rows_trajectories = [advantages], [np.asarray(batch.traj_id, dtype=np.int64)]
            if cfg.trainer.recompute_old_logprobs:
                old_logprobs, metrics = recompute_logprobs(
                    self.model, batch, cfg.optim.micro_batch_size, cfg.rollout.temperature, cfg.policy.precision
                )
        prompts = broadcast_ragged(prompts, torch.int64, self.dist)
        if not prompts:
            return metrics
        responses = broadcast_ragged(responses, torch.int64, self.dist)
        old_logprobs = broadcast_ragged(old_logprobs, torch.float32, self.dist)
        (advantages,) = broadcast_ragged(rows_advantages, torch.float64, self.dist)
        (trajectories,) = broadcast_ragged(rows_trajectories, torch.int64, self.dist)
        return {**metrics, **self.optimize(prompts, responses, old_logprobs, advantages, progress, trajectories)}

    def optimize(
        self,
        prompts: list[np.ndarray],
        responses: list[np.ndarray],
        old_logprobs: list[np.ndarray],
        advantages: np.ndarray,
        progress: Progress,
        trajectories: np.ndarray | None = None,
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
        AdamW's moments."""
        optim = self.config.optim
        learnable = learnable_rows(responses, advantages, self.loss_kwargs.get("kl_coef", 0.0) > 0)
        if len(learnable) == 0:
            return no_step_metrics(0, len(prompts))
        owners = np.arange(len(prompts)) if trajectories is None else np.asarray(trajectories)
        units, unit_of_row = np.unique(owners[learnable], return_inverse=True)
        rows_of_unit = np.split(
            learnable[np.argsort(unit_of_row, kind="stable")], np.cumsum(np.bincount(unit_of_row))[:-1]
        )
        parts = minibatch_count(len(units), optim)
        task = progress.add_task("update", total=optim.epochs * parts)
        step_metrics: list[dict[str, float]] = []
        nonfinite = 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        for _ in range(optim.epochs):
            for chosen in np.array_split(self.shuffle_rng.permutation(len(units)), parts):
                rows = np.concatenate([rows_of_unit[u] for u in chosen])
                self.optimizer.zero_grad(set_to_none=True)
                metrics = accumulate_policy_gradient(
                    self.model,
                    [prompts[i] for i in rows],
                    [responses[i] for i in rows],
                    [old_logprobs[i] for i in rows],
                    advantages[rows],
                    loss_kwargs=self.loss_kwargs,
                    temperature=self.config.rollout.temperature,
                    micro_batch_size=optim.micro_batch_size,
                    reference=self.reference,
                    shard=(self.dist.rank, self.dist.world_size),
                    precision=self.config.policy.precision,
                )
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
                    group["lr"] = warmup_lr(self.steps_taken + 1, base, optim.warmup_steps) * step_scale(
                        len(chosen), optim
                    )
                metrics["lr"] = self.optimizer.param_groups[0]["lr"]
                self.optimizer.step()
                step_metrics.append(metrics)
        progress.remove_task(task)
        if not step_metrics:
            return {**no_step_metrics(len(learnable), len(prompts)), "update/nonfinite_steps": float(nonfinite)}
        # A minibatch whose rows all have zero advantage forwards nothing and reports no loss terms:
        # each metric aggregates over the steps that report it.
        keys = dict.fromkeys(key for m in step_metrics for key in m)
        combined = {key: float(np.mean([m[key] for m in step_metrics if key in m])) for key in keys}
        for key, extreme in RATIO_EXTREMES.items():
            if key in combined:
                combined[key] = float(extreme(m[key] for m in step_metrics if key in m))
        combined["optimizer_steps"] = float(len(step_metrics))
        combined["nonfinite_steps"] = float(nonfinite)
        combined["skipped"] = 0.0
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
