"""Queries behind the dashboard's charts: downsampled series, markers, evals, forecasts, configs.

Charts that tell the truth at scale: a long series is cut into at most
`max_points` step buckets IN SQL, and each bucket keeps its min, max and last
value (plus the count of NaN/inf values), so a one-step spike survives any zoom
level; when the window holds fewer steps than `max_points`, every step comes back
as it is (full resolution). The page re-queries the visible window on zoom.

Every function takes an open DuckDB connection (the caller owns it: one unit of
work, read-only) and returns polars frames or plain Python objects.
"""

from __future__ import annotations

import json
import math
from typing import Any

import polars as pl

__all__ = [
    "MARKER_KINDS",
    "metric_names",
    "metric_extent",
    "downsample",
    "downsample_runs",
    "markers",
    "evals",
    "forecasts",
    "run_row",
    "runs_extras",
    "run_configs",
    "schema",
]

MARKER_KINDS = ("failure", "anomaly", "checkpoint", "config_diff", "decision", "note", "run_end")


def _frame(con, sql: str, params) -> pl.DataFrame:
    return con.sql(sql, params=params).pl()


def _in(values) -> tuple[str, list[Any]]:
    """`IN (?, ?, ...)` placeholders for a list (literal lists let DuckDB push the filter down)."""
    values = list(values)
    return "(" + ", ".join("?" * len(values)) + ")" if values else "(NULL)", values


def _in_named(values) -> tuple[str, dict[str, Any]]:
    """`IN ($r0, $r1, ...)` named placeholders, for statements that also use named parameters."""
    values = list(values)
    names = [f"r{i}" for i in range(len(values))]
    return "(" + ", ".join("$" + n for n in names) + ")" if values else "(NULL)", dict(
        zip(names, values, strict=True)
    )


def metric_names(con, run: str) -> pl.DataFrame:
    """Every metric a run logged: name, n, first_step, last_step, last_value (from the rollup)."""
    return _frame(
        con,
        "SELECT name, n, first_step, last_step, last_value, last_t FROM metric_series WHERE run = ? ORDER BY name",
        [run],
    )


def metric_extent(con, runs, names) -> tuple[int, int] | None:
    """(first, last) step over the given runs and metric names; None when nothing was logged."""
    rin, rp = _in(runs)
    nin, np_ = _in(names)
    row = con.execute(
        f"SELECT min(first_step), max(last_step) FROM metric_series WHERE run IN {rin} AND name IN {nin}",
        rp + np_,
    ).fetchone()
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def _width(lo: int, hi: int, max_points: int) -> int:
    return max(1, math.ceil((hi - lo + 1) / max(1, max_points)))


def downsample(con, run: str, names, lo: int, hi: int, max_points: int = 1000) -> pl.DataFrame:
    """One run's metrics over steps [lo, hi], at most `max_points` buckets per name.

    Columns: name, step (last step in the bucket), step_lo, min, max (finite values
    only), last (value at the last step, NaN included), mean, n, n_nonfinite.
    Sorted by name, step. Width 1 (full resolution) when the window is short.
    """
    nin, np_ = _in(names)
    width = _width(lo, hi, max_points)
    return _frame(
        con,
        f"""
        SELECT name, max(step) AS step, min(step) AS step_lo,
               min(value) FILTER (WHERE isfinite(value)) AS min,
               max(value) FILTER (WHERE isfinite(value)) AS max,
               arg_max(value, step) AS last,
               avg(value) FILTER (WHERE isfinite(value)) AS mean,
               count(*) AS n,
               count(*) FILTER (WHERE NOT isfinite(value)) AS n_nonfinite
        FROM metrics
        WHERE run = ? AND name IN {nin} AND step BETWEEN ? AND ?
        GROUP BY name, (step - ?) // ?
        ORDER BY name, step
        """,
        [run, *np_, lo, hi, lo, width],
    )


