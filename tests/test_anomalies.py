"""Instability detectors: synthetic series through the detector functions, then the
whole path (event logs -> real ingest into a tmp DuckDB -> after_ingest -> anomaly
events -> ingest again) with dedupe and incremental scans."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import polars as pl
import pytest

from observatory import findings, settings
from observatory.detect import detectors as D
from observatory.detect import scan as A
from observatory.detect.thresholds import PREFIX, Thresholds

TH = Thresholds()
BLOOM_GRAD = [0.24, 0.95, 2.39, 15.9, 145.0, 960.0]  # BLOOM 176B, five iterations


def clean(n=3000, seed=0, noise=0.02):
    """A clean run: loss decaying to a plateau with minibatch noise, stable grad norm, steady throughput."""
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    loss = 2.5 + 6.0 * np.exp(-steps / 150) + noise * (1 + steps / n) * rng.standard_normal(n)
    grad = (0.25 + 1.5 * np.exp(-steps / 40)) * np.exp(0.15 * rng.standard_normal(n))
    tps = 5e4 * (1 + 0.03 * rng.standard_normal(n))
    tps[0] = 500.0  # compile step
    tps[::200] *= 0.6  # checkpoint steps: one slow step each
    drop = np.clip(0.07 + 0.01 * rng.standard_normal(n), 0, 1)
    return steps, loss, grad, tps, drop


def bloom(n=800, at=500, seed=1):
    """BLOOM-like: grad norm explodes over 5 steps, loss follows ~3 steps later, recovers in ~30."""
    steps, loss, grad, _, _ = clean(n, seed)
    grad[at : at + 6] = BLOOM_GRAD
    base = loss[at]
    bump = np.array([0.05, 0.3, 1.0, 2.9, 2.4, 1.8, 1.2, 0.8, 0.5, 0.3, 0.2, 0.1])
    loss[at + 3 : at + 3 + bump.size] = base + bump
    loss[at + 3 + bump.size : at + 40] = base
    return steps, loss, grad


def all_series_findings(steps, loss, grad, tps, drop, th=TH):
    spikes = D.loss_spikes(steps, loss, th)
    return (
        spikes
        + D.grad_spikes(steps, grad, th)
        + D.grad_growth(steps, grad, th)
        + D.incomplete_recovery(steps, loss, spikes, th)
        + D.throughput_drops(steps, tps, th)
        + D.drop_jumps(steps, drop, th)
        + D.nonfinite(steps, {"train/loss": loss, "grad/norm/total": grad})
    )


@pytest.mark.parametrize("seed", range(5))
def test_clean_series_raise_nothing(seed):
    assert all_series_findings(*clean(seed=seed)) == []
    steps, loss, grad, tps, _ = clean(seed=seed)
    assert D.loss_dips(steps, loss, TH) == [] and D.update_spikes(steps, 0.5 + 0 * grad, TH) == []


def test_bloom_grad_norm_warns_before_the_loss_peak():
    steps, loss, grad = bloom()
    gs = D.grad_spikes(steps, grad, TH)
    ls = D.loss_spikes(steps, loss, TH)
    assert len(gs) == 1 and len(ls) == 1
    peak = ls[0].extra["peak_step"]
    assert peak == 506
    # 0.95 (~3.5x the recent level) is within what noisy runs do; 2.39 (~8.5x) opens the
    # episode and 15.9 right after confirms it, three steps before the loss peaks
    assert gs[0].window[0] == 502 and gs[0].step == 503
    assert peak - gs[0].step >= 3  # BLOOM's ~3-step lead at least
    assert gs[0].severity == "critical" and ls[0].severity == "critical"
    assert gs[0].window[1] == 505 and gs[0].value == 960.0
    # recovered within the recovery window: no incomplete-recovery finding
    assert D.incomplete_recovery(steps, loss, ls, TH) == []


def test_one_moderate_grad_norm_step_is_noise_one_huge_step_is_not():
    steps, _, grad, _, _ = clean(600, seed=7)
    grad[300] *= 8  # a clean tiny run does this now and then
    grad[200:202] *= 4  # ... and this
    assert D.grad_spikes(steps, grad, TH) == []
    grad[400] *= 30  # a bad batch
    (f,) = D.grad_spikes(steps, grad, TH)
    assert f.window == (400, 400) and f.step == 400 and f.severity == "critical"


def test_update_norm_spike_is_the_step_before_the_loss():
    """As in our trainer's inject=lr_spike: the x30 update is logged at the step that applies it."""
    rng = np.random.default_rng(8)
    steps = np.arange(300)
    update = 0.5 * np.exp(0.03 * rng.standard_normal(300))  # Adam updates: smooth
    update[200] = 15.2
    (f,) = D.update_spikes(steps, update, TH)
    assert (f.detector, f.metric, f.step, f.severity) == ("update_spike", D.UPDATE, 200, "critical")
    assert f.message.startswith("update norm spiked to 15.2 at step 200")


