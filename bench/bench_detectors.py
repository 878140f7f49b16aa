"""Instability detectors on the instability suite: recall, false alarms, lead time.

Builds (or reuses) the suite of real tiny-trainer runs (bench/instability_suite.py),
copies its event logs to a scratch runs dir, ingests them into a fresh DuckDB (the
ingest hook runs the detectors and writes `anomaly` events), ingests again to store
the findings, then scores them against each run's truth, side by side with the
OLMo-core rule (loss > mean + 6 sigma of the previous 128 steps) on the same runs:

- recall: induced instabilities with an alarm (a warn or critical finding; info is
  kept and drawn, never alerted) from the fault step to 100 steps after
- false alarms per 10k clean steps: alarms on clean runs, and on induced runs
  before their fault step, per 10,000 such steps
- lead time: loss peak step minus the step of the first warning (> 0: warned early),
  for faults after which the loss actually rose
- early warning: among instabilities with a grad-norm precursor (grad norm above 2x
  its recent median before the loss peak), the share warned before the peak

Also times an incremental detection pass against a full rescan of a 10k-step run, and scores the slow
failures (`observatory.interop.simulate_slow`, 10,000-step runs: slow divergence, MoE drift, lost
throughput, crash loop, and healthy runs with warmup, cosine and WSD decay, an eval-interval bump and
data-order changes): each case's first warn or critical finding of its detector and its lead time (steps
from the start of the change), the healthy runs' alarms per 10k steps.

    nice python bench/bench_detectors.py [--steps 300[,200]] [--synthetic-only] [--slow-only]
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import instability_suite as suite  # noqa: E402

import observatory  # noqa: E402
from observatory.detect import scan as A  # noqa: E402
from observatory.detect.detectors import SPIKE_GAP, _episodes  # noqa: E402
from observatory.pipeline import ingest  # noqa: E402
from observatory.queries.anomalies import anomaly_events, metric_series  # noqa: E402
from observatory.store import connect  # noqa: E402

AFTER = 100  # steps after the fault in which a finding counts as catching it
# about the machine, not the training dynamics: reported apart, not scored as instability warnings
SYSTEM = ("throughput_drop", "stalled_run")


def olmo_flags(loss: np.ndarray, window: int = 128, k: float = 6.0, min_history: int = 16) -> np.ndarray:
    """OLMo-core's spike rule: value > mean + k * std of the previous `window` values. (N,) bool."""
    out = np.zeros(loss.size, bool)
    for i in range(min_history, loss.size):
        prev = loss[max(0, i - window) : i]
        prev = prev[np.isfinite(prev)]
        if prev.size >= min_history and np.isfinite(loss[i]):
            out[i] = loss[i] > prev.mean() + k * prev.std()
    return out


def olmo_findings(steps: np.ndarray, loss: np.ndarray) -> list[dict]:
    flags = olmo_flags(loss)
    return [
        {"detector": "olmo_loss", "step": int(steps[i0]), "window": [int(steps[i0]), int(steps[i1])]}
        for i0, i1 in _episodes(flags, SPIKE_GAP)
    ]


def loss_peak(steps, loss, s: int | None) -> int | None:
    """The instability's loss peak: the first non-finite loss after the fault, else the highest loss
    within AFTER steps of it if that is >20% above the 32 steps before; None when the loss never
    rose (a bad batch of one repeated byte makes the loss dip, not spike). With no fault step
    (high LR throughout): the highest loss after warmup."""
    lo = s if s is not None else 32
    m = steps >= lo
    if s is not None:
        m &= steps <= s + AFTER
    if not m.any():
        return None
    seg_steps, seg = steps[m], loss[m]
    bad = ~np.isfinite(seg)
    if bad.any():
        return int(seg_steps[np.argmax(bad)])
    i = int(np.argmax(seg))
    if s is not None:
        pre = loss[(steps < s) & (steps >= s - 32) & np.isfinite(loss)]
        if pre.size == 0 or seg[i] <= 1.2 * np.median(pre):
            return None
    return int(seg_steps[i])


