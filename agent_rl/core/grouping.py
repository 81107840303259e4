"""Dense ids for rows that share the values of one or more columns, and step-group statistics.

This is the one grouping primitive of the project: episode statistics (rows of one group, rows of
one trajectory) and anchor groups (:func:`group_steps`) are all built on :func:`dense_ids`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _as_column(column: np.ndarray | list) -> np.ndarray:
    values = np.asarray(column)
    if values.ndim != 1:
        raise ValueError(f"grouping columns must be 1-D, got shape {values.shape}")
    if values.dtype.kind == "b":
        return values.astype(np.int64)
    if values.dtype == object:
        # Python objects (e.g. str keys): group by their string form.
        return values.astype(str)
    return values


def _running_count(flags: np.ndarray) -> np.ndarray:
    """``np.cumsum(flags)`` as int64 for a bool array, read as bytes: a cumsum of bools themselves
    casts every element and is about twice as slow."""
    return np.cumsum(flags.view(np.uint8), dtype=np.int64)


def _compact_range(values: np.ndarray) -> tuple[int, int] | None:
    """``(low, span)`` of integers whose range is not much wider than the row count, else None."""
    if values.dtype.kind not in "iu":
        return None
    low = int(values.min())
    span = int(values.max()) - low
    return (low, span) if span <= 4 * len(values) + 1024 else None


def _compact_codes(values: np.ndarray, low: int, span: int) -> tuple[np.ndarray, int]:
    """O(n) dense codes for integers in ``[low, low + span]`` (see :func:`_compact_range`)."""
    # Offsets are copies, so codes never alias the input.
    if values.dtype.kind == "u":  # every value is >= low: the subtraction cannot wrap
        offsets = (values - values.dtype.type(low)).astype(np.int64)
    else:  # widened first: in a narrow signed dtype the subtraction could overflow
        offsets = values.astype(np.int64)
        offsets -= low
    present = np.zeros(span + 1, dtype=bool)
    present[offsets] = True
    if present.all():  # already dense (e.g. trajectory ids 0..k-1): the offsets are the codes
        return offsets, span + 1
    remap = _running_count(present) - 1
    return remap[offsets], int(remap[-1]) + 1


_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd: multiplying by it is a bijection on 64-bit words


def _mixed_key(arrays: list[np.ndarray]) -> np.ndarray:
    """One 64-bit word per row mixed from integer columns. Its high bits depend on every input bit
    (a product's bit k depends on the factors' bits 0..k), and those are the bits that are kept."""
    key = arrays[0].astype(np.uint64)
    key *= _MIX
    for array in arrays[1:]:
        key ^= array.view(np.uint64) if array.dtype.itemsize == 8 else array.astype(np.uint64)
        key *= _MIX
    return key


def _index_bits(n: int) -> int:
    return max(1, (n - 1).bit_length())


def _sort_packed(high: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Sort rows by ``high`` (uint64 whose low index bits are zero), ties in row order, with one
    value sort of ``high | row``: sorting words is several times faster than an argsort.
    Returns ``(rows, starts)``, ``starts`` flagging the first row of each run of equal ``high``."""
    bits = _index_bits(n)
    packed = high | np.arange(n, dtype=np.uint64)
    packed.sort()
    starts = np.empty(n, dtype=bool)
    starts[0] = True
    # Neighbours differ in ``high`` exactly when their XOR has a bit above the index bits.
    np.greater_equal(packed[1:] ^ packed[:-1], np.uint64(1 << bits), out=starts[1:])
    packed &= np.uint64((1 << bits) - 1)
    return packed.view(np.intp), starts


def _codes_from_runs(order: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, int]:
    run_ids = _running_count(starts)
    run_ids -= 1
    codes = np.empty(len(order), dtype=np.int64)
    codes[order] = run_ids
    return codes, int(run_ids[-1]) + 1


def _hashed_codes(arrays: list[np.ndarray]) -> tuple[np.ndarray, int] | None:
    """Codes from a sort of mixed keys truncated to leave room for the row index; None on a
    truncation collision (two different rows sharing a key), which the caller resolves exactly."""
    n = len(arrays[0])
    bits = _index_bits(n)
    key = _mixed_key(arrays)
    key &= ~np.uint64((1 << bits) - 1)  # room for the row index
    order, starts = _sort_packed(key, n)
    for array in arrays:
        # A run of equal keys holding two different rows has two different neighbours somewhere.
        ordered = array[order]
        if np.any((ordered[1:] != ordered[:-1]) & ~starts[1:]):
            return None
    return _codes_from_runs(order, starts)


def dense_ids(*columns: np.ndarray | list) -> tuple[np.ndarray, int]:
    """Map each row to an id in ``[0, n_groups)`` shared exactly by rows equal in every column.

    Ids depend on the row values only, never on row order. Compact integer ids (trajectory and group
    ids) take an O(n) table path; other integers (hashed anchor keys) one sort of mixed 64-bit keys,
    verified exactly; anything else (strings) one ``np.lexsort``. Returns ``(ids, n_groups)``.
    """
    if not columns:
        raise ValueError("dense_ids needs at least one column")
    arrays = [_as_column(c) for c in columns]
    n = len(arrays[0])
    for array in arrays[1:]:
        if len(array) != n:
            raise ValueError(f"grouping columns differ in length: {n} vs {len(array)}")
    if n == 0:
        return np.zeros(0, dtype=np.int64), 0

    ranges = [_compact_range(a) for a in arrays]
    if all(r is not None for r in ranges):
        compact = [_compact_codes(a, *r) for a, r in zip(arrays, ranges)]
        codes, n_groups = compact[0]
        for next_codes, n_next in compact[1:]:
            combined = codes * n_next + next_codes
            combined_range = _compact_range(combined)
            if combined_range is None:
                break
            codes, n_groups = _compact_codes(combined, *combined_range)
        else:
            return codes, n_groups
        arrays = [c[0] for c in compact]
    if all(a.dtype.kind in "iu" for a in arrays):
        hashed = _hashed_codes(arrays)
        if hashed is not None:
            return hashed

    order = np.lexsort(arrays[::-1])  # lexsort's primary key is its last
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    for array in arrays:
        ordered = array[order]
        starts[1:] |= ordered[1:] != ordered[:-1]
    return _codes_from_runs(order, starts)


