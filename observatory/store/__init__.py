"""The DuckDB store: a rebuildable index over the event logs.

Schema (documented in the README from `SCHEMA_DOC`, which is generated from
`TABLE_DOCS` and the column comments of `DDL` below, so the two cannot drift):

- `runs`: one row per run, from `run_start` / `run_end` and the last event seen.
- `metrics`: one row per (run, step, name) scalar.
- `expert_load`: one row per (run, step, layer, expert); narrow integer types so
  that 10^9 rows stay small (DuckDB compresses them column-wise).
- `events`: every event that is not a `metrics` or `expert_load` event, raw.
- `rejected_events`: lines that could not be read, with file, line and reason.
- `ingest_files`: per-file offsets, updated in the same transaction as the rows
  they cover, so ingest is incremental and exactly-once.
- views `latest_metrics`, `run_drop_fraction`, and `decisions` (the fold of
  `decision` events, SQL in `observatory.queries.decisions`).

Concurrency (ARCHITECTURE decision 2). DuckDB lets one read-write process or
many read-only ones hold the file, never both, and a process that finds the
file busy gets an error. So every connection made here first takes an advisory
`flock` next to the store, the classic turnstile that keeps a writer from
starving behind a stream of readers:

- `<db>.gate`: a writer holds it exclusively while it waits for and holds the
  store; a reader passes through it (shared, released at once), so a waiting
  writer stops new readers from coming in;
- `<db>.lock`: readers hold it shared for the life of their connection, the
  writer exclusively for one short transaction.

Both waits poll with bounded backoff up to `lock_timeout_s`, then raise a
`StoreBusy` that says who to wait for. Nobody holds a connection longer than one
unit of work (`with connect(db) as con:`), so in practice nobody waits long.
"""

from __future__ import annotations

import errno
import os
import random
import re
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

from observatory import settings

__all__ = [
    "DDL",
    "VIEWS",
    "VIEW_NAMES",
    "TABLE_DOCS",
    "SCHEMA_DOC",
    "StoreBusy",
    "StoreConnection",
    "connect",
    "using",
    "write_connection",
    "default_db",
    "default_runs_dir",
    "ensure_schema",
    "schema_columns",
]


def default_db() -> Path:
    return Path(settings.get("db"))


def default_runs_dir() -> Path:
    return Path(settings.get("runs"))


DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run          VARCHAR PRIMARY KEY, -- run id (the run folder's name)
    name         VARCHAR,        -- human-readable name from run_start (the id when none)
    status       VARCHAR,        -- running | completed | failed | preempted | killed | crashed
    start_time   DOUBLE,         -- Unix seconds of the first run_start
    end_time     DOUBLE,         -- Unix seconds of run_end (NULL while running)
    last_event_t DOUBLE,         -- Unix seconds of the newest event from any host
    last_step    BIGINT,         -- highest step of any event
    final_step   BIGINT,         -- final_step from run_end
    parent_run   VARCHAR,        -- run this one was forked or resumed from
    parent_step  BIGINT,         -- step of the parent's checkpoint
    ladder_name  VARCHAR,        -- scaling ladder this run is a rung of
    ladder_rung  VARCHAR,        -- its rung (e.g. d768)
    ladder       JSON,           -- the whole ladder object from run_start
    config       JSON,           -- resolved config, secrets redacted
    tags         VARCHAR[],      -- free-form labels
    code         JSON,           -- {commit, dirty}
    data         JSON,           -- {name, fingerprint, tokens}
    mesh         JSON,           -- {data, expert, processes, devices}
    model        JSON            -- {params_total, params_active, flops_per_token}
);
CREATE TABLE IF NOT EXISTS metrics (
    run   VARCHAR NOT NULL,      -- run id
    step  BIGINT,                -- optimizer step
    name  VARCHAR NOT NULL,      -- /-namespaced metric name, e.g. train/loss
    value DOUBLE,                -- the value; NaN and +-inf are stored as IEEE values
    t     DOUBLE NOT NULL,       -- wall time, Unix seconds
    host  USMALLINT NOT NULL     -- writing process
);
CREATE TABLE IF NOT EXISTS expert_load (
    run     VARCHAR NOT NULL,    -- run id
    step    INTEGER NOT NULL,    -- optimizer step
    layer   USMALLINT NOT NULL,  -- MoE layer index
    expert  USMALLINT NOT NULL,  -- expert index within the layer
    routed  UINTEGER NOT NULL,   -- assignments the router made to this expert
    dropped UINTEGER NOT NULL    -- of those, assignments cut by capacity
);
CREATE TABLE IF NOT EXISTS events (
    run   VARCHAR NOT NULL,      -- run id
    host  USMALLINT NOT NULL,    -- writing process (1000: the observatory itself)
    seq   BIGINT NOT NULL,       -- sequence number within (run, host)
    kind  VARCHAR NOT NULL,      -- run_start, run_end, eval, checkpoint, decision, forecast, anomaly, ...
    step  BIGINT,                -- optimizer step, if any
    t     DOUBLE NOT NULL,       -- wall time, Unix seconds
    v     USMALLINT NOT NULL,    -- event format version
    known BOOLEAN NOT NULL,      -- false: a kind this reader does not know, kept raw
    data  JSON                   -- the kind's payload
);
CREATE TABLE IF NOT EXISTS rejected_events (
    file        VARCHAR NOT NULL, -- path of the event log
    run         VARCHAR,         -- the run folder the file lives in
    line        BIGINT NOT NULL, -- 1-based line number in the file
    field       VARCHAR,         -- offending field (e.g. seq, data.layer, (line))
    reason      VARCHAR NOT NULL, -- what is wrong, in words
    raw         VARCHAR,         -- first 4 KiB of the line
    ingested_at DOUBLE NOT NULL  -- Unix seconds when ingest saw it
);
CREATE TABLE IF NOT EXISTS ingest_files (
    path       VARCHAR PRIMARY KEY, -- path of the event log
    run        VARCHAR,          -- run folder
    host       USMALLINT,        -- host from the file name
    byte_offset BIGINT NOT NULL, -- bytes consumed (uncompressed offset for .gz)
    line       BIGINT NOT NULL,  -- lines consumed
    first_seq  BIGINT,           -- lowest seq stored from this file
    last_seq   BIGINT,           -- highest seq stored from this file
    cursor_seq BIGINT,           -- last seq read in file order (the next must be higher)
    size       BIGINT,           -- file size when last read
    mtime      DOUBLE            -- file mtime when last read
);
"""

VIEWS = """
CREATE OR REPLACE VIEW latest_metrics AS
    SELECT run, name, arg_max(step, step) AS step, arg_max(value, step) AS value, max(t) AS t
    FROM metrics GROUP BY run, name;