def grad_precursor(steps, grad, s: int | None, peak: int) -> bool:
    if grad is None:
        return False
    lo = s if s is not None else 32
    before = grad[(steps < lo) & (steps >= lo - 32) & np.isfinite(grad)]
    win = grad[(steps >= lo) & (steps < peak)]
    if before.size == 0 or win.size == 0:
        return False
    with np.errstate(invalid="ignore"):
        return bool(np.nanmax(np.where(np.isfinite(win), win, np.inf)) > 2 * np.median(before))


def score(truth: dict, per_run: dict, series: dict) -> dict:
    """Recall, false alarms / 10k clean steps, lead times and early-warning share for one detector set."""
    caught, induced, fa, clean_steps, leads, early, with_pre = 0, 0, 0, 0, [], 0, 0
    rows = []
    for run, t in sorted(truth.items()):
        steps, loss, grad = series[run]
        # an alarm is a warn or critical finding: info is kept and drawn, never alerted
        fs = [
            f
            for f in per_run.get(run, [])
            if f["detector"] not in SYSTEM and f.get("severity", "warn") != "info"
        ]
        s = t["inject_step"]
        if t["kind"] == "clean":
            fa += len(fs)
            clean_steps += int(steps.size)
            rows.append((run, "clean", len(fs), None, None, None))
            continue
        induced += 1
        lo = s if s is not None else 0
        before = [f for f in fs if f["window"][1] < lo]
        fa += len(before)
        clean_steps += int((steps < lo).sum())
        rel = [
            f
            for f in fs
            if f["window"][1] >= lo and f["window"][0] <= (s + AFTER if s is not None else math.inf)
        ]
        peak = loss_peak(steps, loss, s)
        first = min((f["step"] for f in rel), default=None)
        caught += bool(rel)
        # a run made unstable throughout (high LR) has no fault step to measure a lead from
        lead = None if first is None or peak is None or s is None else peak - first
        if lead is not None:
            leads.append(lead)
        if peak is not None and grad_precursor(steps, grad, s, peak):
            with_pre += 1
            early += lead is not None and lead > 0
        rows.append((run, "induced", len(rel), first, peak, lead))
    return {
        "recall": caught / induced if induced else float("nan"),
        "caught": caught,
        "induced": induced,
        "false_alarms": fa,
        "clean_steps": clean_steps,
        "fa_per_10k": 1e4 * fa / clean_steps if clean_steps else float("nan"),
        "leads": leads,
        "early": early,
        "with_precursor": with_pre,
        "rows": rows,
    }


def timing(tmp: Path, n: int = 10_000, tail: int = 100, reps: int = 5) -> tuple[float, float, float]:
    """Best-of-`reps` seconds: full rescan vs incremental pass (last `tail` steps) of an n-step run,
    both on one open read-only connection; and the cost of opening one."""
    runs, db = tmp / "timing-runs", tmp / "timing.duckdb"
    rng = np.random.default_rng(0)
    r = observatory.init(run_id="long", runs_dir=runs, install_signal_handlers=False)
    loss = 2.5 + 3 * np.exp(-np.arange(n) / 500) + 0.03 * rng.standard_normal(n)
    grad = 0.3 * np.exp(0.1 * rng.standard_normal(n))
    for i in range(n):
        r.log({"train/loss": loss[i], "grad/norm/total": grad[i], "throughput/tokens_per_s": 4e4}, step=i)
    r.finish()
    ingest(runs, db, hooks=False, emit=None)
    full, inc, opening = [], [], []
    key = (str(runs.resolve()), "long")
    for _ in range(reps):
        t0 = time.perf_counter()
        with connect(db) as con:
            opening.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            A.detect(con, runs, ["long"], write=False, full=True, stall=False)
            full.append(time.perf_counter() - t0)
            progress = A.Progress()
            progress.state[key] = {"series": n - tail - 1}  # as if the previous pass had scanned up to there
            t0 = time.perf_counter()
            A.detect(con, runs, ["long"], write=False, stall=False, progress=progress)
            inc.append(time.perf_counter() - t0)
    return min(full), min(inc), min(opening)


