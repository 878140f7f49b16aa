"""A catch-up batch's after-commit hooks read inside its transaction and compute while it commits
(`ingest.hooks`: `prepare`): the same findings and state as after the commit, nothing lost when a read
fails, the cheap hooks' event writes held back until the commit (`findings.deferred`)."""

from __future__ import annotations

import dataclasses
import json
import threading

import duckdb
import numpy as np
import pytest
from conftest import event, write_lines
from test_anomalies import BLOOM_GRAD, clean, stored_anomalies, write_run

from observatory import findings, store
from observatory.detect import scan
from observatory.ingest import hooks, ingest, msgspec_lines, passes


def _q(db, sql):
    with store.connect(db) as con:
        return con.execute(sql).fetchall()


def _troubled_run(runs_dir, run: str) -> None:
    """A run with a grad spike and loss spike, a bad batch and a NaN, ended."""
    steps, loss, grad, _, _ = clean(1500, seed=3)
    grad[700:706] = BLOOM_GRAD
    loss[703:708] += np.array([0.3, 1.5, 2.5, 1.0, 0.4])
    loss[1100] = 0.2
    loss[1300] = np.nan
    write_run(runs_dir, run, steps, loss, grad)


def _findings(db) -> list[tuple]:
    return sorted((a["run"], a["detector"], a["metric"], tuple(a["window"]), a["severity"]) for a in stored_anomalies(db))


@pytest.fixture
def catch_up(monkeypatch):
    """Every batch a catch-up (the prepared path); the list of the prepared jobs each COMMIT waited with."""
    monkeypatch.setattr(passes, "ROLL_UP_APART_BELOW", 0)
    prepared = []
    commit = hooks.commit

    def spy(con, jobs):
        prepared.extend(name for name, job in jobs.items() if job is not None)
        return commit(con, jobs)

    monkeypatch.setattr(hooks, "commit", spy)
    return prepared


def test_a_prepared_scan_finds_what_a_scan_after_the_commit_finds(tmp_path, monkeypatch, catch_up):
    runs = tmp_path / "runs"
    _troubled_run(runs, "t")
    scan._STATE.clear()
    prepared_db = tmp_path / "prepared.duckdb"
    ingest(runs, prepared_db, hooks=True, emit=None)
    assert "anomalies" in catch_up, "the catch-up batch prepared its scan"
    got = _findings(prepared_db)
    assert {f[1] for f in got} >= {"grad_spike", "loss_spike", "nonfinite"}

    for p in runs.glob("*/events.1000.jsonl"):
        p.unlink()
    scan._STATE.clear()
    monkeypatch.setattr(hooks, "BUILTIN", tuple(dataclasses.replace(h, prepare=None) for h in hooks.BUILTIN))
    after_db = tmp_path / "after.duckdb"
    ingest(runs, after_db, hooks=True, emit=None)
    assert got == _findings(after_db)
    state = "SELECT * FROM detector_state ORDER BY ALL"
    assert _q(prepared_db, state) == _q(after_db, state) and _q(prepared_db, state)


def test_the_commit_runs_on_a_worker_thread_while_the_scan_computes(tmp_path, monkeypatch, catch_up):
    runs = tmp_path / "runs"
    _troubled_run(runs, "t")
    seen = {}
    commit_in = []
    finish = scan._RunScan.finish

    def spy_finish(self, *a, **k):
        seen["compute"] = threading.current_thread()
        return finish(self, *a, **k)

    real_commit = hooks.commit

    def spy_commit(con, jobs):
        class Con:  # the batch's connection, its COMMIT's thread noted
            def execute(self, sql, *a):
                if sql == "COMMIT":
                    commit_in.append(threading.current_thread())
                return con.execute(sql, *a)

        return real_commit(Con(), jobs)

    monkeypatch.setattr(scan._RunScan, "finish", spy_finish)
    monkeypatch.setattr(hooks, "commit", spy_commit)
    scan._STATE.clear()
    ingest(runs, tmp_path / "obs.duckdb", hooks=True, emit=None)
    assert seen["compute"] is threading.main_thread()
    assert commit_in and commit_in[0] is not threading.main_thread()


def test_a_hook_that_swallows_a_failed_query_inside_the_batch_costs_it_nothing(tmp_path, monkeypatch, catch_up):
    """DuckDB aborts a transaction at a failed query and its COMMIT then rolls back without a word: a hook
    that catches its own error (they never raise) must not make the batch vanish."""
    from observatory.ladder import watch

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_lines(runs / "a" / "events.0.jsonl", [event("a", "metrics", {"train/loss": 3.0 - s / 100}, s, s) for s in range(300)])
    calls = []

    def swallowing(con, runs_dir, touched):
        calls.append(getattr(con, "read_only", None))
        try:
            con.execute("SELECT * FROM no_such_table")
        except duckdb.Error:
            pass
        return set()

    monkeypatch.setattr(watch, "after_ingest", swallowing)
    msgs: list[str] = []
    rep = ingest(runs, db, hooks=True, emit=msgs.append)
    assert rep.metric_values == 300 and _q(db, "SELECT count(*) FROM metrics") == [(300,)]
    assert any("ladder_watch's reads inside the batch failed (TransactionException" in m for m in msgs), msgs
    assert calls == [False, True]  # inside the first try (write connection), then after the redone batch's commit


