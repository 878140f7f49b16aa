"""Ingest: event logs → DuckDB store, incremental, exactly-once, every line validated.

    report = ingest("data/runs", "data/observatory.duckdb")          # one pass
    ingest(runs, db, follow=True, stop_event=ev)                      # tail until stopped

Layout read: `<runs>/<run>/events.<host>.jsonl` (and `.jsonl.gz`, import copies).

How one pass works (one short write transaction per batch, see `store.py`):

1. Scan the runs dir; stat every log. A plain log with bytes past its stored
   offset, or a `.gz` whose size or mtime changed, has work.
2. Take the write lock, open the store, read `ingest_files` (offsets, seq ranges).
3. For each file, read up to a byte budget of complete lines from its offset.
   `ingest_fast` decodes them with msgspec and appends metrics / expert_load rows
   as Arrow columns, handing each line it cannot certify to `validate_event` and
   each piece it cannot decode to the path below (same store either way).
   There, bytes go to DuckDB zero-copy as an Arrow string column; DuckDB's JSON reader
   parses them and a conservative vectorised check (`ingest_lines._STAGE_SQL`) marks the lines
   that are certainly valid `metrics` / `expert_load` events (the hot, bulky
   kinds). Every other line -- other kinds, NaN strings, anything odd -- is
   decoded in Python and checked by `observatory.events.validate_event`, which
   stays the one definition of "valid" (tests check the fast path never accepts
   what it rejects). Seq order and (run, host, seq) duplicates are checked for
   every line in file order.
4. Rows go in as bulk `INSERT ... SELECT` from the staged Arrow data; rejected
   lines go to `rejected_events`; the file's new offset goes to `ingest_files`;
   `runs` is updated; the dashboard's rollups hook runs -- all in one transaction,
   so a kill at any point leaves either all of the batch or none of it.
5. Commit, close, release the lock; then the anomaly and decision hooks run
   (they write findings and auto decision records as host-1000 events). When the
   decision hook wrote, the pass ingests once more, so one `ingest` call leaves the
   records in the store; anomaly findings of that last round wait for the next pass.

Torn last lines (no final newline) wait while the run may be live and are
recorded as `truncated` once it ended or went quiet for `stale_after_s`.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observatory import settings, store
from observatory.events import OBSERVATORY_HOST, STATUSES, encode_value
from observatory.ingest.msgspec_lines import ingest_chunk
from observatory.ingest.sql_lines import (
    I64,
    MESSAGE_LIMIT,
    U16,
    LogFile,
    _Batch,
    _FileState,
    _flush,
    _read_chunk,
)

__all__ = ["ingest", "rebuild", "IngestReport", "LogFile", "scan"]

FILE_RE = re.compile(r"^events\.(\d+)\.jsonl(\.gz)?$")
BATCH_BYTES = 32 << 20  # input bytes per write transaction: keeps each lock hold well under a second or two
GZ_BATCH_BYTES = 256 << 20  # .gz has no cheap seek, so take bigger bites


@dataclass
class IngestReport:
    """What one `ingest` call did. `messages` are `file:line: reason` lines."""

    files: int = 0
    events: int = 0
    metric_values: int = 0
    expert_rows: int = 0
    rejected: int = 0
    duplicates: int = 0
    truncated: int = 0
    bytes: int = 0
    seconds: float = 0.0
    passes: int = 0
    fast_events: int = 0  # of `events`, how many the vectorised path accepted (the rest: validate_event)
    runs: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"ingested {self.events} events ({self.metric_values} metric values, {self.expert_rows} "
            f"expert-load rows) from {self.files} file reads, {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s; "
            f"{self.rejected} rejected, {self.duplicates} duplicates skipped, {self.truncated} truncated"
        )


def scan(runs_dir: Path) -> list[LogFile]:
    """Every event log under the runs dir; a run's `.gz` copies come before its live files."""
    out = []
    try:
        run_dirs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    for d in run_dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            m = FILE_RE.match(name)
            if not m:
                continue
            p = d / name
            try:
                st = p.stat()
            except OSError:
                continue
            out.append(LogFile(p, f"{d.name}/{name}", d.name, int(m.group(1)), bool(m.group(2)), st.st_size, st.st_mtime))
    out.sort(key=lambda f: (f.run, f.host, not f.gz, f.rel))
    return out


