"""Ladder forecast quality on the committed sample ladder (data/samples), measured side by side.

    .venv/bin/python bench/bench_ladder.py [--samples data/samples]

Ingests the sample event logs into a temporary store, then:

1. backtest: leave the largest rung out, fit the others, forecast its curve. The
   final-loss error of our fit is printed next to a naive baseline fit on the same
   rungs (a straight line in log-log, i.e. E = 0) and their ratio; when the rungs have
   several seeds, also next to the same fit on one seed per rung (each seed on its
   own: what a one-seed ladder of this recipe would have scored);
   and, for scale, the error this backtest would show by noise alone: `--simulate N`
   ladders drawn from the fitted law with each rung's mean moved by the measured
   run-to-run noise / sqrt(seeds), each backtested the same way (spread and share <= 1%);
2. the share of the held-out curve's points inside the 90% band;
3. the target run against the forecast that was PRE-REGISTERED for it (the
   `forecast` event in its log, written before its run_start): final loss inside
   the band, and the share of its curve inside.

Prints markdown table rows `| target | measured | goal | command |` at the end.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from observatory.ingest import ingest  # noqa: E402
from observatory.ladder.backtest import backtest  # noqa: E402
from observatory.ladder.fit import FitConfig, fit_ladder  # noqa: E402
from observatory.ladder.rungs import Rung, average_seeds, seed_noise  # noqa: E402
from observatory.ladder.watch import band_at_steps, load_ladder  # noqa: E402
from observatory.queries import ladder as ql  # noqa: E402
from observatory.store import connect  # noqa: E402

CMD = "python bench/bench_ladder.py"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=Path, default=ROOT / "data" / "samples")
    ap.add_argument("--ladder", default="ladder-cpu")
    ap.add_argument(
        "--simulate",
        type=int,
        default=40,
        metavar="N",
        help="noise-only ladders to backtest for the expected error spread (0: skip)",
    )
    args = ap.parse_args()
    if not any(args.samples.glob("*/events.*.jsonl.gz")):
        print(f"no sample logs under {args.samples}; see data/samples/README.md", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench_ladder_"))
    try:
        runs, db = tmp / "runs", tmp / "obs.duckdb"
        for d in sorted(p for p in args.samples.iterdir() if p.is_dir()):
            (runs / d.name).mkdir(parents=True)
            for f in d.glob("events.*.jsonl*"):
                shutil.copy2(f, runs / d.name / f.name)
        ingest(runs, db, emit=None, hooks=False)
        with connect(db) as con:
            rungs, targets, ds = load_ladder(con, args.ladder)
            fcs = {t["run"]: ql.forecast_events(con, t["run"]) for t in targets}
        avg = average_seeds(rungs)
        sd, dof = seed_noise(rungs)
        print(
            f"ladder {args.ladder}: {len(avg)} rungs x {sorted({r.n_seeds for r in avg})} seeds ({len(rungs)} runs), "
            f"{len(targets)} target(s), eval dataset {ds}"
        )
        print(
            "  rung final loss (mean of seeds): "
            + ", ".join(f"{r.rung} {r.final_loss:.4f}" for r in avg)
            + (f"; run-to-run noise {100 * sd:.2f}% (1 sigma, {dof} dof)" if dof else "")
        )

        t0 = time.perf_counter()
        fit = fit_ladder(rungs, name=args.ladder)
        t_fit = time.perf_counter() - t0
        fin = fit.final
        print(
            f"fit: L(C) = {fin.E:.4f} + {fin.a_abs:.4g} C^-{fin.alpha:.4f}   ({t_fit:.1f} s for 20 fractions, "
            f"{len(fit.boot[1.0])} bootstrap resamples, {len(fit.rungs)} leave-one-outs)"
        )

        bt = backtest(rungs, name=args.ladder)
        base = backtest(rungs, FitConfig(fix_e=0.0), name=args.ladder)  # naive: pure power law, E = 0
        ratio = abs(base.final_error_pct) / max(abs(bt.final_error_pct), 1e-9)
        print(
            f"backtest (hold out {bt.held_out}): final loss predicted {bt.final_pred:.4f} "
            f"[{bt.final_low:.4f}, {bt.final_high:.4f}] vs observed {bt.final_obs:.4f}"
        )
        print(
            f"  final-loss error: ours {bt.final_error_pct:+.3f}%   naive E=0 {base.final_error_pct:+.3f}%   "
            f"naive/ours = {ratio:.1f}x"
        )
        print(
            f"  held-out curve points inside the 90% band: ours {bt.coverage:.0%}   naive {base.coverage:.0%}"
        )
        seeds = sorted({r.seed for r in rungs if r.seed is not None})
        if max(r.n_seeds for r in avg) > 1:
            # the same backtest on one seed per rung, for each seed: what averaging bought
            one = {
                s: backtest([r for r in rungs if r.seed == s], name=args.ladder)
                for s in seeds
                if len({r.rung for r in rungs if r.seed == s}) == len(avg)
            }
            if one:
                errs = [abs(b.final_error_pct) for b in one.values()]
                print(
                    f"  one seed per rung instead ({len(one)} ladders): mean |error| {sum(errs) / len(errs):.2f}% vs "
                    f"{abs(bt.final_error_pct):.2f}% averaged; within 1% in {sum(e <= 1 for e in errs)}/{len(errs)}; "
                    "by seed: " + " ".join(f"{s}:{b.final_error_pct:+.1f}%" for s, b in one.items())
                )

        rows = [
            (
                "Ladder backtest: leave-largest-rung-out final-loss error",
                f"{abs(bt.final_error_pct):.2f}% (naive E=0: {abs(base.final_error_pct):.2f}%)",
                "<= 1%",
            ),
            ("Ladder backtest: held-out curve points inside the 90% band", f"{bt.coverage:.0%}", ">= 90%"),
        ]
        if args.simulate > 0:
            e = simulate(fit, avg, fit.noise, args.simulate)
            print(
                f"  noise alone ({100 * fit.noise:.2f}% per run, /sqrt(seeds) per rung; {len(e)} simulated ladders "
                f"from the fitted law): error sd {e.std():.2f}%, |error| <= 1% in {np.mean(np.abs(e) <= 1):.0%}"
            )
        for t in targets:
            if not fcs[t["run"]]:
                print(f"target {t['run']}: no forecast event")
                continue
            fc = fcs[t["run"]][0]  # the pre-registered one
            evals = [e for e in t["evals"] if e["loss"] is not None]
            _, lo, hi = band_at_steps(fc["points"], [e["step"] for e in evals])
            scored = [(e, a, b) for e, a, b in zip(evals, lo, hi, strict=True) if a == a]
            inside = sum(a <= e["loss"] <= b for e, a, b in scored)
            final = t["curve"].get(1.0)
            ok = final is not None and fc["low"] <= final <= fc["high"]
            err = 100 * (fc["value"] - final) / final if final else float("nan")
            # a band is only worth as it is narrow: report its half-width with the verdict
            half = 100 * (fc["high"] - fc["low"]) / 2 / fc["value"]
            print(
                f"target {t['run']}: pre-registered {fc['value']:.4f} [{fc['low']:.4f}, {fc['high']:.4f}], "
                f"actual final {final if final is None else round(final, 4)} ({err:+.2f}%): "
                f"{'inside' if ok else 'OUTSIDE'} (band +-{half:.0f}%); curve points inside {inside}/{len(scored)}"
            )
            rows.append(
                (
                    f"Ladder target {t['run']}: final loss inside its pre-registered band",
                    f"{'yes' if ok else 'no'} (point forecast {err:+.2f}%, band +-{half:.0f}%, {inside}/{len(scored)} "
                    "curve points inside)",
                    "yes",
                )
            )
        print()
        for target, measured, goal in rows:
            print(f"| {target} | {measured} | {goal} | `{CMD}` |")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def simulate(fit, rungs: list[Rung], noise: float, n: int, seed: int = 0) -> np.ndarray:
    """Backtest errors (%, (n,)) of ladders drawn from the fit itself: each rung's whole curve is
    the fitted law at every fraction times one draw of exp(N(0, noise / sqrt(seeds)))."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        drawn = []
        for r in rungs:
            off = rng.normal(0.0, noise / math.sqrt(r.n_seeds))
            curve = {f: float(law(r.flops)[()]) * math.exp(off) for f, law in fit.laws.items()}
            drawn.append(Rung(run=r.run, rung=r.rung, flops=r.flops, curve=curve, steps=r.steps))
        out.append(backtest(drawn, FitConfig(n_boot=0, noise=0.0)).final_error_pct)
    return np.array(out)


if __name__ == "__main__":
    sys.exit(main())
