"""Slow failures (issue 56): trend detectors, MoE health limits, sustained throughput loss and crash loops.

Each simulated case (`observatory.interop.simulate_slow`) goes the whole way: its event log -> real ingest
into a tmp DuckDB (the ingest hook runs the detectors) -> the findings stored by the next ingest."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

from observatory.detect import trend as T
from observatory.detect.thresholds import Thresholds
from observatory.interop.simulate_slow import HEALTHY, SLOW_CASES, lead_time, simulate_slow
from observatory.pipeline import ingest
from observatory.queries.anomalies import anomaly_events

STEPS = 2000  # the quick tier's runs (make check); the bench plays them at 10,000
TH = Thresholds()


def _stored(db) -> dict[str, list[dict]]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        out: dict[str, list[dict]] = {}
        for d in anomaly_events(con):
            out.setdefault(d["run"], []).append(d)
        return out
    finally:
        con.close()


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    """Every case at 2,000 steps, ingested twice (the second stores the findings the first wrote)."""
    d = tmp_path_factory.mktemp("slow")
    runs, db = d / "runs", d / "store.duckdb"
    truth = {}
    for case in SLOW_CASES:
        run, tr = simulate_slow(case, runs, steps=STEPS)
        truth[case] = (run, tr)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    found = _stored(db)
    return {case: (tr, found.get(run, [])) for case, (run, tr) in truth.items()}


def _alarms(found: list[dict]) -> list[dict]:
    return [d for d in found if d.get("severity") in ("warn", "critical")]


@pytest.mark.parametrize("case", HEALTHY)
def test_a_healthy_run_with_warmup_decay_eval_bumps_and_data_order_changes_raises_no_alarm(cases, case):
    _, found = cases[case]
    assert _alarms(found) == []


@pytest.mark.parametrize("case", [c for c in SLOW_CASES if c not in HEALTHY])
def test_each_slow_failure_is_found_after_it_starts(cases, case):
    truth, found = cases[case]
    lead = lead_time(truth, found)
    assert lead is not None, [(d["detector"], d["severity"]) for d in found]
    assert 0 <= lead <= STEPS // 2


def test_slow_divergence_names_what_rose_by_how_much_since_when_and_the_earlier_check(cases):
    _, found = cases["slow_divergence"]
    loss = [d for d in _alarms(found) if d["detector"] == "loss_trend" and d["metric"] == "train/loss"]
    assert loss and loss[0]["severity"] == "warn"
    msg = loss[0]["message"]
    assert msg.startswith("train/loss rose ") and "since step " in msg and "rise: 0.05" in msg
    # the change began at 40% (step 800): the finding says so within a few hundred steps
    assert 800 <= loss[0]["since_step"] <= 1100, msg
    assert any(d["metric"] == "eval/loss" for d in _alarms(found)), "the eval loss climbs with it"
    assert not any(d["detector"] == "grad_trend" for d in found), "its grad norm is flat"


def test_a_divergence_with_a_growing_grad_norm_is_found_on_both(cases):
    _, found = cases["slow_divergence_grad"]
    detectors = {d["detector"] for d in _alarms(found)}
    assert {"loss_trend", "grad_trend"} <= detectors


def test_moe_drift_is_found_against_the_early_level_and_the_absolute_limit(cases):
    _, found = cases["moe_drift"]
    detectors = {d["detector"] for d in _alarms(found)}
    assert {"drop_trend", "drop_limit", "entropy_trend"} <= detectors
    # severity grows with size and duration: the divergence reaches 5x its threshold, critical by then
    _, diverged = cases["slow_divergence"]
    assert [d["severity"] for d in _alarms(diverged) if d["metric"] == "train/loss"] == ["warn", "critical"]


@pytest.mark.parametrize("case", ["throughput_70", "throughput_55", "throughput_decay"])
def test_sustained_throughput_loss_warns_on_tokens_per_s_and_mfu_of_a_finished_run(cases, case):
    _, found = cases[case]
    # MFU is tokens/s times a constant: one finding, on tokens/s
    metrics = [d["metric"] for d in _alarms(found) if d["detector"] == "throughput_loss"]
    assert metrics == ["throughput/tokens_per_s"]
    assert all(d["severity"] == "warn" for d in found if d["detector"] == "throughput_loss")


def test_mfu_alone_is_watched_when_a_run_logs_no_tokens_per_s():
    s = np.arange(6000)
    mfu = 0.4 * np.where(s >= 3000, 0.7, 1.0)
    (f,) = T.trends({"throughput/mfu": T.bucket_means(s, mfu)}, TH)
    assert (f.detector, f.metric, f.severity) == ("throughput_loss", "throughput/mfu", "warn")
    assert 3000 <= f.step <= 3600 and "30% below its earlier level" in f.message


def test_a_crash_loop_is_one_critical_finding_with_the_attempt_count(cases):
    _, found = cases["crash_loop"]
    loops = [d for d in found if d["detector"] == "crash_loop"]
    assert len(loops) == 1
    assert loops[0]["severity"] == "critical" and loops[0]["attempts"] == 2
    assert loops[0]["message"] == "crash loop: 2 attempts failed at step 60 with InjectedCrash"


@pytest.mark.slow  # 2-20 s: out of make check
def test_a_live_run_scanned_batch_by_batch_finds_each_trend_once(tmp_path):
    """The trend at a point depends on the points up to it: ingesting a run in pieces (a live run) gives the
    findings of one ingest of the whole, none twice."""
    whole, live = tmp_path / "whole", tmp_path / "live"
    run, _ = simulate_slow("moe_drift", whole, steps=STEPS)
    ingest(whole, tmp_path / "whole.duckdb", emit=None)
    ingest(whole, tmp_path / "whole.duckdb", emit=None)
    lines = (whole / run / "events.0.jsonl").read_bytes().splitlines(keepends=True)
    (live / run).mkdir(parents=True)
    for part in np.array_split(np.arange(len(lines)), 5):
        with open(live / run / "events.0.jsonl", "ab") as f:
            f.write(b"".join(lines[i] for i in part))
        ingest(live, tmp_path / "live.duckdb", emit=None)
    ingest(live, tmp_path / "live.duckdb", emit=None)

    def keys(db):
        return sorted(
            (d["detector"], d["metric"], d["severity"], d["step"])
            for d in _stored(db).get(run, [])
            if d.get("trend")  # not `stalled_run`: the pieces are days old, with no run_end till the last
        )

    got = keys(tmp_path / "live.duckdb")
    assert got == keys(tmp_path / "whole.duckdb")
    assert len(got) == len(set(got)) and any(k[0] == "drop_trend" for k in got)


def test_the_limits_are_thresholds_a_run_can_set(tmp_path):
    th = TH.with_overrides({"drop_max": 0.2, "entropy_floor": 5.9}, "run config")
    s = np.arange(4000)
    drop = 0.03 + 0.09 * np.clip((s - 800) / 2400, 0, 1)
    ent = 5.95 - 0.45 * np.clip((s - 800) / 2400, 0, 1)
    pts = {"moe/drop_fraction": T.bucket_means(s, drop), "router/entropy": T.bucket_means(s, ent)}
    found = {f.detector for f in T.trends(pts, th)}
    assert "drop_limit" not in found and "entropy_floor" in found
    assert "drop_limit" in {f.detector for f in T.trends(pts, TH)}
    with pytest.raises(ValueError, match="throughput_loss"):
        TH.with_overrides({"throughput_loss": 1.5}, "rules")


def test_a_loss_that_stops_falling_late_in_a_cosine_decay_is_no_divergence():
    s = np.arange(10_000)
    rng = np.random.default_rng(3)
    lr = 3e-4 * 0.5 * (1 + np.cos(np.pi * s / s[-1]))
    loss = np.maximum(2.5 + 3 * np.exp(-s / 800), 2.55) + rng.normal(0, 0.05, s.size)  # flat from ~step 4,600
    pts = {"train/loss": T.bucket_means(s, loss), "opt/lr": T.bucket_means(s, lr)}
    assert T.trends(pts, TH) == []
    pts["train/loss"] = T.bucket_means(s, loss + 0.15 * np.clip((s - 6000) / 3000, 0, 1))
    assert [f.detector for f in T.trends(pts, TH) if f.severity == "warn"] == ["loss_trend"]


def test_bucket_means_leave_out_the_bucket_that_may_still_fill():
    st, x = T.bucket_means(np.arange(200), np.arange(200.0))
    assert st.tolist() == [63, 127, 191] and x.tolist() == [31.5, 95.5, 159.5]


def test_crash_loops_count_attempts_of_one_host_and_not_rollbacks():
    f = [
        {"step": 60, "host": 0, "type": "exception", "message": "InjectedCrash: x", "action": "halt"},
        {"step": 60, "host": 1, "type": "exception", "message": "InjectedCrash: x", "action": "halt"},
        {"step": 40, "host": 0, "type": "nan_loss", "message": "NaN", "action": "rollback"},
        {"step": 62, "host": 0, "type": "exception", "message": "InjectedCrash: x", "action": "halt"},
        {"step": 61, "host": 0, "type": "exception", "message": "InjectedCrash: y", "action": "halt"},
        {"step": 90, "host": 0, "type": "exception", "message": "OSError: disk", "action": "halt"},
    ]
    (loop,) = T.crash_loops(f, TH)
    assert loop.extra["attempts"] == 3 and loop.window == (60, 61)
    assert T.crash_loops(f[:3], TH) == []


@pytest.mark.slow  # 2-20 s: out of make check
def test_the_report_has_a_slow_changes_section_with_each_trend_finding_and_its_chart(tmp_path):
    from observatory import report

    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    run, _ = simulate_slow("slow_divergence", runs, steps=STEPS)
    healthy, _ = simulate_slow("healthy_wsd", runs, steps=STEPS)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    rep = report.build(db, run)
    assert {"train/loss", "eval/loss"} <= {s["metric"] for s in rep.slow}
    assert all(s["series"] and s["since"] <= s["step"] for s in rep.slow)
    html = report.render_html(rep)
    assert '<section id="slow"><h2>Slow changes</h2>' in html and 'id="fig-slow-1"' in html
    assert rep.slow[0]["message"].split(";")[0] in html.replace("&gt;", ">")
    quiet = report.render_html(report.build(db, healthy))
    assert "no slow change found" in quiet and "fig-slow-1" not in quiet


def _crash_loop_store(tmp_path):
    """A crash-looping run (simulate_slow's crash_loop) ingested twice: its id and the store."""
    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    run, _ = simulate_slow("crash_loop", runs)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    return run, db


@pytest.mark.slow  # 2-20 s: out of make check
def test_the_live_page_says_crash_loop_with_the_attempt_count(tmp_path):
    from observatory.dashboard.pages.live import crash_loop_note
    from observatory.queries import dashboard as qd

    run, db = _crash_loop_store(tmp_path)
    con = duckdb.connect(str(db), read_only=True)
    try:
        marks = qd.markers(con, run)
    finally:
        con.close()
    assert crash_loop_note(marks) == "crash loop: 2 attempts failed at step 60 with InjectedCrash"
    assert crash_loop_note(marks.filter(marks["kind"] != "anomaly")) is None


def test_the_trainer_can_inject_a_slow_lr_drift():
    from trainer.faults import FaultPlan, parse_faults

    (f,) = parse_faults(["lr_drift@100:x5"])
    assert str(f) == "lr_drift@100:x5" and f.factor == 5
    plan = FaultPlan(["lr_drift@100:x5", "lr_spike@150:x2"])
    assert plan.lr_factor([], 99, 300) == 1.0 and plan.lr_factor([], 100, 300) == 1.0
    assert plan.lr_factor([], 200, 300) == pytest.approx(3.0) and plan.lr_factor([], 300, 300) == 5.0
    assert plan.lr_factor(plan.at(150), 150, 300) == pytest.approx(2 * 2.0)
    with pytest.raises(ValueError, match="needs a factor"):
        parse_faults(["lr_drift@100"])


@pytest.mark.slow  # 2-20 s: out of make check
def test_the_report_says_crash_loop_with_the_attempt_count(tmp_path):
    from observatory import report

    run, db = _crash_loop_store(tmp_path)
    html = report.render_html(report.build(db, run))
    assert "crash loop: 2 attempts failed at step 60 with InjectedCrash" in html
    assert T.crash_loops([{"step": 1, "message": "A" * 500 + ": x"}] * 2, TH)[0].extra["error"] == "A" * 80


@pytest.mark.slow  # 2-20 s: out of make check
def test_throughput_below_the_configs_baseline_run_warns(tmp_path):
    """A run whose config names a baseline run warns when its tokens/s stays at or below 80% of that run's
    median, from its start (its own earlier level is as slow: no `throughput_loss`)."""
    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    base, _ = simulate_slow("healthy_cosine", runs, steps=2000, run_id="base")
    slow, _ = simulate_slow("healthy_wsd", runs, steps=2000, run_id="slow", speed=0.7, baseline_run=base)
    ok, _ = simulate_slow("healthy_wsd", runs, steps=2000, run_id="ok", speed=0.95, baseline_run=base)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    found = _stored(db)
    (f,) = _alarms(found.get(slow, []))
    assert (f["detector"], f["metric"], f["severity"]) == (
        "throughput_baseline",
        "throughput/tokens_per_s",
        "warn",
    )
    assert "baseline run base" in f["message"]
    assert _alarms(found.get(ok, [])) == [] and _alarms(found.get(base, [])) == []


def test_the_cli_simulates_each_slow_case_and_its_list_is_the_simulators(tmp_path):
    from click.testing import CliRunner

    from observatory.cli import main
    from observatory.commands.simulate import SLOW_CASES as CLI_CASES

    assert CLI_CASES == SLOW_CASES
    args = [
        "simulate",
        "--preset",
        "tiny",
        "--slow",
        "moe_drift",
        "--steps",
        "2000",
        "--runs-dir",
        str(tmp_path),
    ]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    assert "slow-moe-drift" in r.output and "the change starts at step 400, for drop_trend" in r.output
    assert (tmp_path / "slow-moe-drift" / "events.0.jsonl").stat().st_size > 0


@pytest.mark.slow  # 2-20 s: out of make check
def test_a_run_scanned_before_the_trend_detectors_existed_gets_them_from_an_incremental_detect(
    tmp_path, monkeypatch
):
    """A finished run whose scan state says `series` through its end, and nothing of `trends` (a store of an
    earlier version): `observatory detect` without --full reads its trends once."""
    from observatory.detect import scan

    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    run, _ = simulate_slow("throughput_55", runs, steps=STEPS)
    with monkeypatch.context() as m:  # the scans of a version without trend detectors
        m.setattr(T, "_due", lambda last, was: False)
        ingest(runs, db, emit=None)
        ingest(runs, db, emit=None)
    assert not [d for d in _stored(db).get(run, []) if d.get("trend")]
    # a one-off detect: a fresh Progress, the store's detector_state as the fallback (a new process)
    found = scan.detect(db, runs, [run], stall=False)
    assert [f.detector for f in found if f.extra.get("trend")] == ["throughput_loss"]
    assert scan.detect(db, runs, [run], stall=False) == []  # once
