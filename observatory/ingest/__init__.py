"""Ingest: event logs → DuckDB store, incremental, exactly-once, every line validated.

    report = ingest(runs_dir, db)                                    # one pass
    ingest(runs, db, follow=True, stop_event=ev)                      # tail until stopped

- `files`: the runs dir's logs, what each has that the store has not, reading one;
- `msgspec_lines`: a chunk of lines decoded in one call, certified in bulk and appended as
  Arrow columns; what it cannot certify goes, line by line, to
- `model`: the data model (a file, a chunk, a file's state, a batch) and `check_line`,
  `observatory.events.validate_event` plus the store's ranges: the one definition of
  "valid" (tests check the bulk path gives the store that judging every line so gives);
- `runs`: the `runs` table, folded from lifecycle events;
- `redaction`: secrets in metric names hidden in the batch (`model` scrubs the rest);
- `passes`: passes and batches, one short write transaction each;
- `hooks`: what other stages run on each batch (rollups in the transaction; the
  detectors, the ladder watch and the decision records after it).

Torn last lines (no final newline) wait while the run may be live and are
recorded as `truncated` once it ended or went quiet for `stale_after_s`.
"""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from observatory import settings, store
from observatory.ingest import hooks as ingest_hooks
from observatory.ingest.files import scan
from observatory.ingest.model import LogFile
from observatory.ingest.passes import Follower, IngestReport, one_pass, write_failure
from observatory.store import rollups

__all__ = ["ingest", "rebuild", "IngestReport", "LogFile", "scan"]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ingest(
    runs_dir: str | os.PathLike | None = None,
    db: str | os.PathLike | None = None,
    follow: bool = False,
    stop_event: threading.Event | None = None,
    *,
    hooks: bool = True,
    emit: Callable[[str], None] | None = _stderr,
    progress: Callable[[dict], None] | None = None,
) -> IngestReport:
    """Load every event log under `runs_dir` into the store `db`; return what happened.

    Incremental and exactly-once: a second call adds only what was appended since.
    With `follow`, keep polling every `follow_interval_s` until `stop_event` is set
    or SIGINT/SIGTERM arrives (when called from the main thread). `emit` receives
    each `file:line: reason` message (default: stderr; None to stay quiet).
    `hooks=False` runs none of `observatory.ingest.hooks`. `progress`, if given, is called
    after each batch with `{"done", "total", "unit": "bytes", "files", "events"}`: bytes
    read so far and bytes to read in all (the total grows when a pass finds more).
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    emit = emit or (lambda _msg: None)
    report = IngestReport()
    fol = Follower()
    t0 = time.perf_counter()
    stop = stop_event or threading.Event()
    old: dict[int, Any] = {}
    if follow and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: stop.set())
    if not runs_dir.is_dir():
        emit(f"{runs_dir}: runs dir does not exist{' (yet); waiting for it' if follow else ''}")
    lock = None
    try:
        if follow:
            lock = _follower_lock(db, stop, emit)
            if lock is None:
                return report  # stopped while waiting for the other follower
        failing = None
        while True:
            try:
                one_pass(runs_dir, db, report, fol, hooks, emit, progress)
                if failing:
                    emit(
                        f"observatory ingest: {db}: the store is writable again; caught up from the last committed batch"
                    )
                failing = None
            except Exception as e:
                if not follow:
                    raise
                why = write_failure(e)
                if why is None or failing != why:
                    emit(
                        f"observatory ingest: pass failed ({type(e).__name__}: {e}); retrying"
                        if why is None
                        else f"observatory ingest: {db}: cannot write the store: {why} "
                        f"({type(e).__name__}: {e}); retrying every {settings.get('follow_interval_s')} s. "
                        "Nothing is lost: the logs are read again from the last committed batch"
                    )
                failing = why
                fol.sig = None
            report.passes += 1
            if not follow or stop.wait(settings.get("follow_interval_s")):
                break
        if hooks:
            ingest_hooks.save_pending_to(db, emit)  # the last batch's detector state: nothing else writes it
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        if lock is not None:
            lock.close()
        report.seconds = time.perf_counter() - t0
    return report


def _follower_lock(db: Path, stop: threading.Event, emit: Callable[[str], None]):
    """Hold `<db>.follower` (an flock) for as long as this follower runs; one follower per store.

    A second follower says who holds it and waits (polling `follow_interval_s`) until the
    first exits or `stop` is set (then None). One-off `ingest` calls take no such lock: their
    batches are safe beside a follower (each takes the store's write lock).
    """
    db.parent.mkdir(parents=True, exist_ok=True)
    path = db.with_name(db.name + ".follower")
    f = open(path, "a+")
    said = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not said:
                f.seek(0)
                who = f.read().strip() or "another process"
                emit(
                    f"observatory ingest: {db} is already followed by {who}; waiting for it to exit "
                    f"(lock file {path})"
                )
                said = True
            if stop.wait(settings.get("follow_interval_s")):
                f.close()
                return None
            continue
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        f.flush()
        if said:
            emit(f"observatory ingest: {db}: the other follower exited; following now")
        return f


def rebuild(
    runs_dir: str | os.PathLike | None = None,
    db: str | os.PathLike | None = None,
    *,
    emit: Callable[[str], None] | None = _stderr,
    progress: Callable[[dict], None] | None = None,
) -> IngestReport:
    """Recreate the store from the event logs: build a fresh file beside it, then swap it in atomically.

    Readers see the old store until the swap and the new one after; neither half-built.
    The hooks run as in `ingest`, batch by batch: rollups in each transaction (caught up
    at the end if one was switched off), and the detectors, so the new store holds their
    state and the next `ingest` reads only what is new. What the hooks wrote before is
    already events (the new store holds it too), so they find nothing they said already. `progress`: as for `ingest`.
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f"{db.name}.rebuild-{os.getpid()}")
    for p in (tmp, tmp.with_name(tmp.name + ".wal")):
        p.unlink(missing_ok=True)
    try:
        report = ingest(runs_dir, tmp, emit=emit, progress=progress)
        with store.write_connection(tmp) as con:
            store.ensure_schema(con)
            con.execute("BEGIN TRANSACTION")
            rollups.after_ingest(con, {"metrics": {"*"}, "expert_load": {"*"}})  # rows the hook left, if any
            con.execute("COMMIT")
        with store.write_connection(db) as con:  # hold the store's locks: nobody opens it mid-swap
            con.duckdb.close()
            os.replace(tmp, db)
            db.with_name(db.name + ".wal").unlink(missing_ok=True)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + ".wal"), *store.lock_files(tmp)):
            p.unlink(missing_ok=True)
    return report
