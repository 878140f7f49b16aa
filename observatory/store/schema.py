"""The store's schema, declared once: tables, views, rollup tables, and the run status readers show.

- `DDL`: the tables ingest fills (`runs`, `metrics`, `expert_load`, `events`,
  `rejected_events`, `ingest_files`); its column comments are docs/schema.md's
  (`SCHEMA_DOC`, from `TABLE_DOCS` and `schema_columns()`), so the two cannot drift.
- `VIEWS` and `DECISIONS_VIEW_DDL`: `latest_metrics`, `run_drop_fraction`, `run_summary`
  (metrics' latest values overridden by `summary` events), `histograms`, and `decisions`
  (the fold of `decision` events, `DECISIONS_SQL`).
- `ROLLUP_DDL`: the tables `observatory.store.rollups` keeps up to date at ingest
  time for the dashboard, `detector_state`, where the detectors' scans stopped
  (`observatory.detect.scan`), and `ingest_folders`, the run folders' last listings
  (`observatory.ingest.folders`); internal: not in docs/schema.md.
- `run_status_sql(cut)`: the one definition of a run's status as every reader
  shows it (`crashed` after `stale_after_s` of silence).

`ensure_schema(con)` creates all of it (idempotent).
"""

from __future__ import annotations

import re

from observatory import settings
from observatory.events import OBSERVATORY_HOST
from observatory.store.goodput import GOODPUT_DOCS, GOODPUT_VIEWS

__all__ = [
    "DDL",
    "VIEWS",
    "VIEW_NAMES",
    "TABLE_DOCS",
    "SCHEMA_DOC",
    "DECISIONS_SQL",
    "DECISIONS_VIEW_DDL",
    "ROLLUP_DDL",
    "RESOLUTIONS",
    "METRIC_RESOLUTIONS",
    "LAYER_RESOLUTION",
    "EXPERT_TABLES",
    "METRIC_TABLES",
    "RUN_COLUMNS",
    "RUN_JSON_COLUMNS",
    "crashed_sql",
    "run_status_sql",
    "PHASE_BUDGETED",
    "PHASE_FOLD_SQL",
    "ensure_schema",
    "schema_columns",
]

