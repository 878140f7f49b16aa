"""`observatory ladder`: fit scaling ladders, backtest them, pre-register a target's forecast, watch it.

observatory ladder list
observatory ladder fit NAME [--target RUN_OR_FILE] [--fix-e E] [--json]
observatory ladder forecast NAME --target RUN [--flops C --steps S | --spec FILE] [--fix-e E]
observatory ladder check [RUN ...]
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from observatory.commands import common_options
from observatory.commands.progress import bar, quiet_option
from observatory.events import RUN_ID_RE
from observatory.ladder.watch import (
    check_targets,
    forecast_event_data,
    load_ladder,
    run_started,
    target_spec,
    write_forecast,
)
from observatory.queries.ladder import ladders
from observatory.store import connect

# observatory.ladder.fit and .backtest load scipy: they are imported inside the commands that fit,
# lazy for start-up time (`ladder list`, `ladder check` and --help do not need them)

__all__ = ["ladder"]


def _fmt(x, spec=".4f"):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _config(fix_e, n_boot, level, independent_e=False, band="forward"):
    from observatory.ladder.fit import FitConfig  # lazy for start-up time: scipy

    try:
        return FitConfig(fix_e=fix_e, n_boot=n_boot, level=level, shared_e=not independent_e, loo=band)
    except ValueError as e:
        raise click.UsageError(str(e)) from None


_band_option = click.option(
    "--band",
    type=click.Choice(["forward", "max", "rms", "none"]),
    default="forward",
    show_default=True,
    help="Held-out-rung error the bootstrap band is widened by: forward (the largest rung predicted from the "
    "smaller ones), max or rms of the leave-one-rung-out errors, or none.",
)


def _load(db, name, dataset):
    with connect(db) as con:
        try:
            return load_ladder(con, name, dataset)
        except ValueError as e:
            raise click.ClickException(str(e)) from None


@click.group("ladder")
def ladder():
    """Fit scaling ladders and forecast target runs.

    A ladder is every run whose run_start has `ladder.name` (rungs), plus targets
    (`ladder.target: true`). The fit is L(C) = E + A C^-alpha on each rung's eval
    loss at every 5% of its schedule (Huber on log residuals, E shared across
    fractions), with a band from a bootstrap over whole rungs widened by the
    forward error (the largest rung predicted from the smaller rungs). Runs with the same `ladder.rung` are seeds of one
    rung: the fit averages them and their spread is the run-to-run noise.
    """


@ladder.command("list")
@common_options
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def list_cmd(runs_dir, db, as_json):
    """Every ladder in the store, with its rung count and target runs."""
    with connect(db) as con:
        rows = ladders(con)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no ladders in the store (runs with ladder.name in run_start); did you run ingest?")
        return
    click.echo(f"{'ladder':<24} {'rungs':>5} {'runs':>5}  targets")
    for r in rows:
        click.echo(f"{r['name']:<24} {r['rungs']:>5} {r['runs']:>5}  {', '.join(r['targets']) or '-'}")


@ladder.command("fit")
@click.argument("name")
@common_options
@click.option(
    "--target",
    "target",
    default=None,
    metavar="RUN_OR_FILE",
    help="Forecast this run (stored, with ladder.flops) or a YAML/JSON file with flops and steps.",
)
@click.option("--fix-e", type=float, default=None, help="Hold the irreducible loss E at this value.")
@click.option("--dataset", default=None, help="Eval dataset (default: the one the rungs log most).")
@click.option(
    "--n-boot",
    type=int,
    default=200,
    show_default=True,
    help="Bootstrap resamples (all distinct ones are enumerated when fewer).",
)
@click.option("--level", type=float, default=0.9, show_default=True, help="Band coverage.")
@_band_option
@click.option("--no-backtest", is_flag=True, help="Skip the leave-largest-rung-out backtest.")
@click.option(
    "--independent-e", is_flag=True, help="Fit E separately at every schedule fraction (default: shared)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the fit, the forecast and the backtest as JSON.")
@quiet_option("No progress bar (the bootstrap and held-out rounds of the fit and the backtest).")
def fit_cmd(
    name,
    runs_dir,
    db,
    target,
    fix_e,
    dataset,
    n_boot,
    level,
    band,
    no_backtest,
    independent_e,
    as_json,
    quiet,
):
    """Fit ladder NAME; backtest it; forecast a target's whole eval-loss curve."""
    from observatory.ladder.backtest import backtest, compare  # lazy for start-up time: scipy
    from observatory.ladder.fit import fit_ladder

    cfg = _config(fix_e, n_boot, level, independent_e, band)
    rungs, targets, ds = _load(db, name, dataset)
    try:
        with bar("fit", quiet, unit="rounds") as progress:
            fit = fit_ladder(rungs, cfg, name=name, progress=progress)
        bt = None
        if not no_backtest and len(rungs) >= 4:
            with bar("backtest", quiet, unit="rounds") as progress:
                bt = backtest(rungs, cfg, name=name, progress=progress)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    spec = None
    if target is not None:
        with connect(db) as con:
            try:
                spec = target_spec(con, target)
            except ValueError as e:
                raise click.ClickException(str(e)) from None
    elif len(targets) == 1 and isinstance(targets[0]["ladder"].get("flops"), (int, float)):
        t = targets[0]
        spec = {
            "run": t["run"],
            "flops": float(t["ladder"]["flops"]),
            "steps": t["steps"],
            "curve": t["curve"],
        }
    fc = rows = None
    if spec is not None:
        fc = fit.forecast(spec["flops"], spec["steps"])
        rows = compare(fc, spec.get("curve") or {})
    if as_json:
        out = {
            "fit": fit.summary(),
            "dataset": ds,
            "backtest": bt.as_dict() if bt else None,
            "forecast": None
            if fc is None
            else {
                "target": spec.get("run"),
                "flops": spec["flops"],
                "steps": spec["steps"],
                "points": rows,
                "final_inside": _final_inside(rows),
            },
        }
        click.echo(json.dumps(out, indent=2, default=_json_default))
        return
    _print_fit(fit, ds)
    if bt is not None:
        click.echo(
            f"\nbacktest: leave the largest rung ({bt.held_out}) out, forecast its curve from the others"
        )
        click.echo(
            f"  final loss: predicted {bt.final_pred:.4f} [{bt.final_low:.4f}, {bt.final_high:.4f}], "
            f"observed {bt.final_obs:.4f}, error {bt.final_error_pct:+.2f}%"
        )
        click.echo(
            f"  curve points inside the {cfg.level:.0%} band: {bt.coverage:.0%} "
            f"({sum(bool(p['inside']) for p in bt.points)}/{sum(p['inside'] is not None for p in bt.points)})"
        )
    if fc is not None:
        click.echo(
            f"\nforecast for {spec.get('run') or target}: C={spec['flops']:.3g} FLOPs, {spec['steps']} steps"
        )
        click.echo(f"  {'frac':>5} {'step':>6} {'value':>8} {'low':>8} {'high':>8} {'observed':>9}")
        for r in rows:
            mark = "" if r["inside"] is None else ("  in" if r["inside"] else "  OUT")
            click.echo(
                f"  {r['fraction']:>5.2f} {_fmt(r['step'], 'd'):>6} {r['value']:>8.4f} {r['low']:>8.4f} "
                f"{r['high']:>8.4f} {_fmt(r['observed']):>9}{mark}"
            )
        fin = _final_inside(rows)
        if fin is not None:
            click.echo(f"  target's final loss {'inside' if fin else 'OUTSIDE'} its band")


