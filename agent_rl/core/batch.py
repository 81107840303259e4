"""``StepBatch``: the columnar record of a rollout, one row per turn.

Scalar columns are numpy arrays of equal length. Token columns are ragged: one 1-D array per row.
Within a trajectory, rows are in time order (``t`` increasing); trajectories may be interleaved.
The anchor columns hold what the agent saw *when it chose the action* of that row (observation and
error before the step), because GiGPO groups actions by the state they were taken in.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping, Sequence

import numpy as np

_SCALAR_DTYPES = {
    "group_id": np.int64,
    "traj_id": np.int64,
    "t": np.int64,
    "reward": np.float64,
    "done": np.bool_,
    "truncated": np.bool_,
    "action_valid": np.bool_,
    "won": np.bool_,
    "overlong": np.bool_,
}
_RAGGED = ("prompt_ids", "response_ids", "old_logprobs")
_TEXT = ("observation", "error", "action", "anchor_state")


@dataclass
class StepBatch:
    """One row per turn. See the module docstring for the ordering contract."""

    group_id: np.ndarray
    """Rows with equal ``group_id`` started from the same seed (same initial state)."""
    traj_id: np.ndarray
    """Globally unique trajectory id."""
    t: np.ndarray
    """Turn index within the trajectory, starting at 0."""
    reward: np.ndarray
    """Environment reward received for this turn's action (float64)."""
    done: np.ndarray
    """True on the last row of a trajectory (terminated, truncated, or cut by max turns)."""
    truncated: np.ndarray
    """True where the trajectory ended without terminating (time limit or max turns)."""
    action_valid: np.ndarray
    """``info["action_valid"]`` returned by the environment for this turn's action."""
    won: np.ndarray
    """``info["won"]`` after this turn's action."""
    overlong: np.ndarray
    """The response hit the generation length limit (for DAPO overlong shaping)."""
    prompt_ids: list[np.ndarray]
    """Token ids of the prompt of each row."""
    response_ids: list[np.ndarray]
    """Token ids the engine sampled for each row."""
    old_logprobs: list[np.ndarray]
    """Engine logprob of each sampled response token, under the sampling distribution."""
    observation: list[str]
    """Observation the action was chosen on."""
    error: list[str | None]
    """``info["error"]`` of that observation (raw error text) or None."""
    action: list[str]
    """The parsed action text sent to the environment."""
    anchor_state: list[str]
    """``info["anchor"]`` of that observation: the environment's canonical state key."""
    anchor_key: np.ndarray | None = None
    """Anchor key per row (uint64), filled by ``anchors`` from one of the columns above."""
    choice_ids: list[np.ndarray] | None = None
    """Per row, for a response chosen among listed actions and learned as that choice
    (``rollout.choice_logprobs=choice``): the token ids the choice offered at each response position,
    ``(response tokens, K)`` padded with -1, over which its logprobs are normalized; a ``(0, 0)``
    array for a response written freely. None: every response was written freely."""
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    """Optional per-row numeric columns (e.g. recomputed logprob stats)."""

    def __post_init__(self) -> None:
        for name, dtype in _SCALAR_DTYPES.items():
            setattr(self, name, np.asarray(getattr(self, name), dtype=dtype).reshape(-1))
        for name in _RAGGED:
            setattr(self, name, [np.asarray(x) for x in getattr(self, name)])
        for name in _TEXT:
            setattr(self, name, list(getattr(self, name)))
        if self.choice_ids is not None:
            self.choice_ids = [np.asarray(x, dtype=np.int64) for x in self.choice_ids]
        self.validate()

    def __len__(self) -> int:
        return len(self.group_id)

    def validate(self) -> None:
        """Check column lengths and the time-order contract; raise ValueError naming the problem."""
        n = len(self.group_id)
        for f in fields(self):
            if f.name in ("extras",):
                continue
            value = getattr(self, f.name)
            if value is None:
                continue
            if len(value) != n:
                raise ValueError(f"StepBatch column {f.name!r} has {len(value)} rows, expected {n}")
        for name, value in self.extras.items():
            if len(value) != n:
                raise ValueError(f"StepBatch extra column {name!r} has {len(value)} rows, expected {n}")
        for i, (resp, lp) in enumerate(zip(self.response_ids, self.old_logprobs)):
            if len(resp) != len(lp):
                raise ValueError(f"StepBatch row {i}: {len(resp)} response tokens but {len(lp)} old logprobs")
        for i, (resp, offered) in enumerate(zip(self.response_ids, self.choice_ids or ())):
            if offered.ndim != 2 or (offered.size and len(offered) != len(resp)):
                raise ValueError(
                    f"StepBatch row {i}: choice_ids of shape {offered.shape} for {len(resp)} response tokens "
                    f"(expected ({len(resp)}, K), or (0, 0) for a reply written freely)"
                )
            if offered.size and not (offered == resp[:, None]).any(axis=1).all():
                raise ValueError(f"StepBatch row {i}: a response token is not among the choice_ids of its position")
        if n:
            # A stable sort by trajectory keeps row order inside each trajectory; t must then increase.
            order = np.argsort(self.traj_id, kind="stable")
            same_traj = self.traj_id[order][1:] == self.traj_id[order][:-1]
            if np.any(same_traj & (np.diff(self.t[order]) <= 0)):
                raise ValueError("StepBatch rows of a trajectory are not in strictly increasing time order")

    @classmethod
    def from_rows(
        cls,
        rows: Sequence[Mapping[str, Any]],
        group_id: Sequence[int] | np.ndarray,
        traj_id: Sequence[int] | np.ndarray,
        extras: dict[str, np.ndarray] | None = None,
    ) -> "StepBatch":
        """A batch of per-turn records (what a rollout writes): each row maps every column in
        ``ROW_COLUMNS`` to its value, and ``choice_ids`` where a rollout records it (other keys are
        ignored); ``group_id`` and ``traj_id`` give each row's group and trajectory."""
        missing = [name for name in ROW_COLUMNS if rows and name not in rows[0]]
        if missing:
            raise ValueError(f"StepBatch.from_rows: the rows lack the columns {missing}")
        return cls(
            group_id=group_id,
            traj_id=traj_id,
            **{name: [row[name] for row in rows] for name in ROW_COLUMNS},
            choice_ids=[row["choice_ids"] for row in rows] if rows and "choice_ids" in rows[0] else None,
            extras=dict(extras or {}),
        )

    @classmethod
    def for_credit(
        cls,
        group_id: Sequence[int] | np.ndarray,
        traj_id: Sequence[int] | np.ndarray,
        reward: Sequence[float] | np.ndarray,
        anchor_key: Sequence | np.ndarray | None = None,
        action_valid: Sequence[bool] | np.ndarray | None = None,
        won: Sequence[bool] | np.ndarray | None = None,
        truncated: Sequence[bool] | np.ndarray | None = None,
    ) -> "StepBatch":
        """A batch holding only what credit assignment reads (tabular policies, examples, tests):
        rows of each trajectory in time order, no tokens and no text. ``action_valid`` defaults to
        all valid and ``won`` to all False; ``done`` marks each trajectory's last row, and ``truncated``
        (default False) is read on that row only: whether the trajectory ended without terminating."""
        from agent_rl.core.grouping import dense_ids, positions_within

        traj_id = np.asarray(traj_id)
        n = len(traj_id)
        codes, n_traj = dense_ids(traj_id)
        t = positions_within(codes, n_traj)
        done = t == np.bincount(codes, minlength=n_traj)[codes] - 1
        empty_tokens = [np.zeros(0, dtype=np.int64)] * n
        return cls(
            group_id=group_id,
            traj_id=traj_id,
            t=t,
            reward=reward,
            done=done,
            truncated=done & (False if truncated is None else np.asarray(truncated, dtype=bool)),
            action_valid=np.ones(n) if action_valid is None else action_valid,
            won=np.zeros(n) if won is None else won,
            overlong=np.zeros(n),
            prompt_ids=empty_tokens,
            response_ids=empty_tokens,
            old_logprobs=empty_tokens,
            observation=[""] * n,
            error=[None] * n,
            action=[""] * n,
            anchor_state=[""] * n,
            anchor_key=None if anchor_key is None else np.asarray(anchor_key),
        )

    @property
    def response_lengths(self) -> np.ndarray:
        return np.fromiter((len(r) for r in self.response_ids), dtype=np.int64, count=len(self))

    def select(self, rows: np.ndarray | Sequence[int]) -> "StepBatch":
        """A new batch holding ``rows`` (indices or a boolean mask), in the given order."""
        index = np.asarray(rows)
        if index.dtype == np.bool_:
            index = np.flatnonzero(index)
        kwargs = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "extras":
                kwargs[f.name] = {k: v[index] for k, v in value.items()}
            elif value is None:
                kwargs[f.name] = None
            elif isinstance(value, np.ndarray):
                kwargs[f.name] = value[index]
            else:
                kwargs[f.name] = [value[i] for i in index]
        return StepBatch(**kwargs)

    @staticmethod
    def concatenate(batches: Sequence["StepBatch"]) -> "StepBatch":
        """Stack batches row-wise. Trajectory ids must already be unique across batches."""
        if not batches:
            raise ValueError("StepBatch.concatenate needs at least one batch")
        kwargs = {}
        for f in fields(StepBatch):
            values = [getattr(b, f.name) for b in batches]
            if f.name == "extras":
                keys = set(values[0])
                if any(set(v) != keys for v in values):
                    raise ValueError("StepBatch.concatenate: batches carry different extra columns")
                kwargs[f.name] = {k: np.concatenate([v[k] for v in values]) for k in keys}
            elif any(v is None for v in values):
                if not all(v is None for v in values):
                    raise ValueError(f"StepBatch.concatenate: column {f.name!r} is set in some batches only")
                kwargs[f.name] = None
            elif isinstance(values[0], np.ndarray):
                kwargs[f.name] = np.concatenate(values)
            else:
                kwargs[f.name] = [x for v in values for x in v]
        return StepBatch(**kwargs)


ROW_COLUMNS = tuple(
    f.name for f in fields(StepBatch) if f.name not in ("group_id", "traj_id", "anchor_key", "choice_ids", "extras")
)
"""The columns every per-turn record carries (:meth:`StepBatch.from_rows`): all but the ids, which
follow from where the row sits, the anchor key and extras, which are computed later, and the
optional ``choice_ids``."""
