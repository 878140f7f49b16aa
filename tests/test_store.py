"""The store: schema and its docs, read-only connections, and the lock turnstile."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest
from polling import holds_for, wait_until

from observatory import store
from observatory.events import KINDS


def test_schema_creates_every_table_and_view(db_path):
    with store.connect(db_path) as con:  # a missing store is created empty
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    assert set(store.TABLE_DOCS) <= names
    for kind in KINDS.values():
        assert kind.table in names, f"kind {kind.name} has no table"


def test_schema_doc_matches_ddl(db_path):
    with store.connect(db_path) as con:
        actual = {
            (t, c)
            for t, c in con.execute(
                "SELECT table_name, column_name FROM duckdb_columns() WHERE NOT internal"
            ).fetchall()
        }
    doc = store.SCHEMA_DOC
    for table, cols in store.schema_columns().items():
        assert f"### `{table}`" in doc
        for col, typ, comment in cols:
            assert (table, col) in actual
            assert comment, f"{table}.{col} has no comment in the DDL (the README documents it from there)"
            assert f"| `{col}` | {typ} |" in doc
    assert {c for t, c in actual if t == "ingest_files"} == {
        c for c, _, _ in store.schema_columns()["ingest_files"]
    }


def test_connect_is_read_only(db_path):
    with store.connect(db_path) as con:
        with pytest.raises(duckdb.Error, match="read-only"):
            con.execute("CREATE TABLE x (a INT)")


def test_old_store_gets_new_columns(db_path):
    con = duckdb.connect(str(db_path))
    con.execute(
        "CREATE TABLE ingest_files (path VARCHAR PRIMARY KEY, run VARCHAR, host USMALLINT, "
        "byte_offset BIGINT NOT NULL, line BIGINT NOT NULL, last_seq BIGINT, size BIGINT, mtime DOUBLE)"
    )
    con.close()
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
        cols = {r[0] for r in con.execute("DESCRIBE ingest_files").fetchall()}
    assert {"first_seq", "cursor_seq"} <= cols


def test_reader_waits_for_writer_and_writer_is_not_starved(db_path):
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
    w = store.write_connection(db_path)
    got: list[float] = []
    trying = threading.Event()

    def reader():
        trying.set()
        with store.connect(db_path) as con:
            got.append((time.monotonic(), con.execute("SELECT count(*) FROM runs").fetchall()[0][0]))

    th = threading.Thread(target=reader)
    th.start()
    wait_until(trying.is_set, what="the reader asks for the store")
    holds_for(lambda: not got, 0.3, what="a reader must wait while the writer holds the store")
    w.execute("INSERT INTO runs (run, status) VALUES ('x', 'running')")
    t_closed = time.monotonic()
    w.close()
    th.join(10)
    assert got and got[0][0] >= t_closed and got[0][1] == 1  # it got in after the commit and saw it

    # readers keep arriving; a writer still gets in (the gate stops new readers while it waits)
    stop = threading.Event()
    reads: list[int] = []

    def busy_reader():
        while not stop.is_set():
            with store.connect(db_path) as con:
                con.execute("SELECT count(*) FROM runs").fetchall()
                reads.append(1)
                time.sleep(0.02)

    readers = [threading.Thread(target=busy_reader) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        wait_until(lambda: len(reads) >= 6, what="the readers stream in")
        t0 = time.monotonic()
        with store.write_connection(db_path, timeout_s=10) as con:
            con.execute("INSERT INTO runs (run, status) VALUES ('y', 'running')")
        assert time.monotonic() - t0 < 5
    finally:
        stop.set()
        for r in readers:
            r.join(10)


def test_a_writer_takes_a_gap_between_readers_without_holding_new_readers_back(db_path):
    """While a writer looks for a gap (`GAP_WAIT_S`), the gate stays open: a reader that comes after it
    gets in at once instead of waiting for the reader in flight and then for the writer's transaction."""
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
    events: list[tuple[str, float]] = []
    first_in = threading.Event()

    def slow_reader():
        with store.connect(db_path) as con:
            first_in.set()
            con.execute("SELECT count(*) FROM runs").fetchall()
            time.sleep(0.15)
        events.append(("slow reader out", time.monotonic()))

    def writer():
        with store.write_connection(db_path, timeout_s=10) as con:
            events.append(("writer in", time.monotonic()))
            con.execute("INSERT INTO runs (run, status) VALUES ('w', 'running')")
            time.sleep(0.2)

    def late_reader():
        with store.connect(db_path, timeout_s=10) as con:
            events.append(("late reader in", time.monotonic()))
            con.execute("SELECT count(*) FROM runs").fetchall()

    assert 0.15 < store.connection.GAP_WAIT_S  # the slow reader leaves within the writer's window
    threads = [
        threading.Thread(target=slow_reader),
        threading.Thread(target=writer),
        threading.Thread(target=late_reader),
    ]
    threads[0].start()
    first_in.wait(5)
    threads[1].start()
    time.sleep(0.05)  # the writer is waiting now
    threads[2].start()
    for t in threads:
        t.join(10)
    order = [name for name, _ in sorted(events, key=lambda e: e[1])]
    # gated at once (as before), the late reader would have waited for the writer: last, not first
    assert order == ["late reader in", "slow reader out", "writer in"], order


