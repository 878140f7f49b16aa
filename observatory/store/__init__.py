"""The DuckDB store: a rebuildable index over the event logs.

- `schema`: every table and view, declared once (`DDL`, `VIEWS`, the rollup tables,
  the `decisions` view), their docs (`SCHEMA_DOC`) and `run_status_sql`, the one
  definition of the status readers show (`crashed` after `stale_after_s` of silence).
- `connection`: `connect` (read-only), `write_connection` (the ingester's), `using`
  (a path or an open connection), and the `flock` turnstile that makes them safe
  across processes (`StoreBusy` when the store stays busy); the writer writes row groups of
  `ROW_GROUP_ROWS`.
- `rollups`: ingest-time summaries that keep the dashboard's queries cheap.
"""

from observatory.store.connection import (
    ROW_GROUP_ROWS,
    ReentrantWrite,
    StoreBusy,
    StoreConnection,
    StoreUnusable,
    connect,
    default_db,
    default_runs_dir,
    lock_files,
    using,
    write_connection,
    writer_active,
)
from observatory.store.schema import (
    DDL,
    RUN_COLUMNS,
    RUN_JSON_COLUMNS,
    SCHEMA_DOC,
    TABLE_DOCS,
    VIEW_NAMES,
    VIEWS,
    crashed_sql,
    ensure_schema,
    run_status_sql,
    schema_columns,
)

__all__ = [
    "DDL",
    "ROW_GROUP_ROWS",
    "RUN_COLUMNS",
    "RUN_JSON_COLUMNS",
    "SCHEMA_DOC",
    "StoreBusy",
    "StoreUnusable",
    "StoreConnection",
    "TABLE_DOCS",
    "VIEWS",
    "VIEW_NAMES",
    "connect",
    "crashed_sql",
    "default_db",
    "default_runs_dir",
    "ensure_schema",
    "lock_files",
    "run_status_sql",
    "schema_columns",
    "using",
    "write_connection",
    "ReentrantWrite",
    "writer_active",
]
