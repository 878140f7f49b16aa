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
    "run_scopes",
    "run_ids",
    "silent_runs",
    "register_wanted",
    "unregister_wanted",
    "metric_arrays_many",
    "nonfinite_arrays_many",
    "expert_layer_stats_many",
    "cut_steps",
    "detector_states",
    "stored_last_steps",
    "anomaly_events_many",
]


def distinct(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` (sorted distinct values) without its first call's import of numpy.ma (numpy 2.4
    asks `np.ma.is_masked`: ~30 ms of an `observatory ingest` command's start)."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


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
        WHERE run = ? AND host <> ? AND step IS NOT NULL AND step >= ? AND NOT replaced {only}
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
        WHERE run = $run AND host <> $host AND step IS NOT NULL AND step >= $since AND NOT replaced
          AND name IN (SELECT unnest($names::VARCHAR[]))
        """,
        {
            "run": run,
            "host": OBSERVATORY_HOST,
            "since": -1 if since_step is None else since_step,
            "names": names,
        },
    ).fetchnumpy()
    c, step = np.asarray(got["k"], np.int64), np.asarray(got["step"], np.int64)
    return SeriesRows(np.zeros(len(c), np.int64), c, step, got["value"], got["null"], names, 1).of(0)


def nonfinite_arrays(con, run: str, since_step: int | None = None) -> dict[str, np.ndarray] | None:
    """`nonfinite_values` as numpy arrays (step, name, value), or None when the run has none."""
    got = con.execute(
        NONFINITE_SQL, [run, OBSERVATORY_HOST, -1 if since_step is None else since_step]
    ).fetchnumpy()
    return {k: np.asarray(v) for k, v in got.items()} if len(got["step"]) else None


NONFINITE_SQL = """
        SELECT step, name, value FROM metrics
        WHERE run = ? AND host <> ? AND step IS NOT NULL AND step >= ? AND NOT replaced
          AND (isnan(value) OR isinf(value))
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


def expert_load_series(
    con, run: str, since_step: int | None = None, layers: list[int] | None = None
) -> pl.DataFrame:
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
        params=[run, -1 if since_step is None else since_step]
        + ([list(layers)] if layers is not None else []),
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


def run_scopes(con, runs: list[str]) -> list[tuple[str, str | None, dict]]:
    """(run, project, config) of these runs: what picks a run's own detector thresholds (the rules file's
    scopes, its config's `alerts.thresholds`). One query for them all; runs with no config come back too."""
    if not runs:
        return []
    rows = con.execute(
        "SELECT run, project, config->'alerts' FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [runs]
    ).fetchall()
    out = []
    for run, project, alerts in rows:
        cfg = json.loads(alerts) if isinstance(alerts, str) else alerts
        out.append((run, project, {"alerts": cfg} if isinstance(cfg, dict) else {}))
    return out


def run_activity(con, runs: list[str] | None = None) -> list[dict[str, Any]]:
    """Per run: whether it wrote run_end, its last step, the time of its newest event, its newest phase
    (`phase`, `phase_t`, `budget_s`: what a silence is allowed while a process compiles, evaluates or saves;
    a phase without `budget_s` has none, not an earlier phase's), its newest restart `attempt`, and
    `progress_t`, the time of its newest metric (its last step's). The one definition of a run's progress
    and phase for the detectors (`stalled_run`) and the alert rules (`stalled`).

    The observatory's own events (host 1000) do not count as the run being alive. The last step and
    time are the `runs` table's (`last_step`, `last_event_t`: ingest keeps them from the run's own
    writers, every kind of event), not a scan of `metrics`: at the reference run's shape that scan
    was most of a catch-up's detector reads; `progress_t` is `metric_series`'s.
    """
    only = "" if runs is None else "AND {} IN (SELECT unnest($runs::VARCHAR[]))"
    params: dict[str, Any] = {"host": OBSERVATORY_HOST} | ({} if runs is None else {"runs": runs})
    rows = con.execute(
        f"""
        WITH ev AS (
            SELECT run, bool_or(kind = 'run_end') AS ended,
                   arg_max_null(data->>'phase', t) FILTER (WHERE kind = 'phase') AS phase,
                   max(t) FILTER (WHERE kind = 'phase') AS phase_t,
                   arg_max_null(TRY_CAST(data->>'budget_s' AS DOUBLE), t) FILTER (WHERE kind = 'phase') AS budget_s,
                   max(TRY_CAST(data->>'attempt' AS BIGINT)) FILTER (WHERE kind = 'phase') AS attempt
            FROM events WHERE host <> $host {only.format("run")}
            GROUP BY run
        ), m AS (
            SELECT run, max(last_t) AS progress_t FROM metric_series WHERE true {only.format("run")} GROUP BY run
        )
        SELECT r.run, coalesce(ev.ended, false), r.last_event_t, r.last_step, ev.phase, ev.phase_t, ev.budget_s,
               ev.attempt, m.progress_t
        FROM runs r LEFT JOIN ev ON ev.run = r.run LEFT JOIN m ON m.run = r.run
        WHERE r.last_event_t IS NOT NULL {only.format("r.run")}
        ORDER BY r.run
        """,
        params,
    ).fetchall()
    keys = ("run", "ended", "last_t", "last_step", "phase", "phase_t", "budget_s", "attempt", "progress_t")
    return [dict(zip(keys, (r, bool(e), *rest), strict=True)) for r, e, *rest in rows]


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


# ------------------------------------------------------------- many runs at once
# The detectors' reads of one ingest batch, one query per kind for every run it touched (a lab's
# catch-up batch holds thousands of small runs: a query per run and kind scanned the tables per run).
# Each takes the runs as a registered table `_scan_w` (run, k: its place in the caller's list, since:
# the first step to read or -1, fresh: the run has no row before the batch's first rowid) and returns
# one result per k.


def register_wanted(con, runs: list[str], since: list[int | None], fresh: list[bool]) -> None:
    """Register the runs a set-wise read is for as `_scan_w` (see above); `unregister_wanted` after."""
    import pyarrow as pa

    from observatory.store.arrow import column

    con.register(
        "_scan_w",
        pa.table(
            {
                "run": column(runs, pa.string()),
                "k": column(list(range(len(runs))), pa.int64()),
                "since": column([-1 if s is None else int(s) for s in since], pa.int64()),
                "fresh": column(list(fresh), pa.bool_()),
            }
        ),
    )


def unregister_wanted(con) -> None:
    con.unregister("_scan_w")


def _parts(
    fresh_rowid: int | None, since: list[int | None], fresh: list[bool], rowid: str = "m.rowid"
) -> list[str]:
    """The WHERE parts of a set-wise read: the fresh runs' rows from the batch's first rowid on (DuckDB skips
    the row groups before it), the other runs' from their `since` on (the least of them as a literal: the
    zonemaps of a big run's steps skip what is before)."""
    out = []
    if fresh_rowid is not None and any(fresh):
        out.append(f"w.fresh AND {rowid} >= {int(fresh_rowid)}")
    rest = [s for s, f in zip(since, fresh, strict=True) if not (f and fresh_rowid is not None)]
    if rest:
        lo = min(-1 if s is None else s for s in rest)
        out.append(("NOT w.fresh AND " if fresh_rowid is not None and any(fresh) else "") + f"m.step >= {lo}")
    return out


def _split(k: np.ndarray, n: int) -> list[slice]:
    """For rows sorted by k: the slice of each k in 0..n-1."""
    bounds = np.searchsorted(k, np.arange(n + 1))
    return [slice(int(bounds[i]), int(bounds[i + 1])) for i in range(n)]


def metric_arrays_many(
    con, since: list[int | None], fresh: list[bool], fresh_rowid: int | None, names: list[str]
) -> SeriesRows:
    """`metric_arrays` of every run in `_scan_w`, one query per part (`_parts`): their rows, run by run on
    demand (`SeriesRows.of`)."""
    got: dict[str, list] = {c: [] for c in ("k", "c", "step", "value", "null")}
    for part in _parts(fresh_rowid, since, fresh):
        r = con.execute(
            f"""
            SELECT w.k, list_position($names, m.name)::INTEGER AS c, m.step, coalesce(m.value, 0) AS value,
                   m.value IS NULL AS null
            FROM metrics m JOIN _scan_w w ON m.run = w.run
            WHERE {part} AND m.host <> $host AND m.step IS NOT NULL AND m.step >= w.since AND NOT m.replaced
              AND m.name IN (SELECT unnest($names::VARCHAR[]))
            """,
            {"host": OBSERVATORY_HOST, "names": list(names)},
        ).fetchnumpy()
        for c in got:
            got[c].append(np.asarray(r[c]))
    k, c, step, value, null = (np.concatenate(got[x]) if got[x] else np.empty(0) for x in got)
    return SeriesRows(k, c, step, value, null, list(names), len(since))


class SeriesRows:
    """Metric rows of n runs (run k in 0..n-1, name code c: its 1-based place in `names`), sorted by (k, c,
    step) and each (k, c, step) once: several rows averaged, NULLs not counted (a (name, step) of NULLs only
    is not a value), as `metric_arrays` gives them. A run's arrays are made when asked (`of`); the
    detectors' screen (`observatory.detect.screen`) reads every run's values of a name at once (`values`),
    so a scan of 10^4 small runs does not split them into 10^4 dicts that it would join again."""

    def __init__(self, k, c, step, value, null, names: list[str], n: int):
        k, c, step = (np.asarray(a, np.int64) for a in (k, c, step))
        value, keep = np.asarray(value, np.float64), ~np.asarray(null, bool)
        order = np.lexsort((step, c, k))
        k, c, step, value, keep = k[order], c[order], step[order], value[order], keep[order]
        first = np.ones(len(k), bool)
        first[1:] = (k[1:] != k[:-1]) | (c[1:] != c[:-1]) | (step[1:] != step[:-1])
        if not (first.all() and keep.all()):  # several rows at a (run, name, step), or a NULL: their average
            starts = np.flatnonzero(first)
            cnt = np.add.reduceat(keep.astype(np.int64), starts) if len(starts) else np.empty(0, np.int64)
            total = np.add.reduceat(np.where(keep, value, 0.0), starts) if len(starts) else np.empty(0)
            k, c, step, keep = k[starts], c[starts], step[starts], cnt > 0
            value = total / np.maximum(cnt, 1)
        self.k, self.c, self.step, self.value, self.keep = k, c, step, value, keep
        self.names, self.n = list(names), n
        self.bounds = np.searchsorted(k, np.arange(n + 1))

    def of(self, i: int) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """Run i's (every step it has a row at, sorted; {name: (steps, values) where it has a value})."""
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        c, step, value, keep = self.c[lo:hi], self.step[lo:hi], self.value[lo:hi], self.keep[lo:hi]
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if len(c):
            cuts = np.flatnonzero(c[1:] != c[:-1]) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(c)], strict=True):
                m = keep[a:b]
                if m.any():
                    out[self.names[int(c[a]) - 1]] = step[a:b][m], value[a:b][m]
        return distinct(step), out

    def last_step(self, i: int) -> int | None:
        """The last step run i has a row at (`of(i)[0][-1]`), or None."""
        lo, hi = int(self.bounds[i]), int(self.bounds[i + 1])
        return int(self.step[lo:hi].max()) if hi > lo else None

    def with_values(self, name: str) -> np.ndarray:
        """(n,) bool: which runs have a value of `name` (`name in of(i)[1]`)."""
        out = np.zeros(self.n, bool)
        if name in self.names:
            out[self.k[(self.c == self.names.index(name) + 1) & self.keep]] = True
        return out

    def longest(self) -> np.ndarray:
        """(n,) each run's longest series: the most values it has of one name."""
        out = np.zeros(self.n, np.int64)
        k, c = self.k[self.keep], self.c[self.keep]
        if len(k):
            heads = np.flatnonzero(np.concatenate(([True], (k[1:] != k[:-1]) | (c[1:] != c[:-1]))))
            np.maximum.at(out, k[heads], np.diff(np.append(heads, len(k))))
        return out

    def values(self, name: str, runs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The values of `name` of the runs where `runs` (n,) is True, run after run in k order, each run's
        in step order (`of(i)[1][name][1]` laid end to end): (values, where each run's begin, its k)."""
        if name not in self.names:
            return np.empty(0), np.empty(0, np.int64), np.empty(0, np.int64)
        sel = (self.c == self.names.index(name) + 1) & self.keep & runs[self.k]
        k, x = self.k[sel], self.value[sel]
        heads = np.flatnonzero(np.concatenate(([True], k[1:] != k[:-1]))) if len(k) else np.empty(0, np.int64)
        return x, heads, k[heads]


def nonfinite_arrays_many(
    con, since: list[int | None], fresh: list[bool], fresh_rowid: int | None
) -> list[dict[str, np.ndarray] | None]:
    """`nonfinite_arrays` of every run in `_scan_w`."""
    parts = []
    for part in _parts(fresh_rowid, since, fresh):
        parts.append(
            con.execute(
                f"""SELECT w.k, m.step, m.name, m.value FROM metrics m JOIN _scan_w w ON m.run = w.run
                WHERE {part} AND m.host <> ? AND m.step IS NOT NULL AND m.step >= w.since AND NOT m.replaced
                  AND (isnan(m.value) OR isinf(m.value))
                ORDER BY w.k, m.step, m.name""",
                [OBSERVATORY_HOST],
            ).fetchnumpy()
        )
    out: list[dict[str, np.ndarray] | None] = [None] * len(since)
    for got in parts:
        if not len(got["k"]):
            continue
        k = np.asarray(got["k"], np.int64)
        for i, s in enumerate(_split(k, len(since))):
            if s.stop > s.start:
                out[i] = {c: np.asarray(got[c])[s] for c in ("step", "name", "value")}
    return out


def expert_layer_stats_many(
    con, since: list[int | None], fresh: list[bool], fresh_rowid: int | None
) -> list[dict[str, np.ndarray]]:
    """`expert_layer_stats` of every run in `_scan_w`."""
    cols = ("step", "layer", "rows", "max_expert", "routed", "routed_max", "dropped", "zeros")
    got: dict[str, list] = {c: [] for c in ("k", *cols)}
    for part in _parts(fresh_rowid, since, fresh):
        r = con.execute(
            f"""
            SELECT w.k, m.step::BIGINT AS step, m.layer::BIGINT AS layer, count(*)::BIGINT AS rows,
                   max(m.expert)::BIGINT AS max_expert, sum(m.routed)::BIGINT AS routed,
                   max(m.routed)::BIGINT AS routed_max, sum(m.dropped)::BIGINT AS dropped,
                   count(*) FILTER (WHERE m.routed = 0)::BIGINT AS zeros
            FROM expert_load m JOIN _scan_w w ON m.run = w.run
            WHERE {part} AND m.step >= w.since
            GROUP BY w.k, m.step, m.layer
            """
        ).fetchnumpy()
        for c in got:
            got[c].append(np.asarray(r[c], np.int64))
    arrs = {c: (np.concatenate(v) if v else np.empty(0, np.int64)) for c, v in got.items()}
    order = np.lexsort((arrs["layer"], arrs["step"], arrs["k"]))
    arrs = {c: v[order] for c, v in arrs.items()}
    return [{c: arrs[c][s] for c in cols} for s in _split(arrs["k"], len(since))]


def cut_steps(
    con, runs: list[str], through: list[int], lookback: int, table: str = "metrics"
) -> list[int | None]:
    """`cut_step` (or `expert_cut_step` with table="expert_run_step") of several runs in one query."""
    import pyarrow as pa

    from observatory.store.arrow import column

    if not runs:
        return []
    back = lookback * 64 if table == "metrics" else None
    con.register(
        "_cut_w",
        pa.table(
            {
                "run": column(runs, pa.string()),
                "k": column(list(range(len(runs))), pa.int64()),
                "through": column(list(through), pa.int64()),
            }
        ),
    )
    try:
        lo = (
            f"AND m.step >= w.through - {back} AND m.step >= {min(through) - back}"
            if back is not None
            else ""
        )
        host = f"AND m.host <> {OBSERVATORY_HOST}" if table == "metrics" else ""
        rows = con.execute(
            f"""
            SELECT k, step FROM (
                SELECT DISTINCT w.k, m.step FROM {table} m JOIN _cut_w w ON m.run = w.run
                WHERE m.step <= w.through {lo} {host}
            ) QUALIFY row_number() OVER (PARTITION BY k ORDER BY step DESC) = {lookback + 1}
            """
        ).fetchall()
    finally:
        con.unregister("_cut_w")
    out: list[int | None] = [None] * len(runs)
    for k, step in rows:
        out[k] = int(step)
    return out


def stored_last_steps(con, runs: list[str]) -> dict[str, int]:
    """The last step of each run the store has (`runs.last_step`: every kind, its own writers'), one query."""
    rows = con.execute(
        "SELECT run, last_step FROM runs WHERE last_step IS NOT NULL AND run IN (SELECT unnest($r))",
        {"r": runs},
    ).fetchall()
    return {run: int(step) for run, step in rows}


def detector_states(con, runs: list[str]) -> dict[str, dict[str, int]]:
    """`detector_state` of several runs, one query."""
    import duckdb

    try:
        rows = con.execute(
            "SELECT run, detector, through FROM detector_state WHERE run IN (SELECT unnest($r))", {"r": runs}
        ).fetchall()
    except duckdb.CatalogException:
        return {}
    out: dict[str, dict[str, int]] = {}
    for run, d, t in rows:
        if t is not None:
            out.setdefault(run, {})[d] = int(t)
    return out


def anomaly_events_many(con, runs: list[str]) -> dict[str, list[dict[str, Any]]]:
    """`anomaly_events` of several runs, one query: {run: its events, oldest first}."""
    rows = con.execute(
        "SELECT run, step, t, host, seq, data FROM events WHERE kind = 'anomaly' AND run IN (SELECT unnest($r)) "
        "ORDER BY t, run, seq",
        {"r": runs},
    ).fetchall()
    out: dict[str, list[dict[str, Any]]] = {}
    for run_id, step, t, host, seq, data in rows:
        d = json.loads(data) if isinstance(data, str) else dict(data or {})
        out.setdefault(run_id, []).append(
            {"run": run_id, "step": step, "t": t, "host": host, "seq": seq, **d}
        )
    return out
