"""Soak: `observatory ingest --follow` over runs whose metric names keep changing; the follower's RSS slope.

A long follower must hold what it keeps between passes to a bound: the metric-name layouts
the bulk decoder learns, the detectors' progress, the alert states. This writes, through the
real writer, `--runs` live runs at a time for `--minutes` simulated minutes, `--speed` times
faster than real time. Every simulated minute each run logs other metric names than the
minute before (`m<minute>/<j>`), and every `--run-minutes` the runs end and new ones begin
(a sweep). The follower is the real command in a child process (analyses on); its RSS is
sampled every wall second. Printed: its RSS at the start and the end of the second half and
the least-squares slope over the second half (the first half is warm-up: imports, DuckDB's
caches), in MB per simulated minute and per hour of wall time, and the steps it stored.

    python bench/bench_follow_soak.py [--minutes 30] [--speed 10] [--runs 4] [--metrics 40] [--tree DIR]

`--tree` runs the follower from another checkout (an older commit, say) to compare slopes side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
import psutil

import observatory

TREE = Path(__file__).resolve().parents[1]


def slope(xs: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over xs."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="simulated minutes")
    ap.add_argument("--speed", type=float, default=10.0, help="simulated seconds per wall second")
    ap.add_argument("--runs", type=int, default=4, help="live runs at a time")
    ap.add_argument("--metrics", type=int, default=40, help="metric names a run logs each step")
    ap.add_argument("--run-minutes", type=float, default=5.0, help="simulated minutes a run lives")
    ap.add_argument("--steps-per-s", type=float, default=2.0, help="steps a run logs per simulated second")
    ap.add_argument(
        "--tree", type=Path, default=TREE, help="the source tree the follower runs (another checkout)"
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="soak-"))
    runs_dir, db = tmp / "runs", tmp / "soak.duckdb"
    runs_dir.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": str(args.tree),
        "OBSERVATORY_ALERTS_FILE": str(tmp / "no-alerts.yaml"),
        "OBSERVATORY_HEARTBEAT_S": "0",
    }
    follower = subprocess.Popen(
        [sys.executable, "-m", "observatory.cli", "ingest", "--follow", "-q", "--runs-dir", str(runs_dir)]
        + ["--db", str(db)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    proc = psutil.Process(follower.pid)
    wall_total = args.minutes * 60 / args.speed
    tick = 1.0 / (args.steps_per_s * args.speed)  # wall seconds between steps
    samples: list[tuple[float, float]] = []  # (simulated minute, RSS MB)
    live: dict[str, tuple[observatory.Run, int]] = {}
    generation, steps, next_sample = -1, 0, 0.0
    t0 = time.monotonic()
    try:
        while (wall := time.monotonic() - t0) < wall_total:
            minute = wall * args.speed / 60
            gen = int(minute // args.run_minutes)
            if gen != generation:  # the sweep's next runs
                for run, _ in live.values():
                    run.finish()
                live = {}
                for i in range(args.runs):
                    rid = f"soak-g{gen}-r{i}"
                    live[rid] = (observatory.init(run_id=rid, runs_dir=runs_dir, heartbeat_s=0), 0)
                generation = gen
            names = [f"m{int(minute)}/{j}" for j in range(args.metrics)]  # other names each minute
            for rid, (run, step) in list(live.items()):
                run.log({n: float(step + j) for j, n in enumerate(names)}, step=step)
                live[rid] = (run, step + 1)
                steps += 1
            if wall >= next_sample:
                samples.append((minute, proc.memory_info().rss / 2**20))
                next_sample += 1.0
            time.sleep(tick)
        for run, _ in live.values():
            run.finish()
        time.sleep(3.0)  # the follower's last passes
        samples.append((args.minutes, proc.memory_info().rss / 2**20))
    finally:
        follower.terminate()
        err = follower.communicate(timeout=60)[1].decode()
    with duckdb.connect(str(db), read_only=True) as con:
        stored = con.execute("SELECT count(DISTINCT (run, step)) FROM metrics").fetchall()[0][0]
        names = con.execute("SELECT count(DISTINCT name) FROM metrics").fetchall()[0][0]
    half = [s for s in samples if s[0] >= args.minutes / 2]
    per_min = slope([m for m, _ in half], [r for _, r in half])
    print(
        f"follower of {args.tree} over {args.minutes:g} simulated minutes ({wall_total:.0f} s wall, {args.runs} runs at a time, "
        f"{args.metrics} names a step, new names every minute: {names} names): stored {stored:,} of {steps:,} steps"
    )
    print(
        f"RSS {samples[0][1]:.0f} MB at start, {half[0][1]:.0f} MB at half time, {half[-1][1]:.0f} MB at the end; "
        f"slope over the second half {per_min:+.3f} MB per simulated minute "
        f"({per_min * 60 * args.speed:+.1f} MB per wall hour at this speed)"
    )
    if stored != steps:
        print(f"NOT all steps stored; the follower said:\n{err[-3000:]}")


if __name__ == "__main__":
    main()
