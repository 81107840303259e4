"""Advantage estimators: trajectory-level (GRPO, Dr.GRPO, RLOO) and GiGPO step-level credit, and
:func:`compute_advantages`, the one pipeline that combines them for a ``StepBatch``.

Numpy in, numpy out (float64), one value per StepBatch row. Everything is vectorized with
``dense_ids`` + ``np.bincount``; no Python loop visits rows.

Conventions (DESIGN "Advantages"):
- std is the unbiased sample std (n - 1) and ``eps`` is added to it;
- a group with a single member (one trajectory, or one row for anchor groups) gets advantage 0.
  The reference implementation (verl-agent) instead leaves such a member's raw score unchanged
  (mean 0, std 1); with two or more members the numbers agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from agent_rl.batch import StepBatch
from agent_rl.grouping import GroupStats, dense_ids, group_steps, rows_by_group

if TYPE_CHECKING:
    from agent_rl.config import AlgorithmConfig

EpisodeMode = Literal["grpo", "drgrpo", "rloo"]
EpisodeStats = Literal["trajectory", "step"]
StepNormalize = Literal["mean", "mean_std"]

EPISODE_MODES = ("grpo", "drgrpo", "rloo")
EPISODE_STATS = ("trajectory", "step")
STEP_NORMALIZE = ("mean", "mean_std")


def _float_column(name: str, values: np.ndarray, n: int | None = None) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one value per row), got shape {array.shape}")
    if n is not None and len(array) != n:
        raise ValueError(f"{name} has {len(array)} rows, expected {n}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains non-finite values (row {int(np.flatnonzero(~np.isfinite(array))[0])})")
    return array


def _id_column(name: str, values: np.ndarray, n: int) -> np.ndarray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D (one id per row), got shape {array.shape}")
    if len(array) != n:
        raise ValueError(f"{name} has {len(array)} rows, expected {n}")
    return array


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def _member_stats(values: np.ndarray, codes: np.ndarray, n_groups: int):
    """Count, sum, mean and unbiased std of ``values`` per group code (two-pass for precision), and
    each value's deviation from its group mean."""
    count = np.bincount(codes, minlength=n_groups).astype(np.float64)
    total = np.bincount(codes, weights=values, minlength=n_groups)
    mean = total / np.maximum(count, 1.0)
    deviation = values - mean[codes]
    sum_sq = np.bincount(codes, weights=deviation * deviation, minlength=n_groups)
    std = np.sqrt(sum_sq / np.maximum(count - 1.0, 1.0))
    return count, total, mean, std, deviation


def discounted_returns(rewards: np.ndarray, traj_ids: np.ndarray, gamma: float = 1.0) -> np.ndarray:
    """Return-to-go ``G_t = r_t + gamma * G_{t+1}`` of every row within its trajectory.

    Rows of one trajectory must be in time order; trajectories may be interleaved.
    """
    rewards = _float_column("rewards", rewards)
    n = len(rewards)
    traj_ids = _id_column("traj_ids", traj_ids, n)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    if n == 0:
        return np.zeros(0)
    traj_code, n_traj = dense_ids(traj_ids)
    order = rows_by_group(traj_code, n_traj)  # each trajectory a contiguous run, in time order
    lengths = np.bincount(traj_code, minlength=n_traj)
    last_row = np.cumsum(lengths) - 1  # of each trajectory, as a position in ``order``
    longest = int(lengths.max())
    longest_first = rows_by_group(longest - lengths, longest + 1)
    last_row_longest_first = last_row[longest_first]
    depths = np.arange(1, longest)
    # How many trajectories are longer than each depth: a prefix of the longest-first list.
    n_longer = np.searchsorted(-lengths[longest_first], -depths, side="left")
    returns = rewards[order]
    # Sweep from the last turn backwards; each pass updates every trajectory at once, so the loop
    # runs (longest trajectory - 1) times, never once per row.
    for depth, count in zip(depths, n_longer):
        rows = last_row_longest_first[:count] - depth
        returns[rows] += gamma * returns[rows + 1]
    out = np.empty(n)
    out[order] = returns
    return out


