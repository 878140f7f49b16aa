"""False alarms on healthy runs (issue 38 item 5, issue 37 item 5): a busy machine's throughput dips and the
one-step grad-norm spikes a clipped tiny run absorbs are `info`; sustained slowdowns, grad-norm climbs and
spikes the loss follows still warn or go critical. Target: 0 critical, <= 1 warning per 10k healthy steps."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl

from observatory.detect import detectors as D
from observatory.detect import scan as A
from observatory.detect.thresholds import Thresholds
from observatory.pipeline import ingest
from observatory.queries.anomalies import anomaly_events
from observatory.store import connect

TH = Thresholds()
SAMPLE = Path(__file__).resolve().parents[1] / "data" / "samples" / "demo-sample"


def frame_of(steps, **cols):
    return pl.DataFrame(
        {"step": np.asarray(steps, dtype=np.int64), **{k: np.asarray(v, float) for k, v in cols.items()}}
    )


def busy_machine_tps(n=4000, seed=0):
    """tokens/s of a healthy run beside other jobs, shaped like the demo sample's: 15% step-to-step noise, and
    at random a burst of 3-60 logged steps at 25-45% speed, some steps in it back at full speed."""
    rng = np.random.default_rng(seed)
    tps = 1.7e4 * np.exp(0.15 * rng.standard_normal(n))
    tps[0] = 300.0  # compile step
    i = 50
    while i < n:
        i += int(rng.integers(40, 400))
        length = int(rng.integers(3, 60))
        slow = rng.uniform(0.25, 0.45, length) * np.where(rng.random(length) < 0.15, 1 / 0.35, 1.0)
        tps[i : i + length] *= slow[: max(0, min(length, n - i))]
        i += length
    return np.arange(n), tps


def test_the_demo_sample_raises_no_critical_and_at_most_one_warning(tmp_path):
    """The committed demo sample (3,416 healthy steps on a shared machine) carried 6 warnings: four one-step
    grad spikes the loss did not follow, two throughput dips of 7-9 steps while the machine was busy."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    (runs / "demo-sample").mkdir(parents=True)
    for f in SAMPLE.glob("events.*.jsonl*"):
        shutil.copy(f, runs / "demo-sample" / f.name)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    with connect(db) as con:
        found = [e for e in anomaly_events(con, "demo-sample") if e["host"] == 1000]
    sev = Counter(e["severity"] for e in found)
    assert sev["critical"] == 0 and sev["warn"] <= 1, found
    # still seen and kept, drawn faintly: the spikes and the dips are there as info
    assert {e["detector"] for e in found if e["severity"] == "info"} >= {"grad_spike", "throughput_drop"}


def test_a_busy_machine_dips_throughput_as_info_a_lasting_drop_warns():
    for seed in range(4):
        steps, tps = busy_machine_tps(seed=seed)
        td = D.throughput_drops(steps, tps, TH)
        assert td and {f.severity for f in td} == {"info"}, [f.message for f in td if f.severity != "info"]
    # issue 41's drop to 40% that lasts: one warning, raised once it has lasted `throughput_sustain` steps
    # (held against the median from before it: the trailing median adapting after half a window does not end it)
    steps, tps = busy_machine_tps(seed=0)
    tps[2000:] *= 0.4
    (w,) = [f for f in D.throughput_drops(steps, tps, TH) if f.severity == "warn"]
    assert w.window[0] == 2000 and w.step == 2000 + TH.throughput_sustain - 1
    assert w.window[1] > 2100 and "still low" in w.message
    # a slow node for 300 steps (a busy spell just before it joins in), then back: one warning
    steps, tps = busy_machine_tps(seed=1)
    tps[1000:1300] *= 0.4
    (w,) = [f for f in D.throughput_drops(steps, tps, TH) if f.severity == "warn"]
    assert 990 <= w.window[0] <= 1000 and w.step == w.window[0] + TH.throughput_sustain - 1