CREATE OR REPLACE VIEW run_drop_fraction AS
    SELECT run, sum(dropped)::DOUBLE / nullif(sum(routed), 0) AS drop_fraction,
           sum(routed) AS routed, sum(dropped) AS dropped
    FROM expert_load GROUP BY run;
"""

# Columns added after a store may already exist; ensure_schema adds them to old files.
_ADDED_COLUMNS = (
    ("ingest_files", "first_seq", "BIGINT"),
    ("ingest_files", "cursor_seq", "BIGINT"),
    ("rejected_events", "run", "VARCHAR"),
)

TABLE_DOCS = {
    "runs": "One row per run, from `run_start` / `run_end` and the newest event seen. "
    "`status` is `running` until a `run_end`; readers show a running run whose newest event "
    "is older than `stale_after_s` as `crashed`.",
    "metrics": "One row per (run, step, name) scalar from `metrics` events.",
    "expert_load": "One row per (run, step, layer, expert) from `expert_load` events; narrow "
    "integer types so that 10^9 rows stay small.",
    "events": "Every event that is not `metrics` or `expert_load` (run_start, run_end, eval, "
    "checkpoint, config_diff, decision, forecast, anomaly, failure, note, unknown kinds), "
    "payload as JSON. `(run, host, seq)` identifies an event.",
    "rejected_events": "Lines ingest could not accept, with file, line, field and reason; the rest "
    "of the file is ingested. Torn final lines of ended or crashed runs appear here as `truncated`.",
    "ingest_files": "Per-file ingest progress, committed in the same transaction as the rows it "
    "covers (exactly-once ingest).",
    "latest_metrics": "View: each run's latest value of each metric.",
    "run_drop_fraction": "View: each run's overall token drop fraction (dropped / routed).",
    "decisions": "View: each decision's current state, folded from its `decision` events in order "
    "(`id`, `state` JSON, `home_run`, `created`, `updated`, `n_events`, `title`, `kind`, `status`).",
}
VIEW_NAMES = ("latest_metrics", "run_drop_fraction", "decisions")

_COL_RE = re.compile(r"^\s+(\w+)\s+([A-Z][A-Z0-9\[\]]*)[^-]*?(?:--\s*(.*))?$")


def schema_columns() -> dict[str, list[tuple[str, str, str]]]:
    """Tables of `DDL` as {table: [(column, type, comment), ...]}, parsed from the DDL text."""
    out: dict[str, list[tuple[str, str, str]]] = {}
    table = None
    for line in DDL.splitlines():
        m = re.match(r"CREATE TABLE IF NOT EXISTS (\w+)", line)
        if m:
            table = m.group(1)
            out[table] = []
            continue
        if table and line.startswith(")"):
            table = None
            continue
        m = _COL_RE.match(line)
        if table and m:
            out[table].append((m.group(1), m.group(2), (m.group(3) or "").strip()))
    return out


def _schema_doc() -> str:
    parts = []
    for table, cols in schema_columns().items():
        parts.append(f"### `{table}`\n\n{TABLE_DOCS[table]}\n\n| column | type | meaning |\n|---|---|---|")
        parts.extend(f"| `{c}` | {t} | {doc} |" for c, t, doc in cols)
        parts.append("")
    parts.append("### Views\n")
    parts.extend(f"- `{v}`: {TABLE_DOCS[v].removeprefix('View: ')}" for v in VIEW_NAMES)
    return "\n".join(parts) + "\n"


SCHEMA_DOC = _schema_doc()


def ensure_schema(con) -> None:
    """Create tables and views if they are missing (idempotent)."""
    # imported here: the decisions fold is that area's SQL (queries/), and importing it at module
    # level would make `store` (imported by nearly everything) pull in the queries package
    from observatory.queries.decisions import DECISIONS_VIEW_DDL

    con.execute(DDL)
    for table, col, typ in _ADDED_COLUMNS:
        con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {typ}")
    con.execute(VIEWS)
    con.execute(DECISIONS_VIEW_DDL)


# ------------------------------------------------------------------- locking


class StoreBusy(RuntimeError):
    """The store stayed busy for `lock_timeout_s`; the message says what to do."""


def _flock(path: Path, exclusive: bool, deadline: float, what: str) -> int | None:
    """Open `path` and take a flock on it, polling until `deadline`. None if it cannot be created."""
    import fcntl

    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EROFS, errno.EPERM, errno.ENOENT):
            return None  # read-only location: nobody can write there, so nobody to wait for
        raise
    op = (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB
    delay = 0.002
    while True:
        try:
            fcntl.flock(fd, op)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise StoreBusy(
                    f"the store {path.with_suffix('')} stayed busy for {settings.get('lock_timeout_s')} s "
                    f"waiting to {what}; another process holds it (setting lock_timeout_s, "
                    f"env {settings.SETTINGS['lock_timeout_s'].env})"
                ) from None
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.025)  # short: a reader must catch the gap between two ingest batches


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing the descriptor releases its flock


def _lock_paths(path: Path) -> tuple[Path, Path]:
    return path.with_name(path.name + ".gate"), path.with_name(path.name + ".lock")


class StoreConnection:
    """A DuckDB connection plus the advisory locks that make it safe; use as a context manager.

    Every attribute of the DuckDB connection (`execute`, `sql`, `fetchall`, ...) is
    available on it. `close()` closes the connection and releases the locks.
    """

    def __init__(self, con, fds: list[int | None], read_only: bool, path: Path):
        self._con = con
        self._fds = fds
        self.read_only = read_only
        self.path = path

    def __getattr__(self, name: str) -> Any:
        return getattr(self._con, name)

    @property
    def duckdb(self):
        """The underlying `duckdb.DuckDBPyConnection`."""
        return self._con

    def close(self) -> None:
        con, self._con = self._con, None
        if con is not None:
            try:
                con.close()
            finally:
                for fd in reversed(self._fds):
                    _unlock(fd)
                self._fds = []

    def __enter__(self) -> StoreConnection:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


def _open_duckdb(path: Path, read_only: bool, deadline: float):
    import duckdb

    delay = 0.005
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as e:
            # a process that does not use these locks (a bare duckdb.connect) holds the file
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.1)


def connect(db=None, read_only: bool = True, timeout_s: float | None = None) -> StoreConnection:
    """A connection to the store for one unit of work, read-only by default.

    Waits (bounded by `lock_timeout_s`) while the ingester commits a batch and
    never returns a lock error before that. A missing store is created empty, so
    readers see tables rather than errors. Use `with connect(db) as con:`.
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
    fd_gate = _flock(gate, False, deadline, "read")  # wait behind a writer that is waiting
    try:
        fd_lock = _flock(lock, False, deadline, "read")
    finally:
        _unlock(fd_gate)
    try:
        con = _open_duckdb(path, True, deadline)
    except BaseException:
        _unlock(fd_lock)
        raise
    return StoreConnection(con, [fd_lock], True, path)


def write_connection(db=None, timeout_s: float | None = None) -> StoreConnection:
    """The read-write connection: only the ingester (and tests) use it, for one short transaction."""
    path = Path(db) if db is not None else default_db()
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (settings.get("lock_timeout_s") if timeout_s is None else timeout_s)
    gate, lock = _lock_paths(path)
    fd_gate = _flock(gate, True, deadline, "write")
    fds = [fd_gate]
    try:
        fds.append(_flock(lock, True, deadline, "write"))
        wal = path.with_name(path.name + ".wal")
        if not path.exists() and wal.exists():
            wal.unlink()  # the store was deleted under us; its orphan WAL must not replay into a new one
        con = _open_duckdb(path, False, deadline)
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
