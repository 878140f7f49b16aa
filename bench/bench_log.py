"""Caller-side cost of one `run.log` of 10 scalars: Observatory vs wandb (offline) vs trackio, same loop.

Each tool runs the same W&B-style loop in a process of its own (one after another, so that
one tool's background threads and service processes do not slow another's caller): a warm-up,
then `--steps` timed calls of `run.log({10 scalars})` with `step=None`, each followed by
`--compute-ms` of sleep that stands in for the training step (the device computes with the
GIL released, which is when a tool's background thread does its work). Printed: the median
and 99th percentile of one call, the ratio of each median to Observatory's, and the time
`finish` takes. A tool that is not installed is reported as such.

    python bench/bench_log.py [--steps 3000] [--compute-ms 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from peers import NAMES, version
from procs import child_result

TOOLS = {
    "observatory": "Observatory (`import observatory as wandb`)",
    "observatory-writer": "Observatory writer (`run.log(d, step=i)`)",
    "wandb": "wandb offline",
    "trackio": "trackio (local SQLite)",
}
WARMUP = 200


def _payloads(n: int) -> list[dict[str, float]]:
    import random

    rng = random.Random(0)
    return [{k: rng.random() for k in NAMES} for _ in range(n)]


def _start(tool: str, tmp: Path):
    """(log function taking (metrics, step), finish function) for one tool."""
    if tool in ("observatory", "observatory-writer"):
        import observatory

        if tool == "observatory":
            run = observatory.init(project="bench", dir=tmp, install_signal_handlers=False)
            return (lambda d, i: run.log(d)), run.finish
        run = observatory.writer.init(run_id="bench-writer", runs_dir=tmp, install_signal_handlers=False)
        return run.log, run.finish
    if tool == "wandb":
        os.environ.update(WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DIR=str(tmp))
        import wandb

        run = wandb.init(project="bench", mode="offline", dir=str(tmp))
        return (lambda d, i: run.log(d)), run.finish
    if tool == "trackio":
        os.environ["TRACKIO_DIR"] = str(tmp)
        import trackio

        trackio.init(project="bench", embed=False)
        return (lambda d, i: trackio.log(d)), trackio.finish
    raise ValueError(tool)


def child(tool: str, steps: int, compute_s: float) -> dict:
    payloads = _payloads(256)
    with tempfile.TemporaryDirectory() as d:
        try:
            log, finish = _start(tool, Path(d))
        except ImportError as e:
            return {"tool": tool, "missing": str(e)}
        for i in range(WARMUP):
            log(payloads[i % len(payloads)], i)
            time.sleep(compute_s)
        times = []
        for i in range(WARMUP, WARMUP + steps):
            d_ = payloads[i % len(payloads)]
            t0 = time.perf_counter()
            log(d_, i)
            times.append(time.perf_counter() - t0)
            time.sleep(compute_s)
        t0 = time.perf_counter()
        finish()
        finish_s = time.perf_counter() - t0
    times.sort()
    return {
        "tool": tool,
        "median_us": statistics.median(times) * 1e6,
        "p99_us": times[int(0.99 * (len(times) - 1))] * 1e6,
        "finish_s": finish_s,
        "calls": steps,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--compute-ms", type=float, default=1.0)
    ap.add_argument("--only", default=",".join(TOOLS), help="comma-separated tools: " + ", ".join(TOOLS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.compute_ms / 1000)))
        return
    results = []
    for tool in args.only.split(","):
        steps = ["--steps", str(args.steps), "--compute-ms", str(args.compute_ms)]
        results.append(child_result(__file__, tool, steps, timeout=1800))
    base = next((r["median_us"] for r in results if r["tool"] == "observatory" and "median_us" in r), None)
    print(
        f"run.log of 10 scalars, step=None, {args.steps} calls each, {args.compute_ms:g} ms of sleep between calls"
    )
    print(f"{'tool':46} {'version':>9} {'median':>10} {'p99':>10} {'÷ Observatory':>14} {'finish':>9}")
    for r in results:
        name = TOOLS[r["tool"]]
        if "missing" in r:
            print(f"{name:46} {version(r['tool']):>9}  {r['missing']}")
            continue
        ratio = f"{r['median_us'] / base:.1f}×" if base else "-"
        print(
            f"{name:46} {version(r['tool']):>9} {r['median_us']:8.1f}µs {r['p99_us']:8.1f}µs {ratio:>14} "
            f"{r['finish_s']:8.2f}s"
        )


if __name__ == "__main__":
    main()
