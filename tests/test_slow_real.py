"""Slow failures on real tiny-trainer runs (issue 56): the faults the trainer can inject, found by the
detectors through the real ingest. The others (MoE drift, lost throughput) the trainer cannot make on
demand: tests/test_slow_failures.py plays them on simulated runs."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from observatory.pipeline import ingest
from observatory.queries.anomalies import anomaly_events
from trainer.config import load_config
from trainer.faults import InjectedCrash
from trainer.train import train

pytestmark = pytest.mark.slow

TINY = Path(__file__).resolve().parents[1] / "trainer" / "configs" / "tiny.yaml"
QUIET = ["telemetry.progress=false", "telemetry.peak_flops=1e10"]


def cfg(*overrides):
    return load_config(TINY, [*QUIET, *overrides])


def findings(runs: Path, db: Path, run: str) -> list[dict]:
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    con = duckdb.connect(str(db), read_only=True)
    try:
        return [d for d in anomaly_events(con, run) if d["severity"] != "info"]
    finally:
        con.close()


def test_a_resumed_run_that_crashes_at_the_same_step_is_one_crash_loop(tmp_path):
    base = ("steps=80", "checkpoint.every=50", "eval.every=0", "inject=crash@60")
    with pytest.raises(InjectedCrash):
        train(cfg(*base), tmp_path, run_id="looping")
    with pytest.raises(InjectedCrash):  # a resume is a new process: the same crash again
        train(cfg(*base), tmp_path, resume="looping")
    found = findings(tmp_path, tmp_path / "store.duckdb", "looping")
    loops = [d for d in found if d["detector"] == "crash_loop"]
    assert len(loops) == 1 and loops[0]["severity"] == "critical" and loops[0]["attempts"] == 2
    assert loops[0]["message"] == "crash loop: 2 attempts failed at step 59 with InjectedCrash"


def test_a_slow_lr_drift_is_found_as_a_rising_loss_after_it_starts(tmp_path, monkeypatch):
    """1,000 tiny steps; from step 400 the LR drifts up to 100x its schedule: the loss stops falling and
    climbs ~0.3 nats within ~200 steps. The shortest trend window scaled to the run: 200 steps (a run must
    span 4 of them to be read)."""
    monkeypatch.setenv("OBSERVATORY_ANOMALY_TREND_STEPS", "200")
    c = cfg("steps=1000", "eval.every=100", "checkpoint.every=100000", "inject=lr_drift@400:x100")
    train(c, tmp_path, run_id="drifting")
    found = findings(tmp_path, tmp_path / "store.duckdb", "drifting")
    trends = [d for d in found if d["detector"] == "loss_trend"]
    assert {d["metric"] for d in trends} == {"train/loss", "eval/loss"}, [
        (d["detector"], d["step"]) for d in found
    ]
    assert all(d["step"] > 400 and d["since_step"] >= 384 for d in trends), trends
    assert not [d for d in found if d.get("trend") and d["step"] <= 400]