def test_loss_dip_is_a_batch_unlike_the_others():
    """Our trainer's inject=bad_batch (one repeated byte): the loss collapses for one step."""
    steps, loss, *_ = clean(400, seed=12)
    loss[250] = 0.17
    (f,) = D.loss_dips(steps, loss, TH)
    assert (f.detector, f.window, f.step) == ("loss_dip", (250, 250), 250)
    assert D.loss_spikes(steps, loss, TH) == []  # the step after is back at the level: no spike
    steps, loss, *_ = clean(400, seed=13)
    assert D.loss_dips(steps, loss, TH) == []  # the fast fall of early training is not a dip


def test_loss_spike_without_recovery_is_reported_once_due():
    steps, loss, _, _, _ = clean(800, seed=2)
    loss[400:] += 0.8  # jumps and stays up
    ls = D.loss_spikes(steps, loss, TH)
    assert ls and ls[0].window[0] == 400
    rec = D.incomplete_recovery(steps, loss, ls, TH)
    assert [(r.detector, r.window[0]) for r in rec] == [("incomplete_recovery", 400)]
    assert rec[0].step >= ls[0].extra["peak_step"] + TH.recovery_steps
    # not yet due: the check step has not been logged
    cut = ls[0].extra["peak_step"] + TH.recovery_steps - 1
    assert D.incomplete_recovery(steps[:cut], loss[:cut], ls, TH) == []


def test_a_divergence_is_one_spike_and_one_recovery_finding():
    steps, loss, _, _, _ = clean(900, seed=14)
    loss[400:] += 0.02 * (steps[400:] - 400)  # climbs for 500 steps: the level keeps catching up
    ls = D.loss_spikes(steps, loss, TH)
    assert len(ls) == 1 and ls[0].window[1] > ls[0].window[0] + 20 and "not recovered" in ls[0].message
    rec = D.incomplete_recovery(steps, loss, ls, TH)
    assert len(rec) == 1 and rec[0].step == ls[0].extra["peak_step"] + TH.recovery_steps


def test_sustained_grad_growth_is_not_a_spike():
    steps, _, grad, _, _ = clean(1200, seed=3)
    ramp = np.clip((steps - 600) / 300, 0, 1)  # grad norm grows ~0.25 -> past 3 over 300 steps
    grad = grad * (1 + 11 * ramp)
    assert D.grad_spikes(steps, grad, TH) == []
    gg = D.grad_growth(steps, grad, TH)
    assert len(gg) == 1
    assert 600 < gg[0].step < 800 and gg[0].extra["ratio"] > TH.grad_growth


def test_drop_fraction_jump_and_throughput_drop():
    steps, _, _, tps, drop = clean(600, seed=4)
    drop[300] = 0.45  # one bad batch routes almost everything to a few experts
    dj = D.drop_jumps(steps, drop, TH)
    assert [(f.detector, f.window[0]) for f in dj] == [("drop_jump", 300)]
    tps[400:420] *= 0.3  # a slow node for 20 steps: info (shorter than throughput_sustain), said once over
    td = D.throughput_drops(steps, tps, TH)
    assert [(f.window[0], f.window[1], f.step, f.severity) for f in td] == [(400, 419, 422, "info")]