DDL = """
CREATE TABLE IF NOT EXISTS runs (
    run          VARCHAR PRIMARY KEY, -- run id (the run folder's name)
    name         VARCHAR,        -- human-readable name from run_start (the id when none)
    project      VARCHAR,        -- project from run_start (wandb's project), NULL when none
    run_group    VARCHAR,        -- group from run_start (wandb's group; `group` is an SQL keyword)
    status       VARCHAR,        -- running | completed | failed | preempted | killed | crashed
    start_time   DOUBLE,         -- Unix seconds of the first run_start
    end_time     DOUBLE,         -- Unix seconds of run_end, or of a final failure when crashed (NULL while running)
    last_event_t DOUBLE,         -- Unix seconds of the newest event from the run's own writers (not host 1000)
    last_step    BIGINT,         -- highest step of any event
    final_step   BIGINT,         -- final_step from run_end
    parent_run   VARCHAR,        -- run this one was forked or resumed from
    parent_step  BIGINT,         -- step of the parent's checkpoint
    ladder_name  VARCHAR,        -- scaling ladder this run is a rung of
    ladder_rung  VARCHAR,        -- its rung (e.g. d768)
    ladder       JSON,           -- the whole ladder object from run_start
    config       JSON,           -- resolved config, secrets redacted
    tags         VARCHAR[],      -- free-form labels
    notes        VARCHAR,        -- notes from run_start (wandb's notes)
    source       JSON,           -- {trainer, version}: who wrote the log (e.g. levanter, wandb-api)
    code         JSON,           -- {commit, dirty}
    data         JSON,           -- {name, fingerprint, tokens}
    mesh         JSON,           -- {data, expert, processes, devices}
    model        JSON,           -- {params_total, params_active, flops_per_token}
    redactions   BIGINT,         -- values ingest hid as secrets (config, text, metric names, rejected lines)
    phase        VARCHAR,        -- the newest phase any of its processes entered (phase events)
    phase_t      DOUBLE,         -- Unix seconds when it entered it
    phase_budget_s DOUBLE        -- that phase event's budget_s (NULL: none given)
);
CREATE TABLE IF NOT EXISTS metrics (
    run   VARCHAR NOT NULL,      -- run id
    step  BIGINT,                -- optimizer step
    name  VARCHAR NOT NULL,      -- /-namespaced metric name, e.g. train/loss
    value DOUBLE,                -- the value; NaN and +-inf are stored as IEEE values
    t     DOUBLE NOT NULL,       -- wall time, Unix seconds
    host  USMALLINT NOT NULL,    -- writing process
    replaced BOOLEAN DEFAULT false -- a newer row of this (run, host, step, name) supersedes it (a resumed attempt's replay)
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
CREATE TABLE IF NOT EXISTS heartbeats (
    run   VARCHAR NOT NULL,      -- run id
    host  USMALLINT NOT NULL,    -- the process that sent it
    seq   BIGINT NOT NULL,       -- its sequence number within (run, host)
    t     DOUBLE NOT NULL,       -- wall time, Unix seconds
    step  BIGINT,                -- the step the process was at
    phase VARCHAR                -- the phase it was in (init, compile, train, eval, checkpoint, shutdown)
);
CREATE TABLE IF NOT EXISTS host_telemetry (
    run   VARCHAR NOT NULL,      -- run id
    host  USMALLINT NOT NULL,    -- the process that measured it
    t     DOUBLE NOT NULL,       -- wall time of its heartbeat, Unix seconds
    name  VARCHAR NOT NULL,      -- e.g. system/cpu_percent, system/rss_bytes, accel/0/hbm_used_bytes
    value DOUBLE                 -- the value
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
    mtime      DOUBLE,           -- file mtime when last read
    rejected   BIGINT,           -- lines of this file rejected so far, stored in rejected_events or not
    rejected_dropped BIGINT      -- of those, lines past max_rejected_per_file: counted, their text not stored
);
"""

VIEWS = """
CREATE OR REPLACE VIEW latest_metrics AS
    SELECT run, name, max(step) AS step, arg_max(value, step::HUGEINT * 18446744073709551616 - rowid) AS value, max(t) AS t
    FROM metrics WHERE NOT replaced GROUP BY run, name;
CREATE OR REPLACE VIEW run_drop_fraction AS
    SELECT run, sum(dropped)::DOUBLE / nullif(sum(routed), 0) AS drop_fraction,
           sum(routed) AS routed, sum(dropped) AS dropped
    FROM expert_load GROUP BY run;
CREATE OR REPLACE VIEW run_summary AS
    WITH kv AS (
        SELECT run, host, seq, t, unnest(map_entries(CAST(data AS MAP(VARCHAR, JSON)))) AS e
        FROM events WHERE kind = 'summary' AND known AND json_type(data) = 'OBJECT'
    ),
    logged AS (  -- key by key, the value of the last summary event that set it
        SELECT run, e.key AS key, arg_max(e.value, (t, host, seq)) AS value, max(t) AS t
        FROM kv GROUP BY run, e.key
    )
    SELECT run, key, value, t, 'summary' AS origin FROM logged
    UNION ALL
    -- every other metric's latest value (metric_series: the ingest-time rollup of latest_metrics)
    SELECT s.run, s.name, to_json(s.last_value), s.last_t, 'metric' FROM metric_series s
    WHERE NOT EXISTS (SELECT 1 FROM logged l WHERE l.run = s.run AND l.key = s.name);
CREATE OR REPLACE VIEW histograms AS
    SELECT run, step, t, data->>'$.name' AS name,
           CAST(data->'$.bucket_limits' AS DOUBLE[]) AS bucket_limits,
           CAST(data->'$.bucket_counts' AS BIGINT[]) AS bucket_counts,
           TRY_CAST(data->>'$.min' AS DOUBLE) AS min, TRY_CAST(data->>'$.max' AS DOUBLE) AS max,
           TRY_CAST(data->>'$.sum' AS DOUBLE) AS sum,
           TRY_CAST(data->>'$.sum_squares' AS DOUBLE) AS sum_squares,
           TRY_CAST(data->>'$.count' AS DOUBLE) AS count
    FROM events WHERE kind = 'histogram' AND known;
"""

