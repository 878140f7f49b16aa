"""Arrow columns for DuckDB appends, built from buffers.

Not `pa.array`: its first call imports pandas (~0.5-1.3 s of CPU, the whole fixed cost of a
small ingest), which no ingest needs.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["numeric", "int64s", "column", "flush"]

I32 = (1 << 31) - 1


def numeric(a: np.ndarray) -> pa.Array:
    """A zero-copy Arrow array of a 1-D numeric numpy array."""
    a = np.ascontiguousarray(a)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def int64s(a: np.ndarray) -> pa.Array:
    """A zero-copy Arrow int64 array (see `numeric`)."""
    return numeric(np.asarray(a, np.int64))


def _validity(nulls: np.ndarray) -> pa.Buffer | None:
    """Arrow's validity bitmap (1 = a value, LSB first) of a (N,) bool mask of nulls; None when there are none."""
    return pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls.any() else None


_NUMPY = {pa.int64(): np.int64, pa.int32(): np.int32, pa.uint16(): np.uint16, pa.uint32(): np.uint32,
          pa.float64(): np.float64}  # fmt: skip


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


# ------------------------------------------------------------------ a batch's rows from Python lists

_S, _F64, _I64, _U16 = pa.string(), pa.float64(), pa.int64(), pa.uint16()
_METRICS = {"run": _S, "step": _I64, "name": _S, "value": _F64, "t": _F64, "host": _U16}
_EXPERTS = {"run": _S, "step": pa.int32(), "layer": _U16, "expert": _U16, "routed": pa.uint32(), "dropped": pa.uint32()}
_EVENTS = {"run": _S, "host": _U16, "seq": _I64, "kind": _S, "step": _I64, "t": _F64, "v": _U16, "known": pa.bool_(),
           "data": _S}  # fmt: skip
_REJECTED = {"file": _S, "run": _S, "line": _I64, "field": _S, "reason": _S, "raw": _S, "ingested_at": _F64}


def _append(con, columns: dict[str, list], types: dict[str, pa.DataType], insert: str) -> None:
    """Register `columns` (lists, typed by `types`) as `_staged` and run `insert` over it."""
    con.register("_staged", pa.table({k: column(list(columns[k]), t) for k, t in types.items()}))
    try:
        con.execute(insert)
    finally:
        con.unregister("_staged")


def flush(con, b) -> None:
    """Bulk-append everything `sql_lines._check_line` put in the batch `b` (a `sql_lines._Batch`)."""
    if b.metrics["run"]:
        m = b.metrics
        b.metric_rows.add_lists(m["run"], m["step"], m["name"], m["value"], m["t"])  # after the others: rowid order
        _append(con, b.metrics, _METRICS, "INSERT INTO metrics SELECT * FROM _staged")
    if b.experts["run"]:
        x = b.experts
        b.expert_rows.add_lists(x["run"], x["step"], x["layer"], x["expert"], x["routed"], x["dropped"])
        _append(con, b.experts, _EXPERTS, "INSERT INTO expert_load SELECT * FROM _staged")
    if b.events:
        _append(con, dict(zip(_EVENTS, zip(*b.events, strict=True), strict=True)), _EVENTS,
                "INSERT INTO events SELECT run, host, seq, kind, step, t, v, known, data::JSON FROM _staged")
    if b.rejected:  # a file of random bytes can reject 10^5 lines: bulk, not executemany
        _append(con, dict(zip(_REJECTED, zip(*b.rejected, strict=True), strict=True)), _REJECTED,
                f"INSERT INTO rejected_events ({', '.join(_REJECTED)}) SELECT * FROM _staged")
