"""Core queries: runs with their live status, metric series, rejected lines.

Every function takes an open connection (the caller owns it:
`with observatory.store.connect(db) as con:`). SQL typed by a person goes through
`observatory.queries.user_sql.run_user_sql` instead.
"""

from __future__ import annotations

import time
from typing import Any

from observatory import settings
from observatory.store import run_status_sql

__all__ = [
    "RUN_COLUMNS",
    "list_runs",
    "metric_series",
    "rejected",
]

# Columns `list_runs` returns, in order.
RUN_COLUMNS = (
    "run", "name", "status", "start_time", "end_time", "last_event_t", "last_step", "final_step",
    "parent_run", "parent_step", "ladder_name", "ladder_rung", "tags", "project", "run_group",
)  # fmt: skip


def list_runs(
    con,
    status: str | None = None,
    now: float | None = None,
    projects: list[str] | tuple[str, ...] = (),
    groups: list[str] | tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Every run, newest first, with `status` computed now (`crashed` after `stale_after_s` of silence).

    `status`, `projects` and `groups` filter (a run matches one of the projects given, and one
    of the groups given; an empty list does not filter).
    """
    now = time.time() if now is None else now
    cols = ", ".join(f"{run_status_sql('$cut')} AS status" if c == "status" else c for c in RUN_COLUMNS)
    sql = (
        f"SELECT * FROM (SELECT {cols} FROM runs) WHERE ($status IS NULL OR status = $status)"
        " AND (len($projects::VARCHAR[]) = 0 OR list_contains($projects::VARCHAR[], project))"
        " AND (len($groups::VARCHAR[]) = 0 OR list_contains($groups::VARCHAR[], run_group))"
        " ORDER BY coalesce(start_time, last_event_t) DESC NULLS LAST, run"
    )
    params = {"status": status, "cut": now - settings.get("stale_after_s"), "projects": list(projects), "groups": list(groups)}
    cur = con.execute(sql, params)
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


def rejected(con, run: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Lines ingest rejected, newest first: file, run, line, field, reason, raw."""
    cols = ("file", "run", "line", "field", "reason", "raw", "ingested_at")
    rows = con.execute(
        f"SELECT {', '.join(cols)} FROM rejected_events WHERE $run IS NULL OR run = $run "
        "ORDER BY ingested_at DESC, file, line LIMIT $limit",
        {"run": run, "limit": limit},
    ).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]
