"""The detectors' false alarms on healthy runs of the demo's config, on a quiet machine and under load.

Healthy runs, all of the demo's recipe (`trainer/configs/tiny.yaml` with `make demo`'s overrides):

- `demo-sample`: the committed sample (data/samples, 3,416 steps, trained on a shared 2-core machine);
- `quiet-<N>`: the trainer, N steps, on the machine as it is;
- `loaded-<N>`: the trainer, N steps, while this bench keeps the machine busy: one busy-loop process
  per CPU core (a `stress --cpu` alike), each spinning for 1-15 s, then idle for 1-15 s, at random,
  so the run's throughput swings as it does beside other jobs;
- `slow-healthy-*`: simulated 10,000-step runs (`observatory.interop.simulate_slow`, with a busy machine's
  dips): warmup and cosine decay with an eval-interval bump, WSD decay, two data-order changes. The slow-
  change detectors read thousands of steps, longer than the trained runs.

The trained runs are cached under `tmp/artifacts/false_alarms/` (so `--before PATH` can score the
same logs with another checkout's detectors: `PYTHONPATH=PATH`). Each run's own event logs are
copied to a fresh store, ingested (the ingest hook runs the detectors and writes their findings),
and ingested again; then its findings are counted by severity. Target: 0 critical and <= 1 warning
per 10,000 healthy steps ("info" findings are kept in the store and drawn faintly, not alerts).

    nice python bench/bench_false_alarms.py [--steps 1500[,5000]] [--fresh] [--before main]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tmp" / "artifacts" / "false_alarms"
SAMPLE = ROOT / "data" / "samples" / "demo-sample"
SIM_HEALTHY = ("healthy_cosine", "healthy_wsd", "healthy_data_order")  # simulate_slow.HEALTHY
SIM_STEPS = 10_000


def _busy(seed: int, stop) -> None:
    """One core's load: spin for 1-15 s, idle for 1-15 s, until `stop` is set."""
    rng = random.Random(seed)
    while not stop.is_set():
        until = time.monotonic() + rng.uniform(1, 15)
        while time.monotonic() < until and not stop.is_set():
            sum(i * i for i in range(10_000))
        stop.wait(rng.uniform(1, 15))


