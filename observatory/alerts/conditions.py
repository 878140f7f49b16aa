"""What is firing now: each alert rule's condition over the live runs, one query per kind for all of them.

The live runs are those still `running` (or `crashed`: a dead process is what a stall alert is for)
whose own writers wrote within `alert_horizon_s`. Every condition is a `Firing` keyed by
(run, rule, host, detector, metric): one key is one episode, opened once and resolved once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from observatory import settings
from observatory.alerts.rules import RANK, Rule, Rules
from observatory.events import OBSERVATORY_HOST

__all__ = ["Firing", "LiveRun", "live_runs", "firing", "PHASE_BUDGETED"]

PHASE_BUDGETED = ("init", "compile", "eval", "checkpoint")  # phases that may be long and are not a stall


@dataclass(frozen=True)
class Firing:
    run: str
    rule: str
    severity: str
    message: str
    step: int | None = None
    host: int | None = None
    attempt: int | None = None
    finding: dict | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple:
        f = self.finding or {}
        return (self.run, self.rule, self.host, f.get("detector"), f.get("metric"))


@dataclass(frozen=True)
class LiveRun:
    run: str
    project: str | None
    config: Any
    status: str
    last_step: int | None
    last_event_t: float | None
    start_time: float | None


def live_runs(con, now: float, also: set[str] = frozenset()) -> dict[str, LiveRun]:
    """The runs the rules look at: running or crashed with an own event within `alert_horizon_s`, and `also`."""
    rows = con.execute(
        """
        SELECT run, project, config, status, last_step, last_event_t, start_time FROM runs
        WHERE (status IN ('running', 'crashed') AND coalesce(last_event_t, start_time, 0) >= $since)
           OR run IN (SELECT unnest($also::VARCHAR[]))
        """,
        {"since": now - settings.get("alert_horizon_s"), "also": sorted(also)},
    ).fetchall()
    out = {}
    for run, project, config, status, last_step, last_t, start in rows:
        try:
            cfg = json.loads(config) if isinstance(config, str) else config
        except ValueError:
            cfg = None
        out[run] = LiveRun(run, project, cfg, status, last_step, last_t, start)
    return out


def _in(runs: list[str]) -> dict:
    return {"runs": runs}


def _findings(con, rule: Rule, runs: dict[str, LiveRun]) -> list[Firing]:
    """A detector's finding at the rule's severity or above, within `alert_episode_steps` of the run's newest step:
    one episode per (detector, metric), however many findings it holds."""
    sevs = [s for s, r in RANK.items() if r >= RANK[rule.severity]]
    rows = con.execute(
        """
        SELECT run, data->>'detector' AS det, data->>'metric' AS metric, max(step) AS step, count(*) AS n,
               arg_max(data->>'message', seq) AS msg, arg_max(data->>'severity', seq) AS sev
        FROM events
        WHERE kind = 'anomaly' AND host = $host AND run IN (SELECT unnest($runs::VARCHAR[]))
          AND data->>'severity' IN (SELECT unnest($sevs::VARCHAR[])) AND data->>'detector' <> 'stalled_run'
        GROUP BY ALL
        """,
        {"host": OBSERVATORY_HOST, "sevs": sevs} | _in(sorted(runs)),
    ).fetchall()
    episode = settings.get("alert_episode_steps")
    out = []
    for run, det, metric, step, n, msg, sev in rows:
        r = runs[run]
        if r.status != "running" or (r.last_step or 0) - (step or 0) > episode:
            continue
        more = f" ({n} findings)" if n > 1 else ""
        out.append(
            Firing(
                run,
                rule.name,
                sev if sev in RANK else rule.severity,
                f"{det} on {metric}: {msg}{more}",
                step,
                finding={"detector": det, "metric": metric, "step": step},
            )
        )
    return out


def _progress(con, runs: list[str]) -> dict[str, dict]:
    """Per run: the newest metric's time (the last step's), the newest phase (any host) and the newest attempt."""
    out: dict[str, dict] = {r: {"progress_t": None, "phase": None} for r in runs}
    for run, t in con.execute(
        "SELECT run, max(last_t) FROM metric_series WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run",
        _in(runs),
    ).fetchall():
        out[run]["progress_t"] = t
    for run, host, t, phase, budget, attempt in con.execute(
        """
        SELECT run, arg_max(host, t), max(t), arg_max(data->>'phase', t), arg_max(TRY_CAST(data->>'budget_s' AS DOUBLE), t),
               max(TRY_CAST(data->>'attempt' AS BIGINT))
        FROM events WHERE kind = 'phase' AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY run
        """,
        _in(runs),
    ).fetchall():
        out[run]["phase"] = {"host": host, "t": t, "phase": phase, "budget_s": budget, "attempt": attempt}
    return out


def _stalled(con, rule: Rule, runs: dict[str, LiveRun], now: float) -> list[Firing]:
    """No new step for the rule's time, on this clock; while a process is in a budgeted phase (compile, eval,
    checkpoint), its budget (or `phase_budget_s`) instead, counted from the phase's start."""
    stall_s = rule.stall_s if rule.stall_s is not None else settings.get("anomaly_stall_s")
    live = [r for r, x in runs.items() if x.status in ("running", "crashed")]
    out = []
    for run, p in _progress(con, live).items():
        r, ph = runs[run], p["phase"]
        ref, allowed, what = p["progress_t"] or r.start_time, stall_s, "no new step"
        if (
            ph and ref is not None and ph["t"] > ref
        ):  # a phase entered since (back to train after an eval): its clock
            ref = ph["t"]
        if ph and ph["phase"] in PHASE_BUDGETED and (p["progress_t"] is None or ph["t"] >= p["progress_t"]):
            budget = ph["budget_s"] if ph["budget_s"] is not None else settings.get("phase_budget_s")
            ref, allowed, what = ph["t"], max(stall_s, budget), f"still in {ph['phase']}"
        if ref is None or now - ref <= allowed:
            continue
        first = p["progress_t"] is None
        alive = r.last_event_t is not None and now - r.last_event_t < stall_s
        why = (
            "its processes still send heartbeats: a hang"
            if alive
            else "its processes are silent too: dead or frozen"
        )
        where = "before its first step" if first else f"after step {r.last_step}"
        out.append(
            Firing(
                run,
                rule.name,
                rule.severity,
                f"{what} for {(now - ref) / 60:.1f} min {where} (allowed {allowed / 60:.1f} min); {why}",
                r.last_step,
                attempt=(ph or {}).get("attempt"),
            )
        )
    return out


