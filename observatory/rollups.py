"""Ingest-time rollups that keep the dashboard's expert and metric queries cheap at 10^8 rows.

A plain scan of `expert_load` (one row per run, step, layer, expert) takes seconds
at the scale of a real MoE run (10^5 steps x 16 layers x 64 experts ~ 10^8 rows),
so ingest maintains smaller tables next to it, in its own write transaction:

- `expert_layer_step`: one row per (run, layer, step) with the layer's totals
  (routed, dropped) and its busiest expert (routed_max). Drop fraction per layer
  over time, the run's drop fraction per step and the hot-expert ratio
  (max / mean = routed_max * n_experts / routed) all read this, 64x smaller.
- `expert_load_r16`, `expert_load_r128`, `expert_load_r1024`: per (run, layer,
  bucket, expert) sums over buckets of 16, 128 and 1024 steps (bucket = step // res).
  A heatmap of any step window reads the finest table that yields at most a few
  thousand buckets, so it touches at most ~64 x 4000 rows.
- `metric_series`: per (run, name) count, first/last step and value; feeds the
  metric pickers without a DISTINCT over every metric row.

Incremental maintenance: rows appended since the last call are found by DuckDB
`rowid` (append-only tables number rows in insertion order; rows added in the
current, uncommitted transaction carry rowids above `LOCAL_ROWID`). For each run
with new rows we delete and recompute every bucket from the smallest new step on,
so reprocessing a row twice is harmless (recompute, not increment) and late or
replayed steps (a rollback to an earlier checkpoint) land in the right buckets.
If the table shrank or the counts do not add up, everything is rebuilt.

All SQL that writes these tables lives here; the queries that read them are in
`observatory/queries/experts.py` and `observatory/queries/dashboard.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["RESOLUTIONS", "ROLLUP_DDL", "ensure_rollups", "after_ingest", "rebuild_rollups"]

RESOLUTIONS = (16, 128, 1024)  # steps per bucket, finest first; each divides the next
# DuckDB numbers rows of the current transaction's local storage from ~2^55 up.
LOCAL_ROWID = 1 << 50

ROLLUP_DDL = (
    """
CREATE TABLE IF NOT EXISTS expert_layer_step (
    run        VARCHAR NOT NULL,
    layer      USMALLINT NOT NULL,
    step       INTEGER NOT NULL,
    routed     UBIGINT NOT NULL,    -- sum over experts
    dropped    UBIGINT NOT NULL,
    routed_max UINTEGER NOT NULL,   -- busiest expert's routed count
    n_experts  USMALLINT NOT NULL
);
"""
    + "".join(
        f"""
CREATE TABLE IF NOT EXISTS expert_load_r{res} (
    run     VARCHAR NOT NULL,
    layer   USMALLINT NOT NULL,
    bucket  INTEGER NOT NULL,       -- step // {res}
    expert  USMALLINT NOT NULL,
    routed  UBIGINT NOT NULL,
    dropped UBIGINT NOT NULL,
    steps   UINTEGER NOT NULL       -- rows summed (one per step that logged this expert)
);
"""
        for res in RESOLUTIONS
    )
    + """
