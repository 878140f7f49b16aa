"""`observatory runs`, `observatory sql` and `observatory settings`: read the store."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import click

from observatory import settings
from observatory.commands import common_options
from observatory.commands.output import FORMATS, emit, emit_stream
from observatory.queries.core import search_runs
from observatory.store import StoreBusy, connect

__all__ = ["runs", "sql", "settings_cmd"]


def _when(t: float | None) -> str | None:
    return None if t is None else dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


@click.command("runs")
@common_options
@click.option(
    "--search",
    "text",
    help="Only runs whose id is TEXT or starts with it, or whose id, name, tag, ladder, "
    "project or group contains each of its words (case-insensitive).",
)
@click.option(
    "--status", type=click.Choice(["running", "completed", "failed", "preempted", "killed", "crashed"])
)
@click.option("--project", "projects", multiple=True, help="Only runs of this project (repeat for several).")
@click.option("--group", "groups", multiple=True, help="Only runs of this group (repeat for several).")
@click.option("--limit", type=click.IntRange(min=0), help="At most this many runs (newest first).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="Write to this file instead of stdout.")
def runs(runs_dir, db, text, status, projects, groups, limit, fmt, out):
    """List runs with their status, newest first (a run silent for stale_after_s without run_end is `crashed`).

    The search runs in the store (a lab's 10^5 runs are not loaded to find one); csv and json are
    written as the rows come, a thousand at a time."""
    try:
        with connect(db) as con:  # one unit of work: the rows are fetched, then written with the store closed
            rows = search_runs(con, text, status, projects, groups, limit=limit)
    except StoreBusy as e:
        raise click.ClickException(str(e)) from None
    if fmt == "table":
        cols = [
            "run",
            "name",
            "status",
            "project",
            "group",
            "last_step",
            "started",
            "ended",
            "parent",
            "ladder",
            "tags",
        ]
        data = [
            (
                r["run"],
                r["name"],
                r["status"],
                r["project"],
                r["run_group"],
                r["last_step"],
                _when(r["start_time"]),
                _when(r["end_time"]),
                f"{r['parent_run']}@{r['parent_step']}" if r["parent_run"] else None,
                "/".join(x for x in (r["ladder_name"], r["ladder_rung"]) if x) or None,
                r["tags"],
            )
            for r in rows
        ]
        emit(cols, data, fmt, out, title=f"{len(rows)} run(s) in {db}")
    elif fmt in ("csv", "json"):
        cols = list(rows[0]) if rows else ["run", "status"]
        emit_stream(cols, (tuple(r[c] for c in cols) for r in rows), fmt, out)
    else:
        cols = list(rows[0]) if rows else ["run", "status"]
        emit(cols, [tuple(r[c] for c in cols) for r in rows], fmt, out)


@click.command("sql")
@click.argument("query")
@common_options
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="Write to this file instead of stdout.")
@click.option("--max-rows", type=int, default=None, help="Row cap (default: setting sql_max_rows).")
@click.option(
    "--time-limit-ms", type=int, default=None, help="Time limit (default: setting sql_time_limit_ms)."
)
def sql(query, runs_dir, db, fmt, out, max_rows, time_limit_ms):
    """Run one read-only SQL QUERY over the store; writes, file access, ATTACH/INSTALL/LOAD/COPY/SET are refused.

    observatory sql "SELECT run, name, value FROM latest_metrics WHERE name = 'train/loss'"

    Tables: runs, metrics, expert_load, events, rejected_events, ingest_files and the
    rollups; views latest_metrics, run_drop_fraction, decisions (see docs/schema.md for the
    schema). Every format takes every column type: table and csv write lists, structs,
    maps and JSON as JSON text, json embeds them, parquet keeps their types.
    """
    from observatory.queries.user_sql import (  # lazy for start-up time (every command)
        QueryError,
        run_user_sql,
    )

    try:
        res = run_user_sql(db, query, max_rows, time_limit_ms)
    except (QueryError, StoreBusy) as e:
        raise click.ClickException(str(e)) from None
    emit(res.columns, res.rows, fmt, out, types=res.types)
    if res.truncated:
        click.echo(
            f"(showing the first {len(res.rows)} rows; more matched. Raise --max-rows or the setting "
            "sql_max_rows, or add LIMIT/aggregate)",
            err=True,
        )


@click.command("settings")
def settings_cmd():
    """Show every setting, its current value and the environment variable that sets it."""
    emit(["name", "value", "env", "help"], settings.describe(), "table", None, title="Observatory settings")
