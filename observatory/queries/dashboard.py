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
import re
from typing import Any

import polars as pl

from observatory.queries import experts
from observatory.queries.core import LAST_LOSS_SQL, loss_names
from observatory.store.schema import METRIC_RESOLUTIONS

__all__ = [
    "MARKER_KINDS",
    "metric_extent",
    "downsample",
    "downsample_runs",
    "series_view",
    "live_view",
    "layer_bands",
    "runs_view",
    "metric_names_for",
    "markers",
    "evals",
    "forecasts",
    "runs_extras",
    "run_configs",
    "schema",
    "SQL_EXAMPLES",
]

MARKER_KINDS = ("failure", "anomaly", "alert", "checkpoint", "config_diff", "decision", "note", "run_end")


def _frame(con, sql: str, params) -> pl.DataFrame:
    return con.sql(sql, params=params).pl()


def _in(values) -> tuple[str, list[Any]]:
    """`IN (?, ?, ...)` placeholders for a list (literal lists let DuckDB push the filter down)."""
    values = list(values)
    return "(" + ", ".join("?" * len(values)) + ")" if values else "(NULL)", values


def metric_extent(con, runs, names) -> tuple[int, int] | None:
    """(first, last) step over the given runs and metric names; None when nothing was logged."""
    rin, rp = _in(runs)
    nin, np_ = _in(names)
    row = con.execute(
        f"SELECT min(first_step), max(last_step) FROM metric_series WHERE run IN {rin} AND name IN {nin}",
        rp + np_,
    ).fetchall()[0]
    return None if row is None or row[0] is None else (int(row[0]), int(row[1]))


def _width(lo: int, hi: int, max_points: int) -> int:
    return max(1, math.ceil((hi - lo + 1) / max(1, max_points)))


def _source(width: int) -> int:
    """Resolution of the coarsest metrics rollup no wider than `width` steps (1 = raw rows)."""
    return max([1, *(r for r in METRIC_RESOLUTIONS if r <= width)])


