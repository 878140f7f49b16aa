"""Passes and batches: each batch is one short write transaction over the files with work.

One pass: scan the runs dir (`files.readable`); while files have work, run a batch:

1. take the write lock, open the store, read `ingest_files` (offsets, seq ranges);
2. read each file from its offset up to `BATCH_BYTES` in all (`files.process_file`:
   the msgspec path, then the SQL path for what it cannot certify);
3. in the same transaction: bulk-insert the staged rows, record rejected lines and
   each file's new offset, fold the batch into `runs`, store `crashed` for runs
   that went silent; then COMMIT, so a kill at any point leaves either all of the
   batch or none of it;
4. the in-transaction hooks (the rollups): for a catch-up batch (`ROLL_UP_APART_BELOW`
   bytes or more) before its COMMIT; for a live run's small batch, after it, in a write
   transaction of their own for each source table it added rows to (`_roll_up`). Between two of these
   transactions a reader that came meanwhile gets in first (`store.connection`'s
   `.want`), so under a live run a reader waits for one short hold, not for the
   batch and all its rollups in one. A kill between them loses nothing: the
   rollups know from `rollup_state` how far they got, and the next `ingest` call
   catches up (`rollups.behind`);
5. release the lock; run the after-commit hooks (`observatory.ingest.hooks`).
"""

from __future__ import annotations

import copy
import errno
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observatory import settings, store
from observatory.events import OBSERVATORY_HOST, STATUSES
from observatory.ingest import files as fs
from observatory.ingest import hooks
from observatory.ingest.arrow import flush
from observatory.ingest.redaction import redact_metric_names
from observatory.ingest.runs import mark_crashed, update_runs
from observatory.ingest.sql_lines import (
    MESSAGE_LIMIT,
    LogFile,
    Rejection,
    _Batch,
    _FileState,
)
from observatory.store import rollups

__all__ = ["BATCH_BYTES", "IngestReport", "Follower", "one_pass", "write_failure"]

BATCH_BYTES = 32 << 20  # input bytes per write transaction: keeps each lock hold well under a second or two


@dataclass
class IngestReport:
    """What one `ingest` call did. `messages` are `file:line: reason` lines."""

    files: int = 0
    events: int = 0
    metric_values: int = 0
    expert_rows: int = 0
    rejected: int = 0  # rejected lines, stored in rejected_events or not
    rejected_dropped: int = 0  # of those, past max_rejected_per_file: counted in ingest_files, text not stored
    duplicates: int = 0
    truncated: int = 0
    bytes: int = 0
    seconds: float = 0.0
    passes: int = 0
    fast_events: int = 0  # of `events`, how many a vectorised path accepted (the rest: validate_event)
    findings: int = 0  # events the hooks wrote (anomalies, deviations, decision records), ingested too
    runs: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"ingested {self.events} events ({self.metric_values} metric values, {self.expert_rows} "
            f"expert-load rows) from {self.files} file reads, {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s; "
            f"{self.rejected} rejected{self._dropped_text()}, {self.duplicates} duplicates skipped, "
            f"{self.truncated} truncated; "
            f"{self.findings} findings written"
        )

    def _dropped_text(self) -> str:
        return f" ({self.rejected_dropped} of them not stored: max_rejected_per_file)" if self.rejected_dropped else ""


class Follower:
    """State kept between passes of one `ingest` call."""

    def __init__(self):
        self.sig: Any = None
        self.skip: set[str] = set()  # files that cannot be ingested (until the next `ingest` call)
        self.off: set[str] = set()  # in-transaction hooks that failed: batches run without them
        self.unprepared: set[str] = set()  # after-commit hooks whose `prepare` failed: run after commits only
        self.last_crash_check = 0.0
        self.rollups_due: set[str] = set()  # source tables with committed rows the rollups have not taken in
        self.rollups_checked = False  # whether this call looked for rows an earlier one left (`rollups.behind`)


_ENSURED: set = set()  # (path, (inode, device)) of store files whose schema this process made sure of


def _db_sig(db: Path) -> Any:
    try:
        st = db.stat()
        return (st.st_ino, st.st_dev)
    except FileNotFoundError:
        return None


