"""Ingest-time rollups that keep the dashboard's queries cheap at 10^8 rows and at 10^5 runs.

A plain scan of `expert_load` (one row per run, step, layer, expert) takes seconds at the
scale of a real MoE run (10^5 steps x 16 layers x 64 experts ~ 10^8 rows), and so does
downsampling tens of metrics over 10^5 steps from `metrics`. So ingest keeps smaller
tables next to them, updated inside each batch's write transaction:

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

Incremental and set-wise: one statement per table per batch, over every run at once, never
a loop of statements per run (a lab's store holds 10^5 small runs). The new rows are those
past the watermark (`rollup_state.next_rowid`: append-only tables number rows in insertion
order, a `rowid >= x` filter skips old row groups, and the current transaction's own rows
carry rowids from ~2^55 up, above `LOCAL_ROWID`). Then, per level:

1. the levels read from the raw rows (`metrics_r8`, `expert_layer_step`, `expert_load_r16`):
   the new rows' cells (one GROUP BY over them) are *merged* into the table: a cell that
   exists already is combined with them (min of mins, sums of sums, the `last` of the
   later step), as a recount of its raw rows would give: a cell is a fold of its rows, and
   its rows are the old ones plus the new ones;
2. every coarser level: the buckets the new cells reach into are recomputed from the level
   below (a rollback's replayed steps land in their buckets as a recount would count them);
3. `metric_series`: the new rows' per-name summary upserted.

If the counts do not add up (rows deleted, store rebuilt), everything is rebuilt
(`rebuild_rollups`, the whole-table GROUP BYs: also the tests' reference). Readers of these
tables: `observatory/queries/experts.py` and `observatory/queries/dashboard.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from observatory.store import replays
from observatory.store.schema import (
    EXPERT_TABLES,
    LAYER_RESOLUTION,
    METRIC_RESOLUTIONS,
    METRIC_TABLES,
    RESOLUTIONS,
)

__all__ = ["SOURCES", "LOCAL_ROWID", "after_ingest", "rebuild_rollups", "SERIES_UPSERT"]

SOURCES = ("metrics", "expert_load")  # the tables rolled up (the charts' source first)
LOCAL_ROWID = 1 << 50  # DuckDB numbers rows of the current transaction's local storage from ~2^55 up


# ------------------------------------------------------------ the levels
# A level: (table, key columns, the SELECT that makes its rows from `{src}` (the rows of the level
# below, or of the raw table), the aggregate that combines cells of one key).

_M8, _M64, _M512 = (f"metrics_r{r}" for r in METRIC_RESOLUTIONS)
_X16, _X128, _X1024 = (f"expert_load_r{r}" for r in RESOLUTIONS)
_XL = f"expert_layer_r{LAYER_RESOLUTION}"

# metrics cells: min/max over finite values, `last` at the last step, counts. `{src}` has the rows' `_row`
# (rowid): at a tie of the last step (two hosts log a name at one step) `last` is the row stored first,
# whatever order DuckDB's threads meet them in, as the stored part of a cell keeps its `last` (`_o`). The
# key (step, first rowid) is one HUGEINT, step * 2^64 - rowid: a struct key took 0.1 s more per 10^6 rows
_METRIC_RAW = """SELECT run, name, step // {res} AS bucket, min(step), max(step),
       min(value) FILTER (WHERE isfinite(value)), max(value) FILTER (WHERE isfinite(value)),
       arg_max(value, step::HUGEINT * 18446744073709551616 - _row), sum(value) FILTER (WHERE isfinite(value)), count(*),
       count(*) FILTER (WHERE NOT isfinite(value))
    FROM {src} WHERE step IS NOT NULL GROUP BY run, name, bucket"""
# cells combined: a coarser bucket's from the level below, or a cell's stored and new parts (`_o` orders
# a tie of `last_step` between them, a replayed step: the stored part came first and keeps its `last`)
_METRIC_COMBINE = """SELECT run, name, bucket // {k} AS b, min(first_step), max(last_step), min(min), max(max),
       arg_max(last, struct_pack(s := last_step, o := _o)), sum(sum), sum(n), sum(n_nonfinite)
    FROM {src} GROUP BY run, name, b"""

_LAYER_STEP_RAW = """SELECT run, layer, step, sum(routed), sum(dropped), max(routed), count(*)
    FROM {src} GROUP BY run, layer, step"""
_LAYER_STEP_COMBINE = """SELECT run, layer, step, sum(routed), sum(dropped), max(routed_max), sum(n_experts)
    FROM {src} GROUP BY run, layer, step"""
_RUN_STEP = """SELECT run, step, sum(routed), sum(dropped) FROM {src} GROUP BY run, step"""
_LAYER_BUCKET = f"""SELECT run, layer, step // {LAYER_RESOLUTION} AS b, min(step), max(step), sum(routed),
       sum(dropped), max(dropped / nullif(routed, 0)), sum(routed_max::DOUBLE * n_experts / nullif(routed, 0)),
       max(routed_max::DOUBLE * n_experts / nullif(routed, 0)), count(*)
    FROM {{src}} GROUP BY run, layer, b"""
_LOAD_RAW = """SELECT run, layer, step // {res} AS b, expert, sum(routed), sum(dropped), count(*)
    FROM {src} GROUP BY run, layer, b, expert"""
_LOAD_COMBINE = """SELECT run, layer, bucket // {k} AS b, expert, sum(routed), sum(dropped), sum(steps)
    FROM {src} GROUP BY run, layer, b, expert"""


# ----------------------------------------------------------------- incremental


def after_ingest(con, touched: Mapping[str, Iterable[str]] | None = None) -> None:
    """Bring the rollups up to date with the rows past the watermark (call inside the write transaction).

    `touched` maps a source table ("metrics", "expert_load") to whether (truthy) the batch added rows
    there; None: look at both. Which rows are new is found from the store itself, so a missed call is
    caught up by the next one."""
    for source in SOURCES:
        if touched is not None and not touched.get(source):
            continue
        start, seen = _state(con, source)
        n_new, committed_max, n_local = con.execute(
            f"""SELECT count(*), max(rowid) FILTER (WHERE rowid < {LOCAL_ROWID}),
                       count(*) FILTER (WHERE rowid >= {LOCAL_ROWID}) FROM {source} WHERE rowid >= ?""",
            [start],
        ).fetchall()[0]
        n_total = con.execute(f"SELECT count(*) FROM {source}").fetchall()[0][0]
        if n_total - seen != n_new:  # rows went missing, or the watermark is off: recount everything
            (_rebuild_metrics if source == "metrics" else _rebuild_experts)(con)
            continue
        if not n_new:
            continue
        if source == "metrics":
            _roll_metrics(con, int(start))
        else:
            _roll_experts(con, f"(SELECT * FROM {source} WHERE rowid >= {int(start)})")
        for (name,) in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE temporary AND starts_with(table_name, '_touched_')"
        ).fetchall():
            con.execute(f"DROP TABLE {name}")  # an instance left with temp tables is not kept for reuse
        nxt = (committed_max + 1 if committed_max is not None else start) + n_local
        _save_state(con, source, nxt, n_total)


def _roll_metrics(con, start: int) -> None:
    """Roll up the metric rows from rowid `start` on; first mark the replays among them (`replays.mark`):
    the rows they replace leave their cells, which are recounted from the raw rows."""
    res0 = METRIC_RESOLUTIONS[0]
    old = replays.mark(con, start)
    raw = f"(SELECT *, rowid AS _row FROM metrics WHERE rowid >= {start} AND NOT replaced)"
    _merge(
        con,
        _M8,
        ("run", "name", "bucket"),
        _METRIC_RAW.format(res=res0, src=raw),
        _METRIC_COMBINE.format(k=1, src="{src}"),
    )
    if old is not None:
        _recount_replaced(con, old)
    below = _M8
    for res, prev in zip(METRIC_RESOLUTIONS[1:], METRIC_RESOLUTIONS, strict=False):
        table = f"metrics_r{res}"
        _recompute(con, table, below, res // prev, ("run", "bucket"), _METRIC_COMBINE, with_o=True)
        below = table
    con.execute(SERIES_UPSERT.format(source=_SERIES_NEW.format(src=raw)))
    if old is not None:
        _fix_series(con, old)
        con.execute(f"DROP TABLE {old}")


def _recount_replaced(con, old: str) -> None:
    """Recount from the raw rows the `metrics_r8` cells that hold rows a replay just replaced (the temp table
    `old`: run, name, step), and add them to the cells the coarser levels recompute."""
    res0 = METRIC_RESOLUTIONS[0]
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE _replay_cells AS SELECT DISTINCT run, name, step // {res0} AS bucket FROM {old}"
    )
    lo, hi = con.execute("SELECT min(bucket), max(bucket) FROM _replay_cells").fetchall()[0]
    on = _on(("run", "name", "bucket"), "t", "d")
    con.execute(f"DELETE FROM {_M8} t USING _replay_cells d WHERE {on} AND t.bucket BETWEEN {lo} AND {hi}")
    rows = f"""(SELECT m.*, m.rowid AS _row FROM metrics m SEMI JOIN _replay_cells d
                   ON m.run = d.run AND m.name = d.name AND m.step // {res0} = d.bucket
                WHERE NOT m.replaced AND m.step BETWEEN {lo * res0} AND {hi * res0 + res0 - 1})"""
    con.execute(f"INSERT INTO {_M8} {_METRIC_RAW.format(res=res0, src=rows)} ORDER BY ALL")
    con.execute(f"INSERT INTO _touched_{_M8} SELECT t.* FROM {_M8} t SEMI JOIN _replay_cells d ON {on}")
    con.execute("DROP TABLE _replay_cells")


def _fix_series(con, old: str) -> None:
    """`metric_series` after a replay replaced stored rows: their count out, and the last value again
    where the replaced row was at the series' last step (what a recount's `arg_max` takes)."""
    con.execute(
        f"""UPDATE metric_series s SET n = s.n - d.k
            FROM (SELECT run, name, sum(delta) AS k FROM {old} GROUP BY ALL) d
            WHERE s.run = d.run AND s.name = d.name"""
    )
    con.execute(
        f"""UPDATE metric_series s SET last_value = v.value
            FROM (SELECT m.run, m.name, arg_max(m.value, m.step::HUGEINT * 18446744073709551616 - m.rowid) AS value
                  FROM metrics m SEMI JOIN (SELECT o.run, o.name, o.step FROM {old} o
                                            JOIN metric_series x ON x.run = o.run AND x.name = o.name
                                                                AND x.last_step = o.step) d
                      ON m.run = d.run AND m.name = d.name AND m.step = d.step
                  WHERE NOT m.replaced AND m.step BETWEEN (SELECT min(step) FROM {old})
                                                      AND (SELECT max(step) FROM {old})
                  GROUP BY m.run, m.name) v
            WHERE s.run = v.run AND s.name = v.name"""
    )


def _roll_experts(con, raw: str) -> None:
    _merge(
        con,
        "expert_layer_step",
        ("run", "layer", "step"),
        _LAYER_STEP_RAW.format(src=raw),
        _LAYER_STEP_COMBINE,
    )
    _merge(
        con,
        _X16,
        ("run", "layer", "bucket", "expert"),
        _LOAD_RAW.format(res=RESOLUTIONS[0], src=raw),
        _LOAD_COMBINE.format(k=1, src="{src}"),
    )
    # the levels over expert_layer_step: the steps (and 64-step buckets) the new cells are in, recomputed
    _recompute(con, "expert_run_step", "expert_layer_step", 1, ("run", "step"), _RUN_STEP, step_key=True)
    _recompute(
        con,
        _XL,
        "expert_layer_step",
        LAYER_RESOLUTION,
        ("run", "layer", "bucket"),
        _LAYER_BUCKET,
        step_key=True,
    )
    below = _X16
    for res, prev in zip(RESOLUTIONS[1:], RESOLUTIONS, strict=False):
        table = f"expert_load_r{res}"
        _recompute(con, table, below, res // prev, ("run", "layer", "bucket"), _LOAD_COMBINE)
        below = table


def _merge(con, table: str, keys: tuple[str, ...], new_sql: str, combine: str) -> None:
    """Fold the cells `new_sql` makes from the new rows into `table`: a cell whose key the table has is
    replaced by the two combined (`combine`, over `{src}`), the others appended. Leaves the new cells
    in the temp table `_touched_<table>` (the coarser levels read which keys they touched)."""
    new = f"_touched_{table}"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {new} AS SELECT * FROM {table} LIMIT 0")  # the table's types
    con.execute(f"INSERT INTO {new} {new_sql}")
    if not con.execute(f"SELECT count(*) FROM {new}").fetchall()[0][0]:
        return  # no new cell (every new row was replaced by another)
    on, rng = _on(keys, "t", "n"), _range(con, table, new, keys)
    old = f"_old_{table}"
    con.execute(
        f"CREATE OR REPLACE TEMP TABLE {old} AS SELECT t.* FROM {table} t SEMI JOIN {new} n ON {on} {rng}"
    )
    if not con.execute(f"SELECT count(*) FROM {old}").fetchall()[0][0]:
        con.execute(f"INSERT INTO {table} SELECT * FROM {new} ORDER BY ALL")
    else:  # some cells go on (a run's tail bucket, a replayed step): stored part + new part
        con.execute(f"DELETE FROM {table} t USING {new} n WHERE {on} {rng}")
        both = f"(SELECT *, 1 AS _o FROM {old} UNION ALL SELECT *, 0 AS _o FROM {new})"
        con.execute(f"INSERT INTO {table} {combine.format(src=both)} ORDER BY ALL")
    con.execute(f"DROP TABLE {old}")


def _recompute(
    con,
    table: str,
    below: str,
    k: int,
    keys: tuple[str, ...],
    sql: str,
    *,
    with_o: bool = False,
    step_key: bool = False,
) -> None:
    """Recompute the cells of `table` (keys `keys`, its bucket = the level below's `// k`) that the new cells
    of `below` reach into (`_touched_<below>`: the keys a merge or a recompute left), from `below`.
    `step_key`: `below` is keyed by `step` (expert_layer_step), not `bucket`."""
    col = "step" if step_key else "bucket"
    src_new = f"_touched_{below}"
    touched = f"_touched_{table}"
    out_key = keys[-1]  # bucket, or step for expert_run_step
    inner = [c for c in keys[:-1]]
    sel = ", ".join([*inner, f"{col} // {k} AS {out_key}"])
    con.execute(f"CREATE OR REPLACE TEMP TABLE {touched} AS SELECT DISTINCT {sel} FROM {src_new}")
    lo, hi = con.execute(f"SELECT min({out_key}), max({out_key}) FROM {touched}").fetchall()[0]
    if lo is None:
        return
    on_t = _on(keys, "t", "d")
    con.execute(f"DELETE FROM {table} t USING {touched} d WHERE {on_t} AND t.{out_key} BETWEEN {lo} AND {hi}")
    on_b = " AND ".join([*(f"b.{c} = d.{c}" for c in inner), f"b.{col} // {k} = d.{out_key}"])
    rows = (
        f"(SELECT b.*{', 0 AS _o' if with_o else ''} FROM {below} b SEMI JOIN {touched} d ON {on_b} "
        f"WHERE b.{col} BETWEEN {lo * k} AND {hi * k + k - 1})"
    )
    con.execute(f"INSERT INTO {table} {sql.format(k=k, src=rows)} ORDER BY ALL")


def _on(keys: tuple[str, ...], a: str, b: str) -> str:
    return " AND ".join(f"{a}.{c} = {b}.{c}" for c in keys)


def _range(con, table: str, new: str, keys: tuple[str, ...]) -> str:
    """A literal range on the table's step or bucket column, from the new cells': DuckDB's zonemaps then
    skip the row groups before it (a big run's rollup tables grow with its steps)."""
    col = "step" if "step" in keys else "bucket"
    lo, hi = con.execute(f"SELECT min({col}), max({col}) FROM {new}").fetchall()[0]
    return f"AND t.{col} BETWEEN {lo} AND {hi}"


def _state(con, source: str) -> tuple[int, int]:
    # fetchall, never fetchone: DuckDB 2 refuses new work on a connection with an unfinished result
    rows = con.execute("SELECT next_rowid, n_rows FROM rollup_state WHERE source = ?", [source]).fetchall()
    return rows[0] if rows else (0, 0)


def _save_state(con, source: str, next_rowid: int, n_rows: int) -> None:
    con.execute("INSERT OR REPLACE INTO rollup_state VALUES (?, ?, ?)", [source, next_rowid, n_rows])


# `metric_series` folds new per-name rows in (one statement over the batch's rows; over the store on a rebuild).
# The value at a tie of the last step (two hosts log a name at one step) is the one stored first, as in a
# recount's `arg_max` by (step, first rowid), and as `metrics_r*`'s `last`
SERIES_UPSERT = """
INSERT INTO metric_series {source}
ON CONFLICT (run, name) DO UPDATE SET
    n = metric_series.n + excluded.n,
    first_step = least(metric_series.first_step, excluded.first_step),
    last_value = CASE WHEN excluded.last_step > coalesce(metric_series.last_step, -1)
                      THEN excluded.last_value ELSE metric_series.last_value END,
    last_step = greatest(metric_series.last_step, excluded.last_step),
    last_t = greatest(metric_series.last_t, excluded.last_t)
"""
_SERIES_NEW = """SELECT run, name, count(*), min(step), max(step), arg_max(value, step::HUGEINT * 18446744073709551616 - _row),
                        max(t)
                 FROM {src} GROUP BY run, name"""


# ------------------------------------------------------------------- rebuild


def _state_now(con, source: str) -> tuple[int, int]:
    """(next rowid, row count) of the whole source (a full scan: rebuilds only)."""
    committed_max, n_local, n = con.execute(
        f"""SELECT max(rowid) FILTER (WHERE rowid < {LOCAL_ROWID}),
                   count(*) FILTER (WHERE rowid >= {LOCAL_ROWID}), count(*) FROM {source}"""
    ).fetchall()[0]
    return (committed_max + 1 if committed_max is not None else 0) + n_local, n


def _rebuild_metrics(con) -> None:
    for t in METRIC_TABLES:
        con.execute(f"DELETE FROM {t}")
    replays.mark_all(con)
    current = "(SELECT *, rowid AS _row FROM metrics WHERE NOT replaced)"
    con.execute(
        f"INSERT INTO {_M8} {_METRIC_RAW.format(res=METRIC_RESOLUTIONS[0], src=current)} ORDER BY ALL"
    )
    for res, prev in zip(METRIC_RESOLUTIONS[1:], METRIC_RESOLUTIONS, strict=False):
        src = f"(SELECT *, 0 AS _o FROM metrics_r{prev})"
        con.execute(
            f"INSERT INTO metrics_r{res} {_METRIC_COMBINE.format(k=res // prev, src=src)} ORDER BY ALL"
        )
    con.execute(SERIES_UPSERT.format(source=_SERIES_NEW.format(src=current)))
    _save_state(con, "metrics", *_state_now(con, "metrics"))


def _rebuild_experts(con) -> None:
    for t in EXPERT_TABLES:
        con.execute(f"DELETE FROM {t}")
    # whole-table statements (not per run) so DuckDB aggregates each level in one parallel pass
    for table, sql in (
        ("expert_layer_step", _LAYER_STEP_RAW.format(src="expert_load")),
        ("expert_run_step", _RUN_STEP.format(src="expert_layer_step")),
        (_XL, _LAYER_BUCKET.format(src="expert_layer_step")),
        (_X16, _LOAD_RAW.format(res=RESOLUTIONS[0], src="expert_load")),
        *(
            (f"expert_load_r{res}", _LOAD_COMBINE.format(k=res // prev, src=f"expert_load_r{prev}"))
            for res, prev in zip(RESOLUTIONS[1:], RESOLUTIONS, strict=False)
        ),
    ):
        con.execute(f"INSERT INTO {table} {sql} ORDER BY ALL")
    _save_state(con, "expert_load", *_state_now(con, "expert_load"))


def rebuild_rollups(con) -> None:
    """Recompute every rollup from the store's tables (after `rebuild`, to repair, and as the tests' reference)."""
    _rebuild_experts(con)
    _rebuild_metrics(con)
