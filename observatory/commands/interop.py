"""`observatory import wandb|tensorboard|jsonl PATH...` and `observatory export RUN`."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from observatory.commands import common_options
from observatory.commands.progress import bar, quiet_option
from observatory.interop import CONFLICT, ingest_runs

__all__ = ["import_group", "export"]

REPLACE_HELP = "Overwrite runs imported earlier from different data, then rebuild the store."


@click.group("import")
def import_group():
    """Import runs from Weights & Biases or TensorBoard (or our own exported jsonl).

    Each source run becomes a run in the runs dir (its own event log, like any run we
    train), then the store is updated. Importing the same run again changes nothing.
    """


def _report(results, verbose: bool, runs_dir, db, ingest: bool, quiet: bool = False) -> None:
    """Print one line per source run (-q: only failed ones) and its problems, update the store, set the exit code."""
    failed = 0
    for r in results:
        line = r.summary_line()
        if r.error:
            failed += 1
            click.secho(line, fg="red", err=True)
        elif not quiet:
            click.echo(line)
        shown = r.problems if verbose else r.problems[:10]
        for p in shown:
            click.secho(f"  unreadable: {p}", fg="yellow", err=True)
        if len(r.problems) > len(shown):
            click.secho(f"  ... {len(r.problems) - len(shown)} more (use --verbose)", fg="yellow", err=True)
    runs = {r.run for r in results if not r.error}
    click.echo(f"{len(runs)} run(s) imported from {len(results) - failed} source(s), {failed} failed")
    if ingest and any(r.written for r in results):
        _store(runs_dir, db, any(r.written == "replaced" for r in results), quiet)
    if failed:
        sys.exit(1)


def _store(runs_dir, db, rebuild: bool, quiet: bool) -> None:
    """Bring the store up to date with what was imported (a progress bar on a terminal)."""
    with bar("rebuild" if rebuild else "ingest", quiet) as progress:
        report = ingest_runs(runs_dir, db, rebuild=rebuild, progress=progress)
    click.echo(f"store {db}: {report.summary()}")


@import_group.command("wandb")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@common_options
@click.option("--no-ingest", is_flag=True, help="Write the event logs but do not update the store.")
@click.option("--replace", is_flag=True, help=REPLACE_HELP)
@click.option("-v", "--verbose", is_flag=True, help="List every unreadable region.")
@quiet_option()
def wandb_cmd(paths, runs_dir, db, no_ingest, replace, verbose, quiet):
    """Import W&B offline runs: `wandb/` folders, `offline-run-*` folders or `run-*.wandb` files.

    Each W&B run becomes run `wandb-<W&B id>`: history -> metrics at their steps, config ->
    run config (secrets redacted), summary and exit code -> run end. Histograms and media are
    skipped and counted. A damaged file imports what is valid and reports the byte offset of
    what is not; a truncated file (a crashed run) imports up to its last whole record.
    """
    from observatory.interop.wandb_import import find_wandb_files, import_wandb

    if not find_wandb_files(paths):
        raise click.UsageError(f"no .wandb files under {', '.join(map(str, paths))}")
    with bar("import", quiet, unit="files") as progress:
        results = import_wandb(paths, runs_dir, db, ingest=False, replace=replace, progress=progress)
    _report(results, verbose, runs_dir, db, not no_ingest, quiet)


@import_group.command("tensorboard")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@common_options
@click.option(
    "--status",
    type=click.Choice(["completed", "failed", "killed", "none"]),
    default="completed",
    show_default=True,
    help="Status for the run end (TensorBoard records none); 'none' writes no run end but a final failure: the runs show as crashed at their last event.",
)
@click.option("--no-ingest", is_flag=True, help="Write the event logs but do not update the store.")
@click.option("--replace", is_flag=True, help=REPLACE_HELP)
@click.option("-v", "--verbose", is_flag=True, help="List every problem.")
@quiet_option()
def tensorboard_cmd(paths, runs_dir, db, status, no_ingest, replace, verbose, quiet):
    """Import TensorBoard logs: one run per folder holding events.out.tfevents.* files.

    Scalars become metrics at their steps (run id `tb-<folder>`); histograms, images and
    text are skipped and counted.
    """
    from observatory.interop.tensorboard_import import find_tfevents_dirs, import_tensorboard

    if not find_tfevents_dirs(paths):
        raise click.UsageError(f"no tfevents files under {', '.join(map(str, paths))}")
    st = None if status == "none" else status
    with bar("import", quiet, unit="runs") as progress:
        results = import_tensorboard(
            paths, runs_dir, db, status=st, ingest=False, replace=replace, progress=progress
        )
    _report(results, verbose, runs_dir, db, not no_ingest, quiet)


@import_group.command("jsonl")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@common_options
@click.option("--no-ingest", is_flag=True, help="Write the event logs but do not update the store.")
@click.option("--replace", is_flag=True, help=REPLACE_HELP)
@quiet_option()
def jsonl_cmd(files, runs_dir, db, no_ingest, replace, quiet):
    """Import event logs exported with `observatory export RUN --format jsonl` (any runs, any hosts)."""
    from observatory.interop.export import import_events_jsonl

    states: dict = {}
    lines: list[tuple[str, bool]] = []  # printed after the bar: (line, is an error)
    with bar("import", quiet, unit="files") as progress:
        for i, f in enumerate(files):
            try:
                got = import_events_jsonl(f, runs_dir, replace=replace)
            except ValueError as e:
                raise click.ClickException(str(e)) from None
            for (run, host), state in sorted(got.items()):
                if state == "conflict":
                    lines.append((f"FAILED {f}: " + CONFLICT.format(run=f"{run} (host {host})"), True))
                else:
                    lines.append((f"{run} host {host} <- {f}: file {state}", False))
                states[(run, host)] = state
            if progress is not None:
                progress({"done": i + 1, "total": len(files), "unit": "files", "what": Path(f).name})
    for line, error in lines:
        if error:
            click.secho(line, fg="red", err=True)
        elif not quiet:
            click.echo(line)
    if not no_ingest and set(states.values()) - {"conflict"}:
        _store(runs_dir, db, "replaced" in states.values(), quiet)
    if "conflict" in states.values():
        sys.exit(1)


@click.command("export")
@click.argument("run", required=False)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["parquet", "csv", "jsonl"]),
    default="jsonl",
    show_default=True,
    help="jsonl: the run's events, all hosts merged, re-importable; parquet/csv: metrics (run, step, name, value, t, host).",
)
@click.option(
    "--out", type=click.Path(path_type=Path), help="Output file (default RUN.FORMAT; '-' for stdout)."
)
@click.option(
    "--partitioned",
    type=click.Path(path_type=Path, file_okay=False),
    help="Instead of one run: the whole store as Hive-partitioned Parquet, DIR/kind=<kind>/run=<run>/.",
)
@common_options
def export(run, fmt, out, partitioned, runs_dir, db):
    """Export a run's events (jsonl) or its metrics table (parquet, csv), or the store (--partitioned DIR)."""
    from observatory.interop.export import ExportError, export_partitioned, export_run

    if partitioned is not None:
        if run is not None or out is not None:
            raise click.UsageError("--partitioned DIR exports every run; give no RUN and no --out")
        try:
            res = export_partitioned(partitioned, db=db)
        except ExportError as e:
            raise click.ClickException(str(e)) from None
        rows = ", ".join(f"{n} {table}" for table, n in res.rows.items())
        click.echo(f"{res.runs} run(s) -> {res.out}: {res.files} parquet files ({rows} rows)")
        return
    if run is None:
        raise click.UsageError("give a RUN to export, or --partitioned DIR for the whole store")
    try:
        res = export_run(run, fmt, out, runs_dir=runs_dir, db=db)
    except ExportError as e:
        raise click.ClickException(str(e)) from None
    what = "events" if fmt == "jsonl" else "metric values"
    msg = f"{res.rows} {what} of {run} -> {res.out}"
    if res.skipped:
        msg += f" ({res.skipped} invalid or torn lines left out)"
    click.echo(msg, err=str(res.out) == "-")
    if fmt == "jsonl":
        from observatory import provenance

        click.echo(provenance.published(), err=str(res.out) == "-")
