"""Instability detectors on the instability suite: recall, false alarms, lead time.

Builds (or reuses) the suite of real tiny-trainer runs (bench/instability_suite.py),
copies its event logs to a scratch runs dir, ingests them into a fresh DuckDB (the
ingest hook runs the detectors and writes `anomaly` events), ingests again to store
the findings, then scores them against each run's truth, side by side with the
OLMo-core rule (loss > mean + 6 sigma of the previous 128 steps) on the same runs:

- recall: induced instabilities with a finding from the fault step to 100 steps after
- false alarms per 10k clean steps: findings on clean runs, and on induced runs
  before their fault step, per 10,000 such steps
- lead time: loss peak step minus the step of the first warning (> 0: warned early)
- early warning: among instabilities with a grad-norm precursor (grad norm above 2x
  its recent median before the loss peak), the share warned before the peak

Also times an incremental detection pass against a full rescan of a 10k-step run.

    nice python bench/bench_detectors.py [--steps 300] [--synthetic]
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

from observatory import anomalies as A  # noqa: E402
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
        for i0, i1 in A._episodes(flags, A.SPIKE_GAP)
    ]


def loss_peak(steps, loss, s: int | None) -> int | None:
    """The instability's loss peak: first non-finite loss, else argmax after the fault (or after warmup)."""
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
    return int(seg_steps[int(np.argmax(seg))])


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
        fs = [f for f in per_run.get(run, []) if f["detector"] not in SYSTEM]
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
        lead = None if first is None or peak is None else peak - first
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
    import observatory
    from observatory.ingest import ingest

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
            A._STATE[key] = n - tail - 1  # as if the previous pass had scanned up to there
            t0 = time.perf_counter()
            A.detect(con, runs, ["long"], write=False, stall=False)
            inc.append(time.perf_counter() - t0)
    return min(full), min(inc), min(opening)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="instability detectors: recall, false alarms, lead time")
    ap.add_argument("--steps", type=int, default=300, help="steps per suite run")
    ap.add_argument("--synthetic", action="store_true", help="use the synthetic suite (no trainer)")
    ap.add_argument("--out", type=Path, default=suite.DEFAULT_OUT)
    a = ap.parse_args(argv)
    from observatory.ingest import ingest

    t0 = time.monotonic()
    if a.synthetic:
        truth = suite.build_synthetic(a.out / "synthetic", a.steps * 2)
        src = a.out / "synthetic" / "runs"
    else:
        truth = suite.build_real(a.out, a.steps)
        src = a.out / "runs"
    print(f"suite: {len(truth)} runs ready in {time.monotonic() - t0:.0f}s ({src})")
    with tempfile.TemporaryDirectory(prefix="bench-detectors-") as d:
        tmp = Path(d)
        runs, db = tmp / "runs", tmp / "obs.duckdb"
        for run in truth:  # the runs' own logs only: findings from earlier benches stay out
            (runs / run).mkdir(parents=True)
            for f in (src / run).glob("events.*.jsonl"):
                if f.name != "events.1000.jsonl":
                    shutil.copy(f, runs / run / f.name)
        A._STATE.clear()
        t1 = time.perf_counter()
        ingest(runs, db)  # the hook writes findings as host-1000 events
        A.after_ingest(db, runs, list(truth))  # explicit, in case ingest has no hook
        ingest(runs, db)
        t_detect = time.perf_counter() - t1
        ours, series, base = {}, {}, {}
        with connect(db) as con:
            for run in truth:
                ours[run] = [e for e in anomaly_events(con, run) if e["host"] == 1000]
                fr = metric_series(con, run)
                steps = fr["step"].to_numpy()
                loss = fr["train/loss"].to_numpy().astype(float)
                grad = (
                    fr["grad/norm/total"].to_numpy().astype(float)
                    if "grad/norm/total" in fr.columns
                    else None
                )
                series[run] = (steps, loss, grad)
                base[run] = olmo_findings(steps, loss)
        full_s, inc_s, open_s = timing(tmp)
    so, sb = score(truth, ours, series), score(truth, base, series)
    print(f"\ningest + detect + ingest over the suite: {t_detect:.2f}s")
    print("\n| run | kind | findings | first warning | loss peak | lead (steps) | detectors |")
    print("|---|---|---|---|---|---|---|")
    for run, kind, n, first, peak, lead in so["rows"]:
        dets = ", ".join(sorted({f["detector"] for f in ours.get(run, [])})) or "-"
        print(f"| {run} | {kind} | {n} | {first} | {peak} | {lead} | {dets} |")
    print(
        "\n| detector set | recall | false alarms / 10k clean steps | lead time (median, min) | warned before peak when grad-norm precursor |"
    )
    print("|---|---|---|---|---|")
    for name, s in (("observatory", so), ("OLMo-core mean+6σ/128 on loss", sb)):
        ld = f"{np.median(s['leads']):.0f}, {min(s['leads'])}" if s["leads"] else "-"
        print(
            f"| {name} | {s['caught']}/{s['induced']} | {s['fa_per_10k']:.1f} ({s['false_alarms']} in {s['clean_steps']}) "
            f"| {ld} | {s['early']}/{s['with_precursor']} |"
        )
    print(
        f"\nscan cost, 10k-step run: full rescan {1e3 * full_s:.0f} ms vs incremental pass {1e3 * inc_s:.0f} ms "
        f"({full_s / inc_s:.1f}x)"
    )
    lead_ours = f"{np.median(so['leads']):.0f}" if so["leads"] else "-"
    lead_base = f"{np.median(sb['leads']):.0f}" if sb["leads"] else "-"
    kind = "synthetic" if a.synthetic else "real tiny-trainer"
    print(
        f"\n| instability detectors ({kind} suite): recall / false alarms per 10k clean steps / median lead "
        f"(OLMo rule side by side) | {so['caught']}/{so['induced']} / {so['fa_per_10k']:.1f} / {lead_ours} steps "
        f"(OLMo: {sb['caught']}/{sb['induced']} / {sb['fa_per_10k']:.1f} / {lead_base}) | all / 0 / > 0 when a grad-norm "
        f"precursor exists ({so['early']}/{so['with_precursor']}) | `nice python bench/bench_detectors.py"
        f"{' --synthetic' if a.synthetic else ''}` |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
