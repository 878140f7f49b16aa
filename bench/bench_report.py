"""Post-mortem report for a long run: build + HTML time and file size, downsampled vs full resolution.

A 100k-step run (5 curves, a loss spike, a NaN tail, expert loads every 100 steps)
is written with the real writer and ingested into a temp store; the report is then
rendered twice, side by side in one process: as shipped (each overview curve cut to
min/max buckets of at most `observatory.report.collect.MAX_POINTS` points) and at full resolution.

    python bench/bench_report.py [--steps 100000]
"""

from __future__ import annotations

import argparse
import math
import tempfile
import time
from pathlib import Path

import observatory
from observatory import report
from observatory.pipeline import ingest
from observatory.report import collect
from observatory.report.render import render_html


def make_run(runs: Path, steps: int) -> None:
    with observatory.init(
        run_id="long", runs_dir=runs, config={"steps": steps}, install_signal_handlers=False
    ) as r:
        for s in range(steps):
            loss = 2.0 + 6.0 * (s + 10) ** -0.5 + (3.0 if s == steps // 3 else 0.0)
            r.log(
                {
                    "train/loss": math.nan if s >= steps - 5 else loss,
                    "grad/norm/total": 1.0 + (s % 97) * 1e-3,
                    "opt/lr": 3e-4,
                    "moe/drop_fraction": 0.05,
                    "throughput/tokens_per_s": 5e4,
                },
                step=s,
            )
            if s % 100 == 0:
                r.log_expert_load(s, 0, [100] * 8, [1] * 8)
        r.event("failure", {"type": "nan_loss", "message": "nan", "action": "halt"}, step=steps - 5)


def timed(fn):
    t = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs, db = Path(tmp) / "runs", Path(tmp) / "obs.duckdb"
        make_run(runs, args.steps)
        ingest(runs, db, hooks=False, emit=None)
        (html, t_ds) = timed(lambda: render_html(report.build(db, "long")))
        shipped = collect.MAX_POINTS
        collect.MAX_POINTS = None  # full resolution, for comparison
        try:
            (html_full, t_full) = timed(lambda: render_html(report.build(db, "long")))
        finally:
            collect.MAX_POINTS = shipped
    mb, mb_full = len(html) / 1e6, len(html_full) / 1e6
    print(
        f"steps {args.steps}: downsampled {t_ds:.2f} s, {mb:.1f} MB; full resolution {t_full:.2f} s, {mb_full:.1f} MB"
    )
    print(f"ratio full/downsampled: time {t_full / t_ds:.1f}x, size {mb_full / mb:.1f}x")
    print(
        f"| report for a {args.steps // 1000}k-step run (build + HTML) | {t_ds:.1f} s, {mb:.1f} MB "
        f"({t_full / t_ds:.1f}x faster, {mb_full / mb:.1f}x smaller than full resolution) | < 10 s, < 10 MB "
        f"| python bench/bench_report.py |"
    )


if __name__ == "__main__":
    main()
