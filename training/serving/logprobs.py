"""Teacher-forced logprobs of responses given their prompts.

``response_logits`` forwards each token once however many rows share it (the prefix all prompts of a
batch share, then each distinct prompt) and repeats the KV caches over the rows;
``sequence_logprobs`` turns the logits into per-token logprobs (``offered_logprobs``: of a choice
among listed actions, where the rollout recorded the tokens each position offered),
``score_continuations`` scores many rows in batches (the engines' ``score``) and
``recompute_logprobs`` scores a rollout batch with the learner's weights.
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


def padded_choices(choice_ids: Sequence[np.ndarray] | None, width: int, device: torch.device) -> torch.Tensor | None:
    """The rows' offered token ids (``StepBatch.choice_ids``) as one ``(B, width, K)`` tensor padded
    with -1 (a row written freely offers none); None when no row offers any."""
    if choice_ids is None or not any(ids.size for ids in choice_ids):
        return None
    most = max(ids.shape[1] for ids in choice_ids if ids.size)
    out = torch.full((len(choice_ids), width, most), -1, dtype=torch.long)
    for i, ids in enumerate(choice_ids):
        out[i, : ids.shape[0], : ids.shape[1]] = torch.as_tensor(ids, dtype=torch.long)
    return out.to(device)


def offered_branches(token_logp: torch.Tensor, offered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which of ``offered``'s ``(B, T, K)`` slots hold a token (-1 pads) and each offered token's
    logprob from ``token_logp`` ``(B, T, V)``, -inf in the padding."""
    allowed = offered >= 0
    return allowed, token_logp.gather(2, offered.clamp(min=0)).masked_fill(~allowed, float("-inf"))


def offered_logprobs(token_logp: torch.Tensor, targets: torch.Tensor, offered: torch.Tensor | None) -> torch.Tensor:
    """Each target token's logprob from the full-vocabulary ``token_logp`` ``(B, T, V)``; where
    ``offered`` ``(B, T, K)`` lists the tokens a choice among listed actions allowed (-1 pads), less
    the log of their summed probability: the logprob under decoding constrained to the list. A
    position that offered only its own token gets exactly 0, and no gradient."""
    logp = token_logp.gather(2, targets[..., None])[..., 0]
    if offered is None:
        return logp
    allowed, branches = offered_branches(token_logp, offered)
    return logp - torch.where(allowed.any(dim=2), torch.logsumexp(branches, dim=2), 0.0)


def offered_entropy(token_logp: torch.Tensor, offered: torch.Tensor | None) -> torch.Tensor:
    """Each position's entropy ``(B, T)`` of the distribution the token was drawn from: the full
    vocabulary's ``token_logp`` ``(B, T, V)``, or where ``offered`` ``(B, T, K)`` lists a choice's
    tokens (-1 pads), those tokens' renormalized over them (0 where only one was offered)."""
    entropy = -(token_logp.exp() * token_logp).sum(-1)
    if offered is None:
        return entropy
    allowed, branches = offered_branches(token_logp, offered)
    choice_logp = branches - torch.logsumexp(branches, dim=2, keepdim=True)
    choice_entropy = -torch.where(allowed, choice_logp.exp() * choice_logp, 0.0).sum(-1)
    return torch.where(allowed.any(dim=2), choice_entropy, entropy)


def sequence_logprobs(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    response_ids_list: Sequence[Sequence[int]],
    temperature: float = 1.0,
    precision: str = "fp32",
    choice_ids: Sequence[np.ndarray] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each response token given its prompt at ``temperature`` (of the choice, where
    ``choice_ids`` says what a row's positions offered: :func:`offered_logprobs`): ``(logp, mask)``,
    both ``(B, T)``, in float32; padded positions hold 0. Gradients flow when grad mode is on."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    logits, targets, mask = response_logits(model, prompt_ids_list, response_ids_list, precision)
    offered = padded_choices(choice_ids, targets.shape[1], targets.device)
    logp = offered_logprobs(F.log_softmax(logits.float() / temperature, dim=-1), targets, offered)
    return logp * mask, mask


@torch.no_grad()
def score_continuations(
    model: torch.nn.Module,
    prompt_ids_list: Sequence[Sequence[int]],
    continuation_ids_list: Sequence[Sequence[int]],
    temperature: float,
    precision: str = "fp32",
    batch_size: int = 64,
    choice_ids: Sequence[np.ndarray] | None = None,
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
            None if choice_ids is None else choice_ids[start : start + batch_size],
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
        None if batch.choice_ids is None else [batch.choice_ids[i] for i in index],
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
