"""A batch's appends on its worker thread (`observatory.ingest.appends`): order, grouping, errors, and
what the ingester does when an INSERT on the worker fails."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest
from conftest import event, write_lines

from observatory import store
from observatory.ingest import appends as appends_mod
from observatory.ingest import msgspec_lines
from observatory.ingest.appends import Appends
from observatory.pipeline import ingest


def _table():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, i INTEGER)")
    return con


def test_tasks_run_in_order_on_one_worker_and_held_rows_go_at_their_limit(monkeypatch):
    """Rows of any file are held together until `limit` of them (one INSERT for many small files), then
    inserted on the worker, in the order of everything submitted."""
    monkeypatch.setattr(appends_mod, "HOLD_WHILE_BUSY", 1)  # a limit holds whether or not the worker is busy
    con = _table()
    calls = []

    def insert(held):
        rows = [r for part in held for r in part]
        calls.append((rows, threading.current_thread().name))
        con.execute(
            "INSERT INTO t SELECT k, i FROM (SELECT unnest(?) AS p) CROSS JOIN (SELECT p[1] AS k, p[2]::INTEGER AS i)",
            [rows],
        )

    with Appends() as ap:
        ap.hold([("a", 1), ("a", 2)], 2, insert, limit=4)
        ap.hold([("b", 3)], 1, insert, limit=4)  # another file's rows: held with a's
        ap.hold([("b", 4)], 1, insert, limit=4)  # the limit: all four go in one insert
        ap.submit(con.execute, "INSERT INTO t VALUES ('c', 5)")  # queued behind that insert
        ap.hold([("d", 6)], 1, insert, limit=4)  # left held: the exit's drain submits it
    assert [rows for rows, _ in calls] == [[("a", 1), ("a", 2), ("b", 3), ("b", 4)], [("d", 6)]]
    assert {name for _, name in calls} == {"observatory-ingest_0"}  # the worker, not the caller
    # one worker, in submission order: the table's rows are in the order they were handed over
    assert con.execute("SELECT k, i FROM t").fetchall() == [
        ("a", 1),
        ("a", 2),
        ("b", 3),
        ("b", 4),
        ("c", 5),
        ("d", 6),
    ]


def test_a_second_rows_task_waits_for_the_first_and_a_busy_worker_lets_more_be_held():
    started, release, sizes = threading.Event(), threading.Event(), []

    def slow(held):
        sizes.append(sum(held))
        started.set()
        release.wait(5)

    ap = Appends()
    try:
        ap.hold(4, 4, slow, limit=4)  # reaches the limit: submitted, and the worker sits in it
        assert started.wait(5)
        t0 = time.monotonic()
        for _ in range(appends_mod.HOLD_WHILE_BUSY - 1):
            ap.hold(4, 4, slow, limit=4)  # worker busy: held, up to HOLD_WHILE_BUSY times the limit
        assert sizes == [4] and time.monotonic() - t0 < 0.25  # none of them waited
        threading.Timer(0.3, release.set).start()
        ap.hold(4, 4, slow, limit=4)  # the cap: it waits for the busy worker, then submits the lot
        assert time.monotonic() - t0 >= 0.25
        ap.drain()
        assert sizes == [4, 4 * appends_mod.HOLD_WHILE_BUSY]
    finally:
        release.set()
        ap.close()


def test_an_error_on_the_worker_is_raised_after_everything_queued_has_run():
    ran = []

    def boom():
        raise RuntimeError("disk full")

    ap = Appends()
    ap.submit(ran.append, 1)
    ap.submit(boom)
    ap.submit(ran.append, 2)  # runs although the one before failed: the caller rolls back after all
    with pytest.raises(RuntimeError, match="disk full"):
        ap.drain()
    assert ran == [1, 2]
    ap.close()


def test_leaving_the_block_by_an_error_waits_for_the_running_task_and_drops_what_is_held():
    done, inserted = threading.Event(), []

    def slow():
        time.sleep(0.3)
        done.set()

    with pytest.raises(KeyError), Appends() as ap:
        ap.submit(slow)
        ap.hold([1], 1, inserted.append, limit=10)
        raise KeyError("the decoder failed")
    assert done.is_set()  # a ROLLBACK after the block never runs beside a statement of the worker's
    assert inserted == []


def test_an_insert_that_fails_on_the_worker_rolls_the_whole_batch_back(tmp_path, monkeypatch):
    """The batch's first INSERT fails on the worker (a full disk) while the decoder goes on: the error
    reaches the caller as a full disk does (it retries), nothing of the batch is stored, and the next
    ingest stores everything."""
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    lines = [event("a", "metrics", {"loss": 1.0 + i, "lr": 1e-3}, i, i) for i in range(3000)]
    write_lines(runs / "a" / "events.0.jsonl", lines)
    monkeypatch.setattr(msgspec_lines, "PIECE_BYTES", 20_000)
    monkeypatch.setattr(msgspec_lines, "INSERT_ROWS", 500)  # many INSERTs, the first one fails
    real, calls = msgspec_lines._insert, []

    def failing(con, held):
        calls.append(threading.current_thread().name)
        if len(calls) == 1:
            raise duckdb.IOException("IO Error: No space left on device")
        real(con, held)

    monkeypatch.setattr(msgspec_lines, "_insert", failing)
    with pytest.raises(duckdb.IOException, match="No space left"):
        ingest(runs, db, hooks=False, emit=None)
    # on the worker; the decoder hears of it as it hands over its next rows, and stops there
    assert len(calls) == 1 and calls[0].startswith("observatory-ingest")
    with store.connect(db) as con:
        assert con.execute("SELECT count(*) FROM metrics").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM ingest_files").fetchall() == [(0,)]
    monkeypatch.setattr(msgspec_lines, "_insert", real)
    assert ingest(runs, db, hooks=False, emit=None).metric_values == 6000
    with store.connect(db) as con:
        assert con.execute("SELECT count(*), min(step), max(step) FROM metrics").fetchall() == [
            (6000, 0, 2999)
        ]
