"""Observatory: a transparent training-log observatory for Mixture-of-Experts language models.

Write events with `init`, wandb's way (`import observatory as wandb` runs a W&B training
loop unchanged; see `observatory.integrations.wandb_api`) or ours; read the store with `connect`:

    import observatory
    with observatory.init(name="my-run", config={"lr": 3e-4}) as run:
        run.log({"train/loss": 2.5}, step=1)
    con = observatory.connect()          # read-only DuckDB connection

The layout, one stage of the flow per package; each imports only itself and the lines before it:

    events, settings, redact    the event-log contract, the settings table, secret redaction
    writer, findings            writing event logs; the observatory's own events (host 1000)
    store/                      DuckDB: connection (flock turnstile), schema, rollups
    queries/                    every SQL read the CLI, reports and pages make
    detect/ ladder/ decisions/  findings: instability detectors, ladder fits and watch, decision records
    ingest/                     logs -> store in short transactions; hooks run the findings stages
    report/ interop/ lineage    post-mortems; imports, exports, simulator, W&B mirror; run lineage;
      markup                    log text made inert for Markdown and HTML
    dashboard/ integrations/    Streamlit pages over queries; wandb-compatible API, Levanter tracker
    commands/ cli demo          the `observatory` command line and `make demo`
    docs                        the generated sections of docs/cli.md and docs/schema.md
"""

from __future__ import annotations

from observatory.integrations import wandb_api
from observatory.integrations.wandb_api import (
    ConfigError,
    Error,
    Settings,
    define_metric,
    finish,
    init,
    log,
    watch,
)
from observatory.store import connect
from observatory.writer import Run

__all__ = [
    "init",
    "log",
    "finish",
    "define_metric",
    "watch",
    "run",
    "config",
    "summary",
    "Error",
    "ConfigError",
    "Settings",
    "Run",
    "connect",
]
__version__ = "0.1.0"

run: wandb_api.Run | wandb_api.DisabledRun | None = None
config: object = wandb_api.PreInit("wandb.config")
summary: object = wandb_api.PreInit("wandb.summary")


def _rebind(active: wandb_api.Run | wandb_api.DisabledRun | None) -> None:
    """Point `run`, `config` and `summary` at the active run (None and wandb's pre-init errors without one)."""
    global run, config, summary
    run = active
    config = active.config if active is not None else wandb_api.PreInit("wandb.config")
    summary = active.summary if active is not None else wandb_api.PreInit("wandb.summary")


wandb_api.on_active_change(_rebind)
