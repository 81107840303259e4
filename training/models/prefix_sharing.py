"""Prompt prefixes that a batch shares, forwarded once: the learner's teacher-forced passes
(``agent_rl.training.loop.logprobs``) and the hf engine's prefill (``agent_rl.training.serving.engines``)
both run the prefix that every row starts with (a system prompt, a rules text) as one sequence and
repeat its KV cache over the rows, and both forward each distinct rest of a prompt once."""

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