_RUN_COLS = (
    "run", "name", "status", "start_time", "end_time", "last_event_t", "last_step", "final_step",
    "parent_run", "parent_step", "ladder_name", "ladder_rung", "ladder", "config", "tags", "code", "data", "mesh", "model",
)  # fmt: skip
_JSON_COLS = ("ladder", "config", "code", "data", "mesh", "model")


def _update_runs(con, b: _Batch) -> None:
    """Fold this batch's lifecycle events and activity into `runs` (one row per touched run)."""
    touched = sorted(set(b.activity) | {e["run"] for e in b.lifecycle if e["host"] != OBSERVATORY_HOST})
    if not touched:
        return
    rows = con.execute(f"SELECT {', '.join(_RUN_COLS)} FROM runs WHERE run IN (SELECT unnest($r))", {"r": touched}).fetchall()
    existing = {r[0]: dict(zip(_RUN_COLS, r, strict=True)) for r in rows}
    out = []
    for run in touched:
        r = existing.get(run) or dict.fromkeys(_RUN_COLS)
        r["run"] = run
        for c in _JSON_COLS:
            if isinstance(r[c], str):
                r[c] = json.loads(r[c])
        if r["status"] in (None, "crashed"):
            r["status"] = "running"  # new events from a run shown as crashed: it is alive after all
        for e in sorted((e for e in b.lifecycle if e["run"] == run and e["host"] != OBSERVATORY_HOST), key=lambda e: e["t"]):
            d = e["data"]
            if e["kind"] == "run_start":
                if r["end_time"] is not None and e["t"] >= r["end_time"]:
                    r["status"], r["end_time"], r["final_step"] = "running", None, None  # resumed
                r["start_time"] = e["t"] if r["start_time"] is None else min(r["start_time"], e["t"])
                for key in ("name", "config", "ladder", "code", "data", "mesh", "model", "tags"):
                    if d.get(key) is not None:
                        r[key] = d[key]
                parent = d.get("parent") or {}
                if isinstance(parent, dict) and parent.get("run") is not None:
                    r["parent_run"], r["parent_step"] = str(parent["run"]), _int_or_none(parent.get("step"))
                ladder = d.get("ladder") or {}
                if isinstance(ladder, dict) and ladder:
                    r["ladder_name"] = _str_or_none(ladder.get("name"))
                    r["ladder_rung"] = _str_or_none(ladder.get("rung"))
            elif r["end_time"] is None or e["t"] >= r["end_time"]:  # run_end
                r["status"], r["end_time"] = d["status"], e["t"]
                r["final_step"] = _int_or_none(d.get("final_step"))
                if r["final_step"] is None:
                    r["final_step"] = r["last_step"]
        t, step = b.activity.get(run, (None, None))
        if t is not None and (r["last_event_t"] is None or t > r["last_event_t"]):
            r["last_event_t"] = t
        if step is not None and (r["last_step"] is None or step > r["last_step"]):
            r["last_step"] = step
        if r["name"] is None:
            r["name"] = run
        for c in _JSON_COLS:
            r[c] = None if r[c] is None else json.dumps(encode_value(r[c]))
        out.append(tuple(r[c] for c in _RUN_COLS))
    placeholders = ", ".join("?::JSON" if c in _JSON_COLS else "?" for c in _RUN_COLS)
    con.executemany(f"INSERT OR REPLACE INTO runs ({', '.join(_RUN_COLS)}) VALUES ({placeholders})", out)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) <= I64 else None


