"""The `observatory` command line: a router over command modules loaded lazily.

Each command lives in `observatory/commands/<area>.py`; importing one never pulls
in another's dependencies (the dashboard's Streamlit, the importers' wandb).
"""

from __future__ import annotations

import importlib

import click

# command name -> "module:attribute" (a click command or group)
COMMANDS = {
    "ingest": "observatory.commands.ingest:ingest",
    "rebuild": "observatory.commands.ingest:rebuild",
    "runs": "observatory.commands.read:runs",
    "sql": "observatory.commands.read:sql",
    "settings": "observatory.commands.read:settings_cmd",
    "ladder": "observatory.commands.ladder:ladder",
    "decide": "observatory.commands.decide:decide",
    "lineage": "observatory.commands.decide:lineage",
    "detect": "observatory.commands.detect:detect",
    "report": "observatory.commands.report:report",
    "import": "observatory.commands.interop:import_group",
    "export": "observatory.commands.interop:export",
    "simulate": "observatory.commands.simulate:simulate",
    "dashboard": "observatory.commands.dashboard:dashboard",
}

HELP = {
    "ingest": "Load event logs into the DuckDB store (incremental; --follow tails live runs).",
    "rebuild": "Recreate the store from the event logs.",
    "runs": "List runs with their status.",
    "sql": "Run a read-only SQL query over the store.",
    "settings": "Show every setting, its value and its environment variable.",
    "ladder": "Fit scaling ladders and forecast target runs.",
    "decide": "Decision history: new, update, show, list, export, import.",
    "lineage": "Show a run's lineage (parents through forks and resumes).",
    "detect": "Run the instability detectors over stored runs.",
    "report": "Write a post-mortem report for a run.",
    "import": "Import runs from Weights & Biases or TensorBoard.",
    "export": "Export a run's events as parquet, csv or jsonl, or the store as partitioned Parquet.",
    "simulate": "Write synthetic runs shaped like the 535B reference run (or tiny, or a ladder).",
    "dashboard": "Start the Streamlit dashboard.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        target = COMMANDS.get(name)
        if target is None:
            return None
        module, attr = target.split(":")
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("observatory"):
                return None  # command not built yet
            raise
        return getattr(mod, attr, None)

    def format_commands(self, ctx, formatter):
        rows = [(name, HELP.get(name, "")) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="observatory")
def main():
    """Observatory: a transparent training-log observatory for MoE language models.

    Event logs (the source of truth) live in the runs dir; the DuckDB store is an
    index over them. Every command takes --runs-dir and --db (env OBSERVATORY_RUNS,
    OBSERVATORY_DB).
    """


if __name__ == "__main__":
    main()
