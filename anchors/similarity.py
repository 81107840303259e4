"""Near-duplicate clustering of texts with MinHash + LSH, vectorized over the whole batch.

Each text becomes the set of its character ``shingle``-grams (after whitespace normalization).
Similarity is the Dice coefficient of two shingle sets, 2|A∩B| / (|A|+|B|): the set analogue of
``difflib.SequenceMatcher.ratio`` (2·matches / total length), so a threshold means about the same
as in the difflib fallback of the GiGPO reference. Dice relates to Jaccard J by D = 2J / (1+J).

Pipeline:
1. Shingles are hashed with a polynomial rolling hash over the UTF-8 bytes of all texts at once,
   then mixed (splitmix64) down to 32 bits.
2. MinHash: ``num_perm`` affine maps ``a·x + b mod 2**32`` (a odd), minimum per text
   (``np.minimum.reduceat``). The fraction of equal signature entries estimates Jaccard.
3. LSH banding: texts whose signatures agree on all rows of some band become candidates. Within
   one bucket (ordered so that near-duplicates are neighbours) each text is paired with its next
   ``BUCKET_WINDOW`` members (all pairs for buckets up to that size). This bounds the work on huge
   buckets, e.g. of texts that share only a common template, while keeping real clusters connected.
4. Candidates whose estimated similarity reaches the threshold are joined; clusters are the
   connected components (single linkage), found by vectorized min-label propagation. Candidates
   already joined are skipped.

Clustering is deterministic: the permutations come from ``seed``, and cluster ids are numbered in
order of first appearance.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent_rl.anchors.keys import mix64, normalize_whitespace, unique_inverse
from agent_rl.core.grouping import dense_ids

BUCKET_WINDOW = 8
SHINGLE_BLOCK_ROWS = 16384  # shingles per MinHash block: (rows × num_perm) uint32 stays in cache
_POLY = np.uint64(0x100000001B3)  # FNV-64 prime: odd, so the rolling hash mixes every byte
_U64 = np.uint64


def shingle_hashes(texts: Sequence[str], shingle: int) -> tuple[np.ndarray, np.ndarray]:
    """32-bit hashes of every character ``shingle``-gram (UTF-8 bytes) of every text, concatenated,
    and the number of shingles per text. A text shorter than ``shingle`` is one shingle."""
    encoded = [text.encode() for text in texts]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    pad = b"\x00" * shingle  # windows of short texts read padding, never the next text
    buffer = np.frombuffer(pad.join(encoded) + pad, dtype=np.uint8)
    # Hash the window at every buffer position with contiguous slices (streaming, no gathers),
    # then keep the windows that start inside a text.
    n_windows = len(buffer) - shingle + 1
    rolling = np.zeros(n_windows, dtype=np.uint64)
    for offset in range(shingle):
        rolling *= _POLY
        rolling += buffer[offset : offset + n_windows]
    # Text i with its padding spans lengths[i] + shingle bytes; its first counts[i] windows are its shingles.
    counts = np.maximum(lengths - shingle + 1, 1)
    run_lengths = np.stack([counts, lengths + shingle - counts], axis=1).reshape(-1)
    is_shingle = np.repeat(np.tile(np.array([True, False]), len(texts)), run_lengths)[:n_windows]
    return (mix64(rolling[is_shingle]) >> _U64(32)).astype(np.uint32), counts


def minhash_signatures(texts: Sequence[str], *, num_perm: int = 64, shingle: int = 4, seed: int = 0) -> np.ndarray:
    """MinHash signatures ``(len(texts), num_perm)`` uint32 of the texts' shingle sets.

    ``(signatures[i] == signatures[j]).mean()`` estimates the Jaccard similarity of texts i and j.
    """
    if num_perm < 1 or shingle < 1:
        raise ValueError(f"num_perm and shingle must be >= 1, got num_perm={num_perm}, shingle={shingle}")
    rng = np.random.default_rng(seed)
    mult = (rng.integers(0, 2**32, num_perm, dtype=np.uint64) | _U64(1)).astype(np.uint32)
    add = rng.integers(0, 2**32, num_perm, dtype=np.uint64).astype(np.uint32)
    hashes, counts = shingle_hashes(texts, shingle)
    ends = np.cumsum(counts)
    starts = ends - counts
    signatures = np.empty((len(texts), num_perm), dtype=np.uint32)
    first_text = 0
    while first_text < len(texts):
        # Blocks of whole texts with about SHINGLE_BLOCK_ROWS shingles (at least one text).
        stop = int(np.searchsorted(ends, starts[first_text] + SHINGLE_BLOCK_ROWS, side="right"))
        stop = max(stop, first_text + 1)
        block = hashes[starts[first_text] : ends[stop - 1], None] * mult
        block += add
        signatures[first_text:stop] = np.minimum.reduceat(block, starts[first_text:stop] - starts[first_text], axis=0)
        first_text = stop
    return signatures


def lsh_bands(jaccard_threshold: float, num_perm: int) -> tuple[int, int]:
    """``(bands, rows)`` with the most rows per band (fewest false candidates) such that a pair at
    the threshold still becomes a candidate with probability >= 0.95."""
    for rows in range(num_perm, 0, -1):
        bands = num_perm // rows
        if 1.0 - (1.0 - jaccard_threshold**rows) ** bands >= 0.95:
            return bands, rows
    return num_perm, 1


def _signature_matches(signatures: np.ndarray, left: np.ndarray, right: np.ndarray, chunk: int = 65536) -> np.ndarray:
    """Number of equal signature entries of each pair ``(left[i], right[i])``, in chunks to bound memory."""
    matches = np.empty(len(left), dtype=np.int64)
    for start in range(0, len(left), chunk):
        stop = start + chunk
        matches[start:stop] = (signatures[left[start:stop]] == signatures[right[start:stop]]).sum(axis=1)
    return matches


def _connected_components(n: int, edges: np.ndarray) -> np.ndarray:
    """Per node, the smallest node index of its connected component."""
    labels = np.arange(n)
    left, right = edges
    while True:
        hooked = labels.copy()
        smaller = np.minimum(labels[left], labels[right])
        np.minimum.at(hooked, left, smaller)
        np.minimum.at(hooked, right, smaller)
        hooked = hooked[hooked]  # pointer jumping: labels are node indices
        if np.array_equal(hooked, labels):
            return labels
        labels = hooked


def similar_components(signatures: np.ndarray, node_groups: np.ndarray, jaccard_threshold: float) -> np.ndarray:
    """Per node, the smallest node index of its cluster: LSH candidates of one group whose
    signatures agree on at least ``jaccard_threshold`` of the entries are joined.

    Per band, nodes are sorted by (group, band key, one signature entry of the next band); each
    node is paired with the member
    ``distance`` places further in its bucket, for distance 1, 2, ... ``BUCKET_WINDOW``. Pairs
    already in one component are skipped, and components are updated after every step, so a
    bucket of many near-duplicates costs about one verification per member instead of one per pair.
    """
    n, num_perm = signatures.shape
    bands, rows = lsh_bands(jaccard_threshold, num_perm)
    min_matches = np.ceil(jaccard_threshold * num_perm - 1e-9)
    labels = np.arange(n)
    for band in range(bands):
        band_keys = np.zeros(n, dtype=np.uint64)
        for column in signatures[:, band * rows : (band + 1) * rows].T:
            band_keys = (band_keys ^ column) * _POLY
        # Inside a bucket, order by the first signature entry of the next band: near-duplicates agree
        # on it with probability ~J, so they sit next to each other and a short window finds them.
        tie_break = signatures[:, ((band + 1) * rows) % num_perm]
        order = np.lexsort((tie_break, band_keys, node_groups))
        sorted_keys, sorted_groups = band_keys[order], node_groups[order]
        for distance in range(1, BUCKET_WINDOW + 1):
            same = (sorted_keys[distance:] == sorted_keys[:-distance]) & (
                sorted_groups[distance:] == sorted_groups[:-distance]
            )
            if not same.any():
                break
            left, right = order[:-distance][same], order[distance:][same]
            apart = labels[left] != labels[right]
            left, right = left[apart], right[apart]
            similar = _signature_matches(signatures, left, right) >= min_matches
            if similar.any():
                joined = np.stack([labels[left[similar]], labels[right[similar]]])
                labels = _connected_components(n, joined)[labels]
    return labels


def cluster_similar(
    texts: Sequence[str],
    *,
    threshold: float = 0.8,
    num_perm: int = 64,
    shingle: int = 4,
    seed: int = 0,
    groups: Sequence | np.ndarray | None = None,
) -> np.ndarray:
    """Cluster ids (int64, numbered by first appearance) such that texts whose estimated Dice
    similarity reaches ``threshold`` share an id (transitively). With ``groups``, only texts of the
    same group are compared, and clusters never span groups."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold}")
    if groups is not None and len(groups) != len(texts):
        raise ValueError(f"groups has {len(groups)} rows but texts has {len(texts)}")
    bad = [text for text in texts if not isinstance(text, str)]
    if bad:
        raise TypeError(f"cluster_similar needs str texts, got {type(bad[0]).__name__}: {bad[0]!r}")
    unique_texts, text_ids = unique_inverse(map(normalize_whitespace, texts))
    group_codes = np.zeros(len(texts), dtype=np.int64) if groups is None else dense_ids(groups)[0]
    # A node is one distinct (group, text); identical texts of one group are one node.
    node_of_row, n_nodes = dense_ids(group_codes, text_ids)
    node_text = np.zeros(n_nodes, dtype=np.int64)
    node_text[node_of_row] = text_ids
    node_group = np.zeros(n_nodes, dtype=np.int64)
    node_group[node_of_row] = group_codes
    signatures = minhash_signatures(unique_texts, num_perm=num_perm, shingle=shingle, seed=seed)[node_text]

    components = similar_components(signatures, node_group, threshold / (2.0 - threshold))[node_of_row]
    # Number clusters by first appearance: stable order of each component's first row.
    _, first_rows, cluster_of_row = np.unique(components, return_index=True, return_inverse=True)
    rank = np.empty(len(first_rows), dtype=np.int64)
    rank[np.argsort(first_rows, kind="stable")] = np.arange(len(first_rows))
    return rank[cluster_of_row.reshape(-1)]
