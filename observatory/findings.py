"""The observatory's own events in a run's folder: one writer setup, one pending-scanner.

Forecasts, anomalies and decisions are written as host `OBSERVATORY_HOST`
(`<runs dir>/<run>/events.1000.jsonl`), beside the run's own logs, so what the
observatory said, and when, is replayed with the run. Between being written and being
ingested they live only in that file; `pending` reads them back, with the contract's
torn-line rule (a line without its final newline is not an event yet).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from observatory import provenance
from observatory.events import OBSERVATORY_HOST
from observatory.writer import init

__all__ = ["path", "write", "pending"]


def path(runs_dir, run: str) -> Path:
    """The run's observatory-host file."""
    return Path(runs_dir) / run / f"events.{OBSERVATORY_HOST}.jsonl"


def write(runs_dir, run: str, kind: str, items: Iterable[tuple[dict, int | None]]) -> int:
    """Append `(data, step)` items as `kind` events to the run's observatory-host file.

    Never writes a `run_start` or `run_end`: the observatory must not start or end someone
    else's run. Returns how many events were written.
    """
    items = list(items)
    if not items:
        return 0
    w = init(
        run_id=run, runs_dir=runs_dir, host=OBSERVATORY_HOST, write_start=False, install_signal_handlers=False
    )
    try:
        for data, step in items:
            w.event(kind, data, step=step)
    finally:
        w.close()  # flush and close; finish() would write a run_end
    return len(items)


def pending(runs_dir, run: str, kind: str) -> list[dict]:
    """Events of `kind` in the run's observatory-host file, written but maybe not yet ingested.

    Skips a torn last line (no final newline), a line that is not JSON, an event whose
    `data` is not an object, and a finding without this observatory's signature: the same
    lines ingest would not store (a forged anomaly's `scanned_through` must not stop the scan).
    """
    p = path(runs_dir, run)
    if not p.exists():
        return []
    needle = f'"{kind}"'.encode()
    out = []
    with open(p, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n") or needle not in raw:
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(ev, dict)
                and ev.get("kind") == kind
                and isinstance(ev.get("data"), dict)
                and provenance.judge(ev, OBSERVATORY_HOST) is None  # a forged finding is not ours
            ):
                out.append(ev)
    return out
