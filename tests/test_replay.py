"""A resumed attempt logs again the steps its predecessor had logged since its last checkpoint: the newest
value of each (run, host, step, metric) wins in the charts, the rollups, the detectors and the report.

Real writer (a crash: `close()` without `finish()`, then a resume appending to the same log as attempt 1),
real ingest, real DuckDB files in tmp_path; a rebuild from the logs gives the same store.
"""

from __future__ import annotations

import math

import pytest
from conftest import recounted_copy
from test_rollups import snapshot

import observatory
from observatory.pipeline import ingest, rebuild
from observatory.queries import anomalies as qa
from observatory.queries import dashboard as qd
from observatory.queries import report as qr
from observatory.store import connect

CKPT, CRASH, END = 500, 535, 600  # attempt 0 saves at 500 and dies at 535; attempt 1 goes on to 600
SPIKE = 520  # attempt 0's loss spikes here (what killed it); attempt 1's step 520 is healthy


def loss(step: int, attempt: int) -> float:
    base = 3.0 - 0.001 * step + 0.01 * math.sin(step)
    if attempt == 0 and step == SPIKE:
        return 8.0
    return base + (0.05 if attempt == 1 and CKPT < step <= CRASH else 0.0)  # a replay is not bit-equal


def start(runs_dir, resume: bool):
    return observatory.init(
        run_id="resumed",
        runs_dir=runs_dir,
        heartbeat_s=0,
        install_signal_handlers=False,
        write_start=not resume,
    )


def log(run, steps, attempt):
    for s in steps:
        run.log({"train/loss": loss(s, attempt), "opt/lr": 1e-3 * (1 + attempt)}, step=s)
    run.flush()


def attempt0(runs_dir):
    run = start(runs_dir, resume=False)
    log(run, range(0, CRASH + 1), 0)
    run.close()  # killed: no run_end


def attempt1(runs_dir, upto=END):
    run = start(runs_dir, resume=True)
    assert run.attempt == 1
    log(run, range(CKPT + 1, upto + 1), 1)
    run.finish()


def newest(step: int) -> float:
    return loss(step, 1 if step > CKPT else 0)


def check_newest_only(db):
    with connect(db) as con:
        # the chart at full resolution: one row per step, attempt 1's value at a replayed step
        d = qd.downsample(con, "resumed", ["train/loss"], 0, END, 10_000)
        assert d["n"].to_list() == [1] * (END + 1)
        assert d["last"].to_list() == pytest.approx([newest(s) for s in range(END + 1)])
        assert d["mean"].to_list() == pytest.approx([newest(s) for s in range(END + 1)])
        # the rollups (8-, 64- and 512-step cells): the replayed rows counted once, the spike gone
        for points in (60, 8, 2):
            r = qd.downsample(con, "resumed", ["train/loss"], 0, END, points)
            assert r["n"].sum() == END + 1, points
            assert r["max"].max() < 4.0, points  # attempt 0's 8.0 at step 520 is not the newest
            assert float((r["mean"] * r["n"].cast(float)).sum()) == pytest.approx(
                sum(newest(s) for s in range(END + 1))
            )
        n, last_step, last_value = con.execute(
            "SELECT n, last_step, last_value FROM metric_series WHERE run = 'resumed' AND name = 'train/loss'"
        ).fetchall()[0]
        assert (n, last_step, last_value) == (END + 1, END, pytest.approx(newest(END)))
        latest = con.execute(
            "SELECT value FROM latest_metrics WHERE run = 'resumed' AND name = 'opt/lr'"
        ).fetchall()
        assert latest == [(pytest.approx(2e-3),)]
        # the detectors' series: attempt 1's values, not an average with attempt 0's
        steps, series = qa.metric_arrays(con, "resumed", None, ["train/loss"])
        s, v = series["train/loss"]
        assert list(s) == list(range(END + 1)) and list(v) == pytest.approx([newest(x) for x in s])
        assert qa.metric_series(con, "resumed", names=["train/loss"])["train/loss"][SPIKE] == pytest.approx(
            newest(SPIKE)
        )
        # the report
        rep = dict(qr.metric_series(con, "resumed", ["train/loss"])["train/loss"])
        assert rep[SPIKE] == pytest.approx(newest(SPIKE)) and len(rep) == END + 1
        # no spike finding at the replayed step: the detectors never saw attempt 0's 8.0 averaged in
        spikes = con.execute(
            "SELECT step FROM events WHERE run = 'resumed' AND kind = 'anomaly' "
            "AND data->>'detector' = 'loss_spike'"
        ).fetchall()
        return spikes


