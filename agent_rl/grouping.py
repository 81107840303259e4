"""Dense ids for rows that share the values of one or more columns.

This is the one grouping primitive of the project: episode statistics (rows of one group, rows of
one trajectory) and anchor groups (``anchors.group_steps``) are all built on :func:`dense_ids`.
"""

from __future__ import annotations

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