def test_held_writes_reach_the_file_only_when_written(tmp_path):
    runs = tmp_path / "runs"
    (runs / "r").mkdir(parents=True)

    def found(detector, step):
        return [({"detector": detector, "metric": "m", "severity": "warn", "message": "m", "window": [step, step]}, step)]

    with findings.deferred() as held:
        assert findings.write(runs, "r", "anomaly", found("x", 1)) == 1
        assert findings.pending(runs, "r", "anomaly") == [] and not findings.path(runs, "r").exists()
        with findings.deferred() as inner:
            findings.write(runs, "r", "anomaly", found("y", 2))
        assert len(inner) == 1 and len(held) == 1
        assert findings.pending(runs, "r", "anomaly") == []
    for w in held + inner:
        findings.write(*w)
    assert [e["data"]["detector"] for e in findings.pending(runs, "r", "anomaly")] == ["x", "y"]
    findings.write(runs, "r", "anomaly", found("z", 3))  # no block: at once
    assert len(findings.pending(runs, "r", "anomaly")) == 3


@pytest.mark.parametrize("path", ["arrays", "arrays and one line by itself", "sql"])
def test_secret_metric_names_are_hidden_whichever_way_their_rows_came(tmp_path, monkeypatch, path):
    """Redaction takes a catch-up's names from its arrays when they hold every new row, else asks DuckDB."""
    secret = "sk-proj-PlantedOpenAiKey0123456789"
    lines = [event("a", "metrics", {"train/loss": 1.0, f"key/{secret}": float(s)}, s, s) for s in range(50)]
    if path == "arrays and one line by itself":
        lines.append(event("a", "metrics", {f"other/{secret}": 1.0}, 50, 50))
        nan = event("a", "metrics", {f"x/{secret}": 0.0}, 51, 51)
        lines.append(json.dumps(nan).replace("0.0}", "NaN}"))  # a NaN literal: judged by _check_line alone
    write_lines(tmp_path / "runs" / "a" / "events.0.jsonl", lines)
    monkeypatch.setattr(msgspec_lines, "ENABLED", path != "sql")
    db = tmp_path / "obs.duckdb"
    ingest(tmp_path / "runs", db, hooks=True, emit=None)
    names = [r[0] for r in _q(db, "SELECT DISTINCT name FROM metrics")]
    assert len(names) == (4 if path == "arrays and one line by itself" else 2)
    assert not any(secret in n for n in names)
    assert _q(db, "SELECT redactions FROM runs") == [(50 + (2 if path == "arrays and one line by itself" else 0),)]


def test_metric_arrays_are_metric_series_as_arrays():
    """The detectors' reads average a (name, step)'s rows in numpy; they equal the polars frame's columns
    (DuckDB's avg per (step, name)): several hosts and a replayed step, NULLs, a NaN, host 1000, NULL steps."""
    import math

    from observatory.queries import anomalies as qa

    con = duckdb.connect()
    store.ensure_schema(con)
    rows = [("r", 1, "a", 1.0, 0), ("r", 1, "a", 2.0, 1), ("r", 1, "a", 4.0, 2), ("r", 2, "a", None, 0),
            ("r", 3, "a", None, 0), ("r", 3, "a", 5.0, 1), ("r", 2, "b", math.nan, 0), ("r", 2, "b", 1.0, 1),
            ("r", 5, "b", 7.0, 1000), ("r", None, "a", 1.0, 0), ("r", 0, "c", 1.0, 0), ("r", 4, "b", 0.5, 0),
            ("other", 1, "a", 9.0, 0)]  # fmt: skip
    con.executemany("INSERT INTO metrics VALUES (?, ?, ?, ?, 0.0, ?)", rows)
    for since in (None, 2, 9):
        steps, series = qa.metric_arrays(con, "r", since, ["b", "a", "zz"])
        frame = qa.metric_series(con, "r", since, ["b", "a", "zz"])
        assert steps.tolist() == frame["step"].to_list()
        for name in ("a", "b", "zz"):
            if name not in frame.columns or frame[name].null_count() == frame.height:
                assert name not in series
                continue
            sub = frame.drop_nulls(name)
            np.testing.assert_array_equal(series[name][0], sub["step"].to_numpy())
            np.testing.assert_array_equal(series[name][1], sub[name].to_numpy())  # NaN where the frame has NaN
    assert qa.metric_arrays(con, "r", None, ["a"])[1]["a"][1].tolist() == [7 / 3, 5.0]