# Columns added after a store may already exist; ensure_schema adds them to old files.
_ADDED_COLUMNS = (
    ("ingest_files", "first_seq", "BIGINT"),
    ("ingest_files", "cursor_seq", "BIGINT"),
    ("rejected_events", "run", "VARCHAR"),
    ("runs", "project", "VARCHAR"),
    ("runs", "run_group", "VARCHAR"),
    ("runs", "notes", "VARCHAR"),
    ("runs", "source", "JSON"),
    ("runs", "redactions", "BIGINT"),
    ("ingest_files", "rejected", "BIGINT"),
    ("ingest_files", "rejected_dropped", "BIGINT"),
    ("metrics", "replaced", "BOOLEAN DEFAULT false"),
    ("runs", "phase", "VARCHAR"),
    ("runs", "phase_t", "DOUBLE"),
    ("runs", "phase_budget_s", "DOUBLE"),
)

TABLE_DOCS = {
    "runs": "One row per run, from `run_start` / `run_end` and the newest event seen. "
    "`status` is `running` until a `run_end`, and `running` again when the run's own processes write "
    "after it (a resume: `trainer train --resume` and `init(resume=)` append to the log with no second "
    "`run_start`); readers show a running run whose newest event "
    "is older than `stale_after_s` as `crashed`, unless its newest phase is `init`, `compile`, `eval` or "
    "`checkpoint` and that phase's `budget_s` (else `phase_budget_s`) has not passed since it began. "
    "A `failure` with `final: true` (its writer stopped there "
    "without a `run_end`, e.g. an imported run cut short) stores `crashed` and `end_time` at once, until "
    "the run's processes write after it.",
    "metrics": "One row per (run, step, name) scalar from `metrics` events. A step logged again by the same "
    "process (a resumed attempt re-logs the steps since its last checkpoint) keeps every row; all but the "
    "newest (by `t`) are `replaced`, and every chart, rollup, detector and report reads `NOT replaced` "
    "(docs/operate.md, Restarts and attempts).",
    "expert_load": "One row per (run, step, layer, expert) from `expert_load` events; narrow "
    "integer types so that 10^9 rows stay small.",
    "events": "Every event that is not `metrics`, `expert_load` or `heartbeat` (run_start, run_end, eval, "
    "checkpoint, config_diff, decision, forecast, anomaly, failure, note, summary, histogram, "
    "artifact, unknown kinds), "
    "payload as JSON. `(run, host, seq)` identifies an event.",
    "heartbeats": "One row per `heartbeat` event: each process's pulse (its step and phase), every "
    "`heartbeat_s` while it lives. Heartbeats are kept here and in `host_telemetry`, not in `events`.",
    "host_telemetry": "One row per (heartbeat, telemetry name): each process's host telemetry over time "
    "(names in docs/events.md's heartbeat row; a name a platform cannot measure is absent).",
    "rejected_events": "Lines ingest could not accept, with file, line, field and reason; the rest "
    "of the file is ingested. Torn final lines of ended or crashed runs appear here as `truncated`. "
    "At most `max_rejected_per_file` lines of one file are stored; `ingest_files.rejected` counts "
    "them all.",
    "ingest_files": "Per-file ingest progress, committed in the same transaction as the rows it "
    "covers (exactly-once ingest).",
    "latest_metrics": "View: each run's latest value of each metric (rows not `replaced`).",
    "run_drop_fraction": "View: each run's overall token drop fraction (dropped / routed).",
    "run_summary": "View: each run's summary, one row per key (`run`, `key`, `value` JSON, `t`, "
    "`origin`): the run's latest value of each metric (`origin` = `metric`), overridden key by key "
    "by its `summary` events, the last event that set a key winning (`origin` = `summary`).",
    "histograms": "View: `histogram` events as columns (`run`, `step`, `t`, `name`, `bucket_limits` "
    "DOUBLE[], `bucket_counts` BIGINT[], `min`, `max`, `sum`, `sum_squares`, `count`).",
    "decisions": "View: each decision's current state, folded from its `decision` events in order "
    "(`id`, `state` JSON, `home_run`, `created`, `updated`, `n_events`, `title`, `kind`, `status`).",
}
VIEW_NAMES = ("latest_metrics", "run_drop_fraction", "run_summary", "histograms", "decisions", *GOODPUT_DOCS)
TABLE_DOCS.update(GOODPUT_DOCS)

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