CREATE TABLE IF NOT EXISTS metric_series (
    run        VARCHAR NOT NULL,
    name       VARCHAR NOT NULL,
    n          BIGINT NOT NULL,
    first_step BIGINT,
    last_step  BIGINT,
    last_value DOUBLE,
    last_t     DOUBLE,
    PRIMARY KEY (run, name)
);
CREATE TABLE IF NOT EXISTS rollup_state (
    source      VARCHAR PRIMARY KEY,  -- expert_load | metrics
    next_rowid  BIGINT NOT NULL,      -- rows with rowid >= this are not rolled up yet
    n_rows      BIGINT NOT NULL       -- count(*) of the source when next_rowid was taken
);
"""
)

_TABLES = ("expert_layer_step", *(f"expert_load_r{r}" for r in RESOLUTIONS), "metric_series")


def ensure_rollups(con) -> None:
    """Create the rollup tables if missing (idempotent; the store's own tables must exist)."""
    con.execute(ROLLUP_DDL)


# ----------------------------------------------------------------- recompute


def _recompute_experts(con, run: str, from_step: int) -> None:
    """Recompute every rollup row of `run` that covers a step >= from_step."""
    con.execute("DELETE FROM expert_layer_step WHERE run = ? AND step >= ?", [run, from_step])
    con.execute(
        """
        INSERT INTO expert_layer_step
        SELECT run, layer, step, sum(routed), sum(dropped), max(routed), count(*)
        FROM expert_load WHERE run = ? AND step >= ?
        GROUP BY run, layer, step
        """,
        [run, from_step],
    )
    prev = None
    for res in RESOLUTIONS:
        b0 = from_step // res
        con.execute(f"DELETE FROM expert_load_r{res} WHERE run = ? AND bucket >= ?", [run, b0])
        if prev is None:  # finest level from the raw rows
            con.execute(
                f"""
                INSERT INTO expert_load_r{res}
                SELECT run, layer, step // {res}, expert, sum(routed), sum(dropped), count(*)
                FROM expert_load WHERE run = ? AND step >= ?
                GROUP BY ALL
                """,
                [run, b0 * res],
            )
        else:  # coarser levels from the level below: each coarse bucket is res/prev fine ones
            k = res // prev
            con.execute(
                f"""
                INSERT INTO expert_load_r{res}
                SELECT run, layer, bucket // {k}, expert, sum(routed), sum(dropped), sum(steps)
                FROM expert_load_r{prev} WHERE run = ? AND bucket >= ?
                GROUP BY run, layer, bucket // {k}, expert
                """,
                [run, b0 * k],
            )
        prev = res


def _merge_metric_series(con, start_rowid: int) -> None:
    """Fold metric rows with rowid >= start_rowid into `metric_series` (O(new rows))."""
    con.execute(
        """
        INSERT INTO metric_series
        SELECT run, name, count(*), min(step), max(step), arg_max(value, step), max(t)
        FROM metrics WHERE rowid >= ? GROUP BY run, name
        ON CONFLICT (run, name) DO UPDATE SET
            n = metric_series.n + excluded.n,
            first_step = least(metric_series.first_step, excluded.first_step),
            last_value = CASE WHEN excluded.last_step >= coalesce(metric_series.last_step, -1)
                              THEN excluded.last_value ELSE metric_series.last_value END,
            last_step = greatest(metric_series.last_step, excluded.last_step),
            last_t = greatest(metric_series.last_t, excluded.last_t)
        """,
        [start_rowid],
    )


def _new_rows(con, source: str) -> tuple[bool, dict[str, int], int, int]:
    """(consistent, {run: smallest new step}, next_rowid, n_rows) for rows added to `source`.

    consistent is False when the source lost rows or the rowids do not account for
    every added row (then the caller rebuilds rather than trust the watermark).
    """
    row = con.execute("SELECT next_rowid, n_rows FROM rollup_state WHERE source = ?", [source]).fetchone()
    start, seen = (0, 0) if row is None else row
    per_run = con.execute(
        f"SELECT run, min(step), count(*) FROM {source} WHERE rowid >= ? GROUP BY run", [start]
    ).fetchall()
    nxt, n_total = _state_now(con, source)
    n_new = sum(c for _, _, c in per_run)
    consistent = n_total - seen == n_new and nxt >= start
    return consistent, {r: (s if s is not None else 0) for r, s, _ in per_run}, nxt, n_total


def _save_state(con, source: str, next_rowid: int, n_rows: int) -> None:
    con.execute(
        "INSERT OR REPLACE INTO rollup_state VALUES (?, ?, ?)",
        [source, next_rowid, n_rows],
    )


def after_ingest(con, touched: Mapping[str, Iterable[str]] | None = None) -> None:
    """Bring the rollups up to date with rows ingest just added (call inside its write transaction).

    `touched` maps a source table ("metrics", "expert_load") to the run ids that
    got rows; a source absent or empty is skipped. Which rows are new is found
    from the store itself, so a missed call is caught up by the next one.
    """
    ensure_rollups(con)
    touched = touched or {}
    if touched.get("expert_load"):
        ok, firsts, nxt, n = _new_rows(con, "expert_load")
        if not ok:
            _rebuild_experts(con)
        else:
            for run, first in sorted(firsts.items()):
                _recompute_experts(con, run, first)
            _save_state(con, "expert_load", nxt, n)
    if touched.get("metrics"):
        row = con.execute("SELECT next_rowid, n_rows FROM rollup_state WHERE source = 'metrics'").fetchone()
        start, seen = (0, 0) if row is None else row
        nxt, n = _state_now(con, "metrics")
        if nxt < start or n < seen:
            _rebuild_metrics(con)
        else:
            _merge_metric_series(con, start)
            _save_state(con, "metrics", nxt, n)


def _state_now(con, source: str) -> tuple[int, int]:
    committed_max, n_local, n = con.execute(
        f"""SELECT max(rowid) FILTER (WHERE rowid < {LOCAL_ROWID}),
                   count(*) FILTER (WHERE rowid >= {LOCAL_ROWID}), count(*) FROM {source}"""
    ).fetchone()
    return (committed_max + 1 if committed_max is not None else 0) + n_local, n


def _rebuild_experts(con) -> None:
    for t in _TABLES[:-1]:
        con.execute(f"DELETE FROM {t}")
    # whole-table statements (not per run) so DuckDB aggregates in parallel in one pass each
    con.execute(
        """
        INSERT INTO expert_layer_step
        SELECT run, layer, step, sum(routed), sum(dropped), max(routed), count(*)
        FROM expert_load GROUP BY run, layer, step ORDER BY run, layer, step
        """
    )
    prev = None
    for res in RESOLUTIONS:
        if prev is None:
            con.execute(
                f"""
                INSERT INTO expert_load_r{res}
                SELECT run, layer, step // {res} AS bucket, expert, sum(routed), sum(dropped), count(*)
                FROM expert_load GROUP BY ALL ORDER BY run, layer, bucket, expert
                """
            )
        else:
            k = res // prev
            con.execute(
                f"""
                INSERT INTO expert_load_r{res}
                SELECT run, layer, bucket // {k} AS b, expert, sum(routed), sum(dropped), sum(steps)
                FROM expert_load_r{prev} GROUP BY run, layer, b, expert ORDER BY run, layer, b, expert
                """
            )
        prev = res
    _save_state(con, "expert_load", *_state_now(con, "expert_load"))


def _rebuild_metrics(con) -> None:
    con.execute("DELETE FROM metric_series")
    con.execute(
        """
        INSERT INTO metric_series
        SELECT run, name, count(*), min(step), max(step), arg_max(value, step), max(t)
        FROM metrics GROUP BY run, name
        """
    )
    _save_state(con, "metrics", *_state_now(con, "metrics"))


def rebuild_rollups(con) -> None:
    """Recompute every rollup from the store's tables (after `rebuild`, or to repair)."""
    ensure_rollups(con)
    _rebuild_experts(con)
    _rebuild_metrics(con)