def evaluate(truth: dict, src: Path, tmp: Path) -> tuple[dict, dict, dict, float]:
    """Ingest a suite's logs into a fresh store (the hook writes findings), ingest again, read back.

    Returns our findings per run, the OLMo rule's per run, (steps, loss, grad) per run, seconds.
    """
    runs, db = tmp / "runs", tmp / "obs.duckdb"
    for run in truth:  # the runs' own logs only: findings from earlier benches stay out
        (runs / run).mkdir(parents=True)
        for f in (src / run).glob("events.*.jsonl"):
            if f.name != "events.1000.jsonl":
                shutil.copy(f, runs / run / f.name)
    t0 = time.perf_counter()
    ingest(runs, db, emit=None)  # the hook writes findings as host-1000 events
    A.after_ingest(db, runs, list(truth))  # explicit, in case ingest has no hook (adds nothing if it has)
    ingest(runs, db, emit=None)
    secs = time.perf_counter() - t0
    ours, base, series = {}, {}, {}
    with connect(db) as con:
        for run in truth:
            ours[run] = [e for e in anomaly_events(con, run) if e["host"] == 1000]
            fr = metric_series(con, run)
            steps = fr["step"].to_numpy()
            loss = fr["train/loss"].to_numpy().astype(float)
            grad = fr["grad/norm/total"].to_numpy().astype(float) if "grad/norm/total" in fr.columns else None
            series[run] = (steps, loss, grad)
            base[run] = olmo_findings(steps, loss)
    return ours, base, series, secs


def report(title: str, truth: dict, ours: dict, base: dict, series: dict, secs: float) -> tuple[dict, dict]:
    so, sb = score(truth, ours, series), score(truth, base, series)
    print(f"\n## {title}: {len(truth)} runs; ingest + detect + ingest {secs:.1f}s")
    print("\n| run | kind | alarms | first alarm | loss peak | lead (steps) | detectors (all findings) |")
    print("|---|---|---|---|---|---|---|")
    for run, kind, n, first, peak, lead in so["rows"]:
        dets = ", ".join(sorted({f"{f['detector']}:{f.get('severity')}" for f in ours.get(run, [])})) or "-"
        print(f"| {run} | {kind} | {n} | {first} | {peak} | {lead} | {dets} |")
    print(
        "\n| detector set | recall | false alarms / 10k clean steps | lead (median, min) | warned before peak, grad-norm precursor |"
    )
    print("|---|---|---|---|---|")
    for name, s in (("observatory", so), ("OLMo-core mean+6σ/128 on loss", sb)):
        ld = f"{np.median(s['leads']):.0f}, {min(s['leads'])}" if s["leads"] else "-"
        print(
            f"| {name} | {s['caught']}/{s['induced']} | {s['fa_per_10k']:.1f} ({s['false_alarms']} in "
            f"{s['clean_steps']} steps) | {ld} | {s['early']}/{s['with_precursor']} |"
        )
    sys_found = sorted({(r, f["detector"]) for r, fs in ours.items() for f in fs if f["detector"] in SYSTEM})
    print(f"\nsystem findings, not scored (a shared 2-core machine slows runs down): {sys_found or 'none'}")
    return so, sb