# The `runs` table's columns in DDL order, and those of them that hold JSON.
RUN_COLUMNS = tuple(c for c, _, _ in schema_columns()["runs"])
RUN_JSON_COLUMNS = tuple(c for c, t, _ in schema_columns()["runs"] if t == "JSON")

# ---------------------------------------------------------------- rollups
# Tables `observatory.store.rollups` maintains (see its docstring for what each holds).

RESOLUTIONS = (16, 128, 1024)  # expert_load buckets (steps), finest first; each divides the next
METRIC_RESOLUTIONS = (8, 64, 512)  # metrics buckets
LAYER_RESOLUTION = 64  # expert_layer_step buckets


def _bucketed(table: str, res: int, key: tuple[str, str], step: str, columns: str) -> str:
    """DDL of a rollup table `<table>_r<res>`: per run and `key` column, one row per `res` steps (`bucket`)."""
    return f"""
CREATE TABLE IF NOT EXISTS {table}_r{res} (
    run         VARCHAR NOT NULL,
    {key[0]:<11} {key[1]} NOT NULL,
    bucket      {step} NOT NULL,    -- step // {res}
{columns}
);
"""


# Each bucketed rollup's columns after (run, key, bucket).
_EXPERT_LAYER_COLUMNS = """\
    first_step  INTEGER NOT NULL,
    last_step   INTEGER NOT NULL,
    routed      UBIGINT NOT NULL,
    dropped     UBIGINT NOT NULL,
    drop_max    DOUBLE,             -- worst single step's dropped / routed
    hot_sum     DOUBLE,             -- sum over steps of busiest / mean expert
    hot_max     DOUBLE,             -- worst step's busiest / mean expert
    steps       UINTEGER NOT NULL"""
_EXPERT_LOAD_COLUMNS = """\
    expert      USMALLINT NOT NULL,
    routed      UBIGINT NOT NULL,
    dropped     UBIGINT NOT NULL,
    steps       UINTEGER NOT NULL    -- rows summed"""
_METRICS_COLUMNS = """\
    first_step  BIGINT NOT NULL,
    last_step   BIGINT NOT NULL,
    min         DOUBLE,             -- finite values only
    max         DOUBLE,
    last        DOUBLE,             -- value at last_step (NaN kept)
    sum         DOUBLE,             -- of finite values
    n           BIGINT NOT NULL,
    n_nonfinite BIGINT NOT NULL"""

