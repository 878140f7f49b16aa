"""Arrow columns for DuckDB appends, built from buffers.

Not `pa.array`: its first call imports pandas (~0.5-1.3 s of CPU, the whole fixed cost of a
small ingest), which no ingest needs. Used by the ingester (`observatory.ingest.arrow`,
`msgspec_lines`) and by the rollups' cells (`metric_cells`, `expert_cells`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["numeric", "int64s", "column"]

I32 = (1 << 31) - 1


def numeric(a: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """A zero-copy Arrow array of a 1-D numeric numpy array, null where the bool mask `nulls` is set."""
    a = np.ascontiguousarray(a)
    valid = None if nulls is None else _validity(nulls)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [valid, pa.py_buffer(a)])


def int64s(a: np.ndarray) -> pa.Array:
    """A zero-copy Arrow int64 array (see `numeric`)."""
    return numeric(np.asarray(a, np.int64))


def _validity(nulls: np.ndarray) -> pa.Buffer | None:
    """Arrow's validity bitmap (1 = a value, LSB first) of a (N,) bool mask of nulls; None when there are none."""
    return pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None


_NUMPY = {
    pa.int64(): np.int64,
    pa.int32(): np.int32,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.float64(): np.float64,
}


def column(values: list, typ: pa.DataType) -> pa.Array:
    """A Python list (None for null) as an Arrow array of `typ`: numbers, bool or string.

    Numbers out of `typ`'s range raise OverflowError, as `pa.array` raises on them.
    """
    n = len(values)
    nulls = np.fromiter((v is None for v in values), bool, n)
    if pa.types.is_string(typ):
        # a lone surrogate (JSON allows "\ud800") has no UTF-8 form: store "?", not fail the batch
        encoded = [b"" if v is None else v.encode("utf-8", "replace") for v in values]
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(np.fromiter(map(len, encoded), np.int64, n), out=offsets[1:])
        if offsets[-1] > I32:
            raise OverflowError("string column over 2 GiB")
        buffers = [_validity(nulls), pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(typ, n, buffers)
    if nulls.any():
        values = [0 if v is None else v for v in values]
    if pa.types.is_boolean(typ):
        data = pa.py_buffer(np.packbits(np.array(values, bool), bitorder="little"))
    else:
        data = pa.py_buffer(np.array(values, _NUMPY[typ]))
    return pa.Array.from_buffers(typ, n, [_validity(nulls), data])