def downsample_runs(con, runs, name: str, lo: int, hi: int, max_points: int = 1000) -> pl.DataFrame:
    """One metric for several runs, downsampled like `downsample`, with tokens and FLOPs per bucket.

    tokens is the run's `data/tokens` at (or before) the bucket's last step; flops
    is tokens x the run's model.flops_per_token (null when either is unknown).
    Columns: run, step, step_lo, min, max, last, n, tokens, flops.
    """
    rin, rp = _in_named(runs)
    width = _width(lo, hi, max_points)
    # one scan over both names; the buckets are those of the plotted metric's steps
    return _frame(
        con,
        f"""
        WITH b AS (
            SELECT run,
                   max(step) FILTER (WHERE name = $name) AS step,
                   min(step) FILTER (WHERE name = $name) AS step_lo,
                   min(value) FILTER (WHERE name = $name AND isfinite(value)) AS min,
                   max(value) FILTER (WHERE name = $name AND isfinite(value)) AS max,
                   arg_max(value, step) FILTER (WHERE name = $name) AS last,
                   count(*) FILTER (WHERE name = $name) AS n,
                   arg_max(value, step) FILTER (WHERE name = 'data/tokens') AS tokens
            FROM metrics
            WHERE run IN {rin} AND name IN ($name, 'data/tokens') AND step BETWEEN $lo AND $hi
            GROUP BY run, (step - $lo) // $width
        )
        SELECT b.*, b.tokens * TRY_CAST(r.model->>'$.flops_per_token' AS DOUBLE) AS flops
        FROM b LEFT JOIN runs r ON r.run = b.run
        WHERE b.n > 0
        ORDER BY b.run, b.step
        """,
        {**rp, "name": name, "lo": lo, "hi": hi, "width": width},
    )


def markers(con, run: str, lo: int | None = None, hi: int | None = None, kinds=MARKER_KINDS) -> pl.DataFrame:
    """Events to mark on a run's curves: kind, step, t, host, data (JSON text), newest last."""
    kin, kp = _in(kinds)
    return _frame(
        con,
        f"""
        SELECT kind, step, t, host, data::VARCHAR AS data FROM events
        WHERE run = ? AND kind IN {kin}
          AND (step IS NULL OR step BETWEEN coalesce(?, step) AND coalesce(?, step))
        ORDER BY coalesce(step, -1), t, host, seq
        """,
        [run, *kp, lo, hi],
    )


def evals(con, run: str) -> pl.DataFrame:
    """Eval results: step, dataset, loss, bpb (null when absent)."""
    return _frame(
        con,
        """
        SELECT step, data->>'$.dataset' AS dataset,
               TRY_CAST(data->>'$.loss' AS DOUBLE) AS loss, TRY_CAST(data->>'$.bpb' AS DOUBLE) AS bpb
        FROM events WHERE run = ? AND kind = 'eval' ORDER BY step, t
        """,
        [run],
    )


def forecasts(con, run: str) -> list[dict[str, Any]]:
    """The run's forecast events (data dicts plus step and t), oldest first."""
    rows = con.execute(
        "SELECT step, t, data FROM events WHERE run = ? AND kind = 'forecast' ORDER BY t, seq", [run]
    ).fetchall()
    return [dict(json.loads(d) if isinstance(d, str) else (d or {}), _step=s, _t=t) for s, t, d in rows]


def run_row(con, run: str) -> dict[str, Any] | None:
    """The `runs` row of one run as a dict (JSON columns parsed), None when unknown."""
    cur = con.execute("SELECT * FROM runs WHERE run = ?", [run])
    row = cur.fetchone()
    if row is None:
        return None
    out = dict(zip([d[0] for d in cur.description], row, strict=True))
    for k in ("ladder", "config", "code", "data", "mesh", "model"):
        if isinstance(out.get(k), str):
            out[k] = json.loads(out[k])
    return out


def runs_extras(con) -> pl.DataFrame:
    """Per run: last loss, last logged step, tokens seen and the newest event time (from the rollup)."""
    return _frame(
        con,
        """
        SELECT run,
               max(last_value) FILTER (WHERE name = 'train/loss') AS last_loss,
               max(last_value) FILTER (WHERE name = 'data/tokens') AS tokens,
               max(last_step) AS last_metric_step, max(last_t) AS last_metric_t
        FROM metric_series GROUP BY run
        """,
        [],
    )


def run_configs(con, runs) -> dict[str, dict]:
    """{run: resolved config dict} for the given runs (missing runs are absent)."""
    rin, rp = _in(runs)
    rows = con.execute(f"SELECT run, config FROM runs WHERE run IN {rin}", rp).fetchall()
    return {r: (json.loads(c) if isinstance(c, str) else (c or {})) for r, c in rows}


def schema(con) -> pl.DataFrame:
    """Tables and views of the store with their columns: table, column, type, kind (table/view)."""
    return _frame(
        con,
        """
        SELECT c.table_name AS "table", c.column_name AS "column", c.data_type AS type,
               CASE WHEN v.view_name IS NULL THEN 'table' ELSE 'view' END AS kind
        FROM duckdb_columns() c
        LEFT JOIN duckdb_views() v ON v.view_name = c.table_name AND v.schema_name = c.schema_name
        WHERE c.schema_name = 'main' AND NOT c.internal
        ORDER BY kind, c.table_name, c.column_index
        """,
        [],
    )
