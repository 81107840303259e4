"""Which rows a minibatch forwards, and in which micro-batches.

- ``learnable_rows``: the rows with a gradient;
- ``merge_repeated_rows``: identical rows (same prompt, response and sign of advantage) forwarded once;
- ``plan_micro_batches``: rows split into micro-batches that forward the fewest tokens
  (``forwarded_tokens`` costs a plan).
"""

from __future__ import annotations

import numpy as np

from agent_rl.training.models.prefix_sharing import distinct_rests, shared_prefix_length


def forwarded_tokens(
    batches: list[np.ndarray], prompts: list[np.ndarray], prompt_lengths: np.ndarray, response_lengths: np.ndarray
) -> int:
    """Tokens ``response_logits`` (``agent_rl.training.serving.logprobs``) forwards for ``batches``: the
    shared prefix once, each distinct rest of a prompt once padded to the longest, then every row's
    response but its last token, padded to the longest."""
    total = 0
    for batch in batches:
        shared = shared_prefix_length([prompts[i] for i in batch])
        distinct = len(distinct_rests([prompts[i] for i in batch], shared)[0])
        rest = int(prompt_lengths[batch].max()) - shared
        total += shared + distinct * rest + len(batch) * max(int(response_lengths[batch].max()) - 1, 0)
    return total


def plan_micro_batches(
    prompts: list[np.ndarray], responses: list[np.ndarray], rows: np.ndarray, size: int
) -> list[np.ndarray]:
    """Split ``rows`` into micro-batches of at most ``size`` rows that forward the fewest tokens.

    Two plans are costed (``forwarded_tokens``) and the cheaper one wins:
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

    costs = [forwarded_tokens(plan, selected, prompt_lengths, response_lengths) for plan in (length_plan, cluster_plan)]
    return [rows[batch] for batch in (length_plan, cluster_plan)[int(np.argmin(costs))]]


def learnable_rows(responses: list[np.ndarray], advantages: np.ndarray, kl_on: bool) -> np.ndarray:
    """Indices of the rows with a gradient: a response token and a non-zero advantage (any advantage
    with a KL term, which pulls every row towards the reference)."""
    lengths = np.array([len(r) for r in responses], dtype=np.int64)
    return np.flatnonzero(((np.asarray(advantages) != 0) | kl_on) & (lengths > 0))


def merge_repeated_rows(
    prompts: list[np.ndarray],
    responses: list[np.ndarray],
    rows: np.ndarray,
    advantages: np.ndarray,
    choice_ids: list[np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(representatives, advantages, counts)``: one row for each group of ``rows`` with the same
    prompt, the same response, the same offered tokens (``choice_ids``, where given) and the same
    sign of advantage, carrying the group's summed advantage and its size. A policy stuck in a loop
    writes the same reply to the same prompt turn after turn; such rows have the same logprobs and
    ratios, and the clipped surrogate is linear in the advantage on either side of 0 (as CISPO's is
    everywhere), so the representative's loss is the sum of theirs and each group is forwarded once."""
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) < 2:
        return rows, advantages[rows], np.ones(len(rows), dtype=np.int64)
    offered = (
        [np.zeros(0, dtype=np.int64)] * len(prompts) if choice_ids is None else [c.reshape(-1) for c in choice_ids]
    )
    # -3 separates the parts (no token id); offered ids are (response tokens, K): their length fixes K.
    pieces = [piece for i in rows for piece in (prompts[i], (-3,), responses[i], (-3,), offered[i])]
    lengths = np.array([len(prompts[i]) + len(responses[i]) + 2 + len(offered[i]) for i in rows])
    matrix = np.full((len(rows), int(lengths.max()) + 1), -2, dtype=np.int64)
    matrix[:, :-1][np.arange(matrix.shape[1] - 1) < lengths[:, None]] = np.concatenate(pieces)
    matrix[:, -1] = np.sign(advantages[rows])
    _, first, inverse, counts = np.unique(matrix, axis=0, return_index=True, return_inverse=True, return_counts=True)
    return rows[first], np.bincount(inverse.reshape(-1), weights=advantages[rows]), counts
