"""Queries behind the instability detectors and the anomaly listings.

The detectors fetch one run's metric stream with one query (long form, one row
per (step, name)), its expert load with one more, and the findings already made
for it. Everything here takes an open DuckDB connection and returns plain
Python / polars objects; callers own the connection's lifetime.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # annotations only: polars loads lazily (start-up time of `observatory ingest`)
    import polars as pl

from observatory.events import OBSERVATORY_HOST
from observatory.store.metric_cells import distinct

__all__ = [
    "metric_series",
    "metric_arrays",
    "nonfinite_values",
    "nonfinite_arrays",
    "expert_load_series",
    "expert_layer_stats",
    "expert_zero_cells",
    "expert_rows_at",
    "expert_busiest",
    "expert_cut_step",
    "detector_state",
    "cut_step",
    "anomaly_events",
    "run_activity",
    "run_ids",
    "silent_runs",
]


def cut_step(con, run: str, through: int, lookback: int) -> int | None:
    """The step `lookback` logged steps before `through`; None when the run has fewer.

    Incremental scans start here so that every rolling window they need is whole.
    The scan is bounded to `lookback * 64` steps back (a run logging more sparsely
    than every 64th step gets None, i.e. a full scan: slower, never wrong).
    """
    rows = con.execute(
        """
        SELECT DISTINCT step FROM metrics
        WHERE run = ? AND host <> ? AND step <= ? AND step >= ?
        ORDER BY step DESC LIMIT ?
        """,
        [run, OBSERVATORY_HOST, through, through - lookback * 64, lookback + 1],
    ).fetchall()
    if len(rows) <= lookback:
        return None
    return int(rows[-1][0])


def metric_series(
    con, run: str, since_step: int | None = None, names: list[str] | None = None
) -> pl.DataFrame:
    """One run's metrics as a wide frame: `step` then one Float64 column per metric name.

    names: only these metrics (a big run logs hundreds of per-layer names the series
    detectors never look at). Several hosts logging the same name at one step are
    averaged (a NaN stays NaN). Rows are sorted by step; a metric missing at a step is null.
    """
    import polars as pl  # lazy for start-up time: ingest's detectors read `metric_arrays`

    only = "" if names is None else "AND name IN (SELECT unnest(?::VARCHAR[]))"
    params: list[Any] = [run, OBSERVATORY_HOST, -1 if since_step is None else since_step]
    tbl = con.sql(
        f"""
        SELECT step, name, avg(value) AS value FROM metrics
        WHERE run = ? AND host <> ? AND step IS NOT NULL AND step >= ? {only}
        GROUP BY step, name
        """,
        params=params + ([list(names)] if names is not None else []),
    ).to_arrow_table()
    long = pl.from_arrow(tbl)
    if long.height == 0:
        return pl.DataFrame({"step": pl.Series([], dtype=pl.Int64)})
    wide = long.pivot(on="name", index="step", values="value").sort("step")
    return wide.with_columns(pl.col("step").cast(pl.Int64))


def metric_arrays(
    con, run: str, since_step: int | None, names: list[str]
) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """`metric_series` of some metrics as numpy arrays: (every step the frame would have, sorted;
    {name: (steps, values) where it has a value}), names never logged left out. No frame, no pivot.

    The rows come as they are (the name as its place in `names`: no Python string per row) and are
    averaged per (name, step) in numpy where a step has several (hosts, a rollback's replay): half the
    time of DuckDB's GROUP BY into ~10^5 groups at the 535b log's shape. NULL values do not count, as
    `avg` would not; a (name, step) of NULLs only is not a value."""
    names = list(names)
    got = con.execute(
        """
        SELECT list_position($names, name)::INTEGER AS k, step, coalesce(value, 0) AS value, value IS NULL AS null
        FROM metrics
        WHERE run = $run AND host <> $host AND step IS NOT NULL AND step >= $since
          AND name IN (SELECT unnest($names::VARCHAR[]))
        """,
        {"run": run, "host": OBSERVATORY_HOST, "since": -1 if since_step is None else since_step, "names": names},
    ).fetchnumpy()
    k, step = np.asarray(got["k"], np.int64), np.asarray(got["step"], np.int64)
    value, null = np.asarray(got["value"], np.float64), np.asarray(got["null"], bool)
    order = np.lexsort((step, k))
    k, step, value, null = k[order], step[order], value[order], null[order]
    first = np.ones(len(k), bool)
    first[1:] = (k[1:] != k[:-1]) | (step[1:] != step[:-1])
    keep = ~null
    if not (first.all() and keep.all()):  # several rows at a (name, step), or a NULL: their average
        starts = np.flatnonzero(first)
        n = np.add.reduceat(keep.astype(np.int64), starts) if len(starts) else np.empty(0, np.int64)
        total = np.add.reduceat(np.where(keep, value, 0.0), starts) if len(starts) else np.empty(0)
        k, step, keep = k[starts], step[starts], n > 0
        value = total / np.maximum(n, 1)
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if len(k):
        cuts = np.flatnonzero(k[1:] != k[:-1]) + 1
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(k)], strict=True):
            m = keep[lo:hi]
            if m.any():
                out[names[int(k[lo]) - 1]] = step[lo:hi][m], value[lo:hi][m]
    return distinct(step), out


def nonfinite_arrays(con, run: str, since_step: int | None = None) -> dict[str, np.ndarray] | None:
    """`nonfinite_values` as numpy arrays (step, name, value), or None when the run has none."""
    got = con.execute(NONFINITE_SQL, [run, OBSERVATORY_HOST, -1 if since_step is None else since_step]).fetchnumpy()
    return {k: np.asarray(v) for k, v in got.items()} if len(got["step"]) else None


NONFINITE_SQL = """
        SELECT step, name, value FROM metrics
        WHERE run = ? AND host <> ? AND step IS NOT NULL AND step >= ? AND (isnan(value) OR isinf(value))
        ORDER BY step, name
        """


def nonfinite_values(con, run: str, since_step: int | None = None) -> pl.DataFrame:
    """Every NaN or infinite metric value of a run: columns step, name, value (long form, sorted)."""
    import polars as pl  # lazy for start-up time: ingest's detectors read `nonfinite_arrays`

    tbl = con.sql(
        NONFINITE_SQL,
        params=[run, OBSERVATORY_HOST, -1 if since_step is None else since_step],
    ).to_arrow_table()
    return pl.from_arrow(tbl)


def expert_load_series(con, run: str, since_step: int | None = None, layers: list[int] | None = None) -> pl.DataFrame:
    """Routed load per (step, layer, expert), sorted; columns step, layer, expert, routed, dropped (Int64).

    layers: only these layers. Sums are cast to BIGINT in SQL: DuckDB's sum of an integer
    column is a HUGEINT, which would arrive as Python Decimals, one object per value.
    """
    import polars as pl  # lazy for start-up time: ingest loads this module for its detectors
    only = "" if layers is None else "AND layer IN (SELECT unnest(?::USMALLINT[]))"
    tbl = con.sql(
        f"""
        SELECT step, layer, expert, sum(routed)::BIGINT AS routed, sum(dropped)::BIGINT AS dropped
        FROM expert_load WHERE run = ? AND step >= ? {only}
        GROUP BY step, layer, expert ORDER BY step, layer, expert
        """,
        params=[run, -1 if since_step is None else since_step] + ([list(layers)] if layers is not None else []),
    ).to_arrow_table()
    return pl.from_arrow(tbl)


def expert_layer_stats(con, run: str, since_step: int | None = None) -> dict[str, np.ndarray]:
    """Per (step, layer), sorted: rows, largest expert index, routed sum and max, dropped sum, zero cells.

    Numpy arrays (int64), one aggregate over few groups: what the hot / dead expert
    detectors need without fetching 384 values per layer and step. `rows == max_expert + 1`
    says the (step, layer) came from one event (expert = index in its list), so its
    `routed_max` is the busiest expert's load.
    """
    return con.execute(
        """
        SELECT step::BIGINT AS step, layer::BIGINT AS layer, count(*)::BIGINT AS rows,
               max(expert)::BIGINT AS max_expert, sum(routed)::BIGINT AS routed,
               max(routed)::BIGINT AS routed_max, sum(dropped)::BIGINT AS dropped,
               count(*) FILTER (WHERE routed = 0)::BIGINT AS zeros
        FROM expert_load WHERE run = ? AND step >= ?
        GROUP BY step, layer ORDER BY step, layer
        """,
        [run, -1 if since_step is None else since_step],
    ).fetchnumpy()


def expert_rows_at(con, run: str, steps: np.ndarray) -> dict[str, np.ndarray]:
    """The raw (step, layer, expert, routed) rows of a run at some steps (int64 arrays, unsorted)."""
    return con.execute(
        """
        SELECT step::BIGINT AS step, layer::BIGINT AS layer, expert::BIGINT AS expert, routed::BIGINT AS routed
        FROM expert_load WHERE run = ? AND step BETWEEN ? AND ? AND step IN (SELECT unnest(?::INTEGER[]))
        """,
        [run, int(steps.min()), int(steps.max()), [int(s) for s in steps]],
    ).fetchnumpy()


def expert_zero_cells(con, run: str, since_step: int | None = None) -> dict[str, np.ndarray]:
    """(step, layer, expert) of every expert_load row that routed nothing (int64 arrays, unsorted)."""
    return con.execute(
        """
        SELECT step::BIGINT AS step, layer::BIGINT AS layer, expert::BIGINT AS expert
        FROM expert_load WHERE run = ? AND step >= ? AND routed = 0
        """,
        [run, -1 if since_step is None else since_step],
    ).fetchnumpy()


def expert_busiest(con, run: str, layer: int, lo: int, hi: int) -> dict[str, np.ndarray]:
    """Per step of [lo, hi] of one layer: the busiest expert (summed over events; lowest index on ties)."""
    return con.execute(
        """
        WITH s AS (
            SELECT step, expert, sum(routed)::BIGINT AS r FROM expert_load
            WHERE run = ? AND layer = ? AND step BETWEEN ? AND ? GROUP BY step, expert
        )
        SELECT step::BIGINT AS step, arg_max(expert, r * 65536 + (65535 - expert))::BIGINT AS expert
        FROM s GROUP BY step ORDER BY step
        """,
        [run, layer, lo, hi],
    ).fetchnumpy()


def expert_cut_step(con, run: str, through: int, lookback: int) -> int | None:
    """The expert_load step `lookback` logged expert steps before `through`; None when there are fewer.

    Read from the `expert_run_step` rollup (one row per run and step). Where that rollup
    lags (its hook switched off), it knows fewer steps: the cut comes earlier or is None
    (a full scan), which reads more, never less.
    """
    rows = con.execute(
        "SELECT step FROM expert_run_step WHERE run = ? AND step <= ? ORDER BY step DESC LIMIT ?",
        [run, through, lookback + 1],
    ).fetchall()
    if len(rows) <= lookback:
        return None
    return int(rows[-1][0])


def detector_state(con, run: str) -> dict[str, int]:
    """{detector group: last step scanned} kept in the store for a run; {} for a store without the table."""
    import duckdb

    try:
        rows = con.execute("SELECT detector, through FROM detector_state WHERE run = ?", [run]).fetchall()
    except duckdb.CatalogException:
        return {}
    return {d: int(t) for d, t in rows if t is not None}


def anomaly_events(con, run: str | None = None, detector: str | None = None) -> list[dict[str, Any]]:
    """Stored `anomaly` events, oldest first: run, step, t, host, seq and the data fields."""
    where, params = ["kind = 'anomaly'"], []
    if run is not None:
        where.append("run = ?")
        params.append(run)
    if detector is not None:
        where.append("json_extract_string(data, '$.detector') = ?")
        params.append(detector)
    rows = con.execute(
        f"SELECT run, step, t, host, seq, data FROM events WHERE {' AND '.join(where)} ORDER BY t, run, seq",
        params,
    ).fetchall()
    out = []
    for run_id, step, t, host, seq, data in rows:
        d = json.loads(data) if isinstance(data, str) else dict(data or {})
        out.append({"run": run_id, "step": step, "t": t, "host": host, "seq": seq, **d})
    return out


def run_activity(con, runs: list[str] | None = None) -> list[dict[str, Any]]:
    """Per run: whether it wrote run_end, its last step and the time of its newest event.

    The observatory's own events (host 1000) do not count as the run being alive. The last step and
    time are the `runs` table's (`last_step`, `last_event_t`: ingest keeps them from the run's own
    writers, every kind of event), not a scan of `metrics`: at the reference run's shape that scan
    was most of a catch-up's detector reads.
    """
    only = "" if runs is None else "AND {} IN (SELECT unnest($runs::VARCHAR[]))"
    params: dict[str, Any] = {"host": OBSERVATORY_HOST} | ({} if runs is None else {"runs": runs})
    rows = con.execute(
        f"""
        WITH ev AS (
            SELECT run, bool_or(kind = 'run_end') AS ended FROM events WHERE host <> $host {only.format("run")}
            GROUP BY run
        )
        SELECT r.run, coalesce(ev.ended, false), r.last_event_t, r.last_step
        FROM runs r LEFT JOIN ev ON ev.run = r.run
        WHERE r.last_event_t IS NOT NULL {only.format("r.run")}
        ORDER BY r.run
        """,
        params,
    ).fetchall()
    return [{"run": r, "ended": bool(e), "last_t": t, "last_step": s} for r, e, t, s in rows]


def run_ids(con) -> list[str]:
    """Every run the store knows (from any table), sorted."""
    rows = con.execute(
        """
        SELECT run FROM runs UNION SELECT DISTINCT run FROM metrics
        UNION SELECT DISTINCT run FROM events ORDER BY run
        """
    ).fetchall()
    return [r[0] for r in rows]


def silent_runs(con, before_t: float) -> list[str]:
    """Runs without run_end whose newest event (host 1000 aside) is older than `before_t` (the `runs`
    table's `last_event_t`, as `run_activity`)."""
    rows = con.execute(
        """
        WITH open_runs AS (
            SELECT run FROM events WHERE host <> ? GROUP BY run HAVING NOT bool_or(kind = 'run_end')
        )
        SELECT o.run FROM open_runs o JOIN runs r ON r.run = o.run
        WHERE coalesce(r.last_event_t, 0) < ?
        ORDER BY o.run
        """,
        [OBSERVATORY_HOST, before_t],
    ).fetchall()
    return [r[0] for r in rows]
