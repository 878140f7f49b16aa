"""The DuckDB store: a rebuildable index over the event logs.

Schema (documented in the README; a test checks the two agree):

- `runs`: one row per run, from `run_start` / `run_end` and the last event seen.
- `metrics`: one row per (run, step, name) scalar.
- `expert_load`: one row per (run, step, layer, expert); narrow integer types so
  that 10^9 rows stay small (DuckDB compresses them column-wise).
- `events`: every event that is not a `metrics` or `expert_load` event, raw.
- `rejected_events`: lines that could not be read, with file, line and reason.
- `ingest_files`: per-file offsets, updated in the same transaction as the rows
  they cover, so ingest is incremental and exactly-once.

DuckDB allows one read-write process or many read-only ones. Nobody here holds
a connection longer than one unit of work; see `connect` and `write_connection`.
"""

from __future__ import annotations

from observatory import settings
from pathlib import Path

__all__ = ["DDL", "VIEWS", "connect", "default_db", "default_runs_dir", "ensure_schema"]


def default_db() -> Path:
    return Path(settings.get("db"))


def default_runs_dir() -> Path:
    return Path(settings.get("runs"))


DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run          VARCHAR PRIMARY KEY,
    name         VARCHAR,
    status       VARCHAR,        -- running | completed | failed | preempted | killed | crashed
    start_time   DOUBLE,         -- Unix seconds of run_start
    end_time     DOUBLE,         -- Unix seconds of run_end (NULL while running)
    last_event_t DOUBLE,         -- Unix seconds of the newest event from any host
    last_step    BIGINT,
    final_step   BIGINT,
    parent_run   VARCHAR,
    parent_step  BIGINT,
    ladder_name  VARCHAR,
    ladder_rung  VARCHAR,
    ladder       JSON,
    config       JSON,
    tags         VARCHAR[],
    code         JSON,
    data         JSON,
    mesh         JSON,
    model        JSON
);
CREATE TABLE IF NOT EXISTS metrics (
    run   VARCHAR NOT NULL,
    step  BIGINT,
    name  VARCHAR NOT NULL,
    value DOUBLE,
    t     DOUBLE NOT NULL,
    host  USMALLINT NOT NULL
);
CREATE TABLE IF NOT EXISTS expert_load (
    run     VARCHAR NOT NULL,
    step    INTEGER NOT NULL,
    layer   USMALLINT NOT NULL,
    expert  USMALLINT NOT NULL,
    routed  UINTEGER NOT NULL,
    dropped UINTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    run   VARCHAR NOT NULL,
    host  USMALLINT NOT NULL,
    seq   BIGINT NOT NULL,
    kind  VARCHAR NOT NULL,
    step  BIGINT,
    t     DOUBLE NOT NULL,
    v     USMALLINT NOT NULL,
    known BOOLEAN NOT NULL,      -- false: a kind this reader does not know, kept raw
    data  JSON
);
CREATE TABLE IF NOT EXISTS rejected_events (
    file        VARCHAR NOT NULL,
    line        BIGINT NOT NULL,
    field       VARCHAR,
    reason      VARCHAR NOT NULL,
    raw         VARCHAR,         -- first 4 KiB of the line
    ingested_at DOUBLE NOT NULL
);
CREATE TABLE IF NOT EXISTS ingest_files (
    path     VARCHAR PRIMARY KEY,
    run      VARCHAR,
    host     USMALLINT,
    offset   BIGINT NOT NULL,    -- bytes consumed (uncompressed offset for .gz)
    line     BIGINT NOT NULL,    -- lines consumed
    last_seq BIGINT,             -- highest seq accepted
    size     BIGINT,
    mtime    DOUBLE
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


def ensure_schema(con) -> None:
    """Create tables and views if they are missing (idempotent)."""
    con.execute(DDL)
    con.execute(VIEWS)


def connect(db=None, read_only: bool = True, timeout_s: float | None = None):
    """A DuckDB connection to the store, retrying a busy lock with bounded backoff.

    Read-only by default. Close it after one unit of work: DuckDB lets one
    read-write process or many read-only ones hold the file, never both.
    """
    import random
    import time

    import duckdb

    path = Path(db) if db is not None else default_db()
    if read_only and not path.exists():
        # an empty store: create the schema once so readers see tables, not errors
        with connect(path, read_only=False, timeout_s=timeout_s) as con:
            ensure_schema(con)
    if not read_only:
        path.parent.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + (settings.get("lock_timeout_s") if timeout_s is None else timeout_s)
    delay = 0.005
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise
        time.sleep(delay * (1 + random.random()))
        delay = min(delay * 2, 0.1)
