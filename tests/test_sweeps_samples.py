"""The committed iso-FLOP samples (data/samples/sweep-isoflop*): they are what the simulator writes, they seed
and ingest with the rest, and the fit finds the stated ground truth in them."""

from __future__ import annotations

import pytest

from observatory import demo
from observatory.interop.simulate_isoflop import SAMPLE_GRIDS, TRUTH, optimum, pack_samples
from observatory.ladder.sweep import compare_view, isoflop_view
from observatory.queries.sweeps import count_selected
from observatory.store import connect


def test_the_committed_grid_is_what_the_simulator_writes(tmp_path):
    runs = pack_samples(tmp_path)
    assert len(runs) == 20 * len(SAMPLE_GRIDS)
    for run in runs:
        fresh = (tmp_path / run / "events.0.jsonl.gz").read_bytes()
        committed = demo.SAMPLES / run / "events.0.jsonl.gz"
        assert committed.exists(), (
            f"{committed} is missing: python -m observatory.interop.simulate_isoflop data/samples"
        )
        assert committed.read_bytes() == fresh, f"{committed} differs from what the simulator writes now"


def test_the_demo_store_fits_the_samples_grid(tmp_path):
    from observatory.pipeline import ingest

    runs_dir, db = tmp_path / "runs", tmp_path / "s.duckdb"
    demo.seed_samples(runs_dir)
    ingest(runs_dir, db, emit=None)
    with connect(db) as con:
        assert count_selected(con, "ladder = sweep-isoflop") == 20
        view = isoflop_view(con, "ladder = sweep-isoflop", "eval:eval", 1e19)
        cmp = compare_view(con, "ladder = sweep-isoflop", "ladder = sweep-isoflop-var", "eval:eval")
    fit = view["fit"]
    a, b = TRUTH["alpha"], TRUTH["beta"]
    assert [f["status"] for f in fit["budgets"]] == ["ok"] * 4
    assert fit["frontier"]["a_n_lo"] < b / (a + b) < fit["frontier"]["a_n_hi"]
    rec = fit["recommendation"]
    assert rec["params_lo"] < optimum(1e19)[0] < rec["params_hi"]
    assert cmp["multiplier"]["value"] == pytest.approx(1 / 1.4, rel=0.03)
    assert demo.SWEEPS_QUERY.startswith("sel=ladder+%3D+sweep-isoflop&")
