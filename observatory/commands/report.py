"""`observatory report RUN [--out DIR] [--format html|md|pdf]`: a post-mortem in one command."""

from __future__ import annotations

from pathlib import Path

import click

from observatory.commands import db_option

__all__ = ["report"]


@click.command("report")
@click.argument("run")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("data/reports"),
    show_default=True,
    help="folder for <run>.html|md|pdf (Markdown figures go in <run>_figures/)",
)
@click.option("--format", "fmt", type=click.Choice(("html", "md", "pdf")), default="html", show_default=True)
@db_option
def report(run, out_dir, fmt, db):
    """Write a post-mortem report for RUN: what happened and when, with figures.

    HTML is one self-contained file that works offline; Markdown comes with PNG
    figures; PDF is the HTML printed by headless chromium.
    """
    from observatory import report as rep

    try:
        path = rep.write(db, run, out_dir, fmt)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(str(path))
