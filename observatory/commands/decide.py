"""`observatory decide new|update|show|list|export|import` and `observatory lineage RUN`.

    observatory decide new --title "Enable z-loss" --kind intervention --run d512@1200 \\
        --trigger-metric grad/norm/total --trigger-rule "> 4 for 50 steps" --action "z_loss=1e-4"
    observatory decide new plan.md              # front matter + '## Hypothesis' sections
    observatory decide update enable-z-loss --status running --at 2026-11-29T14:11:45Z
    observatory decide list --status running --json
    observatory decide export decisions/ && observatory decide import decisions/
"""

from __future__ import annotations

import functools
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from observatory import decisions as dec
from observatory import lineage as lin
from observatory.commands import common_options
from observatory.decisions import markdown as decisions_md
from observatory.pipeline import ingest

__all__ = ["decide", "lineage"]


def fmt_time(t: float | None) -> str:
    """`observatory.report.format.fmt_time`, loaded when first needed: the report package is heavy
    and every command loads this module (start-up time)."""
    from observatory.report.format import fmt_time as fmt  # lazy for start-up time

    return fmt(t)


def _fail(e: Exception) -> click.ClickException:
    return click.ClickException(str(e))


def _echo_written(d: dec.Decision, as_json: bool, text: str) -> None:
    """What `new` and `update` print: the record as JSON, or one line."""
    click.echo(json.dumps(d.to_dict(), indent=2, sort_keys=True) if as_json else text)


def _parse_at(ctx, param, value: str | None) -> float | None:
    """`--at 2026-11-29T14:11:45Z` as Unix seconds (a time without a zone is UTC)."""
    if value is None:
        return None
    try:
        t = datetime.fromisoformat(value.strip())
    except ValueError:
        raise click.BadParameter(
            f"{value!r}: expected an ISO 8601 time such as 2026-11-29T14:11:45Z", param_hint="--at"
        ) from None
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp()


