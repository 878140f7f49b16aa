"""Decisions read from the store and written as `decision` events.

A decision is written as `decision` events (see EVENTS.md): the first carries the
whole record, every later one only the fields it changes, so each decision's own
history stays visible in the log. The store folds them into the current state
(`observatory.queries.decisions.DECISIONS_SQL`).

Events go, as host `OBSERVATORY_HOST`, into the folder of the first linked run,
or into the pseudo-run folder `decisions/` (no `run_start`) when no linked run
exists locally. Updates go to the folder the decision was created in.

Writing does not ingest: pass `ingest` (a callable taking `(runs_dir, db)`, e.g.
`observatory.pipeline.ingest`) to `new` and `update` to bring the store up to date
after they wrote, so the record can be read back at once.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from observatory import findings
from observatory.decisions.record import DECISIONS_RUN, Decision, slugify
from observatory.queries import decisions as q
from observatory.store import using

__all__ = [
    "Ingest",
    "get",
    "list_decisions",
    "history",
    "home_run",
    "unique_id",
    "new",
    "update",
    "diff_fields",
    "folder_for",
    "event_step",
    "write_events",
]

Ingest = Callable[[Any, Any], object]  # (runs_dir, db) -> anything: brings the store up to date


def _state_to_decision(row: dict) -> Decision:
    state = dict(row["state"])
    state["created"] = row["created"]
    state["updated"] = row["updated"]
    return Decision.from_dict(state)


def get(db, decision_id: str) -> Decision | None:
    """The current state of one decision, or None. `db` is a store path or an open connection."""
    with using(db) as con:
        rows = q.current_states(con, [decision_id])
    return _state_to_decision(rows[0]) if rows else None


def list_decisions(
    db,
    *,
    status: str | None = None,
    kind: str | None = None,
    run: str | None = None,
    unreadable: list[tuple[str, str]] | None = None,
) -> list[Decision]:
    """Every decision's current state, oldest first, optionally filtered.

    A folded state that is not a valid record (a foreign log's decision event with an
    unknown status, say) is left out rather than failing the whole list: its
    `(id, reason)` is appended to `unreadable` when a list is given, so callers can show it.
    """
    out = []
    with using(db) as con:
        for r in q.current_states(con):
            try:
                out.append(_state_to_decision(r))
            except ValueError as e:
                if unreadable is not None:
                    unreadable.append((str(r["id"]), str(e)))
    return [
        d
        for d in out
        if (status is None or d.status == status)
        and (kind is None or d.kind == kind)
        and (run is None or any(link.run == run for link in d.runs))
    ]


def history(db, decision_id: str) -> list[dict]:
    """One decision's events in order: [{run, host, seq, step, t, data}]."""
    with using(db) as con:
        return q.decision_events(con, decision_id)


def home_run(db, decision_id: str) -> str | None:
    """The run folder a decision was created in (where its updates go), or None if unknown."""
    with using(db) as con:
        rows = q.current_states(con, [decision_id])
    return rows[0]["home_run"] if rows else None


def write_events(runs_dir, run: str, items: list[tuple[dict, int | None]]) -> None:
    """Append `(data, step)` decision events to the run's observatory-host file."""
    findings.write(runs_dir, run, "decision", items)


def folder_for(runs_dir, d: Decision) -> str:
    """The folder a new decision's events go to: its first linked run found locally, else `decisions/`."""
    for link in d.runs:
        if (Path(runs_dir) / link.run).is_dir():
            return link.run
    return DECISIONS_RUN


def event_step(d: Decision) -> int | None:
    """The step of a decision's first event: that of its first linked run."""
    return d.runs[0].step if d.runs else None


def unique_id(db, title: str) -> str:
    """A slug of the title not yet used by a decision in the store (`-2`, `-3`... when taken)."""
    with using(db) as con:
        taken = q.decision_ids(con)
    base = slugify(title)
    cand, n = base, 2
    while cand in taken:
        cand, n = f"{base}-{n}", n + 1
    return cand


def new(runs_dir, db, *, ingest: Ingest | None = None, now: float | None = None, **fields_: Any) -> Decision:
    """Record a new decision (validated) and write its first event; then `ingest(runs_dir, db)` if given.

    `fields_` are Decision fields; `id` defaults to a slug of the title. Raises
    ValueError for bad fields or an id already in use.
    """
    now = time.time() if now is None else now
    if not fields_.get("id"):
        fields_["id"] = unique_id(db, str(fields_.get("title") or ""))
    elif get(db, fields_["id"]) is not None:
        raise ValueError(f"decision {fields_['id']!r} already exists; use `decide update`")
    fields_.setdefault("created", now)
    fields_.setdefault("updated", fields_["created"])
    d = Decision(**fields_)
    write_events(runs_dir, folder_for(runs_dir, d), [(d.to_dict(), event_step(d))])
    if ingest is not None:
        ingest(runs_dir, db)
    return d


def diff_fields(old: Decision, new_: Decision) -> dict[str, Any]:
    """The payload fields in which two records differ (None for a field that was cleared)."""
    a, b = old.to_dict(times=False), new_.to_dict(times=False)
    return {k: b.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def update(
    runs_dir, db, decision_id: str, *, ingest: Ingest | None = None, now: float | None = None, **changes: Any
) -> Decision:
    """Change fields of a decision: validates the status transition, writes one event with the changes.

    Writes nothing (and does not ingest) when nothing changes; returns the new state.
    """
    cur = get(db, decision_id)
    if cur is None:
        raise ValueError(
            f"no decision {decision_id!r} in the store (run `observatory ingest` if it was just written)"
        )
    if "id" in changes and changes["id"] != decision_id:
        raise ValueError("a decision's id cannot change; record a new decision instead")
    if "status" in changes:
        cur.check_transition(changes["status"])
    now = time.time() if now is None else now
    if cur.updated is not None and now < cur.updated:
        raise ValueError(
            f"decision {decision_id}: an update at {now:.0f} would come before its last change "
            f"(at {cur.updated:.0f}); changes are recorded in order"
        )
    nxt = replace(cur, **changes, updated=now)
    delta = diff_fields(cur, nxt)
    if not delta:
        return cur
    write_events(
        runs_dir,
        home_run(db, decision_id) or DECISIONS_RUN,
        [({"id": decision_id, **delta, "updated": now}, None)],
    )
    if ingest is not None:
        ingest(runs_dir, db)
    return nxt
