"""Expert-load queries for the dashboard: heatmaps, hot experts, drop fraction per layer.

They read the ingest-time rollups of `observatory/store/rollups.py`, never a full scan
of `expert_load` (10^8 rows for a 10^5-step run of 16 layers x 64 experts):

- a heatmap over a step window reads the coarsest table whose buckets are still
  no wider than the requested bucket width (raw rows for short windows, then
  `expert_load_r16` / `_r128` / `_r1024`), so it aggregates at most ~8 x 64 rows
  per output bucket;
- per-layer series read `expert_layer_step` (one row per run, layer, step).

Every function takes an open DuckDB connection (callers own its lifetime) and
returns polars frames or plain dicts. A window that is not aligned to the
source resolution is widened to whole source buckets (at most res-1 steps).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import polars as pl

from observatory.store.schema import LAYER_RESOLUTION, RESOLUTIONS

__all__ = [
    "expert_extent",
    "experts_view",
    "bucket_width",
    "by_load",
    "EXPERT_DETECTORS",
    "expert_findings",
    "layer_matrix",
    "heatmap",
    "hot_experts",
    "layer_series",
    "run_drop_series",
    "plain_drop_per_step",
]


def _frame(con, sql: str, params) -> pl.DataFrame:
    return con.sql(sql, params=params).pl()


def expert_extent(con, run: str) -> dict[str, Any] | None:
    """First and last step with expert loads, the layers and the expert count; None if none.

    Read from the 64-step layer rollup and the 1024-step expert rollup (10^4 rows,
    not 10^6): the extent is exact because each rollup row keeps its first/last step.
    """
    row = con.execute(
        f"""
        SELECT min(first_step), max(last_step), list(DISTINCT layer ORDER BY layer),
               (SELECT max(expert) + 1 FROM expert_load_r{RESOLUTIONS[-1]} WHERE run = $run)
        FROM expert_layer_r{LAYER_RESOLUTION} WHERE run = $run
        """,
        {"run": run},
    ).fetchall()[0]
    if row[0] is None:
        return None
    return {
        "first_step": int(row[0]),
        "last_step": int(row[1]),
        "layers": list(row[2]),
        "experts": int(row[3]),
    }


def experts_view(
    con,
    run: str,
    layer: int | None,
    lo: int | None,
    hi: int | None,
    max_buckets: int = 400,
    series_buckets: int = 500,
    max_cells: int = 80_000,
) -> dict[str, Any] | None:
    """The Experts page's data in one call: extent, the layer used, window, heatmap, per-layer data.

    layer None (or a layer the run lacks) is its first layer; lo/hi None are the ends.
    The layer heatmap has at most `max_buckets` columns and `max_cells` cells (384
    experts get ~200 columns: what a browser draws without lag). `overview` is the
    layer x step matrix of every layer (`layer_matrix`, from the same rows as
    `series`); `findings` the hot/dead-expert findings of the window (`expert_findings`).
    """
    ext = expert_extent(con, run)
    if ext is None:
        return None
    layer = layer if layer in ext["layers"] else ext["layers"][0]
    a = ext["first_step"] if lo is None else max(ext["first_step"], int(lo))
    b = ext["last_step"] if hi is None else min(ext["last_step"], int(hi))
    if a > b:
        a, b = ext["first_step"], ext["last_step"]
    buckets = max(1, min(max_buckets, max_cells // max(1, ext["experts"])))
    rows, lo_al, width = _layer_buckets(con, run, a, b, series_buckets)
    return {
        "extent": ext,
        "layer": layer,
        "window": (a, b),
        "heatmap": heatmap(con, run, layer, a, b, buckets),
        "series": rows.drop("i"),
        "overview": layer_matrix(rows, lo_al, width, b, ext["layers"]),
        "findings": expert_findings(con, run, a, b),
    }


def bucket_width(lo: int, hi: int, max_buckets: int) -> int:
    """Steps per bucket so that [lo, hi] fits in at most max_buckets buckets (>= 1)."""
    return max(1, math.ceil((hi - lo + 1) / max(1, max_buckets)))


def _source(width: int) -> tuple[str, str, int]:
    """(table, bucket column, res) of the coarsest source at most 2x wider than `width` steps."""
    table, col, res = "expert_load", "step", 1
    for r in RESOLUTIONS:
        if r <= 2 * width:  # columns up to 2x coarser than asked: 8x fewer raw rows for mid zooms
            table, col, res = f"expert_load_r{r}", "bucket", r
    return table, col, res


def heatmap(
    con, run: str, layer: int, lo: int, hi: int, max_buckets: int = 400, plain: bool = False
) -> dict[str, Any]:
    """Expert x step-bucket matrices for one layer over steps [lo, hi].

    Returns {steps: (B,) first step of each bucket, width, res (source resolution),
    experts: (E,), routed, dropped: (E, B) int sums, share: (E, B) routed / layer
    total, drop_frac: (E, B) dropped / routed}. Empty buckets are NaN.
    plain=True reads the raw `expert_load` rows: the reference the rollups are
    tested and benchmarked against (seconds at 10^8 rows).
    """
    width = bucket_width(lo, hi, max_buckets)
    table, col, res = _source(width) if not plain else ("expert_load", "step", 1)
    width = math.ceil(width / res) * res  # whole source buckets per output bucket
    lo_al = (lo // res) * res
    df = _frame(
        con,
        f"""
        SELECT ({col} * {res} - ?) // ? AS i, expert, sum(routed)::DOUBLE AS routed, sum(dropped)::DOUBLE AS dropped
        FROM {table}
        WHERE run = ? AND layer = ? AND {col} BETWEEN ? AND ?
        GROUP BY i, expert
        """,
        [lo_al, width, run, layer, lo // res, hi // res],
    )
    n_b = (hi - lo_al) // width + 1
    n_e = int(df["expert"].max()) + 1 if df.height else 0
    routed = np.full((n_e, n_b), np.nan)
    dropped = np.full((n_e, n_b), np.nan)
    if df.height:
        e, i = df["expert"].to_numpy(), df["i"].to_numpy()
        routed[e, i] = df["routed"].to_numpy()
        dropped[e, i] = df["dropped"].to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        share = routed / np.nansum(routed, axis=0, keepdims=True)
        drop_frac = dropped / routed
    return {
        "steps": lo_al + np.arange(n_b) * width,
        "width": width,
        "res": res,
        "experts": np.arange(n_e),
        "routed": routed,
        "dropped": dropped,
        "share": share,
        "drop_frac": drop_frac,
    }


def hot_experts(hm: dict[str, Any], top: int = 10) -> pl.DataFrame:
    """The busiest experts of a heatmap window: load share, max/mean ratio, peak share, drop fraction.

    max/mean = the expert's routed total over the mean expert's total (1.0 is
    perfectly balanced); peak is its largest share in any bucket times E.
    """
    routed = np.nan_to_num(hm["routed"])  # (E, B)
    dropped = np.nan_to_num(hm["dropped"])
    if routed.size == 0:
        return pl.DataFrame(
            schema={
                "expert": pl.Int64,
                "share": pl.Float64,
                "max_over_mean": pl.Float64,
                "peak_over_mean": pl.Float64,
                "drop_fraction": pl.Float64,
            }
        )
    tot = routed.sum(axis=1)  # (E,)
    n_e = len(tot)
    mean = tot.mean() if tot.mean() > 0 else 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        peak = np.nanmax(np.nan_to_num(hm["share"]), axis=1) * n_e
        drop = np.where(tot > 0, dropped.sum(axis=1) / tot, np.nan)
    df = pl.DataFrame(
        {
            "expert": hm["experts"].astype(np.int64),
            "share": tot / max(tot.sum(), 1.0),
            "max_over_mean": tot / mean,
            "peak_over_mean": peak,
            "drop_fraction": drop,
        }
    )
    return df.sort("max_over_mean", descending=True).head(top)


def layer_series(con, run: str, lo: int, hi: int, max_buckets: int = 1000) -> pl.DataFrame:
    """Per layer and step bucket: drop fraction, its worst step, and the hot-expert ratio (max/mean).

    Columns: layer, step (bucket's last step), step_lo, drop_fraction (sum dropped /
    sum routed over the bucket), drop_max (worst single step), hot_ratio (mean over
    steps of busiest expert / mean expert), hot_max (worst step). Reads
    `expert_layer_r64` when buckets are at least 32 steps wide, else per-step rows.
    """
    return _layer_buckets(con, run, lo, hi, max_buckets)[0].drop("i")


def _layer_buckets(con, run: str, lo: int, hi: int, max_buckets: int) -> tuple[pl.DataFrame, int, int]:
    """(`layer_series` columns plus bucket index i, first step of bucket 0, bucket width)."""
    width = bucket_width(lo, hi, max_buckets)
    res = LAYER_RESOLUTION
    if 2 * width < res:  # buckets up to 2x wider than asked come from the rollup
        df = _frame(
            con,
            """
            SELECT layer, (step - ?) // ? AS i, max(step) AS step, min(step) AS step_lo,
                   sum(dropped) / nullif(sum(routed), 0) AS drop_fraction,
                   max(dropped / nullif(routed, 0)) AS drop_max,
                   avg(routed_max * n_experts / nullif(routed, 0)) AS hot_ratio,
                   max(routed_max * n_experts / nullif(routed, 0)) AS hot_max
            FROM expert_layer_step
            WHERE run = ? AND step BETWEEN ? AND ?
            GROUP BY layer, i
            ORDER BY layer, step
            """,
            [lo, width, run, lo, hi],
        )
        return df, lo, width
    width = math.ceil(width / res) * res
    lo_al = (lo // res) * res
    df = _frame(
        con,
        f"""
        SELECT layer, (bucket * {res} - ?) // ? AS i, max(last_step) AS step, min(first_step) AS step_lo,
               sum(dropped) / nullif(sum(routed), 0) AS drop_fraction,
               max(drop_max) AS drop_max, sum(hot_sum) / sum(steps) AS hot_ratio, max(hot_max) AS hot_max
        FROM expert_layer_r{res}
        WHERE run = ? AND bucket BETWEEN ? AND ?
        GROUP BY layer, i
        ORDER BY layer, step
        """,
        [lo_al, width, run, lo // res, hi // res],
    )
    return df, lo_al, width


def layer_matrix(df: pl.DataFrame, lo_al: int, width: int, hi: int, layers: list[int]) -> dict[str, Any]:
    """The layer x step-bucket matrices of `_layer_buckets` rows: every layer of the run at once.

    Returns {layers: (L,), steps: (B,) first step of each bucket, width, drop_frac,
    drop_max, hot_max: (L, B)}; a bucket a layer has no rows in is NaN.
    """
    n_b = max(0, (hi - lo_al) // width + 1)
    row = {layer: k for k, layer in enumerate(layers)}
    out: dict[str, Any] = {
        "layers": np.asarray(layers, dtype=np.int64),
        "steps": lo_al + np.arange(n_b) * width,
        "width": width,
    }
    k = df["layer"].replace_strict(row, default=None).to_numpy() if df.height else np.zeros(0, int)
    i = df["i"].to_numpy() if df.height else np.zeros(0, int)
    for name, col in (("drop_frac", "drop_fraction"), ("drop_max", "drop_max"), ("hot_max", "hot_max")):
        m = np.full((len(layers), n_b), np.nan)
        if df.height:
            m[k, i] = df[col].cast(pl.Float64).fill_null(np.nan).to_numpy()
        out[name] = m
    return out


def by_load(hm: dict[str, Any]) -> np.ndarray:
    """Row indices of a `heatmap` with the busiest expert (most routed in the window) first; ties by id."""
    tot = np.nansum(hm["routed"], axis=1) if hm["routed"].size else np.zeros(0)
    return np.lexsort((hm["experts"], -tot)) if tot.size else np.zeros(0, np.int64)


EXPERT_DETECTORS = ("hot_expert", "dead_expert")


def expert_findings(con, run: str, lo: int | None = None, hi: int | None = None) -> pl.DataFrame:
    """The hot- and dead-expert detectors' findings (`anomaly` events) whose window meets [lo, hi].

    These are the detectors' own verdicts (`observatory.detect.detectors.hot_experts`
    / `dead_experts`), not a second definition. Columns: detector, layer, expert,
    first_step, last_step, value, severity, message; sorted by layer, detector, expert.
    """
    return _frame(
        con,
        """
        SELECT data->>'$.detector' AS detector,
               TRY_CAST(data->>'$.layer' AS INTEGER) AS layer,
               TRY_CAST(data->>'$.expert' AS INTEGER) AS expert,
               TRY_CAST(data->'$.window'->>0 AS BIGINT) AS first_step,
               TRY_CAST(data->'$.window'->>1 AS BIGINT) AS last_step,
               TRY_CAST(data->>'$.value' AS DOUBLE) AS value,
               data->>'$.severity' AS severity,
               data->>'$.message' AS message
        FROM events
        WHERE run = ? AND kind = 'anomaly' AND data->>'$.detector' IN (?, ?)
          AND coalesce(TRY_CAST(data->'$.window'->>1 AS BIGINT), step) >= coalesce(?, -1)
          AND coalesce(TRY_CAST(data->'$.window'->>0 AS BIGINT), step) <= coalesce(?, 9223372036854775807)
        ORDER BY layer, detector DESC, expert, first_step
        """,
        [run, *EXPERT_DETECTORS, lo, hi],
    )


def run_drop_series(con, run: str, lo: int, hi: int, max_buckets: int = 1000) -> pl.DataFrame:
    """The run's drop fraction over all layers: step, step_lo, min, max, last, n per bucket."""
    width = bucket_width(lo, hi, max_buckets)
    return _frame(
        con,
        """
        SELECT max(step) AS step, min(step) AS step_lo,
               min(dropped / nullif(routed, 0)) AS min, max(dropped / nullif(routed, 0)) AS max,
               arg_max(dropped / nullif(routed, 0), step) AS last, count(*) AS n
        FROM expert_run_step WHERE run = ? AND step BETWEEN ? AND ?
        GROUP BY (step - ?) // ? ORDER BY step
        """,
        [run, lo, hi, lo, width],
    )


def plain_drop_per_step(con, run: str) -> pl.DataFrame:
    """Reference: the run's drop fraction per step straight from raw `expert_load` (no rollup)."""
    return _frame(
        con,
        """
        SELECT step, sum(dropped) / nullif(sum(routed), 0) AS drop_fraction
        FROM expert_load WHERE run = ? GROUP BY step ORDER BY step
        """,
        [run],
    )
