"""The run table every page starts from: one row per run, shaped for display, and how long ago things happened."""

from __future__ import annotations

import time
from typing import Any

from observatory.dashboard.cache import query_all
from observatory.queries import core
from observatory.queries import dashboard as qd

__all__ = ["runs_table", "runs_calls", "is_running", "ago"]


def runs_calls() -> tuple[tuple, ...]:
    """The run table's queries, for a page that batches them with its own on one connection.

    `core.list_runs` is the one definition of a run's status (a silent run without
    run_end is `crashed`) for the CLI and the dashboard.
    """
    return ((core.list_runs,), (qd.runs_extras,))


def runs_table(keep_fresh: bool = False) -> list[dict[str, Any]]:
    """Every run as a dict: run, name, status (crashed when stale), last_step, steps, progress,
    last_loss, tokens, ladder, tags, project, group, start_time, last_event_t, parent, redactions; newest first.
    `keep_fresh`: the cache's keeper refills these queries after each commit while they are asked for."""

    rows, extras = query_all(*runs_calls(), keep_fresh=keep_fresh)
    extras = {r["run"]: r for r in extras.to_dicts()}
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
    out.sort(key=lambda r: -(r["start_time"] or r["last_event_t"] or 0))
    return out


def is_running(runs: list[dict[str, Any]], run: str) -> bool:
    """Whether `run` is running in `runs` (a `runs_table()`): its pages refresh and are kept fresh."""
    return next((r["status"] for r in runs if r["run"] == run), None) == "running"


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
