"""The store's kept DuckDB instances (`store.connection.Process`'s `instances`): a unit of work ATTACHes the store
to an instance kept from the last one, instead of paying for a new instance, and must behave exactly
as a fresh `duckdb.connect(path)` would: see other processes' writes, leave no WAL and no lock behind,
and carry nothing of one unit of work into the next."""

from __future__ import annotations

import subprocess
import sys

import pytest

from observatory import store
from observatory.store import connection

_SEEN: list = []  # every instance a test looked at, held so that no freed one's id is given to a new one


def _instance(con) -> int:
    _SEEN.append(con.duckdb)
    return id(con.duckdb)


@pytest.fixture
def process(monkeypatch) -> connection.Process:
    """A process's store state of its own (`connection.PROCESS`): no instance kept by another test."""
    fresh = connection.Process()
    monkeypatch.setattr(connection, "PROCESS", fresh)
    return fresh


@pytest.fixture
def seeded(db_path):
    with store.write_connection(db_path) as con:
        store.ensure_schema(con)
        con.execute("INSERT INTO runs (run, name) VALUES ('a', 'a')")
    return db_path


def _other_process(db_path, code: str) -> subprocess.CompletedProcess:
    """`code` in another process, with `con` a bare DuckDB connection to the store (no locks of ours)."""
    script = f"import duckdb\ncon = duckdb.connect({str(db_path)!r})\n{code}\ncon.close()\n"
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.subprocess
def test_a_unit_of_work_reuses_the_last_instance_and_sees_other_processes_writes(seeded):
    with store.connect(seeded) as con:
        first = _instance(con)
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    # closed: the store file is free, another process may write it at once (DuckDB's own lock is gone)
    r = _other_process(seeded, "con.execute(\"INSERT INTO runs (run, name) VALUES ('b', 'b')\")")
    assert r.returncode == 0, r.stderr
    with store.connect(seeded) as con:
        assert _instance(con) == first  # kept, not made anew
        assert con.execute("SELECT run FROM runs ORDER BY run").fetchall() == [("a",), ("b",)]
        assert con.execute("SELECT current_database()").fetchall() == [(seeded.name.split(".")[0],)]
        assert con.execute("SELECT current_setting('temp_directory')").fetchall() == [(f"{seeded}.tmp",)]


@pytest.mark.subprocess
def test_a_kept_writer_leaves_its_rows_in_the_file_and_no_wal(seeded):
    wal = seeded.with_name(seeded.name + ".wal")
    for i in range(3):
        with store.write_connection(seeded) as con:
            con.execute("BEGIN TRANSACTION")
            con.execute("INSERT INTO runs (run, name) VALUES (?, ?)", [f"w{i}", "w"])
            con.execute("COMMIT")
        assert not wal.exists()  # DETACH checkpointed it, as closing did
        r = _other_process(
            seeded, "print(con.execute(\"SELECT count(*) FROM runs WHERE name = 'w'\").fetchall()[0][0])"
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str(i + 1)


def test_an_uncommitted_transaction_is_rolled_back_not_carried_over(seeded):
    con = store.write_connection(seeded)
    con.execute("BEGIN TRANSACTION")
    con.execute("INSERT INTO runs (run, name) VALUES ('lost', 'lost')")
    con.close()
    with store.write_connection(seeded) as con:
        assert con.execute("SELECT count(*) FROM runs WHERE run = 'lost'").fetchall() == [(0,)]
        con.execute("BEGIN TRANSACTION")  # no transaction was left open on the kept instance
        con.execute("COMMIT")


def test_nothing_temporary_or_failed_or_locked_is_kept(seeded):
    with store.connect(seeded) as con:
        kept = _instance(con)
    # a temporary table left behind: the instance is closed, not kept
    with store.connect(seeded) as con:
        assert _instance(con) == kept
        con.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS x")
    with store.connect(seeded) as con:
        assert _instance(con) != kept
        assert con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp'"
        ).fetchall() == [(0,)]
        kept = _instance(con)
    # a unit of work that raised: closed too
    with pytest.raises(ZeroDivisionError), store.connect(seeded) as con:
        assert _instance(con) == kept
        raise ZeroDivisionError
    with store.connect(seeded) as con:
        assert _instance(con) != kept
        kept = _instance(con)
        con.execute("SET lock_configuration = true")  # someone else's SQL could do this
    with store.connect(seeded) as con:
        assert _instance(con) != kept
        kept = _instance(con)
    # fresh: an instance of its own, neither taken from the kept ones nor kept after
    with store.connect(seeded, fresh=True) as con:
        assert _instance(con) != kept
        mine = _instance(con)
    with store.connect(seeded) as con:
        assert _instance(con) == kept
        assert _instance(con) != mine


def test_readers_and_writers_keep_instances_apart_and_concurrent_readers_get_their_own(process, seeded):
    with store.write_connection(seeded) as w:
        writer = _instance(w)
    a = store.connect(seeded)
    b = store.connect(seeded)  # two readers at once (two dashboard sessions): two instances
    try:
        assert len({_instance(a), _instance(b), writer}) == 3
        assert (
            a.execute("SELECT count(*) FROM runs").fetchall()
            == b.execute("SELECT count(*) FROM runs").fetchall()
        )
    finally:
        a.close()
        b.close()
    assert len(process.instances._idle[True]) == 2 and len(process.instances._idle[False]) == 1


def test_a_prepared_spare_is_the_next_fresh_connection_s_and_only_its(process, seeded):
    """The SQL worker makes its next instance while it waits (`prepare_fresh`); a kept instance is
    never handed out as fresh, and the spare is never handed out as a kept one."""
    with store.connect(seeded) as con:
        kept = con.duckdb
    connection.prepare_fresh()
    spare = process.instances._spare
    assert spare is not None and spare is not kept
    with store.connect(seeded) as con:
        assert con.duckdb is kept  # not the spare
    with store.connect(seeded, fresh=True) as con:
        assert con.duckdb is spare
        assert con.execute("SELECT count(*) FROM runs").fetchall() == [(1,)]
    assert process.instances._spare is None
    with store.connect(seeded, fresh=True) as con:
        assert con.duckdb is not spare and con.duckdb is not kept
