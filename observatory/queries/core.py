"""Core queries: runs with their live status, metric series, the schema.

Every function takes an open connection (the caller owns it:
`with observatory.store.connect(db) as con:`). SQL typed by a person goes through
`observatory.queries.user_sql.run_user_sql` instead.
"""

from __future__ import annotations

import time
from typing import Any

from observatory import settings

__all__ = [
    "RUN_COLUMNS",
    "list_runs",
    "run_status_sql",
    "metric_series",
    "metric_names",
    "schema",
    "table_counts",
    "rejected",
]

# Columns `list_runs` returns, in order.
RUN_COLUMNS = (
    "run", "name", "status", "start_time", "end_time", "last_event_t", "last_step", "final_step",
    "parent_run", "parent_step", "ladder_name", "ladder_rung", "tags",
)  # fmt: skip


def run_status_sql(stale_after_s: float, now: float) -> str:
    """SQL expression for a run's status as the public sees it: silent running runs are crashed."""
    return (
        f"CASE WHEN status IN ('running', 'crashed') AND coalesce(last_event_t, 0) < {float(now - stale_after_s)!r} "
        f"THEN 'crashed' WHEN status = 'crashed' THEN 'running' ELSE status END"
    )


def list_runs(con, status: str | None = None, now: float | None = None) -> list[dict[str, Any]]:
    """Every run, newest first, with `status` computed now (`crashed` after `stale_after_s` of silence)."""
    now = time.time() if now is None else now
    st = run_status_sql(settings.get("stale_after_s"), now)
    cols = ", ".join(f"{st} AS status" if c == "status" else c for c in RUN_COLUMNS)
    sql = f"SELECT * FROM (SELECT {cols} FROM runs) WHERE $status IS NULL OR status = $status"
    sql += " ORDER BY coalesce(start_time, last_event_t) DESC NULLS LAST, run"
    cur = con.execute(sql, {"status": status})
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in cur.fetchall()]


def metric_series(con, run: str, name: str, lo: int | None = None, hi: int | None = None) -> dict[str, list]:
    """{"step": [...], "value": [...], "t": [...]} of one metric of one run, in step order (every point)."""
    rows = con.execute(
        """SELECT step, value, t FROM metrics
           WHERE run = $run AND name = $name AND ($lo IS NULL OR step >= $lo) AND ($hi IS NULL OR step <= $hi)
           ORDER BY step, t""",
        {"run": run, "name": name, "lo": lo, "hi": hi},
    ).fetchall()
    return {"step": [r[0] for r in rows], "value": [r[1] for r in rows], "t": [r[2] for r in rows]}


def metric_names(con, run: str) -> list[str]:
    return [r[0] for r in con.execute("SELECT DISTINCT name FROM metrics WHERE run = ? ORDER BY name", [run]).fetchall()]


def table_counts(con) -> dict[str, int]:
    """Row count of every base table of the store."""
    names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()]
    return {n: con.execute(f'SELECT count(*) FROM "{n}"').fetchall()[0][0] for n in sorted(names)}


def rejected(con, run: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Lines ingest rejected, newest first: file, run, line, field, reason, raw."""
    cols = ("file", "run", "line", "field", "reason", "raw", "ingested_at")
    rows = con.execute(
        f"SELECT {', '.join(cols)} FROM rejected_events WHERE $run IS NULL OR run = $run "
        "ORDER BY ingested_at DESC, file, line LIMIT $limit",
        {"run": run, "limit": limit},
    ).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def schema(con) -> list[dict[str, Any]]:
    """Tables and views with their columns: [{name, kind, columns: [(column, type), ...]}, ...]."""
    rows = con.execute(
        """SELECT c.table_name, CASE WHEN v.view_name IS NULL THEN 'table' ELSE 'view' END, c.column_name, c.data_type
           FROM duckdb_columns() c
           LEFT JOIN duckdb_views() v ON v.view_name = c.table_name AND v.schema_name = c.schema_name
           WHERE c.schema_name = 'main' AND NOT c.internal
           ORDER BY 2, 1, c.column_index"""
    ).fetchall()
    out: dict[str, dict[str, Any]] = {}
    for table, kind, col, typ in rows:
        out.setdefault(table, {"name": table, "kind": kind, "columns": []})["columns"].append((col, typ))
    return list(out.values())