def _frozen_hosts(con, rule: Rule, runs: dict[str, LiveRun]) -> list[Firing]:
    """One process of a running run silent (no event, step or heartbeat) for `anomaly_stall_s` longer than its
    newest sibling: its siblings' heartbeats do not hide it."""
    stall_s = settings.get("anomaly_stall_s")
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    rows = con.execute(
        """
        WITH last AS (
            SELECT run, host, max(t) AS t FROM events
            WHERE host <> $host AND run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY ALL
            UNION ALL
            SELECT run, host, max(t) FROM metrics WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY ALL
            UNION ALL
            SELECT run, host, max(t) FROM heartbeats WHERE run IN (SELECT unnest($runs::VARCHAR[])) GROUP BY ALL
        ), per AS (SELECT run, host, max(t) AS t FROM last GROUP BY ALL)
        SELECT run, host, t, max(t) OVER (PARTITION BY run) AS newest, count(*) OVER (PARTITION BY run) AS n FROM per
        """,
        {"host": OBSERVATORY_HOST} | _in(live),
    ).fetchall()
    return [
        Firing(
            run,
            rule.name,
            rule.severity,
            f"host {host} silent for {(newest - t) / 60:.1f} min while {n - 1} sibling(s) go on",
            runs[run].last_step,
            host=host,
        )
        for run, host, t, newest, n in rows
        if n > 1 and newest - t > stall_s
    ]


