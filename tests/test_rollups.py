"""Rollups kept by ingest agree with a rebuild from scratch, and the fast queries agree with plain scans.

Real writer, real ingest (which calls `rollups.after_ingest` in its transaction),
real DuckDB files in tmp_path.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import recounted_copy
from dashboard_fixtures import expert_loads, make_store, metrics_at

import observatory
from observatory.pipeline import ingest
from observatory.queries import dashboard as qd
from observatory.queries import experts as qe
from observatory.store import connect, schema

TABLES = (*schema.EXPERT_TABLES, *schema.METRIC_TABLES)


def _r(v):
    """Floats to 12 digits: an incremental rollup adds a cell's sum in two parts, a recount in one."""
    return float(f"{v:.12g}") if isinstance(v, float) and math.isfinite(v) else v


def snapshot(db) -> dict[str, list]:
    with connect(db) as con:
        return {
            t: sorted(repr(tuple(map(_r, row))) for row in con.execute(f"SELECT * FROM {t}").fetchall())
            for t in TABLES
        }


def rebuilt(db, tmp_path) -> dict[str, list]:
    copy = recounted_copy(db, tmp_path)
    out = snapshot(copy)
    copy.unlink()
    return out


def log_steps(run, steps, layers=2):
    for s in steps:
        run.log(metrics_at(s), step=s)
        for layer in range(layers):
            r, d = expert_loads(s, layer)
            run.log_expert_load(s, layer, r, d)
    run.flush()


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_incremental_rollups_equal_a_rebuild(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "store.duckdb"
    a = observatory.init(run_id="run-a", runs_dir=runs_dir, install_signal_handlers=False)
    b = observatory.init(run_id="run-b", runs_dir=runs_dir, install_signal_handlers=False)
    # chunks that straddle bucket edges (16, 64, 128 ...), a second run interleaved,
    # then a rollback: run-a logs steps 30..59 again after reaching 70
    for run, steps in [
        (a, range(0, 21)),
        (b, range(0, 5)),
        (a, range(21, 70)),
        (b, range(5, 140)),
        (a, range(30, 60)),
        (a, range(70, 75)),
    ]:
        log_steps(run, steps)
        ingest(runs_dir, db, emit=None)
        assert snapshot(db) == rebuilt(db, tmp_path), f"after {run.id} {steps}"
    a.finish()
    b.finish()
    ingest(runs_dir, db, emit=None)
    snap = snapshot(db)
    assert snap == rebuilt(db, tmp_path)
    assert snap["expert_layer_step"] and snap["metrics_r8"] and snap["expert_load_r128"]
    with connect(db) as con:
        # the replayed steps count twice, exactly as in the raw table
        n = con.execute(
            "SELECT sum(steps) FROM expert_load_r16 WHERE run = 'run-a' AND layer = 0 AND expert = 0"
        )
        assert n.fetchall()[0][0] == 75 + 30


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("rollups"))[1]


def test_downsampling_keeps_the_spike_and_the_nan(store):
    with connect(store) as con:
        for points in (1000, 50, 7):  # raw rows, then the 8-step rollup, then the 64-step one
            d = qd.downsample(con, "base-run", ["train/loss"], 0, 119, points)
            assert d.height <= points
            assert d["max"].max() == pytest.approx(2.0 + 6.0 * 87**-0.5 + 5.0)  # the step-77 spike
            assert d["n"].sum() == 120 and d["n_nonfinite"].sum() == 1  # the NaN at step 90
            assert d["step"].max() == 119 and d.sort("step")["last"][-1] == pytest.approx(
                2.0 + 6.0 * 129**-0.5
            )
        full = qd.downsample(con, "base-run", ["train/loss"], 70, 80, 1000)
        assert full["step"].to_list() == list(range(70, 81))  # a short window is every step


def test_heatmap_and_layer_series_match_plain_scans(store):
    with connect(store) as con:
        for buckets in (200, 8, 2):  # raw, 16-step and 128-step sources
            fast = qe.heatmap(con, "base-run", 1, 0, 127, buckets)
            plain = qe.heatmap(con, "base-run", 1, 0, 127, buckets, plain=True)
            assert np.nansum(fast["routed"], axis=1) == pytest.approx(np.nansum(plain["routed"], axis=1))
            assert np.nansum(fast["dropped"]) == np.nansum(plain["dropped"]) > 0
            assert fast["share"].shape[1] <= buckets
        per_step = qe.plain_drop_per_step(con, "base-run")
        for buckets in (500, 2):  # per-step rows, then the 64-step rollup
            ls = qe.layer_series(con, "base-run", 0, 119, buckets)
            assert set(ls["layer"].to_list()) == {0, 1}
            assert ls.filter(ls["layer"] == 0)["drop_fraction"].max() == 0
            assert ls.filter(ls["layer"] == 1)["hot_max"].max() > 2  # expert 3 takes ~3x its share
        rd = qe.run_drop_series(con, "base-run", 0, 119, 1000)
        assert rd["last"].to_numpy() == pytest.approx(per_step["drop_fraction"].to_numpy())


def test_a_collapsed_router_at_the_reference_batch_does_not_overflow(tmp_path):
    """One expert taking all 4096 x 4096 x 8 assignments of a step, with 384 experts: no integer overflow."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    n = 384
    routed = [0] * n
    routed[7] = 4096 * 4096 * 8
    with observatory.init(run_id="collapsed", runs_dir=runs) as run:
        for s in range(3):
            run.log({"train/loss": 2.0}, step=s)
            run.log_expert_load(s, 0, routed, [0] * n)
    said = []
    ingest(runs, db, emit=said.append)
    assert not [m for m in said if "rollups" in m], said
    with connect(db) as con:
        peak = con.execute(f"SELECT max(hot_max) FROM expert_layer_r{schema.LAYER_RESOLUTION}").fetchone()[0]
    assert peak == pytest.approx(n)