def _str_or_none(x: Any) -> str | None:
    return None if x is None else str(x)


def _mark_crashed(con, now: float) -> None:
    con.execute(
        "UPDATE runs SET status = 'crashed' WHERE status = 'running' AND last_event_t < $cut",
        {"cut": now - settings.get("stale_after_s")},
    )


# --------------------------------------------------------------- the passes


def _optional_module(name: str):
    """observatory.<name> if that module exists (another engineer's hook), else None."""
    try:
        mod = {"rollups": "store.rollups", "anomalies": "detect.scan", "ladder_watch": "ladder.watch"}.get(name, name)
        return importlib.import_module(f"observatory.{mod}")
    except ModuleNotFoundError as e:
        if e.name == f"observatory.{name}":
            return None
        raise


def _load_state(con) -> tuple[dict[str, dict], dict[str, str]]:
    cols = ("path", "run", "host", "byte_offset", "line", "first_seq", "last_seq", "cursor_seq", "size", "mtime")
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in con.execute(f"SELECT {', '.join(cols)} FROM ingest_files").fetchall()}
    status = dict(con.execute("SELECT run, status FROM runs").fetchall())
    return rows, status


def _has_work(lf: LogFile, row: dict | None) -> bool:
    if row is None:
        return True
    if lf.gz:
        return row["size"] != lf.size or row["mtime"] != lf.mtime
    return lf.size != row["byte_offset"]


def _siblings(lf: LogFile, rows: dict[str, dict]) -> list[tuple[int, int]]:
    return [
        (r["first_seq"], r["last_seq"])
        for path, r in rows.items()
        if path != lf.rel and r["run"] == lf.run and r["host"] == lf.host and r["first_seq"] is not None
    ]


def _process_file(con, b: _Batch, lf: LogFile, st: _FileState, budget: int, ended: bool, max_line: int) -> tuple[int, bool]:
    """Ingest from `st.offset` until EOF or `budget` bytes; returns (bytes consumed, reached EOF)."""
    read_size = max(GZ_BATCH_BYTES if lf.gz else budget, max_line + 2)
    used = 0
    while used < budget or lf.gz:  # a .gz counts as read only at its end (else it is re-read from 0, forever)
        start = st.offset
        ch = _read_chunk(lf, start, read_size, max_line)
        if ch.error and ch.transient:
            b.messages.append(f"{lf.path}: {ch.error}; will retry")
            return used, False
        if ch.error:
            b.reject(lf, st.line + 1, "(file)", ch.error, b"")
            return used, True
        if ch.data or ch.oversized:
            ingest_chunk(con, b, lf, st, ch, max_line)  # msgspec path, else the DuckDB/validate_event one
        used += ch.end - start
        if ch.eof:
            if ch.tail_len and (ended or _ended_in_batch(b, lf.run)):
                what = f"a {ch.tail_len}-byte final line" if ch.tail_len <= max_line else "an oversized final line"
                b.reject(lf, st.line + 1, "(line)", f"truncated: {what} has no newline (the writer died mid-line)", ch.tail)
                b.n_truncated += 1
                st.offset += ch.tail_len
                st.line += 1
            return used, True
        if ch.end == start:
            break
    return used, False


def _ended_in_batch(b: _Batch, run: str) -> bool:
    last = [e["kind"] for e in b.lifecycle if e["run"] == run]
    return bool(last) and last[-1] == "run_end"


def _save_file(con, lf: LogFile, st: _FileState, done: bool) -> None:
    size = lf.size if (done or not lf.gz) else None  # a .gz counts as read only when read to its end
    con.execute(
        "INSERT OR REPLACE INTO ingest_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (lf.rel, lf.run, lf.host, st.offset, st.line, st.first_seq, st.last_seq, st.cursor, size, lf.mtime),
    )


