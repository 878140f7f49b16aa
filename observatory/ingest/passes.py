"""Passes and batches: each batch is one short write transaction over the files with work.

One pass: scan the runs dir (`files.scan`); while files have work, run a batch, one
straight line (`_run_batch`):

1. read: take the write lock, open the store, take the next files with work up to `BATCH_BYTES`
   of new bytes (`files.with_work`: listed once a pass), read their `ingest_files` rows (offsets,
   seq ranges);
2. validate and append: read each file from its offset, up to `BATCH_BYTES` in all
   (`files.process_file`: `msgspec_lines` decodes and certifies, `model` judges the
   rest; a sweep's small files are read whole and decoded together, `files.Small`);
   certified rows are appended as Arrow columns, one INSERT per `INSERT_ROWS` rows;
3. in the same transaction: the batch's staged rows, rejected lines and each file's new
   offset; fold the batch into `runs` (`runs.update_runs`), store `crashed` for runs that
   went silent; roll up (`observatory.store.rollups`, one statement per table for every
   run of the batch); then COMMIT, so a kill at any point leaves either all of the batch
   or none of it;
4. hand the committed batch to the caller (`batches` yields it): `observatory.pipeline.Ingester`
   runs the analyses (detectors, ladder watch, decisions, alerts) over its runs before the next.

What the stage keeps between passes is one `Stage` object, owned by its caller: the folder
listings, the files skipped, the store files whose schema it made sure of, the metric-name
layouts it learnt, the names known clean, and what the caller saves in each batch's transaction.
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
from observatory.events import RUN_ID_RE, STATUSES
from observatory.ingest import files as fs
from observatory.ingest.arrow import flush
from observatory.ingest.folders import Folders
from observatory.ingest.model import (
    MESSAGE_LIMIT,
    Batch,
    FileState,
    Rejection,
)
from observatory.ingest.msgspec_lines import Layouts
from observatory.ingest.redaction import redact_metric_names
from observatory.ingest.runs import mark_crashed, update_runs
from observatory.store import rollups

__all__ = ["BATCH_BYTES", "IngestReport", "Stage", "look", "batches", "looked", "write_failure"]

# input bytes per write transaction. Its metrics rows (~1.5M at a sweep's ~45 bytes a value) fill a row group
# (`store.connection.ROW_GROUP_ROWS`), which is written as it fills, before the COMMIT; at 32 MB no sweep's
# batch filled one, and its COMMIT wrote every row: a catch-up of 10^5 runs took ~10% longer
# (bench/bench_many_runs.py). A reader waits for at most one transaction: a big run's 64 MB
# held the lock 2.5 s (median; 3.8 s at most) here, a sweep's 4.5 s (8 s at most: 7,700 runs' rows and rollups).
BATCH_BYTES = 64 << 20
ALL_SOURCES = {"metrics": {"*"}, "expert_load": {"*"}}  # `touched` for "roll up every source's new rows"


@dataclass
class IngestReport:
    """What one `ingest` call did. `messages` are `file:line: reason` lines."""

    files: int = 0
    events: int = 0
    metric_values: int = 0
    expert_rows: int = 0
    rejected: int = 0  # rejected lines, stored in rejected_events or not
    rejected_dropped: int = (
        0  # of those, past max_rejected_per_file: counted in ingest_files, text not stored
    )
    duplicates: int = 0
    truncated: int = 0
    bytes: int = 0
    seconds: float = 0.0
    passes: int = 0
    fast_events: int = 0  # of `events`, how many msgspec_lines certified in bulk (the rest: check_line)
    findings: int = 0  # events the hooks wrote (anomalies, deviations, decision records), ingested too
    runs: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)
    # run folder whose name is no run id -> the first reason its lines were rejected: none of its lines can be
    # stored, so the CLI exits non-zero (`bad_run_ids_text`). A line whose `run` is not its (valid) folder's
    # is quarantined like any bad line: counted in `rejected`, the folder's other lines stored
    bad_run_ids: dict[str, str] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # files not ingested at all (said when skipped; exit 1)

    def summary(self) -> str:
        return (
            f"ingested {self.events} events ({self.metric_values} metric values, {self.expert_rows} "
            f"expert-load rows) from {self.files} file reads, {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s; "
            f"{self.rejected} rejected{self._dropped_text()}, {self.duplicates} duplicates skipped, "
            f"{self.truncated} truncated; "
            f"{self.findings} findings written"
            + (f"; {self.bad_run_ids_text()}" if self.bad_run_ids else "")
            + (f"; {self.skipped_text()}" if self.skipped else "")
        )

    def dropped(self) -> bool:
        """Whether data could not be stored: a file skipped, or a folder whose name is no run id."""
        return bool(self.bad_run_ids or self.skipped)

    def skipped_text(self) -> str:
        shown = ", ".join(self.skipped[:5]) + (
            f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
        )
        return f"{len(self.skipped)} file(s) not ingested (each said why above): {shown}"

    def bad_run_ids_text(self) -> str:
        names = sorted(self.bad_run_ids)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return (
            f"lines of {len(names)} run folder(s) rejected for their run id, so not in the store: {shown} "
            f"({self.bad_run_ids[names[0]]})"
        )

    def _dropped_text(self) -> str:
        return (
            f" ({self.rejected_dropped} of them not stored: max_rejected_per_file)"
            if self.rejected_dropped
            else ""
        )


class Stage:
    """The ingest stage's state between the passes of one ingester (`observatory.pipeline.Ingester`).

    `rollups`: whether each batch rolls up its rows (`observatory.store.rollups`) in its transaction.
    `savers`: what the caller keeps in the store, written by each batch's transaction (`saver(con)`; the
    detectors' progress, say): a write of its own would take the store's lock once more."""

    def __init__(self, rollups: bool = True, savers: tuple[Callable[[Any], None], ...] = ()):
        self.rollups = rollups
        self.savers = savers
        self.sig: Any = None
        self.skip: set[str] = set()  # files that cannot be ingested (until the next `ingest` call)
        self.rollups_failed = False  # the rollups raised once: batches run without them from then on
        self.last_crash_check = 0.0
        # the run folders' listings (`ingest.folders`), kept for the whole call
        self.folders: Folders | None = None
        # whether a batch of this call ran the rollups over every row past their watermark
        self.rolled_up = False
        self.ensured: set = set()  # (path, (inode, device)) of store files whose schema it made sure of
        self.layouts = Layouts()  # the runs' metric-name layouts the bulk decoder learnt
        self.clean_names: set[str] = set()  # metric names known to hold no secret (`redaction`)


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


class RollupsFailed(Exception):
    """The rollups raised inside a batch's transaction: it is rolled back and done again without them."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _roll_up(con, touched: dict[str, set[str]], st: Stage) -> None:
    """The rollups of `touched`'s rows, in the batch's transaction (`RollupsFailed` if they raise)."""
    if not st.rollups or st.rollups_failed or not (touched["metrics"] or touched["expert_load"]):
        return
    try:
        rollups.after_ingest(con, touched)
    except Exception as e:
        raise RollupsFailed(e) from e