def _has_schema(con) -> bool:
    import duckdb

    try:
        con.execute("SELECT 1 FROM ingest_files LIMIT 0").fetchall()
        return True
    except duckdb.CatalogException:
        return False


def write_failure(e: BaseException) -> str | None:
    """Why the store cannot be written, when `e` is the store's fault and no event log's: 'the disk is full'
    (or the file size limit) when `e` says so, or the file is not a usable store (`StoreUnusable`); else None."""
    text = str(e).lower()
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)) or any(
        w in text for w in ("no space left", "file too large", "disk quota")
    ):
        return "the disk is full (or a file size limit was reached)"
    if isinstance(e, store.StoreUnusable):
        return "the file cannot be opened as a store"
    return None


@contextmanager
def _transaction(con) -> Iterator[None]:
    """BEGIN, and ROLLBACK if the block raises; the block COMMITs (it may return early after its own)."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        try:
            con.execute("ROLLBACK")
        except Exception:
            pass
        raise


def _hook_off(fol: Follower, h: hooks.HookFailed, emit: Callable[[str], None]) -> None:
    """Say that an in-transaction hook failed (its transaction was rolled back) and leave it out from now on."""
    e, name = h.error, h.hook.name
    emit(f"observatory ingest: {name}.after_ingest failed ({type(e).__name__}: {e}); "
         f"ingesting without {name} from now on (`observatory rebuild` rebuilds them)")  # fmt: skip
    fol.off.add(name)


def _open_store(db: Path):
    """The write connection of a batch, the store's schema ensured; `StoreUnusable` when the file cannot be
    opened or given the schema (a file that is not a DuckDB store): no event log is to blame for that."""
    try:
        con = store.write_connection(db)
    except (store.StoreBusy, OSError):
        raise  # busy: wait and retry; an OSError names its own path (the folder cannot be written, say)
    except Exception as e:
        raise store.StoreUnusable(db, e) from e
    try:
        con.execute("SET enable_progress_bar = false")
        if (str(db), _db_sig(db)) not in _ENSURED or not _has_schema(con):
            store.ensure_schema(con)  # DDL costs ~0.1 s a batch; once per store file is enough
            _ENSURED.add((str(db), _db_sig(db)))
    except Exception as e:
        con.close(reuse=False)
        if write_failure(e):
            raise
        raise store.StoreUnusable(db, e) from e
    return con


def _run_batch(db: Path, runs_dir: Path, files: list[LogFile], only: str | None, fol: Follower,
               use_hooks: bool) -> tuple[_Batch | None, bool]:  # fmt: skip
    """One write transaction over files with work. Returns (batch or None if idle, more work left).

    With `use_hooks`: a batch of `ROLL_UP_APART_BELOW` bytes or more runs the in-transaction hooks before
    its COMMIT, and the after-commit hooks' `prepare` (their reads; they compute while it commits, and
    finish from `b.prepared`); a smaller one adds the sources it added rows to to `fol.rollups_due` (and,
    at the call's first batch, those an earlier call left behind), for `_roll_up` after the commit.
    """
    now = time.time()
    stale = settings.get("stale_after_s")
    max_line = int(settings.get("max_line_bytes"))
    with _open_store(db) as con:
        with _transaction(con):
            if use_hooks and not fol.rollups_checked:
                fol.rollups_due |= rollups.behind(con)  # a kill between an earlier batch and its rollups
                fol.rollups_checked = True
            rows, status = fs.load_state(con)
            b = _Batch(now)
            if not (use_hooks and hooks.any_in_transaction(fol.off)):
                b.metric_rows.forget()  # no rollups to make from them: do not fold the rows into cells
                b.expert_rows.forget()
            used, more, did = 0, False, False
            room = _Room(db)
            with b.appends:  # the INSERTs run on its worker while the next pieces decode; drained here
                for lf in files:
                    if (only is not None and lf.rel != only) or not fs.has_work(lf, rows.get(lf.rel)):
                        continue
                    if not room.left(used, b):
                        more = True
                        break
                    st = _FileState(rows.get(lf.rel), lf, fs.siblings(lf, rows))
                    if st.restarted_from is not None:
                        b.messages.append(
                            f"{lf.path}: the file shrank or was replaced under the ingester (read up to byte "
                            f"{st.restarted_from:,}, now {lf.size:,} bytes); reading it again from the start: "
                            "events already stored are skipped as duplicates, new ones are added")
                    ended = lf.gz or status.get(lf.run) in STATUSES or now - lf.mtime > stale
                    while True:  # a catch-up goes on reading the file while nobody waits (`_Room`)
                        n, done = fs.process_file(con, b, lf, st, room.limit - used, ended, max_line)
                        used += n
                        b.n_bytes += n
                        if done or n == 0 or not room.left(used, b):
                            break
                    b.n_files += 1
                    # queued behind the file's INSERTs (`b.appends`); `st` as it is now, not as it may become
                    b.appends.submit(fs.save_file, con, lf, copy.copy(st), done, lf.rel in rows)
                    rows[lf.rel] = {"run": lf.run, "host": lf.host, "first_seq": st.first_seq, "last_seq": st.last_seq}
                    did = True
                    if used >= room.limit:
                        more = True
            if not did:
                # nothing new, but time passes: runs that went silent are now crashed
                mark_crashed(con, now)
                con.execute("COMMIT")
                return None, False
            flush(con, b)
            redact_metric_names(con, b)
            update_runs(con, b)
            mark_crashed(con, now)
            touched = {source for source in ROLLUP_SOURCES if b.touched[source]} if use_hooks else set()
            catch_up = b.n_bytes >= ROLL_UP_APART_BELOW
            if touched and catch_up:  # a catch-up: its rollups commit with it
                hooks.run_in_transaction(con, b.touched, fol.off, {"metrics": b.metric_rows, "expert_load": b.expert_rows})
                fol.rollups_due -= touched
                touched = set()
            hooks.save_pending(con)  # what the last batch's after-commit hooks keep in the store
            if use_hooks and catch_up and b.activity:
                b.prepared = hooks.prepare_after_commit(con, runs_dir, set(b.activity), fol.off | fol.unprepared)
            hooks.commit(con, b.prepared)
    fol.rollups_due |= touched
    return b, more


class _Room:
    """How many input bytes one write transaction may take in: `BATCH_BYTES`, and for a catch-up (a batch
    that reached it with more to read) `BATCH_BYTES` more each time while no reader waits for the store
    (`store.readers_waiting`), up to `CATCH_UP_PIECES` pieces, `CATCH_UP_ROWS` rows and `CATCH_UP_HOLD_S`
    of the transaction's time.

    A batch of 32 MB is fewer rows than one row group (`store.ROW_GROUP_ROWS`) at the 535b log's shape:
    DuckDB writes such a batch to its WAL, checkpoints it, then rewrites the partial row group with the
    next batch. A transaction of several row groups writes them once, as the engine's own append does,
    and runs the hooks fewer times. Measured side by side (hooks on, 100k-step 535b metrics log, in-process):
    ~10 % faster, about the machine's run-to-run noise; through the CLI at 20k steps no gain showed. A
    reader that comes meanwhile still waits for one `BATCH_BYTES` piece and the commit: the next look
    sees it and the transaction ends there."""

    def __init__(self, db: Path):
        self.db, self.limit, self.pieces, self.began = db, BATCH_BYTES, 1, time.monotonic()

    def left(self, used: int, b: _Batch) -> bool:
        """Whether the transaction may take in more after `used` bytes and the rows of `b` so far
        (raising `limit` if it grew)."""
        if used < self.limit:
            return True
        if (self.pieces >= CATCH_UP_PIECES or b.n_metric_values + b.n_expert_rows >= CATCH_UP_ROWS
                or time.monotonic() - self.began >= CATCH_UP_HOLD_S or store.readers_waiting(self.db)):  # fmt: skip
            return False
        self.limit, self.pieces = used + BATCH_BYTES, self.pieces + 1
        return True


CATCH_UP_PIECES = 4  # `BATCH_BYTES` pieces of one catch-up transaction at most (the ingester's RSS grows with it)
# rows of one catch-up transaction past which it takes in no more piece: a few row groups are written once
# either way, and expert_load lines (a 32 MB piece of the 535b log is ~3M rows) need no more pieces for that
CATCH_UP_ROWS = 4 * store.ROW_GROUP_ROWS
CATCH_UP_HOLD_S = 2.0  # a catch-up transaction takes in no more after this long (a look between pieces)


ROLLUP_SOURCES = rollups.SOURCES  # whose new rows the in-transaction hooks take in; the charts first
# A batch of fewer input bytes than this (a live run's tail: a follower's batch is a step or a few) is rolled
# up after its commit, in transactions of its own (`_roll_up`), so a reader waits for one short hold; a
# larger one (a catch-up, where nobody waits for a step) inside its own transaction, as the extra commits
# and checkpoints cost a bulk `observatory ingest` 7-11 % (535b logs, metrics and expert_load, 3 runs each)
ROLL_UP_APART_BELOW = 4 << 20


def _roll_up(db: Path, fol: Follower, emit: Callable[[str], None]) -> bool:
    """The in-transaction hooks over the committed rows of each source in `fol.rollups_due`, each source
    in a write transaction of its own. False if the store stayed busy (they stay due for the next pass).

    A hook that raises is rolled back, said, and left out for the rest of the call: the batch's rows
    are in already, and `observatory rebuild` rebuilds the rollups."""
    if not hooks.any_in_transaction(fol.off):
        fol.rollups_due.clear()  # every one failed earlier in this call: no transaction to open for them
        return True
    for source in [s for s in ROLLUP_SOURCES if s in fol.rollups_due]:
        touched = {s: ({"*"} if s == source else set()) for s in ROLLUP_SOURCES}  # the hooks find the runs
        try:
            with store.write_connection(db) as con, _transaction(con):
                hooks.run_in_transaction(con, touched, fol.off)
                con.execute("COMMIT")
        except store.StoreBusy as e:
            emit(f"{db}: {e}; will retry the rollups")
            return False
        except hooks.HookFailed as h:
            _hook_off(fol, h, emit)
        fol.rollups_due.discard(source)
    return True


def one_pass(runs_dir: Path, db: Path, report: IngestReport, fol: Follower, use_hooks: bool,
             emit: Callable[[str], None], progress: Callable[[dict], None] | None = None) -> None:  # fmt: skip
    """Ingest what the files have that the store has not; skip the lock when nothing changed on disk."""
    files = fs.readable(runs_dir, fol.skip, emit)
    sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in files), _db_sig(db))
    now = time.time()
    if sig == fol.sig and now - fol.last_crash_check < min(5.0, settings.get("stale_after_s") / 4):
        return  # nothing changed on disk: do not even take the lock
    fol.last_crash_check = now
    wrote = _batches(runs_dir, db, files, report, fol, use_hooks, emit, progress=progress)
    if wrote:
        # the hooks wrote findings into run folders: ingest them in this call, so that one command
        # leaves the store with everything it found (the hooks run again on this round's new
        # activity only: the observatory's own events are not activity, so this round ends it)
        files = fs.readable(runs_dir, fol.skip, emit)
        sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in files), _db_sig(db))
        wrote = _batches(runs_dir, db, files, report, fol, use_hooks, emit, findings=True, progress=progress)
    # the files as they were when this pass read them, not a scan taken now: a writer that appended
    # meanwhile (its last flush, say) must make the next pass read, not wait for the 5 s check
    fol.sig = (sig[0], _db_sig(db))
    if wrote:
        fol.sig = None  # a hook wrote after our last read: look again on the next pass, not in 5 s


def _batches(runs_dir: Path, db: Path, files: list[LogFile], report: IngestReport, fol: Follower, use_hooks: bool,
             emit: Callable[[str], None], findings: bool = False,
             progress: Callable[[dict], None] | None = None) -> set[str]:  # fmt: skip
    """Write transactions until `files` have no work left; returns the hooks that wrote events meanwhile.

    `findings`: this round ingests what the hooks just wrote; count the observatory's events as findings.
    `progress`: called at the start and after each batch with the bytes done and to do (`_progress`).
    """
    total = report.bytes + _pending_bytes(db, files) if progress is not None else 0
    if progress is not None:
        progress(_progress(report, total))
    wrote: set[str] = set()
    only: str | None = None
    queue = None  # set when isolating files after a failure
    if not _roll_up(db, fol, emit):  # what an earlier pass left due (the store was busy, or full)
        return wrote
    while True:
        try:
            b, more = _run_batch(db, runs_dir, files, only, fol, use_hooks)
        except store.StoreBusy as e:
            emit(f"{db}: {e}; will retry")
            return wrote
        except hooks.HookFailed as h:
            _hook_off(fol, h, emit)  # a catch-up batch's transaction was rolled back: do it again without
            continue
        except hooks.PrepareFailed as p:  # rolled back too: again, with that hook after the commit
            emit(f"observatory ingest: {p.hook.name}'s reads inside the batch failed ({type(p.error).__name__}: "
                 f"{p.error}); it runs after each commit from now on")  # fmt: skip
            fol.unprepared.add(p.hook.name)
            continue
        except Exception as e:
            if write_failure(e):
                raise  # the store cannot be written (full disk): no file is to blame; the caller retries
            if only is not None:
                emit(f"{runs_dir / only}: cannot ingest ({type(e).__name__}: {e}); skipped until the next ingest")
                fol.skip.add(only)
                files = [lf for lf in files if lf.rel != only]
            queue = [lf.rel for lf in files] if queue is None else [r for r in queue if r != only]
            only = queue[0] if queue else None
            if only is None:
                break
            continue
        if not _roll_up(db, fol, emit):  # also a batch of None: the rows an earlier call left behind
            return wrote
        if b is None:
            if queue:
                queue.pop(0)
                only = queue[0] if queue else None
                if only is not None:
                    continue
            break
        _add(report, b, emit)
        if progress is not None:
            progress(_progress(report, total))
        if findings:
            report.findings += sum(1 for e in b.events if e[1] == OBSERVATORY_HOST)
        if use_hooks and b.activity:
            wrote |= hooks.run_after_commit(db, runs_dir, set(b.activity), emit, b.prepared)
        if not more and queue is None:
            break
        time.sleep(0.02)  # let readers waiting at the gate in between two batches
    return wrote


def _pending_bytes(db: Path, files: list[LogFile]) -> int:
    """Bytes of `files` past what the store has read of them: the work a progress bar counts down."""
    stored: dict[str, int] = {}
    if db.exists():
        try:
            with store.connect(db, timeout_s=1.0) as con:
                stored = dict(con.execute("SELECT path, byte_offset FROM ingest_files").fetchall())
        except Exception:  # busy, or a store without tables yet: every byte is to do (only a bar's estimate)
            stored = {}
    return sum(max(lf.size - stored.get(lf.rel, 0), 0) for lf in files)


def _progress(report: IngestReport, total: int) -> dict:
    return {"done": report.bytes, "total": max(total, report.bytes), "unit": "bytes",
            "files": report.files, "events": report.events}  # fmt: skip


def _add(report: IngestReport, b: _Batch, emit: Callable[[str], None]) -> None:
    """Count a committed batch into the report and pass its messages on."""
    report.events += b.n_events
    report.metric_values += b.n_metric_values
    report.expert_rows += b.n_expert_rows
    report.rejected += b.n_rejected
    report.rejected_dropped += b.n_rejected - len(b.rejected)
    report.duplicates += b.n_duplicates
    report.truncated += b.n_truncated
    report.runs |= set(b.activity) | b.observed
    report.files += b.n_files
    report.fast_events += b.n_fast
    report.bytes += b.n_bytes
    for msg in b.messages:
        emit(msg)
    if len(b.rejected) > len(b.messages):
        emit(Rejection(f"... and {len(b.rejected) - len(b.messages)} more rejected lines: "
                       "observatory sql \"SELECT file, line, reason FROM rejected_events\""))  # fmt: skip
    for msg in b.dropped_messages():
        emit(msg)
        report.messages.append(msg)  # one per file and batch: past MESSAGE_LIMIT too, a count is never hidden
    if len(report.messages) < MESSAGE_LIMIT:
        report.messages.extend(b.messages[: MESSAGE_LIMIT - len(report.messages)])
