"""`observatory ladder`: fit scaling ladders, backtest them, pre-register a target's forecast, watch it.

observatory ladder import FILE.csv|FILE.json ...
observatory ladder list
observatory ladder fit NAME [--target RUN_OR_FILE] [--fix-e E] [--e-range LO HI] [--noise S] [--json]
observatory ladder forecast NAME (--flops C | --tokens D --params N) [--json]
observatory ladder forecast NAME --target RUN [--flops C --steps S | --spec FILE]
observatory ladder check [RUN ...]
"""

from __future__ import annotations

import json
import math
import sys
from collections import Counter
from pathlib import Path
from urllib.parse import quote

import click
import numpy as np

from observatory import bucket, settings
from observatory.commands import bucket_options, common_options
from observatory.commands.progress import bar, quiet_option
from observatory.events import RUN_ID_RE
from observatory.ladder.watch import (
    check_targets,
    forecast_event_data,
    load_ladder,
    rejected_runs_warnings,
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


def _config(fix_e, n_boot, level, independent_e=False, band="forward", e_range=None, noise=None):
    from observatory.ladder.fit import FitConfig  # lazy for start-up time: scipy

    try:
        return FitConfig(
            fix_e=fix_e,
            n_boot=n_boot,
            level=level,
            shared_e=not independent_e,
            loo=band,
            e_range=tuple(e_range) if e_range else None,
            noise=noise,
        )
    except ValueError as e:
        raise click.UsageError(str(e)) from None


def _band_options(f):
    """--fix-e, --e-range and --noise: what the fit and its band assume."""
    f = click.option(
        "--noise",
        type=float,
        default=None,
        metavar="SIGMA",
        help="Run-to-run noise of one run's eval loss, relative, 1 sigma (e.g. 0.003). Default: "
        "measured from the rungs' seeds, else 0.3% (said as 'default').",
    )(f)
    f = click.option(
        "--e-range",
        type=float,
        nargs=2,
        default=None,
        metavar="LO HI",
        help="The range E lies in (a prior): the fit is repeated with E held across it and the band "
        "is their envelope. With --fix-e, the forecast is the fit at that E.",
    )(f)
    return click.option(
        "--fix-e", type=float, default=None, help="Hold the irreducible loss E at this value."
    )(f)


_band_option = click.option(
    "--band",
    type=click.Choice(["forward", "max", "rms", "none"]),
    default="forward",
    show_default=True,
    help="Held-out-rung error the bootstrap band is widened by: forward (the largest rung predicted from the "
    "smaller ones), max or rms of the leave-one-rung-out errors, or none.",
)


def _load(db, name, dataset):
    """The ladder's rungs, targets and dataset; run folders of it that ingest rejected are warned about."""
    with connect(db) as con:
        try:
            out = load_ladder(con, name, dataset)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        for w in rejected_runs_warnings(con, name):
            click.secho(f"warning: {w}", fg="yellow", err=True)
    return out


def _warn(fit) -> None:
    for w in fit.warnings:
        click.secho(f"warning: {w}", fg="yellow", err=True)


def _noise_text(fit) -> str:
    src = {
        "given": "given with --noise",
        "default": "the default: no seeds to measure it from; --noise sets it",
    }
    return f"run-to-run noise {100 * fit.noise:.2f}% (1 sigma; {src.get(fit.noise_source, 'from ' + fit.noise_source)})"


def _band_text(fit) -> str:
    held = {
        "measured": "held-out rung error measured",
        "proxy": "held-out error NOT measurable (as many free "
        "parameters as rungs): widened by the E = 0 law's error instead",
        "none": "no band",
    }[fit.held_out]
    if fit.e_fits:
        lo, hi = fit.config.e_range
        held += f"; E across [{lo:g}, {hi:g}] ({len(fit.e_fits) + 1} fits, the band their envelope)"
    return held


@click.group("ladder")
def ladder():
    """Fit scaling ladders and forecast target runs.

    A ladder is every run whose run_start has `ladder.name` (rungs), plus targets
    (`ladder.target: true`). The fit is L(C) = E + A C^-alpha on each rung's eval
    loss at every 5% of its schedule (Huber on log residuals, E shared across
    fractions), with a band from a bootstrap over whole rungs widened by the
    forward error (the largest rung predicted from the smaller rungs). Runs with the same `ladder.rung` are seeds of one
    rung: the fit averages them and their spread is the run-to-run noise. `ladder import` brings
    a table of published points in as runs; `ladder forecast --flops C` forecasts a run that
    does not exist (docs/ladder.md).
    """


@ladder.command("import")
@click.argument(
    "files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@bucket_options
@click.option("--no-ingest", is_flag=True, help="Write the event logs but do not update the store.")
@click.option(
    "--replace",
    is_flag=True,
    help="Overwrite runs imported earlier from other numbers (the store is then rebuilt).",
)
def import_cmd(files, runs_dir, db, no_ingest, replace):
    """Import a table of ladder points (CSV or JSON): one run per rung and seed, as event logs.

    Columns: ladder, rung, flops, loss; optional tokens, params, seed, step or fraction (a point
    of the curve; neither: the final loss), steps, dataset, source, target (a held-out run; its
    loss may be empty) and run (the run id). Every problem is named by row and field, and a
    table with one writes nothing. The store is then updated (see docs/ladder.md).
    """
    from observatory.interop import ingest_runs
    from observatory.interop.ladder_points import PointsError, import_points

    results = []
    for f in files:
        try:
            with bucket.staged(runs_dir) as local:  # a bucket's runs: written here, then uploaded as chunks
                res = import_points(f, local, ingest=False, replace=replace)
        except PointsError as e:
            raise click.ClickException(f"{f}: {e}") from None
        states = ", ".join(f"{n} {s}" for s, n in sorted(Counter(res.runs.values()).items()))
        click.echo(
            f"{f}: {len(res.runs)} run(s) of ladder(s) {', '.join(res.ladders)} in {bucket.safe(str(runs_dir))} ({states or 'none'})"
            + (f"; {len(res.targets)} target(s) without a loss" if res.targets else "")
        )
        results.append(res)
    written = {s for r in results for s in r.runs.values()}
    if no_ingest:
        click.echo(
            "next: observatory ingest"
            + (" (then rebuild: runs were replaced)" if "replaced" in written else "")
        )
    elif written - {"unchanged"}:
        report = ingest_runs(runs_dir, db, rebuild="replaced" in written)
        click.echo(f"store {db}: {report.summary()}")
    for name in sorted({n for r in results for n in r.ladders}):
        click.echo(f"next: observatory ladder fit {name}")
    for t in (t for r in results for t in r.targets):
        click.echo(
            f"next: observatory ladder forecast {t['ladder']} --flops {t['flops']:.6g}   # target {t['rung']}"
        )


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
@_band_options
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
def fit_cmd(name, runs_dir, db, target, dataset, no_backtest, independent_e, as_json, quiet, **fit_options):
    """Fit ladder NAME; backtest it; forecast a target's whole eval-loss curve."""
    from observatory.ladder.backtest import backtest, compare  # lazy for start-up time: scipy
    from observatory.ladder.fit import fit_ladder

    cfg = _config(independent_e=independent_e, **fit_options)  # --fix-e, --e-range, --noise, --band, ...
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
    _warn(fit)
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
            + (
                ""
                if bt.held_out_basis == "measured"
                else f" (band: {'no band' if bt.held_out_basis == 'none' else 'held-out error not measurable, widened'}"
                f": {bt.warnings[-1] if bt.warnings else ''})"
            )
        )
        click.echo(
            f"  final loss: predicted {bt.final_pred:.4f} [{_fmt(bt.final_low)}, {_fmt(bt.final_high)}], "
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
                f"  {r['fraction']:>5.2f} {_fmt(r['step'], 'd'):>6} {r['value']:>8.4f} {_fmt(r['low']):>8} "
                f"{_fmt(r['high']):>8} {_fmt(r['observed']):>9}{mark}"
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
    click.echo(f"  {_noise_text(fit)}; a rung of several seeds is their mean")
    click.echo(f"  band: {_band_text(fit)}")
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
@click.option("--flops", type=float, default=None, help="The run's training compute C (FLOPs).")
@click.option(
    "--tokens",
    type=float,
    default=None,
    help="The run's training tokens D (with --params: C = k*N*D, k from the rungs, else 6).",
)
@click.option(
    "--params",
    type=float,
    default=None,
    help="The run's (active) parameters N; alone, D follows the rungs' tokens per parameter.",
)
@click.option(
    "--target",
    "target",
    default=None,
    metavar="RUN",
    help="Pre-register the forecast for this run id: write a `forecast` event into its folder "
    "(its flops and steps from the store when it has started). Without it, only print.",
)
@click.option(
    "--steps", type=int, default=None, help="The target's optimizer steps (places the curve points)."
)
@click.option(
    "--spec",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML/JSON file with flops and steps (`trainer ladder --plan` prints one).",
)
@_band_options
@click.option("--dataset", default=None, help="Eval dataset (default: the one the rungs log most).")
@click.option("--n-boot", type=int, default=200, show_default=True)
@click.option("--level", type=float, default=0.9, show_default=True)
@_band_option
@click.option("--dry-run", is_flag=True, help="With --target: print the event instead of writing it.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print the forecast (value, band, noise, curve) as JSON."
)
def forecast_cmd(
    name, runs_dir, db, flops, tokens, params, target, steps, spec, dataset, dry_run, as_json, **fit_options
):
    """Forecast the final eval loss (and its band) of a run of ladder NAME that need not exist.

    Give its compute (--flops, or --tokens and/or --params). With --target, pre-register it:
    write a `forecast` event (host 1000) into that run's folder, before the run starts.
    """
    from observatory.ladder.fit import fit_ladder  # lazy for start-up time: scipy

    if target is not None and not RUN_ID_RE.match(target):
        raise click.BadParameter(
            f"{target!r} is not a run id ([A-Za-z0-9._-]{{1,128}})", param_hint="--target"
        )
    cfg = _config(**fit_options)  # --fix-e, --e-range, --noise, --band, --n-boot, --level
    rungs, _, ds = _load(db, name, dataset)
    how = "--flops"
    if flops is not None and (tokens is not None or params is not None):
        raise click.UsageError("give --flops, or --tokens/--params, not both")
    if flops is None and (tokens is not None or params is not None):
        flops, how = _flops_from(rungs, tokens, params)
    if flops is None and target is None and spec is None:
        raise click.UsageError(
            "give the run's compute: --flops C, or --tokens D and/or --params N "
            "(or --target RUN / --spec FILE for a planned run)"
        )
    if flops is None:
        with connect(db) as con:
            try:
                s = target_spec(con, str(spec) if spec else target)
            except ValueError as e:
                raise click.ClickException(
                    f"{e}; give --flops and --steps (or --spec) for a target that has not started"
                ) from None
        flops, steps, how = s["flops"], steps or s["steps"], "--spec" if spec else f"run {target}"
    if not (flops > 0 and math.isfinite(flops)):
        raise click.BadParameter(f"must be > 0, got {flops}", param_hint="--flops")
    try:
        fit = fit_ladder(rungs, cfg, name=name)
    except ValueError as e:
        raise click.ClickException(str(e)) from None
    _warn(fit)
    fc = fit.forecast(flops, steps)
    fin = fc.final
    if target is None:
        _print_forecast(fit, fc, ds, how, as_json)
        return
    if not fit.has_band:
        raise click.ClickException(f"no band to pre-register for {target}: {fit.warnings[-1]}")
    data = forecast_event_data(fit, fc, ds, pre_registered=not run_started(runs_dir, target))
    if dry_run or as_json:
        click.echo(json.dumps(data, indent=2, default=_json_default))
        if dry_run:
            return
    if not data["pre_registered"]:
        click.echo(
            f"warning: run {target} has already started; this forecast is NOT pre-registered", err=True
        )
    path = write_forecast(runs_dir, target, data)
    click.echo(
        f"forecast for {target}: final eval loss {fin.value:.4f} [{fin.low:.4f}, {fin.high:.4f}] "
        f"at step {fin.step}; {len(fc.points)} curve points; written to {path}",
        err=as_json,
    )


def _flops_from(rungs, tokens, params) -> tuple[float, str]:
    """C from --tokens/--params the way the rungs relate them: C = k*N*D with k the rungs' median
    flops / (N*D) (else 6), and a missing N or D from the rungs' median tokens per parameter."""
    both = [r for r in rungs if r.tokens and r.params_active]
    k = float(np.median([r.flops / (r.tokens * r.params_active) for r in both])) if both else 6.0
    for v, opt in ((tokens, "--tokens"), (params, "--params")):
        if v is not None and not (v > 0 and math.isfinite(v)):
            raise click.BadParameter(f"must be > 0, got {v}", param_hint=opt)
    if tokens is None or params is None:
        if not both:
            raise click.UsageError(
                "the rungs carry no tokens and params (ladder.tokens, ladder.params_active), so "
                "one of --tokens/--params cannot give the other: give both, or --flops"
            )
        ratio = float(np.median([r.tokens / r.params_active for r in both]))
        tokens = tokens if tokens is not None else ratio * params
        params = params if params is not None else tokens / ratio
        how = f"N={params:.3g}, D={tokens:.3g} at the rungs' {ratio:.3g} tokens per parameter"
    else:
        how = f"N={params:.3g}, D={tokens:.3g}"
    return k * params * tokens, f"{how}; C = {k:.3g}·N·D" + ("" if both else " (no rungs to calibrate k on)")


def _nan_none(x):
    return None if x is None or not math.isfinite(x) else x


def _print_forecast(fit, fc, ds, how, as_json) -> None:
    fin = fc.final
    if as_json:
        out = {
            "ladder": fit.name,
            "dataset": ds,
            "flops": fc.flops,
            "flops_from": how,
            "steps": fc.steps,
            "value": fin.value,
            "low": _nan_none(fin.low),
            "high": _nan_none(fin.high),
            "level": fit.config.level,
            "noise": {"value": fit.noise, "source": fit.noise_source},
            **{k: v for k, v in fit.summary().items() if k in ("band", "final", "fit_version")},
            "points": [
                {
                    "fraction": p.fraction,
                    "step": p.step,
                    "value": p.value,
                    "low": _nan_none(p.low),
                    "high": _nan_none(p.high),
                }
                for p in fc.points
            ],
        }
        click.echo(json.dumps(out, indent=2, default=_json_default))
        return
    click.echo(f"ladder {fit.name}: forecast at C={fc.flops:.4g} FLOPs ({how}), eval dataset {ds}")
    if fit.has_band:
        click.echo(
            f"  final eval loss {fin.value:.4f}, {fit.config.level:.0%} band [{fin.low:.4f}, {fin.high:.4f}] "
            f"({100 * (fin.low / fin.value - 1):+.1f}% / {100 * (fin.high / fin.value - 1):+.1f}%)"
        )
    else:
        click.echo(f"  final eval loss {fin.value:.4f}, no band (see the warning)")
    click.echo(f"  {_noise_text(fit)}")
    click.echo(f"  band: {_band_text(fit)}")
    fl = fit.final
    click.echo(f"  fit: L(C) = {fl.E:.4f} + {fl.a_abs:.4g} * C^-{fl.alpha:.4f} on {len(fit.rungs)} rungs")
    base = settings.get("public_url").rstrip("/")
    click.echo(f"  on the dashboard: {base}/ladder?ladder={quote(fit.name)}&flops={fc.flops:.6g}")


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
