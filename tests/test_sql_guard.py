"""The guarded door for user SQL: a hostile corpus, the limits, the worker pool, and ordinary queries.

The corpus and its judge live in tests/sql_corpus.py (bench/bench_public.py prints the
same corpus's counts). Limits in these tests: 1000 ms, 256 MB.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from dashboard_fixtures import make_store
from polling import holds_for, wait_until
from sql_corpus import CORPUS, MEMORY_LIMIT_MB, TIME_LIMIT_MS, Probe, limits_env

from observatory.queries import dashboard as qd
from observatory.queries import user_sql
from observatory.queries.user_sql import QueryBusy, QueryError, QueryInterrupted, run_user_sql

pytestmark = pytest.mark.subprocess  # user SQL runs in the SQL worker, a child process


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        for k, v in limits_env().items():
            mp.setenv(k, v)
        _, db = make_store(tmp_path_factory.mktemp("guard"))
        p = Probe(db)
        yield p
        p.close()


@pytest.fixture
def db(probe):
    return probe.db


def test_the_corpus_is_large_and_varied():
    assert len(CORPUS) >= 60
    assert len({c.label for c in CORPUS}) == len(CORPUS)
    assert sum(c.slow for c in CORPUS) >= 15 and sum(c.expect == "harmless" for c in CORPUS) >= 10


@pytest.mark.parametrize("case", [c for c in CORPUS if not c.slow], ids=lambda c: c.label)
def test_hostile_statement_is_refused_or_harmless(probe, case):
    v = probe.judge(case)
    assert v.outcome != "harmful", (case.sql[:200], v.reasons, v.message)
    assert v.expected, (case.sql[:200], v.outcome, v.message)
    if v.outcome == "refused":
        assert v.message and "Traceback" not in v.message


@pytest.mark.slow
@pytest.mark.timing  # a wall-clock bound: judged in `make test`'s quiet first pass, not among other tests
@pytest.mark.parametrize("case", [c for c in CORPUS if c.slow], ids=lambda c: c.label)
def test_resource_bomb_is_stopped_within_the_limits(probe, case):
    v = probe.judge(case)
    assert v.outcome != "harmful", (case.sql[:200], v.reasons, v.message)
    assert v.elapsed_ms <= 1.5 * TIME_LIMIT_MS and v.peak_memory_mb <= 1.5 * MEMORY_LIMIT_MB


def test_refusals_say_what_and_why(db):
    for sql, words in [
        ("SELECT * FROM duckdb_settings()", "duckdb_settings() is refused"),
        ("SELECT * FROM DuCkDb_DaTaBaSeS()", "duckdb_databases() is refused"),
        ("SELECT current_setting('threads')", "current_setting() is refused"),
        ("SELECT * FROM pg_settings", "system view pg_settings is refused"),
        ("SELECT * FROM read_parquet('x.parquet')", "disabled by configuration"),
        ("SELECT 1; SELECT 2", "one statement at a time"),
        ("SET threads = 1", "SET statements are refused"),
        ("", "no SQL statement"),
    ]:
        with pytest.raises(QueryError) as e:
            run_user_sql(db, sql)
        assert words in str(e.value), (sql, str(e.value))


@pytest.mark.parametrize(
    "inner",
    [
        "CREATE TABLE t AS SELECT 1",
        "CREATE VIEW v AS SELECT 1",
        "CREATE MACRO m() AS (SELECT 1)",
        "CREATE TEMP TABLE t AS FROM runs",
        "INSERT INTO runs SELECT * FROM runs",
        "COPY (SELECT 1) TO 'x.csv'",
    ],
)
@pytest.mark.parametrize("explain", ["EXPLAIN", "EXPLAIN ANALYZE", "explain (format json)"])
def test_explain_judges_the_statement_it_explains(db, explain, inner):
    """Issue 36: EXPLAIN ANALYZE CREATE ... ran, as only its trailing SELECT was checked."""
    with pytest.raises(QueryError, match="EXPLAIN of a"):
        run_user_sql(db, f"{explain} {inner}")
    assert run_user_sql(db, f"{explain} SELECT 1").rows  # an EXPLAIN of a SELECT still runs


@pytest.mark.timing
def test_time_limit_interrupts_and_kills(db):
    for sql in ("SELECT count(*) FROM range(1000000000000)", "SELECT sleep_ms(30000)"):
        user_sql.warm_up()
        t0 = time.perf_counter()
        with pytest.raises(QueryInterrupted) as e:
            run_user_sql(db, sql)
        assert (time.perf_counter() - t0) < 1.5 * TIME_LIMIT_MS / 1000, sql
        assert e.value.setting == "sql_time_limit_ms" and "OBSERVATORY_SQL_TIME_LIMIT_MS" in str(e.value)
    assert run_user_sql(db, "SELECT 42").rows == [(42,)]  # the killed worker was replaced


@pytest.mark.timing
def test_the_time_limit_watchdog_interrupts_at_the_limit_and_never_after_disarm():
    """The worker's one watchdog thread (made before its address-space limit: a thread made per query could
    fail under it, "can't start new thread"): it interrupts at the limit, says it did, and an armed query
    that ends first is never interrupted, whatever the next query is."""
    from observatory.queries.user_sql_worker import _Watchdog

    class Con:
        def __init__(self):
            self.interrupted = threading.Event()

        def interrupt(self):
            self.interrupted.set()

    dog = _Watchdog()
    slow = Con()
    dog.arm(slow, 0.05)
    assert slow.interrupted.wait(2.0)
    assert dog.disarm() is True
    quick = Con()
    dog.arm(quick, 0.3)
    assert dog.disarm() is False
    holds_for(lambda: not quick.interrupted.is_set(), 0.5, what="a disarmed watchdog interrupts nothing")
    again = Con()
    dog.arm(again, 0.05)  # the same thread serves the next query
    assert again.interrupted.wait(2.0) and dog.disarm() is True


@pytest.mark.timing
def test_a_worker_that_stops_answering_is_killed_at_the_limit(db):
    """A worker frozen mid-query (SIGSTOP: not even DuckDB's interrupt can land) is killed at 1.25x."""
    error, elapsed = _frozen_query(db)
    assert isinstance(error, QueryInterrupted) and elapsed < 1.5 * TIME_LIMIT_MS / 1000
    assert run_user_sql(db, "SELECT 3").rows == [(3,)]


@pytest.mark.timing
def test_the_kill_factor_is_a_setting_within_its_range(db, monkeypatch):
    for bad in ("1.6", "0.9"):
        monkeypatch.setenv("OBSERVATORY_SQL_KILL_AFTER", bad)
        with pytest.raises(
            ValueError, match=r"OBSERVATORY_SQL_KILL_AFTER=.* sql_kill_after must be between 1.0 and 1.5"
        ):
            run_user_sql(db, "SELECT 1")
    monkeypatch.setenv("OBSERVATORY_SQL_KILL_AFTER", "1.5")
    error, elapsed = _frozen_query(db)
    # killed at 1.5x, not at the default 1.25x
    assert (
        isinstance(error, QueryInterrupted)
        and 1.5 * TIME_LIMIT_MS / 1000 <= elapsed < 2.5 * TIME_LIMIT_MS / 1000
    )
    monkeypatch.delenv("OBSERVATORY_SQL_KILL_AFTER")
    assert run_user_sql(db, "SELECT 4").rows == [(4,)]


def _frozen_query(db) -> tuple[Exception | None, float]:
    """(error, seconds) of a long query whose worker is frozen with SIGSTOP once it runs; checks it was killed."""
    user_sql.warm_up()
    out: dict = {}

    def query():
        t0 = time.perf_counter()
        try:
            run_user_sql(db, "SELECT count(*) FROM range(1000000000000)")
        except Exception as e:
            out["error"] = e
        out["elapsed"] = time.perf_counter() - t0

    t = threading.Thread(target=query)
    t.start()
    busy = wait_until(
        lambda: [w for w in user_sql._POOL.all if w.phase == "running" and w.alive()], what="a running worker"
    )
    os.kill(busy[0].proc.pid, signal.SIGSTOP)
    t.join(timeout=10)
    busy[0].proc.wait(timeout=5)  # killed, not left stopped
    return out.get("error"), out["elapsed"]


def test_memory_limit_names_the_setting(db):
    with pytest.raises(QueryError) as e:
        run_user_sql(db, "SELECT length(repeat('x', 2000000000))")
    assert e.value.setting == "sql_memory_limit_mb" and "OBSERVATORY_SQL_MEMORY_LIMIT_MB" in str(e.value)
    assert e.value.peak_memory_mb is not None and e.value.peak_memory_mb < 1.5 * MEMORY_LIMIT_MB
    assert run_user_sql(db, "SELECT 1").rows == [(1,)]


def test_a_query_out_of_memory_is_reported_as_memory_not_as_changed_settings(db):
    # CI once saw this cross-join reported as "changed the locked settings": the read-back of the
    # settings ran out of memory too, right after the query did
    for _ in range(3):
        with pytest.raises(QueryError) as e:
            run_user_sql(
                db, "SELECT count(*) FROM range(100000000) a, range(100000000) b", time_limit_ms=3000
            )
        assert e.value.setting in ("sql_memory_limit_mb", "sql_time_limit_ms"), e.value.message
    assert run_user_sql(db, "SELECT 1").rows == [(1,)]


@pytest.mark.parametrize(
    "failed, after, expect",
    [
        (None, "same", None),  # the result goes out
        ({"kind": "memory"}, "same", {"kind": "memory"}),
        (None, "changed", {"kind": "settings_changed", "retire": True}),
        ({"kind": "memory"}, "changed", {"kind": "settings_changed", "retire": True}),
        (None, "unreadable", {"kind": "settings_changed", "retire": True}),  # unverified: withheld
        ({"kind": "memory"}, "unreadable", {"kind": "memory", "retire": True}),  # keeps its reason
        ({"kind": "interrupted"}, "unreadable", {"kind": "interrupted", "retire": True}),
    ],
)
def test_the_settings_read_back_decides_what_a_query_earns(failed, after, expect):
    from observatory.queries.user_sql_worker import _after_query

    before = [("threads", "2")]
    read = {"same": [("threads", "2")], "changed": [("threads", "8")], "unreadable": None}[after]
    assert _after_query(failed, before, read) == expect


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT INTERVAL 100000000 YEARS AS i",
        "SELECT [INTERVAL 100000000 YEARS] AS l",
        "SELECT {'a': INTERVAL 100000000 YEARS} AS s",
    ],
)
def test_a_value_python_cannot_hold_is_an_error_saying_so_and_the_worker_lives(db, sql):
    """DuckDB computes `INTERVAL 100000000 YEARS`; Python's timedelta cannot hold it. This used to kill
    the worker with an OverflowError, and the visitor was told the query hit the memory limit."""
    user_sql.warm_up()
    pids = {w.proc.pid for w in user_sql._POOL.all if w.alive()}
    with pytest.raises(QueryError) as e:
        run_user_sql(db, sql)
    msg = str(e.value)
    assert e.value.setting is None and "memory" not in msg and "Traceback" not in msg
    assert "out of the range" in msg and "VARCHAR" in msg and "OverflowError" in msg
    assert pids <= {w.proc.pid for w in user_sql._POOL.all if w.alive()}  # no worker died for it
    assert run_user_sql(db, sql.replace(" AS", "::VARCHAR AS", 1)).rows  # as text it shows


