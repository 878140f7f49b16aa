"""Automatic decision records, the after-ingest hook: config changes and failures handled with an action.

A `config_diff` event becomes a proposed experiment that links the run and the run it
is compared against; a `failure` event with an action (other than `halt`) becomes a
running intervention triggered by it. Ids are deterministic (`auto-<run>-<seq>`,
with `h<host>-` before the seq for hosts other than 0), so the hook is idempotent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import replace

from observatory import findings
from observatory.decisions.record import DECISIONS_RUN, Decision, RunLink, Trigger
from observatory.decisions.store import write_events
from observatory.events import RUN_ID_RE
from observatory.queries import decisions as q
from observatory.store import using

__all__ = ["after_ingest", "AUTO_AUTHOR"]

AUTO_AUTHOR = "observatory"
NO_ACTION = ("", "halt", "none")  # failure actions that are not an intervention


def _auto_id(ev: dict) -> str:
    host = "" if ev["host"] == 0 else f"h{ev['host']}-"
    return f"auto-{ev['run']}-{host}{ev['seq']}"[:128]


def _auto_record(ev: dict) -> Decision | None:
    data, run, step = ev["data"], ev["run"], ev["step"]
    ref = {"event": {"run": run, "host": ev["host"], "seq": ev["seq"], "kind": ev["kind"], "step": step}}
    if ev["kind"] == "config_diff":
        changes = data.get("changes")
        against = data.get("against") or {}
        if not isinstance(changes, Mapping) or not changes:
            return None
        links = [RunLink(run, step)]
        if isinstance(against.get("run"), str) and RUN_ID_RE.match(against["run"]) and against["run"] != run:
            links.append(
                RunLink(against["run"], against.get("step") if isinstance(against.get("step"), int) else None)
            )
        where = f"{against.get('run')}@{against.get('step')}" if against else "its parent"
        keys = ", ".join(sorted(changes))
        return Decision(
            id=_auto_id(ev),
            title=f"Config change in {run} against {where}: {keys}"[:200],
            kind="experiment",
            status="proposed",
            hypothesis="Recorded automatically from a config_diff; state why these settings changed.",
            runs=tuple(links),
            config_diff={
                k: list(v) if isinstance(v, (list, tuple)) and len(v) == 2 else [None, v]
                for k, v in changes.items()
            },
            evidence=(ref,),
            author=AUTO_AUTHOR,
        )
    action = data.get("action")
    if not isinstance(action, str) or action.strip().lower() in NO_ACTION:
        return None
    ftype = str(data.get("type") or "failure")
    at = f" at step {step}" if step is not None else ""
    return Decision(
        id=_auto_id(ev),
        title=f"{action} after {ftype}{at} in {run}"[:200],
        kind="intervention",
        status="running",  # the action was taken; a person records whether it worked
        trigger=Trigger(
            "train/loss" if ftype == "nan_loss" else ftype, str(data.get("message") or "")[:2000], step
        ),
        action=action,
        runs=(RunLink(run, step),),
        evidence=(ref,),
        author=AUTO_AUTHOR,
    )


def after_ingest(
    db, runs_dir, touched_runs: Iterable[str] | None = None, *, now: float | None = None
) -> set[str]:
    """Create decision records for new config changes and for failures handled with an action.

    Call after an ingest pass with the runs it touched (None: all). `db` is a path or an
    open connection (pass the ingester's own connection while it holds the store: DuckDB
    will not open a second, read-only one in the same process). Ids are deterministic
    (`auto-<run>-<seq>`), so calling it twice writes nothing new. Returns the runs whose
    folders got new events: ingest those again so the records reach the store.
    """
    runs = None if touched_runs is None else sorted(set(touched_runs) - {DECISIONS_RUN})

    with using(db) as con:
        sources, known = q.auto_sources(con, runs), q.decision_ids(con)
    by_run: dict[str, list[tuple[dict, int | None]]] = {}
    now = time.time() if now is None else now
    file_ids: dict[str, set[str]] = {}
    for ev in sources:
        rec = _auto_record(ev)
        if rec is None or rec.id in known:
            continue
        run = ev["run"]
        if run not in file_ids:  # written by an earlier call but not ingested yet: keeps re-runs idempotent
            file_ids[run] = {str(e["data"].get("id")) for e in findings.pending(runs_dir, run, "decision")}
        if rec.id in file_ids[run]:
            continue
        rec = replace(
            rec, created=ev["t"] if ev["t"] is not None and math.isfinite(ev["t"]) else now, updated=now
        )
        by_run.setdefault(run, []).append((rec.to_dict(), ev["step"]))
    for run, items in by_run.items():
        write_events(runs_dir, run, items)
    return set(by_run)