def test_hot_and_dead_experts():
    rng = np.random.default_rng(5)
    t, e = 100, 8
    steps = np.arange(t) * 10  # expert load logged every 10 steps
    routed = rng.integers(900, 1100, size=(t, e))
    routed[40:70, 3] = 20_000  # expert 3 takes most tokens for 30 logged steps
    routed[50:, 6] = 0  # expert 6 dies at step 500
    routed[10:15, 1] = 0  # a short lull: not dead
    hot = D.hot_experts(steps, 0, routed, TH)
    assert [(f.metric, f.window, f.extra["expert"]) for f in hot] == [("expert_load/layer_0", (400, 690), 3)]
    assert hot[0].step == steps[40 + TH.expert_steps - 1]
    dead = D.dead_experts(steps, 0, routed, TH)
    assert [(f.metric, f.window) for f in dead] == [("expert_load/layer_0/expert_6", (500, 990))]


def test_nonfinite_names_the_loss_and_ignores_missing():
    steps = np.arange(50)
    loss = np.linspace(3, 2, 50)
    grad = np.ones(50)
    loss[30] = np.nan
    grad[30:33] = np.inf
    other = np.zeros(50)  # missing values come in as 0 from the frame
    f = D.nonfinite(steps, {"train/loss": loss, "grad/norm/total": grad, "x/y": other})
    assert [(x.metric, x.window, x.severity) for x in f] == [("train/loss", (30, 32), "critical")]
    assert set(f[0].extra["metrics"]) == {"train/loss", "grad/norm/total"}


def test_stalled_run():
    assert D.stalled(120, 1000.0, False, TH, now=1000.0 + TH.stall_s - 1) == []
    assert D.stalled(120, 1000.0, True, TH, now=1e9) == []
    (f,) = D.stalled(120, 1000.0, False, TH, now=1000.0 + 2 * TH.stall_s)
    assert f.key == ("stalled_run", "events", 120)


def test_thresholds_validate_and_come_from_settings(monkeypatch):
    with pytest.raises(ValueError, match="anomaly_loss_z"):
        Thresholds(loss_z=0)
    with pytest.raises(ValueError, match="min_history"):
        Thresholds(window=8, min_history=16)
    monkeypatch.setenv("OBSERVATORY_ANOMALY_LOSS_Z", "9.5")
    monkeypatch.setenv("OBSERVATORY_ANOMALY_WINDOW", "64")
    th = Thresholds.from_settings()
    assert th.loss_z == 9.5 and th.window == 64 and th.grad_z == TH.grad_z


def test_every_threshold_is_a_setting_and_every_anomaly_setting_a_threshold():
    fields = {f.name: f for f in dataclasses.fields(Thresholds)}
    rows = {n.removeprefix(PREFIX): s for n, s in settings.SETTINGS.items() if n.startswith(PREFIX)}
    assert set(fields) == set(rows)
    for name, f in fields.items():
        assert f.default == rows[name].default and f.type == type(rows[name].default).__name__, name


def frame_of(steps, **cols):
    return pl.DataFrame(
        {"step": np.asarray(steps, dtype=np.int64), **{k: np.asarray(v, float) for k, v in cols.items()}}
    )


def test_incremental_frames_give_the_same_findings_as_one_full_scan():
    """Scanning in chunks that re-read `lookback` rows finds exactly what one full scan finds."""
    steps, loss, grad, tps, drop = clean(2500, seed=6)
    for at in (700, 1500):
        grad[at : at + 6] = BLOOM_GRAD
        loss[at + 3 : at + 8] += np.array([0.3, 1.5, 2.5, 1.0, 0.4])
    loss[2000:] += 1.0  # a spike that never recovers
    loss[2100:2300] += 0.01 * np.arange(200)  # ... then climbs
    loss[1100] = 0.2  # a bad batch
    update = 0.5 * np.exp(0.03 * np.random.default_rng(7).standard_normal(steps.size))
    update[1800] = 12.0
    tps[1200:1300] *= 0.2
    loss[2400] = np.nan
    full = frame_of(steps, **{D.LOSS: loss, D.GRAD: grad, D.THROUGHPUT: tps, D.DROP: drop, D.UPDATE: update})
    want = {f.key for f in A.detect_frame(full, None, TH)}
    assert {k[0] for k in want} >= {
        "loss_spike",
        "grad_spike",
        "incomplete_recovery",
        "throughput_drop",
        "nonfinite",
        "loss_dip",
        "update_spike",
    }
    got: set = set()
    through = None
    for end in list(range(300, 2500, 137)) + [2500]:
        since = None if through is None or through < TH.lookback else through - TH.lookback
        part = full.filter((pl.col("step") < end) & (pl.col("step") >= (since or 0)))
        got |= {f.key for f in A.detect_frame(part, None, TH, truncated=since is not None)}
        through = end - 1
    assert got == want


