"""Teacher-forced logprobs of responses given their prompts.

``response_logits`` forwards each token once however many rows share it (the prefix all prompts of a
batch share, then each distinct prompt) and repeats the KV caches over the rows;
``sequence_logprobs`` turns the logits into per-token logprobs, ``score_continuations`` scores many
rows in batches (the engines' ``score``) and ``recompute_logprobs`` scores a rollout batch with the
learner's weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agent_rl.core.batch import StepBatch
from agent_rl.training.infra.distributed import forward_precision
from agent_rl.training.models.prefix_sharing import prompt_cache, shared_prefix_length, shares_prefixes


def response_logits(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    precision: str = "fp32",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forced next-token logits at every response position: ``(logits, targets, mask)`` with
    shapes ``(B, T, V)``, ``(B, T)``, ``(B, T)``; ``T`` is the longest response and ``mask`` is 1.0 on
    real response tokens.

    Each token is forwarded once however many rows share it, in three passes that extend one KV cache:
    the prefix all prompts share (a system prompt, a rules text) as one sequence; then each distinct
    rest of a prompt once (the rows of a GRPO group share their first turn's prompt, and a weak policy
    revisits states), left-padded; then every row's response, right-padded, on its prompt's cache
    (the last response token predicts nothing and is not forwarded). Gradients flow back through the
    repeated caches, so the result equals B separate forward passes, gradients included, when grad
    mode is on. ``precision`` ``bf16`` runs the body under bfloat16 autocast and the output head in
    float32 (``agent_rl.training.infra.distributed.forward_precision``)."""
    if len(prompt_ids_list) != len(response_ids_list):
        raise ValueError(f"{len(prompt_ids_list)} prompts but {len(response_ids_list)} responses")
    if any(len(p) == 0 for p in prompt_ids_list):
        raise ValueError("every prompt needs at least one token")
    device = next(model.parameters()).device
    batch = len(prompt_ids_list)
    shared = shared_prefix_length(prompt_ids_list) if shares_prefixes(model) else 0
    response_width = max((len(r) for r in response_ids_list), default=0)
    responses = torch.zeros((batch, response_width), dtype=torch.long)
    response_mask = torch.zeros_like(responses)
    for i, r in enumerate(response_ids_list):
        responses[i, : len(r)] = torch.as_tensor(r, dtype=torch.long)
        response_mask[i, : len(r)] = 1
    targets, mask = responses.to(device), response_mask.to(device=device, dtype=torch.float32)
    if response_width == 0:
        return torch.zeros((batch, 0, model.config.vocab_size), device=device), targets, mask
    with forward_precision(model, device, precision):
        cache, logits, prompt_mask = prompt_cache(model, prompt_ids_list, shared, device, with_last_token=True)
        if response_width > 1:  # the prompt's last token predicted the first response token
            response_pass = model(
                input_ids=targets[:, :-1],
                attention_mask=torch.cat([prompt_mask, response_mask[:, :-1].to(device)], dim=1),
                position_ids=prompt_mask.sum(dim=1)[:, None] + torch.arange(response_width - 1, device=device),
                past_key_values=cache,
                logits_to_keep=response_width - 1,
                use_cache=True,
            )
            logits = torch.cat([logits, response_pass.logits], dim=1)
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
def score_continuations(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    continuation_ids_list: Sequence[Sequence[int]],
    temperature: float,
    precision: str = "fp32",
    batch_size: int = 64,
) -> list[np.ndarray]:
    """The logprob of each token of each continuation given its prompt at ``temperature`` (float32,
    one array per row), ``batch_size`` rows per forward pass (:func:`sequence_logprobs`)."""
    scored = []
    for start in range(0, len(prompt_ids_list), batch_size):
        logp, mask = sequence_logprobs(
            model,
            prompt_ids_list[start : start + batch_size],
            continuation_ids_list[start : start + batch_size],
            temperature,
            precision,
        )
        scored += [values[valid] for values, valid in zip(logp.cpu().numpy(), mask.cpu().numpy().astype(bool))]
    return scored


def unsampled_rows(batch: StepBatch) -> np.ndarray:
    """The rows whose old logprobs are not the engine's at the sampling temperature: the turns the
    rollout explored (``batch.extras["explored"]``, placeholders) or decoded greedily
    (``batch.extras["greedy"]``). The learner scores them before an update."""
    none = np.zeros(len(batch), dtype=bool)
    return np.logical_or(batch.extras.get("explored", none), batch.extras.get("greedy", none))


def recompute_logprobs(
    model: torch.nn.Module,
    batch: StepBatch,
    micro_batch_size: int,
    temperature: float,
    precision: str = "fp32",
    rows: np.ndarray | None = None,
) -> tuple[list[np.ndarray], dict[str, float]]:
    """``batch``'s old logprobs with those of ``rows`` (a boolean mask; None: every row) scored by
    ``model``, and how far the engine's were from them; the :func:`unsampled_rows` are left out of the
    mismatch."""
    rows = np.ones(len(batch), dtype=bool) if rows is None else np.asarray(rows, dtype=bool)
    index = np.flatnonzero(rows)
    old_logprobs = list(batch.old_logprobs)
    scored = score_continuations(
        model,
        [batch.prompt_ids[i] for i in index],
        [batch.response_ids[i] for i in index],
        temperature,
        precision,
        micro_batch_size,
    )
    for row, values in zip(index, scored):
        old_logprobs[row] = values.astype(np.float32)
    engine_scored = rows & ~unsampled_rows(batch)
    diffs = [np.abs(old_logprobs[i] - batch.old_logprobs[i]) for i in np.flatnonzero(engine_scored)]
    if not diffs:
        return old_logprobs, {}
    flat = np.concatenate(diffs)
    return old_logprobs, {
        "update/logprob_mismatch_mean": float(flat.mean()) if flat.size else 0.0,
        "update/logprob_mismatch_max": float(flat.max()) if flat.size else 0.0,
    }
