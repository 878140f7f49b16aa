"""The `runs` table: one row per run, folded from each batch's lifecycle events and activity.

Lifecycle events: `run_start`, `run_end` and a `failure` with `final: true` (its writer stopped
there without a run_end: the run is `crashed` at that event's time, as a run_end ends it).
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from observatory import settings
from observatory.events import OBSERVATORY_HOST, json_text
from observatory.ingest.model import Batch
from observatory.ingest.rules import I64
from observatory.store import RUN_COLUMNS, RUN_JSON_COLUMNS, crashed_sql
from observatory.store.arrow import column
from observatory.store.rollups import LOCAL_ROWID
from observatory.store.schema import PHASE_FOLD_SQL

__all__ = ["update_runs", "mark_crashed"]

# run_start's free-text fields and the `runs` column each fills (`group` is an SQL keyword)
_TEXT_FIELDS = (("project", "project"), ("group", "run_group"), ("notes", "notes"))


def update_runs(con, b: Batch) -> None:
    """Fold this batch's lifecycle events and activity into `runs` (one row per touched run)."""
    touched = sorted(set(b.activity) | {e["run"] for e in b.lifecycle if e["host"] != OBSERVATORY_HOST})
    # secrets hidden in lines of runs this batch did not otherwise touch (rejected lines, findings)
    rest = [(n, run) for run, n in b.redactions.items() if run not in touched]
    if rest:
        con.executemany("UPDATE runs SET redactions = coalesce(redactions, 0) + ? WHERE run = ?", rest)
    if not touched:
        return
    rows = con.execute(
        f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE run IN (SELECT unnest($r))", {"r": touched}
    ).fetchall()
    existing = {r[0]: dict(zip(RUN_COLUMNS, r, strict=True)) for r in rows}
    lifecycle: dict[str, list[dict]] = {}  # run -> its lifecycle events of this batch, from its own writers
    for e in b.lifecycle:
        if e["host"] != OBSERVATORY_HOST:
            lifecycle.setdefault(e["run"], []).append(e)
    new_rows: list[tuple] = []
    updates: dict[tuple[str, ...], list[tuple]] = {}  # changed columns -> (their values..., run) per run
    for run in touched:
        stored = existing.get(run)
        r = stored or dict.fromkeys(RUN_COLUMNS)
        r["run"] = run
        if stored is not None:
            for c in RUN_JSON_COLUMNS:
                if isinstance(r[c], str):
                    r[c] = json.loads(r[c])
            before = dict(r)
        if r["status"] is None or (r["status"] == "crashed" and r["end_time"] is None):
            r["status"] = "running"  # new events from a run shown as crashed for its silence: alive after all
        # (a crash known at a time, from a final failure, is undone only by events after it: below)
        for e in sorted(lifecycle.get(run, ()), key=lambda e: e["t"]):
            d = e["data"]
            if e["kind"] == "run_start":
                if r["end_time"] is not None and e["t"] >= r["end_time"]:
                    r["status"], r["end_time"], r["final_step"] = "running", None, None  # resumed
                r["start_time"] = e["t"] if r["start_time"] is None else min(r["start_time"], e["t"])
                for key in ("name", "config", "ladder", "code", "data", "mesh", "model", "tags", "source"):
                    if d.get(key) is not None:
                        r[key] = d[key]
                for key, col in _TEXT_FIELDS:
                    if d.get(key) is not None:
                        r[col] = str(d[key])
                parent = d.get("parent") or {}
                if isinstance(parent, dict) and parent.get("run") is not None:
                    r["parent_run"], r["parent_step"] = str(parent["run"]), _int_or_none(parent.get("step"))
                ladder = d.get("ladder") or {}
                if isinstance(ladder, dict) and ladder:
                    r["ladder_name"] = _str_or_none(ladder.get("name"))
                    r["ladder_rung"] = _str_or_none(ladder.get("rung"))
            elif r["end_time"] is not None and e["t"] < r["end_time"]:
                pass  # an end older than the one the row has
            elif e["kind"] == "failure":  # final: the writer stopped without a run_end, a crash known at once
                r["status"], r["end_time"], r["final_step"] = "crashed", e["t"], None
            else:  # run_end
                r["status"], r["end_time"] = d["status"], e["t"]
                r["final_step"] = _int_or_none(d.get("final_step"))
                if r["final_step"] is None:
                    r["final_step"] = r["last_step"]
        t, step = b.activity.get(run, (None, None))
        if t is not None and r["end_time"] is not None and t > r["end_time"]:
            # the run's own processes wrote on after its (last) run_end: it was resumed. `trainer train
            # --resume` and the wandb API's `init(resume=)` append to the same log with no new run_start
            # (a run_end is each host's last event, so the run_end's own time is not past it)
            r["status"], r["end_time"], r["final_step"] = "running", None, None
        if t is not None and (r["last_event_t"] is None or t > r["last_event_t"]):
            r["last_event_t"] = t
        if step is not None and (r["last_step"] is None or step > r["last_step"]):
            r["last_step"] = step
        if r["name"] is None:
            r["name"] = run
        if b.redactions.get(run) or r["redactions"] is None:
            r["redactions"] = (r["redactions"] or 0) + b.redactions.get(run, 0)
        # a stored row's changed columns (a new one is inserted whole)
        changed = () if stored is None else tuple(c for c in RUN_COLUMNS if not _same(r[c], before[c]))
        for c in RUN_JSON_COLUMNS:
            r[c] = None if r[c] is None else json_text(r[c], (", ", ": "))
        if stored is None:
            new_rows.append(tuple(r[c] for c in RUN_COLUMNS))
        elif changed:
            updates.setdefault(changed, []).append((*(r[c] for c in changed), run))
    # one statement for the new runs and one per set of changed columns (a follower's batch: last_step,
    # last_event_t), over every run of the batch at once: a catch-up of 10^4 small runs is not 10^4 statements
    if new_rows:
        _write(
            con,
            RUN_COLUMNS,
            new_rows,
            f"INSERT INTO runs ({', '.join(RUN_COLUMNS)}) SELECT {{cols}} FROM _runs",
        )
    for cols, params in updates.items():
        sets = ", ".join(f"{c} = u.{c}" for c in cols)
        _write(
            con,
            (*cols, "run"),
            params,
            f"UPDATE runs SET {sets} FROM (SELECT {{cols}} FROM _runs) u WHERE runs.run = u.run",
        )
    b.new_runs |= {r[0] for r in new_rows}
    # each run's newest phase (what its silence is allowed: `crashed_sql`), from this transaction's events
    con.execute(PHASE_FOLD_SQL.format(events=f"(SELECT * FROM events WHERE rowid >= {LOCAL_ROWID})"))