def _run_batch(db: Path, files: list[LogFile], only: str | None, use_rollups: bool) -> tuple[_Batch | None, bool]:
    """One write transaction over files with work. Returns (batch or None if idle, more work left)."""
    rollups = _optional_module("rollups") if use_rollups else None
    now = time.time()
    stale = settings.get("stale_after_s")
    max_line = int(settings.get("max_line_bytes"))
    with store.write_connection(db) as con:
        con.execute("SET enable_progress_bar = false")
        if (str(db), _db_sig(db)) not in _ENSURED or not _has_schema(con):
            store.ensure_schema(con)  # DDL costs ~0.1 s a batch; once per store file is enough
            _ENSURED.add((str(db), _db_sig(db)))
        con.execute("BEGIN TRANSACTION")
        try:
            rows, status = _load_state(con)
            b = _Batch(now)
            used, more, did = 0, False, False
            for lf in files:
                if (only is not None and lf.rel != only) or not _has_work(lf, rows.get(lf.rel)):
                    continue
                if used >= BATCH_BYTES:
                    more = True
                    break
                st = _FileState(rows.get(lf.rel), lf, _siblings(lf, rows))
                ended = lf.gz or status.get(lf.run) in STATUSES or now - lf.mtime > stale
                n, done = _process_file(con, b, lf, st, BATCH_BYTES - used, ended, max_line)
                used += n
                b.n_bytes += n
                b.n_files += 1
                _save_file(con, lf, st, done)
                rows[lf.rel] = {"run": lf.run, "host": lf.host, "first_seq": st.first_seq, "last_seq": st.last_seq}
                did = True
                if used >= BATCH_BYTES:
                    more = True
            if not did:
                # nothing new, but time passes: runs that went silent are now crashed
                _mark_crashed(con, now)
                con.execute("COMMIT")
                return None, False
            _flush(con, b)
            _update_runs(con, b)
            _mark_crashed(con, now)
            if rollups is not None and (b.touched["metrics"] or b.touched["expert_load"]):
                try:
                    rollups.after_ingest(con, b.touched)
                except Exception as e:
                    raise _HookFailed(e) from e
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:
                pass
            raise
    return b, more


def _has_schema(con) -> bool:
    import duckdb

    try:
        con.execute("SELECT 1 FROM ingest_files LIMIT 0").fetchall()
        return True
    except duckdb.CatalogException:
        return False


_ENSURED: set = set()  # (inode, device) of store files whose schema this process made sure of


class _Follower:
    """State kept between passes of one `ingest` call."""

    def __init__(self):
        self.sig: Any = None
        self.skip: set[str] = set()
        self.use_rollups = True
        self.last_crash_check = 0.0


def _db_sig(db: Path) -> Any:
    try:
        st = db.stat()
        return (st.st_ino, st.st_dev)
    except FileNotFoundError:
        return None


def _files(runs_dir: Path, fol: _Follower, emit: Callable[[str], None]) -> list[LogFile]:
    """The logs to read this pass: every scanned file not skipped; a host the store cannot keep skips its file."""
    files = []
    for lf in scan(runs_dir):
        if lf.rel in fol.skip:
            continue
        if lf.host > U16:
            # the store keeps hosts as USMALLINT (ingest_files, every table): say so once and go on
            emit(f"{runs_dir / lf.rel}: host {lf.host} in the file name is above {U16}, the largest host the "
                 f"store keeps; file skipped (rename it events.<host>.jsonl with a host in 0..{U16})")
            fol.skip.add(lf.rel)
            continue
        files.append(lf)
    return files


