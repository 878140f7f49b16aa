"""Core queries: runs with their live status, metric series, rejected lines, and user SQL.

Every function but `run_user_sql` takes an open connection (the caller owns it:
`with observatory.store.connect(db) as con:`). `run_user_sql` opens its own,
because it must lock that connection down: it is the one safe entry point for
SQL typed by a person, shared by `observatory sql` and the dashboard's console.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from observatory import settings
from observatory.store import connect, run_status_sql

__all__ = [
    "QueryError",
    "QueryInterrupted",
    "QueryResult",
    "RUN_COLUMNS",
    "list_runs",
    "metric_series",
    "run_user_sql",
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


# ------------------------------------------------------------------ user SQL


class QueryError(Exception):
    """A user query that was refused or failed. Carries the SQL and, when a limit caused it, the setting."""

    def __init__(self, message: str, sql: str, setting: str | None = None):
        super().__init__(message)
        self.message = message
        self.sql = sql
        self.setting = setting


class QueryInterrupted(QueryError):
    """A user query ran past `sql_time_limit_ms`."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more rows existed than max_rows
    sql: str
    elapsed_ms: float = 0.0
    types: list[str] = field(default_factory=list)

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


_ALLOWED = {"SELECT", "EXPLAIN"}  # DESCRIBE, SHOW, SUMMARIZE, FROM-first and VALUES parse as SELECT


def _check_statement(sql: str) -> None:
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error as e:
        raise QueryError(f"SQL does not parse: {_first_line(e)}", sql) from None
    if not statements:
        raise QueryError("no SQL statement given", sql)
    if len(statements) > 1:
        raise QueryError("one statement at a time, please (found several separated by ';')", sql)
    kind = statements[0].type.name
    if kind not in _ALLOWED:
        raise QueryError(
            f"{kind} statements are refused: the store is read-only here and only SELECT-style queries "
            "run (no ATTACH, INSTALL, LOAD, COPY, SET, PRAGMA, EXPORT, CREATE, INSERT, ...)",
            sql,
        )


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def run_user_sql(db, sql: str, max_rows: int | None = None, time_limit_ms: int | None = None) -> QueryResult:
    """Run one read-only query typed by a person; the only door for user SQL.

    - one SELECT-style statement (SELECT, WITH, FROM, VALUES, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN);
      anything else raises `QueryError` before it reaches DuckDB;
    - a read-only connection with external access off (no files, no network, no extensions)
      and its configuration locked, so the query cannot turn it back on;
    - at most `max_rows` rows (`sql_max_rows`), with `truncated` set when there were more;
    - at most `time_limit_ms` (`sql_time_limit_ms`), else `QueryInterrupted`.
    """
    import duckdb

    sql = (sql or "").strip()
    max_rows = settings.get("sql_max_rows") if max_rows is None else int(max_rows)
    limit_ms = settings.get("sql_time_limit_ms") if time_limit_ms is None else int(time_limit_ms)
    _check_statement(sql)
    t0 = time.perf_counter()
    with connect(db) as con:
        # Settings of a DuckDB instance are shared by every connection of this process to the
        # file; they last until the last of them closes, which each unit of work does.
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
        timer = threading.Timer(limit_ms / 1000, con.interrupt)
        timer.start()
        try:
            cur = con.execute(sql)
            columns = [d[0] for d in cur.description] if cur.description else []
            types = [str(d[1]) for d in cur.description] if cur.description else []
            rows = cur.fetchmany(max_rows + 1) if columns else []
        except duckdb.InterruptException:
            raise QueryInterrupted(
                f"query took longer than {limit_ms} ms and was stopped (setting sql_time_limit_ms, "
                f"env {settings.SETTINGS['sql_time_limit_ms'].env})",
                sql,
                "sql_time_limit_ms",
            ) from None
        except duckdb.Error as e:
            if timer.finished.is_set() and "interrupt" in str(e).lower():
                raise QueryInterrupted(
                    f"query took longer than {limit_ms} ms and was stopped (setting sql_time_limit_ms)",
                    sql,
                    "sql_time_limit_ms",
                ) from None
            raise QueryError(f"{type(e).__name__}: {_first_line(e)}", sql) from None
        finally:
            timer.cancel()
    truncated = len(rows) > max_rows
    return QueryResult(
        columns=columns,
        rows=[tuple(_plain(v) for v in r) for r in rows[:max_rows]],
        truncated=truncated,
        sql=sql,
        elapsed_ms=(time.perf_counter() - t0) * 1000,
        types=types,
    )


def _plain(v: Any) -> Any:
    """JSON columns come back as strings; leave them as they are, but make odd objects printable."""
    if isinstance(v, (str, int, float, bool, type(None), bytes, list, dict, tuple)):
        return v
    try:
        json.dumps(v)
        return v
    except TypeError:
        return v if hasattr(v, "isoformat") else str(v)