def _rollups_off(st: Stage, h: RollupsFailed, emit: Callable[[str], None]) -> None:
    """Say that the rollups failed (their transaction was rolled back) and leave them out from now on."""
    e = h.error
    emit(
        f"observatory ingest: rollups.after_ingest failed ({type(e).__name__}: {e}); "
        "ingesting without rollups from now on (`observatory rebuild` rebuilds them)"
    )
    st.rollups_failed = True


def _open_store(db: Path, st: Stage):
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
        if (str(db), _db_sig(db)) not in st.ensured or not _has_schema(con):
            store.ensure_schema(con)  # DDL costs ~0.1 s a batch; once per store file is enough
            st.ensured.add((str(db), _db_sig(db)))
    except Exception as e:
        con.close(reuse=False)
        if write_failure(e):
            raise
        raise store.StoreUnusable(db, e) from e
    return con


def _run_batch(
    db: Path, runs_dir: Path, scan: fs.Scan, only: str | None, fol: Stage
) -> tuple[Batch | None, bool]:
    """One write transaction over files with work, top to bottom: read and validate each file's new lines
    (up to `BATCH_BYTES` in all), append the rows, fold the runs, roll up, COMMIT. Returns (the batch, or
    None if nothing was new; whether work is left)."""
    now = time.time()
    stale = settings.get("stale_after_s")
    max_line = int(settings.get("max_line_bytes"))
    with _open_store(db, fol) as con:
        with _transaction(con):
            # the listings the scan made, kept: a later call lists only the folders that changed
            if scan.folders is not None:
                scan.folders.save(con)
            # the few with new bytes, a batch's worth (at 10^5 runs too), with their stored state
            work = fs.Work(con, scan, only, None if only is not None else BATCH_BYTES)
            rows, status, by_host = work.rows, work.status, work.by_host
            b = Batch(now, layouts=fol.layouts)
            # where this batch's rows begin in each table: the detectors read the runs it began from there
            b.metrics_start, b.experts_start = con.execute(
                "SELECT (SELECT count(*) FROM metrics), (SELECT count(*) FROM expert_load)"
            ).fetchall()[0]
            used, more = 0, False
            saves = []  # (file, its state, done, stored): the batch's ingest_files rows, written together
            small = fs.Small(con, b, max_line)  # a sweep's small files, decoded together

            def record(lf: fs.LogFile, st: FileState, done: bool) -> None:
                saves.append((lf, copy.copy(st), done, lf.rel in rows))
                rows[lf.rel] = {
                    "run": lf.run,
                    "host": lf.host,
                    "first_seq": st.first_seq,
                    "last_seq": st.last_seq,
                }
                fs.index_row(by_host, lf.rel, rows[lf.rel])

            def done_small() -> None:
                for lf, st in small.flush():
                    record(lf, st, True)

            def listed() -> Iterator[fs.LogFile]:
                yield from list(work.files)
                if work.left_out and not more:  # they gave less than their sizes said
                    done_small()  # (the rest may hold their siblings)
                    b.appends.drain()  # the rest is looked up on the connection the INSERTs use
                    yield from work.rest()

            with b.appends:  # the rows held for one INSERT per INSERT_ROWS; the rest inserted here
                for lf in listed():
                    if more:
                        break
                    st = FileState(rows.get(lf.rel), lf, fs.siblings(lf, by_host))
                    if st.restarted_from is not None:
                        b.messages.append(
                            f"{lf.path}: the file shrank or was replaced under the ingester (read up to byte "
                            f"{st.restarted_from:,}, now {lf.size:,} bytes); reading it again from the start: "
                            "events already stored are skipped as duplicates, new ones are added"
                        )
                    n = None
                    if work.alone[(lf.run, lf.host)] == 1 and not st.siblings:
                        n = small.take(lf, st)
                    if n is not None:
                        used += n
                        b.n_bytes += n
                        b.n_files += 1
                        more = used >= BATCH_BYTES
                        if small.due():
                            done_small()
                        continue
                    done_small()  # first: in file order, as if each were read alone (a run_end before a torn line)
                    ended = lf.gz or status.get(lf.run) in STATUSES or now - lf.mtime > stale
                    n, done = fs.process_file(con, b, lf, st, BATCH_BYTES - used, ended, max_line)
                    used += n
                    b.n_bytes += n
                    b.n_files += 1
                    record(lf, st, done)
                    # full: a file that read some and stopped short of its end stopped at the budget
                    more = used >= BATCH_BYTES or bool(n and not done)
                done_small()
            more = more or work.left_out  # files left for the next batch
            if not saves:
                # nothing new, but time passes: runs that went silent are now crashed
                mark_crashed(con, now)
                if fol.rollups and not fol.rolled_up:  # rows an earlier call (hooks off) left without rollups
                    _roll_up(con, ALL_SOURCES, fol)
                    fol.rolled_up = True
                con.execute("COMMIT")
                return None, False
            fs.save_files(con, saves)
            flush(con, b)
            redact_metric_names(con, b, fol.clean_names)
            update_runs(con, b)
            mark_crashed(con, now)
            if fol.rollups:  # the first batch of a call also rolls up what an earlier call left (hooks off)
                _roll_up(con, b.touched if fol.rolled_up else ALL_SOURCES, fol)
                fol.rolled_up = True
            for save in fol.savers:  # what the caller keeps in the store (the last batch's analyses reached)
                save(con)
            con.execute("COMMIT")
            scan.read_to_end(lf.rel for lf, _, done, _ in saves if done)
    return b, more