def _one_pass(runs_dir: Path, db: Path, report: IngestReport, fol: _Follower, hooks: bool, emit: Callable[[str], None]) -> None:
    files = _files(runs_dir, fol, emit)
    sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in files), _db_sig(db))
    now = time.time()
    if sig == fol.sig and now - fol.last_crash_check < min(5.0, settings.get("stale_after_s") / 4):
        return  # nothing changed on disk: do not even take the lock
    fol.last_crash_check = now
    wrote = _batches(runs_dir, db, files, report, fol, hooks, emit)
    if "decisions" in wrote:
        # the decision hook wrote records: ingest them now, so one `observatory ingest` leaves them in
        # the store (the hook runs again on this round's new activity only, and skips ids it knows)
        files = _files(runs_dir, fol, emit)
        sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in files), _db_sig(db))
        wrote = _batches(runs_dir, db, files, report, fol, hooks, emit)
    # the files as they were when this pass read them, not a scan taken now: a writer that appended
    # meanwhile (its last flush, say) must make the next pass read, not wait for the 5 s check
    fol.sig = (sig[0], _db_sig(db))
    if wrote:
        fol.sig = None  # a hook wrote after our last read: look again on the next pass, not in 5 s


def _batches(runs_dir: Path, db: Path, files: list[LogFile], report: IngestReport, fol: _Follower, hooks: bool,
             emit: Callable[[str], None]) -> set[str]:  # fmt: skip
    """Write transactions until `files` have no work left; returns the hooks that wrote events meanwhile."""
    wrote: set[str] = set()
    only: str | None = None
    queue = None  # set when isolating files after a failure
    while True:
        try:
            b, more = _run_batch(db, files, only, fol.use_rollups and hooks)
        except store.StoreBusy as e:
            emit(f"{db}: {e}; will retry")
            return wrote
        except _HookFailed as h:
            # the batch was rolled back; do it again without the hook rather than lose it
            e = h.error
            emit(f"observatory ingest: rollups.after_ingest failed ({type(e).__name__}: {e}); "
                 "ingesting without rollups from now on (`observatory rebuild` rebuilds them)")  # fmt: skip
            fol.use_rollups = False
            continue
        except Exception as e:
            if only is not None:
                emit(f"{runs_dir / only}: cannot ingest ({type(e).__name__}: {e}); skipped until the next ingest")
                fol.skip.add(only)
                files = [lf for lf in files if lf.rel != only]
            queue = [lf.rel for lf in files] if queue is None else [r for r in queue if r != only]
            only = queue[0] if queue else None
            if only is None:
                break
            continue
        if b is None:
            if queue:
                queue.pop(0)
                only = queue[0] if queue else None
                if only is not None:
                    continue
            break
        report.events += b.n_events
        report.metric_values += b.n_metric_values
        report.expert_rows += b.n_expert_rows
        report.rejected += len(b.rejected)
        report.duplicates += b.n_duplicates
        report.truncated += b.n_truncated
        report.runs |= set(b.activity) | b.observed
        report.files += b.n_files
        report.fast_events += b.n_fast
        report.bytes += b.n_bytes
        for msg in b.messages:
            emit(msg)
        if len(b.rejected) > len(b.messages):
            emit(f"... and {len(b.rejected) - len(b.messages)} more rejected lines: "
                 "observatory sql \"SELECT file, line, reason FROM rejected_events\"")  # fmt: skip
        if len(report.messages) < MESSAGE_LIMIT:
            report.messages.extend(b.messages[: MESSAGE_LIMIT - len(report.messages)])
        if hooks and b.activity:
            if _anomaly_hook(db, runs_dir, set(b.activity), emit):
                wrote.add("anomalies")
            if _decision_hook(db, runs_dir, set(b.activity), emit):
                wrote.add("decisions")
        if not more and queue is None:
            break
        time.sleep(0.02)  # let readers waiting at the gate in between two batches
    return wrote


class _HookFailed(Exception):
    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


def _anomaly_hook(db: Path, runs_dir: Path, runs: set[str], emit: Callable[[str], None]) -> bool:
    """Run the detectors on the runs a batch touched; True when they wrote findings (events)."""
    try:
        anomalies = _optional_module("anomalies")
        if anomalies is not None:
            return bool(anomalies.after_ingest(db, runs_dir, runs))
    except Exception as e:  # a detector must never take ingest down
        emit(f"observatory ingest: anomalies.after_ingest failed: {type(e).__name__}: {e}")
    return False


