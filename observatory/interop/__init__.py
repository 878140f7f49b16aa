"""Interop: import Weights & Biases and TensorBoard runs, mirror to W&B, export our runs.

Importers turn another tool's run into OUR event log (one `events.0.jsonl` per run, see
`docs/events.md`) and then ingest it like any other run, so everything downstream (runs
list, dashboard, reports) sees imported runs exactly as it sees our own.

Why importers do not go through `observatory.init`: the live writer stamps `t` with the
current time, appends to an existing file on resume (a second import would duplicate every
event) and drops events when its queue is full (a bulk import outruns the writer thread).
An import instead builds the whole log in memory with the source's own timestamps and a
deterministic `seq`, validates every event with `events.validate_event`, and puts the file
in place atomically. Re-importing the same source writes the same bytes, so it is a no-op;
a source that has grown since (a live W&B run) gives a file that extends the old one, which
ingest picks up incrementally.

Everything the store shows comes from the log: a source run cut short (a W&B run with no
exit record, TensorBoard imported with `--status none`) ends in a `failure` with `final: true`
at its last event's time (`RunLogBuilder.crashed`), which ingest folds into status `crashed`
and `end_time` (a run with no `run_end` would otherwise be `running` until `stale_after_s`
after its last event). Imported again after the source grew, the log keeps that marker and
goes on after it (`continued`): the run is running again from its new events, as any run
that writes after it stopped.

Modules (each imports its heavy dependency lazily):

- `wandb_reader`: the `.wandb` transaction-log reader with per-record error recovery.
- `wandb_import`: W&B offline runs -> event logs.
- `tensorboard_import`: tfevents scalars -> event logs.
- `wandb_mirror`: `WandbMirror`, a writer `Sink` that mirrors a live run to W&B.
- `export`: a stored run as jsonl (re-ingestable), parquet or csv.
- `ladder_points`: a table of scaling-ladder points (a lab's published numbers) -> event logs.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observatory.events import (
    RUN_ID_RE,
    VERSION,
    encode_nonfinite,
    encode_value,
    is_final_failure,
    validate_event,
)
from observatory.redact import redact

__all__ = [
    "ImportResult",
    "RunLogBuilder",
    "safe_run_id",
    "flatten",
    "put_file",
    "continued",
    "settle",
    "ingest_runs",
]


def safe_run_id(prefix: str, source_id: str) -> str:
    """`<prefix>-<source id>` made to match the run id rule `[A-Za-z0-9._-]{1,128}`."""
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", source_id).strip("-.") or "run"
    run_id = f"{prefix}-{stem}"[:128]
    assert RUN_ID_RE.match(run_id), run_id
    return run_id


def flatten(obj: Any, prefix: str = "", out: dict | None = None, skipped: Counter | None = None) -> dict:
    """Nested mapping -> `{"a/b/c": number}`; non-numbers are counted in `skipped` by type.

    A mapping with a `_type` key is a W&B rich value (histogram, image, table, ...): it is
    skipped whole and counted under its `_type`. Booleans become 0/1 (a scalar the user logged).
    """
    out = {} if out is None else out
    if isinstance(obj, dict):
        if "_type" in obj and prefix:
            if skipped is not None:
                skipped[str(obj["_type"])] += 1
            return out
        for k, v in obj.items():
            flatten(v, f"{prefix}/{k}" if prefix else str(k), out, skipped)
        return out
    if isinstance(obj, bool):
        out[prefix] = float(obj)
    elif isinstance(obj, (int, float)):
        out[prefix] = float(obj)
    elif skipped is not None:
        skipped[
            "none"
            if obj is None
            else "string"
            if isinstance(obj, str)
            else "list"
            if isinstance(obj, list)
            else type(obj).__name__
        ] += 1
    return out


@dataclass
class ImportResult:
    """What importing one source run did; `problems` are human-readable, with byte offsets."""

    source: Path
    run: str | None = None
    status: str = "crashed"  # completed | failed | crashed (no end record)
    records: int = 0  # source records read (W&B records, TensorBoard events)
    metric_events: int = 0  # metrics events written (one per source step row)
    values: int = 0  # scalar values written
    heartbeats: int = 0  # heartbeat events written (W&B system-stats records)
    skipped: Counter = field(default_factory=Counter)  # histograms, media, text ... by type
    problems: list[str] = field(default_factory=list)
    truncated: bool = False
    written: str = ""  # new | unchanged | extended | replaced | "" (nothing written)
    error: str | None = None  # set when nothing could be imported from this source
    note: str = ""  # anything else worth a line (e.g. one session of a resumed run)

    def summary_line(self) -> str:
        if self.error:
            return f"FAILED {self.source}: {self.error}"
        skipped = ", ".join(f"{n} {k}" for k, n in sorted(self.skipped.items()))
        bits = [
            f"{self.run} <- {self.source}",
            f"status {self.status}",
            f"{self.records} records, {self.metric_events} steps, {self.values} values"
            + (f", {self.heartbeats} heartbeats" if self.heartbeats else ""),
            f"file {self.written}",
        ]
        if skipped:
            bits.append(f"skipped {skipped}")
        if self.truncated:
            bits.append("truncated (crashed run: read up to its last whole record)")
        if self.problems:
            bits.append(f"{len(self.problems)} unreadable region(s)")
        if self.note:
            bits.append(self.note)
        return "; ".join(bits)


class RunLogBuilder:
    """Builds one run's event log in memory: deterministic seq, the source's own times.

    Every event is validated as it is added, so a bad value is reported against the source
    record instead of being rejected later by ingest.
    """

    def __init__(self, run_id: str, host: int = 0):
        if not RUN_ID_RE.match(run_id):
            raise ValueError(f"run id {run_id!r} must match [A-Za-z0-9._-]{{1,128}}")
        self.run = run_id
        self.host = host
        self.events: list[dict] = []

    def add(self, kind: str, data: dict, step: int | None, t: float) -> dict:
        # the bulk of an import is plain metrics: names and float values we made ourselves;
        # only non-finite values need their string form, with the same result as validate_event
        plain = kind == "metrics" and self._plain_metrics(data, step, t)
        ev = {
            "v": VERSION,
            "run": self.run,
            "kind": kind,
            "step": step,
            "t": float(t),
            "host": self.host,
            "seq": len(self.events),
            "data": {k: v if v - v == 0 else encode_nonfinite(v) for k, v in data.items()}
            if plain
            else encode_value(data),
        }
        if not plain:
            validate_event(ev)
        self.events.append(ev)
        return ev

    @staticmethod
    def _plain_metrics(data: dict, step: int | None, t: float) -> bool:
        return (
            type(step) is int
            and step >= 0
            and type(t) is float
            and t - t == 0
            and all(type(v) is float and type(k) is str and k for k, v in data.items())
        )

    def start(self, t: float, config: dict, **fields: Any) -> dict:
        data = {"config": redact(config)}
        data.update({k: v for k, v in fields.items() if v not in (None, "", [], {})})
        return self.add("run_start", data, None, t)

    def crashed(self, t: float, message: str) -> dict:
        """End the log of a run cut short (no end record): a `failure` with `final: true` at `t`.

        Without it the run has no `run_end` and ingest shows it `running` until `stale_after_s`
        after its last event, which may be recent; with it the store says `crashed`, `end_time`
        `t`, from the log alone. Its step is the last step logged.
        """
        steps = [ev["step"] for ev in self.events if ev["step"] is not None]
        data = {"type": "crashed", "message": message, "final": True}
        return self.add("failure", data, max(steps) if steps else None, t)

    def to_bytes(self) -> bytes:
        return b"".join(_line(ev) for ev in self.events)

    def write(self, runs_dir: str | os.PathLike, replace: bool = False) -> str:
        """Put the log at `<runs_dir>/<run>/events.<host>.jsonl`; say what happened (`put_file`)."""
        path = Path(runs_dir) / self.run / f"events.{self.host}.jsonl"
        payload = self.to_bytes()
        old = path.read_bytes() if path.exists() else None
        if old is not None and old != payload:
            payload = continued(old, self.events) or payload
        return put_file(path, payload, replace)


def _line(ev: dict) -> bytes:
    return (json.dumps(ev, separators=(",", ":"), allow_nan=False) + "\n").encode()


def continued(old: bytes, events: list[dict]) -> bytes | None:
    """An earlier import's log that ended in a crash marker, grown by what `events` adds; None if not.

    A log only grows, and a source cut short may grow later (a live W&B run imported again):
    when `old` ends in a final `failure` (`RunLogBuilder.crashed`) and `events`, this import's
    whole log, begins with `old`'s events without its markers, the result is `old` and then the
    rest of `events`, numbered on from `old`'s last seq (ingest reads just that: the run is
    running again from its new events and ends as this import says). `old` itself when nothing
    was added. None for anything else (`put_file` then compares the fresh log).
    """
    lines = old.splitlines()
    try:  # the last line first: most files end otherwise, and are not parsed further
        prior = [json.loads(lines[-1])] if lines and old.endswith(b"\n") else []
        if not (prior and _is_marker(prior[0]) and isinstance(prior[0].get("seq"), int)):
            return None
        prior = [json.loads(x) for x in lines[:-1]] + prior
    except ValueError:
        return None
    if not all(isinstance(ev, dict) for ev in prior):
        return None

    def same(ev: dict) -> bytes:  # an event's line as a fresh import writes it, but its seq
        return _line({**ev, "seq": 0})

    body = [ev for ev in prior if not _is_marker(ev)]
    if len(events) <= len(body) or [same(ev) for ev in events[: len(body)]] != [same(ev) for ev in body]:
        return None
    rest = events[len(body) :]
    if len(rest) == 1 and same(rest[0]) == same(prior[-1]):
        return old  # the source has not grown since
    seq = prior[-1]["seq"] + 1
    return old + b"".join(_line({**ev, "seq": seq + i}) for i, ev in enumerate(rest))


def _is_marker(ev: Any) -> bool:
    return isinstance(ev, dict) and is_final_failure(ev.get("kind"), ev.get("data"))


def put_file(path: Path, payload: bytes, replace: bool = False) -> str:
    """Write `payload` to `path` atomically unless it is already there; say what happened.

    `new`; `unchanged`: identical bytes already there (re-import is a no-op); `extended`:
    the old file is a prefix of the new one (the source grew; ingest reads just the rest);
    `conflict`: different content is there (e.g. an earlier import of a damaged copy) and
    nothing was written; `replaced`: the same, overwritten because `replace` was asked --
    ingest only appends, so the caller must then rebuild the store.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    state = "new"
    if path.exists():
        old = path.read_bytes()
        if old == payload:
            return "unchanged"
        state = "extended" if payload.startswith(old) else "replaced"
        if state == "replaced" and not replace:
            return "conflict"
    # atomic: a concurrent ingest sees the old file or the new one, never half of it.
    # The temporary name holds no "events"/"jsonl", so no ingest glob picks it up.
    tmp = path.parent / f".import-{os.getpid()}-{threading.get_ident()}.partial"
    with open(tmp, "wb") as f:
        f.write(payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return state


CONFLICT = (
    "run {run} is already in the runs dir with different events (imported earlier from other "
    "data?); nothing written. Pass --replace to overwrite it (the store is then rebuilt)."
)


def settle(res: ImportResult, state: str) -> None:
    """Record what writing the run's log did; a conflict is an error for this source."""
    if state == "conflict":
        res.error = CONFLICT.format(run=res.run)
    else:
        res.written = state


def ingest_runs(
    runs_dir: str | os.PathLike,
    db: str | os.PathLike | None,
    rebuild: bool = False,
    progress: Callable[[dict], None] | None = None,
) -> Any:
    """Bring the store up to date with the runs dir (imported runs are ordinary runs).

    Ingest only appends; if an import replaced a run's file (`rebuild`), the store is
    rebuilt from the logs instead. What the import knows is in the logs, so nothing is
    written to the store beside them: a run cut short ends in a final `failure`
    (`RunLogBuilder.crashed`), which ingest shows as `crashed`. `progress`: the ingest's
    progress callback.
    """
    from observatory import pipeline as ing
    from observatory.store import default_db

    db = Path(db) if db is not None else default_db()
    return (ing.rebuild if rebuild else ing.ingest)(runs_dir, db, progress=progress)
