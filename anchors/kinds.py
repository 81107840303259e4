"""Anchor keys of every kind (``KEY_KINDS``; the package docstring says what each keys), and the
dispatch from a ``StepBatch`` to its rows' keys."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agent_rl.anchors.fingerprint import error_fingerprint
from agent_rl.anchors.keys import hash_strings, mix64, normalize_whitespace, stable_hash64, unique_inverse
from agent_rl.anchors.similarity import cluster_similar
from agent_rl.core.batch import StepBatch
from agent_rl.core.grouping import dense_ids, rows_by_group
from agent_rl.core.presets import KEY_KINDS

_NEEDS = {
    "state": ("states",),
    "observation": ("observations",),
    "fingerprint": ("observations", "errors"),
    "similarity": ("observations",),
    "context": ("states", "actions", "traj_ids", "history_turns"),
}
_ODD = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it is a bijection on 64-bit words
_NO_TURN = np.uint64(stable_hash64("no earlier turn", domain="context"))


def observation_keys(observations: Sequence[str]) -> np.ndarray:
    """uint64 key of each whitespace-normalized observation (domain ``observation``)."""
    uniques, inverse = unique_inverse(observations)
    _require_str("observations", uniques)
    return hash_strings([normalize_whitespace(text) for text in uniques], domain="observation")[inverse]


def fingerprint_keys(observations: Sequence[str], errors: Sequence[str | None]) -> np.ndarray:
    """uint64 key of each row's error fingerprint (domain ``fingerprint``), or of its observation
    where the row has no error (None or blank)."""
    keys = observation_keys(observations)
    uniques, inverse = unique_inverse(errors)
    _require_str("errors", [error for error in uniques if error is not None])
    has_error = np.array([error is not None and bool(error.strip()) for error in uniques], dtype=bool)
    fingerprints = [error_fingerprint(error) for error, present in zip(uniques, has_error) if present]
    unique_keys = np.zeros(len(uniques), dtype=np.uint64)
    unique_keys[has_error] = hash_strings(fingerprints, domain="fingerprint")
    rows_with_error = has_error[inverse]
    keys[rows_with_error] = unique_keys[inverse[rows_with_error]]
    return keys


def state_keys(states: Sequence[str]) -> np.ndarray:
    """uint64 key of each canonical state string (domain ``state``)."""
    uniques, inverse = unique_inverse(states)
    _require_str("states", uniques)
    return hash_strings(uniques, domain="state")[inverse]


def context_keys(
    states: Sequence[str],
    actions: Sequence[str],
    traj_ids: Sequence | np.ndarray,
    history_turns: int,
    observations: Sequence[str] | None = None,
) -> np.ndarray:
    """uint64 key of each row's state and of the last ``history_turns`` turns before it in its
    trajectory, each turn being (its observation, its action); without ``observations`` a turn's
    state stands in for its observation. Rows of a trajectory must be in time order (the
    ``StepBatch`` contract); trajectories may be interleaved.

    Vectorized: each turn is one mixed word per row, and the history is folded in by shifting those
    words ``1 .. history_turns`` rows back within each trajectory (a loop over turns, not rows)."""
    if isinstance(history_turns, bool) or not isinstance(history_turns, (int, np.integer)) or history_turns < 0:
        raise ValueError(f"history_turns must be an integer >= 0, got {history_turns!r}")
    keys = state_keys(states)
    if history_turns == 0 or len(keys) == 0:
        return keys
    uniques, inverse = unique_inverse(actions)
    _require_str("actions", uniques)
    turn = keys * _ODD if observations is None else observation_keys(observations) * _ODD
    turn ^= hash_strings(uniques, domain="action")[inverse]
    mix64(turn)
    # Positions of each trajectory's rows, in time order, and each row's turn index.
    traj_code, n_traj = dense_ids(np.asarray(traj_ids))
    order = rows_by_group(traj_code, n_traj)
    lengths = np.bincount(traj_code, minlength=n_traj)
    turn_index = np.arange(len(order)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    ordered_turns = turn[order]
    context = keys[order]
    for back in range(1, history_turns + 1):
        earlier = np.full(len(order), _NO_TURN, dtype=np.uint64)
        has_earlier = turn_index >= back
        earlier[has_earlier] = ordered_turns[np.flatnonzero(has_earlier) - back]
        context *= _ODD
        context ^= earlier
        mix64(context)
    out = np.empty_like(context)
    out[order] = context
    return out


def compute_anchor_keys(
    kind: str,
    observations: Sequence[str] | None = None,
    errors: Sequence[str | None] | None = None,
    states: Sequence[str] | None = None,
    *,
    group_ids: Sequence | np.ndarray | None = None,
    similarity_threshold: float = 0.8,
    actions: Sequence[str] | None = None,
    traj_ids: Sequence | np.ndarray | None = None,
    history_turns: int | None = None,
) -> np.ndarray:
    """One uint64 anchor key per row for key ``kind`` (one of ``KEY_KINDS``).

    ``state`` needs ``states``; ``observation`` and ``similarity`` need ``observations``;
    ``fingerprint`` needs ``observations`` and ``errors`` (None entries mean no error);
    ``context`` needs ``states``, ``actions`` (the action of each row), ``traj_ids`` and
    ``history_turns`` (the turns of history the prompt shows, ``RolloutConfig.history_turns``),
    and reads ``observations`` when given (pass them when the prompt shows the history's observations).
    ``group_ids`` (optional, ``similarity`` only) restricts clustering to rows of one group;
    ``similarity_threshold`` is the Dice similarity at which observations count as near-duplicates.
    """
    if kind not in KEY_KINDS:
        raise ValueError(f"unknown anchor key kind {kind!r}; valid kinds: {', '.join(KEY_KINDS)}")
    given = {
        "observations": observations,
        "errors": errors,
        "states": states,
        "group_ids": group_ids,
        "actions": actions,
        "traj_ids": traj_ids,
    }
    missing = [name for name in _NEEDS[kind] if {**given, "history_turns": history_turns}[name] is None]
    if missing:
        raise ValueError(f"anchor key kind {kind!r} needs {' and '.join(missing)}")
    lengths = {name: len(value) for name, value in given.items() if value is not None}
    if len(set(lengths.values())) > 1:
        raise ValueError("anchor key inputs differ in length: " + ", ".join(f"{k}={v}" for k, v in lengths.items()))
    if kind == "state":
        return state_keys(states)
    if kind == "context":
        return context_keys(states, actions, traj_ids, history_turns, observations)
    if kind == "observation":
        return observation_keys(observations)
    if kind == "fingerprint":
        return fingerprint_keys(observations, errors)
    clusters = cluster_similar(observations, threshold=similarity_threshold, groups=group_ids)
    return clusters.astype(np.uint64)


def batch_anchor_keys(batch: StepBatch, kind: str, *, history_turns: int, history_observations: bool) -> np.ndarray:
    """The anchor key of every row of ``batch``: what ``kind`` reads of it, and for ``context`` the
    history the prompts showed (``history_turns`` turns, their observations only when
    ``history_observations``; ``RolloutConfig`` holds both)."""
    context = kind == "context"
    return compute_anchor_keys(
        kind,
        observations=batch.observation if history_observations or not context else None,
        errors=batch.error,
        states=batch.anchor_state,
        group_ids=batch.group_id if kind == "similarity" else None,
        actions=batch.action if context else None,
        traj_ids=batch.traj_id if context else None,
        history_turns=history_turns if context else None,
    )


def _require_str(name: str, values: Sequence) -> None:
    bad = [value for value in values if not isinstance(value, str)]
    if bad:
        raise TypeError(f"{name} must hold str values, got {type(bad[0]).__name__}: {bad[0]!r}")
