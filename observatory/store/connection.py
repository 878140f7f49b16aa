"""Connections to the store: read-only by default, one unit of work each, safe across processes.

Concurrency (docs/architecture.md, "The rule for the store"). DuckDB lets one read-write process or many read-only ones
hold the file, never both, and a process that finds the file busy gets an error. So every
connection made here first takes advisory `flock`s beside the store (per open file, across
processes): `<db>.gate`, the turnstile that keeps the one writer from starving behind a stream
of readers, and `<db>.lock`, which readers hold shared for the life of their connection and the
writer exclusively for one short transaction. The states of one store:

    FREE ───── reader: gate SH (passed at once), lock SH ─────▶ READING (n readers hold lock SH)
    READING ── reader: the same ──────────────────────────────▶ READING (n + 1)
    READING ── reader closes ─────────────────────────────────▶ READING (n - 1), FREE at n = 0
    FREE / READING ── writer: lock EX in a gap (n = 0 within GAP_WAIT_S) ──▶ WRITING
    READING ── writer: no gap: gate EX, then waits for lock EX ──▶ DRAINING
    DRAINING ─ new readers wait at the gate; the n in flight close ──▶ WRITING (gate EX, lock EX)
    WRITING ── COMMIT, close: its locks released ─────────────▶ FREE (readers waiting at the gate pass)

Every wait polls with bounded backoff up to `lock_timeout_s`, then raises a `StoreBusy` that
says who to wait for. Nobody holds a connection longer than one unit of work (`with
connect(db) as con:`), so in practice nobody waits long.

Re-entrancy (one thread, one store): a thread that holds a read connection and opens another
takes lock SH again without passing the gate (in DRAINING it would wait at the gate for a writer
that waits for this very thread); a thread that holds a read connection and asks for the write
connection would wait for itself: `ReentrantWrite`, at once.
"""

from __future__ import annotations

import errno
import os
import random
import threading
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from observatory import bucket, settings
from observatory.store.schema import ensure_schema

# DuckDB threads of the writer: every core but one, which the ingester's own thread needs to decode the
# lines it appends; on a small machine a DuckDB thread on that core too only waits for it (a metrics
# catch-up was slower with every core: bench/HISTORY.md, "one thread per write connection")
_CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
WRITER_THREADS = max(1, _CORES - 1)


def default_db() -> Path:
    return Path(settings.get("db"))


def default_runs_dir() -> str | Path:
    """The runs dir setting as `bucket.location` gives it: a bucket URL stays a URL (a `Path` would fold its
    `//`), a local folder is a `Path`."""
    return bucket.location(settings.get("runs"))


class StoreBusy(RuntimeError):
    """The store stayed busy for `lock_timeout_s`; the message says what to do."""


class StoreUnusable(RuntimeError):
    """The store file cannot be opened or given its schema (not a DuckDB file, a damaged one, a newer
    format): the store's fault, not any event log's. The message names the file and DuckDB's reason."""

    def __init__(self, path: Path, error: BaseException):
        super().__init__(f"{path}: cannot use the store ({type(error).__name__}: {error})")
        self.path, self.error = path, error