def look(
    runs_dir: Path, db: Path, st: Stage, emit: Callable[[str], None], force: bool = False
) -> fs.Scan | None:
    """The runs dir's logs as they are now, or None when nothing changed on disk since the last pass (and
    the check for runs gone silent is not due, nor `force`d): then the store's lock is not even taken."""
    if st.folders is None:
        st.folders = Folders(db)
    files = fs.scan(runs_dir, st.skip, emit, st.folders)
    now = time.time()
    if (
        (files.sig(), _db_sig(db)) == st.sig
        and now - st.last_crash_check < min(5.0, settings.get("stale_after_s") / 4)
        and not force
    ):
        return None
    st.last_crash_check = now
    return files


def looked(db: Path, st: Stage, files: fs.Scan | None) -> None:
    """The pass read `files` (as they were when it read them, not a scan taken now: a writer that appended
    meanwhile must make the next pass read); None: look again on the next pass (something was written
    after the last read)."""
    st.sig = None if files is None else (files.sig(), _db_sig(db))


def batches(
    runs_dir: Path,
    db: Path,
    files: fs.Scan,
    report: IngestReport,
    fol: Stage,
    emit: Callable[[str], None],
    progress: Callable[[dict], None] | None = None,
) -> Iterator[Batch]:
    """Write transactions until `files` have no work left; yields each batch once it is committed and
    counted into `report` (the caller runs its analyses then, before the next batch).

    `progress`: called at the start and after each batch with the bytes done and to do (`_progress`).
    """
    total = report.bytes + _pending_bytes(db, files) if progress is not None else 0
    if progress is not None:
        progress(_progress(report, total))
    only: str | None = None
    queue = None  # set when isolating files after a failure

    def next_turn() -> str | None:
        """One file at a time: the queue's head is read as far as it goes; the next one's turn (not a new look
        at the head: the pass's listing of it may be stale, and it would be read again forever)."""
        queue.pop(0)
        return queue[0] if queue else None

    while True:
        try:
            b, more = _run_batch(db, runs_dir, files, only, fol)
        except store.StoreBusy as e:
            emit(f"{db}: {e}; will retry")
            return
        except RollupsFailed as h:
            _rollups_off(fol, h, emit)  # the batch's transaction was rolled back: do it again without them
            continue
        except Exception as e:
            if write_failure(e):
                raise  # the store cannot be written (full disk): no file is to blame; the caller retries
            if only is not None:
                emit(
                    f"{runs_dir / only}: cannot ingest ({type(e).__name__}: {e}); skipped until the next ingest"
                )
                fol.skip.add(only)
                files = files.without(only)
            elif queue is None:  # said once: a failure no file turns out to cause is still heard of
                emit(
                    f"{runs_dir}: a batch failed ({type(e).__name__}: {e}); nothing of it was stored, and its "
                    "files are read again one at a time, so that only a file that fails alone is skipped"
                )
            queue = _with_work(db, files) if queue is None else [r for r in queue if r != only]
            only = queue[0] if queue else None
            if only is None:
                break
            continue
        if b is None:
            if queue and (only := next_turn()) is not None:
                continue
            break
        _add(report, b, emit)
        if progress is not None:
            progress(_progress(report, total))
        yield b
        if not more and (queue is None or (only := next_turn()) is None):
            break
        time.sleep(0.02)  # let readers waiting at the gate in between two batches


