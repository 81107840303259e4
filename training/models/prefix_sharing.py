"""Prompt prefixes that a batch shares, forwarded once: the learner's teacher-forced passes
(``agent_rl.training.serving.logprobs``) and the hf engine's prefill (``agent_rl.training.serving.engines``)
both run the prefix that every row starts with (a system prompt, a rules text) as one sequence and
repeat its KV cache over the rows, and both forward each distinct rest of a prompt once
(``prompt_cache``)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def shared_prefix_length(prompts: Sequence[Sequence[int]]) -> int:
    """Tokens at the start of every prompt that are forwarded once for the batch: their longest common
    prefix, short of the shortest prompt's last token (whose logits predict what follows); 0 for a
    single prompt."""
    if len(prompts) < 2:
        return 0
    width = min(len(p) for p in prompts) - 1
    matrix = np.array([p[:width] for p in prompts]).reshape(len(prompts), width)
    differs = (matrix != matrix[0]).any(axis=0)
    return int(differs.argmax()) if differs.any() else width


def distinct_rests(prompts: Sequence[Sequence[int]], shared: int) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of a batch past their first ``shared`` tokens, in order of first
    appearance, and the index of each row's among them."""
    index: dict[bytes, int] = {}
    rests: list[list[int]] = []
    row_rest = []
    for prompt in prompts:
        rest = np.asarray(prompt[shared:], dtype=np.int64)
        row_rest.append(index.setdefault(rest.tobytes(), len(index)))
        if row_rest[-1] == len(rests):
            rests.append(rest.tolist())
    return rests, row_rest


def shares_prefixes(model: torch.nn.Module) -> bool:
    """Whether a prefix's KV cache can stand in for the prefix: every layer attends to all earlier
    tokens (a sliding-window cache would drop some of them)."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    sliding = getattr(config, "sliding_window", None) is not None and getattr(config, "use_sliding_window", True)
    return all(kind == "full_attention" for kind in layer_types) and not sliding


def repeated_prefix_cache(model: torch.nn.Module, prefix: Sequence[int], rows: int, device: torch.device):
    """The KV cache of ``prefix`` (forwarded once, under the caller's grad and precision modes),
    repeated for ``rows`` rows."""
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    cache = model(input_ids=ids, use_cache=True).past_key_values
    cache.batch_repeat_interleave(rows)
    return cache


def prompt_cache(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    shared: int,
    device: torch.device,
    *,
    with_last_token: bool,
):
    """Every row's prompt cached with each token forwarded once: the first ``shared`` tokens as one
    sequence, then each distinct rest of a prompt, left-padded, then the caches repeated over the rows
    that share them. ``with_last_token`` False leaves each prompt's last token out (``generate``
    forwards it). Returns ``(cache, last_logits, mask)`` per row: the cache (None when nothing was
    forwarded), the logits of the last forwarded token of each prompt (None when there is none) and
    the attention mask over the cached columns. Under the caller's grad and precision modes."""
    rests, row_rest = distinct_rests(prompts, shared)
    if not with_last_token:
        rests = [rest[:-1] for rest in rests]
    width = max(len(rest) for rest in rests)
    rest_ids = torch.zeros((len(rests), width), dtype=torch.long)
    rest_mask = torch.zeros_like(rest_ids)
    for i, rest in enumerate(rests):
        rest_ids[i, width - len(rest) :] = torch.as_tensor(rest, dtype=torch.long)
        rest_mask[i, width - len(rest) :] = 1
    mask = torch.cat([rest_mask.new_ones((len(rests), shared)), rest_mask], dim=1).to(device)
    cache = repeated_prefix_cache(model, prompts[0][:shared], len(rests), device) if shared else None
    last_logits = None
    if width:
        rest_pass = model(
            input_ids=rest_ids.to(device),
            attention_mask=mask,
            position_ids=shared + (mask[:, shared:].cumsum(dim=1) - 1).clamp(min=0),
            past_key_values=cache,
            logits_to_keep=1,
            use_cache=True,
        )
        cache, last_logits = rest_pass.past_key_values, rest_pass.logits
    rows = torch.as_tensor(row_rest, dtype=torch.long, device=device)
    if cache is not None:
        cache.batch_select_indices(rows)
    return cache, None if last_logits is None else last_logits[rows], mask[rows]
