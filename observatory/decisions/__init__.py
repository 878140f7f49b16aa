"""Decision history: experiments, interventions and policies as structured, queryable records.

- `record`: the `Decision` record and its parts (`Forecast`, `Trigger`, `RunLink`, `Cost`), validated;
- `store`: reading decisions from the store and writing them as `decision` events;
- `auto`: the after-ingest hook that records config changes and handled failures;
- `markdown`: export/import as Markdown files (and `decide new FILE`).

    from observatory import decisions
    from observatory.pipeline import ingest
    d = decisions.new(runs_dir, db, title="Enable z-loss", kind="intervention",
                      runs=[{"run": "d512", "step": 1200}], action="z_loss=1e-4", ingest=ingest)
    decisions.update(runs_dir, db, d.id, status="running", ingest=ingest)
"""

from observatory.decisions.auto import after_ingest
from observatory.decisions.record import (
    DECISIONS_RUN,
    KINDS,
    STATUSES,
    TRANSITIONS,
    Cost,
    Decision,
    Forecast,
    RunLink,
    Trigger,
    parse_run_link,
    slugify,
)
from observatory.decisions.store import (
    diff_fields,
    get,
    history,
    home_run,
    list_decisions,
    new,
    unique_id,
    update,
)

__all__ = [
    # the record (record.py)
    "Decision",
    "Forecast",
    "Trigger",
    "RunLink",
    "Cost",
    "KINDS",
    "STATUSES",
    "TRANSITIONS",
    "DECISIONS_RUN",
    "parse_run_link",
    "slugify",
    # reading and writing (store.py)
    "new",
    "update",
    "get",
    "list_decisions",
    "history",
    "home_run",
    "unique_id",
    "diff_fields",
    # the after-ingest hook (auto.py)
    "after_ingest",
]
