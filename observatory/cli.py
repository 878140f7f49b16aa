"""The `observatory` command line: a router over the command modules in `observatory/commands/`.

Each command lives in `observatory/commands/<area>.py` and imports its heavy
dependencies (the dashboard's Streamlit, the importers' wandb, DuckDB, scipy)
inside the command, so loading every command module for `--help` stays cheap.
"""

from __future__ import annotations

import gc

import click

from observatory.commands import (
    alerts,
    dashboard,
    decide,
    detect,
    ingest,
    interop,
    ladder,
    read,
    report,
    simulate,
    sweeps,
)
from observatory.store import StoreBusy, StoreUnusable

# command name -> click command or group, in the order `--help` lists them
COMMANDS: dict[str, click.Command] = {
    "ingest": ingest.ingest,
    "rebuild": ingest.rebuild,
    "runs": read.runs,
    "sql": read.sql,
    "settings": read.settings_cmd,
    "ladder": ladder.ladder,
    "isoflop": sweeps.isoflop,
    "sweep": sweeps.sweep,
    "decide": decide.decide,
    "lineage": decide.lineage,
    "detect": detect.detect,
    "report": report.report,
    "alerts": alerts.alerts,
    "metrics": alerts.metrics,
    "goodput": alerts.goodput,
    "import": interop.import_group,
    "export": interop.export,
    "simulate": simulate.simulate,
    "dashboard": dashboard.dashboard,
}

HELP = {
    "ingest": "Load event logs into the DuckDB store (incremental; --follow tails live runs).",
    "rebuild": "Recreate the store from the event logs.",
    "runs": "List runs with their status.",
    "sql": "Run a read-only SQL query over the store.",
    "settings": "Show every setting, its value and its environment variable.",
    "ladder": "Fit scaling ladders and forecast target runs.",
    "isoflop": "Iso-FLOP fit of a selection: compute-optimal params and tokens per budget, the frontier.",
    "sweep": "Many-run views of a selection: runs, curves, table, values, compare (variant vs baseline).",
    "decide": "Decision history: new, update, show, list, export, import.",
    "lineage": "Show a run's lineage (parents through forks and resumes).",
    "detect": "Run the instability detectors over stored runs.",
    "report": "Write a post-mortem report for a run.",
    "alerts": "Alerts: list open ones, evaluate now, silence, disable or enable a rule, test the channels.",
    "metrics": "Serve each live run's health at /metrics for Prometheus.",
    "goodput": "Where each run's wall time went (productive steps and each kind of lost time).",
    "import": "Import runs from Weights & Biases or TensorBoard.",
    "export": "Export a run's events as parquet, csv or jsonl, or the store as partitioned Parquet.",
    "simulate": "Write synthetic runs shaped like the 535B reference run (or tiny, or a ladder).",
    "dashboard": "Start the Streamlit dashboard.",
}


def one_line(e: BaseException) -> str:
    """An unexpected error as one line: `path: reason` for a file, else `Type: first line of the message`."""
    if isinstance(e, (StoreBusy, StoreUnusable)):
        return str(e)
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        return f"{e.filename}: {e.strerror}"
    text = str(e).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {first}" if first else type(e).__name__


class Commands(click.Group):
    """The commands of COMMANDS in its order, each listed with its line of HELP.

    An error no command turned into a message is still one line and exit status 1,
    not a traceback; `observatory --traceback ...` shows the traceback instead.
    """

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:
            if ctx.params.get("traceback"):
                raise
            raise click.ClickException(one_line(e)) from None

    def list_commands(self, ctx):
        return list(COMMANDS)

    def format_commands(self, ctx, formatter):
        rows = [(name, HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=Commands, commands=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="observatory")
@click.option("--traceback", is_flag=True, help="Show the Python traceback of an unexpected error.")
def main(traceback):
    """Observatory: a transparent training-log observatory for MoE language models.

    Event logs (the source of truth) live in the runs dir; the DuckDB store is an
    index over them. Every command that reads or writes them takes --runs-dir and
    --db (env OBSERVATORY_RUNS, OBSERVATORY_DB).
    """


# The one piece of process-wide tuning, set by `run` and never at import: Python runs a full collection
# (a walk over every object alive) after every 10 collections of its middle generation. A catch-up of 10^5
# small runs keeps each batch's thousands of per-file objects (file states, store rows, lifecycle events,
# the detectors' per-run scans) alive long enough to reach the oldest generation, so a full pass ran every
# few thousand allocations: 75 of them, 0.01-0.2 s each as the detectors' state grew. After every 1,000
# instead (Python's thresholds otherwise): a 100,000-run catch-up took 89-90 s against 103 s, one process
# side by side from a warm page cache, and 86-89 s with the collector off; one run's catch-up has little to
# gain or lose (its full passes cost 0.06 s in all). The target it is for: the same bytes as 100,000 runs against as one run,
# <= 2x (bench/bench_many_runs.py; bench/HISTORY.md, "The collector's full passes, again"). No other tuning
# (threads, allocator, exit paths): none moved a figure a user sees.
FULL_COLLECTION_AFTER = 1000  # middle-generation collections between full ones (Python's default: 10)


def run() -> None:
    """The `observatory` command as a process (the console script, `python -m observatory.cli`)."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, FULL_COLLECTION_AFTER)
    main()


if __name__ == "__main__":
    run()
