"""`observatory isoflop` and `observatory sweep ...`: many-run views over a selection, for scripts.

Each is the CLI/JSON twin of a view of the Sweeps page: `sweep runs` (the selection), `sweep curves`
(group curves), `sweep table` (final-value pivot), `sweep values` (scatter and parallel coordinates),
`isoflop` (iso-FLOP fit) and `sweep compare` (a variant against a baseline). SELECTION is the page's
`sel` URL parameter (docs/ladder.md: the selection language).
"""

from __future__ import annotations

import json
import math

import click

from observatory.commands import common_options
from observatory.store import StoreBusy, connect

__all__ = ["isoflop", "sweep"]

_metric = click.option(
    "--metric",
    required=True,
    help="A metric name (its last value), or eval:DATASET (that dataset's last eval loss).",
)
_best = click.option("--best", is_flag=True, help="The lowest value instead of the last.")
_json = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


def _echo_json(obj) -> None:
    from observatory.ladder.isoflop import finite_json  # a NaN loss is logged data: JSON null, not NaN

    click.echo(json.dumps(finite_json(obj), indent=1, default=str, allow_nan=False))


def _g(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.4g}"


def _with_store(db, fn):
    from observatory.queries.selection import SelectionError

    try:
        with connect(db) as con:
            return fn(con)
    except (SelectionError, StoreBusy) as e:
        raise click.ClickException(str(e)) from None


@click.command("isoflop")
@click.argument("selection")
@common_options
@_metric
@click.option("--budget", type=float, help="Recommend (params, tokens) for this compute budget (FLOPs).")
@click.option(
    "--noise", type=float, help="A cell's loss sd (e.g. the seeds' spread); default: the fits' residuals."
)
@click.option("--level", type=float, default=0.9, show_default=True, help="Interval coverage.")
@click.option("--n-boot", type=int, default=1000, show_default=True, help="Bootstrap draws.")
@_best
@_json
def isoflop(selection, runs_dir, db, metric, budget, noise, level, n_boot, best, as_json):
    """Iso-FLOP fit of the SELECTION's runs: per budget the compute-optimal tokens, params and loss, the
    frontier N* ∝ C^a and D* ∝ C^b, and (--budget) a recommendation, each with its interval.

    observatory isoflop "ladder = isoflop-sim" --metric eval:eval --budget 1e19
    """
    from observatory.ladder.sweep import isoflop_view

    view = _with_store(
        db,
        lambda con: isoflop_view(
            con, selection, metric, budget=budget, noise=noise, level=level, n_boot=n_boot, best=best
        ),
    )
    if as_json:
        _echo_json(view)
        return
    fit = view["fit"]
    if fit is None:
        raise click.ClickException(view["message"])
    pct = round(100 * level)
    click.echo(
        f"{len(view['cells'])} cell(s) of {view['selected']} selected run(s), {metric}; {pct}% intervals"
    )
    for s in view["skipped"]:
        click.echo(f"  left out {s['run']}: {s['reason']}")
    click.echo(f"{'budget':>9} {'n':>3} {'tokens D*':>28} {'params N*':>28} {'loss':>22}  status")
    for b in fit["budgets"]:
        if b["tokens"] is None:
            click.echo(f"{_g(b['budget']):>9} {b['n']:>3}  {b['status']}: {b['message']}")
            continue
        click.echo(
            f"{_g(b['budget']):>9} {b['n']:>3} {_g(b['tokens']):>9} [{_g(b['tokens_lo'])}, {_g(b['tokens_hi'])}]"
            f"{'':>3} {_g(b['params']):>9} [{_g(b['params_lo'])}, {_g(b['params_hi'])}] ({b['params_from']})"
            f" {_g(b['loss']):>7} [{_g(b['loss_lo'])}, {_g(b['loss_hi'])}]  {b['status']}"
            + (f": {b['message']}" if b["message"] else "")
        )
    fr = fit["frontier"]
    if fr:
        click.echo(
            f"frontier over {fr['budgets']} budgets: N* ∝ C^{fr['a_n']:.3f} [{_g(fr['a_n_lo'])}, "
            f"{_g(fr['a_n_hi'])}], D* ∝ C^{fr['a_d']:.3f} [{_g(fr['a_d_lo'])}, {_g(fr['a_d_hi'])}]"
        )
    rec = fit["recommendation"]
    if rec:
        click.echo(
            f"at C = {_g(rec['budget'])}: params {_g(rec['params'])} [{_g(rec['params_lo'])}, "
            f"{_g(rec['params_hi'])}], tokens {_g(rec['tokens'])} [{_g(rec['tokens_lo'])}, "
            f"{_g(rec['tokens_hi'])}]" + (f" ({rec['note']})" if rec.get("note") else "")
        )
    for n in fit["notes"]:
        click.echo(n)
    click.echo(f"noise: {_g(fit['noise'])} ({fit['noise_from']})")


@click.group("sweep")
def sweep():
    """Many-run views over a SELECTION (the Sweeps page's views, as text or JSON)."""


@sweep.command("runs")
@click.argument("selection", default="")
@common_options
@click.option("--limit", type=int, default=1000, show_default=True)
@_json
def runs_cmd(selection, runs_dir, db, limit, as_json):
    """The selected runs (restarts folded into their run), newest first."""
    from observatory.queries.sweeps import count_selected, select_runs

    rows, n = _with_store(
        db, lambda con: (select_runs(con, selection, limit), count_selected(con, selection))
    )
    if as_json:
        _echo_json({"selected": n, "runs": rows})
        return
    click.echo(f"{n} run(s) selected" + (f", showing {len(rows)}" if len(rows) < n else ""))
    for r in rows:
        more = (
            f" (+{len(r['attempts']) - 1} restart(s), newest {r['last']})" if len(r["attempts"]) > 1 else ""
        )
        click.echo(
            f"{r['run']:<40} {r['status'] or '-':<10} {r['project'] or '-':<12} {r['name'] or ''}{more}"
        )


