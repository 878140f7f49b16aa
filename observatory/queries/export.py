"""Queries behind `observatory export`: a run's metrics as a long table, streamed; the store as partitioned Parquet."""

from __future__ import annotations

__all__ = [
    "METRIC_COLUMNS",
    "run_exists",
    "similar_runs",
    "metrics_reader",
    "PARTITION_SELECTS",
    "run_ids",
    "copy_partitioned",
]

# the long table's columns, in order; parquet and csv exports have exactly these
METRIC_COLUMNS = ("run", "step", "name", "value", "t", "host", "replaced")


def run_exists(con, run: str) -> bool:
    """Is `run` in the store (as a run, or at least with metrics)?"""
    # fetchall, not fetchone: DuckDB 2 keeps a half-read result open and refuses the next query
    rows = con.execute(
        "SELECT (SELECT count(*) FROM runs WHERE run = $run) + (SELECT count(*) FROM "
        "(SELECT 1 FROM metrics WHERE run = $run LIMIT 1))",
        {"run": run},
    ).fetchall()
    return bool(rows and rows[0][0])


def similar_runs(con, run: str, limit: int = 5) -> list[str]:
    """Run ids that look like `run` (for a helpful "did you mean" message)."""
    rows = con.execute(
        "SELECT run FROM runs ORDER BY jaro_winkler_similarity(run, $run) DESC, run LIMIT $limit",
        {"run": run, "limit": limit},
    ).fetchall()
    return [r[0] for r in rows]


def metrics_reader(con, run: str, batch_rows: int = 100_000):
    """`pyarrow.RecordBatchReader` over the run's metrics, ordered by step, name, host.

    Columns: run VARCHAR, step BIGINT, name VARCHAR, value DOUBLE (NaN/inf kept), t DOUBLE,
    host USMALLINT, replaced BOOLEAN (a resumed attempt logged the step again: the newest row is the
    step's value, `observatory.store.replays`). Streamed in batches so a run with 10^8 values never sits in memory.
    """
    return con.sql(
        f"SELECT {', '.join(METRIC_COLUMNS)} FROM metrics WHERE run = $run ORDER BY step, name, host, t",
        params={"run": run},
    ).to_arrow_reader(batch_rows)


# `export --partitioned`: one Hive-partitioned Parquet table per kind, DIR/kind=<kind>/run=<run>/*.parquet.
# The partition value of an event kind is the kind when it is a plain name, `unknown` otherwise (an
# unknown kind is any string a log wrote); `raw_kind` keeps it as written.
PARTITION_SELECTS = {
    "runs": "SELECT 'runs' AS kind, * FROM runs",
    "metrics": "SELECT 'metrics' AS kind, run, step, name, value, t, host, replaced FROM metrics",
    "expert_load": "SELECT 'expert_load' AS kind, run, step, layer, expert, routed, dropped FROM expert_load",
    "events": (
        "SELECT CASE WHEN regexp_full_match(kind, '[a-z][a-z0-9_]{0,63}') AND kind NOT IN "
        "('runs', 'metrics', 'expert_load') THEN kind ELSE 'unknown' END AS kind, "
        "run, host, seq, step, t, v, known, kind AS raw_kind, data FROM events"
    ),
}


def run_ids(con) -> list[str]:
    """Every run id in the store's tables that `export --partitioned` writes."""
    rows = con.execute(
        "SELECT run FROM runs UNION SELECT DISTINCT run FROM metrics UNION SELECT DISTINCT run FROM events "
        "UNION SELECT DISTINCT run FROM expert_load"
    ).fetchall()
    return sorted(r[0] for r in rows)


def copy_partitioned(con, out_dir: str) -> dict[str, int]:
    """Write each table as Parquet partitioned by (kind, run) under `out_dir`; rows written per table."""
    quoted = "'" + str(out_dir).replace("'", "''") + "'"
    counts = {}
    for table, select in PARTITION_SELECTS.items():
        rows = con.execute(
            f"COPY ({select}) TO {quoted} (FORMAT parquet, COMPRESSION zstd, PARTITION_BY (kind, run), "
            "OVERWRITE_OR_IGNORE true)"
        ).fetchall()
        counts[table] = int(rows[0][0]) if rows else 0
    return counts