ROLLUP_DDL = (
    """
CREATE TABLE IF NOT EXISTS expert_layer_step (
    run        VARCHAR NOT NULL,
    layer      USMALLINT NOT NULL,
    step       INTEGER NOT NULL,
    routed     UBIGINT NOT NULL,    -- sum over experts
    dropped    UBIGINT NOT NULL,
    routed_max UINTEGER NOT NULL,   -- busiest expert's routed count
    n_experts  USMALLINT NOT NULL
);
CREATE TABLE IF NOT EXISTS expert_run_step (
    run     VARCHAR NOT NULL,
    step    INTEGER NOT NULL,
    routed  UBIGINT NOT NULL,       -- sum over layers and experts
    dropped UBIGINT NOT NULL
);
"""
    + "".join(
        _bucketed(table, res, key, step, columns)
        for table, resolutions, key, step, columns in (
            ("expert_layer", (LAYER_RESOLUTION,), ("layer", "USMALLINT"), "INTEGER", _EXPERT_LAYER_COLUMNS),
            ("expert_load", RESOLUTIONS, ("layer", "USMALLINT"), "INTEGER", _EXPERT_LOAD_COLUMNS),
            ("metrics", METRIC_RESOLUTIONS, ("name", "VARCHAR"), "BIGINT", _METRICS_COLUMNS),
        )
        for res in resolutions
    )
    + """
CREATE TABLE IF NOT EXISTS metric_series (
    run        VARCHAR NOT NULL,
    name       VARCHAR NOT NULL,
    n          BIGINT NOT NULL,
    first_step BIGINT,
    last_step  BIGINT,
    last_value DOUBLE,
    last_t     DOUBLE,
    PRIMARY KEY (run, name)
);
CREATE TABLE IF NOT EXISTS detector_state (
    run      VARCHAR NOT NULL,
    detector VARCHAR NOT NULL,        -- a detector group: series | experts | trends
    through  BIGINT,                  -- the last step its scan read (the next re-reads a trailing window)
    PRIMARY KEY (run, detector)
);
CREATE TABLE IF NOT EXISTS rollup_state (
    source      VARCHAR PRIMARY KEY,  -- expert_load | metrics
    next_rowid  BIGINT NOT NULL,      -- rows with rowid >= this are not rolled up yet
    n_rows      BIGINT NOT NULL       -- count(*) of the source when next_rowid was taken
);
CREATE TABLE IF NOT EXISTS ingest_folders (
    folder   VARCHAR NOT NULL,        -- a run folder, as ingest_files.path begins (findings:<run> too)
    mtime_ns BIGINT NOT NULL,         -- the folder's mtime when it was listed
    names    VARCHAR NOT NULL         -- its event logs then, separated by spaces
);
"""
)

EXPERT_TABLES = (
    "expert_layer_step",
    "expert_run_step",
    f"expert_layer_r{LAYER_RESOLUTION}",
    *(f"expert_load_r{r}" for r in RESOLUTIONS),
)
METRIC_TABLES = (*(f"metrics_r{r}" for r in METRIC_RESOLUTIONS), "metric_series")

# -------------------------------------------------------------- decisions
# A decision is a series of `decision` events sharing `data.id`; each event carries only the
# fields it sets. Its current state is the fold of those events in order (t, run, host, seq):
# for every key, the value from the last event that wrote it. `observatory sql` users can paste
# `DECISIONS_SQL` or query the `decisions` view.

# One row per decision id: its folded state (JSON object), first/last event and count.
DECISIONS_SQL = """
WITH ev AS (
    SELECT data->>'$.id' AS id, run, host, seq, step, t, data
    FROM events
    WHERE kind = 'decision' AND json_type(data->'$.id') = 'VARCHAR'
),
kv AS (
    SELECT id, run, host, seq, t, unnest(map_entries(CAST(data AS MAP(VARCHAR, JSON)))) AS e FROM ev
),
latest AS (
    -- arg_max_null: a field set to null by a later event is cleared, not skipped
    SELECT id, e.key AS key, arg_max_null(e.value, (t, run, host, seq)) AS value FROM kv GROUP BY id, e.key
),
folded AS (
    SELECT id, json_group_object(key, value) AS state FROM latest GROUP BY id
),
bounds AS (
    SELECT id,
           arg_min(run, (t, run, host, seq)) AS home_run,   -- folder of the creating event
           -- created/updated: what the first/last event says, else its envelope time
           coalesce(TRY_CAST(arg_min(data->>'$.created', (t, run, host, seq)) AS DOUBLE), min(t)) AS created,
           coalesce(TRY_CAST(arg_max(data->>'$.updated', (t, run, host, seq)) AS DOUBLE), max(t)) AS updated,
           count(*) AS n_events
    FROM ev GROUP BY id
)
SELECT f.id, f.state, b.home_run, b.created, b.updated, b.n_events,
       f.state->>'$.title' AS title, f.state->>'$.kind' AS kind, f.state->>'$.status' AS status
FROM folded f JOIN bounds b USING (id)
"""