@sweep.command("values")
@click.argument("selection")
@common_options
@_metric
@click.option("--key", "keys", multiple=True, help="A config key to show (repeat; e.g. config.optimizer.lr).")
@_best
@_json
def values_cmd(selection, runs_dir, db, metric, keys, best, as_json):
    """One metric's final (or best) value per selected run with config keys (scatter, parallel coordinates)."""
    from observatory.queries.sweeps import final_values

    got = _with_store(db, lambda con: final_values(con, selection, metric, keys, best))
    if as_json:
        _echo_json(got)
        return
    click.echo(f"{len(got['rows'])} of {got['selected']} selected run(s) logged {metric}")
    for r in got["rows"]:
        ks = "  ".join(f"{k}={v}" for k, v in r["keys"].items())
        click.echo(f"{r['run']:<40} {_g(r['value']):>10}  {ks}")


@sweep.command("table")
@click.argument("selection")
@common_options
@_metric
@click.option("--rows", "row_key", required=True, help="Config key of the table's rows.")
@click.option("--cols", "col_key", required=True, help="Config key of its columns.")
@_best
@_json
def table_cmd(selection, runs_dir, db, metric, row_key, col_key, best, as_json):
    """One metric's final (or best) value pivoted by two config keys (a cell with several runs: their mean)."""
    from observatory.ladder.sweep import pivot
    from observatory.queries.sweeps import final_values

    got = _with_store(db, lambda con: final_values(con, selection, metric, [row_key, col_key], best))
    pv = pivot(got["rows"], row_key, col_key)
    if as_json:
        _echo_json(pv)
        return
    click.echo(f"{metric}: rows {row_key}, columns {col_key}")
    click.echo(f"{'':>12} " + " ".join(f"{c[:12]:>12}" for c in pv["cols"]))
    for r in pv["rows"]:
        cells = []
        for c in pv["cols"]:
            vs = [x["value"] for x in pv["cells"][r][c] if x["value"] is not None]
            cells.append(_g(sum(vs) / len(vs)) if vs else "-")
        click.echo(f"{r[:12]:>12} " + " ".join(f"{x:>12}" for x in cells))


@sweep.command("curves")
@click.argument("selection")
@common_options
@_metric
@click.option("--by", "keys", multiple=True, help="Group by this config key (at most twice).")
@click.option(
    "--x", "x", type=click.Choice(["step", "tokens", "flops", "time"]), default="step", show_default=True
)
@click.option("--max-groups", type=int, default=12, show_default=True)
@click.option("--points", type=int, default=200, show_default=True, help="x buckets per curve.")
@_json
def curves_cmd(selection, runs_dir, db, metric, keys, x, max_groups, points, as_json):
    """Group curves: per group and x bucket the mean, sd, min, max and n over the group's runs."""
    from observatory.queries.sweeps import group_curves

    if len(keys) > 2:
        raise click.BadParameter("at most two --by keys", param_hint="--by")
    g = _with_store(db, lambda con: group_curves(con, selection, metric, keys, x, max_groups, points))
    data = g.pop("data")
    if as_json:
        _echo_json({**g, "points": [] if data is None else data.to_dicts()})
        return
    click.echo(
        f"{g['runs']} run(s) in {g['matched_groups']} group(s)"
        + (f"; drawing the {len(g['groups'])} largest" if len(g["groups"]) < g["matched_groups"] else "")
    )
    if data is None:
        return
    for grp in g["groups"]:
        d = data.filter(data["group"] == grp["group"])
        if d.height:
            last = d.row(-1, named=True)
            click.echo(
                f"{grp['group']:<30} n={grp['n']:<4} last {x}={_g(last['x'])}: mean {_g(last['mean'])} "
                f"sd {_g(last['sd'])} [{_g(last['min'])}, {_g(last['max'])}]"
            )


@sweep.command("compare")
@click.argument("baseline")
@click.argument("variant")
@common_options
@_metric
@click.option("--level", type=float, default=0.9, show_default=True, help="Interval coverage.")
@_best
@click.option("--record", "title", help="Save the result as a decision record with this title.")
@_json
def compare_cmd(baseline, variant, runs_dir, db, metric, level, best, title, as_json):
    """A VARIANT selection against a BASELINE selection: both loss-vs-compute envelopes and the variant's
    effective compute multiplier at the baseline's best loss, with its interval."""
    from observatory.ladder.sweep import compare_view, record_comparison

    view = _with_store(db, lambda con: compare_view(con, baseline, variant, metric, level=level, best=best))
    if title:
        from observatory.pipeline import ingest

        try:
            d = record_comparison(runs_dir, db, view, title, ingest=ingest)
        except ValueError as e:
            raise click.ClickException(str(e)) from None
        view["decision"] = d.id
    if as_json:
        _echo_json(view)
        return
    if view["multiplier"] is None:
        raise click.ClickException(view["message"])
    click.echo(
        f"the variant {view['text']} ({metric}, at the baseline's loss {_g(view['multiplier']['loss'])})"
    )
    if view["message"]:
        click.echo(view["message"])
    if title:
        click.echo(f"recorded as decision {view['decision']}")