_DOUBLES = {"start_time", "end_time", "last_event_t", "phase_t", "phase_budget_s"}
_INTS = {"last_step", "final_step", "parent_step", "redactions"}


def _write(con, cols: tuple[str, ...], rows: list[tuple], sql: str) -> None:
    """Run `sql` over `rows` (a tuple of `cols` each) registered as the Arrow table `_runs`; `{cols}` in
    `sql` becomes the columns cast to the `runs` table's types (JSON text to JSON, tags to VARCHAR[])."""
    data = list(zip(*rows, strict=True))
    arrays = {}
    for c, values in zip(cols, data, strict=True):
        if c in _DOUBLES:
            arrays[c] = column([None if v is None else float(v) for v in values], pa.float64())
        elif c in _INTS:
            arrays[c] = column(list(values), pa.int64())
        elif c == "tags":
            arrays[c] = column(
                [None if v is None else json_text(v, (", ", ": ")) for v in values], pa.string()
            )
        else:
            arrays[c] = column([None if v is None else str(v) for v in values], pa.string())
    casts = ", ".join(
        f"{c}::JSON AS {c}" if c in RUN_JSON_COLUMNS else f"{c}::JSON::VARCHAR[] AS {c}" if c == "tags" else c
        for c in cols
    )
    con.register("_runs", pa.table(arrays))
    try:
        con.execute(sql.format(cols=casts))
    finally:
        con.unregister("_runs")


def _same(a: Any, b: Any) -> bool:
    """Whether a column's value is unchanged (NaN equals NaN: an unchanged float is not rewritten)."""
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return type(a) is type(b) and a == b


def mark_crashed(con, now: float) -> None:
    """Store `crashed` for the runs that went silent (`observatory.store.crashed_sql`, the one definition)."""
    con.execute(
        f"UPDATE runs SET status = 'crashed' WHERE {crashed_sql('$cut')}",
        {"cut": now - settings.get("stale_after_s")},
    )


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) <= I64 else None


def _str_or_none(x: Any) -> str | None:
    return None if x is None else str(x)
