"""`observatory detect [RUN...]`: run the instability detectors over stored runs.

New findings are written as `anomaly` events into each run's events.1000.jsonl;
`--ingest` stores them right away (otherwise the next `observatory ingest` does).
Running it twice writes nothing new the second time.
"""

from __future__ import annotations

import json

import click

from observatory.alerts.rules import thresholds_of
from observatory.commands import common_options
from observatory.detect import scan
from observatory.detect.thresholds import Thresholds
from observatory.pipeline import ingest

__all__ = ["detect"]


@click.command("detect")
@click.argument("runs", nargs=-1)
@common_options
@click.option(
    "--full", is_flag=True, help="Rescan every step instead of continuing from the last scanned step."
)
@click.option(
    "--ingest", "do_ingest", is_flag=True, help="Ingest the runs dir first and store the findings after."
)
@click.option("--dry-run", is_flag=True, help="Print findings without writing them.")
@click.option("--json", "as_json", is_flag=True, help="Print the new findings as JSON lines.")
@click.option(
    "--fail-on",
    type=click.Choice(["info", "warn", "critical"]),
    default=None,
    help="Exit 1 when a new finding has this severity or a worse one (for cron jobs and CI).",
)
def detect(runs, runs_dir, db, full, do_ingest, dry_run, as_json, fail_on):
    """Run the instability detectors over RUNS (default: every stored run).

    Thresholds are the `anomaly_*` settings (see `observatory settings`), each
    overridable by its environment variable, e.g. OBSERVATORY_ANOMALY_LOSS_Z=8.
    """
    try:
        th = Thresholds.from_settings()
    except ValueError as e:
        raise click.UsageError(str(e)) from None
    if do_ingest:
        ingest(runs_dir, db, hooks=False)  # this command reports what it finds, not the hook
    if not db.exists():
        raise click.UsageError(f"no store at {db}; run `observatory ingest --runs-dir {runs_dir}` first")
    found = scan.detect(
        db,
        runs_dir,
        runs or None,
        thresholds=th,
        full=full,
        write=not dry_run,
        progress=scan.Progress(thresholds_of),
    )
    if as_json:
        for row in scan.finding_rows(found):
            click.echo(json.dumps(row, default=str))
    else:
        for f in found:
            click.echo(f"{f.run}  step {f.step:>7}  {f.severity:<8} {f.detector:<20} {f.message}")
        verb = "found (not written)" if dry_run else "written"
        click.echo(f"{len(found)} new finding(s) {verb}", err=as_json)
    if found and not dry_run:
        if do_ingest:
            ingest(runs_dir, db)
        elif not as_json:
            click.echo("run `observatory ingest` to store them", err=True)
    rank = {"info": 0, "warn": 1, "critical": 2}
    if fail_on is not None and any(rank.get(f.severity, 0) >= rank[fail_on] for f in found):
        worst = max(found, key=lambda f: rank.get(f.severity, 0)).severity
        click.echo(f"exit 1: a new finding is {worst} (--fail-on {fail_on})", err=True)
        raise SystemExit(1)
