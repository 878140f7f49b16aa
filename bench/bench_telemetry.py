"""Telemetry overhead: training step time with full telemetry vs telemetry off, measured side by side.

Full telemetry = every metric every step (per-layer router and drop statistics, per-module grad
norms, update and param norms) plus `expert_load` events for every layer at every step, all
written through the observatory writer. Off = `telemetry.enabled=false`: only the loss leaves
the device. Both run the real trainer loop (`trainer.train.train`) on the same config in this one
process, alternating A/B/A/B so that load drift on a shared machine hits both alike; step time is
the wall time between the first measured step's and the last step's metrics events (so it counts
everything the loop does), and the figure is best-of-reps full / best-of-reps off (the per-rep
ratios are printed too). Because wall time on a shared machine is mostly other people's load, it
also reports this process's CPU time per step (long run minus a short run, so setup cancels), median
over repetitions, full / off.

    python bench/bench_telemetry.py [--config trainer/configs/tiny.yaml] [--steps 60] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from trainer.cli import _enable_compile_cache  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.train import train  # noqa: E402

WARMUP = 10  # steps excluded at the start (compile, first dispatches)


def step_time(runs: Path, run_id: str) -> float:
    ts = {}
    for line in (runs / run_id / "events.0.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev["kind"] == "metrics":
            ts[ev["step"]] = ev["t"]
    last = max(ts)
    return (ts[last] - ts[WARMUP]) / (last - WARMUP)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "trainer" / "configs" / "tiny.yaml"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    _enable_compile_cache()
    common = [f"steps={args.steps}", "eval.every=0", "checkpoint.every=0", "checkpoint.at_exit=false",
              "telemetry.progress=false", "telemetry.peak_flops=1e10", "schedule.warmup_steps=5", *args.overrides]
    variants = {
        "full": load_config(args.config, [*common, "telemetry.enabled=true", "telemetry.expert_load_every=1"]),
        "off": load_config(args.config, [*common, "telemetry.enabled=false"]),
    }
    times: dict[str, list[float]] = {"full": [], "off": []}
    cpu: dict[str, list[float]] = {"full": [], "off": []}

    def cpu_of(cfg) -> tuple[float, str]:
        t0 = time.process_time()
        run_id = train(cfg, runs)
        return time.process_time() - t0, run_id

    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        for cfg in variants.values():  # compile both variants before measuring anything
            train(cfg.replace(steps=WARMUP + 2), runs)
        for rep in range(args.reps):
            order = ("full", "off") if rep % 2 == 0 else ("off", "full")
            for name in order:
                c_short, _ = cpu_of(variants[name].replace(steps=WARMUP))
                c_long, run_id = cpu_of(variants[name])
                times[name].append(step_time(runs, run_id))
                # CPU seconds per step of this process (all its threads), setup cancelled out by the
                # short run: other processes on a shared machine inflate wall time, not this.
                cpu[name].append((c_long - c_short) / (args.steps - WARMUP))
                print(f"rep {rep} {name:4s}: wall {1e3 * times[name][-1]:.2f} ms/step, "
                      f"cpu {1e3 * cpu[name][-1]:.2f} ms/step", file=sys.stderr)
        n_events = sum(1 for _ in (runs / run_id / "events.0.jsonl").open())
    ratios = [f / o for f, o in zip(times["full"], times["off"], strict=True)]
    # Wall time, best-of-reps per variant (as timeit does): other processes only ever add time.
    full_ms, off_ms = 1e3 * min(times["full"]), 1e3 * min(times["off"])
    ratio = full_ms / off_ms
    cpu_ratio = statistics.median(cpu["full"]) / statistics.median(cpu["off"])
    print(f"wall, best of {args.reps}: full telemetry {full_ms:.2f} ms/step, off {off_ms:.2f} ms/step "
          f"(per-rep ratios {', '.join(f'{r:.3f}' for r in ratios)}); CPU time per step, median: full "
          f"{1e3 * statistics.median(cpu['full']):.2f} ms, off {1e3 * statistics.median(cpu['off']):.2f} ms "
          f"= {cpu_ratio:.3f}x; the last run wrote {n_events} events")
    print("| target | measured | goal | command |")
    print("|---|---|---|---|")
    print(f"| telemetry overhead: step time full / off (wall best-of {full_ms:.1f} vs {off_ms:.1f} ms; "
          f"CPU time {cpu_ratio:.3f}x) | {ratio:.3f}x | <= 1.02x | `python bench/bench_telemetry.py` |")


if __name__ == "__main__":
    main()