@pytest.mark.timing  # under load the relay can leave a real gap, and the writer gets in early
def test_a_writer_with_no_gap_closes_the_gate_after_its_window(db_path):
    """Readers that hand over to each other leave no gap: the writer closes the gate once `GAP_WAIT_S`
    has passed and gets in after the reader in flight, so it is never starved."""
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
    stop = threading.Event()
    handed = threading.Semaphore(0)
    readers: list[threading.Thread] = []

    def reader():
        with store.connect(db_path, timeout_s=10) as con:
            con.execute("SELECT count(*) FROM runs").fetchall()
            time.sleep(0.05)
            handed.release()  # the next reader comes in before this one leaves
            time.sleep(0.05)

    def relay():
        while not stop.is_set():
            if handed.acquire(timeout=0.5) and not stop.is_set():
                readers.append(threading.Thread(target=reader))
                readers[-1].start()

    handed.release()
    th = threading.Thread(target=relay)
    th.start()
    try:
        wait_until(lambda: len(readers) >= 3, what="readers hand over to each other")
        t0 = time.monotonic()
        with store.write_connection(db_path, timeout_s=10) as con:
            waited = time.monotonic() - t0
            con.execute("INSERT INTO runs (run, status) VALUES ('z', 'running')")
    finally:
        stop.set()
        th.join(10)
        for r in readers:
            r.join(10)
    assert store.connection.GAP_WAIT_S <= waited < store.connection.GAP_WAIT_S + 1.0, waited


def test_a_thread_that_reads_cannot_deadlock_against_a_waiting_writer(db_path, monkeypatch):
    """A thread holding a read connection opens another while a writer waits with the gate closed: it gets
    in (past the gate), where it would otherwise wait for the writer that waits for it; asking for the write
    connection while it reads fails at once instead of waiting for itself."""
    import threading

    from observatory.store import connection

    monkeypatch.setenv("OBSERVATORY_LOCK_TIMEOUT_S", "5")
    monkeypatch.setattr(connection, "GAP_WAIT_S", 0.05)
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
    wrote = threading.Event()

    def writer():
        with store.write_connection(db_path) as w:
            w.execute("CREATE TABLE IF NOT EXISTS t AS SELECT 1 AS x")
        wrote.set()

    with store.connect(db_path) as outer:
        outer.execute("SELECT 1").fetchall()
        with pytest.raises(store.ReentrantWrite, match="holds a read connection"):
            store.write_connection(db_path)
        t = threading.Thread(target=writer)
        t.start()
        # the writer found no gap: it holds the gate and waits for this thread's lock
        wait_until(lambda: connection.writer_active(db_path), what="the writer closes the gate")
        assert not wrote.is_set()
        t0 = time.monotonic()
        with store.connect(db_path) as inner:  # re-entrant: past the gate the writer holds
            assert inner.execute("SELECT 1").fetchall() == [(1,)]
        assert time.monotonic() - t0 < 2
        assert not wrote.is_set()  # the writer still waits for the outer connection
    t.join(10)
    assert wrote.is_set()
    with store.write_connection(db_path) as w:  # no read connection left in this thread: allowed again
        assert w.execute("SELECT x FROM t").fetchall() == [(1,)]


