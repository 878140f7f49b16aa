"""The detectors on real runs of our trainer: induced faults are caught, a clean run raises nothing.

Two tiny runs are trained once for the module (real JAX on CPU): a clean one and
one with three faults in turn (a bad batch, a NaN loss skipped, an LR spike). They
are ingested into a tmp DuckDB by the real ingester, whose hook runs the
detectors; a second ingest stores the findings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
STEPS = 60
BAD_BATCH, NAN, LR_SPIKE = 25, 38, 48


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    pytest.importorskip("jax")
    from observatory.pipeline import ingest
    from trainer.config import load_config
    from trainer.train import train

    tmp = tmp_path_factory.mktemp("anomalies-real")
    runs, db = tmp / "runs", tmp / "obs.duckdb"
    tiny = str(ROOT / "trainer" / "configs" / "tiny.yaml")
    cases = {
        "clean": [],
        "faults": [
            f"inject=bad_batch@{BAD_BATCH}",
            f"inject=nan@{NAN}",
            f"inject=lr_spike@{LR_SPIKE}:x30",
            "failure.on_nan=skip_batch",
        ],
    }
    for run, ov in cases.items():
        base = [
            f"steps={STEPS}",
            "telemetry.progress=false",
            "checkpoint.every=0",
            "checkpoint.at_exit=false",
            "eval.every=0",
        ]
        cfg = load_config(tiny, [*base, *ov])
        train(cfg, runs, run_id=run)
    ingest(runs, db, emit=None)  # the hook writes findings as host-1000 events
    ingest(runs, db, emit=None)  # ... which this pass stores
    return runs, db


def findings(db, run):
    from observatory.queries.anomalies import anomaly_events
    from observatory.store import connect

    with connect(db) as con:
        return [a for a in anomaly_events(con, run) if a["host"] == 1000]


def near(fs, step, after=40):
    return [f for f in fs if f["window"][1] >= step and f["window"][0] <= step + after]


def test_clean_run_raises_nothing(suite):
    _, db = suite
    assert findings(db, "clean") == []


def test_each_fault_is_caught_and_nothing_before(suite):
    _, db = suite
    fs = findings(db, "faults")
    assert not [f for f in fs if f["window"][1] < BAD_BATCH], fs
    assert {f["detector"] for f in near(fs, BAD_BATCH, after=3)} & {"loss_dip", "drop_jump", "grad_spike"}, fs
    nf = [f for f in fs if f["detector"] == "nonfinite"]
    assert [f["window"][0] for f in nf] == [NAN] and nf[0]["severity"] == "critical"
    assert nf[0]["metric"] == "train/loss"
    spike = [
        f
        for f in near(fs, LR_SPIKE, after=5)
        if f["detector"] in ("loss_spike", "grad_spike", "update_spike")
    ]
    assert spike, fs
    # the x30 update is logged at the step that applies it: warned before the loss reacts
    assert min(f["step"] for f in spike) == LR_SPIKE


def test_rerunning_detect_adds_nothing(suite):
    from observatory.detect import scan as A

    runs, db = suite
    assert A.detect(db, runs, full=True) == []
