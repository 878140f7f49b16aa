"""Hooks cost what is new: a run ingested in 50 pieces ends with what one full recomputation gives.

Real simulator logs (`observatory.interop.simulate`, the tiny preset: the 535b story at
4 layers x 16 experts, with a spike, a NaN and its rollback that re-logs steps, a hot
expert, a fork), real ingest with every hook, real DuckDB files in tmp_path.
"""

from __future__ import annotations

import shutil

import numpy as np
import polars as pl
import pytest
from conftest import append_in_pieces, recounted_copy

import observatory
from observatory.detect import scan as A
from observatory.detect.expert_scan import expert_findings
from observatory.detect.thresholds import Thresholds
from observatory.interop.simulate import simulate
from observatory.pipeline import ingest
from observatory.queries import anomalies as qa
from observatory.store import connect, schema

TABLES = (*schema.EXPERT_TABLES, *schema.METRIC_TABLES)
TH = Thresholds()


def _r(v):
    return float(f"{v:.12g}") if isinstance(v, float) else v  # float sums depend on the order rows arrive in


def snapshot(db) -> dict[str, list]:
    with connect(db) as con:
        return {
            t: sorted(repr(tuple(map(_r, row))) for row in con.execute(f"SELECT * FROM {t}").fetchall())
            for t in TABLES
        }


def anomalies(db) -> list[tuple]:
    with connect(db) as con:
        return sorted(
            (a["run"], a["detector"], a["metric"], a["window"][0], a["step"]) for a in qa.anomaly_events(con)
        )


@pytest.fixture
def no_stall(monkeypatch):
    # the simulated clock is in the past: a stall check would fire at whatever step each piece ends
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "1e12")


@pytest.mark.slow
def test_fifty_pieces_give_the_anomalies_and_rollups_of_one_full_recomputation(tmp_path, no_stall):
    src = tmp_path / "src"
    simulate("tiny", src, steps=400, expert_load_every=1)
    # the whole logs at once, fresh store: the full recomputation
    full_runs, full_db = tmp_path / "full", tmp_path / "full.duckdb"
    shutil.copytree(src, full_runs)
    ingest(full_runs, full_db, emit=None)
    ingest(full_runs, full_db, emit=None)  # stores what the last pass's hooks wrote
    want = anomalies(full_db)
    assert {a[1] for a in want} >= {"grad_spike", "loss_spike", "nonfinite", "hot_expert"}
    # the same bytes in 50 pieces, cut at line ends, every hook on each ingest
    runs, db = tmp_path / "runs", tmp_path / "pieces.duckdb"
    for _ in append_in_pieces(src, runs, 50):
        ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    assert anomalies(db) == want
    # a full scan of the pieced store finds nothing the incremental scans did not
    assert A.detect(db, runs, full=True, write=False) == []
    # rollups kept batch by batch equal the one-pass rollups, and a rebuild from scratch
    assert snapshot(db) == snapshot(full_db)
    assert snapshot(recounted_copy(db, tmp_path)) == snapshot(db)
    # the state each run's scans stopped at is in the store
    with connect(db) as con:
        st = qa.detector_state(con, "sim-tiny")
        assert set(st) == {"series", "experts", "trends"} and st["series"] >= 390


