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



def current_states(con, ids: list[str] | None = None) -> list[dict[str, Any]]:
    """Folded state of every decision (or of `ids`), ordered by creation time then id."""
    sql = f"SELECT * FROM ({DECISIONS_SQL}) d"
    params: list[Any] = []
    if ids is not None:
        if not ids:
            return []
        sql += " WHERE id IN (SELECT unnest(?::VARCHAR[]))"
        params.append(list(ids))
    sql += " ORDER BY created, id"
    rows = con.execute(sql, params).fetchall()
    return [
        {
            "id": r[0],
            "state": json.loads(r[1]),
            "home_run": r[2],
            "created": r[3],
            "updated": r[4],
            "n_events": r[5],
        }
        for r in rows
    ]


def decision_events(con, decision_id: str) -> list[dict[str, Any]]:
    """Every event of one decision, in fold order: its visible history."""
    rows = con.execute(
        """
        SELECT run, host, seq, step, t, data FROM events
        WHERE kind = 'decision' AND data->>'$.id' = ?
        ORDER BY t, run, host, seq
        """,
        [decision_id],
    ).fetchall()
    return [
        {"run": r[0], "host": r[1], "seq": r[2], "step": r[3], "t": r[4], "data": json.loads(r[5])}
        for r in rows
    ]


def decision_ids(con) -> set[str]:
    rows = con.execute(
        "SELECT DISTINCT data->>'$.id' FROM events WHERE kind = 'decision' AND data->>'$.id' IS NOT NULL"
    ).fetchall()
    return {r[0] for r in rows}


def auto_sources(con, runs: list[str] | None) -> list[dict[str, Any]]:
    """`config_diff` and `failure` events (of `runs`, or all) that may need a decision record."""
    sql = """
        SELECT run, host, seq, kind, step, t, data FROM events
        WHERE kind IN ('config_diff', 'failure')
    """
    params: list[Any] = []
    if runs is not None:
        if not runs:
            return []
        sql += " AND run IN (SELECT unnest(?::VARCHAR[]))"
        params.append(list(runs))
    sql += " ORDER BY run, host, seq"
    return [
        {
            "run": r[0],
            "host": r[1],
            "seq": r[2],
            "kind": r[3],
            "step": r[4],
            "t": r[5],
            "data": json.loads(r[6]),
        }
        for r in con.execute(sql, params).fetchall()
    ]