def test_busy_store_raises_store_busy_naming_the_setting(db_path):
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
        with pytest.raises(store.StoreBusy, match="lock_timeout_s"):
            store.connect(db_path, timeout_s=0.2)


@pytest.mark.subprocess
def test_decisions_view_on_an_empty_store_and_after_ingest(runs_dir, db_path):
    """`SELECT * FROM decisions` works through the user-SQL door, empty or not, and agrees with the query."""
    from observatory import decisions
    from observatory.pipeline import ingest
    from observatory.queries.decisions import current_states
    from observatory.queries.user_sql import run_user_sql

    empty = run_user_sql(db_path, "SELECT * FROM decisions")
    assert empty.rows == [] and empty.columns[:3] == ["id", "state", "home_run"] and "status" in empty.columns
    d = decisions.new(runs_dir, db_path, title="Enable z-loss", kind="intervention", ingest=ingest)
    decisions.update(runs_dir, db_path, d.id, status="running", ingest=ingest)
    res = run_user_sql(db_path, "SELECT id, kind, status, n_events, home_run FROM decisions")
    assert res.rows == [(d.id, "intervention", "running", 2, decisions.DECISIONS_RUN)]
    with store.connect(db_path) as con:
        assert [s["id"] for s in current_states(con)] == [d.id]
    assert "- `decisions`: " in store.SCHEMA_DOC


@pytest.mark.subprocess
def test_store_imports_without_a_cycle():
    """store pulls the decisions view SQL in lazily: both import orders work in a fresh interpreter."""
    import subprocess
    import sys

    for first, second in (
        ("observatory.store", "observatory.queries.decisions"),
        ("observatory.queries.decisions", "observatory.store"),
    ):
        code = f"import {first}, {second}; import observatory.store as s; print(' '.join(s.VIEW_NAMES))"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert "decisions" in out.split()