def _tails(con, name: str, runs: list[str], n: int) -> dict[str, tuple[list[float], list[int]]]:
    """Each run's last `n` logged values of `name`, newest first (values, steps)."""
    rows = con.execute(
        """
        SELECT run, list(value ORDER BY step DESC), list(step ORDER BY step DESC) FROM (
            SELECT run, step, value, row_number() OVER (PARTITION BY run ORDER BY step DESC) AS k FROM metrics
            WHERE name = $name AND run IN (SELECT unnest($runs::VARCHAR[])) AND NOT replaced
        ) WHERE k <= $n GROUP BY run
        """,
        {"name": name, "n": n, "runs": runs},
    ).fetchall()
    return {run: (values, steps) for run, values, steps in rows}


def _baseline(con, rule: Rule, steps: list[int]) -> float | None:
    """The named baseline run's median of the rule's metric over the same steps."""
    row = con.execute(
        "SELECT median(value) FROM metrics WHERE run = $run AND name = $name AND step BETWEEN $lo AND $hi "
        "AND NOT replaced",
        {"run": rule.baseline_run, "name": rule.metric, "lo": min(steps), "hi": max(steps)},
    ).fetchone()
    return row[0] if row else None


def _metric(con, rule: Rule, runs: dict[str, LiveRun]) -> list[Firing]:
    """The rule's metric past its limit: at each of the last `for_steps` logged steps (`above`, `below`), or in
    the median of them (`ratio_below` a baseline, `rise` or `fall` against `over_steps` logged steps before)."""
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    n = rule.for_steps
    own_history = (
        rule.rise is not None or rule.fall is not None or (rule.ratio_below and not rule.baseline_run)
    )
    tails = _tails(con, rule.metric, live, n + rule.over_steps if own_history else n)
    out = []
    for run, (values, steps) in tails.items():
        now, now_steps = values[:n], steps[:n]
        if len(now) < n:
            continue
        finite = [v for v in now if v == v]
        mid = float(np.median(finite)) if finite else float("nan")
        if rule.above is not None or rule.below is not None:
            past = (
                all(v > rule.above for v in now)
                if rule.above is not None
                else all(v < rule.below for v in now)
            )
            limit = f"above {rule.above:g}" if rule.above is not None else f"below {rule.below:g}"
            text = f"{rule.metric} {limit} for {n} logged step(s): now {now[0]:.4g}"
        else:
            if rule.ratio_below is not None and rule.baseline_run:
                base, what = _baseline(con, rule, now_steps), f"run {rule.baseline_run}'s"
            else:
                # own history: the median of the window `over_steps` logged steps back (a regression: the
                # median of all of those before the window)
                before = (
                    values[n:]
                    if rule.ratio_below is not None
                    else values[rule.over_steps : rule.over_steps + n]
                )
                if len(values) < n + rule.over_steps:
                    continue
                base = float(np.median([v for v in before if v == v] or [np.nan]))
                what = f"its own {rule.over_steps} logged steps before"
            if base is None or base != base:
                continue
            if rule.ratio_below is not None:
                past = mid < rule.ratio_below * base
                text = f"{rule.metric} median {mid:.4g} over the last {n} logged steps is {mid / base:.0%} of {what} {base:.4g}"
            else:
                delta = mid - base
                past = delta > rule.rise if rule.rise is not None else -delta > rule.fall
                text = (
                    f"{rule.metric} drifted {delta:+.4g} (median {base:.4g} -> {mid:.4g}) over "
                    f"{rule.over_steps} logged steps"
                )
        if past:
            out.append(
                Firing(
                    run,
                    rule.name,
                    rule.severity,
                    text,
                    now_steps[0],
                    finding={"detector": rule.name, "metric": rule.metric, "step": now_steps[0]},
                )
            )
    return out


STRAGGLER_RATIO = 1.3  # a host this much slower per step than the median host, over the whole window
WINDOW_S = 600.0  # the straggler and memory rules look at the last ten minutes of heartbeats


