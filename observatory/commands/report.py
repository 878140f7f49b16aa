"""`observatory report RUN [--out DIR] [--format html|md|pdf]`: a post-mortem in one command."""

from __future__ import annotations

from pathlib import Path

import click

from observatory import decisions
from observatory.commands import common_options
from observatory.pipeline import ingest

__all__ = ["report"]


def _refresh(runs_dir: Path, db: Path) -> None:
    """Bring the store up to date first, so a report right after a run has all of it.

    Two passes: the first one's hooks (detectors, automatic decisions) write their
    findings as events, and the second pass ingests those.
    """
    if not Path(runs_dir).is_dir():
        return
    first = ingest(runs_dir, db)
    decisions.after_ingest(db, runs_dir, first.runs or None)
    ingest(runs_dir, db)


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
@click.option(
    "--ingest/--no-ingest", "do_ingest", default=True, show_default=True, help="ingest new events first"
)
@common_options
def report(run, out_dir, fmt, do_ingest, runs_dir, db):
    """Write a post-mortem report for RUN: what happened and when, with figures.

    HTML is one self-contained file that works offline; Markdown comes with PNG
    figures; PDF is the HTML printed by headless chromium.
    """
    from observatory import report as rep  # lazy for start-up time: every command loads this module

    if do_ingest:
        _refresh(runs_dir, db)
    try:
        path = rep.write(db, run, out_dir, fmt)
    except (ValueError, RuntimeError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(str(path))
