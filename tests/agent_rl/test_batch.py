"""StepBatch: the columnar rollout record and its contracts; the light top-level import."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from agent_rl.core.batch import ROW_COLUMNS, StepBatch


def _batch(traj_ids, ts, **overrides):
    n = len(traj_ids)
    columns = dict(
        group_id=np.zeros(n, dtype=int),
        traj_id=traj_ids,
        t=ts,
        reward=np.zeros(n),
        done=np.zeros(n, dtype=bool),
        truncated=np.zeros(n, dtype=bool),
        action_valid=np.ones(n, dtype=bool),
        won=np.zeros(n, dtype=bool),
        overlong=np.zeros(n, dtype=bool),
        prompt_ids=[np.arange(3)] * n,
        response_ids=[np.arange(i + 1) for i in range(n)],
        old_logprobs=[np.full(i + 1, -1.0) for i in range(n)],
        observation=[f"obs {i}" for i in range(n)],
        error=[None] * n,
        action=["look"] * n,
        anchor_state=[f"s{i}" for i in range(n)],
    )
    columns.update(overrides)
    return StepBatch(**columns)


def test_interleaved_trajectories_in_time_order_are_valid():
    batch = _batch([0, 1, 0, 1, 0], [0, 0, 1, 1, 2])
    assert len(batch) == 5
    np.testing.assert_array_equal(batch.response_lengths, [1, 2, 3, 4, 5])
    assert batch.reward.dtype == np.float64 and batch.done.dtype == np.bool_


@pytest.mark.parametrize(
    "traj, t",
    [([0, 0], [1, 0]), ([0, 1, 0], [0, 0, 0])],
)
def test_time_order_is_enforced(traj, t):
    with pytest.raises(ValueError, match="time order"):
        _batch(traj, t)


def test_column_lengths_and_logprob_counts_are_checked():
    with pytest.raises(ValueError, match="column 'reward' has 1 rows, expected 2"):
        _batch([0, 0], [0, 1], reward=np.zeros(1))
    with pytest.raises(ValueError, match="row 1: 2 response tokens but 1 old logprobs"):
        _batch([0, 0], [0, 1], old_logprobs=[np.zeros(1), np.zeros(1)])


def test_select_and_concatenate_round_trip():
    batch = _batch([0, 1, 0, 1], [0, 0, 1, 1])
    evens, odds = batch.select([0, 2]), batch.select(np.array([False, True, False, True]))
    assert evens.traj_id.tolist() == [0, 0] and odds.observation == ["obs 1", "obs 3"]
    joined = StepBatch.concatenate([evens, odds])
    assert joined.observation == ["obs 0", "obs 2", "obs 1", "obs 3"]
    np.testing.assert_array_equal(joined.response_lengths, [1, 3, 2, 4])
    with pytest.raises(ValueError, match="at least one batch"):
        StepBatch.concatenate([])


def test_importing_agent_rl_stays_light():
    code = (
        "import sys, agent_rl, agent_rl.core.advantages, agent_rl.core.batch; "
        "print(sorted(m for m in ('torch', 'vllm', 'ray', 'textworld', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_for_credit_numbers_turns_within_each_trajectory():
    batch = StepBatch.for_credit([0, 0, 0, 1, 0], [5, 7, 5, 9, 7], [0.0, 1.0, 0.5, 0.0, 0.0], anchor_key=["a"] * 5)
    np.testing.assert_array_equal(batch.t, [0, 0, 1, 0, 1])
    assert batch.action_valid.all() and batch.anchor_key.tolist() == ["a"] * 5
    assert all(len(ids) == 0 for ids in batch.response_ids)
    assert StepBatch.for_credit([], [], []).t.shape == (0,)
    # done marks each trajectory's last row; truncated is read there only.
    flags = StepBatch.for_credit([0] * 4, [5, 5, 6, 6], [0.0] * 4, truncated=[True, True, False, True])
    assert flags.done.tolist() == [False, True, False, True] and flags.truncated.tolist() == [False, True, False, True]


def test_from_rows_reads_every_schema_column_from_per_turn_records():
    batch = _batch([3, 3, 4], [0, 1, 0], reward=np.array([0.0, 1.0, 0.5]))
    rows = [{name: getattr(batch, name)[i] for name in ROW_COLUMNS} | {"kept_aside": i} for i in range(3)]
    rebuilt = StepBatch.from_rows(rows, group_id=batch.group_id, traj_id=batch.traj_id, extras={"seed": np.arange(3)})
    for name in ROW_COLUMNS:
        assert [np.asarray(v).tolist() for v in getattr(rebuilt, name)] == [
            np.asarray(v).tolist() for v in getattr(batch, name)
        ], name
    assert rebuilt.extras["seed"].tolist() == [0, 1, 2]
    assert rebuilt.choice_ids is None  # the records carry none
    assert set(ROW_COLUMNS) | {"group_id", "traj_id", "anchor_key", "choice_ids", "extras"} == set(
        StepBatch.__dataclass_fields__
    )
    with pytest.raises(ValueError, match=r"lack the columns \['won'\]"):
        StepBatch.from_rows([{k: v for k, v in rows[0].items() if k != "won"}], group_id=[0], traj_id=[0])


def test_choice_ids_travel_with_their_rows_and_must_fit_their_responses():
    batch = _batch([3, 3, 4], [0, 1, 0])
    # Responses [0], [0, 1] and [0, 1, 2]: each token among its position's offered ids.
    offered = [np.array([[0, 6, -1]]), np.zeros((0, 0)), np.array([[7, 0], [1, 8], [2, -1]])]
    chosen = StepBatch(**{f: getattr(batch, f) for f in batch.__dataclass_fields__} | {"choice_ids": offered})
    assert all(ids.dtype == np.int64 for ids in chosen.choice_ids)
    picked = chosen.select([2, 0])
    assert [ids.tolist() for ids in picked.choice_ids] == [offered[2].tolist(), offered[0].tolist()]
    both = StepBatch.concatenate([chosen.select([0, 1]), chosen.select([2])])
    assert [ids.tolist() for ids in both.choice_ids] == [ids.tolist() for ids in offered]
    with pytest.raises(ValueError, match="set in some batches only"):
        StepBatch.concatenate([chosen.select([0, 1]), batch.select([2])])
    with pytest.raises(ValueError, match=r"row 1: choice_ids of shape \(3, 1\) for 2 response tokens"):
        StepBatch(
            **{f: getattr(batch, f) for f in batch.__dataclass_fields__}
            | {"choice_ids": [offered[0], np.ones((3, 1)), offered[2]]}
        )
    with pytest.raises(ValueError, match="row 0: a response token is not among the choice_ids of its position"):
        StepBatch(
            **{f: getattr(batch, f) for f in batch.__dataclass_fields__}
            | {"choice_ids": [np.array([[5, 6]]), offered[1], offered[2]]}
        )