def _flock(path: Path, exclusive: bool, deadline: float, what: str) -> int | None:
    """Open `path` and take a flock on it, polling until `deadline`. None if it cannot be created."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOENT):
            return None  # read-only location: nobody can write there, so nobody to wait for
        raise
    op = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    try:
        fcntl.flock(fd, op | fcntl.LOCK_NB)
        return fd  # free: the common case, no wait to announce
    except BlockingIOError:
        pass
    began = time.monotonic()
    # short polls: a reader must catch the gap between two ingest transactions
    if _poll_flock(fd, op, deadline, 0.002, READER_MAX_POLL_S, jitter=True):
        return fd
    os.close(fd)
    raise StoreBusy(
        f"the store {path.with_suffix('')} stayed busy for {time.monotonic() - began:.1f} s "
        f"waiting to {what}; another process holds it (setting lock_timeout_s, "
        f"env {settings.SETTINGS['lock_timeout_s'].env})"
    )


def _poll_flock(fd: int, op: int, until: float, delay: float, max_delay: float, jitter: bool) -> bool:
    """Try the flock `op` on `fd` without blocking until it is taken (True) or `until` has passed (False),
    sleeping `delay` between tries, doubled each time up to `max_delay` (times 1-2 at random: `jitter`)."""
    import fcntl

    while True:
        try:
            fcntl.flock(fd, op | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() > until:
                return False
        time.sleep(delay * (1 + random.random()) if jitter else delay)
        delay = min(delay * 2, max_delay)


# How long a writer polls for a gap between readers before it closes the gate (see the module doc):
# the most a live batch is delayed by it; readers' units of work under load last ~0.1-0.5 s.
GAP_WAIT_S = 0.25
READER_MAX_POLL_S = 0.01  # a waiting reader's longest sleep between two tries: it sees a free store within it
_GAP_POLL_S = 0.002  # gaps between readers are short: poll often (a flock try is one syscall)


def _flock_in_gap(path: Path, window_s: float) -> int | None:
    """`path` flocked exclusively in a moment when no reader holds it, within `window_s`; else None
    (also when the lock file cannot be opened: the gated path then says why)."""
    import fcntl

    if window_s <= 0:
        return None
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    if _poll_flock(fd, fcntl.LOCK_EX, time.monotonic() + window_s, _GAP_POLL_S, _GAP_POLL_S, jitter=False):
        return fd
    os.close(fd)
    return None


def writer_active(db) -> bool:
    """Whether a writer holds or is about to hold the store right now (its transaction, or the gate
    closed while it waits for readers): a reader that opened it now would wait. One non-blocking
    flock try per lock file, no wait."""
    import fcntl

    for p in _lock_paths(Path(db)):
        try:
            fd = os.open(p, os.O_RDONLY)
        except OSError:
            continue  # no lock file (nobody ever wrote here) or unreadable: nobody to wait for
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
    return False


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor releases its flock


def _lock_paths(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".gate"), path.with_name(path.name + ".lock")


def lock_files(db) -> list[Path]:
    """Every file beside the store that the locks use (to remove with a scratch store)."""
    path = Path(db)
    return [*_lock_paths(path)]


class ReentrantWrite(RuntimeError):
    """A thread that holds a read connection to a store asked for its write connection (see the module doc)."""


def _reading(path: Path) -> bool:
    """Whether this thread holds a read connection to the store at `path`."""
    return PROCESS.reading.get((os.path.abspath(path), threading.get_ident()), 0) > 0


class StoreConnection:
    """A DuckDB connection plus the advisory locks that make it safe; use as a context manager.

    Every attribute of the DuckDB connection (`execute`, `sql`, `fetchall`, ...) is
    available on it. `close()` closes the connection and releases the locks.
    """

    def __init__(self, con, fds: list[int | None], read_only: bool, path: Path, fresh: bool = False):
        self._con = con
        self._fds = fds
        self.read_only = read_only
        self.path = path
        self.fresh = fresh  # its own instance, closed with it: never kept for another unit of work
        self._key = (os.path.abspath(path), threading.get_ident()) if read_only else None
        self._process = PROCESS  # the owner it came from (a test may set another for later connections)
        if self._key is not None:
            reading = self._process.reading
            reading[self._key] = reading.get(self._key, 0) + 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    @property
    def duckdb(self):
        """The underlying `duckdb.DuckDBPyConnection`."""
        return self._con

    def close(self, reuse: bool = True) -> None:
        """Close the store (its instance goes back to its process's `instances`, or is closed) and release
        the locks."""
        con, self._con = self._con, None
        if con is not None:
            self._unread()
            try:
                self._process.instances.release(con, self.read_only, reuse and not self.fresh)
            finally:
                for fd in reversed(self._fds):
                    _unlock(fd)
                self._fds = []

    def _unread(self) -> None:
        if self._key is not None:
            reading = self._process.reading
            left = reading.get(self._key, 1) - 1
            if left > 0:
                reading[self._key] = left
            else:
                reading.pop(self._key, None)
            self._key = None

    def __enter__(self) -> StoreConnection:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.close(reuse=exc_type is None)  # after an error the instance may hold anything: not reused

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


# Rows per row group that the writer writes (DuckDB's default is 122,880). A query that filters a table
# reads every row group's statistics first, on a fresh instance, and frees them when it closes: at the
# reference run's 2x10^9 expert_load rows that was ~0.4 s per page batch with the default, 8x less with
# this. DuckDB takes it per ATTACH, not from the file, so every write connection sets it.
ROW_GROUP_ROWS = 1 << 20
WRITE_BUFFER_ROW_GROUPS = 1  # see `write_connection`


def _open_duckdb(path: Path, read_only: bool, deadline: float, fresh: bool = False):
    import duckdb

    delay = 0.005
    while True:
        try:
            return _attach(duckdb, path, read_only, fresh)
        except duckdb.IOException as e:
            # a process that does not use these locks (a bare duckdb.connect) holds the file
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.1)


_RESERVED_CATALOGS = {"memory", "system", "temp", "main"}


class _Instances:
    """Idle in-memory DuckDB instances that the store is ATTACHed to, one unit of work at a time.

    Making a DuckDB instance costs ~30 ms of CPU here (its catalog of built-in functions), and the
    ingester and the dashboard open the store for every unit of work: a one-step batch paid it three
    times, a dashboard view once per query batch. ATTACH and DETACH of the store file into a kept
    instance cost ~3 ms, and DETACH does what closing did: it checkpoints a writer's WAL into the file
    and releases DuckDB's own file lock, so another process may open the store at once. An instance
    comes back only after a clean unit of work, and without any temporary table, view or registered
    object left in it (else it is closed; no code of ours makes temporary macros, and checking for
    them costs as much as a new instance); read-only and read-write instances are kept apart (a writer
    sets its threads). At most `KEEP` of each are kept idle."""

    KEEP = 4

    def __init__(self):
        import threading

        self._lock = threading.Lock()
        self._idle: dict[bool, list] = {True: [], False: []}
        self._spare = None  # a new instance no unit of work has used yet: the next `fresh` one
        self._pid = os.getpid()

    def take(self, duckdb, read_only: bool, fresh: bool = False):
        with self._lock:
            if self._pid != os.getpid():  # a forked child must not share its parent's instances
                self._idle, self._spare, self._pid = {True: [], False: []}, None, os.getpid()
            if fresh:
                spare, self._spare = self._spare, None
                if spare is not None:
                    return spare
            elif self._idle[read_only]:
                return self._idle[read_only].pop()
        return duckdb.connect()

    def make_spare(self, duckdb) -> None:
        """Make the next `fresh` instance now (while a worker waits for its next query), not on its clock."""
        if self._spare is None:
            spare = duckdb.connect()
            with self._lock:
                if self._spare is None:
                    self._spare, spare = spare, None
            if spare is not None:  # another thread made one meanwhile
                spare.close()

    def release(self, con, read_only: bool, reuse: bool) -> None:
        """Detach the store from `con` and keep the instance for the next unit of work, or close it."""
        if reuse:
            try:
                name, clean = con.execute(_CLEAN).fetchall()[0]
                if clean:
                    try:
                        con.execute("ROLLBACK")  # a transaction left open ends as closing would end it
                    except Exception:
                        pass
                    con.execute("USE memory")
                    con.execute(f"DETACH {_ident(name)}")
                    with self._lock:
                        if len(self._idle[read_only]) < self.KEEP and self._pid == os.getpid():
                            self._idle[read_only].append(con)
                            return
            except Exception:
                pass  # anything unexpected: close it, as before instances were kept
        con.close()


# (the attached store's name, whether the instance may be kept): its settings still unlocked (someone
# else's SQL may lock them, or turn external access off, which forbids the next ATTACH), and nothing
# temporary or attached left beside the store
_CLEAN = """
SELECT current_database(),
       NOT (current_setting('lock_configuration') OR NOT current_setting('enable_external_access'))
       AND (SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp') = 0
       AND (SELECT count(*) FROM duckdb_views() WHERE database_name = 'temp' AND NOT internal) = 0
       AND (SELECT count(*) FROM duckdb_databases()
            WHERE NOT internal AND database_name NOT IN ('memory', current_database())) = 0
"""


class Process:
    """What this process keeps of its stores between units of work, for every caller at once: its idle
    DuckDB instances (`instances`) and the read connections each thread holds (`reading`).

    Why one per process, reached as `PROCESS`, not an object each caller passes: both are facts of the
    process, not of a caller. An instance kept by one unit of work serves the next of any caller (the
    dashboard's sessions, the ingester's analyses, a report), and a write connection asked for anywhere
    must see the read connection its own thread opened anywhere else (`ReentrantWrite`), or it would
    wait for itself. A test that wants a clean one sets `PROCESS` to a new `Process()` (monkeypatch);
    nothing clears it. A connection goes back to the `Process` it came from."""

    def __init__(self) -> None:
        self.instances = _Instances()
        # (store path, thread id) -> the read connections that thread holds open on that store; each key is
        # one thread's, changed by that thread alone
        self.reading: dict[tuple[str, int], int] = {}


PROCESS = Process()


def prepare_fresh() -> None:
    """Make the instance of this process's next `connect(..., fresh=True)` now: the SQL console's worker
    calls it while it waits for a query, so a query does not wait ~30 ms for a new DuckDB instance."""
    import duckdb

    PROCESS.instances.make_spare(duckdb)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _attach(duckdb, path: Path, read_only: bool, fresh: bool = False):
    """An instance with the store attached under the name `duckdb.connect(path)` would give it (the file's
    stem), its spill folder where it would be, and, for writing, `ROW_GROUP_ROWS` per row group."""
    con = PROCESS.instances.take(duckdb, read_only, fresh)
    try:
        name = path.name.split(".")[0] or "store"
        name = f"{name}_store" if name.lower() in _RESERVED_CATALOGS else name
        literal, ident = str(path).replace("'", "''"), _ident(name)
        con.execute(f"SET temp_directory = '{literal}.tmp'")
        options = "READ_ONLY" if read_only else f"ROW_GROUP_SIZE {ROW_GROUP_ROWS}"
        con.execute(f"ATTACH '{literal}' AS {ident} ({options})")
        con.execute(f"USE {ident}")
    except BaseException:
        con.close()
        raise
    return con


def connect(
    db=None, read_only: bool = True, timeout_s: float | None = None, fresh: bool = False
) -> StoreConnection:
    """A connection to the store for one unit of work, read-only by default.

    Waits (bounded by `lock_timeout_s`) while the ingester commits a batch and
    never returns a lock error before that. A missing store is created empty, so
    readers see tables rather than errors. Use `with connect(db) as con:`.
    `fresh`: a DuckDB instance of its own, closed with the connection, never one
    kept from an earlier unit of work (`_Instances`): for a connection whose
    settings someone else's SQL may touch (the public SQL console's worker).
    """
    path = Path(db) if db is not None else default_db()
    timeout = settings.get("lock_timeout_s") if timeout_s is None else timeout_s
    if read_only and not path.exists():
        with connect(path, read_only=False, timeout_s=timeout) as con:
            ensure_schema(con)
    if not read_only:
        return write_connection(path, timeout_s=timeout)
    deadline = time.monotonic() + timeout
    gate, lock = _lock_paths(path)
    if _reading(path):  # this thread reads the store already: past the gate (see the module doc)
        fd_lock = _flock(lock, False, deadline, "read")
    else:
        fd_gate = _flock(gate, False, deadline, "read")  # wait behind a writer that is waiting
        try:
            fd_lock = _flock(lock, False, deadline, "read")
        finally:
            _unlock(fd_gate)
    try:
        con = _open_duckdb(path, True, deadline, fresh)
    except BaseException:
        _unlock(fd_lock)
        raise
    return StoreConnection(con, [fd_lock], True, path, fresh)


def write_connection(db=None, timeout_s: float | None = None) -> StoreConnection:
    """The read-write connection: only the ingester (and tests) use it, for one short transaction."""
    path = Path(db) if db is not None else default_db()
    if _reading(path):
        raise ReentrantWrite(
            f"{path}: this thread holds a read connection to the store and asked for its write "
            "connection, which would wait for that read connection forever: close it first"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (settings.get("lock_timeout_s") if timeout_s is None else timeout_s)
    gate, lock = _lock_paths(path)
    fd_gap = _flock_in_gap(lock, min(GAP_WAIT_S, max(0.0, deadline - time.monotonic())))
    fds = [fd_gap] if fd_gap is not None else [_flock(gate, True, deadline, "write")]
    try:
        if fd_gap is None:  # no gap came: close the gate, wait for the readers in flight
            fds.append(_flock(lock, True, deadline, "write"))
        wal = path.with_name(path.name + ".wal")
        if not path.exists() and wal.exists():
            wal.unlink()  # the store was deleted under us; its orphan WAL must not replay into a new one
        con = _open_duckdb(path, False, deadline)
        con.execute(f"SET threads = {WRITER_THREADS}")
        # each row group a transaction fills is compressed and written as it fills (DuckDB's default: five at
        # a time, the rest at COMMIT), on the ingester's worker thread while it decodes the next lines: a
        # catch-up's COMMIT then writes only its last, partial row group (`ingest.appends`)
        con.execute(f"SET write_buffer_row_group_count = {WRITE_BUFFER_ROW_GROUPS}")
    except BaseException:
        for fd in reversed(fds):
            _unlock(fd)
        raise
    return StoreConnection(con, fds, False, path)


def using(db):
    """`with using(db) as con:` for an API that takes a store path or an open connection.

    An open connection (anything with `execute`) is used as it is and left open; a path
    (or None: the default store) gets a read-only `connect` for the block. Pass the
    ingester's own connection while it holds the store: DuckDB will not open a second,
    read-only one in the same process.
    """
    return nullcontext(db) if hasattr(db, "execute") else connect(db)
