"""`observatory runs`, `observatory sql` and `observatory settings`: read the store."""

from __future__ import annotations

import datetime as dt
import json
import sys
from pathlib import Path

import click

from observatory import settings
from observatory.commands import db_option
from observatory.queries.core import QueryError, list_runs, run_user_sql
from observatory.store import StoreBusy, connect

__all__ = ["runs", "sql", "settings_cmd"]

FORMATS = ("table", "csv", "json", "parquet")


def _frame(columns: list[str], rows: list[tuple]):
    import polars as pl  # lazy for start-up time: only output needs it

    data = {c: [r[i] for r in rows] for i, c in enumerate(columns)}
    try:
        return pl.DataFrame(data, strict=False)
    except Exception:  # a column of mixed types: show it as text
        return pl.DataFrame({c: [None if v is None else str(v) for v in vs] for c, vs in data.items()})


def _emit(columns: list[str], rows: list[tuple], fmt: str, out: Path | None, title: str | None = None) -> None:
    if fmt == "parquet" and out is None:
        raise click.UsageError("--format parquet needs --out FILE (parquet is binary)")
    if fmt == "table":
        from rich.console import Console  # lazy for start-up time
        from rich.table import Table

        table = Table(title=title, show_lines=False)
        for c in columns:
            table.add_column(c, overflow="fold")
        for r in rows:
            table.add_row(*("" if v is None else _cell(v) for v in r))
        if out is not None:
            with open(out, "w") as f:
                Console(file=f, width=200).print(table)
        else:
            # piped output (a file, `less`, a test) gets a wide table instead of wrapped cells
            Console(width=None if sys.stdout.isatty() else 240).print(table)
        return
    frame = _frame(columns, rows)
    if fmt == "parquet":
        frame.write_parquet(out)
    elif fmt == "csv":
        text = frame.write_csv()
        _write_text(text, out)
    else:  # json: one object per row, a JSON array
        text = json.dumps([dict(zip(columns, r, strict=True)) for r in rows], default=str, indent=1)
        _write_text(text + "\n", out)


def _write_text(text: str, out: Path | None) -> None:
    if out is None:
        sys.stdout.write(text)
    else:
        Path(out).write_text(text)


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, list):
        return ", ".join(map(str, v))
    return str(v)


def _when(t: float | None) -> str | None:
    return None if t is None else dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


@click.command("runs")
@db_option
@click.option("--status", type=click.Choice(["running", "completed", "failed", "preempted", "killed", "crashed"]))
@click.option("--project", "projects", multiple=True, help="Only runs of this project (repeat for several).")
@click.option("--group", "groups", multiple=True, help="Only runs of this group (repeat for several).")
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="Write to this file instead of stdout.")
def runs(db, status, projects, groups, fmt, out):
    """List runs with their status (a run silent for stale_after_s without run_end is `crashed`)."""
    try:
        with connect(db) as con:
            rows = list_runs(con, status=status, projects=projects, groups=groups)
    except StoreBusy as e:
        raise click.ClickException(str(e)) from None
    if fmt == "table":
        cols = ["run", "name", "status", "project", "group", "last_step", "started", "ended", "parent", "ladder", "tags"]
        data = [
            (
                r["run"],
                r["name"] if r["name"] != r["run"] else "",
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
        _emit(cols, data, fmt, out, title=f"{len(rows)} run(s) in {db}")
    else:
        cols = list(rows[0]) if rows else ["run", "status"]
        _emit(cols, [tuple(r[c] for c in cols) for r in rows], fmt, out)


@click.command("sql")
@click.argument("query")
@db_option
@click.option("--format", "fmt", type=click.Choice(FORMATS), default="table", show_default=True)
@click.option("--out", type=click.Path(path_type=Path), help="Write to this file instead of stdout.")
@click.option("--max-rows", type=int, default=None, help="Row cap (default: setting sql_max_rows).")
@click.option("--time-limit-ms", type=int, default=None, help="Time limit (default: setting sql_time_limit_ms).")
def sql(query, db, fmt, out, max_rows, time_limit_ms):
    """Run one read-only SQL QUERY over the store, e.g.

    observatory sql "SELECT run, name, value FROM latest_metrics WHERE name = 'train/loss'"

    Tables: runs, metrics, expert_load, events, rejected_events, ingest_files; views
    latest_metrics, run_drop_fraction (see the README for the schema).
    """
    try:
        res = run_user_sql(db, query, max_rows, time_limit_ms)
    except QueryError as e:
        raise click.ClickException(str(e)) from None
    except StoreBusy as e:
        raise click.ClickException(str(e)) from None
    _emit(res.columns, res.rows, fmt, out)
    if res.truncated:
        click.echo(
            f"(showing the first {len(res.rows)} rows; more matched. Raise --max-rows or the setting "
            "sql_max_rows, or add LIMIT/aggregate)",
            err=True,
        )


@click.command("settings")
def settings_cmd():
    """Show every setting, its current value and the environment variable that sets it."""
    _emit(["name", "value", "env", "help"], settings.describe(), "table", None, title="Observatory settings")
