"""Advantage estimators: trajectory-level (GRPO, Dr.GRPO, RLOO), step-level credit from anchor groups
(GiGPO) or from a group's state graph (graph credit, after GraphGPO), and :func:`compute_advantages`,
the one pipeline that combines them for a ``StepBatch``.

Numpy in, numpy out (float64), one value per StepBatch row. Everything is vectorized with
``dense_ids`` + ``np.bincount``; no Python loop visits rows.

Conventions (DESIGN "Advantages"):
- std is the unbiased sample std (n - 1) and ``eps`` is added to it;
- a group with a single member (one trajectory, or one row for anchor groups) gets advantage 0.
  The reference implementation (verl-agent) instead leaves such a member's raw score unchanged
  (mean 0, std 1); with two or more members the numbers agree exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

import numpy as np

from agent_rl.core.batch import StepBatch
from agent_rl.core.grouping import GroupStats, dense_ids, first_visits, group_steps, next_rows, rows_by_group
from agent_rl.core.presets import EPISODE_MODES, EPISODE_STATS, STEP_NORMALIZE

EpisodeMode = Literal[EPISODE_MODES]
EpisodeStats = Literal[EPISODE_STATS]
StepNormalize = Literal[STEP_NORMALIZE]


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


def group_return_spread(returns: np.ndarray, group_ids: np.ndarray, traj_ids: np.ndarray) -> np.ndarray:
    """Per group (indexed by the dense codes of ``group_ids``), the unbiased std of its trajectories'
    returns, each trajectory counted once; 0 for a group of one. ``returns`` holds each row's
    trajectory return. A group at 0 gives trajectory-level credit no signal: every member did
    equally well."""
    returns = _float_column("returns", returns)
    n = len(returns)
    group_code, n_groups = dense_ids(_id_column("group_ids", group_ids, n))
    traj_code, n_traj = dense_ids(_id_column("traj_ids", traj_ids, n))
    representative = np.empty(n_traj, dtype=np.intp)
    representative[traj_code] = np.arange(n)
    return _member_stats(returns[representative], group_code[representative], n_groups)[3]


def kept_groups(spread: np.ndarray, keep: float, drop_flat: bool = False) -> np.ndarray:
    """Which groups the variance filter keeps (RAGEN's SNR-aware filter): with ``keep`` 1, every
    group, or with ``drop_flat`` every group whose return ``spread`` is above 0
    (:func:`group_return_spread`); below 1, the ``ceil(keep * groups)`` groups with the largest
    spread (ties go to the earlier group), never one whose spread is 0."""
    if not 0.0 < keep <= 1.0:
        raise ValueError(f"keep must be in (0, 1], got {keep}")
    with_spread = spread > 0
    if keep == 1.0:
        return with_spread if drop_flat else np.ones(len(spread), dtype=bool)
    rank = np.empty(len(spread), dtype=np.int64)
    rank[np.argsort(-spread, kind="stable")] = np.arange(len(spread))
    return (rank < np.ceil(keep * len(spread) - 1e-9)) & with_spread


def turn_position_mass(advantages: np.ndarray, t: np.ndarray, traj_ids: np.ndarray, bins: int = 3) -> np.ndarray:
    """The share of ``sum |advantage|`` that falls on each of ``bins`` equal parts of a trajectory's
    turns (bin ``floor(bins * t / length)``): where in an episode the update's signal lies. Zeros
    when every advantage is 0."""
    traj_code, _ = dense_ids(traj_ids)
    lengths = np.bincount(traj_code)[traj_code]
    position = np.minimum(bins * np.asarray(t) // lengths, bins - 1)
    mass = np.bincount(position, weights=np.abs(advantages), minlength=bins)
    total = mass.sum()
    return mass / total if total > 0 else mass


def novel_steps(traj_ids: np.ndarray, anchor_keys: np.ndarray) -> np.ndarray:
    """Per row, whether its action reached an anchor state its trajectory had not been in before (the
    next row's key, first seen there). An invalid or idle action leaves the state as it was and is
    never novel; a trajectory's last row is not either, the batch not holding the state it led to.
    Rows of a trajectory are in time order (the ``StepBatch`` contract)."""
    n = len(np.asarray(traj_ids))
    traj_code, n_traj = dense_ids(_id_column("traj_ids", traj_ids, n))
    following = next_rows(traj_code, n_traj)
    first = first_visits(traj_code, _id_column("anchor_keys", anchor_keys, n))
    return (following >= 0) & first[following]


def novelty_bonuses(batch: StepBatch, spread: np.ndarray, bonus: float) -> np.ndarray:
    """Per row, ``bonus`` where its action reached a state new to its trajectory (:func:`novel_steps`)
    in a group the task left silent: no trajectory won and the returns do not spread (``spread``,
    :func:`group_return_spread`); 0 elsewhere. Where the task gives no signal, a step that explores
    is pushed up (count-based episodic novelty); where it gives one, it alone decides."""
    group_code, n_groups = dense_ids(batch.group_id)
    won = np.bincount(group_code, weights=batch.won, minlength=n_groups) > 0
    silent = (spread == 0) & ~won
    return bonus * (silent[group_code] & novel_steps(batch.traj_id, batch.anchor_key))


# ---- graph credit ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphProgress:
    """A batch's state graphs, one per group, and what each row's transition did in its group's graph
    (:func:`graph_progress`)."""

    group: np.ndarray
    """Dense id of the row's group: whose graph it is in."""
    state: np.ndarray
    """Dense id of the row's (group, anchor key): the graph node the action was taken in."""
    distance: np.ndarray
    """Steps from the row's state to a win along the group's graph, capped (see :func:`graph_progress`)."""
    next_distance: np.ndarray
    """The same after the row's action: 0 where it won, the cap where it ended the episode without a
    win, NaN where the trajectory was cut (truncated or unfinished) before the next state was seen."""
    progress: np.ndarray
    """``clip(distance - next_distance, -1, 1)``: +1 for a step along a shortest path to a win, 0 for
    one that keeps the distance, -1 for one that moves away; NaN where ``next_distance`` is."""
    trajectory_won: np.ndarray
    """Per row, whether its trajectory won."""
    merged: np.ndarray
    """Per row, whether its group's trajectories meet: some anchor state after the first turn is
    visited by two or more of them. Without a meeting the graph is a bundle of separate paths that
    says no more than each trajectory's outcome, and graph credit leaves the group to episode credit."""


def graph_progress(
    group_ids: np.ndarray,
    traj_ids: np.ndarray,
    anchor_keys: np.ndarray,
    won: np.ndarray,
    done: np.ndarray,
    truncated: np.ndarray,
) -> GraphProgress:
    """Merge each group's trajectories into one directed graph of anchor states and measure each
    step's progress towards a win in it.

    Nodes are the distinct anchor keys of a group; every row that has a next row in its trajectory
    adds the edge (its state -> the next row's state). A row whose action won (``won``) leads to the
    goal, at distance 0. A state's distance is its shortest path to the goal in the group's graph:
    the fewest steps in which any trajectory of the group, stitched together at shared states, went
    from it to a win. States that reach no win, and the state after an action that ended the
    episode without a win (``done`` and not ``truncated``), get the group's cap, one more than its
    largest finite distance, so every state that reaches a win is nearer than every state that does
    not. A group without a win has every state at its cap: no progress anywhere, except that a turn
    whose next state is the state it began in has progress -1, as a step away from the goal has.
    Rows of a trajectory are in time order (the ``StepBatch`` contract).
    """
    group_ids = _id_column("group_ids", group_ids, len(np.asarray(group_ids)))
    n = len(group_ids)
    traj_ids = _id_column("traj_ids", traj_ids, n)
    anchor_keys = _id_column("anchor_keys", anchor_keys, n)
    won, done, truncated = (
        _id_column(name, column, n).astype(bool)
        for name, column in (("won", won), ("done", done), ("truncated", truncated))
    )
    if n == 0:
        empty = np.zeros(0)
        no_ids, no_flags = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        return GraphProgress(no_ids, no_ids, empty, empty, empty, no_flags, no_flags)
    state, n_states = dense_ids(group_ids, anchor_keys)
    group_code, n_groups = dense_ids(group_ids)
    state_group = np.empty(n_states, dtype=np.int64)
    state_group[state] = group_code
    traj_code, n_traj = dense_ids(traj_ids)
    next_row = next_rows(traj_code, n_traj)
    has_next = next_row >= 0
    after_first_turn = np.zeros(n, dtype=bool)
    after_first_turn[next_row[has_next]] = True

    distance = np.full(n_states, np.inf)
    np.minimum.at(distance, state[won], 1.0)
    edge = has_next & ~won
    source, target = state[edge], state[next_row[edge]]
    # Unit-weight shortest paths to the goal, relaxing every edge at once: the loop runs once per
    # step of the longest shortest path, never once per row.
    while len(source):
        relaxed = distance.copy()
        np.minimum.at(relaxed, source, distance[target] + 1.0)
        if np.array_equal(relaxed, distance):
            break
        distance = relaxed
    finite = np.isfinite(distance)
    cap = np.ones(n_groups)
    np.maximum.at(cap, state_group[finite], distance[finite] + 1.0)
    distance = np.where(finite, distance, cap[state_group])

    next_distance = np.full(n, np.nan)
    next_distance[has_next] = distance[state[next_row[has_next]]]
    lost = ~has_next & done & ~truncated
    next_distance[lost] = cap[group_code[lost]]
    next_distance[won] = 0.0
    row_distance = distance[state]
    progress = np.clip(row_distance - next_distance, -1.0, 1.0)
    # A turn that left the state as it was (an invalid or idle action) spent a turn for nothing: it
    # scores as a step away, never above one (with the invalid-action penalty, below it).
    stayed = np.zeros(n, dtype=bool)
    stayed[has_next] = state[next_row[has_next]] == state[has_next]
    progress[stayed & ~won] = -1.0

    # A meeting: a state seen after the first turn by two or more trajectories of the group.
    first_visit = first_visits(traj_code, state)
    trajectories_at = np.bincount(state[first_visit], minlength=n_states)
    seen_later = np.bincount(state, weights=after_first_turn.astype(np.float64), minlength=n_states) > 0
    merged_group = np.zeros(n_groups, dtype=bool)
    merged_group[state_group[(trajectories_at >= 2) & seen_later]] = True
    trajectory_won = np.bincount(traj_code, weights=won, minlength=n_traj)[traj_code] > 0
    return GraphProgress(
        group_code, state, row_distance, next_distance, progress, trajectory_won, merged_group[group_code]
    )


def graph_advantages(graph: GraphProgress, *, normalize: StepNormalize = "mean", eps: float = 1e-6) -> np.ndarray:
    """Graph credit: each step's progress (:func:`graph_progress`) against the other steps of its
    group (same seed), ``mean`` or ``mean_std`` as :func:`step_advantages`.

    The baseline is the group's, not the anchor group's: progress already compares a state with the
    state the action led to, so steps taken in different states are comparable, and a step taken in
    a state no other trajectory visited (most steps of a long walk) still gets credit, where GiGPO
    gives a singleton anchor group 0. Rows whose progress is unknown (a cut last step), and the rows
    of groups whose trajectories never meet (:attr:`GraphProgress.merged`), get 0 and enter no
    statistic.
    """
    _choice("normalize", normalize, STEP_NORMALIZE)
    credited = graph.merged & ~np.isnan(graph.progress)
    advantages = np.zeros(len(graph.state))
    if np.any(credited):
        codes, n_codes = dense_ids(graph.group[credited])
        advantages[credited] = _normalize_within(graph.progress[credited], codes, n_codes, normalize, eps)
    return advantages


# ---- the credit pipeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Credit:
    """What :func:`compute_advantages` assigns to each row of a batch, and why."""

    advantages: np.ndarray
    """The advantage the learner uses: ``episode + step_weight * step - invalid_penalty * invalid +
    novelty`` (without its first two terms on an invalid row with ``algo.invalid_credit="penalty"``),
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
    graph: GraphProgress | None = None
    """The groups' state graphs and each step's progress in them, with ``algo.step_credit="graph"``."""
    step_credit: str = "none"
    """The step-level credit that was computed (``algo.step_credit``)."""
    group_spread: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per group, the std of its trajectory returns (:func:`group_return_spread`)."""
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Per group, whether the variance filter kept it (``algo.keep_groups``, :func:`kept_groups`);
    the rows of a group it dropped have advantage 0."""
    position_mass: np.ndarray = field(default_factory=lambda: np.zeros(3))
    """The share of the advantages' absolute mass on the first, middle and last third of the
    trajectories' turns (:func:`turn_position_mass`)."""
    novelty: np.ndarray | None = None
    """Per row, the novelty bonus added to its advantage (``algo.novelty_bonus``,
    :func:`novelty_bonuses`); None when the bonus is off."""
    masked_overlong: int = 0
    """Rows whose non-zero advantage ``algo.mask_overlong`` set to 0 (their reply hit the token limit)."""

    def filtered_out(self) -> bool:
        """Whether the variance filter dropped every group of a batch that had some."""
        return len(self.kept) > 0 and not self.kept.any()

    def why_no_step(self) -> str:
        """Why an update on this credit takes no optimizer step, when it takes none."""
        if self.filtered_out():
            return (
                "the variance filter (algo.keep_groups, algo.drop_flat_groups) dropped every group: "
                "each group's returns were all equal"
            )
        if self.masked_overlong:
            return (
                f"every row has zero advantage once algo.mask_overlong left out the {self.masked_overlong} "
                "whose reply hit rollout.max_new_tokens"
            )
        return "every row has zero advantage"

    def blind_step_credit(self) -> str | None:
        """Why step credit reached no row of this batch, or None when it reached some: no anchor state
        recurs within a group (``anchor``), or no group's trajectories meet (``graph``)."""
        if self.step_credit == "anchor" and self.group_stats.frac_rows_in_groups_ge2 == 0:
            return (
                "step credit (anchor) found no anchor state shared by two steps of a group: every step advantage is 0"
            )
        if self.step_credit == "graph" and len(self.graph.state) and not self.graph.merged.any():
            return (
                "step credit (graph) found no group whose trajectories meet in an anchor state after the first turn: "
                "every step advantage is 0 and episode credit alone remains"
            )
        return None

    def metrics(self) -> dict[str, float]:
        """Scalars for the run log."""
        metrics = {
            # What limits learning: groups whose members all did equally well give episode credit no
            # signal; the filter's share; where in the episodes the signal lies.
            "credit/zero_variance_groups": float(np.mean(self.group_spread == 0)) if len(self.group_spread) else 0.0,
            "credit/kept_groups": float(np.mean(self.kept)) if len(self.kept) else 0.0,
            **{
                f"advantage/mass_{part}": float(share)
                for part, share in zip(("early", "middle", "late"), self.position_mass)
            },
            "advantage/abs_mean": float(np.abs(self.advantages).mean()) if len(self.advantages) else 0.0,
            # Positive: the batch pushes up, on balance, what it sampled; negative: away from it.
            "advantage/sum": float(self.advantages.sum()),
            "advantage/zero_fraction": float(np.mean(self.advantages == 0)) if len(self.advantages) else 0.0,
            "advantage/step_abs_mean": float(np.abs(self.step).mean()) if len(self.step) else 0.0,
        }
        if self.novelty is not None and len(self.novelty):
            metrics["credit/novel_rows"] = float(np.mean(self.novelty > 0))
        if self.group_stats is not None:
            metrics["anchors/mean_group_size"] = self.group_stats.mean_size
            metrics["anchors/max_group_size"] = float(self.group_stats.max_size)
            metrics["anchors/grouped_fraction"] = self.group_stats.frac_rows_in_groups_ge2
        if self.graph is not None and len(self.graph.state):
            graph = self.graph
            # Which steps graph credit can see: those of groups whose trajectories meet.
            metrics["graph/merged_fraction"] = float(graph.merged.mean())
            # Progress inside failed trajectories, which episode credit cannot reward.
            failed = ~graph.trajectory_won & ~np.isnan(graph.progress)
            metrics["graph/failed_progress_fraction"] = (
                float(np.mean(graph.progress[failed] > 0)) if failed.any() else 0.0
            )
            metrics["graph/mean_distance"] = float(graph.distance.mean())
        return metrics


class CreditSettings(Protocol):
    """What :func:`compute_advantages` reads of a resolved ``agent_rl.config.AlgorithmConfig``."""

    advantage: str
    episode_stats: str
    step_credit: str
    step_normalize: str
    step_weight: float
    gamma: float
    invalid_penalty: float
    invalid_credit: str
    novelty_bonus: float
    negative_weight: float
    row_weight: str
    keep_groups: float
    drop_flat_groups: bool
    mask_overlong: bool
    eps: float


def compute_advantages(batch: StepBatch, algo: CreditSettings) -> Credit:
    """One advantage per row of ``batch`` for the resolved algorithm ``algo``
    (``agent_rl.config.resolve_algorithm``), as in the GiGPO paper:

    - Eq. 3, episode: each trajectory's total reward R against its group (same seed), with the
      preset's estimator (``grpo``, ``drgrpo`` or ``rloo``, see :func:`episode_advantages`).
    - Eq. 6, anchor groups: rows of one group that share ``batch.anchor_key``.
    - Eq. 7, step (``algo.step_credit="anchor"``): each row's discounted return-to-go against its
      anchor group (:func:`step_advantages`, ``mean`` or ``mean_std``); or, with
      ``algo.step_credit="graph"``, each row's progress towards a win in its group's state graph
      against its group (:func:`graph_advantages`).
    - Eq. 8: ``A = A_episode + step_weight * A_step``.

    With ``algo.advantage="none"`` the episode part is 0 and step credit alone remains.

    ``algo.invalid_penalty`` is then charged to each row whose action was invalid, on that row
    alone: it is not discounted into earlier steps and enters no group statistic, so no std can
    scale it up. With ``algo.invalid_credit="penalty"`` such a row gets the penalty alone, not its
    trajectory's episode and step credit. ``algo.novelty_bonus`` is added the same way to each row
    whose action reached a state new to its trajectory, in the groups the task left silent
    (:func:`novelty_bonuses`).
    Negative advantages are then multiplied by ``algo.negative_weight``, and with
    ``algo.row_weight="trajectory"`` every row's advantage is scaled by
    :func:`trajectory_weights`, so each trajectory weighs the same in the loss whatever its length.
    Last, with ``algo.keep_groups`` below 1 or ``algo.drop_flat_groups`` the rows of the groups
    the variance filter drops (:func:`kept_groups`) get 0.
    With ``algo.mask_overlong`` a row whose reply hit the token limit (``batch.overlong``) gets 0.
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
    spread = group_return_spread(episode_return, batch.group_id, batch.traj_id) if n else np.zeros(0)
    novelty = None
    if algo.novelty_bonus:
        if batch.anchor_key is None:
            raise ValueError("algo.novelty_bonus needs StepBatch.anchor_key (see anchors.compute_anchor_keys)")
        novelty = novelty_bonuses(batch, spread, algo.novelty_bonus)
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
    graph = None
    if algo.step_credit != "none" and step_groups is None:
        raise ValueError(
            f"step credit ({algo.step_credit}) needs StepBatch.anchor_key (see anchors.compute_anchor_keys)"
        )
    if algo.step_credit == "anchor":
        step_returns = discounted_returns(batch.reward, batch.traj_id, algo.gamma)
        step = _normalize_within(step_returns, step_groups, group_stats_.n_groups, algo.step_normalize, algo.eps)
    elif algo.step_credit == "graph":
        graph = graph_progress(batch.group_id, batch.traj_id, batch.anchor_key, batch.won, batch.done, batch.truncated)
        step = graph_advantages(graph, normalize=algo.step_normalize, eps=algo.eps)
    outcome = episode + algo.step_weight * step
    if algo.invalid_credit == "penalty":
        outcome = np.where(batch.action_valid, outcome, 0.0)
    advantages = outcome - algo.invalid_penalty * ~batch.action_valid
    if novelty is not None:
        advantages = advantages + novelty
    advantages = np.where(advantages < 0, algo.negative_weight * advantages, advantages)
    if algo.row_weight == "trajectory" and n:
        advantages = advantages * trajectory_weights(traj_code)
    kept = kept_groups(spread, algo.keep_groups, algo.drop_flat_groups)
    if n:
        advantages = np.where(kept[dense_ids(batch.group_id)[0]], advantages, 0.0)
    masked_overlong = int(np.count_nonzero(batch.overlong & (advantages != 0))) if algo.mask_overlong else 0
    if masked_overlong:
        advantages = np.where(batch.overlong, 0.0, advantages)
    position_mass = turn_position_mass(advantages, batch.t, batch.traj_id) if n else np.zeros(3)
    return Credit(
        advantages,
        episode,
        step,
        step_groups,
        group_stats_,
        graph,
        algo.step_credit,
        spread,
        kept,
        position_mass,
        novelty,
        masked_overlong,
    )


def trajectory_weights(traj_code: np.ndarray) -> np.ndarray:
    """Per row, the mean trajectory length over its own trajectory's (dense codes): the rows of each
    trajectory then weigh as much in all as one mean-length trajectory's, and the weights sum to the
    number of rows."""
    lengths = np.bincount(traj_code).astype(np.float64)
    return (len(traj_code) / np.count_nonzero(lengths)) / lengths[traj_code]