def train(runs_dir: Path, run: str, steps: int, load: int) -> float:
    """A demo-recipe run of `steps` steps (with `load` busy-loop processes beside it); seconds taken."""
    from observatory.demo import LONG_RUN  # the demo's own overrides
    from trainer.config import load_config  # lazy: the trainer loads jax
    from trainer.train import train as run_trainer

    cfg = load_config(
        str(ROOT / "trainer" / "configs" / "tiny.yaml"),
        [f"steps={steps}", "telemetry.progress=false", *LONG_RUN],
    )
    ctx = mp.get_context("spawn")  # not fork: JAX's threads are running
    stop = ctx.Event()
    procs = [ctx.Process(target=_busy, args=(i, stop), daemon=True) for i in range(load)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    try:
        run_trainer(cfg, runs_dir, run_id=run)
    finally:
        stop.set()
        for p in procs:
            p.join(20)
    return time.monotonic() - t0


def build(steps: int, fresh: bool, train_missing: bool = True) -> dict[str, str]:
    """The healthy runs (cached; with `train_missing` false, only those already there): run -> how made."""
    runs = OUT / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    made = {"demo-sample": "committed sample, 3,416 steps"}
    cores = os.cpu_count() or 2
    for run, load in ((f"quiet-{steps}", 0), (f"loaded-{steps}", cores)):
        if fresh:
            shutil.rmtree(runs / run, ignore_errors=True)
        if not (runs / run / "events.0.jsonl").exists():
            if not train_missing:
                continue
            secs = train(runs, run, steps, load)
            print(f"trained {run} in {secs:.0f} s ({load} busy-loop processes)", flush=True)
        made[run] = f"trainer, {steps} steps, " + (
            f"{cores} busy-loop processes (1-15 s on/off)" if load else "the machine as it is"
        )
    for case in SIM_HEALTHY:
        run = f"slow-{case.replace('_', '-')}"
        if not (runs / run / "events.0.jsonl").exists():  # cheap to make: made in --score-only too
            try:
                from observatory.interop.simulate_slow import simulate_slow
            except ImportError:  # an older checkout's observatory (`--before`): the runs it did not make
                continue
            simulate_slow(case, runs, steps=SIM_STEPS, run_id=run)
        made[run] = f"simulated {case}, {SIM_STEPS:,} steps"
    return made


def score(made: dict[str, str]) -> list[dict]:
    """Ingest each run's own logs into a fresh store (the hook writes findings), count them by severity."""
    from observatory.pipeline import ingest
    from observatory.queries.anomalies import anomaly_events
    from observatory.store import connect

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-fa-") as d:
        runs, db = Path(d) / "runs", Path(d) / "obs.duckdb"
        for run in made:
            src = SAMPLE if run == "demo-sample" else OUT / "runs" / run
            (runs / run).mkdir(parents=True)
            for f in src.glob("events.*.jsonl*"):
                if not f.name.startswith("events.1000."):  # the run's own logs: no earlier findings
                    shutil.copy(f, runs / run / f.name)
        ingest(runs, db, emit=None)
        ingest(runs, db, emit=None)
        with connect(db) as con:
            for run, how in made.items():
                found = [e for e in anomaly_events(con, run) if e["host"] == 1000]
                (n,) = con.execute(
                    "SELECT count(DISTINCT step) FROM metrics WHERE run = ? AND name = 'train/loss'", [run]
                ).fetchone()
                sev = Counter(f.get("severity") for f in found)
                rows.append(
                    {
                        "run": run,
                        "how": how,
                        "steps": n,
                        "critical": sev["critical"],
                        "warn": sev["warn"],
                        "info": sev["info"],
                        "detectors": dict(Counter(f"{f['detector']}:{f.get('severity')}" for f in found)),
                        "longest_dip": max(
                            (
                                f["window"][1] - f["window"][0] + 1
                                for f in found
                                if f["detector"] == "throughput_drop"
                            ),
                            default=0,
                        ),
                    }
                )
    return rows


def score_at(ref: str, steps: str) -> list[dict]:
    """`score` with the detectors as they were at git `ref` (its `observatory/`, in a subprocess)."""
    with tempfile.TemporaryDirectory(prefix="bench-fa-ref-") as d:
        tar = subprocess.run(
            ["git", "-C", ROOT, "archive", ref, "observatory"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", d], input=tar.stdout, check=True)
        out = subprocess.run(
            [sys.executable, __file__, "--score-only", "--json", "--steps", steps],
            env={**os.environ, "PYTHONPATH": d},
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(out.stdout.splitlines()[-1])


def _rates(rows: list[dict]) -> str:
    steps = sum(r["steps"] for r in rows)
    if not steps:  # no such runs (`--score-only` with none trained under load)
        return "-"
    crit, warn = sum(r["critical"] for r in rows), sum(r["warn"] for r in rows)
    return (
        f"{1e4 * crit / steps:.1f} critical, {1e4 * warn / steps:.1f} warnings per 10k steps "
        f"({crit}, {warn} in {steps:,})"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default="1500", help="steps of each trained run; several: 1500,5000")
    ap.add_argument("--fresh", action="store_true", help="train the runs again")
    ap.add_argument(
        "--before", default="main", help="git ref whose detectors score the same runs, side by side"
    )
    ap.add_argument(
        "--score-only", action="store_true", help="score the cached runs of --steps (no training)"
    )
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    a = ap.parse_args(argv)
    from observatory.detect.thresholds import Thresholds

    made: dict[str, str] = {}
    for n in (int(x) for x in a.steps.split(",")):
        made.update(build(n, a.fresh and not a.score_only, train_missing=not a.score_only))
    rows = score(made)
    if a.json:
        print(json.dumps(rows))
        return 0
    before = {r["run"]: r for r in score_at(a.before, a.steps)} if a.before else {}
    print(f"\nbefore: detectors at `{a.before}`; after: this checkout's\n")
    print("| run | how | steps | critical (before, after) | warn | info | findings after |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        b = before.get(r["run"], {})
        dets = ", ".join(f"{k} x{v}" for k, v in sorted(r["detectors"].items())) or "-"
        print(
            f"| {r['run']} | {r['how']} | {r['steps']:,} | {b.get('critical', '?')}, {r['critical']} | "
            f"{b.get('warn', '?')}, {r['warn']} | {b.get('info', '?')}, {r['info']} | {dets} |"
        )
    loaded = [r for r in rows if r["run"].startswith("loaded-")]
    for name, part in (
        ("all", rows),
        ("the machine as it is", [r for r in rows if r not in loaded]),
        ("under load", loaded),
    ):
        bpart = [before[r["run"]] for r in part if r["run"] in before]
        print(f"\n{name}: before {_rates(bpart) if bpart else '-'}; after {_rates(part)}")
    print(
        f"\nlongest throughput dip on these healthy runs: {max(r.get('longest_dip', 0) for r in rows)} logged steps "
        f"(a dip warns once it lasts anomaly_throughput_sustain, {Thresholds.from_settings().throughput_sustain})"
    )
    print(
        f"\n| detectors' false alarms on healthy demo-recipe runs, quiet and under load | {_rates(rows)} "
        f"(before: {_rates(list(before.values())) if before else '-'}) | 0 critical, <= 1 warning per 10k "
        f"| `nice python bench/bench_false_alarms.py --steps {a.steps}` |"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
