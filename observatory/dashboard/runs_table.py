"""The run table every page starts from: one row per run, shaped for display, and how long ago things happened."""

from __future__ import annotations

import time
from typing import Any

from observatory.dashboard.cache import query_all
from observatory.queries import core
from observatory.queries import dashboard as qd

__all__ = ["PAGE", "runs_table", "runs_calls", "run_row", "is_running", "ago"]

PAGE = 50  # runs a table page or a picker shows at once: a lab's 10^5 runs are searched, not listed


def runs_calls(
    search: str | None = None,
    status=None,
    projects=(),
    groups=(),
    ladders=(),
    tags=(),
    limit: int = PAGE,
    offset: int = 0,
    runs=None,
    name: str | None = None,
) -> tuple[tuple, ...]:
    """The run table's query, for a page that batches it with its own on one connection.

    `core.search_runs` is the one run search (server-side: a page never loads every run) and the one
    definition of a run's status (a silent run without run_end is `crashed`) for the CLI and the dashboard.
    """
    return (
        (
            core.search_runs,
            search,
            status,
            list(projects),
            list(groups),
            list(ladders),
            list(tags),
            limit,
            offset,
            None,
            None if runs is None else list(runs),
            name,
        ),
    )


def runs_table(keep_fresh: bool = False, **search: Any) -> list[dict[str, Any]]:
    """A page of runs (`runs_calls`' arguments: a search, filters, `limit` and `offset`) as dicts: run, name,
    status (crashed when stale), last_step, steps, progress, last_loss, tokens, ladder, tags, project, group,
    start_time, last_event_t, parent, redactions; newest first. `keep_fresh`: the cache's keeper refills
    these queries after each commit while they are asked for."""
    (rows,) = query_all(*runs_calls(**search), keep_fresh=keep_fresh)
    ids = [r["run"] for r in rows]
    extras = query_all((qd.runs_extras, ids), keep_fresh=keep_fresh)[0].to_dicts() if ids else []
    extras = {r["run"]: r for r in extras}
    out = []
    for r in rows:
        x = extras.get(r["run"], {})
        steps = x.get("planned_steps") or r.get("final_step")
        last = r.get("last_step") if r.get("last_step") is not None else x.get("last_metric_step")
        done = r.get("status") == "completed"
        progress = 1.0 if done else (min(1.0, (last + 1) / steps) if steps and last is not None else None)
        ladder = " / ".join(str(v) for v in (r.get("ladder_name"), r.get("ladder_rung")) if v)
        out.append(
            {
                "run": r["run"],
                "name": r.get("name") or r["run"],
                "status": r.get("status") or "unknown",
                "last_step": last,
                "steps": steps,
                "progress": progress,
                "last_loss": x.get("last_loss"),
                "tokens": x.get("tokens"),
                "ladder": ladder or None,
                "tags": list(r.get("tags") or []),
                "project": r.get("project"),
                "group": r.get("run_group"),
                "start_time": r.get("start_time"),
                "last_event_t": r.get("last_event_t") or x.get("last_metric_t"),
                "parent": r.get("parent_run"),
                "redactions": x.get("redactions") or 0,
            }
        )
    return out


def run_row(run: str, keep_fresh: bool = False) -> dict[str, Any] | None:
    """One run's `runs_table` row (None when the store has no such run)."""
    rows = runs_table(keep_fresh, runs=[run], limit=1)
    return rows[0] if rows else None


def is_running(row: dict[str, Any] | None) -> bool:
    """Whether a run (its `runs_table` row) is running: its pages refresh and are kept fresh."""
    return row is not None and row["status"] == "running"


def ago(t: float | None, now: float | None = None) -> str:
    """'12 s ago', '3 min ago', '2.1 h ago', '4 d ago' (or 'never')."""
    if t is None:
        return "never"
    dt = max(0.0, (now or time.time()) - t)
    if dt < 90:
        return f"{dt:.0f} s ago"
    if dt < 5400:
        return f"{dt / 60:.0f} min ago"
    if dt < 172800:
        return f"{dt / 3600:.1f} h ago"
    return f"{dt / 86400:.0f} d ago"