def test_a_resume_replays_steps_and_the_newest_values_win(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "store.duckdb"
    attempt0(runs_dir)
    attempt1(runs_dir)
    ingest(runs_dir, db, emit=None)  # both attempts in one batch: the replay is found among the new rows
    assert check_newest_only(db) == []
    assert snapshot(db) == snapshot(recounted_copy(db, tmp_path))
    again = tmp_path / "rebuilt.duckdb"
    rebuild(runs_dir, again, emit=None)
    assert snapshot(again) == snapshot(db)


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_a_replay_ingested_live_supersedes_what_the_store_had(tmp_path):
    """Ingested as it happens: attempt 0's rows are in the store (and rolled up) when attempt 1 replays them."""
    runs_dir, db = tmp_path / "runs", tmp_path / "store.duckdb"
    attempt0(runs_dir)
    ingest(runs_dir, db, emit=None)
    with connect(db) as con:  # attempt 0's spike was seen, live: a finding, kept as history
        assert con.execute(
            "SELECT count(*) FROM events WHERE kind = 'anomaly' AND data->>'detector' = 'loss_spike' AND step = ?",
            [SPIKE],
        ).fetchall()[0][0]
    run = start(runs_dir, resume=True)
    log(run, range(CKPT + 1, 520), 1)  # part of the replay: step 535 is still attempt 0's newest
    ingest(runs_dir, db, emit=None)
    with connect(db) as con:
        n, last_step, last_value = con.execute(
            "SELECT n, last_step, last_value FROM metric_series WHERE run = 'resumed' AND name = 'train/loss'"
        ).fetchall()[0]
        assert (n, last_step, last_value) == (CRASH + 1, CRASH, pytest.approx(loss(CRASH, 0)))
    assert snapshot(db) == snapshot(recounted_copy(db, tmp_path))
    log(run, range(520, END + 1), 1)
    run.finish()
    ingest(runs_dir, db, emit=None)
    check_newest_only(db)
    assert snapshot(db) == snapshot(recounted_copy(db, tmp_path))
    again = tmp_path / "rebuilt.duckdb"
    rebuild(runs_dir, again, emit=None)
    assert snapshot(again) == snapshot(db)
    with connect(db) as con, connect(again) as con2:
        q = "SELECT run, host, name, step, value, replaced FROM metrics ORDER BY ALL"
        assert con.execute(q).fetchall() == con2.execute(q).fetchall()


def test_a_store_from_before_the_marks_is_marked_at_its_next_ingest(tmp_path):
    """A store written before `metrics.replaced` and `runs.phase` existed: opening it for writing adds them,
    marks its replays, recounts its metric rollups and folds its runs' phases, as a rebuild would."""
    from observatory.store import ensure_schema, write_connection

    runs_dir, db = tmp_path / "runs", tmp_path / "store.duckdb"
    attempt0(runs_dir)
    attempt1(runs_dir)
    ingest(runs_dir, db, emit=None)
    q = "SELECT count(*) FILTER (WHERE replaced), sum(n) FROM metrics, (SELECT sum(n) AS n FROM metric_series)"
    phases = "SELECT run, phase, phase_t FROM runs ORDER BY run"
    with connect(db) as con:
        marked, fresh_phases = con.execute(q).fetchall(), con.execute(phases).fetchall()
    assert marked[0][0] == 2 * (CRASH - CKPT) and fresh_phases[0][1] == "shutdown"
    with write_connection(db) as con:  # as an older version left it: every row counted, no phases
        con.execute("ALTER TABLE metrics DROP COLUMN replaced")
        con.execute("ALTER TABLE runs DROP COLUMN phase")
        con.execute("UPDATE metric_series SET n = n + 1")
        ensure_schema(con)
    ingest(runs_dir, db, emit=None)
    with connect(db) as con:
        assert con.execute(q).fetchall() == marked
        assert con.execute(phases).fetchall() == fresh_phases
    check_newest_only(db)
