"""Instability early warning: the detectors run over the store as events are ingested.

Each finding becomes an `anomaly` event (EVENTS.md) written by the observatory
itself as host 1000 into the run's folder; the next ingest pass stores it. So
what the observatory said, and when, is as the run itself. The
detectors themselves (pure functions over numpy series, their thresholds from
the `anomaly_*` settings) live in `observatory.detect.detectors`, re-exported here.

    after_ingest(db, runs_dir, touched_runs)   # ingest's hook, after each committed batch
    detect(db, runs_dir, runs=None)            # `observatory detect`: new findings, written

Incremental and idempotent: a flag at a step depends only on a bounded trailing
window, so `scan_run` re-reads `Thresholds.lookback` logged steps before the last
step it scanned (kept per process, and as `scanned_through` in every finding
written), ignores episodes that began before its windows were whole (an earlier
scan saw their start) and dedupes by (detector, metric, window start) against
anomaly events in the store and in events.1000.jsonl.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from observatory.detect.detectors import (
    DROP,
    GRAD,
    LOSS,
    SERIES,
    SPIKE_GAP,
    THROUGHPUT,
    UPDATE,
    Finding,
    Thresholds,
    _episodes,
    dead_experts,
    detect_frame,
    drop_jumps,
    grad_growth,
    grad_spikes,
    hot_experts,
    incomplete_recovery,
    loss_dips,
    loss_spikes,
    nonfinite,
    stalled,
    throughput_drops,
    update_spikes,
)
from observatory.events import OBSERVATORY_HOST

__all__ = [
    "after_ingest",
    "detect",
    "scan_run",
    "write_findings",
    "existing_findings",
    "finding_rows",
    # re-exported from observatory.detect.detectors
    "Thresholds",
    "Finding",
    "loss_spikes",
    "loss_dips",
    "grad_spikes",
    "update_spikes",
    "grad_growth",
    "incomplete_recovery",
    "drop_jumps",
    "hot_experts",
    "dead_experts",
    "nonfinite",
    "throughput_drops",
    "stalled",
    "detect_frame",
    "LOSS",
    "GRAD",
    "UPDATE",
    "DROP",
    "THROUGHPUT",
    "SERIES",
    "SPIKE_GAP",
    "_episodes",
]


def _host_file_findings(runs_dir: Path, run: str) -> list[dict]:
    """Anomaly payloads already in the run's events.1000.jsonl (written, maybe not yet ingested)."""
    path = Path(runs_dir) / run / f"events.{OBSERVATORY_HOST}.jsonl"
    if not path.exists():
        return []
    out = []
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # a torn write: the writer is mid-line
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if isinstance(ev, dict) and ev.get("kind") == "anomaly" and isinstance(ev.get("data"), dict):
                out.append({**ev["data"], "host": ev.get("host")})
    return out


def _key_of(d: dict) -> tuple[str, str, int] | None:
    w = d.get("window")
    if not isinstance(w, list) or not w or not isinstance(d.get("detector"), str):
        return None
    try:
        return (d["detector"], d.get("metric") or "", int(w[0]))
    except (TypeError, ValueError):
        return None


def existing_findings(con, runs_dir: Path, run: str) -> tuple[set[tuple[str, str, int]], int | None]:
    """Keys of findings already made for a run (store and host-1000 file) and the furthest step scanned."""
    from observatory.queries.anomalies import anomaly_events

    seen = anomaly_events(con, run) + _host_file_findings(runs_dir, run)
    keys = {k for d in seen if (k := _key_of(d)) is not None}
    scanned = [
        int(d["scanned_through"])
        for d in seen
        if d.get("host") == OBSERVATORY_HOST and isinstance(d.get("scanned_through"), int)
    ]
    return keys, (max(scanned) if scanned else None)


# (runs dir, run) -> last step scanned by this process; the store-derived value is the fallback
_STATE: dict[tuple[str, str], int] = {}


def scan_run(
    con,
    runs_dir: Path,
    run: str,
    th: Thresholds,
    *,
    full: bool = False,
    activity: dict | None = None,
    now: float | None = None,
) -> tuple[list[Finding], int | None]:
    """New findings for one run (deduped) and the last step scanned. Writes nothing."""
    from observatory.queries.anomalies import cut_step, expert_load_series, metric_series, nonfinite_values

    keys, stored_through = existing_findings(con, runs_dir, run)
    state_key = (str(Path(runs_dir).resolve()), run)
    through = None if full else _STATE.get(state_key, stored_through)
    since = cut_step(con, run, through, th.lookback) if through is not None else None
    frame = metric_series(con, run, since, list(SERIES))
    load = expert_load_series(con, run, since)
    bad = nonfinite_values(con, run, since)
    found = detect_frame(frame, load, th, truncated=since is not None, bad=bad)
    if activity is not None:
        found += stalled(activity["last_step"], activity["last_t"], activity["ended"], th, now)
    new, fresh = [], set()
    for f in found:
        if f.key not in keys and f.key not in fresh:
            fresh.add(f.key)
            new.append(replace(f, run=run))
    last = int(frame["step"].max()) if frame.height else through
    if last is not None:
        _STATE[state_key] = max(last, through or last)
    return new, last


