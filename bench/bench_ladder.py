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
   the band, and the share of its curve inside; and against today's fit of the rungs;
4. `--synthetic N`: ladders with known true curves (3 to 6 rungs of final losses only, as a lab
   publishes them; different exponents and noise, one of them Chinchilla's two-term law, which
   ours only approximates), each drawn N times with noise: the share of true target losses
   inside the 90% band, its median width and the median point error; and Chinchilla's points
   with E fixed a little high, the band without and with E's range (`--e-range`).

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

from observatory.demo import seed_samples  # noqa: E402
from observatory.ladder.backtest import backtest  # noqa: E402
from observatory.ladder.fit import FitConfig, fit_ladder  # noqa: E402
from observatory.ladder.rungs import Rung, average_seeds, seed_noise  # noqa: E402
from observatory.ladder.watch import band_at_steps, load_ladder  # noqa: E402
from observatory.pipeline import ingest  # noqa: E402
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
    ap.add_argument(
        "--synthetic",
        type=int,
        default=40,
        metavar="N",
        help="noisy draws of each synthetic ladder with a known true curve (0: skip)",
    )
    args = ap.parse_args()
    if not any(args.samples.glob("*/events.*.jsonl.gz")):
        print(f"no sample logs under {args.samples}; see data/samples/README.md", file=sys.stderr)
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench_ladder_"))
    try:
        runs, db = tmp / "runs", tmp / "obs.duckdb"
        seed_samples(runs, args.samples)  # their pre-registered forecasts signed with this observatory's key
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
            if final is not None:  # today's fit of the same rungs (the pre-registered one may be older)
                now = fit.forecast(float(t["ladder"]["flops"]), t["steps"]).final
                ok_now = now.low <= final <= now.high
                print(
                    f"  today's fit: {now.value:.4f} [{now.low:.4f}, {now.high:.4f}] ({100 * (now.value / final - 1):+.2f}%): "
                    f"{'inside' if ok_now else 'OUTSIDE'} (band width {100 * (now.high - now.low) / now.value:.1f}%)"
                )
        if args.synthetic > 0:
            rows += synthetic(args.synthetic)
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


def chinchilla(c):
    """Hoffmann et al.'s L(N, D) = 1.69 + 406.4/N^0.34 + 410.7/D^0.28 at its compute-optimal split of C = 6ND."""
    e, a, b, al, be = 1.69, 406.4, 410.7, 0.34, 0.28
    n = (al * a / (be * b)) ** (1 / (al + be)) * (c / 6) ** (be / (al + be))
    return e + a / n**al + b / (c / 6 / n) ** be


# name: (true final loss at compute C, the rungs' C, the target's C, run-to-run noise, 1 sigma)
SYNTHETIC = {
    "steep, 3 rungs, 0.3% noise": (
        lambda c: 1.8 + 1.5 * (c / 1e18) ** -0.15,
        [1e18, 4e18, 1.6e19],
        1.6e20,
        0.003,
    ),
    "shallow, 4 rungs, 1% noise": (
        lambda c: 1.2 + 3.0 * (c / 1e18) ** -0.05,
        [1e18, 3e18, 1e19, 3e19],
        3e20,
        0.01,
    ),
    "Chinchilla law, 6 rungs, 0.5% noise": (chinchilla, [1e18, 3e18, 1e19, 3e19, 1e20, 3e20], 3e21, 0.005),
}


def synthetic(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """Each synthetic ladder drawn n times (its rungs' final losses times exp(N(0, noise))), fit, and the
    true target loss judged against the 90% band; then Chinchilla's points with --fix-e vs --e-range."""
    rows = []
    print(f"\nsynthetic ladders ({n} noisy draws each; the band is judged against the TRUE target loss):")
    inside_all = 0
    for name, (law, flops, target, noise) in SYNTHETIC.items():
        rng = np.random.default_rng(seed)
        inside, width, err, t0 = [], [], [], time.perf_counter()
        for _ in range(n):
            rungs = [
                Rung(run=f"r{i}", rung=f"r{i}", flops=c, curve={1.0: law(c) * math.exp(rng.normal(0, noise))})
                for i, c in enumerate(flops)
            ]
            fit = fit_ladder(rungs, FitConfig(noise=noise))
            fc, truth = fit.forecast(target).final, law(target)
            inside.append(fc.low <= truth <= fc.high)
            width.append(100 * (fc.high - fc.low) / fc.value)
            err.append(100 * abs(fc.value / truth - 1))
        inside_all += sum(inside)
        print(
            f"  {name}: target {target / flops[-1]:.0f}x the largest rung, band '{fit.held_out}': true loss inside "
            f"{np.mean(inside):.0%}, median band width {np.median(width):.2f}%, median |point error| "
            f"{np.median(err):.2f}% ({time.perf_counter() - t0:.0f} s)"
        )
        rows.append(
            (
                f"Ladder band, synthetic ({name}): true target loss inside the 90% band",
                f"{np.mean(inside):.0%} of {n} (median width {np.median(width):.1f}%, median point error "
                f"{np.median(err):.2f}%)",
                ">= 90%",
            )
        )
    rungs = [
        Rung(run=f"c{i}", rung=f"c{i}", flops=c, curve={1.0: chinchilla(c)})
        for i, c in enumerate([6e18, 3e19, 1.5e20, 8e20])
    ]
    actual = chinchilla(5.76e23)
    for label, cfg in (
        ("--fix-e 1.8", FitConfig(fix_e=1.8)),
        ("--fix-e 1.8 --e-range 1.5 1.9", FitConfig(fix_e=1.8, e_range=(1.5, 1.9))),
    ):
        fin = fit_ladder(rungs, cfg).forecast(5.76e23).final
        ok = fin.low <= actual <= fin.high
        print(
            f"  Chinchilla's points (4 rungs, 6e18..8e20) at 5.76e23 with {label}: {fin.value:.4f} "
            f"[{fin.low:.4f}, {fin.high:.4f}] vs {actual:.4f}: {'inside' if ok else 'OUTSIDE'}"
        )
        rows.append(
            (
                f"Ladder band, Chinchilla points with {label}: actual inside",
                f"{'yes' if ok else 'no'} ({fin.value:.4f} [{fin.low:.4f}, {fin.high:.4f}] vs {actual:.4f})",
                "yes",
            )
        )
    return rows


if __name__ == "__main__":
    sys.exit(main())
