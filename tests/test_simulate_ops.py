"""`observatory simulate --fault`: each operator fault on a many-host job, judged by the default alert rules
through the real ingest (its hooks evaluate them), and goodput against the simulator's own ground truth."""

from __future__ import annotations

import json

import duckdb
import pytest
from click.testing import CliRunner

from observatory.cli import main
from observatory.interop.simulate_ops import FAULTS, simulate_ops
from observatory.pipeline import ingest


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
        found = {
            (r, d["detector"]): d["message"]
            for r, d in (
                (r, json.loads(d))
                for r, d in con.execute("SELECT run, data FROM events WHERE kind = 'anomaly'").fetchall()
            )
            if d["detector"].startswith("throughput")
        }
        goodput = {
            r[0]: r[1:]
            for r in con.execute(
                "SELECT run, goodput, productive_s, redone_s, down_s FROM goodput"
            ).fetchall()
        }
    yield alerts, goodput, truths, found
    mp.undo()


def test_each_fault_is_alerted_by_name_and_the_healthy_job_pages_nobody(store):
    alerts, _, _, found = store
    got = {(run, a["rule"], a.get("host")) for run, a in alerts}
    assert got == {
        ("ops-frozen", "frozen_host", 8),
        ("ops-hang", "stalled", None),
        ("ops-straggler", "straggler", 7),
        ("ops-hbm_creep", "memory_creep", 3),
        ("ops-mfu_drop", "mfu_drop", None),
    }
    # the live `mfu_drop` rule is the `throughput_loss` detector's definition: the same episode, same words
    (drop,) = [a for run, a in alerts if a["rule"] == "mfu_drop"]
    assert drop["severity"] == "info" and drop["finding"]["detector"] == "throughput_loss"
    assert drop["message"] in found[("ops-mfu_drop", "throughput_loss")]
    assert not {run for run, _ in found} - {"ops-mfu_drop"}  # no throughput loss on the other jobs
    hang = next(a for run, a in alerts if run == "ops-hang")
    assert "still in compile" in hang["message"] and "before its first step" in hang["message"]


def test_goodput_of_every_simulated_run_equals_the_ground_truth(store):
    _, goodput, truths, _ = store
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


def _log(runs, run, host):
    return [json.loads(x) for x in (runs / run / f"events.{host}.jsonl").read_text().splitlines()]


def test_each_hosts_heartbeats_say_its_own_step_time_and_the_faults_show_in_the_logs(tmp_path):
    import statistics

    run, truth = simulate_ops("straggler", tmp_path, hosts=8, steps=900, seed=2)
    own = {
        h: statistics.median(
            e["data"]["perf/step_time_s"]
            for e in _log(tmp_path, run, h)
            if e["kind"] == "heartbeat" and "perf/step_time_s" in e["data"]
        )
        for h in range(8)
    }
    assert truth["sim/host"] == 7 and own[7] == pytest.approx(1.5 * own[0], rel=0.05)
    assert all(v == pytest.approx(own[0], rel=0.05) for h, v in own.items() if h != 7)

    run, truth = simulate_ops("healthy", tmp_path, hosts=8, steps=2000, seed=2)
    evs = _log(tmp_path, run, 3)
    pauses = [e for e in evs if e["kind"] == "phase" and e["data"]["phase"] in ("eval", "checkpoint")]
    assert len(pauses) == 6 and all(e["data"]["budget_s"] for e in pauses)  # 4 evals, 2 checkpoints
    beats = [e["data"] for e in evs if e["kind"] == "heartbeat"]
    timed = [b["perf/step_time_s"] for b in beats if "perf/step_time_s" in b]
    assert not [b for b in beats if b["phase"] != "train" and "perf/step_time_s" in b]
    assert max(timed) < 3.0  # an eval's minutes are never a step's
    assert truth["sim/eval_s"] > 4 * 120 and truth["sim/checkpoint_s"] > 2 * 60

    run, truth = simulate_ops("preempt", tmp_path, hosts=8, steps=1000, seed=2)
    evs = _log(tmp_path, run, 0)
    attempts = [(e["data"]["phase"], e["data"]["attempt"]) for e in evs if e["kind"] == "phase"]
    assert ("init", 1) in attempts and attempts[-1] == ("train", 1)
    steps = [e["step"] for e in evs if e["kind"] == "metrics"]
    assert steps == list(range(1, 601)) + list(range(501, 1001))  # attempt 1 trains 501..600 again
    assert truth["sim/redone_s"] == pytest.approx(2.0 * 99, rel=0.2)  # step 501 is the compile's

    run, _ = simulate_ops("hang", tmp_path, hosts=8, steps=1000, seed=2)
    evs = _log(tmp_path, run, 5)
    assert not [e for e in evs if e["kind"] == "metrics"]
    assert [e["data"]["phase"] for e in evs if e["kind"] == "phase"] == ["init", "compile"]
    assert {e["data"]["phase"] for e in evs if e["kind"] == "heartbeat"} == {"init", "compile"}

    run, truth = simulate_ops("frozen", tmp_path, hosts=8, steps=1000, seed=2)
    last = {h: max(e["t"] for e in _log(tmp_path, run, h)) for h in range(8)}
    frozen = truth["sim/host"]
    assert all(last[frozen] < last[h] - 1100 for h in range(8) if h != frozen)