def episode_advantages(
    returns: np.ndarray,
    group_ids: np.ndarray,
    traj_ids: np.ndarray,
    *,
    mode: EpisodeMode = "grpo",
    stats: EpisodeStats = "trajectory",
    eps: float = 1e-6,
) -> np.ndarray:
    """Trajectory-level advantages, one per row.

    - ``grpo``: (R - mean) / (std + eps); ``drgrpo``: R - mean; ``rloo``: R - mean of the *other*
      trajectories of the group.
    - ``stats="trajectory"`` counts each trajectory once (GiGPO paper, Eq. 3); all rows of a
      trajectory must then carry the same return. ``stats="step"`` counts every row, as
      verl-agent does.
    - A group with one trajectory gets 0.
    """
    returns = _float_column("returns", returns)
    n = len(returns)
    group_ids = _id_column("group_ids", group_ids, n)
    traj_ids = _id_column("traj_ids", traj_ids, n)
    _choice("mode", mode, EPISODE_MODES)
    _choice("stats", stats, EPISODE_STATS)
    if n == 0:
        return np.zeros(0)

    traj_code, n_traj = dense_ids(traj_ids)
    group_code, n_groups = dense_ids(group_ids)
    # One representative row per trajectory (which one does not matter: all are checked against it).
    representative = np.empty(n_traj, dtype=np.intp)
    representative[traj_code] = np.arange(n)
    traj_group_code = group_code[representative]
    split = traj_group_code[traj_code] != group_code
    if np.any(split):
        raise ValueError(f"trajectory {traj_ids[int(np.flatnonzero(split)[0])]} has rows in more than one group")
    trajectories_per_group = np.bincount(traj_group_code, minlength=n_groups)

    if stats == "trajectory":
        traj_value = returns[representative]
        mismatch = returns != traj_value[traj_code]
        if np.any(mismatch):
            bad = int(np.flatnonzero(mismatch)[0])
            raise ValueError(
                f"stats='trajectory' needs one return per trajectory, but trajectory {traj_ids[bad]} "
                f"has rows with {traj_value[traj_code[bad]]} and {returns[bad]}"
            )
        # One member per trajectory: compute per trajectory, then spread to its rows.
        values, codes, own_count, own_total = traj_value, traj_group_code, 1.0, traj_value
    else:
        values, codes = returns, group_code
        own_count = np.bincount(traj_code, minlength=n_traj).astype(np.float64)[traj_code]
        own_total = np.bincount(traj_code, weights=returns, minlength=n_traj)[traj_code]

    count, total, _, std, deviation = _member_stats(values, codes, n_groups)
    if mode == "grpo":
        advantage = deviation / (std[codes] + eps)
    elif mode == "drgrpo":
        advantage = deviation
    else:
        advantage = values - (total[codes] - own_total) / np.maximum(count[codes] - own_count, 1.0)
    advantage = np.where(trajectories_per_group[codes] < 2, 0.0, advantage)
    return advantage[traj_code] if stats == "trajectory" else advantage


def step_advantages(
    step_returns: np.ndarray,
    group_ids: np.ndarray,
    anchor_keys: np.ndarray,
    *,
    normalize: StepNormalize = "mean_std",
    eps: float = 1e-6,
) -> np.ndarray:
    """GiGPO step-level advantages: normalize ``step_returns`` within anchor groups
    {same group_id, same anchor key}. Keys may be str or integers. A singleton anchor group gets 0."""
    step_returns = _float_column("step_returns", step_returns)
    n = len(step_returns)
    group_ids = _id_column("group_ids", group_ids, n)
    anchor_keys = _id_column("anchor_keys", anchor_keys, n)
    _choice("normalize", normalize, STEP_NORMALIZE)
    if n == 0:
        return np.zeros(0)
    step_groups, n_step_groups = dense_ids(group_ids, anchor_keys)
    return _normalize_within(step_returns, step_groups, n_step_groups, normalize, eps)


def _normalize_within(values: np.ndarray, codes: np.ndarray, n_groups: int, normalize: str, eps: float) -> np.ndarray:
    _, _, _, std, centered = _member_stats(values, codes, n_groups)
    # A singleton's mean is its own value, so it is centered to exactly 0.
    if normalize == "mean_std":
        centered /= (std + eps)[codes]
    return centered