DECISIONS_VIEW_DDL = f"CREATE OR REPLACE VIEW decisions AS {DECISIONS_SQL}"


# ------------------------------------------------------------ run status


PHASE_BUDGETED = ("init", "compile", "eval", "checkpoint")  # phases that may be long and are not a hang

# Fold the phase events of `{events}` (a table or a subquery: a batch's rows, or all of them) into `runs`: each
# run's newest phase, its time and budget (set-wise, one statement for every run; an older phase is no news)
PHASE_FOLD_SQL = f"""
UPDATE runs SET phase = p.phase, phase_t = p.t, phase_budget_s = p.budget_s
FROM (
    SELECT run, arg_max_null(data->>'phase', t) AS phase, max(t) AS t,
           arg_max_null(TRY_CAST(data->>'budget_s' AS DOUBLE), t) AS budget_s
    FROM {{events}} WHERE kind = 'phase' AND host <> {OBSERVATORY_HOST} GROUP BY run
) p
WHERE runs.run = p.run AND (runs.phase_t IS NULL OR p.t >= runs.phase_t)
"""


def crashed_sql(cut: str) -> str:
    """SQL condition over a `runs` row: the run is `crashed` at cut-off `cut` (SQL: now - stale_after_s).

    A run still `running` (no run_end) whose newest event from its own writers is older
    than the cut-off, unless its newest phase is one that may be long (`PHASE_BUDGETED`: a
    synchronous checkpoint save, a first compile) and that phase's `budget_s` (else the
    `phase_budget_s` setting) has not passed since it began: a process that writes no
    heartbeats is silent for as long as its save takes. `last_event_t` never counts the
    observatory's own events (host 1000): findings about a dead run do not keep it alive.
    """
    now = f"(({cut}) + {float(settings.get('stale_after_s'))!r})"
    default = float(settings.get("phase_budget_s"))
    in_budget = f"coalesce(phase IN {PHASE_BUDGETED!r} AND phase_t + coalesce(phase_budget_s, {default!r}) >= {now}, false)"
    return f"(status = 'running' AND coalesce(last_event_t, 0) < {cut} AND NOT {in_budget})"


def run_status_sql(cut: str) -> str:
    """SQL expression over a `runs` row: its status as every reader shows it at cut-off `cut`.

    `crashed` when `crashed_sql(cut)` holds; otherwise the stored status. A stored
    `crashed` stays `crashed`: only new events from the run's writers make it
    `running` again, and ingest stores that when it folds them into `runs`.
    """
    return f"CASE WHEN {crashed_sql(cut)} THEN 'crashed' ELSE status END"


def _has_column(con, table: str, column: str) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_columns() WHERE table_name = ? AND column_name = ? AND NOT internal",
            [table, column],
        ).fetchall()[0][0]
    )


def ensure_schema(con) -> None:
    """Create every table and view if it is missing (idempotent)."""
    con.execute(DDL)
    marked = _has_column(con, "metrics", "replaced")
    phased = all(_has_column(con, "runs", c) for c in ("phase", "phase_t", "phase_budget_s"))
    for table, col, typ in _ADDED_COLUMNS:
        con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {col} {typ}")
    if con.execute("SELECT count(*) FROM ingest_files WHERE rejected IS NULL").fetchall()[0][0]:
        # a store from before the per-file count: its stored rejections are the count so far
        con.execute(
            "UPDATE ingest_files SET rejected_dropped = 0, rejected = "
            "(SELECT count(*) FROM rejected_events r WHERE r.file = ingest_files.path) WHERE rejected IS NULL"
        )
    con.execute(ROLLUP_DDL)
    if (
        not marked
    ):  # a store from before `metrics.replaced`: its next ingest marks and recounts every metric row
        con.execute("UPDATE rollup_state SET n_rows = -1 WHERE source = 'metrics'")
    if not phased:  # a store from before `runs.phase`: every run's newest phase, from its stored events
        con.execute(PHASE_FOLD_SQL.format(events="events"))
    con.execute(VIEWS)
    con.execute(DECISIONS_VIEW_DDL)
    con.execute(GOODPUT_VIEWS)
