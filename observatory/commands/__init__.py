"""Command modules for the `observatory` CLI, and the options they all share."""

from __future__ import annotations

import functools
from pathlib import Path

import click

from observatory import bucket, settings

__all__ = ["runs_dir_option", "db_option", "common_options", "bucket_options", "RunsDir"]


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


class RunsDir(click.ParamType):
    """A runs dir: a local folder (a `Path`) or a bucket URL (`s3://bucket/prefix`, `gs://...`, kept a `str`)."""

    name = "path|url"

    def convert(self, value, param, ctx):
        try:
            return bucket.location(value)
        except ValueError as e:
            self.fail(str(e), param, ctx)


runs_dir_option = click.option(
    "--runs-dir",
    type=RunsDir(),
    default=lambda: settings.get("runs"),
    show_default=f"{settings.SETTINGS['runs'].default}, env {settings.SETTINGS['runs'].env}",
    help="Directory of event logs, or a bucket: s3://bucket/prefix, gs://bucket/prefix.",
)
db_option = _path_option("--db", "db", "The DuckDB store.")


def common_options(f):
    """--runs-dir and --db. A bucket runs dir reaches the command as the store's local mirror of it (what
    `ingest` copied there; the findings folder is the bucket's): commands that read run folders need one."""

    @functools.wraps(f)
    def local(*args, **kwargs):
        if isinstance(kwargs.get("runs_dir"), str):
            kwargs["runs_dir"] = bucket.mirror_of(kwargs["runs_dir"], Path(kwargs["db"]))
        return f(*args, **kwargs)

    return runs_dir_option(db_option(local))


def bucket_options(f):
    """--runs-dir and --db for a command that reads or writes a bucket runs dir itself (a URL stays one)."""
    return runs_dir_option(db_option(f))
