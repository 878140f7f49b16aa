"""Alerts: rules over findings and metrics, one message per episode, sent through apprise, kept as events.

`evaluate` compares what fires now (`conditions.firing`) with the alerts still open (the store's
`alert` events, and what this process wrote since) and, for each episode that begins or ends,
sends one message to the channels (`channels.send`, or queued for the ingester's delivery thread:
`delivery`) and writes one `alert` event (state `open` or
`resolved`) into the run's observatory file (host 1000), so the store stays rebuildable and the pages
show them. It runs as one of the ingester's analyses (`observatory.pipeline`) and on the follower's clock (`ingest --follow`
evaluates every few seconds with no new event too: a silent run is found by the clock, not by the
next event). Rules: `observatory.alerts.rules`.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from observatory import findings, settings
from observatory.alerts import channels, rules
from observatory.alerts.conditions import Firing, firing, live_runs
from observatory.queries.alerts import alert_rows
from observatory.store import using

__all__ = ["evaluate", "after_ingest", "open_alerts", "live_link", "Firing"]


def live_link(run: str, step: int | None) -> str:
    base = settings.get("public_url").rstrip("/")
    return f"{base}/live?run={quote(run)}" + (f"&step={step}" if step is not None else "")


def open_alerts(
    con, runs: Iterable[str] | None = None, written: dict[tuple, str] | None = None
) -> dict[tuple, dict]:
    """The alerts open now, by key, from the store's `alert` events (the newest per key wins) and
    `written`: what this ingester wrote that the store may not hold yet (key -> "open" | "resolved")."""
    rows = alert_rows(con, None if runs is None else sorted(runs))
    out = {}
    for run, data in rows:
        d = json.loads(data) if isinstance(data, str) else data
        f = d.get("finding") or {}
        key = (run, d.get("rule"), d.get("host"), f.get("detector"), f.get("metric"))
        if d.get("state") == "open":
            out[key] = {"run": run, **d}
    for key, state in (written or {}).items():
        if state == "resolved":
            out.pop(key, None)
    return out


def _data(f: Firing, state: str, sent: list[str], message: str) -> dict:
    d: dict[str, Any] = {
        "rule": f.rule,
        "state": state,
        "severity": f.severity,
        "message": message,
        "channels": sent,
    }
    if f.finding:
        d["finding"] = f.finding
    if f.host is not None:
        d["host"] = f.host
    if f.attempt is not None:
        d["attempt"] = f.attempt
    return d


def _body(f: Firing, state: str, message: str) -> tuple[str, str]:
    """(title, body) of an alert's message. The body's first line is the message, a log's text on one line
    (`channels.send_one` makes it inert for each channel); the lines after it are the observatory's own."""
    host = f" host {f.host}" if f.host is not None else ""
    attempt = f" attempt {f.attempt}" if f.attempt is not None else ""
    where = f"step {f.step}" if f.step is not None else "no step yet"
    verb = "RESOLVED" if state == "resolved" else f.severity.upper()
    title = f"[{verb}] {f.run}{host}: {f.rule}"
    one_line = " ".join(str(message).split())
    return title, f"{one_line}\nrun {f.run}{host}{attempt}, {where}\n{live_link(f.run, f.step)}"


def evaluate(
    db,
    runs_dir,
    *,
    now: float | None = None,
    rule_set: rules.Rules | None = None,
    send: bool = True,
    written: dict[tuple, str] | None = None,
    deliver: Callable[..., list[str]] | None = None,
) -> list[dict]:
    """Open the episodes that began and resolve those that ended; the `alert` events written (with `run`).
    `written`: the caller's record of the alert states it wrote (key -> "open" | "resolved"), read and
    updated (a long-lived ingester keeps one: its writes reach the store one pass later). `deliver`: how a
    message leaves (`delivery.Delivery.put`: queued for a thread of its own, returning the channels it is
    queued for); None: sent now, on this thread (`channels.send`). An episode that opens mentions whom its
    rule's `mention` names (the rules file's); one that resolves mentions nobody."""
    deliver = deliver or channels.send
    now = time.time() if now is None else now
    rule_set = rule_set or rules.load(rules.path_for(getattr(db, "path", db)))  # the store's own rules
    written = {} if written is None else written
    with using(db) as con:
        opened = open_alerts(con, written=written)
        live = live_runs(con, now, also={k[0] for k in opened})
        fire = {f.key: f for f in firing(con, rule_set, live, now, opened)}
    out: list[dict] = []
    mentions = {r.name: r.mention for r in rule_set.rules}
    by_run: dict[str, list[tuple[dict, int | None]]] = {}
    for key, f in fire.items():
        if key in opened:
            continue
        project = live[f.run].project
        silenced = rule_set.silenced(f.rule, f.run, project, now)
        title, body = _body(f, "open", f.message)
        mention = mentions.get(f.rule, ())
        sent = [] if silenced or not send else deliver(rule_set.channels, f.severity, title, body, mention)
        by_run.setdefault(f.run, []).append((_data(f, "open", sent, f.message), f.step))
        written[key] = "open"
    for key, d in opened.items():
        if key in fire:
            continue
        run = d["run"]
        r = live.get(run)
        f = Firing(
            run,
            d.get("rule", "?"),
            d.get("severity", "warn"),
            d.get("message", ""),
            r.last_step if r else None,
            d.get("host"),
            d.get("attempt"),
            d.get("finding"),
        )
        why = (
            "the condition cleared"
            if r is not None and r.status == "running"
            else f"the run is {r.status if r else 'gone'}"
        )
        msg = f"resolved ({why}): {f.message}"
        silenced = rule_set.silenced(f.rule, run, r.project if r else None, now)
        title, body = _body(f, "resolved", msg)
        sent = [] if silenced or not send else deliver(rule_set.channels, f.severity, title, body)
        by_run.setdefault(run, []).append((_data(f, "resolved", sent, msg), f.step))
        written[key] = "resolved"
    for run, items in by_run.items():
        if not (Path(runs_dir) / run).is_dir():
            print(
                f"observatory alerts: run {run} has no folder in {runs_dir}; alert not written",
                file=sys.stderr,
            )
            continue
        findings.write(runs_dir, run, "alert", items)
        out += [{"run": run, **d} for d, _ in items]
    return out


def after_ingest(
    db,
    runs_dir,
    runs: set[str] | None = None,
    *,
    written: dict[tuple, str] | None = None,
    deliver: Callable[..., list[str]] | None = None,
) -> set[str]:
    """The ingester's analysis (after each batch, and on the follower's clock): evaluate; the runs written
    to. `written`, `deliver`: as for `evaluate`. Never raises: a bad rules file or a failed send is said on stderr and
    ingest goes on."""
    try:
        return {w["run"] for w in evaluate(db, runs_dir, written=written, deliver=deliver)}
    except rules.RulesError as e:
        print(f"observatory alerts: {e}", file=sys.stderr)
    except Exception as e:
        print(f"observatory alerts: evaluation failed: {type(e).__name__}: {e}", file=sys.stderr)
    return set()
