"""SQL for the decision history: each decision's current state and its events.

A decision is a series of `decision` events sharing `data.id`; each event carries
only the fields it sets. The current state is the fold of those events in order
(t, run, host, seq): for every key, the value from the last event that wrote it.
`observatory.store.schema.DECISIONS_SQL` does that fold in DuckDB (the store's
`decisions` view is that query); the functions here read through it.
"""

from __future__ import annotations

import json
from typing import Any

from observatory.store.schema import DECISIONS_SQL

__all__ = [
    "current_states",
    "decision_events",
    "decision_ids",
    "auto_sources",
]


def _dicts(con, sql: str, params: list[Any], json_cols: tuple[str, ...]) -> list[dict[str, Any]]:
    """Rows as dicts keyed by column name, with the JSON columns decoded."""
    cur = con.execute(sql, params)
    cols = [d[0] for d in cur.description]
    return [
        {c: json.loads(v) if c in json_cols and v is not None else v for c, v in zip(cols, r, strict=True)}
        for r in cur.fetchall()
    ]


def current_states(con, ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Folded state of every decision (or of `ids`), ordered by creation time then id."""
    if ids is not None and not ids:
        return []
    only = "" if ids is None else "WHERE id IN (SELECT unnest(?::VARCHAR[]))"
    return _dicts(
        con,
        f"""SELECT id, state, home_run, created, updated, n_events FROM ({DECISIONS_SQL}) d {only}
            ORDER BY created, id""",
        [] if ids is None else [list(ids)],
        ("state",),
    )


def decision_events(con, decision_id: str) -> list[dict[str, Any]]:
    """Every event of one decision, in fold order: its visible history."""
    return _dicts(
        con,
        """SELECT run, host, seq, step, t, data FROM events
           WHERE kind = 'decision' AND data->>'$.id' = ? ORDER BY t, run, host, seq""",
        [decision_id],
        ("data",),
    )


def decision_ids(con) -> set[str]:
    rows = con.execute(
        "SELECT DISTINCT data->>'$.id' FROM events WHERE kind = 'decision' AND data->>'$.id' IS NOT NULL"
    ).fetchall()
    return {r[0] for r in rows}


def auto_sources(con, runs: list[str] | None) -> list[dict[str, Any]]:
    """`config_diff` and `failure` events (of `runs`, or all) that may need a decision record."""
    if runs is not None and not runs:
        return []
    only = "" if runs is None else "AND run IN (SELECT unnest(?::VARCHAR[]))"
    return _dicts(
        con,
        f"""SELECT run, host, seq, kind, step, t, data FROM events
            WHERE kind IN ('config_diff', 'failure') {only} ORDER BY run, host, seq""",
        [] if runs is None else [list(runs)],
        ("data",),
    )