def _stragglers(con, rule: Rule, runs: dict[str, LiveRun], now: float) -> list[Firing]:
    """A host whose own seconds per step, over the last `WINDOW_S` of its heartbeats, is `STRAGGLER_RATIO` times
    the median host's (three hosts or more: with two, which one is slow is a coin toss)."""
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    rows = con.execute(
        """
        WITH per AS (
            SELECT run, host, (max(t) - min(t)) / nullif(max(step) - min(step), 0) AS s_per_step
            FROM heartbeats WHERE run IN (SELECT unnest($runs::VARCHAR[])) AND t >= $since AND step IS NOT NULL
            GROUP BY ALL HAVING count(*) >= 3
        )
        SELECT run, host, s_per_step, median(s_per_step) OVER (PARTITION BY run) AS mid, count(*) OVER (PARTITION BY run)
        FROM per WHERE s_per_step IS NOT NULL
        """,
        {"since": now - WINDOW_S} | _in(live),
    ).fetchall()
    return [
        Firing(
            run,
            rule.name,
            rule.severity,
            f"host {host} takes {s:.3g} s per step, {s / mid:.2f}x the median host's {mid:.3g} s "
            f"(last {WINDOW_S / 60:.0f} min, {n} hosts)",
            runs[run].last_step,
            host=host,
        )
        for run, host, s, mid, n in rows
        if n >= 3 and mid and s > STRAGGLER_RATIO * mid
    ]


def _memory(con, rule: Rule, runs: dict[str, LiveRun], now: float) -> list[Firing]:
    """An accelerator's memory above `MEMORY_FULL` of its limit, or rising at a pace that reaches the limit
    within `MEMORY_HORIZON_S` (a least-squares slope over the last `WINDOW_S` of heartbeats)."""
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    rows = con.execute(
        """
        WITH used AS (
            SELECT run, host, regexp_extract(name, '^accel/([^/]+)/', 1) AS dev, t, value FROM host_telemetry
            WHERE run IN (SELECT unnest($runs::VARCHAR[])) AND t >= $since AND name LIKE 'accel/%/hbm_used_bytes'
        ), lim AS (
            SELECT run, host, regexp_extract(name, '^accel/([^/]+)/', 1) AS dev, arg_max(value, t) AS limit_bytes
            FROM host_telemetry
            WHERE run IN (SELECT unnest($runs::VARCHAR[])) AND t >= $since AND name LIKE 'accel/%/hbm_limit_bytes'
            GROUP BY ALL
        )
        SELECT u.run, u.host, u.dev, arg_max(u.value, u.t), regr_slope(u.value, u.t), any_value(l.limit_bytes)
        FROM used u JOIN lim l USING (run, host, dev) GROUP BY ALL HAVING count(*) >= 3
        """,
        {"since": now - WINDOW_S} | _in(live),
    ).fetchall()
    out = []
    for run, host, dev, used, slope, limit in rows:
        if not limit:
            continue
        left = (limit - used) / slope if slope and slope > 0 else float("inf")
        if used / limit >= MEMORY_FULL or left <= MEMORY_HORIZON_S:
            eta = f"; at this pace full in {left / 60:.0f} min" if left < float("inf") else ""
            out.append(
                Firing(
                    run,
                    rule.name,
                    rule.severity,
                    f"host {host} accelerator {dev}: {used / limit:.0%} of its memory used{eta}",
                    runs[run].last_step,
                    host=host,
                    finding={"detector": rule.name, "metric": f"accel/{dev}/hbm_used_bytes"},
                )
            )
    return out


MEMORY_FULL = 0.95
MEMORY_HORIZON_S = 3600.0


def firing(con, rules: Rules, runs: dict[str, LiveRun], now: float) -> list[Firing]:
    """Every condition firing now, each rule over the runs it is active for."""
    out: list[Firing] = []
    for rule in rules.rules:
        mine = {r: x for r, x in runs.items() if rules.active(rule, r, x.project, x.config)}
        if not mine:
            continue
        if rule.kind == "findings":
            out += _findings(con, rule, mine)
        elif rule.kind == "stalled":
            out += _stalled(con, rule, mine, now)
        elif rule.kind == "frozen_host":
            out += _frozen_hosts(con, rule, mine)
        elif rule.kind == "metric":
            out += _metric(con, rule, mine)
        elif rule.kind == "straggler":
            out += _stragglers(con, rule, mine, now)
        elif rule.kind == "memory_creep":
            out += _memory(con, rule, mine, now)
    return out