def _record_options(f):
    """Flags shared by `new` and `update`: one per Decision field, then --runs-dir/--db and --json."""
    opts = [
        click.option("--title"),
        click.option("--kind", type=click.Choice(dec.KINDS)),
        click.option("--status", type=click.Choice(dec.STATUSES)),
        click.option("--hypothesis"),
        click.option("--goal"),
        click.option("--forecast-metric", help="pre-registered forecast: metric, e.g. eval/loss"),
        click.option("--forecast-value", type=float, help="pre-registered forecast: predicted value"),
        click.option("--forecast-assumptions"),
        click.option("--trigger-metric", help="interventions: the metric or signal that set it off"),
        click.option("--trigger-rule", help="e.g. '> mean + 6 sigma over 128 steps'"),
        click.option("--trigger-step", type=click.IntRange(min=0)),
        click.option("--action", help="what is done: skip batches, roll back to step X, lower LR, z-loss..."),
        click.option(
            "--alternative", "alternatives", multiple=True, help="an alternative considered (repeat)"
        ),
        click.option("--run", "runs", multiple=True, metavar="RUN[@STEP]", help="a linked run (repeat)"),
        click.option(
            "--config-change",
            "config_changes",
            multiple=True,
            metavar="KEY=[OLD, NEW]",
            help="a config diff entry, value in YAML (repeat)",
        ),
        click.option("--evidence", multiple=True, help="a link or note backing the decision (repeat)"),
        click.option("--cost-steps", type=click.IntRange(min=0)),
        click.option("--cost-tokens", type=click.IntRange(min=0)),
        click.option("--cost-hours", type=click.FloatRange(min=0)),
        click.option("--outcome"),
        click.option("--follow-up", "follow_up"),
        click.option("--author"),
        click.option(
            "--at",
            "at",
            callback=_parse_at,
            metavar="ISO-TIME",
            help="when the decision was made or changed (ISO 8601, UTC unless a zone is given); default now",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return click.option("--json", "as_json", is_flag=True, help="print the record as JSON")(common_options(f))


def _parse_change(text: str) -> tuple[str, list]:
    key, eq, raw = text.partition("=")
    if not eq or not key.strip():
        raise click.BadParameter(f"{text!r}: expected KEY=[OLD, NEW]", param_hint="--config-change")
    import yaml  # lazy: start-up time of every command

    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as e:
        raise click.BadParameter(f"{text!r}: {e}", param_hint="--config-change") from None
    if not isinstance(value, list) or len(value) != 2:
        raise click.BadParameter(f"{text!r}: the value must be [old, new]", param_hint="--config-change")
    return key.strip(), value


def _fields_from_flags(opts: dict[str, Any], base: dec.Decision | None) -> dict[str, Any]:
    """Decision fields set on the command line. On update, list flags add to what is there."""
    out: dict[str, Any] = {}
    for name in ("title", "kind", "status", "hypothesis", "goal", "action", "outcome", "follow_up", "author"):
        if opts.get(name) is not None:
            out[name] = opts[name]
    fc = {k: opts.get(f"forecast_{k}") for k in ("metric", "value", "assumptions")}
    if any(v is not None for v in fc.values()):
        prev = base.forecast.to_dict() if base and base.forecast else {}
        out["forecast"] = {**prev, **{k: v for k, v in fc.items() if v is not None}}
    tr = {k: opts.get(f"trigger_{k}") for k in ("metric", "rule", "step")}
    if any(v is not None for v in tr.values()):
        prev = base.trigger.to_dict() if base and base.trigger else {}
        out["trigger"] = {**prev, **{k: v for k, v in tr.items() if v is not None}}
    cost = {k: opts.get(f"cost_{k}") for k in ("steps", "tokens", "hours")}
    if any(v is not None for v in cost.values()):
        prev = base.cost.to_dict() if base and base.cost else {}
        out["cost"] = {**prev, **{k: v for k, v in cost.items() if v is not None}}
    try:
        if opts.get("runs"):
            links = [dec.parse_run_link(r) for r in opts["runs"]]
            prev = list(base.runs) if base else []
            out["runs"] = prev + [link for link in links if link not in prev]
    except ValueError as e:
        raise click.BadParameter(str(e), param_hint="--run") from None
    if opts.get("alternatives"):
        out["alternatives"] = (list(base.alternatives) if base else []) + list(opts["alternatives"])
    if opts.get("evidence"):
        out["evidence"] = (list(base.evidence) if base else []) + list(opts["evidence"])
    if opts.get("config_changes"):
        diff = dict(base.config_diff) if base else {}
        diff.update(_parse_change(c) for c in opts["config_changes"])
        out["config_diff"] = diff
    return out


def _print_decision(d: dec.Decision, events: list[dict] | None = None) -> None:
    click.echo(f"{d.id}  [{d.kind}, {d.status}]  {d.title}")
    click.echo(f"  author {d.author or '-'}   created {fmt_time(d.created)}   updated {fmt_time(d.updated)}")
    for name in ("hypothesis", "goal", "action", "outcome", "follow_up"):
        if getattr(d, name):
            click.echo(f"  {name.replace('_', '-')}: {getattr(d, name)}")
    if d.forecast:
        f = d.forecast
        click.echo(
            f"  forecast: {f.metric} = {f.value:g}" + (f"  ({f.assumptions})" if f.assumptions else "")
        )
    if d.trigger:
        t = d.trigger
        click.echo(f"  trigger: {t.metric} {t.rule}" + (f" at step {t.step}" if t.step is not None else ""))
    if d.runs:
        click.echo(
            "  runs: " + ", ".join(r.run + (f"@{r.step}" if r.step is not None else "") for r in d.runs)
        )
    for k, (old, new) in d.config_diff.items():
        click.echo(f"  config {k}: {old!r} -> {new!r}")
    for a in d.alternatives:
        click.echo(f"  alternative: {a}")
    for e in d.evidence:
        click.echo(f"  evidence: {e if isinstance(e, str) else json.dumps(e, sort_keys=True)}")
    if d.cost and d.cost.to_dict():
        click.echo("  cost: " + ", ".join(f"{k} {v:g}" for k, v in d.cost.to_dict().items()))
    if events:
        click.echo(f"  history ({len(events)} events):")
        for e in events:
            changed = ", ".join(k for k in e["data"] if k not in ("id", "updated", "created"))
            click.echo(f"    {fmt_time(e['t'])}  {e['run']}#{e['seq']}  {changed or '(no field changes)'}")


@click.group()
def decide():
    """Decision history: experiments, interventions and policies, as events."""


def _record_command(name: str, *params):
    """A `decide` command that writes a record: `params`, then the record flags (`_record_options`).

    The function returns the decision it wrote and the line to print; a ValueError it
    raises becomes the command's error message.
    """

    def wrap(fn):
        @functools.wraps(fn)
        def command(*args, as_json, **kwargs):
            try:
                d, text = fn(*args, **kwargs)
            except ValueError as e:
                raise _fail(e) from None
            _echo_written(d, as_json, text)

        f = _record_options(command)
        for param in reversed(params):
            f = param(f)
        return decide.command(name)(f)

    return wrap


@_record_command(
    "new",
    click.argument("file", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)),
    click.option("--id", "decision_id", help="defaults to a slug of the title"),
)
def new_cmd(file, decision_id, runs_dir, db, at, **opts):
    """Record a new decision from flags, or from a Markdown FILE with YAML front matter (flags win)."""
    fields: dict[str, Any] = {}
    if file is not None:
        fields, _ = decisions_md.read_file(file)
    fields.update(_fields_from_flags(opts, None))
    if decision_id:
        fields["id"] = decision_id
    if not fields.get("title"):
        raise ValueError("a decision needs a title (--title, or `title:` in the front matter)")
    fields.setdefault("author", os.environ.get("USER", ""))
    if at is not None:  # --at wins over created/updated in the file, like every flag
        fields["created"] = fields["updated"] = at
    d = dec.new(runs_dir, db, ingest=ingest, now=at, **fields)
    return d, f"recorded decision {d.id}"


@_record_command("update", click.argument("decision_id"))
def update_cmd(decision_id, runs_dir, db, at, **opts):
    """Change a decision's fields; --run, --alternative, --evidence and --config-change add to the lists."""
    cur = dec.get(db, decision_id)
    if cur is None:
        raise ValueError(f"no decision {decision_id!r} (see `observatory decide list`)")
    changes = _fields_from_flags(opts, cur)
    if not changes:
        raise ValueError("nothing to update: give at least one field flag, e.g. --status running")
    d = dec.update(runs_dir, db, decision_id, ingest=ingest, now=at, **changes)
    return d, f"updated decision {d.id}: {d.status}"


@decide.command("show")
@click.argument("decision_id")
@common_options
@click.option("--json", "as_json", is_flag=True, help="the record plus its event history")
def show_cmd(decision_id, runs_dir, db, as_json):
    """Show a decision's current state and its history."""
    d = dec.get(db, decision_id)
    if d is None:
        raise click.ClickException(f"no decision {decision_id!r} (see `observatory decide list`)")
    events = dec.history(db, decision_id)
    if as_json:
        click.echo(json.dumps({**d.to_dict(), "history": events}, indent=2, sort_keys=True))
    else:
        _print_decision(d, events)


def _warn_unreadable(unreadable: list[tuple[str, str]]) -> None:
    """One stderr line per decision record left out because it is not valid."""
    for did, reason in unreadable:
        click.echo(f"warning: decision {did!r} left out, its record is not valid: {reason}", err=True)


@decide.command("list")
@click.option("--status", type=click.Choice(dec.STATUSES))
@click.option("--kind", type=click.Choice(dec.KINDS))
@click.option("--run", help="only decisions linked to this run")
@common_options
@click.option("--json", "as_json", is_flag=True)
def list_cmd(status, kind, run, runs_dir, db, as_json):
    """List decisions (oldest first) with their current status."""
    unreadable: list[tuple[str, str]] = []
    ds = dec.list_decisions(db, status=status, kind=kind, run=run, unreadable=unreadable)
    _warn_unreadable(unreadable)
    if as_json:
        click.echo(json.dumps([d.to_dict() for d in ds], indent=2, sort_keys=True))
        return
    if not ds:
        click.echo("no decisions")
        return
    w = max(len(d.id) for d in ds)
    for d in ds:
        runs = ",".join(r.run for r in d.runs) or "-"
        click.echo(f"{d.id:<{w}}  {d.kind:<12} {d.status:<10} {fmt_time(d.updated)}  {runs}  {d.title}")


@decide.command("export")
@click.argument("out_dir", type=click.Path(file_okay=False, path_type=Path))
@common_options
def export_cmd(out_dir, runs_dir, db):
    """Write one Markdown file per decision (front matter + sections + history) into OUT_DIR."""
    unreadable: list[tuple[str, str]] = []
    paths = decisions_md.export_dir(db, out_dir, unreadable)
    _warn_unreadable(unreadable)
    click.echo(f"exported {len(paths)} decisions to {out_dir}")


@decide.command("import")
@click.argument("in_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@common_options
def import_cmd(in_dir, runs_dir, db):
    """Load the Markdown files of IN_DIR: new decisions are created, changed ones updated."""
    try:
        r = decisions_md.import_dir(runs_dir, db, in_dir, ingest=ingest)
    except ValueError as e:
        raise _fail(e) from None
    click.echo(
        f"imported {len(r['created'])} new, {len(r['updated'])} updated, {len(r['unchanged'])} unchanged"
    )


@click.command("lineage")
@click.argument("run")
@click.option("--metric", default="train/loss", show_default=True, help="metric for the stitched curve")
@common_options
@click.option("--json", "as_json", is_flag=True, help="the chain, children and stitched curve as JSON")
def lineage(run, metric, runs_dir, db, as_json):
    """Show RUN's ancestors (through forks and resumes), its children and the stitched curve's extent."""
    try:
        li = lin.lineage(db, run, metric=metric)
    except ValueError as e:
        raise _fail(e) from None
    if as_json:
        click.echo(json.dumps(li.to_dict(), indent=2, sort_keys=True))
        return
    click.echo(lin.format_text(li))
