"""What is firing now: each alert rule's condition over the live runs, one query per kind for all of them.

The live runs are those still `running` (or `crashed`: a dead process is what a stall alert is for)
whose own writers wrote within `alert_horizon_s`. Every condition is a `Firing` keyed by
(run, rule, host, detector, metric): one key is one episode, opened once and resolved once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from observatory import settings
from observatory.alerts.rules import RANK, Rule, Rules
from observatory.detect import trend
from observatory.detect.thresholds import Thresholds
from observatory.queries import alerts as q
from observatory.queries.anomalies import run_activity
from observatory.queries.trends import trend_points
from observatory.store.schema import PHASE_BUDGETED

__all__ = ["Firing", "LiveRun", "live_runs", "firing", "PHASE_BUDGETED"]


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
    rows = q.live_run_rows(con, now - settings.get("alert_horizon_s"), sorted(also))
    out = {}
    for run, project, config, status, last_step, last_t, start in rows:
        try:
            cfg = json.loads(config) if isinstance(config, str) else config
        except ValueError:
            cfg = None
        out[run] = LiveRun(run, project, cfg, status, last_step, last_t, start)
    return out


def _findings(con, rule: Rule, runs: dict[str, LiveRun]) -> list[Firing]:
    """A detector's finding at the rule's severity or above, within `alert_episode_steps` of the run's newest step:
    one episode per (detector, metric), however many findings it holds."""
    sevs = [s for s, r in RANK.items() if r >= RANK[rule.severity]]
    rows = q.finding_episodes(con, sorted(runs), sevs)
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


def _stalled(con, rule: Rule, runs: dict[str, LiveRun], now: float) -> list[Firing]:
    """No new step for the rule's time, on this clock; while a process is in a budgeted phase (compile, eval,
    checkpoint), its budget (or `phase_budget_s`) instead, counted from the phase's start."""
    stall_s = rule.stall_s if rule.stall_s is not None else settings.get("anomaly_stall_s")
    live = sorted(r for r, x in runs.items() if x.status in ("running", "crashed"))
    out = []
    for p in run_activity(con, live) if live else []:
        run = p["run"]
        r = runs[run]
        ph = (
            None
            if p["phase_t"] is None
            else {"t": p["phase_t"], "phase": p["phase"], "budget_s": p["budget_s"]}
        )
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
                attempt=p["attempt"],
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
    rows = q.host_last_seen(con, live)
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


def _metric(con, rule: Rule, runs: dict[str, LiveRun], opened: set[str] = frozenset()) -> list[Firing]:
    """The rule's metric past its limit: at each of the last `for_steps` logged steps (`above`, `below`), or in
    the median of them (`ratio_below` a baseline, `rise` or `fall` against `over_steps` logged steps before).

    An episode has hysteresis (the runs in `opened` have one open): it opens once all `for_steps` values
    are past the limit, and stays open until none of them is (`above`, `below`: a minimum duration of
    `for_steps` clear steps), or until the median is back half-way from the limit to the baseline
    (`ratio_below` 0.8 resolves at 0.9; `rise`/`fall` at half of it). A median hovering at the limit (a busy
    machine's MFU) is one episode, not an alert that opens and resolves again every few minutes."""
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    n = rule.for_steps
    own_history = (
        rule.rise is not None or rule.fall is not None or (rule.ratio_below and not rule.baseline_run)
    )
    tails = q.metric_tails(con, rule.metric, live, n + rule.over_steps if own_history else n)
    out = []
    for run, (values, steps) in tails.items():
        now, now_steps = values[:n], steps[:n]
        if len(now) < n:
            continue
        finite = [v for v in now if v == v]
        mid = float(np.median(finite)) if finite else float("nan")
        held = any if run in opened else all  # open: it holds while any value of the window is past
        if rule.above is not None or rule.below is not None:
            past = (
                held(v > rule.above for v in now)
                if rule.above is not None
                else held(v < rule.below for v in now)
            )
            limit = f"above {rule.above:g}" if rule.above is not None else f"below {rule.below:g}"
            text = f"{rule.metric} {limit} for {n} logged step(s): now {now[0]:.4g}"
        else:
            if rule.ratio_below is not None and rule.baseline_run:
                base = q.metric_median(con, rule.baseline_run, rule.metric, min(now_steps), max(now_steps))
                what = f"run {rule.baseline_run}'s"
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
                ratio = rule.ratio_below if run not in opened else (1 + rule.ratio_below) / 2
                past = mid < ratio * base
                text = f"{rule.metric} median {mid:.4g} over the last {n} logged steps is {mid / base:.0%} of {what} {base:.4g}"
            else:
                delta = mid - base
                half = 0.5 if run in opened else 1.0
                past = delta > half * rule.rise if rule.rise is not None else -delta > half * rule.fall
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


def _throughput_loss(con, rule: Rule, runs: dict[str, LiveRun], rules: Rules) -> list[Firing]:
    """A sustained throughput loss by the `throughput_loss` detector's own definition (`trend.throughput_loss`,
    one function for both, with each run's thresholds): firing while the episode at the run's newest whole
    64-step bucket is open. It resolves when the level is back at (1 + `anomaly_throughput_loss`) / 2 of its
    best: no flapping on a busy machine. One query for every running run."""
    live = sorted(r for r, x in runs.items() if x.status == "running")
    if not live:
        return []
    base = Thresholds.from_settings()
    ths = {r: rules.thresholds_for(base, r, runs[r].project, runs[r].config)[0] for r in live}
    points = trend_points(con, live, [trend.THROUGHPUT, trend.MFU], trend.EVAL, trend.min_span(ths.values()))
    out = []
    for run, series in points.items():
        episodes = trend.throughput_loss(series, ths[run])
        if not episodes or episodes[-1][1] is not None:
            continue
        f = episodes[-1][0]
        out.append(
            Firing(
                run,
                rule.name,
                rule.severity,
                f.message,
                runs[run].last_step,
                finding={"detector": f.detector, "metric": f.metric, "step": f.step},
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
    rows = q.host_step_pace(con, live, now - WINDOW_S)
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
    rows = q.hbm_use(con, live, now - WINDOW_S)
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


def firing(
    con, rules: Rules, runs: dict[str, LiveRun], now: float, opened: Iterable[tuple] = ()
) -> list[Firing]:
    """Every condition firing now, each rule over the runs it is active for; `opened`: the keys of the
    episodes open now (a metric rule's open episode holds until it clears past its hysteresis)."""
    open_runs: dict[str, set[str]] = {}
    for key in opened:
        open_runs.setdefault(key[1], set()).add(key[0])
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
            out += _metric(con, rule, mine, open_runs.get(rule.name, set()))
        elif rule.kind == "throughput_loss":
            out += _throughput_loss(con, rule, mine, rules)
        elif rule.kind == "straggler":
            out += _stragglers(con, rule, mine, now)
        elif rule.kind == "memory_creep":
            out += _memory(con, rule, mine, now)
    return out
