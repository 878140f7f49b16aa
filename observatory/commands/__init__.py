"""Command modules for the `observatory` CLI, and the options they all share."""

from __future__ import annotations

from pathlib import Path

import click

from observatory import settings

__all__ = ["runs_dir_option", "db_option", "common_options"]


def _path_option(flag: str, setting: str, help: str):
    """A path option defaulting to a setting, read when the command runs (so its env var applies)."""
    s = settings.SETTINGS[setting]
    return click.option(
        flag,
        type=click.Path(path_type=Path),
        default=lambda: settings.get(setting),
        show_default=f"{s.default}, env {s.env}",
        help=help,
    )


runs_dir_option = _path_option("--runs-dir", "runs", "Directory of event logs.")
db_option = _path_option("--db", "db", "The DuckDB store.")


def common_options(f):
    return runs_dir_option(db_option(f))
