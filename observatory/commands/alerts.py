"""`observatory alerts ...`: see, test and silence the alerts; `observatory metrics`: a Prometheus target."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from observatory import settings
from observatory.commands import common_options, db_option

__all__ = ["alerts", "metrics", "goodput"]

_s = settings.SETTINGS["alerts_file"]


rules_option = click.option(
    "--rules",
    "rules_path",
    type=click.Path(path_type=Path),
    show_default=f"env {_s.env}, else <store>.alerts.yaml beside --db",
    help="The alert rules file (YAML).",
)


def _path(rules_path: Path | None, db: Path) -> Path:
    """The rules file: --rules, else the store's (`rules.path_for`: the setting's file, else beside it)."""
    from observatory.alerts import rules

    return rules_path if rules_path is not None else rules.path_for(db)


def _load(path: Path):
    from observatory.alerts import rules

    try:
        return rules.load(path)
    except rules.RulesError as e:
        raise click.ClickException(str(e)) from None


def _scope(run: str | None, project: str | None) -> dict:
    if run is None and project is None:
        raise click.UsageError("say which runs: --run ID-OR-GLOB and/or --project NAME")
    return {k: v for k, v in (("run", run), ("project", project)) if v is not None}


@click.group("alerts")
def alerts():
    """Alerts: list the open ones, evaluate now, silence, disable or enable a rule, test the channels.

    Rules, channels and silences live in the store's rules file (`<store>.alerts.yaml` beside --db, or
    the file --rules or the setting `alerts_file` names); `ingest` (and `ingest --follow` on its clock)
    evaluates them and sends one message per episode.
    """


@alerts.command("list")
@common_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def list_cmd(runs_dir, db, as_json):
    """The alerts open now."""
    from observatory.alerts import open_alerts
    from observatory.store import using

    if not db.exists():
        raise click.UsageError(f"no store at {db}")
    with using(db) as con:
        rows = sorted(open_alerts(con).values(), key=lambda d: (d["run"], d.get("rule", "")))
    for d in rows:
        if as_json:
            click.echo(json.dumps(d, default=str))
        else:
            host = f" host {d['host']}" if d.get("host") is not None else ""
            click.echo(
                f"{d['run']}{host}  {d.get('severity', '?'):<8} {d.get('rule', '?'):<12} {d.get('message', '')}"
            )
    if not as_json:
        click.echo(f"{len(rows)} open alert(s)", err=True)


@alerts.command("check")
@common_options
@rules_option
@click.option("--dry-run", is_flag=True, help="Say what would open or resolve; send and write nothing.")
def check(runs_dir, db, rules_path, dry_run):
    """Evaluate every rule now: open and resolve alerts, send them (then `observatory ingest` stores them)."""
    rules_path = _path(rules_path, db)
    from observatory import alerts as al
    from observatory.alerts.conditions import firing, live_runs
    from observatory.store import using

    if not db.exists():
        raise click.UsageError(f"no store at {db}; run `observatory ingest` first")
    rule_set = _load(rules_path)
    if not dry_run:
        from observatory.alerts import rules

        click.echo(rules.announce(rules_path), err=True)
    if dry_run:
        now = time.time()
        with using(db) as con:
            opened = al.open_alerts(con)
            found = firing(con, rule_set, live_runs(con, now, {k[0] for k in opened}), now, opened)
        for f in found:
            state = "open (already)" if f.key in opened else "would open"
            click.echo(f"{f.run}  {state:<14} {f.severity:<8} {f.rule:<12} {f.message}")
        return
    written = al.evaluate(db, runs_dir, rule_set=rule_set)
    for d in written:
        click.echo(
            f"{d['run']}  {d['state']:<8} {d['severity']:<8} {d['rule']:<12} sent to {d['channels'] or 'nobody'}"
        )
    click.echo(
        f"{len(written)} alert event(s) written"
        + (": run `observatory ingest` to store them" if written else ""),
        err=True,
    )


def _scope_options(run: str, project: str, rule: str):
    """The options of a command that names runs and a rule (`silence`, `disable`, `enable`): their helps."""

    def apply(f):
        for option in reversed(
            (
                rules_option,
                db_option,
                click.option("--run", help=run),
                click.option("--project", help=project),
                click.option("--rule", default="*", show_default=True, help=rule),
            )
        ):
            f = option(f)
        return f

    return apply


@alerts.command("silence")
@_scope_options("Run id or glob (sweep-*).", "Project name.", "Rule name or glob.")
@click.option(
    "--for", "until", required=True, metavar="DURATION|TIME", help="30m, 2h, 1d, or an ISO time with zone."
)
def silence(rules_path, db, run, project, rule, until):
    """Send nothing for these runs and rule until then (alerts still open, resolve and are stored)."""
    rules_path = _path(rules_path, db)
    from datetime import UTC, datetime

    from observatory.alerts import rules

    try:
        t = rules.parse_until(until)
    except rules.RulesError as e:
        raise click.BadParameter(str(e), param_hint="--for") from None
    iso = datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    rules.save(rules_path, "silences", {"rule": rule, **_scope(run, project), "until": iso})
    click.echo(f"silenced {rule} for {_scope(run, project)} until {iso} (in {rules_path})")


@alerts.command("disable")
@_scope_options(
    "Run id or glob.", "Project name.", "Rule name or glob (findings, stalled, frozen_host, ...)."
)
def disable(rules_path, db, run, project, rule):
    """Turn a rule off for these runs (no alert at all), until `enable`."""
    rules_path = _path(rules_path, db)
    from observatory.alerts import rules

    rules.save(rules_path, "disabled", {"rule": rule, **_scope(run, project)})
    click.echo(f"disabled {rule} for {_scope(run, project)} (in {rules_path})")


@alerts.command("enable")
@_scope_options(
    "Run id or glob, as it was disabled.",
    "Project name, as it was disabled.",
    "Rule name or glob, as it was disabled.",
)
def enable(rules_path, db, run, project, rule):
    """Undo a `disable` (and end a silence) of these runs and rule."""
    rules_path = _path(rules_path, db)
    from observatory.alerts import rules

    match = {"rule": rule, **_scope(run, project)}
    n = rules.remove(rules_path, "disabled", match) + rules.remove(rules_path, "silences", match)
    click.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} for {match} (in {rules_path})")


@alerts.command("test")
@rules_option
@db_option
def test(rules_path, db):
    """Send one test message to every channel."""
    rules_path = _path(rules_path, db)
    from observatory.alerts import channels

    rule_set = _load(rules_path)
    if not rule_set.channels:
        raise click.ClickException(f"{rules_path}: no channels")
    sent = channels.send(
        rule_set.channels, "critical", "[TEST] observatory alerts", "a test message: it works"
    )
    click.echo(f"sent to {sent or 'nobody'} of {[c.name for c in rule_set.channels]}")
    if len(sent) < len(rule_set.channels):
        raise SystemExit(1)


@click.command("metrics")
@common_options
@click.option("--port", default=9108, show_default=True, help="Port of the /metrics endpoint.")
@click.option("--host", "bind", default="127.0.0.1", show_default=True, help="Address to listen on.")
def metrics(runs_dir, db, port, bind):
    """Serve each live run's health at /metrics for Prometheus (read from the store at every scrape)."""
    from observatory.alerts import prometheus

    server = prometheus.serve(db, bind, port)
    click.echo(f"serving http://{bind}:{server.server_port}/metrics for {db} (Ctrl-C to stop)", err=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


@click.command("goodput")
@click.argument("runs", nargs=-1, required=True)
@common_options
@click.option("--json", "as_json", is_flag=True, help="The goodput view's row per run, as JSON lines.")
def goodput(runs, runs_dir, db, as_json):
    """Where each run's wall time went: productive steps, init, compile, evals, checkpoints, stalls, redone
    steps and time down between attempts (the `goodput` SQL view; `goodput_segments` has it over time)."""
    from observatory.queries.goodput import describe_goodput
    from observatory.queries.goodput import goodput as read
    from observatory.store import using

    if not db.exists():
        raise click.UsageError(f"no store at {db}")
    with using(db) as con:
        rows = read(con, list(runs))
    for run in runs:
        if run not in rows:
            click.echo(f"{run}: no run with logged steps or phases of process 0 in {db}", err=True)
        elif as_json:
            click.echo(json.dumps(rows[run], default=str))
        else:
            click.echo(f"{run}  {describe_goodput(rows[run])}")
    if len(rows) < len(set(runs)):
        raise SystemExit(1)