def _decision_hook(db: Path, runs_dir: Path, runs: set[str], emit: Callable[[str], None]) -> bool:
    """Auto decision records for new config_diff / handled failure events; True when it wrote some.

    Idempotent (ids `auto-<run>-<seq>`), so running it again on the same runs writes nothing.
    """
    try:
        decisions = _optional_module("decisions")
        if decisions is not None:
            return bool(decisions.after_ingest(db, runs_dir, runs))
    except Exception as e:  # a record keeper must never take ingest down
        emit(f"observatory ingest: decisions.after_ingest failed: {type(e).__name__}: {e}")
    return False


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
) -> IngestReport:
    """Load every event log under `runs_dir` into the store `db`; return what happened.

    Incremental and exactly-once: a second call adds only what was appended since.
    With `follow`, keep polling every `follow_interval_s` until `stop_event` is set
    or SIGINT/SIGTERM arrives (when called from the main thread). `emit` receives
    each `file:line: reason` message (default: stderr; None to stay quiet).
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    emit = emit or (lambda _msg: None)
    report = IngestReport()
    fol = _Follower()
    t0 = time.perf_counter()
    stop = stop_event or threading.Event()
    old: dict[int, Any] = {}
    if follow and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: stop.set())
    if not runs_dir.is_dir():
        emit(f"{runs_dir}: runs dir does not exist{' (yet); waiting for it' if follow else ''}")
    if follow and hooks:  # import the hooks now, not in the middle of the first live batch
        # (ladder_watch: anomalies imports it, and scipy with it, on its first call: ~3 s without ingesting)
        for name in ("rollups", "anomalies", "decisions", "ladder_watch"):
            try:
                _optional_module(name)
            except Exception as e:
                emit(f"observatory ingest: cannot import observatory.{name}: {type(e).__name__}: {e}")
    try:
        while True:
            try:
                _one_pass(runs_dir, db, report, fol, hooks, emit)
            except Exception as e:
                if not follow:
                    raise
                emit(f"observatory ingest: pass failed ({type(e).__name__}: {e}); retrying")
                fol.sig = None
            report.passes += 1
            if not follow or stop.wait(settings.get("follow_interval_s")):
                break
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        report.seconds = time.perf_counter() - t0
    return report


def rebuild(runs_dir: str | os.PathLike | None = None, db: str | os.PathLike | None = None, *,
            emit: Callable[[str], None] | None = _stderr) -> IngestReport:  # fmt: skip
    """Recreate the store from the event logs: build a fresh file beside it, then swap it in atomically.

    Readers see the old store until the swap and the new one after; neither half-built.
    Rollups are rebuilt with it; the anomaly and decision hooks are not run (what they wrote
    is already events, so the new store holds it too).
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f"{db.name}.rebuild-{os.getpid()}")
    for p in (tmp, tmp.with_name(tmp.name + ".wal")):
        p.unlink(missing_ok=True)
    try:
        report = ingest(runs_dir, tmp, hooks=False, emit=emit)
        rollups = _optional_module("rollups")
        if rollups is not None and hasattr(rollups, "rebuild_rollups"):
            with store.write_connection(tmp) as con:
                con.execute("BEGIN TRANSACTION")
                rollups.rebuild_rollups(con)
                con.execute("COMMIT")
        with store.write_connection(db) as con:  # hold the store's locks: nobody opens it mid-swap
            con.duckdb.close()
            os.replace(tmp, db)
            db.with_name(db.name + ".wal").unlink(missing_ok=True)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + ".gate"), tmp.with_name(tmp.name + ".lock")):
            p.unlink(missing_ok=True)
    return report