# ---- the credit pipeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Credit:
    """What :func:`compute_advantages` assigns to each row of a batch, and why."""

    advantages: np.ndarray
    """The advantage the learner uses: ``episode + step_weight * step - invalid_penalty * invalid``,
    times ``negative_weight`` where that is negative, times the row's trajectory weight with
    ``algo.row_weight="trajectory"``."""
    episode: np.ndarray
    """Trajectory-level part (Eq. 3): the trajectory's total reward against its group; 0 with
    ``algo.advantage="none"``."""
    step: np.ndarray
    """Step-level part (Eq. 7): the step's discounted return against its anchor group; 0 without
    step credit and for singleton anchor groups."""
    step_groups: np.ndarray | None
    """Dense anchor-group id of every row (Eq. 6); None when the batch has no anchor keys."""
    group_stats: GroupStats | None
    """Sizes of the anchor groups; None when the batch has no anchor keys."""

    def metrics(self) -> dict[str, float]:
        """Scalars for the run log."""
        metrics = {
            "advantage/abs_mean": float(np.abs(self.advantages).mean()) if len(self.advantages) else 0.0,
            # Positive: the batch pushes up, on balance, what it sampled; negative: away from it.
            "advantage/sum": float(self.advantages.sum()),
            "advantage/zero_fraction": float(np.mean(self.advantages == 0)) if len(self.advantages) else 0.0,
            "advantage/step_abs_mean": float(np.abs(self.step).mean()) if len(self.step) else 0.0,
        }
        if self.group_stats is not None:
            metrics["anchors/mean_group_size"] = self.group_stats.mean_size
            metrics["anchors/max_group_size"] = float(self.group_stats.max_size)
            metrics["anchors/grouped_fraction"] = self.group_stats.frac_rows_in_groups_ge2
        return metrics


def compute_advantages(batch: StepBatch, algo: AlgorithmConfig) -> Credit:
    """One advantage per row of ``batch`` for the resolved algorithm ``algo``
    (``agent_rl.config.resolve_algorithm``), as in the GiGPO paper:

    - Eq. 3, episode: each trajectory's total reward R against its group (same seed), with the
      preset's estimator (``grpo``, ``drgrpo`` or ``rloo``, see :func:`episode_advantages`).
    - Eq. 6, anchor groups: rows of one group that share ``batch.anchor_key``.
    - Eq. 7, step: each row's discounted return-to-go against its anchor group
      (:func:`step_advantages`, ``mean`` or ``mean_std``); only with step credit.
    - Eq. 8: ``A = A_episode + step_weight * A_step``.

    With ``algo.advantage="none"`` the episode part is 0 and step credit alone remains.

    ``algo.invalid_penalty`` is then charged to each row whose action was invalid, on that row
    alone: it is not discounted into earlier steps and enters no group statistic, so no std can
    scale it up. Negative advantages are then multiplied by ``algo.negative_weight``, and with
    ``algo.row_weight="trajectory"`` every row's advantage is scaled by
    :func:`trajectory_weights`, so each trajectory weighs the same in the loss whatever its length.
    Anchor groups are built once; their statistics are reported with or without step credit.
    ``batch.anchor_key`` must be set when step credit is on.
    """
    open_parts = [name for name in ("advantage", "step_credit", "step_normalize") if getattr(algo, name) is None]
    if open_parts:
        raise ValueError(
            f"algo leaves {', '.join(open_parts)} to its preset; pass agent_rl.config.resolve_algorithm(algo)"
        )
    n = len(batch)
    traj_code, _ = dense_ids(batch.traj_id)
    episode_return = np.bincount(traj_code, weights=batch.reward)[traj_code] if n else np.zeros(0)
    if algo.advantage == "none":
        episode = np.zeros(n)
    else:
        episode = episode_advantages(
            episode_return, batch.group_id, batch.traj_id, mode=algo.advantage, stats=algo.episode_stats, eps=algo.eps
        )
    step = np.zeros(n)
    step_groups = group_stats_ = None
    if batch.anchor_key is not None:
        step_groups, group_stats_ = group_steps(batch.group_id, batch.anchor_key)
    if algo.step_credit:
        if step_groups is None:
            raise ValueError("step credit needs StepBatch.anchor_key (see anchors.compute_anchor_keys)")
        step_returns = discounted_returns(batch.reward, batch.traj_id, algo.gamma)
        step = _normalize_within(step_returns, step_groups, group_stats_.n_groups, algo.step_normalize, algo.eps)
    advantages = episode + algo.step_weight * step - algo.invalid_penalty * ~batch.action_valid
    advantages = np.where(advantages < 0, algo.negative_weight * advantages, advantages)
    if algo.row_weight == "trajectory" and n:
        advantages = advantages * trajectory_weights(traj_code)
    return Credit(advantages, episode, step, step_groups, group_stats_)


def trajectory_weights(traj_code: np.ndarray) -> np.ndarray:
    """Per row, the mean trajectory length over its own trajectory's (dense codes): the rows of each
    trajectory then weigh as much in all as one mean-length trajectory's, and the weights sum to the
    number of rows."""
    lengths = np.bincount(traj_code).astype(np.float64)
    return (len(traj_code) / np.count_nonzero(lengths)) / lengths[traj_code]