def slow_failures(tmp: Path, steps: int = 10_000) -> tuple[int, int, int, int]:
    """The slow failures' table; returns (cases found, cases, healthy alarms, healthy steps)."""
    from observatory.interop.simulate_slow import HEALTHY, SLOW_CASES, lead_time, simulate_slow

    runs, db = tmp / "runs", tmp / "obs.duckdb"
    truth = dict(simulate_slow(case, runs, steps=steps) for case in SLOW_CASES)
    t0 = time.perf_counter()
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    secs = time.perf_counter() - t0
    with connect(db) as con:
        found = {run: [e for e in anomaly_events(con, run) if e["host"] == 1000] for run in truth}
    print(
        f"\n## slow failures: {len(truth)} simulated runs of {steps:,} steps; ingest + detect + ingest {secs:.1f}s"
    )
    print(
        "\n| case | change from | expected | first alarm | lead (steps) | alarms (detector:severity@step) |"
    )
    print("|---|---|---|---|---|---|")
    caught = cases = healthy_alarms = healthy_steps = 0
    for run, tr in truth.items():
        alarms = sorted(
            (f["step"], f["detector"], f["severity"]) for f in found[run] if f["severity"] != "info"
        )
        lead = lead_time(tr, found[run])
        if tr["sim/case"] in HEALTHY:
            healthy_alarms += len(alarms)
            healthy_steps += tr["sim/steps"]
        else:
            cases += 1
            caught += lead is not None
        first = next((f"{d}@{s}" for s, d, _ in alarms), "-")
        listed = ", ".join(f"{d}:{v}@{s}" for s, d, v in alarms) or "-"
        print(
            f"| {tr['sim/case']} | {tr['sim/change_step'] if tr['sim/change_step'] is not None else '-'} | "
            f"{tr['sim/expect'] or 'nothing'} | {first} | {lead if lead is not None else '-'} | {listed} |"
        )
    print(
        f"\nslow failures found: {caught}/{cases}; healthy: {healthy_alarms} alarms in {healthy_steps:,} steps "
        f"({1e4 * healthy_alarms / max(healthy_steps, 1):.1f} per 10k)"
    )
    return caught, cases, healthy_alarms, healthy_steps


def _short(s: dict) -> str:
    lead = f"{np.median(s['leads']):.0f}" if s["leads"] else "-"
    return f"{s['caught']}/{s['induced']}, {s['fa_per_10k']:.1f}, {lead}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="instability detectors: recall, false alarms, lead time")
    ap.add_argument(
        "--steps", default="300", help="steps per real suite run; several: 200,300 (one suite each)"
    )
    ap.add_argument("--synthetic-only", action="store_true", help="skip the real suite (no trainer needed)")
    ap.add_argument("--out", type=Path, default=suite.DEFAULT_OUT)
    ap.add_argument("--slow-only", action="store_true", help="only the simulated slow failures")
    a = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-detectors-") as d:
        tmp = Path(d)
        slow = slow_failures(tmp / "slow")
        if a.slow_only:
            return 0
        if not a.synthetic_only:
            t0 = time.monotonic()
            truth = {}
            for n in (int(x) for x in a.steps.split(",")):
                truth.update(suite.build_real(a.out, n))
            print(f"real suite: {len(truth)} runs ready in {time.monotonic() - t0:.0f}s ({a.out / 'runs'})")
            so, sb = report("real tiny-trainer runs", truth, *evaluate(truth, a.out / "runs", tmp / "real"))
            rows.append(("real", so, sb))
        syn = suite.build_synthetic(a.out / "synthetic", 600)
        so, sb = report(
            "synthetic runs (BLOOM-like precursor, growth, bad batch, clean)",
            syn,
            *evaluate(syn, a.out / "synthetic" / "runs", tmp / "synthetic"),
        )
        rows.append(("synthetic", so, sb))
        full_s, inc_s, open_s = timing(tmp)
    print(
        f"\nscan cost, 10k-step run, one open connection: full rescan {1e3 * full_s:.0f} ms vs incremental "
        f"pass {1e3 * inc_s:.0f} ms ({full_s / inc_s:.1f}x); opening the store read-only: {1e3 * open_s:.0f} ms"
    )
    ours = "; ".join(f"{k}: {_short(so)}" for k, so, _ in rows)
    olmo = "; ".join(f"{k}: {_short(sb)}" for k, _, sb in rows)
    early = "; ".join(f"{k} {so['early']}/{so['with_precursor']}" for k, so, _ in rows)
    print(
        "\n| instability detectors: recall, false alarms / 10k clean steps, median lead (steps) | "
        f"{ours} (OLMo rule side by side: {olmo}); warned before the peak when a grad-norm precursor: {early} "
        f"| all caught, 0, > 0 with a precursor | `nice python bench/bench_detectors.py` |"
    )
    print(
        f"\n| slow failures: found, healthy alarms per 10k steps | {slow[0]}/{slow[1]}, "
        f"{1e4 * slow[2] / max(slow[3], 1):.1f} | all, <= 1 | `nice python bench/bench_detectors.py --slow-only` |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