def _bucketed(con, runs, names, lo: int, hi: int, max_points: int) -> pl.DataFrame:
    """Per (run, name, bucket i): step, step_lo, min, max, last, mean, n, n_nonfinite.

    Reads `metrics` when buckets are narrower than the finest rollup, else the
    coarsest `metrics_r<res>` rollup whose buckets fit (so 10^5 steps x 30 names
    cost ~10^4 rollup rows, not 3x10^6 metric rows). Rollup buckets that straddle
    lo or hi are counted whole (at most res - 1 steps past the window).
    """
    rin, rp = _in(runs)
    nin, np_ = _in(names)
    width = _width(lo, hi, max_points)
    res = _source(width)
    if res == 1:
        return _frame(
            con,
            f"""
            SELECT run, name, (step - ?) // ? AS i, max(step) AS step, min(step) AS step_lo,
                   min(value) FILTER (WHERE isfinite(value)) AS min,
                   max(value) FILTER (WHERE isfinite(value)) AS max,
                   arg_max(value, step) AS last,
                   avg(value) FILTER (WHERE isfinite(value)) AS mean,
                   count(*) AS n,
                   count(*) FILTER (WHERE NOT isfinite(value)) AS n_nonfinite
            FROM metrics
            WHERE run IN {rin} AND name IN {nin} AND step BETWEEN ? AND ? AND NOT replaced
            GROUP BY run, name, i
            ORDER BY run, name, i
            """,
            [lo, width, *rp, *np_, lo, hi],
        )
    width = math.ceil(width / res) * res  # whole rollup buckets per output bucket
    lo_al = (lo // res) * res
    return _frame(
        con,
        f"""
        SELECT run, name, (bucket * {res} - ?) // ? AS i, max(last_step) AS step, min(first_step) AS step_lo,
               min(min) AS min, max(max) AS max, arg_max(last, last_step) AS last,
               sum(sum) / nullif(sum(n - n_nonfinite), 0) AS mean,
               sum(n) AS n, sum(n_nonfinite) AS n_nonfinite
        FROM metrics_r{res}
        WHERE run IN {rin} AND name IN {nin} AND bucket BETWEEN ? AND ?
        GROUP BY run, name, i
        ORDER BY run, name, i
        """,
        [lo_al, width, *rp, *np_, lo // res, hi // res],
    )


def downsample(con, run: str, names, lo: int, hi: int, max_points: int = 1000) -> pl.DataFrame:
    """One run's metrics over steps [lo, hi], at most `max_points` buckets per name.

    Columns: name, step (last step in the bucket), step_lo, min, max (finite values
    only), last (value at the last step, NaN included), mean, n, n_nonfinite.
    Sorted by name, step. Width 1 (full resolution) when the window is short.
    """
    return _bucketed(con, [run], names, lo, hi, max_points).drop("run", "i")


def _window(extent: tuple[int, int] | None, lo: int | None, hi: int | None) -> tuple[int, int] | None:
    """[lo, hi] clamped to the extent; None ends mean the extent's ends; a window outside it is all of it."""
    if extent is None:
        return None
    a = extent[0] if lo is None else max(extent[0], int(lo))
    b = extent[1] if hi is None else min(extent[1], int(hi))
    return (a, b) if a <= b else extent


def series_view(
    con, run: str, names, lo: int | None, hi: int | None, max_points: int = 1000
) -> dict[str, Any]:
    """A chart group's data in one call: {extent, window, data} for `downsample` over the window.

    lo/hi None mean the first/last logged step of these names, so a page can ask for
    "everything" or "up to the newest step" without a round trip for the extent.
    """
    extent = metric_extent(con, [run], names)
    window = _window(extent, lo, hi)
    data = downsample(con, run, names, *window, max_points) if window else None
    return {"extent": extent, "window": window, "data": data}


def live_view(
    con,
    run: str,
    main: list[str],
    small: list[str],
    lo: int | None,
    hi: int | None,
    main_points: int = 1000,
    small_points: int = 300,
    families=(),
    drops: bool = False,
) -> dict[str, Any]:
    """The Live panel's series in one call: `main` names at `main_points` buckets (the big loss chart),
    `small` names at `small_points` (the half-width health charts), over one window of the union's extent.

    families: per-layer metric patterns (`router/layer_*/lb_loss`); `bands` is then
    `layer_bands` of them over the same window at `small_points` (None without families).
    drops: `drop` is then the run's drop fraction from the expert-load rollup
    (`experts.run_drop_series`) over the same window: in the same call, because its
    window is only known here and a second call would cost every viewer a round trip.
    """
    extent = metric_extent(con, [run], [*main, *small])
    window = _window(extent, lo, hi)
    if window is None:
        return {"extent": None, "window": None, "data": None, "bands": None, "drop": None}
    data = pl.concat(
        [
            downsample(con, run, main, *window, main_points),
            downsample(con, run, small, *window, small_points),
        ],
        how="vertical_relaxed",
    )
    bands = layer_bands(con, run, families, *window, small_points) if families else None
    drop = experts.run_drop_series(con, run, *window, small_points) if drops else None
    return {"extent": extent, "window": window, "data": data, "bands": bands, "drop": drop}


_LAYER = re.compile(r"/layer_(\d+)/")


def layer_bands(con, run: str, families, lo: int, hi: int, max_points: int = 300) -> dict[str, Any]:
    """Per-layer metrics summed up across layers: a band per step bucket and the worst layer.

    families: patterns with `*` for the layer index, e.g. `moe/layer_*/drop_fraction`
    (names as the trainer logs them). Returns {"data": frame of family, step,
    step_lo, min, max (over layers of the bucket's min / max), mean (of the layers'
    bucket means), worst_layer (the layer holding `max`), n_layers; "worst":
    {family: {"layer", "mean"}}: the layer with the highest mean over the window}.
    Reads the same rollups as `downsample` (one statement for every family's layers).
    """
    families = list(families)
    names: dict[str, str] = {}
    for fam in families:
        for (name,) in con.execute(
            "SELECT name FROM metric_series WHERE run = ? AND name LIKE ?", [run, fam.replace("*", "%")]
        ).fetchall():
            m = _LAYER.search(name)
            if m and name == fam.replace("*", m.group(1), 1):
                names[name] = fam
    schema = {
        "family": pl.String,
        "step": pl.Int64,
        "step_lo": pl.Int64,
        "min": pl.Float64,
        "max": pl.Float64,
        "mean": pl.Float64,
        "worst_layer": pl.Int64,
        "n_layers": pl.UInt32,
    }
    if not names:
        return {"data": pl.DataFrame(schema=schema), "worst": {}}
    df = _bucketed(con, [run], list(names), lo, hi, max_points).with_columns(
        family=pl.col("name").replace_strict(names),
        layer=pl.col("name").str.extract(r"/layer_(\d+)/").cast(pl.Int64),
    )
    data = (
        df.group_by("family", "i")
        .agg(
            pl.col("step").max(),
            pl.col("step_lo").min(),
            pl.col("min").min(),
            pl.col("max").max(),
            pl.col("mean").mean(),
            pl.col("layer").sort_by(pl.col("max").fill_null(-math.inf)).last().alias("worst_layer"),
            pl.col("layer").n_unique().alias("n_layers"),
        )
        .sort("family", "step")
        .drop("i")
        .cast(schema)
    )
    per_layer = df.group_by("family", "layer").agg(pl.col("mean").mean()).drop_nulls("mean")
    worst = {
        f: {"layer": int(g.row(0, named=True)["layer"]), "mean": float(g.row(0, named=True)["mean"])}
        for (f,), g in per_layer.sort("mean", descending=True).group_by("family", maintain_order=True)
    }
    return {"data": data, "worst": worst}


def runs_view(con, runs, name: str, lo: int | None, hi: int | None, max_points: int = 1000) -> dict[str, Any]:
    """Like `series_view` for one metric of several runs (`downsample_runs`)."""
    extent = metric_extent(con, runs, [name])
    window = _window(extent, lo, hi)
    data = downsample_runs(con, runs, name, *window, max_points) if window else None
    return {"extent": extent, "window": window, "data": data}


def metric_names_for(con, runs) -> list[str]:
    """Every metric name logged by any of `runs`, sorted."""
    rin, rp = _in(runs)
    return [
        r[0]
        for r in con.execute(
            f"SELECT DISTINCT name FROM metric_series WHERE run IN {rin} ORDER BY name", rp
        ).fetchall()
    ]


def downsample_runs(con, runs, name: str, lo: int, hi: int, max_points: int = 1000) -> pl.DataFrame:
    """One metric for several runs, downsampled like `downsample`, with tokens and FLOPs per bucket.

    tokens is the run's last `data/tokens` in the same bucket; flops is tokens x
    the run's model.flops_per_token from run_start (null when either is unknown).
    Columns: run, step, step_lo, min, max, last, n, n_nonfinite, tokens, flops.
    """
    runs = list(runs)
    both = _bucketed(con, runs, [name, "data/tokens"], lo, hi, max_points)
    rin, rp = _in(runs)
    fpt = _frame(
        con,
        f"SELECT run, TRY_CAST(model->>'$.flops_per_token' AS DOUBLE) AS fpt FROM runs WHERE run IN {rin}",
        rp,
    )
    tok = both.filter(pl.col("name") == "data/tokens").select("run", "i", pl.col("last").alias("tokens"))
    out = (
        both.filter(pl.col("name") == name)
        .join(tok, on=["run", "i"], how="left")
        .join(fpt, on="run", how="left")
        .with_columns(flops=pl.col("tokens") * pl.col("fpt"))
    )
    return out.select(
        "run", "step", "step_lo", "min", "max", "last", "n", "n_nonfinite", "tokens", "flops"
    ).sort("run", "step")


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


def runs_extras(con, runs: list[str]) -> pl.DataFrame:
    """Per run of `runs` (a page of them, never every run): planned steps (config `steps` or `train.steps`),
    last loss (`core.loss_name`'s rule), tokens seen, last metric step/time, values redacted at ingest."""
    return _frame(
        con,
        f"""
        WITH m AS (
            SELECT run,
                   {LAST_LOSS_SQL} AS last_loss,
                   max(last_value) FILTER (WHERE name = 'data/tokens') AS tokens,
                   max(last_step) AS last_metric_step, max(last_t) AS last_metric_t
            FROM metric_series WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run
        )
        SELECT r.run,
               coalesce(TRY_CAST(r.config->>'$.steps' AS BIGINT), TRY_CAST(r.config->>'$.train.steps' AS BIGINT),
                        TRY_CAST(r.config->>'$.trainer.steps' AS BIGINT)) AS planned_steps,
               m.last_loss, m.tokens, m.last_metric_step, m.last_metric_t, r.redactions
        FROM runs r LEFT JOIN m USING (run) WHERE r.run IN (SELECT unnest($runs::VARCHAR[]))
        """,
        {"runs": list(runs), "loss_names": loss_names()},
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


# Example queries for the SQL console (read-only; run through queries.user_sql.run_user_sql).
SQL_EXAMPLES = {
    "Runs and their status": "SELECT run, status, last_step, ladder_name, ladder_rung, tags\nFROM runs\nORDER BY start_time DESC",
    "Last value of every metric of a run": "SELECT name, step, value\nFROM latest_metrics\nWHERE run = (SELECT run FROM runs ORDER BY start_time DESC LIMIT 1)\nORDER BY name",
    "Loss every 100 steps (min, max, last)": "SELECT step // 100 * 100 AS step, min(value) AS min, max(value) AS max,\n       arg_max(value, step) AS last\nFROM metrics\nWHERE name = 'train/loss' AND NOT replaced  -- a resumed attempt's step: its newest value\n  AND run = (SELECT run FROM runs ORDER BY start_time DESC LIMIT 1)\nGROUP BY ALL ORDER BY step",
    "Drop fraction per layer (rollup)": "SELECT run, layer, sum(dropped) / sum(routed) AS drop_fraction\nFROM expert_layer_step\nGROUP BY run, layer ORDER BY run, layer",
    "Failures and anomalies": "SELECT run, kind, step, data->>'$.message' AS message\nFROM events\nWHERE kind IN ('failure', 'anomaly')\nORDER BY t DESC",
    "Rejected lines": "SELECT file, line, field, reason\nFROM rejected_events\nORDER BY ingested_at DESC\nLIMIT 100",
}
