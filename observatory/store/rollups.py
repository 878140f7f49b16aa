"""Ingest-time rollups that keep the dashboard's queries cheap at 10^8 rows.

A plain scan of `expert_load` (one row per run, step, layer, expert) takes seconds
at the scale of a real MoE run (10^5 steps x 16 layers x 64 experts ~ 10^8 rows),
and so does downsampling tens of metrics over 10^5 steps from `metrics`. So ingest
keeps smaller tables next to them, updated in a write transaction of the ingester's
(a catch-up batch's own; for a live run's small batch one per source table right after
its commit, `observatory.ingest.passes`):

- `expert_layer_step` (run, layer, step): the layer's totals and its busiest
  expert. `expert_layer_r64` buckets it by 64 steps (with the worst step's drop
  fraction and hot-expert ratio kept), `expert_run_step` sums it over layers.
- `expert_load_r16` / `_r128` / `_r1024` (run, layer, bucket, expert): sums over
  buckets of 16, 128 and 1024 steps (bucket = step // res). A heatmap reads the
  coarsest one that is not coarser than its columns: <= ~8 x 64 rows per column.
- `metrics_r8` / `_r64` / `_r512` (run, name, bucket): min, max, last (with its
  step), sum, counts; downsampled charts read these when their buckets are wide.
- `metric_series` (run, name): count, first/last step, last value: metric pickers.
- `rollup_state`: per source table, the rowid up to which rows are rolled up.

The tables are declared with the rest of the schema (`observatory.store.schema.ROLLUP_DDL`).

Incremental maintenance: rows appended since the last call are found by DuckDB
`rowid` (append-only tables number rows in insertion order, and a `rowid >= x`
filter skips old row groups; rows added by the current, uncommitted transaction
carry rowids from ~2^55 up, above `LOCAL_ROWID`). For each run with new rows,
every bucket from its smallest new step on is deleted and recomputed from the
level below, so reprocessing a row is harmless (recompute, never increment) and
late or replayed steps (a rollback to an earlier checkpoint) land in the right
buckets. If the counts do not add up (rows deleted, store rebuilt), everything is
rebuilt. A catch-up batch passes its new rows as arrays: where they are every row past the
watermark, the levels read from the raw rows are made from them (`metric_cells`, `expert_cells`:
the same cells, folded with the store's in the buckets the new rows reach into), not read back, and
the coarser metrics levels from those cells too (`metric_cells.roll_up`). Readers of these tables: `observatory/queries/experts.py` and
`observatory/queries/dashboard.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from observatory.store import expert_cells, metric_cells
from observatory.store.schema import (
    EXPERT_TABLES,
    LAYER_RESOLUTION,
    METRIC_RESOLUTIONS,
    METRIC_TABLES,
    RESOLUTIONS,
)

__all__ = ["SOURCES", "after_ingest", "behind", "rebuild_rollups"]

assert expert_cells.RES == RESOLUTIONS[0], "expert_cells makes the finest expert_load rollup"
FROM_RAW = ("expert_layer_step", f"expert_load_r{RESOLUTIONS[0]}")  # the expert rollups read from expert_load
SOURCES = ("metrics", "expert_load")  # the tables rolled up (the charts' source first: ingest rolls up in this order)
LOCAL_ROWID = 1 << 50  # DuckDB numbers rows of the current transaction's local storage from ~2^55 up


# ------------------------------------------------------------ the statements
# Each takes a WHERE clause over its source ("run = ? AND step >= ?" incrementally,
# "TRUE" on rebuild) and the parameters for it.


def _expert_statements(where_raw: str, where_bucket: callable) -> list[tuple[str, str]]:
    """(table, INSERT ... SELECT) for every expert rollup, finest source first."""
    out = [
        (
            "expert_layer_step",
            f"""INSERT INTO expert_layer_step
                SELECT run, layer, step, sum(routed), sum(dropped), max(routed), count(*)
                FROM expert_load WHERE {where_raw} GROUP BY run, layer, step ORDER BY run, layer, step""",
        ),
        (
            "expert_run_step",
            f"""INSERT INTO expert_run_step
                SELECT run, step, sum(routed), sum(dropped)
                FROM expert_layer_step WHERE {where_raw} GROUP BY run, step ORDER BY run, step""",
        ),
        (
            f"expert_layer_r{LAYER_RESOLUTION}",
            f"""INSERT INTO expert_layer_r{LAYER_RESOLUTION}
                SELECT run, layer, step // {LAYER_RESOLUTION} AS b, min(step), max(step), sum(routed), sum(dropped),
                       max(dropped / nullif(routed, 0)),
                       sum(routed_max::DOUBLE * n_experts / nullif(routed, 0)),
                       max(routed_max::DOUBLE * n_experts / nullif(routed, 0)), count(*)
                FROM expert_layer_step WHERE {where_bucket(LAYER_RESOLUTION, "step")}
                GROUP BY run, layer, b ORDER BY run, layer, b""",
        ),
    ]
    prev = None
    for res in RESOLUTIONS:
        if prev is None:  # finest level from the raw rows
            sql = f"""INSERT INTO expert_load_r{res}
                SELECT run, layer, step // {res} AS b, expert, sum(routed), sum(dropped), count(*)
                FROM expert_load WHERE {where_bucket(res, "step")}
                GROUP BY run, layer, b, expert ORDER BY run, layer, b, expert"""
        else:  # coarser levels from the level below: res // prev fine buckets each
            k = res // prev
            sql = f"""INSERT INTO expert_load_r{res}
                SELECT run, layer, bucket // {k} AS b, expert, sum(routed), sum(dropped), sum(steps)
                FROM expert_load_r{prev} WHERE {where_bucket(res, "bucket", prev)}
                GROUP BY run, layer, b, expert ORDER BY run, layer, b, expert"""
        out.append((f"expert_load_r{res}", sql))
        prev = res
    return out


def _metric_statements(where_bucket: callable) -> list[tuple[str, str]]:
    out = []
    prev = None
    for res in METRIC_RESOLUTIONS:
        if prev is None:
            sql = f"""INSERT INTO metrics_r{res}
                SELECT run, name, step // {res} AS b, min(step), max(step),
                       min(value) FILTER (WHERE isfinite(value)), max(value) FILTER (WHERE isfinite(value)),
                       arg_max(value, step), sum(value) FILTER (WHERE isfinite(value)), count(*),
                       count(*) FILTER (WHERE NOT isfinite(value))
                FROM metrics WHERE step IS NOT NULL AND {where_bucket(res, "step")}
                GROUP BY run, name, b ORDER BY run, name, b"""
        else:
            k = res // prev
            sql = f"""INSERT INTO metrics_r{res}
                SELECT run, name, bucket // {k} AS b, min(first_step), max(last_step), min(min), max(max),
                       arg_max(last, last_step), sum(sum), sum(n), sum(n_nonfinite)
                FROM metrics_r{prev} WHERE {where_bucket(res, "bucket", prev)}
                GROUP BY run, name, b ORDER BY run, name, b"""
        out.append((f"metrics_r{res}", sql))
        prev = res
    return out


def _bucket_where_incremental(res: int, col: str, src_res: int = 1) -> str:
    """Rows of one run from the first `res` bucket holding the smallest new step ($first)."""
    return f"run = $run AND {col} >= ($first // {res}) * {res // src_res}"


# ----------------------------------------------------------------- incremental


def _recompute_experts(con, run: str, first: int, coarser_only: bool = False) -> None:
    """Recompute every expert rollup row of `run` that covers a step >= first (`coarser_only`: those not
    read from the raw rows, which `expert_cells` made)."""
    params = {"run": run, "first": first}
    for table, sql in _expert_statements("run = $run AND step >= $first", _bucket_where_incremental):
        if coarser_only and table in FROM_RAW:
            continue
        res = _res_of(table)
        col = "step" if table in ("expert_layer_step", "expert_run_step") else "bucket"
        lo = "$first" if res == 1 else f"$first // {res}"
        con.execute(f"DELETE FROM {table} WHERE run = $run AND {col} >= {lo}", params)
        con.execute(sql, params)


def _recompute_metrics(con, run: str, first: int) -> None:
    """Recompute every metrics rollup row of `run` that covers a step >= first."""
    params = {"run": run, "first": first}
    for table, sql in _metric_statements(_bucket_where_incremental):
        con.execute(f"DELETE FROM {table} WHERE run = $run AND bucket >= $first // {_res_of(table)}", params)
        con.execute(sql, params)


def _res_of(table: str) -> int:
    tail = table.rsplit("_r", 1)[-1]
    return int(tail) if tail.isdigit() else 1


def _merge_metric_series(con, start_rowid: int) -> None:
    """Fold metric rows with rowid >= start_rowid into `metric_series` (O(new rows))."""
    source = """SELECT run, name, count(*), min(step), max(step), arg_max(value, step), max(t)
                FROM metrics WHERE rowid >= ? GROUP BY run, name"""
    con.execute(metric_cells.SERIES_UPSERT.format(source=source), [start_rowid])


def _new_rows(con, source: str) -> tuple[bool, dict[str, int], int, int, int]:
    """(consistent, {run: smallest new step}, start_rowid, next_rowid, n_rows) for rows added to `source`.

    Reads only row groups at or past the watermark. consistent is False when the
    source lost rows or the new rowids do not account for every added row.
    """
    # fetchall, never fetchone: DuckDB 2 refuses new work on a connection with an unfinished result
    rows = con.execute("SELECT next_rowid, n_rows FROM rollup_state WHERE source = ?", [source]).fetchall()
    start, seen = rows[0] if rows else (0, 0)
    per_run = con.execute(
        f"""
        SELECT run, min(step), count(*),
               max(rowid) FILTER (WHERE rowid < {LOCAL_ROWID}), count(*) FILTER (WHERE rowid >= {LOCAL_ROWID})
        FROM {source} WHERE rowid >= ? GROUP BY run
        """,
        [start],
    ).fetchall()
    n_total = con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0]
    n_new = sum(r[2] for r in per_run)
    committed = [r[3] for r in per_run if r[3] is not None]
    nxt = (max(committed) + 1 if committed else start) + sum(r[4] for r in per_run)
    consistent = n_total - seen == n_new
    firsts = {r[0]: (r[1] if r[1] is not None else 0) for r in per_run}
    return consistent, firsts, start, nxt, n_total


def _save_state(con, source: str, next_rowid: int, n_rows: int) -> None:
    # an UPDATE where the row is there (every batch after the first): INSERT OR REPLACE costs ~3x more
    updated = con.execute("UPDATE rollup_state SET next_rowid = ?, n_rows = ? WHERE source = ?",
                          [next_rowid, n_rows, source]).fetchall()[0][0]  # fmt: skip
    if not updated:
        con.execute("INSERT INTO rollup_state VALUES (?, ?, ?)", [source, next_rowid, n_rows])


def behind(con) -> set[str]:
    """The source tables with rows the rollups have not taken in: ingest commits a batch and then rolls
    it up in a transaction of its own, so a kill in between leaves these for the next call. A row count
    per source (DuckDB keeps it: no scan)."""
    seen = dict(con.execute("SELECT source, n_rows FROM rollup_state").fetchall())
    out = set()
    for source in SOURCES:
        if con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0] != seen.get(source, 0):
            out.add(source)
    return out


def after_ingest(con, touched: Mapping[str, Iterable[str]] | None = None, rows: Mapping[str, Any] | None = None) -> None:
    """Bring the rollups up to date with rows ingest just added (call inside its write transaction).

    `touched` maps a source table ("metrics", "expert_load") to the run ids that
    got rows; a source absent or empty is skipped. Which rows are new is found
    from the store itself, so a missed call is caught up by the next one.
    `rows`: the transaction's new rows as arrays, per source (`metric_cells.MetricRows`,
    `expert_cells.ExpertRows`); where they are every new row, the rollups read from the raw rows
    (`metrics_r8`, `metric_series`, `expert_layer_step`, `expert_load_r16`) are made from them, not the store.
    """
    rows = rows or {}
    touched = touched or {}
    for source, recompute, rebuild in (
        ("expert_load", _recompute_experts, _rebuild_experts),
        ("metrics", _recompute_metrics, _rebuild_metrics),
    ):
        if not touched.get(source):
            continue
        quick = _arrays_are_new_rows(con, source, rows.get(source))
        if quick is not None:  # the finest levels from the arrays, the coarser ones by SQL from those
            if source == "metrics":
                metric_cells.roll_up(con, rows[source], quick[0])  # every level
            else:
                expert_cells.roll_up(con, rows[source], quick[0])
                for run, first in sorted(quick[0].items()):
                    recompute(con, run, first, coarser_only=True)
            _save_state(con, source, *quick[1:])
            continue
        ok, firsts, start, nxt, n = _new_rows(con, source)
        if not ok:
            rebuild(con)
            continue
        for run, first in sorted(firsts.items()):
            recompute(con, run, first)
        if source == "metrics":
            _merge_metric_series(con, start)
        _save_state(con, source, nxt, n)


def _arrays_are_new_rows(con, source: str, rows) -> tuple[dict[str, int], int, int] | None:
    """({run: smallest new step}, next rowid, row count) when the arrays `rows` are every row past the
    watermark, without reading the rows: the source's count (DuckDB keeps it) less the rows rolled up is
    the arrays' count. Every path that adds rows in a transaction either gives them to the arrays or
    makes them unusable, so the rows past the watermark are then this transaction's own (none is left
    committed and not rolled up: `behind` had them rolled up before the batch). None: read them."""
    if rows is None or not rows.usable or not rows.counts:
        return None
    state = con.execute("SELECT next_rowid, n_rows FROM rollup_state WHERE source = ?", [source]).fetchall()
    start, seen = state[0] if state else (0, 0)
    n_total = con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0]
    n_new = sum(rows.counts.values())
    if n_total - seen != n_new:
        return None
    return rows.first_steps(), start + n_new, n_total


# ------------------------------------------------------------------- rebuild


def _state_now(con, source: str) -> tuple[int, int]:
    """(next rowid, row count) of the whole source (a full scan: rebuilds only)."""
    committed_max, n_local, n = con.execute(
        f"""SELECT max(rowid) FILTER (WHERE rowid < {LOCAL_ROWID}),
                   count(*) FILTER (WHERE rowid >= {LOCAL_ROWID}), count(*) FROM {source}"""
    ).fetchall()[0]
    return (committed_max + 1 if committed_max is not None else 0) + n_local, n


def _rebuild_experts(con) -> None:
    for t in EXPERT_TABLES:
        con.execute(f"DELETE FROM {t}")
    # whole-table statements (not per run) so DuckDB aggregates each level in one parallel pass
    for _, sql in _expert_statements("TRUE", lambda *a: "TRUE"):
        con.execute(sql)
    _save_state(con, "expert_load", *_state_now(con, "expert_load"))


def _rebuild_metrics(con) -> None:
    for t in METRIC_TABLES:
        con.execute(f"DELETE FROM {t}")
    for _, sql in _metric_statements(lambda *a: "TRUE"):
        con.execute(sql)
    _merge_metric_series(con, 0)
    _save_state(con, "metrics", *_state_now(con, "metrics"))


def rebuild_rollups(con) -> None:
    """Recompute every rollup from the store's tables (after `rebuild`, or to repair)."""
    _rebuild_experts(con)
    _rebuild_metrics(con)
