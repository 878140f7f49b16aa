"""`observatory simulate --fault`: each operator fault on a many-host job, judged by the default alert rules
through the real ingest (its hooks evaluate them), and goodput against the simulator's own ground truth."""

from __future__ import annotations

import json

import duckdb
import pytest
from click.testing import CliRunner

from observatory.cli import main
from observatory.ingest import ingest
from observatory.interop.simulate_ops import FAULTS, simulate_ops


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ops")
    runs, db = tmp / "runs", tmp / "s.duckdb"
    mp = pytest.MonkeyPatch()
    mp.setenv("OBSERVATORY_ALERTS_FILE", str(tmp / "none.yaml"))
    truths = {
        run: truth for run, truth in (simulate_ops(f, runs, hosts=12, steps=3000, seed=1) for f in FAULTS)
    }
    ingest(runs, db, emit=None)
    with duckdb.connect(str(db), read_only=True) as con:
        alerts = [
            (r, json.loads(d))
            for r, d in con.execute("SELECT run, data FROM events WHERE kind = 'alert'").fetchall()
        ]
        goodput = {
            r[0]: r[1:]
            for r in con.execute(
                "SELECT run, goodput, productive_s, redone_s, down_s FROM goodput"
            ).fetchall()
        }
    yield alerts, goodput, truths
    mp.undo()


def test_each_fault_is_alerted_by_name_and_the_healthy_job_pages_nobody(store):
    alerts, _, _ = store
    got = {(run, a["rule"], a.get("host")) for run, a in alerts}
    assert got == {
        ("ops-frozen", "frozen_host", 8),
        ("ops-hang", "stalled", None),
        ("ops-straggler", "straggler", 7),
        ("ops-hbm_creep", "memory_creep", 3),
        ("ops-mfu_drop", "mfu_drop", None),
    }
    hang = next(a for run, a in alerts if run == "ops-hang")
    assert "still in compile" in hang["message"] and "before its first step" in hang["message"]


def test_goodput_of_every_simulated_run_equals_the_ground_truth(store):
    _, goodput, truths = store
    for run, truth in truths.items():
        g, productive, redone, down = goodput[run]
        assert g == pytest.approx(truth["sim/goodput"], abs=0.01 * truth["sim/goodput"] + 1e-9), (
            run
        )  # within 1%
        assert (productive, redone, down) == pytest.approx(
            (truth["sim/productive_s"], truth["sim/redone_s"], truth["sim/down_s"]), abs=0.01
        )
    assert truths["ops-preempt"]["sim/redone_s"] > 500 and truths["ops-preempt"]["sim/down_s"] == 600


def test_the_cli_plays_a_fault(tmp_path):
    r = CliRunner().invoke(
        main,
        [
            "simulate",
            "--preset",
            "535b",
            "--fault",
            "preempt",
            "--hosts",
            "200",
            "--steps",
            "400",
            "--runs-dir",
            str(tmp_path),
        ],
    )
    assert r.exit_code == 0, r.output
    assert "ops-preempt" in r.output and "200 hosts, fault preempt" in r.output
    assert len(list((tmp_path / "ops-preempt").glob("events.*.jsonl"))) == 200
