"""A run's post-mortem as plain data: `build(db, run)` reads the store into a `Report`.

Every query orders its rows and the report holds no wall-clock "generated at"
stamp, so the same store gives the same `Report` (and the same rendered files).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import duckdb

from observatory import decisions as dec
from observatory import lineage as lin
from observatory import settings
from observatory.detect.trend import EVAL, TREND_METRICS
from observatory.events import OBSERVATORY_HOST, describe
from observatory.queries import report as q
from observatory.queries.core import loss_name
from observatory.queries.goodput import describe_goodput, goodput
from observatory.queries.trends import trend_points
from observatory.redact import redacted_note
from observatory.report.format import fmt_time, fmt_value
from observatory.store import run_status_sql, using

__all__ = ["Report", "build", "effective_status", "MAX_POINTS", "OVERVIEW_METRICS", "overview_names"]

MAX_POINTS = 4000  # per overview curve: min and max of each bucket, so spikes survive
MAX_WINDOWS = 12  # metric windows around failures/anomalies; more would bury the first ones
WINDOW_METRICS = ("train/loss", "grad/norm/total")  # the loss: the run's own (`loss_name`)
MAX_PLAIN = 12  # a run without our names (a W&B script's `loss`, `acc`): its first metrics drawn instead
SEVERITY_RANK = {"critical": 0, "warn": 1, "info": 2}
# the curves of the overview figure, read at up to MAX_POINTS points each
OVERVIEW_METRICS = (
    "train/loss",
    "grad/norm/total",
    "opt/lr",
    "moe/drop_fraction",
    "throughput/tokens_per_s",
)


@dataclass(frozen=True)
class Report:
    run: str
    info: dict[str, Any]
    status: str
    story: list[str]  # "what happened", one sentence per line
    summary: list[tuple[str, str]]  # (label, value) rows
    timeline: list[dict[str, Any]]  # {step, t, kind, text}
    series: dict[str, list[tuple[int, float]]]
    windows: list[dict[str, Any]]  # {title, first, last, lo, hi, series}
    expert_layers: list[dict[str, Any]]
    expert_matrix: tuple[list[int], list[int], list[list[float]]]
    drops: list[tuple[int, float]]
    lineage: Any  # observatory.lineage.Lineage | None
    config: dict[str, Any]
    config_diffs: list[dict[str, Any]]
    forecasts: list[dict[str, Any]]  # {metric, step, value, low, high, actual, verdict, source_text}
    forecast_actuals: dict[str, list[tuple[int, float]]]
    ladder: list[dict[str, Any]]
    decisions: list[Any]  # observatory.decisions.Decision
    metric_names: list[str] = field(default_factory=list)
    nonfinite: list[int] = field(default_factory=list)  # steps where the loss is NaN or inf
    loss_name: str | None = (
        None  # the run's loss (`queries.core.loss_name`): train/loss, or a W&B run's `loss`, ...
    )
    slow: list[dict[str, Any]] = field(default_factory=list)  # trend findings: {title, metric, ..., series}


def effective_status(info: dict[str, Any], now: float | None = None) -> str:
    """The stored status, except a run with no run_end whose writers went silent is `crashed`.

    `crashed` comes from `observatory.store.run_status_sql`, the one definition every reader uses.
    """
    if info.get("start_time") is None:
        return "records"  # a folder without run_start (e.g. `decisions/`): findings, not a training run
    now = time.time() if now is None else now
    row = {
        "status": info.get("status") or "running",
        "last": info.get("writer_t") or info.get("last_event_t"),
        "phase": info.get("phase"),
        "phase_t": info.get("phase_t"),
        "budget": info.get("phase_budget_s"),
    }
    with (
        duckdb.cursor() as con
    ):  # a cursor of DuckDB's in-memory default database: the expression over one row
        return con.execute(
            f"SELECT {run_status_sql('$cut')} FROM (SELECT $status AS status, $last::DOUBLE AS last_event_t, "
            "$phase::VARCHAR AS phase, $phase_t::DOUBLE AS phase_t, $budget::DOUBLE AS phase_budget_s)",
            {**row, "cut": now - float(settings.get("stale_after_s"))},
        ).fetchall()[0][0]


def overview_names(names: list[str]) -> list[str]:
    """The overview's curves: the run's loss, then `OVERVIEW_METRICS` it logged; a run with none of them
    (a W&B script's `acc`, `val/loss`) gets its own metrics, the first `MAX_PLAIN`, instead."""
    loss = loss_name(names)
    known = [n for n in OVERVIEW_METRICS[1:] if n in names]
    rest = known or [n for n in names if n != loss][: MAX_PLAIN - (loss is not None)]
    return ([loss] if loss else []) + rest


def _windows(con, run: str, timeline: list[dict], last_step: int | None, loss: str | None) -> list[dict]:
    half = max(10, min(100, (last_step or 0) // 20))
    cands = []
    for e in timeline:
        if e["kind"] not in ("failure", "anomaly") or e["step"] is None:
            continue
        w = e["data"].get("window") if e["kind"] == "anomaly" else None
        first, last = (w[0], w[1]) if isinstance(w, list) and len(w) == 2 else (e["step"], e["step"])
        rank = -1 if e["kind"] == "failure" else SEVERITY_RANK.get(e["data"].get("severity"), 3)
        cands.append((rank, e["step"], e["seq"], first, last, e))
    seen, out = set(), []
    for _rank, step, _seq, first, last, e in sorted(cands, key=lambda c: c[:3]):
        if (e["kind"], first, last) in seen:
            continue
        seen.add((e["kind"], first, last))
        lo, hi = max(0, first - half), last + half
        series = q.metric_series(con, run, [loss or WINDOW_METRICS[0], *WINDOW_METRICS[1:]], lo, hi)
        series = {k: v for k, v in series.items() if v}
        out.append(
            {
                "title": f"{e['kind']} at step {step}: {e['text']}",
                "kind": e["kind"],
                "step": step,
                "first": first,
                "last": last,
                "lo": lo,
                "hi": hi,
                "series": series,
            }
        )
        if len(out) >= MAX_WINDOWS:
            break
    return sorted(out, key=lambda w: (w["step"], w["kind"]))


def _forecasts(con, run: str, events: list[dict], decisions: list) -> tuple[list[dict], dict]:
    fcs = []
    for e in events:
        if e["kind"] != "forecast":
            continue
        d = e["data"]
        src = d.get("source") or {}
        pts = d.get("points") if isinstance(d.get("points"), list) else None
        if d.get("value") is not None:
            pts = [
                {
                    "step": d.get("target_step"),
                    "value": d["value"],
                    "low": d.get("low"),
                    "high": d.get("high"),
                }
            ]
        for p in pts or []:
            if not isinstance(p, dict) or p.get("value") is None:
                continue
            fcs.append(
                {
                    "metric": str(d.get("metric")),
                    "step": p.get("step"),
                    "value": float(p["value"]),
                    "low": None if p.get("low") is None else float(p["low"]),
                    "high": None if p.get("high") is None else float(p["high"]),
                    "source_text": f"{d.get('method', '')} {json.dumps(src, sort_keys=True) if src else ''}".strip(),
                }
            )
    for dcs in decisions:
        fc = dcs.forecast
        same = (
            None
            if fc is None
            else next(
                (
                    f
                    for f in fcs
                    if f["metric"] == fc.metric and math.isclose(f["value"], fc.value, rel_tol=1e-3)
                ),
                None,
            )
        )
        if (
            same is not None
        ):  # the decision pre-registered this forecast event's number: one row, both sources
            same["source_text"] = f"decision {dcs.id}; {same['source_text']}"
        elif dcs.forecast is not None:
            fcs.append(
                {
                    "metric": dcs.forecast.metric,
                    "step": None,  # a decision's forecast is for the end of the run
                    "value": dcs.forecast.value,
                    "low": None,
                    "high": None,
                    "source_text": f"decision {dcs.id}: {dcs.forecast.assumptions}".strip(),
                }
            )
    actuals = q.metric_series(con, run, sorted({f["metric"] for f in fcs}))
    for metric, pts in actuals.items():  # `eval/loss` that is not a metric: the run's eval events
        if not pts and metric.startswith("eval/"):
            actuals[metric] = q.eval_series(con, run, metric.removeprefix("eval/"))
    for f in fcs:
        pts = [(s, v) for s, v in actuals.get(f["metric"], []) if math.isfinite(v)]
        if f["step"] is not None:
            pts = [(s, v) for s, v in pts if s <= f["step"]]
        f["actual"] = pts[-1][1] if pts else None
        f["actual_step"] = pts[-1][0] if pts else None
        if f["actual"] is None:
            f["verdict"] = "no data"
        elif f["low"] is not None and f["high"] is not None:
            f["verdict"] = (
                "inside band"
                if f["low"] <= f["actual"] <= f["high"]
                else ("above band" if f["actual"] > f["high"] else "below band")
            )
        else:
            f["verdict"] = f"{f['actual'] - f['value']:+.4g} vs forecast"
    return fcs, actuals


def _story(rep_parts: dict[str, Any]) -> list[str]:
    info, status, tl = rep_parts["info"], rep_parts["status"], rep_parts["timeline"]
    run = info["run"]
    steps = info.get("final_step") if info.get("final_step") is not None else info.get("last_step")
    lines = []
    if info.get("start_time") is None:
        lines.append(
            f"{run} has no run_start event: it is a folder of observatory records, not a training run."
        )
    elif status == "crashed":
        lines.append(
            f"{run} crashed: no run_end was written and its writers went silent after step {steps} "
            f"(last event {fmt_time(info.get('writer_t') or info.get('last_event_t'))})."
        )
    else:
        lines.append(f"{run} {status} at step {steps}.")
    if info.get("parent_run"):
        lines.append(f"It started from {info['parent_run']} at step {info.get('parent_step')}.")
    nf = rep_parts["nonfinite"]
    if nf:
        lines.append(
            f"{rep_parts['loss_name'] or 'train/loss'} first became non-finite at step {nf[0]} ({len(nf)} non-finite steps)."
        )
    found = [e for e in tl if e["kind"] == "anomaly" and e["step"] is not None]
    # an info finding (a busy machine's throughput dip) is worth knowing, not a warning: off the headline
    anoms = [e for e in found if (e["data"] or {}).get("severity") != "info"]
    infos = len(found) - len(anoms)
    fails = [e for e in tl if e["kind"] == "failure"]
    if anoms:
        first = anoms[0]
        lead = ""
        ref = fails[0]["step"] if fails and fails[0]["step"] is not None else (nf[0] if nf else None)
        if ref is not None and ref >= first["step"]:
            lead = (
                f", {ref - first['step']} steps before the {'failure' if fails else 'first non-finite loss'}"
            )
        n = f"{len(anoms)} anomal{'y' if len(anoms) == 1 else 'ies'}"
        lines.append(f"{n}; the first warning came at step {first['step']}{lead}: {first['text']}.")
    elif infos:
        lines.append("No warning: no detector found anything to act on.")
    if infos:
        lines.append(
            f"{infos} info finding{'' if infos == 1 else 's'} (worth knowing, not warnings: see the timeline)."
        )
    for e in fails[:5]:
        at = f"step {e['step']}" if e["step"] is not None else "an unknown step"
        lines.append(f"Failure at {at}: {e['text']}.")
    if len(fails) > 5:
        lines.append(f"... and {len(fails) - 5} more failures (see the timeline).")
    if rep_parts["decisions"]:
        ds = rep_parts["decisions"]
        lines.append(
            f"{len(ds)} decision{'' if len(ds) == 1 else 's'} linked to this run: "
            + "; ".join(f"{d.id} ({d.status})" for d in ds[:5])
            + ("…" if len(ds) > 5 else "")
            + "."
        )
    for f in rep_parts["forecasts"][:3]:
        if f["actual"] is not None and f["low"] is not None and f["high"] is not None:
            missed = f["verdict"] != "inside band"
            lines.append(
                f"The forecast {f['metric']} {fmt_value(f['value'])} (band {fmt_value(f['low'])}–"
                f"{fmt_value(f['high'])}) {'missed' if missed else 'held'}: actual {fmt_value(f['actual'])} "
                f"at step {f['actual_step']}, {f['verdict']}."
            )
        elif f["actual"] is not None:
            lines.append(
                f"Forecast {f['metric']} = {fmt_value(f['value'])}; actual {fmt_value(f['actual'])} "
                f"at step {f['actual_step']} ({f['verdict']})."
            )
    return lines


def _slow(con, run: str, timeline: list[dict]) -> list[dict]:
    """The run's slow-change findings (`observatory.detect.trend`), each with its metric over the whole run
    (64-step means, as the detector read it), at most `MAX_WINDOWS`."""
    found = [e for e in timeline if e["kind"] == "anomaly" and e["data"].get("trend") is True][:MAX_WINDOWS]
    if not found:
        return []
    points = trend_points(con, [run], list(TREND_METRICS), EVAL, 0).get(run, {})
    out = []
    for e in found:
        d = e["data"]
        metric = str(d.get("metric") or "")
        steps, values = points.get(metric, ([], []))
        since = d.get("since_step") if isinstance(d.get("since_step"), int) else e["step"]
        out.append(
            {
                "title": f"{d.get('severity')} at step {e['step']}: {e['text']}",
                "kind": "anomaly",
                "metric": metric,
                "severity": str(d.get("severity") or ""),
                "message": str(d.get("message") or ""),
                "step": e["step"],
                "since": since,
                "lo": since,
                "hi": e["step"],
                "baseline": d.get("baseline") if isinstance(d.get("baseline"), int | float) else None,
                "series": [(int(a), float(b)) for a, b in zip(list(steps), list(values), strict=True)],
            }
        )
    return out


def build(db, run: str, *, now: float | None = None) -> Report:
    """Collect a run's report from the store (a path or an open connection). ValueError if unknown."""

    def work(con) -> Report:
        info = q.run_info(con, run)
        if info is None:
            raise ValueError(f"no run {run!r} in the store (see `observatory runs`; ingest first?)")
        info["writer_t"] = q.last_writer_t(con, run, OBSERVATORY_HOST)
        status = effective_status(info, now)
        events = q.run_events(con, run)
        timeline = [
            {
                "step": e["step"],
                "t": e["t"],
                "kind": e["kind"],
                "seq": e["seq"],
                "data": e["data"],
                "text": describe(e["kind"], e["data"]),
            }
            for e in events
        ]
        names = q.metric_names(con, run)
        loss = loss_name(names)
        series = q.metric_series(con, run, overview_names(names), max_points=MAX_POINTS)
        nonfinite = q.nonfinite_steps(con, run, loss) if loss else []
        last_step = info.get("final_step") if info.get("final_step") is not None else info.get("last_step")
        unreadable: list[tuple[str, str]] = []
        every = dec.list_decisions(con, unreadable=unreadable)
        decisions = [d for d in every if any(link.run == run for link in d.runs)]
        linked = {d.id for d in decisions}
        decisions += [d for d in every if d.id not in linked and dec.home_run(con, d.id) == run]
        forecasts, actuals = _forecasts(con, run, events, decisions)
        li = lin.lineage(con, run) if info.get("start_time") is not None else None
        ladder = q.ladder_runs(con, info["ladder_name"]) if info.get("ladder_name") else []
        tokens = q.last_value(con, run, "data/tokens")
        final_loss = q.last_value(con, run, loss, finite=True) if loss else None
        summary = [
            ("status", status),
            ("name", info.get("name") or "-"),
            ("steps", fmt_value(last_step)),
            ("tokens", fmt_value(tokens[1]) if tokens else fmt_value((info.get("data") or {}).get("tokens"))),
            (
                f"final {loss or 'train/loss'} (last finite)",
                f"{fmt_value(final_loss[1])} at step {final_loss[0]}" if final_loss else "-",
            ),
            ("first non-finite loss", f"step {nonfinite[0]}" if nonfinite else "none"),
            ("started", fmt_time(info.get("start_time"))),
            ("ended", fmt_time(info.get("end_time"))),
            ("last event from the run", fmt_time(info.get("writer_t"))),
            ("parent", f"{info['parent_run']}@{info['parent_step']}" if info.get("parent_run") else "-"),
            (
                "ladder",
                f"{info['ladder_name']} rung {info.get('ladder_rung')}" if info.get("ladder_name") else "-",
            ),
        ]
        gp = goodput(con, [run]).get(run)
        if gp is not None and gp["total_s"]:
            summary.append(("goodput", describe_goodput(gp)))
        if info.get("redactions"):
            summary.append(("secrets", redacted_note(info["redactions"])))
        for did, reason in unreadable:  # a foreign log's decision record that is not valid: named, not fatal
            if dec.home_run(con, did) == run:
                summary.append((f"decision {did} (not shown)", reason))
        for f in forecasts:
            summary.append(
                (
                    f"forecast {f['metric']}",
                    f"{fmt_value(f['value'])} -> actual {fmt_value(f['actual'])} ({f['verdict']})",
                )
            )
        parts = {
            "info": info,
            "status": status,
            "timeline": timeline,
            "nonfinite": nonfinite,
            "loss_name": loss,
            "decisions": decisions,
            "forecasts": forecasts,
        }
        return Report(
            run=run,
            info=info,
            status=status,
            story=_story(parts),
            summary=summary,
            timeline=timeline,
            series=series,
            windows=_windows(con, run, timeline, last_step, loss),
            expert_layers=q.expert_load_by_layer(con, run),
            expert_matrix=q.expert_load_matrix(con, run),
            drops=q.drop_series(con, run),
            lineage=li,
            config=info.get("config") or {},
            config_diffs=[e for e in timeline if e["kind"] == "config_diff"],
            forecasts=forecasts,
            forecast_actuals=actuals,
            ladder=ladder,
            decisions=decisions,
            metric_names=names,
            nonfinite=nonfinite,
            loss_name=loss,
            slow=_slow(con, run, timeline),
        )

    with using(db) as con:
        return work(con)
