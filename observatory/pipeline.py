"""The ingester: passes of the ingest stage, then the analyses, in a fixed order, with one owner of state.

    report = ingest(runs_dir, db)                                    # one pass
    ingest(runs, db, follow=True, stop_event=ev)                      # tail until stopped

One `Ingester` per `ingest` call or follower owns everything that lives between passes:
the ingest stage's state (`observatory.ingest.Stage`: folder listings, the schema made sure
of, the metric-name layouts, the names known clean) and the analyses' (`Analyses`: the
detectors' progress, the alerts written, the alert delivery queue). Nothing of it is a
module global, and each piece is passed explicitly to the code that reads it.

A pass: the stage's batches (`observatory.ingest.batches`), each one committed; after each,
on a read-only connection shared by them, the analyses over the runs it touched, in this
order: the detectors (`detect.scan`), the ladder watch (`ladder.watch`), the decision
records (`decisions`), the alerts (`alerts`, after the findings they read). What they wrote
into run folders (findings are events) is ingested in the same pass. Every `CLOCK_S` the
detectors' stall check and the alerts run with no new event too (a silent run is found by
the clock). The detectors' progress reached on the read-only connection is written by the
next batch's transaction (`Stage.savers`), or at the end of the call.

`hooks=False` runs neither the rollups nor the analyses.
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

from observatory import bucket, decisions, settings, store
from observatory.alerts.delivery import Delivery
from observatory.alerts.rules import thresholds_of
from observatory.detect import scan as detectors
from observatory.events import OBSERVATORY_HOST
from observatory.ingest import IngestReport, Stage, batches, look, looked, write_failure
from observatory.ladder import watch
from observatory.store import rollups

__all__ = ["ingest", "rebuild", "Ingester", "Analyses", "ANALYSES", "ON_CLOCK", "CLOCK_S"]

# how often the analyst of a bucket runs dir looks for settled chunks to pack, and how many packs at most
PACK_EVERY_S, PACKS_A_CALL = 60.0, 10
# how often the analyses of `ON_CLOCK` run with no new event (a silent run is found within it)
CLOCK_S = 5.0
# the analyses in the order they run after each batch (each a method of `Analyses`)
ANALYSES = ("anomalies", "ladder_watch", "decisions", "alerts")
# those that also run on the clock: the detectors' stall check and the alerts, which change with time alone
ON_CLOCK = ("anomalies", "alerts")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class Analyses:
    """The analyses of one ingester and their state: the detectors' progress (`detect.scan.Progress`), the
    alert states it wrote that the store may not hold yet, and the queue that delivers alert messages on a
    thread of its own (`alerts.delivery.Delivery`), so that a hung channel never delays a pass."""

    def __init__(self, emit: Callable[[str], None], only: tuple[str, ...] = ANALYSES):
        self.emit = emit
        self.only = only  # the analyses to run (all but in tests)
        self.progress = detectors.Progress(
            thresholds_of
        )  # runs' own thresholds: the rules file's, their config's
        self.alerts_written: dict[tuple, str] = {}
        self.delivery = Delivery(emit)

    def run(
        self, db: Path, runs_dir: Path, runs: set[str], batch: Any = None, clock: bool = False
    ) -> set[str]:
        """The analyses over `runs` (after `batch`, committed; or on the clock: `ON_CLOCK` alone, no batch),
        in order, on one read-only connection; the names of those that wrote events into run folders.
        One that raises is said and the others go on: an analysis never takes ingest down."""
        wrote = set()
        with store.connect(db) as con:  # read-only: beside the dashboard's readers, not holding them out
            for name in ANALYSES:
                if name not in self.only or (clock and name not in ON_CLOCK):
                    continue
                try:
                    if getattr(self, "_" + name)(con, runs_dir, set(runs), batch):
                        wrote.add(name)
                except Exception as e:
                    self.emit(f"observatory ingest: {name}.after_ingest failed: {type(e).__name__}: {e}")
        return wrote

    def _anomalies(self, con, runs_dir: Path, runs: set[str], batch: Any) -> set[str]:
        # the runs the batch began are read from its first rowids on (DuckDB skips the row groups before)
        fresh = (
            None
            if batch is None
            else detectors.FreshFrom(batch.metrics_start, batch.experts_start, frozenset(batch.new_runs))
        )
        return detectors.after_ingest(con, runs_dir, runs, fresh_from=fresh, progress=self.progress)

    def _ladder_watch(self, con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
        return watch.after_ingest(con, runs_dir, runs)

    def _decisions(self, con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
        return decisions.after_ingest(con, runs_dir, runs)

    def _alerts(self, con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
        from observatory import alerts  # lazy: apprise and the rules file only when a batch or a tick asks

        return alerts.after_ingest(
            con, runs_dir, runs, written=self.alerts_written, deliver=self.delivery.put
        )

    def save(self, con) -> None:
        """What the analyses reached on their read-only connection and keep in the store (the detectors'
        progress), written by `con`, a write connection, inside its transaction."""
        detectors.save_state(con, self.progress)

    def save_to(self, db: Path) -> None:
        """`save` in a write transaction of its own, if anything waits (the end of an `ingest` call)."""
        if not detectors.unsaved_state(db, self.progress):
            return
        try:
            with store.write_connection(db) as con:
                con.execute("BEGIN TRANSACTION")
                self.save(con)
                con.execute("COMMIT")
        except Exception as e:  # a cache: the next ingest re-reads a little more and misses nothing
            self.emit(
                f"observatory ingest: the detectors' state was not saved ({type(e).__name__}: {e}); "
                "the next ingest re-reads a little more"
            )

    def close(self, timeout_s: float | None = None) -> None:
        self.delivery.close(timeout_s)


class Ingester:
    """One `ingest` call's or follower's passes and the state they keep (see the module doc)."""

    def __init__(
        self,
        runs_dir: Path,
        db: Path,
        *,
        hooks: bool = True,
        emit: Callable[[str], None] = _stderr,
        progress: Callable[[dict], None] | None = None,
        analyses: tuple[str, ...] = ANALYSES,
    ):
        self.runs_dir, self.db, self.emit, self.progress = runs_dir, db, emit, progress
        self.analyses = Analyses(emit, analyses) if hooks else None
        self.stage = Stage(rollups=hooks, savers=(self.analyses.save,) if self.analyses else ())
        self.last_clock = 0.0  # when the clock's analyses last ran

    def one_pass(self, report: IngestReport) -> None:
        """Ingest what the files have that the store has not, with the analyses after each batch; skip the
        store's lock when nothing changed on disk."""
        now = time.time()
        clock = self.analyses is not None and now - self.last_clock >= CLOCK_S
        files = look(self.runs_dir, self.db, self.stage, self.emit, force=clock)
        if files is None:
            return
        wrote = self._batches(files, report)
        for tick in (False, True):
            if tick and clock and self.db.exists():
                # the clock's checks (a silent run; the alerts, over the findings just stored too), with or
                # without new events: a run that stopped writing is found by the time, not by the next event
                self.last_clock = now
                wrote |= self.analyses.run(self.db, self.runs_dir, set(), clock=True)
            if wrote:
                # the analyses wrote findings into run folders: ingest them in this call, so that one command
                # leaves the store with everything it found (they run again on this round's new activity
                # only: the observatory's own events are not activity, so this round ends it)
                files = look(self.runs_dir, self.db, self.stage, self.emit, force=True)
                wrote = self._batches(files, report, findings=True)
        looked(self.db, self.stage, None if wrote else files)

    def _batches(self, files, report: IngestReport, findings: bool = False) -> set[str]:
        """The stage's batches over `files`, the analyses after each; the analyses that wrote events.
        `findings`: this round ingests what the analyses wrote; count the observatory's events as findings."""
        wrote: set[str] = set()
        for b in batches(self.runs_dir, self.db, files, report, self.stage, self.emit, self.progress):
            if findings:
                report.findings += sum(1 for e in b.events if e[1] == OBSERVATORY_HOST)
            if self.analyses is not None and b.activity:
                wrote |= self.analyses.run(self.db, self.runs_dir, set(b.activity), b)
        return wrote

    def close(self) -> None:
        """The detectors' progress of the last batch into the store (nothing else writes it); the alert
        messages still queued get `alert_send_timeout_s` to leave."""
        if self.analyses is not None:
            self.analyses.save_to(self.db)
            self.analyses.close()


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
    `hooks=False` runs neither the rollups nor the analyses. `progress`, if given, is called
    after each batch with `{"done", "total", "unit": "bytes", "files", "events"}`: bytes
    read so far and bytes to read in all (the total grows when a pass finds more).

    `runs_dir` may be a bucket URL (`s3://bucket/prefix`, `gs://...`): each pass first copies its new
    chunks into the store's local mirror of it (`observatory.ingest.bucket_source`), then reads that.
    """
    runs_dir = bucket.location(runs_dir if runs_dir is not None else settings.get("runs"))
    db = Path(db) if db is not None else store.default_db()
    emit = emit or (lambda _msg: None)
    source = None
    analyses, packer = ANALYSES, False
    if isinstance(runs_dir, str):  # a bucket: its new chunks into a local mirror, read from there
        from observatory.ingest.bucket_source import BucketSource

        source = BucketSource(runs_dir, db, settings.get("journal_margin_s"))
        runs_dir = source.mirror
        if hooks and not source.analyst(settings.get("bucket_analyst"), emit):
            analyses = ()  # a replica: it reads the analyst's findings from the bucket, writes none
        packer = hooks and bool(analyses)
    report = IngestReport()
    ing = Ingester(runs_dir, db, hooks=hooks, emit=emit, progress=progress, analyses=analyses)
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
        next_pack = 0.0
        while True:
            try:
                if source is not None:
                    source.pull(emit)
                    if packer and time.monotonic() >= next_pack:  # the analyst packs what has settled
                        next_pack = time.monotonic() + PACK_EVERY_S
                        _pack(source, emit)
                ing.one_pass(report)
                if source is not None:
                    source.send(emit)  # the findings the analyses wrote, to the bucket
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
                looked(db, ing.stage, None)
            report.passes += 1
            if not follow or stop.wait(settings.get("follow_interval_s")):
                break
    finally:
        ing.close()
        report.skipped = sorted(ing.stage.skip)
        for sig, h in old.items():
            signal.signal(sig, h)
        if lock is not None:
            lock.close()
        report.seconds = time.perf_counter() - t0
    return report


def _pack(source, emit: Callable[[str], None]) -> None:
    """The analyst's packs of a bucket's settled chunks (`BucketSource.pack`), a few a call; a failure is
    said and left for the next call (packs only speed up a new replica's catch-up)."""
    try:
        for _ in range(PACKS_A_CALL):
            if not source.pack(emit):
                return
    except Exception as e:
        emit(f"observatory ingest: {source.url}: packing failed ({type(e).__name__}: {e}); retrying later")


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
    Rollups and analyses run as in `ingest`, batch by batch: rollups in each transaction (caught up
    at the end if one was switched off), and the detectors, so the new store holds their
    state and the next `ingest` reads only what is new. What the analyses wrote before is
    already events (the new store holds it too), so they find nothing they said already. `progress`: as for `ingest`.
    """
    runs_dir = bucket.location(runs_dir if runs_dir is not None else settings.get("runs"))
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
            rollups.after_ingest(con, {"metrics": {"*"}, "expert_load": {"*"}})  # rows left, if any
            con.execute("COMMIT")
        with store.write_connection(db) as con:  # hold the store's locks: nobody opens it mid-swap
            con.duckdb.close()
            os.replace(tmp, db)
            db.with_name(db.name + ".wal").unlink(missing_ok=True)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + ".wal"), *store.lock_files(tmp)):
            p.unlink(missing_ok=True)
        if isinstance(runs_dir, str):  # a bucket's: the fresh store read it into a mirror of its own
            import shutil

            shutil.rmtree(f"{tmp}.bucket", ignore_errors=True)
    return report