def test_a_lasting_throughput_drop_warns_live_and_a_dip_waits_until_it_is_over():
    """Scanned as a live run is (chunks that re-read `lookback` rows): the same findings as one scan, the
    lasting drop's warning raised while it is still going on, a dip still going on is not yet reported."""
    steps, tps = busy_machine_tps(3000, seed=2)
    tps[1800:] *= 0.4
    full = frame_of(steps, **{D.THROUGHPUT: tps})
    want = {(f.key, f.severity) for f in A.detect_frame(full, None, TH)}
    assert ("warn", 1800) in {(s, k[2]) for k, s in want}
    got, through = set(), None
    for end in range(200, 3001, 37):
        since = None if through is None or through < TH.lookback else through - TH.lookback
        part = full.filter((pl.col("step") < end) & (pl.col("step") >= (since or 0)))
        new = {(f.key, f.severity) for f in A.detect_frame(part, None, TH, truncated=since is not None)}
        if end == 1800 + TH.throughput_sustain + 10:
            assert any(s == "warn" and k[2] == 1800 for k, s in new)
        got |= new
        through = end - 1
    assert got == want
    steps, tps = np.arange(400), np.full(400, 1.7e4)
    tps[390:] *= 0.3  # a dip in its 10th step at the last step: wait
    assert D.throughput_drops(steps, tps, TH) == []
    # a slow spell still going on is one episode: a deeper dip inside it, against the trailing median that has
    # adapted by then, is not a dip of its own that ends sooner (it was, live, before the whole spell was seen)
    steps, tps = np.arange(600), np.full(600, 1e4)
    tps[300:370], tps[370:], tps[381:387] = 3000, 6000, 1000
    assert [(f.window[0], f.severity) for f in D.throughput_drops(steps, tps, TH)] == [(300, "warn")]
    assert D.throughput_drops(steps[:400], tps[:400], TH) == []


def clean_grad(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    steps = np.arange(n)
    loss = 2.5 + 6.0 * np.exp(-steps / 150) + 0.02 * rng.standard_normal(n)
    grad = (0.35 + 1.5 * np.exp(-steps / 40)) * np.exp(0.15 * rng.standard_normal(n))
    return steps, loss, grad


def test_one_step_grad_spikes_the_loss_did_not_follow_are_info():
    """The demo sample's: one step at 11x, 27x, 46x and 89x the level, the clip takes them, the loss goes on."""
    steps, loss, grad = clean_grad()
    for at, x in ((841, 11), (2493, 89), (1500, 46), (2200, 27)):
        grad[at] *= x
    fs = A.detect_frame(frame_of(steps, **{D.LOSS: loss, D.GRAD: grad}), None, TH)
    assert sorted(f.window[0] for f in fs) == [841, 1500, 2200, 2493]
    assert {(f.detector, f.severity) for f in fs} == {("grad_spike", "info")}
    assert all("one step, the loss did not follow" in f.message for f in fs)
    # live: the verdict waits until the loss had FOLLOW_STEPS steps to follow
    cut = frame_of(steps[:850], **{D.LOSS: loss[:850], D.GRAD: grad[:850]})
    assert A.detect_frame(cut, None, TH) == []
    cut = frame_of(steps[:858], **{D.LOSS: loss[:858], D.GRAD: grad[:858]})
    assert [f.severity for f in A.detect_frame(cut, None, TH)] == ["info"]


def test_grad_spikes_that_are_faults_still_warn_or_go_critical():
    steps, loss, grad = clean_grad(900, seed=1)
    grad[500:506] = [0.24 * 1.5, 0.95 * 1.5, 2.39 * 1.5, 15.9, 145.0, 960.0]  # BLOOM's climb
    calm = frame_of(steps, **{D.LOSS: loss, D.GRAD: grad})
    (g,) = [f for f in A.detect_frame(calm, None, TH) if f.detector == "grad_spike"]
    assert g.severity == "warn" and g.step <= 504  # a climb the loss did not (yet) follow: warned at once
    followed = loss.copy()
    followed[503:512] += [0.3, 1.0, 2.9, 2.4, 1.8, 1.2, 0.8, 0.5, 0.3]
    fs = A.detect_frame(frame_of(steps, **{D.LOSS: followed, D.GRAD: grad}), None, TH)
    assert {(f.detector, f.severity) for f in fs} >= {("grad_spike", "critical"), ("loss_spike", "critical")}
    steps, loss, grad = clean_grad(900, seed=2)
    grad[600] *= 30  # a bad batch: the grad norm and the loss jump at the same step
    loss[600] += 2.5
    fs = A.detect_frame(frame_of(steps, **{D.LOSS: loss, D.GRAD: grad}), None, TH)
    assert ("grad_spike", "critical") in {(f.detector, f.severity) for f in fs}
    loss[600] = 0.2  # our trainer's bad batch (one repeated byte): the loss collapses instead
    fs = A.detect_frame(frame_of(steps, **{D.LOSS: loss, D.GRAD: grad}), None, TH)
    assert {("grad_spike", "critical"), ("loss_dip", "warn")} <= {(f.detector, f.severity) for f in fs}
