"""`observatory ingest` and `observatory rebuild`: event logs into the DuckDB store."""

from __future__ import annotations

import click

from observatory.commands import bucket_options
from observatory.commands.output import terminal_text
from observatory.commands.progress import bar, quiet_option
from observatory.store import StoreBusy

__all__ = ["ingest", "rebuild"]


@click.command("ingest")
@bucket_options
@click.option(
    "--follow", "-f", is_flag=True, help="Keep tailing live runs (every follow_interval_s) until Ctrl-C."
)
@quiet_option("No progress bar, nor each rejected line: only the summary and errors.")
def ingest(runs_dir, db, follow, quiet):
    """Load every event log under the runs dir into the store (incremental, exactly-once).

    The runs dir may be a bucket (s3://bucket/prefix, gs://bucket/prefix): its new chunks are copied
    into a mirror beside the store (DB.bucket/) and read from there; an idle pass is one LIST.

    Lines that break the event format are stored in `rejected_events` and printed
    as `file:line: reason`; the rest of each file is ingested. On a terminal a
    progress bar shows the bytes read and the time left (not with --follow).
    """
    from observatory.pipeline import (
        ingest as run_ingest,
    )  # lazy for start-up time (pyarrow, the hooks' polars)

    if follow:
        click.echo(f"following {runs_dir} into {db} (Ctrl-C to stop)", err=True)
    _announce(db, follow)
    try:
        with bar("ingest", quiet or follow) as progress:
            report = run_ingest(
                runs_dir, db, follow=follow, emit=_quiet if quiet else _err, progress=progress
            )
    except StoreBusy as e:
        raise click.ClickException(str(e)) from None
    click.echo(terminal_text(report.summary()), err=True)  # (it names skipped files)
    _fail_on_dropped(report)


@click.command("rebuild")
@bucket_options
@quiet_option("No progress bar, nor each rejected line: only the summary and errors.")
def rebuild(runs_dir, db, quiet):
    """Recreate the store from the event logs (built aside, then swapped in atomically)."""
    from observatory.pipeline import rebuild as run_rebuild  # lazy for start-up time (see `ingest`)

    _announce(db, False)
    try:
        with bar("rebuild", quiet) as progress:
            report = run_rebuild(runs_dir, db, emit=_quiet if quiet else _err, progress=progress)
    except StoreBusy as e:
        raise click.ClickException(str(e)) from None
    click.echo(terminal_text(f"rebuilt {db}: {report.summary()}"), err=True)
    _fail_on_dropped(report)


def _announce(db, always: bool) -> None:
    """Say where this process's alerts go before it sends any: the store's channels (`ingest --follow`
    says it even when there are none; a one-off ingest only when there are)."""
    from observatory.alerts import rules

    line = rules.announce(rules.path_for(db))
    if always or not line.startswith("alerts: sending to no channel") or " is not read " in line:
        click.echo(line, err=True)


def _fail_on_dropped(report) -> None:
    """Exit 1 only when data could not be stored, saying exactly what: files skipped whole, and folders whose
    name is no run id (none of their lines can be stored). A bad line is quarantined in `rejected_events`
    and counted in the summary (its file's other lines stored): that is no failure of the ingest."""
    what = []
    if report.skipped:
        what.append(f"{len(report.skipped)} file(s) not ingested (see above)")
    if report.bad_run_ids:
        what.append(
            f"the lines of {len(report.bad_run_ids)} run folder(s) whose name is not a run id: rename "
            "the folder and its events' `run` to a run id ([A-Za-z0-9._-]{1,128}, e.g. "
            "1e18 for 1e+18), then ingest again"
        )
    if what:
        raise click.ClickException("not stored: " + "; ".join(what))


def _err(msg: str) -> None:
    click.echo(
        terminal_text(msg), err=True
    )  # names a log writer chose: no escape sequence reaches the terminal


def _quiet(msg: str) -> None:
    """-q: every message but those about rejected lines (the summary counts them): errors and notes stay."""
    from observatory.ingest.model import Rejection

    if not isinstance(msg, Rejection):
        click.echo(terminal_text(msg), err=True)