def test_run_status_is_one_definition_for_ingest_cli_and_reports(runs_dir, db_path, monkeypatch):
    """`crashed` after `stale_after_s` of silence from the run's own writers, the same for every reader.

    - a run with no run_end whose writers went silent is `crashed` (stored, listed, reported);
    - a stored `crashed` is never shown as `running` unless new events arrived (even to a reader
      whose `stale_after_s` is longer than the ingester's);
    - observatory-host (1000) events do not keep a run alive;
    - a folder without run_start shows as `records` in reports.
    """
    from conftest import event, write_lines, write_stall_finding

    from observatory import report
    from observatory.events import OBSERVATORY_HOST
    from observatory.pipeline import ingest
    from observatory.queries import report as qr
    from observatory.queries.core import list_runs

    now = time.time()

    def shown(run):
        with store.connect(db_path) as con:
            listed = {r["run"]: r["status"] for r in list_runs(con)}.get(run)
            stored = con.execute("SELECT status FROM runs WHERE run = ?", [run]).fetchall()
            info = qr.run_info(con, run)
            info["writer_t"] = qr.last_writer_t(con, run, OBSERVATORY_HOST)
        return listed, stored[0][0] if stored else None, report.effective_status(info)

    write_lines(
        runs_dir / "quiet" / "events.0.jsonl",
        [
            event("quiet", "run_start", {"config": {}}, 0, t=now - 60),
            event("quiet", "metrics", {"x": 1.0}, 1, 1, t=now - 60),
        ],
    )
    write_stall_finding(runs_dir, "quiet", 1, t=now)
    write_lines(runs_dir / "live" / "events.0.jsonl", [event("live", "run_start", {"config": {}}, 0, t=now)])
    write_lines(
        runs_dir / "notes" / f"events.{OBSERVATORY_HOST}.jsonl",
        [event("notes", "note", {"text": "a record"}, 0, t=now, host=OBSERVATORY_HOST)],
    )
    monkeypatch.setenv("OBSERVATORY_STALE_AFTER_S", "30")
    ingest(runs_dir, db_path, hooks=False, emit=None)
    assert shown("quiet") == ("crashed", "crashed", "crashed")  # the host-1000 finding kept nothing alive
    assert shown("live") == ("running", "running", "running")
    # a reader that waits longer before calling a run crashed still shows the stored verdict
    monkeypatch.setenv("OBSERVATORY_STALE_AFTER_S", "3600")
    assert shown("quiet") == ("crashed", "crashed", "crashed")
    # new events from the run's writers: running again, everywhere
    write_lines(runs_dir / "quiet" / "events.0.jsonl", [event("quiet", "metrics", {"x": 2.0}, 2, 2, t=now)])
    ingest(runs_dir, db_path, hooks=False, emit=None)
    assert shown("quiet") == ("running", "running", "running")
    # observatory records without run_start: not a run, a `records` folder in reports
    with store.connect(db_path) as con:
        info = qr.run_info(con, "notes")
        assert "notes" not in {r["run"] for r in list_runs(con)}
    assert report.effective_status({**info, "writer_t": None}) == "records"


@pytest.mark.slow  # seconds: `make test`, not `make check`
@pytest.mark.parametrize("name", ["store.duckdb", "temp.duckdb", "it's.duckdb"])
def test_the_writer_writes_big_row_groups_under_the_store_s_own_name(tmp_path, name):
    """Row groups of `ROW_GROUP_ROWS` (DuckDB's default is 8x smaller): a filtered query on a fresh
    instance reads every row group's statistics, which at 2x10^9 rows cost ~0.4 s a page."""
    path = tmp_path / name
    n = store.ROW_GROUP_ROWS * 2 + 5
    with store.write_connection(path) as con:
        store.ensure_schema(con)
        con.execute(
            "INSERT INTO expert_load SELECT 'r', i // 1000, 0, i % 1000, 1, 0 FROM range(?) t(i)", [n]
        )
    with store.write_connection(path) as con:  # a later writer appends into the same size of group
        assert con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0] == f"{path}.tmp"
        con.execute(
            "INSERT INTO expert_load SELECT 'r', 10**6 + i // 1000, 0, i % 1000, 1, 0 FROM range(?) t(i)", [n]
        )
    with store.connect(path) as con:
        groups = con.execute(
            "SELECT count(DISTINCT row_group_id) FROM pragma_storage_info('expert_load')"
        ).fetchall()
        assert groups[0][0] == -(-2 * n // store.ROW_GROUP_ROWS)  # 5, where DuckDB's default gives 35
        assert con.execute("SELECT count(*) FROM latest_metrics").fetchall() == [(0,)]  # views bind as before


@pytest.mark.parametrize(
    "runs, want",
    [("s3://lab-logs/runs/", "s3://lab-logs/runs"), ("gcs://lab-logs", "gs://lab-logs")],
)
def test_the_default_runs_dir_keeps_a_bucket_url_a_url(monkeypatch, runs, want):
    """A `Path` would fold `s3://b/p` into `s3:/b/p`, a local folder named `s3:`."""
    monkeypatch.setenv("OBSERVATORY_RUNS", runs)
    assert store.default_runs_dir() == want


def test_the_default_runs_dir_of_a_folder_is_a_path(monkeypatch, tmp_path):
    monkeypatch.setenv("OBSERVATORY_RUNS", str(tmp_path / "runs"))
    assert store.default_runs_dir() == tmp_path / "runs"
