"""A batch's staged rows appended to DuckDB as Arrow tables (`flush`); the columns are built from
buffers by `observatory.store.arrow` (not `pa.array`, whose first call imports pandas).
"""

from __future__ import annotations

import pyarrow as pa

from observatory.store.arrow import column

__all__ = ["flush"]

# ------------------------------------------------------------------ a batch's rows from Python lists

_S, _F64, _I64, _U16 = pa.string(), pa.float64(), pa.int64(), pa.uint16()
_METRICS = {"run": _S, "step": _I64, "name": _S, "value": _F64, "t": _F64, "host": _U16}
_EXPERTS = {
    "run": _S,
    "step": pa.int32(),
    "layer": _U16,
    "expert": _U16,
    "routed": pa.uint32(),
    "dropped": pa.uint32(),
}
_EVENTS = {
    "run": _S,
    "host": _U16,
    "seq": _I64,
    "kind": _S,
    "step": _I64,
    "t": _F64,
    "v": _U16,
    "known": pa.bool_(),
    "data": _S,
}
_HEARTBEATS = {"run": _S, "host": _U16, "seq": _I64, "t": _F64, "step": _I64, "phase": _S}
_TELEMETRY = {"run": _S, "host": _U16, "t": _F64, "name": _S, "value": _F64}
_REJECTED = {"file": _S, "run": _S, "line": _I64, "field": _S, "reason": _S, "raw": _S, "ingested_at": _F64}
_INSERT_EVENTS = "INSERT INTO events SELECT run, host, seq, kind, step, t, v, known, data::JSON FROM _staged"
_INSERT_REJECTED = f"INSERT INTO rejected_events ({', '.join(_REJECTED)}) SELECT * FROM _staged"


def _append(con, columns: dict[str, list], types: dict[str, pa.DataType], insert: str) -> None:
    """Register `columns` (lists, typed by `types`) as `_staged` and run `insert` over it."""
    con.register("_staged", pa.table({k: column(list(columns[k]), t) for k, t in types.items()}))
    try:
        con.execute(insert)
    finally:
        con.unregister("_staged")


def _append_rows(con, rows: list[tuple], types: dict[str, pa.DataType], insert: str) -> None:
    """`_append` of row tuples (in `types`' column order); nothing when there are none."""
    if rows:
        _append(con, dict(zip(types, zip(*rows, strict=True), strict=True)), types, insert)


def flush(con, b) -> None:
    """Bulk-append everything `model.check_line` put in the batch `b` (a `model.Batch`)."""
    if b.metrics["run"]:
        _append(
            con,
            b.metrics,
            _METRICS,
            "INSERT INTO metrics (run, step, name, value, t, host) SELECT * FROM _staged",
        )
    if b.experts["run"]:
        _append(con, b.experts, _EXPERTS, "INSERT INTO expert_load SELECT * FROM _staged")
    _append_rows(con, b.events, _EVENTS, _INSERT_EVENTS)
    _append_rows(con, b.heartbeats, _HEARTBEATS, "INSERT INTO heartbeats SELECT * FROM _staged")
    if b.telemetry["run"]:
        _append(con, b.telemetry, _TELEMETRY, "INSERT INTO host_telemetry SELECT * FROM _staged")
    # a file of random bytes can reject 10^5 lines: bulk, not executemany
    _append_rows(con, b.rejected, _REJECTED, _INSERT_REJECTED)