def test_result_size_cap(db, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_SQL_MAX_RESULT_MB", "1")
    with pytest.raises(QueryError, match="sql_max_result_mb"):
        run_user_sql(db, "SELECT repeat('x', 100000) AS s FROM range(20)")
    assert len(run_user_sql(db, "SELECT repeat('x', 1000) AS s FROM range(20)").rows) == 20


def test_concurrency_cap_says_busy(db, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_SQL_MAX_CONCURRENT", "1")
    monkeypatch.setenv("OBSERVATORY_SQL_QUEUE_WAIT_MS", "200")
    user_sql.warm_up()
    errors: list[Exception] = []

    def long_query():
        try:
            run_user_sql(db, "SELECT count(*) FROM range(1000000000000)", time_limit_ms=1500)
        except Exception as e:
            errors.append(e)

    t = threading.Thread(target=long_query)
    t.start()
    wait_until(lambda: user_sql._GATE.active, what="the long query holds the only slot")
    t0 = time.perf_counter()
    with pytest.raises(QueryBusy) as e:
        run_user_sql(db, "SELECT 1")
    assert 0.15 < time.perf_counter() - t0 < 1.0
    assert "try again" in str(e.value) and "sql_max_concurrent" in str(e.value)
    t.join(timeout=10)
    assert [type(x) for x in errors] == [QueryInterrupted]
    assert run_user_sql(db, "SELECT 1").rows == [(1,)]  # the slot is free again


def test_a_killed_worker_is_replaced(db):
    user_sql.warm_up()
    wait_until(lambda: user_sql._POOL.idle, what="a started worker")
    killed = list(user_sql._POOL.idle)
    pids = {w.proc.pid for w in killed}
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    wait_until(lambda: not any(w.alive() for w in killed), what="the killed workers are gone")
    assert run_user_sql(db, "SELECT 7").rows == [(7,)]
    assert user_sql._POOL.idle and all(w.proc.pid not in pids for w in user_sql._POOL.idle)


def test_the_worker_prints_nothing_on_the_server(db, capfd):
    run_user_sql(db, "SELECT count(*) FROM range(100000000) a, range(10) b", time_limit_ms=3000)
    out, _ = capfd.readouterr()
    assert out == ""


def test_paths_are_scrubbed_from_results_and_messages(probe):
    res = run_user_sql(probe.db, f"SELECT '{probe.db}' AS p, '{probe.dir}/x' AS d, '{probe.home}/y' AS h")
    assert res.rows == [("<store>", "<store dir>/x", "<home>/y")]
    with pytest.raises(QueryError) as e:
        run_user_sql(probe.db, f"SELECT error('{probe.db} in {probe.home}')")
    assert str(probe.db) not in str(e.value) and "<store> in <home>" in str(e.value)
    files = run_user_sql(probe.db, "SELECT DISTINCT path FROM ingest_files").rows
    assert files and all(str(probe.dir) not in r[0] for r in files)


def test_ordinary_queries_still_work(db):
    assert run_user_sql(db, "SELECT run FROM runs ORDER BY run").rows == [
        ("base-run",),
        ("crashed-run",),
        ("fork-run",),
    ]
    res = run_user_sql(db, "SELECT count(*) AS n FROM metrics WHERE run = 'base-run' AND name = 'train/loss'")
    assert res.columns == ["n"] and res.rows[0][0] > 100
    assert run_user_sql(db, "SELECT count(*) FROM latest_metrics").rows[0][0] > 0
    assert run_user_sql(db, "SELECT count(*) FROM decisions").rows[0][0] >= 0
    describe = run_user_sql(db, "DESCRIBE runs")
    assert "column_name" in describe.columns and ("run",) in [(r[0],) for r in describe.rows]
    tables = {r[0] for r in run_user_sql(db, "SHOW TABLES").rows}
    assert {"runs", "metrics", "events", "latest_metrics"} <= tables
    summary = run_user_sql(db, "SUMMARIZE metrics")
    assert "approx_unique" in summary.columns and len(summary.rows) >= 4
    plan = run_user_sql(db, "EXPLAIN SELECT * FROM metrics WHERE step > 3")
    assert "metrics" in str(plan.rows)
    assert run_user_sql(db, "FROM runs SELECT count(*)").rows == [(3,)]
    assert run_user_sql(db, "VALUES (1, 'a'), (2, 'b')").rows == [(1, "a"), (2, "b")]
    assert run_user_sql(
        db, "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 5) SELECT sum(n) FROM r"
    ).rows == [(15,)]
    assert run_user_sql(
        db, "SELECT table_name FROM information_schema.tables WHERE table_name = 'runs'"
    ).rows == [("runs",)]
    capped = run_user_sql(db, "SELECT * FROM range(50)", max_rows=10)
    assert len(capped.rows) == 10 and capped.truncated
    for name, sql in qd.SQL_EXAMPLES.items():
        run_user_sql(db, sql)  # every example of the console runs
        assert name


def test_a_busy_store_waits_then_says_so_without_its_path(probe, monkeypatch):
    from observatory import store

    monkeypatch.setenv("OBSERVATORY_LOCK_TIMEOUT_S", "0.5")
    monkeypatch.setenv("OBSERVATORY_SQL_TIME_LIMIT_MS", "200")  # the wait for the lock is not query time
    with store.write_connection(probe.db):
        with pytest.raises(store.StoreBusy) as e:
            run_user_sql(probe.db, "SELECT 1")
    assert "lock_timeout_s" in str(e.value) and str(probe.dir) not in str(e.value)
    assert run_user_sql(probe.db, "SELECT 1").rows == [(1,)]


def test_taking_the_last_idle_worker_starts_a_spare_up_to_the_cap(db, monkeypatch):
    """A query that takes the only started worker has a spare started beside it, so a second visitor's
    query meanwhile does not wait for a new process (~1 s, several under load); never past the cap."""
    monkeypatch.setenv("OBSERVATORY_SQL_MAX_CONCURRENT", "2")
    user_sql._POOL.close()
    user_sql.warm_up(1)
    (first,) = user_sql._POOL.idle
    assert run_user_sql(db, "SELECT 1").rows == [(1,)]
    wait_until(lambda: len(user_sql._POOL.idle) >= 2, what="the spare joins the pool")
    idle = list(user_sql._POOL.idle)
    assert first in idle and len(idle) == 2  # the one that ran, and the spare started while it ran
    for _ in range(5):  # the cap holds: taking a worker while another is idle starts nothing
        assert run_user_sql(db, "SELECT 2").rows == [(2,)]
    holds_for(lambda: user_sql.pool_status()["alive"] == 2, 0.5, what="no worker past the cap")
    user_sql._POOL.close()