def _final_inside(rows):
    if not rows:
        return None
    last = max(rows, key=lambda r: r["fraction"])
    return last["inside"]


def _json_default(o):
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def _print_fit(fit, ds):
    s = fit.summary()
    fin = s["final"]
    click.echo(f"ladder {fit.name}: {len(fit.rungs)} rungs, eval dataset {ds}, fit {s['fit_version']}")
    click.echo(f"  L(C) = {fin['E']:.4f} + {fin['A']:.4g} * C^-{fin['alpha']:.4f}   (final eval loss)")
    click.echo(
        f"  run-to-run noise {100 * fit.noise:.2f}% (1 sigma; from {fit.noise_source}); "
        "a rung of several seeds is their mean"
    )
    click.echo(
        f"  {'rung':>8} {'run':>26} {'seeds':>5} {'active':>10} {'FLOPs':>10} {'final':>8} {'fit':>8} "
        f"{'fwd err':>8} {'LOO err':>8}"
    )
    click.echo(
        "  (fwd err: the rung predicted from the smaller rungs only; LOO err: from all the others;"
        f" the band uses {'fwd' if fit.config.loo == 'forward' else fit.config.loo})"
    )

    def pct(e):
        return "-" if e is None else f"{100 * (math.exp(e) - 1):+.2f}%"

    for r in fit.rungs:
        pred = float(fit.final(r.flops))
        click.echo(
            f"  {r.rung:>8} {r.run:>26} {r.n_seeds:>5} {_fmt(r.params_active, ',d'):>10} {r.flops:>10.3g} "
            f"{_fmt(r.final_loss):>8} {pred:>8.4f} {pct(s['forward_final'].get(r.rung)):>8} "
            f"{pct(s['loo_final'].get(r.rung)):>8}"
        )


