"""Writer overhead: call time per training step, as a share of a 50 ms step.

A step's worth of logging is what the trainer does each step: `log` with 50
scalars plus `log_expert_load` for 8 layers x 64 experts (numpy counts). Side by
side: the same events written synchronously (json.dumps + write + flush in the
caller), which is what a writer without a background thread would cost.

    python bench/bench_writer.py [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

import observatory

STEP_S = 0.050
TARGET = 0.01  # 1% of a step


def one_step_payload(rng, step):
    scalars = {f"train/m{i:02d}": float(rng.random()) for i in range(50)}
    loads = [(layer, rng.integers(0, 5000, 64), rng.integers(0, 50, 64)) for layer in range(8)]
    return scalars, loads


def bench_observatory(tmp: Path, steps: int, payloads, compute_s: float = 0.0) -> list[float]:
    """Per-step call time; `compute_s` of sleep between steps stands in for the device step (GIL released)."""
    run = observatory.init(run_id=f"bench-{compute_s}", runs_dir=tmp, install_signal_handlers=False)
    per_step = []
    for step in range(steps):
        scalars, loads = payloads[step % len(payloads)]
        t0 = time.perf_counter()
        run.log(scalars, step=step)
        for layer, routed, dropped in loads:
            run.log_expert_load(step, layer, routed, dropped)
        per_step.append(time.perf_counter() - t0)
        if compute_s:
            time.sleep(compute_s)
    run.finish()
    assert run.dropped_events == 0
    return per_step


def bench_synchronous(tmp: Path, steps: int, payloads) -> list[float]:
    per_step = []
    with open(tmp / "sync.jsonl", "a") as f:
        for step in range(steps):
            scalars, loads = payloads[step % len(payloads)]
            t0 = time.perf_counter()
            f.write(json.dumps({"kind": "metrics", "step": step, "data": scalars}) + "\n")
            for layer, routed, dropped in loads:
                d = {"layer": layer, "routed": routed.tolist(), "dropped": dropped.tolist()}
                f.write(json.dumps({"kind": "expert_load", "step": step, "data": d}) + "\n")
            f.flush()
            per_step.append(time.perf_counter() - t0)
    return per_step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=2000, help="back-to-back steps")
    ap.add_argument(
        "--paced-steps", type=int, default=200, help="steps with 50 ms of simulated compute between"
    )
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    payloads = [one_step_payload(rng, s) for s in range(64)]
    with tempfile.TemporaryDirectory() as tmp:
        obs = bench_observatory(Path(tmp), args.steps, payloads)
        sync = bench_synchronous(Path(tmp), args.steps, payloads)
        paced = bench_observatory(Path(tmp), args.paced_steps, payloads, compute_s=STEP_S)
    med_obs, med_sync = statistics.median(obs), statistics.median(sync)
    p99_obs = sorted(obs)[int(0.99 * len(obs))]
    mean_paced, p99_paced = statistics.fmean(paced), sorted(paced)[int(0.99 * len(paced))]
    print(f"{args.steps} steps of 50 scalars + 8x64 expert_load")
    print(
        f"observatory writer : median {med_obs * 1e6:7.0f} us/step = {med_obs / STEP_S:.2%} of a 50 ms step "
        f"(p99 {p99_obs * 1e6:.0f} us, back to back: the writer thread competes for the GIL)"
    )
    print(
        f"  paced, 50 ms compute between steps ({args.paced_steps} steps): mean {mean_paced * 1e6:.0f} us "
        f"= {mean_paced / STEP_S:.2%}, p99 {p99_paced * 1e6:.0f} us"
    )
    print(
        f"synchronous write  : median {med_sync * 1e6:7.0f} us/step = {med_sync / STEP_S:.2%} of a 50 ms step"
    )
    print(f"ratio writer / synchronous: {med_obs / med_sync:.2f}")
    print(
        f"| writer call time per step (50 scalars + 8x64 expert_load) | median {med_obs * 1e6:.0f} us = "
        f"{med_obs / STEP_S:.2%} of a 50 ms step, paced mean {mean_paced / STEP_S:.2%} "
        f"({med_obs / med_sync:.2f}x a synchronous json write) "
        f"| < {TARGET:.0%} | python bench/bench_writer.py |"
    )


if __name__ == "__main__":
    main()