def test_expert_scan_equals_the_pivot_of_per_expert_sums(tmp_path):
    """The per (step, layer) shortcut and its dense fix-up give what `detect_frame` gives on the pivot."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    rng = np.random.default_rng(3)
    r = observatory.init(run_id="x", runs_dir=runs, install_signal_handlers=False)
    e = 12
    for s in list(range(0, 120)) + list(range(60, 90)):  # steps 60..89 logged twice (a rollback)
        for layer in range(3):
            routed = rng.integers(900, 1100, size=e)
            if layer == 1 and 30 <= s < 100:
                routed[4] = 30_000  # hot
            if layer == 2 and s >= 40:
                routed[7] = 0  # dead
            n = e - 1 if (layer == 0 and s == 50) else e  # one short list: expert 11 missing = 0
            r.log_expert_load(s, layer, routed[:n].tolist(), [0] * n)
        r.log({"train/loss": 2.0}, step=s)
    r.finish()
    ingest(runs, db, hooks=False, emit=None)
    with connect(db) as con:
        stats = qa.expert_layer_stats(con, "x")
        assert all(v.dtype == np.int64 for v in stats.values())  # no Decimal, no object arrays
        load = qa.expert_load_series(con, "x")
        assert load.schema["routed"] == pl.Int64 and load.schema["dropped"] == pl.Int64
        assert qa.metric_series(con, "x", None, ["train/loss"]).schema["train/loss"] == pl.Float64
        ref = A.detect_frame(pl.DataFrame({"step": pl.Series([], dtype=pl.Int64)}), load, TH)
        for since in (None, 35):
            got, drop, last = expert_findings(con, "x", since, TH)
            assert drop[1].dtype == np.float64 and last == 119
            want = ref if since is None else [f for f in ref if f.window[0] > since]
            assert sorted((f.key, f.step, f.extra.get("expert")) for f in got) == sorted(
                (f.key, f.step, f.extra.get("expert")) for f in want
            )
    assert {f.detector for f in ref} == {"hot_expert", "dead_expert"}


@pytest.mark.subprocess
def test_analyses_read_beside_readers_and_their_state_lands_in_the_store(tmp_path, no_stall, monkeypatch):
    """The detectors run on a read-only connection: another process opens the store while they run (the
    write lock is the batch's alone). Their state, kept by the ingester (no module global), is written by
    its next batch, or when it closes (the end of an `ingest` call)."""
    import subprocess
    import sys

    from observatory.ingest import IngestReport
    from observatory.pipeline import Ingester

    src, runs, db = tmp_path / "src", tmp_path / "runs", tmp_path / "obs.duckdb"
    simulate("tiny", src, steps=120, expert_load_every=1)
    log = next(src.glob("sim-tiny/events.0.jsonl"))
    lines = log.read_bytes().splitlines(keepends=True)
    (runs / "sim-tiny").mkdir(parents=True)
    dst = runs / "sim-tiny" / "events.0.jsonl"
    dst.write_bytes(b"".join(lines[: len(lines) // 2]))
    opened: list[str] = []
    real = A.after_ingest

    def hook(con, runs_dir, wanted, **kw):
        probe = (
            f"from observatory import store\nwith store.connect(r'{db}', timeout_s=0.5) as c:\n"
            "    print(c.execute('SELECT count(*) FROM runs').fetchall()[0][0])"
        )
        p = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
        opened.append(p.stdout.strip() if p.returncode == 0 else f"failed: {p.stderr[-300:]}")
        real(con, runs_dir, wanted, **kw)
        return set()  # as if it found nothing: no findings round, whose batch would save the state at once

    monkeypatch.setattr(A, "after_ingest", hook)
    # the detectors alone after the commit: the other analyses' findings would start a findings round
    ing = Ingester(runs, db, emit=lambda m: None, analyses=("anomalies",))
    progress, key = ing.analyses.progress, (str(runs.resolve()), "sim-tiny")
    ing.one_pass(IngestReport())
    assert opened and all(x.isdigit() for x in opened), opened  # a reader got in during the analyses
    reached = dict(progress.state[key])
    assert A.unsaved_state(db, progress)
    with connect(db) as con:
        assert qa.detector_state(con, "sim-tiny") != reached  # not written yet: the analyses could not
    with open(dst, "ab") as f:
        f.write(b"".join(lines[len(lines) // 2 :]))
    ing.one_pass(IngestReport())  # its batch writes what the last analyses reached
    with connect(db) as con:
        saved = qa.detector_state(con, "sim-tiny")
    assert saved == reached and saved["series"] < progress.state[key]["series"]
    monkeypatch.undo()
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "1e12")
    ing.close()  # what the end of an ingest call does
    assert not A.unsaved_state(db, progress)
    with connect(db) as con:
        assert qa.detector_state(con, "sim-tiny") == progress.state[key]


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_a_rebuild_from_logs_with_findings_reads_each_batch_not_the_run_so_far(
    tmp_path, no_stall, monkeypatch
):
    """A long run's folder holds a finding scanned through its end (an earlier store's). Ingested again into
    a new store in batches (`observatory rebuild`), each batch's scan starts a lookback before the run's last
    stored step: it found no cut near the finding's step, far past what the new store held, and read the
    whole run at every batch (quadratic in the run's length). The anomalies are those of the first store."""
    import json
    import random

    from observatory.ingest import passes

    src = tmp_path / "runs"
    (src / "long").mkdir(parents=True)
    rng, steps = random.Random(3), 60_000
    with open(src / "long" / "events.0.jsonl", "w") as f:
        for step in range(steps):
            loss = 3.0 + rng.gauss(0, 0.01) + (5.0 if step == steps - 300 else 0.0)  # a spike near the end
            ev = {"v": 1, "run": "long", "kind": "metrics", "step": step, "t": 1.7e9 + step, "host": 0}
            f.write(json.dumps(ev | {"seq": step, "data": {"train/loss": loss, "lr": 1e-3}}) + "\n")
    first = tmp_path / "first.duckdb"
    ingest(src, first, emit=None)
    ingest(src, first, emit=None)  # stores what the last pass's hooks wrote
    want = anomalies(first)
    assert any(a[1] == "loss_spike" and a[4] >= steps - 300 for a in want), want
    monkeypatch.setattr(passes, "BATCH_BYTES", 1 << 20)  # batches of ~13k steps
    monkeypatch.setenv("OBSERVATORY_MAX_LINE_BYTES", "100000")  # (a read is at least a longest line)
    reads: list[tuple] = []  # (the scan's cut, the run's last stored step), each batch
    real = A.metric_arrays_many

    def spy(con, since, fresh, *a, **kw):
        reads.append((since[0], qa.stored_last_steps(con, ["long"])["long"]))
        return real(con, since, fresh, *a, **kw)

    monkeypatch.setattr(A, "metric_arrays_many", spy)
    again = tmp_path / "again.duckdb"
    ingest(src, again, emit=None)
    assert len(reads) >= 4
    assert all(since is not None and last - 2 * TH.lookback <= since < last for since, last in reads), reads
    assert anomalies(again) == want
