"""The spine's CLI: ingest, rebuild, runs, sql (every format), settings."""

from __future__ import annotations

import json
import time

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import event, write_lines

from observatory import findings
from observatory.cli import main


@pytest.fixture
def env(runs_dir, db_path, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs_dir))
    monkeypatch.setenv("OBSERVATORY_DB", str(db_path))
    write_lines(
        runs_dir / "r1" / "events.0.jsonl",
        [
            event("r1", "run_start", {"config": {"lr": 0.1}, "name": "first", "tags": ["t"]}, 0),
            *[event("r1", "metrics", {"train/loss": 3.0 - i, "opt/lr": 0.1}, i + 1, i) for i in range(3)],
            "{broken",
            event("r1", "run_end", {"status": "completed", "final_step": 2}, 5),
        ],
    )
    return runs_dir, db_path


def run(*args):
    res = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return res


@pytest.mark.subprocess
def test_ingest_then_runs_and_sql(env, tmp_path):
    runs_dir, db = env
    res = run("ingest")
    assert res.exit_code == 0
    assert f"{runs_dir / 'r1' / 'events.0.jsonl'}:5: bad JSON" in res.stderr
    assert "ingested 5 events" in res.stderr and "1 rejected" in res.stderr

    res = run("runs", "--format", "json")
    rows = json.loads(res.stdout)
    assert [(r["run"], r["name"], r["status"], r["final_step"]) for r in rows] == [
        ("r1", "first", "completed", 2)
    ]
    table = run("runs").stdout
    assert "r1" in table and "completed" in table

    res = run(
        "sql", "SELECT step, value FROM metrics WHERE name = 'train/loss' ORDER BY step", "--format", "csv"
    )
    assert res.stdout.splitlines() == ["step,value", "0,3.0", "1,2.0", "2,1.0"]
    res = run("sql", "SELECT name, value FROM latest_metrics ORDER BY name", "--format", "json")
    assert json.loads(res.stdout) == [{"name": "opt/lr", "value": 0.1}, {"name": "train/loss", "value": 1.0}]
    out = tmp_path / "m.parquet"
    assert run("sql", "SELECT * FROM metrics", "--format", "parquet", "--out", str(out)).exit_code == 0
    assert pl.read_parquet(out).height == 6
    assert "train/loss" in run("sql", "SELECT DISTINCT name FROM metrics").stdout  # rich table

    res = run("sql", "SELECT * FROM range(10)", "--max-rows", "3", "--format", "csv")
    assert res.stdout.splitlines() == ["range", "0", "1", "2"] and "showing the first 3 rows" in res.stderr


@pytest.mark.subprocess
def test_sql_refusals_and_errors_are_clear(env):
    run("ingest", "-q")
    for sql_text, words in [
        ("ATTACH 'x.duckdb'", "ATTACH statements are refused"),
        ("INSTALL httpfs", "LOAD statements are refused"),
        ("SELECT * FROM read_csv('/etc/passwd')", "disabled by configuration"),
        ("DELETE FROM runs", "DELETE statements are refused"),
        ("SELECT * FROM nope", "nope does not exist"),
    ]:
        res = run("sql", sql_text)
        assert res.exit_code == 1 and words in res.stderr, (sql_text, res.stderr)
        assert "Traceback" not in res.stderr
    res = run("sql", "SELECT count(*) FROM range(100000000000) a", "--time-limit-ms", "200")
    assert res.exit_code == 1 and "sql_time_limit_ms" in res.stderr
    assert run("sql", "SELECT 1", "--format", "parquet").exit_code == 2  # parquet needs --out


@pytest.mark.subprocess
def test_rebuild_and_settings(env):
    run("ingest", "-q")
    before = run("sql", "SELECT * FROM metrics ORDER BY ALL", "--format", "csv").stdout
    res = run("rebuild", "-q")
    assert res.exit_code == 0 and "rebuilt" in res.stderr
    assert run("sql", "SELECT * FROM metrics ORDER BY ALL", "--format", "csv").stdout == before
    out = run("settings").stdout
    assert "stale_after_s" in out and "OBSERVATORY_SQL_TIME_LIMIT_MS" in out


def test_records_folder_is_not_a_run(env):
    """`decisions/` holds observatory records (host 1000, no run_start): never a row of `runs`, never crashed."""
    from observatory import decisions, store
    from observatory.events import OBSERVATORY_HOST
    from observatory.queries.core import list_runs

    runs_dir, db = env
    d = decisions.new(runs_dir, db, title="Policy: every hero run has a ladder", kind="policy")
    path = findings.path(runs_dir, decisions.DECISIONS_RUN)
    assert path.exists() and d.runs == ()
    old = 1_000_000_000.0
    write_lines(path, [event("decisions", "note", {"text": "old record"}, 1, t=old, host=OBSERVATORY_HOST)])
    assert run("ingest", "-q").exit_code == 0
    with store.connect(db) as con:
        assert con.execute("SELECT run FROM runs ORDER BY run").fetchall() == [("r1",)]
        assert con.execute("SELECT count(*) FROM events WHERE run = 'decisions'").fetchall() == [(2,)]
        assert [r["run"] for r in list_runs(con, now=time.time() + 10**6)] == ["r1"]
        assert list_runs(con, status="crashed", now=time.time() + 10**6) == []
    assert [r["run"] for r in json.loads(run("runs", "--format", "json").stdout)] == ["r1"]