@ladder.command("forecast")
@click.argument("name")
@common_options
@click.option(
    "--target", "target", required=True, metavar="RUN", help="Run id of the target (need not exist yet)."
)
@click.option("--flops", type=float, default=None, help="The target's training compute C (FLOPs).")
@click.option(
    "--steps", type=int, default=None, help="The target's optimizer steps (places the curve points)."
)
@click.option(
    "--spec",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML/JSON file with flops and steps (`trainer ladder --plan` prints one).",
)
@click.option("--fix-e", type=float, default=None, help="Hold the irreducible loss E at this value.")
@click.option("--dataset", default=None, help="Eval dataset (default: the one the rungs log most).")
@click.option("--n-boot", type=int, default=200, show_default=True)
@click.option("--level", type=float, default=0.9, show_default=True)
@_band_option
@click.option("--dry-run", is_flag=True, help="Print the event instead of writing it.")
def forecast_cmd(
    name, runs_dir, db, target, flops, steps, spec, fix_e, dataset, n_boot, level, band, dry_run
):
    """Pre-register TARGET's forecast: write a `forecast` event (host 1000) into its run folder.

    Run this before the target starts; the event's time then precedes its run_start.
    """
    from observatory.ladder.fit import fit_ladder  # lazy for start-up time: scipy

    if not RUN_ID_RE.match(target):
        raise click.BadParameter(
            f"{target!r} is not a run id ([A-Za-z0-9._-]{{1,128}})", param_hint="--target"
        )
    cfg = _config(fix_e, n_boot, level, band=band)
    if flops is None:
        with connect(db) as con:
            try:
                s = target_spec(con, str(spec) if spec else target)
            except ValueError as e:
                raise click.ClickException(
                    f"{e}; give --flops and --steps (or --spec) for a target that has not started"
                ) from None
        flops, steps = s["flops"], steps or s["steps"]
    if not (flops > 0):
        raise click.BadParameter(f"must be > 0, got {flops}", param_hint="--flops")
    rungs, _, ds = _load(db, name, dataset)
    try:
        fit = fit_ladder(rungs, cfg, name=name)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    fc = fit.forecast(flops, steps)
    data = forecast_event_data(fit, fc, ds, pre_registered=not run_started(runs_dir, target))
    if dry_run:
        click.echo(json.dumps(data, indent=2, default=_json_default))
        return
    if not data["pre_registered"]:
        click.echo(
            f"warning: run {target} has already started; this forecast is NOT pre-registered", err=True
        )
    path = write_forecast(runs_dir, target, data)
    fin = fc.final
    click.echo(
        f"forecast for {target}: final eval loss {fin.value:.4f} [{fin.low:.4f}, {fin.high:.4f}] "
        f"at step {fin.step}; {len(fc.points)} curve points; written to {path}"
    )


@ladder.command("check")
@click.argument("runs", nargs=-1)
@common_options
@click.option("--k", type=int, default=None, help="Consecutive evals outside the band (default: setting).")
def check_cmd(runs, runs_dir, db, k):
    """Compare target runs' evals with their forecast bands; write `ladder_deviation` anomalies.

    Idempotent: an excursion already reported is not written again. Ingest afterwards
    to see the new anomalies in the store.
    """
    found = check_targets(db, runs_dir, list(runs) or None, **({} if k is None else {"k": k}))
    for a in found:
        click.echo(f"{a['run']}: [{a['severity']}] {a['message']}")
    if not found:
        click.echo("no new deviations", err=True)
    sys.stdout.flush()
