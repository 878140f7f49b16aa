"""Secrets in what the bulk path stores: metric names, hidden in the batch's transaction.

`check_line` scrubs every event payload it stores (`observatory.redact.scrub_event`); metrics
and expert loads are numbers, so the only text `msgspec_lines` stores is metric names, and this
scrubs those.
"""

from __future__ import annotations

from observatory.ingest.model import Batch
from observatory.redact import scrub_text
from observatory.store.rollups import LOCAL_ROWID

__all__ = ["redact_metric_names", "added_names"]

CLEAN_MAX = 100_000  # metric names kept as known clean; past it the set starts again


def redact_metric_names(con, b: Batch, clean: set[str] | None = None) -> None:
    """Hide credential-shaped text in the metric names this transaction added (values are numbers).

    Both paths (`msgspec_lines`, `check_line`) append to `metrics`; the
    names it added are the distinct names of the transaction's local rows (rowid >=
    LOCAL_ROWID), so one query covers them all (`added_names`). Each hidden name counts once per row.
    `clean`: the ingester's metric names known to hold no secret (read and added to; bounded by CLEAN_MAX).
    """
    clean = set() if clean is None else clean
    if not b.touched["metrics"]:
        return
    for name in added_names(con, b):
        if name in clean:
            continue
        hidden, n = scrub_text(name)
        if not n:
            if len(clean) > CLEAN_MAX:
                clean.clear()
            clean.add(name)
            continue
        where = f"rowid >= {LOCAL_ROWID} AND name = $old"
        hits = con.execute(
            f"SELECT run, count(*) FROM metrics WHERE {where} GROUP BY run", {"old": name}
        ).fetchall()
        if not hits:
            continue  # a name of a run's layout that its rows do not use
        for run, rows in hits:
            b.hid(run, rows)
        con.execute(f"UPDATE metrics SET name = $new WHERE {where}", {"old": name, "new": hidden})


def added_names(con, b: Batch) -> set[str]:
    """The distinct metric names of the transaction's local `metrics` rows (one DISTINCT over them)."""
    return {
        r[0]
        for r in con.execute(f"SELECT DISTINCT name FROM metrics WHERE rowid >= {LOCAL_ROWID}").fetchall()
    }