def test_finding_payload_is_a_valid_anomaly_event():
    from observatory.events import validate_data

    steps, loss, grad = bloom()
    f = D.grad_spikes(steps, grad, TH)[0]
    d = f.data(scanned_through=799)
    validate_data("anomaly", d)
    assert d["window"] == [502, 505] and d["scanned_through"] == 799 and d["peak_step"] == 505
    json.dumps(d)


# ------------------------------------------------------------ through the store


def write_run(runs_dir, run, steps, loss, grad, end=True, load=None, extra=None):
    import observatory

    r = observatory.init(run_id=run, runs_dir=runs_dir, config={"lr": 1e-3}, install_signal_handlers=False)
    for s, lo, g in zip(steps, loss, grad, strict=True):
        r.log({D.LOSS: float(lo), D.GRAD: float(g), **(extra(int(s)) if extra else {})}, step=int(s))
    for s, layer, routed in load or ():
        r.log_expert_load(int(s), layer, routed, [0] * len(routed))
    if end:
        r.finish()
    else:
        r.close()


def anomaly_lines(runs_dir, run):
    """The findings in the run's observatory file (which holds its alerts too)."""
    p = findings.path(runs_dir, run)
    lines = [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []
    return [e for e in lines if e["kind"] != "alert"]


@pytest.fixture
def ingest():
    from observatory.pipeline import ingest

    return ingest


def stored_anomalies(db, run=None):
    from observatory.queries.anomalies import anomaly_events
    from observatory.store import connect

    with connect(db) as con:
        return anomaly_events(con, run)


def test_one_ingest_leaves_its_findings_in_the_store(tmp_path, ingest):
    """`observatory ingest` once: the spike's anomalies are queryable, and its summary counts them."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_run(runs, "bloomish", *bloom(700, at=500)[:3])
    rep = ingest(runs, db, emit=None)
    stored = sorted((a["detector"], a["window"][0]) for a in stored_anomalies(db, "bloomish"))
    assert stored == [("grad_spike", 502), ("loss_spike", 504)]
    assert rep.findings == len(anomaly_lines(runs, "bloomish")) == 2
    assert "2 findings written" in rep.summary()
    rep = ingest(runs, db, emit=None)
    assert rep.findings == 0 and len(stored_anomalies(db, "bloomish")) == 2


def test_a_forged_finding_neither_shows_nor_stops_the_scan(tmp_path, ingest):
    """An unsigned anomaly put into the observatory's own file by hand, claiming the run was scanned to
    step 10**12: it is a rejected line, and a later scan by a new process still finds the spike."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_run(runs, "bloomish", *bloom(700, at=500)[:3])
    log = runs / "bloomish" / "events.0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:400]))  # the run before its spike
    ingest(runs, db, emit=None)
    assert stored_anomalies(db, "bloomish") == []
    forged = {
        "detector": "loss_spike",
        "severity": "critical",
        "message": "FORGED",
        "scanned_through": 10**12,
    }
    line = {"v": 1, "run": "bloomish", "kind": "anomaly", "step": 1, "t": 1.7e9, "host": 1000, "seq": 0}
    (runs / "bloomish" / "events.1000.jsonl").write_text(json.dumps(line | {"data": forged}) + "\n")
    log.write_bytes(b"".join(lines))  # the rest, spike included, read by a new process
    rep = ingest(runs, db, emit=None)
    stored = sorted((a["detector"], a["window"][0]) for a in stored_anomalies(db, "bloomish"))
    assert stored == [("grad_spike", 502), ("loss_spike", 504)]  # found, and the forged one not stored
    assert rep.rejected == 1 and any("not signed" in m for m in rep.messages)


@pytest.mark.slow
def test_after_ingest_end_to_end_and_idempotent(tmp_path, ingest):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad = bloom(700, at=500)
    write_run(runs, "bloomish", steps, loss, grad)
    write_run(runs, "clean", *clean(700, seed=9)[:3])
    ingest(runs, db)  # ingest's hook calls after_ingest after its commit ...
    assert {a["data"]["detector"] for a in anomaly_lines(runs, "bloomish")} == {"grad_spike", "loss_spike"}
    A.after_ingest(db, runs, ["bloomish", "clean"])  # ... and calling it again adds nothing
    ingest(runs, db)
    stored = stored_anomalies(db, "bloomish")
    kinds = sorted((a["detector"], a["window"][0]) for a in stored)
    assert kinds == [("grad_spike", 502), ("loss_spike", 504)]
    assert all(a["host"] == 1000 for a in stored)
    assert stored_anomalies(db, "clean") == []
    # again and again: nothing new, in memory state or not
    n = len(anomaly_lines(runs, "bloomish"))
    progress = A.Progress()
    A.after_ingest(db, runs, ["bloomish", "clean"], progress=progress)
    A.after_ingest(db, runs, ["bloomish", "clean"], progress=progress)  # with its state in memory
    A.after_ingest(db, runs, ["bloomish", "clean"])  # a fresh one: the store's state alone
    assert A.detect(db, runs, full=True) == []
    ingest(runs, db)
    assert len(anomaly_lines(runs, "bloomish")) == n
    assert len(stored_anomalies(db, "bloomish")) == 2
    # no run_end from host 1000: the observatory never ends a run
    assert not any(e["kind"] == "run_end" for e in anomaly_lines(runs, "bloomish"))


@pytest.mark.slow
def test_live_run_is_scanned_incrementally(tmp_path, ingest):
    """A run ingested in slices: findings appear once, as the data allows."""
    import observatory

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad = bloom(1400, at=1100)
    loss[600:] += 0.0
    grad[300:306] = BLOOM_GRAD  # an early one too
    r = observatory.init(run_id="live", runs_dir=runs, install_signal_handlers=False)
    seen = []
    for lo in range(0, 1400, 200):
        for s in range(lo, lo + 200):
            r.log({D.LOSS: float(loss[s]), D.GRAD: float(grad[s])}, step=s)
        r.flush(60)
        ingest(runs, db)
        A.after_ingest(db, runs, ["live"])
        seen.append(len(anomaly_lines(runs, "live")))
    r.finish()
    ingest(runs, db)  # whatever the last pass's hook wrote ...
    ingest(runs, db)  # ... is stored by the next
    keys = [(a["detector"], a["window"][0]) for a in stored_anomalies(db, "live")]
    assert sorted(keys) == [("grad_spike", 302), ("grad_spike", 1102), ("loss_spike", 1104)]
    full = A.detect_frame(frame_of(steps, **{D.LOSS: loss, D.GRAD: grad}), None, TH)
    assert sorted(keys) == sorted((f.detector, f.window[0]) for f in full)  # incremental == one full scan
    assert seen[:2] == [0, 1]  # the step-301 spike is written by the pass that ingested it
    assert len(keys) == len(set(keys))


def test_stalled_run_is_flagged_once(tmp_path, ingest, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad, _, _ = clean(200, seed=11)
    write_run(runs, "silent", steps, loss, grad, end=False)
    write_run(runs, "done", steps, loss, grad, end=True)
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "0.5")
    time.sleep(0.6)
    ingest(runs, db)
    A.after_ingest(db, runs, [])
    ingest(runs, db)
    A.after_ingest(db, runs, [])
    st = stored_anomalies(db)
    assert [(a["run"], a["detector"], a["window"]) for a in st] == [("silent", "stalled_run", [199, 199])]


def test_detect_command(tmp_path, ingest):
    from click.testing import CliRunner

    from observatory.cli import main

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad = bloom(700, at=500)
    loss[650] = float("nan")
    write_run(runs, "r1", steps, loss, grad)
    cli = CliRunner()
    args = ["detect", "r1", "--runs-dir", str(runs), "--db", str(db)]
    res = cli.invoke(main, [*args[:2], "--runs-dir", str(runs), "--db", str(tmp_path / "none.duckdb")])
    assert res.exit_code != 0 and "observatory ingest" in res.output  # no store yet: says what to do
    ingest(runs, db, hooks=False)
    res = cli.invoke(main, [*args, "--dry-run"])
    assert res.exit_code == 0, res.output
    assert "grad_spike" in res.output and "nonfinite" in res.output and "(not written)" in res.output
    res = cli.invoke(main, [*args, "--dry-run", "--fail-on", "critical"])  # a cron job can act on it
    assert res.exit_code == 1 and "a new finding is critical (--fail-on critical)" in res.output
    assert not findings.path(runs, "r1").exists()
    fresh = tmp_path / "fresh.duckdb"  # --ingest: ingest, detect, store the findings
    res = cli.invoke(main, ["detect", "--runs-dir", str(runs), "--db", str(fresh), "--json", "--ingest"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.stdout.splitlines() if x.startswith("{")]
    assert {r["detector"] for r in rows} == {"grad_spike", "loss_spike", "nonfinite"}
    assert all(r["run"] == "r1" and len(r["window"]) == 2 for r in rows)
    assert len(stored_anomalies(fresh, "r1")) == 3
    res = cli.invoke(main, [*args, "--full", "--fail-on", "info"])
    assert res.exit_code == 0 and "0 new finding(s)" in res.output  # nothing new: nothing to fail on


def test_nonfinite_in_any_metric_through_the_store(tmp_path, ingest):
    """The series detectors read five metrics; the non-finite check still sees every one."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad, _, _ = clean(300, seed=15)

    def extra(s):
        return {"router/layer_3/z_loss": float("inf") if s in (200, 201) else 1.0}

    write_run(runs, "r", steps, loss, grad, extra=extra)
    ingest(runs, db)
    ingest(runs, db)
    (f,) = stored_anomalies(db, "r")
    assert (f["detector"], f["metric"], f["window"], f["severity"]) == (
        "nonfinite",
        "router/layer_3/z_loss",
        [200, 201],
        "critical",
    )


def test_rolling_quantiles_equal_polars_bit_for_bit():
    """The detectors' numpy rolling windows give polars' rolling_quantile / median / min exactly (nulls skipped)."""
    import numpy as np
    import polars as pl

    from observatory.detect.rolling import rolling

    rng = np.random.default_rng(3)
    for _ in range(5):
        x = rng.standard_normal(2500) * 10.0 ** rng.integers(-3, 3)
        x[rng.random(x.size) < 0.1] = np.nan
        s = pl.Series(x).fill_nan(None)
        for window, least in ((128, 16), (16, 8), (32, 1)):
            med, q25, lo = rolling(x, window, least, (0.5, 0.25, 0.0))
            kw = {"window_size": window, "min_samples": least}
            ref = (
                s.rolling_median(**kw),
                s.rolling_quantile(0.25, interpolation="linear", **kw),
                s.rolling_min(**kw),
            )
            for got, want in zip((med, q25, lo), ref, strict=True):
                assert np.array_equal(got, want.fill_null(np.nan).to_numpy(), equal_nan=True)


def test_level_noise_is_kept_for_the_same_values_only():
    """The loss's spike and dip detectors both ask for its level and noise: in the caller's memo the second
    gets the first's arrays (read-only), a series that differs in one value gets its own; without a memo
    nothing is kept (no module global holds them)."""
    from observatory.detect import rolling as R

    memo: dict = {}
    x = np.random.default_rng(0).normal(2.0, 0.1, 500)
    first = R.level_noise(x, 64, 16, memo=memo)
    again = R.level_noise(x.copy(), 64, 16, memo=memo)
    assert again[0] is first[0] and not first[0].flags.writeable
    for got, want in zip(first, R._level_noise_of(x, 64, 16), strict=True):
        assert np.array_equal(got, want, equal_nan=True)
    y = x.copy()
    y[250] += 1.0
    other = R.level_noise(y, 64, 16, memo=memo)
    assert other[0] is not first[0] and not np.array_equal(other[1], first[1], equal_nan=True)
    assert len(memo) == 2 and R.level_noise(x, 64, 16)[0] is not first[0]


def test_a_long_checkpoint_or_first_compile_is_not_a_stalled_run(monkeypatch):
    """A silence that began when a process entered a budgeted phase is allowed that phase's budget."""
    monkeypatch.setenv("OBSERVATORY_PHASE_BUDGET_S", "1800")
    now = 10_000.0
    ckpt = {"phase": "checkpoint", "phase_t": now - 360, "budget_s": 600.0}
    assert D.stalled(50, now - 360, False, TH, now, ckpt) == []  # a 6-minute save with a 10-minute budget
    assert D.stalled(50, now - 700, False, TH, now, {**ckpt, "phase_t": now - 700})  # past its budget
    compiling = {"phase": "compile", "phase_t": now - 360, "budget_s": None}
    assert D.stalled(None, now - 360, False, TH, now, compiling) == []  # a 6-minute first compile
    train = {"phase": "train", "phase_t": now - 360, "budget_s": None}
    assert D.stalled(50, now - 360, False, TH, now, train)  # training silently for 6 minutes is a stall
    older = {**ckpt, "phase_t": now - 900}  # the save ended long ago: later events, then silence
    assert D.stalled(50, now - 360, False, TH, now, older)


def test_a_grad_spike_the_loss_did_not_follow_is_a_warning():
    """Critical is kept for what an operator must act on: a grad-norm spike the run absorbed is a warning; the
    same spike with the loss spiking after it stays critical."""
    steps, loss, grad = bloom(700, at=500)
    calm = loss.copy()
    calm[480:] = calm[479]  # the loss does not react
    grad_only = [
        f
        for f in A.detect_frame(frame_of(steps, **{D.LOSS: calm, D.GRAD: grad}), None, TH)
        if f.detector == "grad_spike"
    ]
    both = [
        f
        for f in A.detect_frame(frame_of(steps, **{D.LOSS: loss, D.GRAD: grad}), None, TH)
        if f.detector == "grad_spike"
    ]
    assert grad_only and all(
        f.severity == "warn" and "the loss did not follow" in f.message for f in grad_only
    )
    assert any(f.severity == "critical" for f in both)


def test_thresholds_per_run_and_per_project(tmp_path, ingest, monkeypatch, capsys):
    """The anomaly_* thresholds are not only process-wide: a rules file's `thresholds` set them for a project
    (or run glob), a run's own config `alerts.thresholds` over that; a bad value in a run's config is said and
    left out, a bad rules-file entry names its file, entry and field."""
    import observatory
    from observatory.alerts import rules as R

    rules = tmp_path / "alerts.yaml"
    rules.write_text("thresholds:\n  - project: calm\n    loss_z: 1000.0\n    loss_min_rise: 50.0\n")
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(rules))
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad = bloom()
    own = {"alerts": {"thresholds": {"loss_z": 1000.0, "loss_min_rise": 50.0}}}
    bad = {"alerts": {"thresholds": {"loss_z": "high"}}}
    for run, project, config in [
        ("plain", None, {}),
        ("own", None, own),
        ("in-calm", "calm", {}),
        ("bad", None, bad),
    ]:
        r = observatory.init(
            run_id=run, runs_dir=runs, config=config, project=project, install_signal_handlers=False
        )
        for s, lo, g in zip(steps, loss, grad, strict=True):
            r.log({D.LOSS: float(lo), D.GRAD: float(g)}, step=int(s))
        r.finish()
    ingest(runs, db, emit=None)
    spikes = {a["run"] for a in stored_anomalies(db) if a["detector"] == "loss_spike"}
    assert spikes == {"plain", "bad"}
    assert "run bad: config alerts.thresholds.loss_z: 'high' is not a number" in capsys.readouterr().err
    assert {a["run"] for a in stored_anomalies(db) if a["detector"] == "grad_spike"} >= {"own", "in-calm"}
    rules.write_text("thresholds:\n  - project: calm\n    loss_zz: 3.0\n")
    with pytest.raises(R.RulesError, match=r"alerts.yaml: thresholds\[0\]: unknown threshold 'loss_zz'"):
        R.load()
    rules.write_text("thresholds:\n  - window: 10\n    min_history: 20\n")
    with pytest.raises(R.RulesError, match=r"thresholds\[0\].*min_history \(20\) must be <= window \(10\)"):
        R.load()
