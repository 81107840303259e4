"""Anchor keys for GiGPO step-level credit, and the step grouper.

A step's anchor key says which state it is in; steps of one group (same seed) with equal keys form
a step group whose returns are compared. Five kinds of key (``KEY_KINDS``):

- ``state``: the environment's canonical state string ``info["anchor"]``, hashed. Exact revisits.
- ``observation``: the whitespace-normalized observation, hashed.
- ``fingerprint``: the error template of ``info["error"]`` (``error_fingerprint``) when the step
  has an error, else the observation hash. Steps that hit the same kind of error share a key even
  when names, numbers and positions differ.
- ``similarity``: near-duplicate cluster ids of the observations (MinHash/LSH, ``cluster_similar``),
  clustered within each group when ``group_ids`` is given, else over the whole batch.
- ``context``: the ``state`` key combined with the history the policy's prompt shows: the last
  ``history_turns`` turns of the trajectory, each its action and the observation it was taken on
  (or, without ``observations``, the state). Steps in the same state whose prompts show different
  histories never share an anchor group (HGPO's context consistency); a step with fewer earlier
  turns than ``history_turns`` shows fewer, and its key says so. ``history_turns=0`` gives exactly
  the ``state`` keys.

Keys are stable uint64 values (blake2b, equal across processes and machines). Each kind hashes in
its own domain, so a fingerprint key never equals an observation key of another row by accident.
numpy only: this package never imports torch.
"""

from agent_rl.anchors.fingerprint import error_fingerprint, line_template
from agent_rl.anchors.keys import hash_strings, normalize_whitespace, stable_hash64
from agent_rl.anchors.kinds import (
    batch_anchor_keys,
    compute_anchor_keys,
    context_keys,
    fingerprint_keys,
    observation_keys,
    state_keys,
)
from agent_rl.anchors.similarity import cluster_similar, minhash_signatures
from agent_rl.core.grouping import GroupStats, group_stats, group_steps
from agent_rl.core.presets import KEY_KINDS

__all__ = [
    "KEY_KINDS",
    "GroupStats",
    "batch_anchor_keys",
    "cluster_similar",
    "compute_anchor_keys",
    "context_keys",
    "error_fingerprint",
    "fingerprint_keys",
    "group_stats",
    "group_steps",
    "hash_strings",
    "line_template",
    "minhash_signatures",
    "normalize_whitespace",
    "observation_keys",
    "stable_hash64",
    "state_keys",
]