def write_findings(runs_dir: Path, run: str, findings: list[Finding], scanned_through: int | None) -> None:
    """Append findings as `anomaly` events to <runs_dir>/<run>/events.1000.jsonl (never a run_end)."""
    if not findings:
        return
    from observatory.writer import init

    w = init(
        run_id=run, runs_dir=runs_dir, host=OBSERVATORY_HOST, write_start=False, install_signal_handlers=False
    )
    try:
        for f in findings:
            w.event("anomaly", f.data(scanned_through), step=f.step)
    finally:
        w.close()  # close, not finish: the observatory must not end someone's run


def _open(db):
    """A connection for one unit of work: the caller's if it passed one, else read-only on the path."""
    from contextlib import nullcontext

    from observatory.store import connect

    return nullcontext(db) if hasattr(db, "execute") else connect(db)


def detect(
    db,
    runs_dir,
    runs: Iterable[str] | None = None,
    *,
    thresholds: Thresholds | None = None,
    full: bool = False,
    stall: bool = True,
    write: bool = True,
    now: float | None = None,
) -> list[Finding]:
    """Run every detector over stored runs (all when `runs` is None); write and return the new findings.

    `full` rescans each run from its first step instead of continuing from the
    last scanned step (the result is the same; it is slower). `stall` also checks
    whether the runs have gone silent without a run_end.
    """
    from observatory.queries.anomalies import run_activity, run_ids

    th = thresholds or Thresholds.from_settings()
    runs_dir = Path(runs_dir)
    results: list[tuple[str, list[Finding], int | None]] = []
    with _open(db) as con:
        wanted = run_ids(con) if runs is None else list(dict.fromkeys(runs))
        act = {a["run"]: a for a in run_activity(con, wanted)} if stall and wanted else {}
        for run in wanted:
            try:
                new, last = scan_run(con, runs_dir, run, th, full=full, activity=act.get(run), now=now)
            except Exception as e:  # one bad run must not stop the others
                print(
                    f"observatory anomalies: run {run}: detectors failed: {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
                continue
            results.append((run, new, last))
    out = []
    for run, new, last in results:
        if write and new:
            if not (runs_dir / run).is_dir():
                print(
                    f"observatory anomalies: run {run} has no folder in {runs_dir}; findings not written",
                    file=sys.stderr,
                )
                continue
            write_findings(runs_dir, run, new, last)
        out += new
    return out


_last_stall_check = 0.0


def after_ingest(
    db, runs_dir, touched_runs: Iterable[str], *, thresholds: Thresholds | None = None
) -> list[Finding]:
    """Ingest's hook, called after each committed batch: detect over the runs it touched.

    Cheap on every pass: each run continues from the last step this process
    scanned (re-reading only `Thresholds.lookback` logged steps). Runs that went
    silent without run_end are checked at most every few seconds. Never raises:
    a detector failure is reported on stderr and ingest goes on.
    """
    global _last_stall_check
    runs = list(dict.fromkeys(touched_runs))
    try:  # ladder targets against their pre-registered forecast band (writes its own anomalies; idempotent)
        from observatory.ladder.watch import check_targets

        check_targets(db, runs_dir, runs)
    except Exception as e:
        print(f"observatory anomalies: ladder check failed: {type(e).__name__}: {e}", file=sys.stderr)
    try:
        th = thresholds or Thresholds.from_settings()
        stall_due = time.monotonic() - _last_stall_check > min(10.0, th.stall_s / 4)
        if stall_due:
            _last_stall_check = time.monotonic()
            from observatory.queries.anomalies import silent_runs

            with _open(db) as con:
                runs += [r for r in silent_runs(con, time.time() - th.stall_s) if r not in runs]
        if not runs:
            return []
        return detect(db, runs_dir, runs, thresholds=th, stall=stall_due)
    except Exception as e:
        print(f"observatory anomalies: after_ingest failed: {type(e).__name__}: {e}", file=sys.stderr)
        return []


def finding_rows(findings: Iterable[Finding]) -> list[dict[str, Any]]:
    """Findings as flat dicts (for --json and tables)."""
    rows = []
    for f in findings:
        d = asdict(f)
        d["window"] = list(f.window)
        d.update(d.pop("extra"))
        rows.append(d)
    return rows
