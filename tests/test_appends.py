"""A batch's appends (`observatory.ingest.appends`): grouping, the one thread that uses the connection,
and what the ingester does when an INSERT fails."""

from __future__ import annotations

import threading

import duckdb
import pytest
from conftest import event, write_lines

from observatory import store
from observatory.ingest import msgspec_lines
from observatory.ingest.appends import Appends
from observatory.pipeline import ingest


def _table():
    con = duckdb.connect()
    con.execute("CREATE TABLE t (k VARCHAR, i INTEGER)")
    return con


def test_rows_of_many_files_go_in_one_insert_at_their_limit_on_the_callers_thread():
    """Rows of any file are held together until `limit` of them (one INSERT for many small files), then
    inserted on the caller's thread: the batch's write connection is used by that one thread alone."""
    con = _table()
    calls = []

    def insert(held):
        rows = [r for part in held for r in part]
        calls.append((rows, threading.current_thread()))
        con.execute(
            "INSERT INTO t SELECT k, i FROM (SELECT unnest(?) AS p) CROSS JOIN (SELECT p[1] AS k, p[2]::INTEGER AS i)",
            [rows],
        )

    with Appends() as ap:
        ap.hold([("a", 1), ("a", 2)], 2, insert, limit=4)
        ap.hold([("b", 3)], 1, insert, limit=4)  # another file's rows: held with a's
        assert calls == []
        ap.hold([("b", 4)], 1, insert, limit=4)  # the limit: all four go in one insert, now
        assert len(calls) == 1
        ap.hold([("d", 6)], 1, insert, limit=4)  # left held: the exit's drain inserts it
    assert [rows for rows, _ in calls] == [[("a", 1), ("a", 2), ("b", 3), ("b", 4)], [("d", 6)]]
    assert {t for _, t in calls} == {threading.current_thread()}
    assert con.execute("SELECT k, i FROM t").fetchall() == [("a", 1), ("a", 2), ("b", 3), ("b", 4), ("d", 6)]


def test_leaving_the_block_by_an_error_drops_what_is_held():
    inserted = []
    with pytest.raises(KeyError), Appends() as ap:
        ap.hold([1], 1, inserted.append, limit=10)
        raise KeyError("the decoder failed")
    assert inserted == []  # the transaction is rolled back: nothing more goes in


def test_an_insert_that_fails_rolls_the_whole_batch_back(tmp_path, monkeypatch):
    """The batch's first INSERT fails (a full disk): the error reaches the caller as a full disk does (it
    retries), nothing of the batch is stored, and the next ingest stores everything."""
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
    # on the ingester's own thread, which stops there
    assert calls == [threading.current_thread().name]
    with store.connect(db) as con:
        assert con.execute("SELECT count(*) FROM metrics").fetchall() == [(0,)]
        assert con.execute("SELECT count(*) FROM ingest_files").fetchall() == [(0,)]
    monkeypatch.setattr(msgspec_lines, "_insert", real)
    assert ingest(runs, db, hooks=False, emit=None).metric_values == 6000
    with store.connect(db) as con:
        assert con.execute("SELECT count(*), min(step), max(step) FROM metrics").fetchall() == [
            (6000, 0, 2999)
        ]
