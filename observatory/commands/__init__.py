"""Command modules for the `observatory` CLI, and the options they all share."""

from __future__ import annotations

from pathlib import Path

import click

from observatory import settings

__all__ = ["runs_dir_option", "db_option", "common_options"]


def runs_dir_option(f):
    return click.option(
        "--runs-dir",
        type=click.Path(path_type=Path),
        default=lambda: settings.get("runs"),
        show_default="data/runs, env OBSERVATORY_RUNS",
        help="Directory of event logs.",
    )(f)


def db_option(f):
    return click.option(
        "--db",
        type=click.Path(path_type=Path),
        default=lambda: settings.get("db"),
        show_default="data/observatory.duckdb, env OBSERVATORY_DB",
        help="The DuckDB store.",
    )(f)


def common_options(f):
    return runs_dir_option(db_option(f))