def _pending_bytes(db: Path, files: fs.Scan) -> int:
    """Bytes of `files` past what the store has read of them: the work a progress bar counts down."""
    if db.exists():
        try:
            with store.connect(db, timeout_s=1.0) as con:
                return fs.pending_bytes(con, files)
        except Exception:  # busy, or a store without tables yet: every byte is to do (only a bar's estimate)
            pass
    return sum(files.size)


def _with_work(db: Path, files: fs.Scan) -> list[str]:
    """The files with work, one at a time after a batch failed: which one is to blame."""
    with store.connect(db) as con:
        return [lf.rel for lf in fs.with_work(con, files)[0]]


def _progress(report: IngestReport, total: int) -> dict:
    return {
        "done": report.bytes,
        "total": max(total, report.bytes),
        "unit": "bytes",
        "files": report.files,
        "events": report.events,
    }


def _add(report: IngestReport, b: Batch, emit: Callable[[str], None]) -> None:
    """Count a committed batch into the report and pass its messages on."""
    report.events += b.n_events
    report.metric_values += b.n_metric_values
    report.expert_rows += b.n_expert_rows
    report.rejected += b.n_rejected
    report.rejected_dropped += b.n_rejected - len(b.rejected)
    report.duplicates += b.n_duplicates
    report.truncated += b.n_truncated
    report.runs |= set(b.activity) | b.observed
    for _, folder, _, fld, reason, *_ in b.rejected:
        if fld == "run" and not RUN_ID_RE.match(folder):  # no line of the folder can be stored
            report.bad_run_ids.setdefault(folder, reason)
    report.files += b.n_files
    report.fast_events += b.n_fast
    report.bytes += b.n_bytes
    for msg in b.messages:
        emit(msg)
    if len(b.rejected) > len(b.messages):
        emit(
            Rejection(
                f"... and {len(b.rejected) - len(b.messages)} more rejected lines: "
                'observatory sql "SELECT file, line, reason FROM rejected_events"'
            )
        )
    for msg in b.dropped_messages():
        emit(msg)
        report.messages.append(msg)  # one per file and batch: past MESSAGE_LIMIT too, a count is never hidden
    if len(report.messages) < MESSAGE_LIMIT:
        report.messages.extend(b.messages[: MESSAGE_LIMIT - len(report.messages)])
