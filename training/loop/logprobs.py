"""Teacher-forced logprobs of responses given their prompts.

``response_logits`` forwards the prefix that all prompts of a batch share once and repeats its KV
cache over the rows; ``sequence_logprobs`` turns the logits into per-token logprobs and
``recompute_logprobs`` scores a rollout batch with the learner's weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from agent_rl.core.batch import StepBatch
from agent_rl.training.infra.distributed import forward_precision
from agent_rl.training.models.prefix_sharing import repeated_prefix_cache, shared_prefix_length, shares_prefixes


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
    shared = shared_prefix_length(prompt_ids_list) if shares_prefixes(model) else 0
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
            past = repeated_prefix_cache(model, prompt_ids_list[0][:shared], batch, device)
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