def rows_by_group(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Row indices listed group by group (``codes`` from :func:`dense_ids`), each group's rows in
    their original order: a stable argsort of ``codes``, done as a radix sort or one sort of packed
    words."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, dtype=np.intp)
    if n_groups <= 1 << 16:  # numpy's stable sort of 16-bit integers is an O(n) radix sort
        return np.argsort(codes.astype(np.uint16), kind="stable")
    if _index_bits(n) + max(n_groups - 1, 1).bit_length() > 64:
        return np.argsort(codes, kind="stable")
    return _sort_packed(codes.astype(np.uint64) << np.uint64(_index_bits(n)), n)[0]


def positions_within(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Each row's position among its group's rows in row order (0 for a group's first row): the turn
    index ``t`` when the groups are trajectories whose rows are in time order."""
    order = rows_by_group(codes, n_groups)
    lengths = np.bincount(codes, minlength=n_groups)
    position = np.empty(len(codes), dtype=np.int64)
    position[order] = np.arange(len(codes)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return position


def next_rows(codes: np.ndarray, n_groups: int) -> np.ndarray:
    """Per row, the index of the row after it in its group (``codes`` from :func:`dense_ids`), -1 for
    a group's last row: the next turn of its trajectory when the groups are trajectories whose rows
    are in time order."""
    order = rows_by_group(codes, n_groups)
    following = np.full(len(codes), -1, dtype=np.intp)
    continues = codes[order[1:]] == codes[order[:-1]]
    following[order[:-1][continues]] = order[1:][continues]
    return following


def first_visits(codes: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Per row, whether it is the first of its group (``codes``) to hold its key: in time order, the
    turn a trajectory first reached that anchor state."""
    visits, _ = dense_ids(codes, keys)
    first = np.zeros(len(codes), dtype=bool)
    first[np.unique(visits, return_index=True)[1]] = True
    return first


@dataclass(frozen=True)
class GroupStats:
    """How much step-level credit a batch can get: GiGPO's step advantage is 0 for a singleton."""

    n_rows: int
    """Number of steps grouped."""
    n_groups: int
    """Number of distinct (group_id, anchor key) step groups."""
    mean_size: float
    """Mean rows per step group (0.0 for an empty batch)."""
    max_size: int
    """Rows in the largest step group (0 for an empty batch)."""
    frac_rows_in_groups_ge2: float
    """Fraction of rows whose step group has at least 2 rows, i.e. rows that get a step advantage."""
    size_histogram: dict[int, int]
    """Step-group size -> number of step groups of that size."""

    def as_dict(self) -> dict[str, float | int | dict[str, int]]:
        """JSON-friendly view for metrics logs (histogram keys become strings)."""
        return {
            "n_rows": self.n_rows,
            "n_groups": self.n_groups,
            "mean_size": self.mean_size,
            "max_size": self.max_size,
            "frac_rows_in_groups_ge2": self.frac_rows_in_groups_ge2,
            "size_histogram": {str(size): count for size, count in self.size_histogram.items()},
        }


def group_stats(step_group_ids: np.ndarray, n_groups: int) -> GroupStats:
    """Statistics of dense step-group ids in ``[0, n_groups)``."""
    sizes = np.bincount(step_group_ids, minlength=n_groups)
    n_rows = int(len(step_group_ids))
    size_values, size_counts = np.unique(sizes, return_counts=True)
    return GroupStats(
        n_rows=n_rows,
        n_groups=int(n_groups),
        mean_size=float(n_rows / n_groups) if n_groups else 0.0,
        max_size=int(sizes.max()) if n_groups else 0,
        frac_rows_in_groups_ge2=float(sizes[sizes >= 2].sum() / n_rows) if n_rows else 0.0,
        size_histogram={int(size): int(count) for size, count in zip(size_values, size_counts)},
    )


def group_steps(group_ids: np.ndarray | list, anchor_keys: np.ndarray | list) -> tuple[np.ndarray, GroupStats]:
    """Step-group id (int64, dense) of every row: rows share an id iff they have the same group id
    and the same anchor key. Built on :func:`dense_ids`, the project's one grouping primitive, so
    ``agent_rl.core.advantages.step_advantages`` groups exactly the same way."""
    group_ids, anchor_keys = np.asarray(group_ids), np.asarray(anchor_keys)
    if group_ids.ndim != 1 or anchor_keys.ndim != 1:
        raise ValueError(f"group_ids and anchor_keys must be 1-D, got shapes {group_ids.shape} and {anchor_keys.shape}")
    if len(group_ids) != len(anchor_keys):
        raise ValueError(f"group_ids has {len(group_ids)} rows but anchor_keys has {len(anchor_keys)}")
    step_group_ids, n_groups = dense_ids(group_ids, anchor_keys)
    return step_group_ids, group_stats(step_group_ids, n_groups)
