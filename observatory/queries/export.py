"""Queries behind `observatory export`: a run's metrics as a long table, streamed."""

from __future__ import annotations

__all__ = ["METRIC_COLUMNS", "run_exists", "similar_runs", "metrics_reader"]

# the long table's columns, in order; parquet and csv exports have exactly these
METRIC_COLUMNS = ("run", "step", "name", "value", "t", "host")


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
    host USMALLINT. Streamed in batches so a run with 10^8 values never sits in memory.
    """
    return con.sql(
        "SELECT run, step, name, value, t, host FROM metrics WHERE run = $run ORDER BY step, name, host, t",
        params={"run": run},
    ).to_arrow_reader(batch_rows)
