"""Scaling-ladder queries: ladders, their rungs and targets, eval curves, forecasts, deviations.

A ladder is the set of runs whose `run_start` carried `ladder.name`; a run whose
ladder info says `target: true` (or `rung: "target"`) is a target the ladder
forecasts, every other run is a rung. Every function takes an open connection
(`with observatory.store.connect(db) as con:`).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ladders",
    "ladder_runs",
    "run_ladder",
    "eval_points",
    "forecast_events",
    "deviation_anomalies",
    "eval_datasets",
    "loss_metrics",
    "rejected_ladder_runs",
]


def _json(x: Any) -> Any:
    if isinstance(x, str):
        try:
            return json.loads(x)
        except ValueError:
            return None
    return x


def is_target(ladder: dict | None) -> bool:
    """Whether a run's ladder info marks it as a target rather than a rung."""
    return bool(ladder) and (ladder.get("target") is True or ladder.get("rung") == "target")


def ladders(con) -> list[dict[str, Any]]:
    """Every ladder: name, rungs (distinct rung labels), runs (rung runs: seeds count once each),
    targets (run ids), newest start time."""
    rows = con.execute(
        """SELECT ladder_name, run, ladder_rung, ladder, start_time FROM runs
           WHERE ladder_name IS NOT NULL ORDER BY ladder_name, start_time NULLS LAST, run"""
    ).fetchall()
    out: dict[str, dict[str, Any]] = {}
    labels: dict[str, set] = {}
    for name, run, rung, ladder, start in rows:
        d = out.setdefault(name, {"name": name, "rungs": 0, "runs": 0, "targets": [], "last_start": None})
        if is_target(_json(ladder)):
            d["targets"].append(run)
        else:
            d["runs"] += 1
            labels.setdefault(name, set()).add(rung if rung is not None else run)
            d["rungs"] = len(labels[name])
        if start is not None:
            d["last_start"] = max(d["last_start"] or start, start)
    return list(out.values())


def ladder_runs(con, name: str) -> list[dict[str, Any]]:
    """The runs of one ladder (rungs and targets): run, rung, ladder info, status, steps, start time."""
    rows = con.execute(
        """SELECT run, ladder_rung, ladder, status, final_step, last_step, start_time, model
           FROM runs WHERE ladder_name = ? ORDER BY start_time NULLS LAST, run""",
        [name],
    ).fetchall()
    out = []
    for run, rung, ladder, status, final_step, last_step, start, model in rows:
        info = _json(ladder) or {}
        out.append(
            {
                "run": run,
                "rung": rung,
                "ladder": info,
                "target": is_target(info),
                "status": status,
                "final_step": final_step,
                "last_step": last_step,
                "start_time": start,
                "model": _json(model) or {},
            }
        )
    return out


def run_ladder(con, run: str) -> dict[str, Any] | None:
    """One run's ladder info, status, steps and start time; None if the run is not in the store."""
    row = con.execute(
        "SELECT ladder_name, ladder, status, final_step, last_step, start_time FROM runs WHERE run = ?", [run]
    ).fetchone()
    if row is None:
        return None
    name, ladder, status, final_step, last_step, start = row
    return {
        "ladder_name": name,
        "ladder": _json(ladder) or {},
        "status": status,
        "final_step": final_step,
        "last_step": last_step,
        "start_time": start,
    }


def eval_points(con, runs: list[str]) -> list[dict[str, Any]]:
    """Every `eval` event of these runs: run, step, dataset, loss (NaN kept), t; by run then step."""
    if not runs:
        return []
    rows = con.execute(
        """SELECT run, step, json_extract_string(data, '$.dataset') AS dataset,
                  TRY_CAST(json_extract_string(data, '$.loss') AS DOUBLE) AS loss, t
           FROM events WHERE kind = 'eval' AND step IS NOT NULL AND run IN (SELECT unnest(?::VARCHAR[]))
           ORDER BY run, step, t, host, seq""",
        [list(runs)],
    ).fetchall()
    return [{"run": r[0], "step": r[1], "dataset": r[2], "loss": r[3], "t": r[4]} for r in rows]


def forecast_events(con, run: str | None = None, ladder: str | None = None) -> list[dict[str, Any]]:
    """Stored `forecast` events, oldest first: run, t, host, seq, step, the run's `started` (its first
    run_start's time) and the data fields (`signed_by`: the key that signed one of the observatory's)."""
    rows = con.execute(
        """SELECT run, t, host, seq, step, data, (SELECT start_time FROM runs r WHERE r.run = events.run)
           FROM events WHERE kind = 'forecast' AND ($run IS NULL OR run = $run)
             AND ($ladder IS NULL OR json_extract_string(data, '$.source.ladder') = $ladder)
           ORDER BY t, run, seq""",
        {"run": run, "ladder": ladder},
    ).fetchall()
    out = []
    for run_id, t, host, seq, step, data, started in rows:
        d = _json(data) or {}
        out.append({"run": run_id, "t": t, "host": host, "seq": seq, "step": step, **d, "started": started})
    return out


def deviation_anomalies(con, run: str, detector: str = "ladder_deviation") -> list[dict[str, Any]]:
    """Stored anomalies of one detector for a run, oldest first."""
    rows = con.execute(
        """SELECT step, t, data FROM events WHERE kind = 'anomaly' AND run = ?
             AND json_extract_string(data, '$.detector') = ? ORDER BY t, seq""",
        [run, detector],
    ).fetchall()
    return [{"step": s, "t": t, **(_json(d) or {})} for s, t, d in rows]


def eval_datasets(con, runs: list[str]) -> dict[str, list[str]]:
    """run -> the eval datasets it has `eval` events for (any dataset)."""
    rows = con.execute(
        """SELECT run, list(DISTINCT json_extract_string(data, '$.dataset') ORDER BY 1) FROM events
           WHERE kind = 'eval' AND run IN (SELECT unnest(?::VARCHAR[])) GROUP BY run""",
        [list(runs)],
    ).fetchall()
    return {r: [d for d in ds if d is not None] for r, ds in rows}


def loss_metrics(con, runs: list[str]) -> dict[str, list[str]]:
    """run -> names of its logged metrics that hold a loss (`metrics` events, not `eval` events)."""
    rows = con.execute(
        """SELECT run, list(name ORDER BY name) FROM metric_series
           WHERE run IN (SELECT unnest(?::VARCHAR[])) AND lower(name) LIKE '%loss%' GROUP BY run""",
        [list(runs)],
    ).fetchall()
    return dict(rows)


def rejected_ladder_runs(con, name: str, limit: int = 20) -> list[dict[str, Any]]:
    """Run folders whose `run_start` names ladder `name` and that ingest rejected for their run id
    (field `run`): folder, the run id, the reason."""
    rows = con.execute(
        """SELECT run, any_value(raw), any_value(reason) FROM rejected_events
           WHERE field = 'run' AND raw LIKE '%"run_start"%' AND raw LIKE '%' || ? || '%'
           GROUP BY run ORDER BY run LIMIT ?""",
        [json.dumps(name), limit],
    ).fetchall()
    out = []
    for folder, raw, reason in rows:
        ev = _json(raw)
        lad = ((ev or {}).get("data") or {}).get("ladder") if isinstance(ev, dict) else None
        if isinstance(lad, dict) and lad.get("name") == name:
            out.append({"folder": folder, "run": ev.get("run"), "reason": reason})
    return out


def decision_markers(con, name: str):
    """`decision` events stored in any run of ladder `name`, as chart markers (kind, step, t, host, data)."""
    import polars as pl  # lazy for start-up time: the ladder CLI reads this module without polars

    rows = con.execute(
        """SELECT e.kind, e.step, e.t, e.host, e.data::VARCHAR FROM events e JOIN runs r USING (run)
           WHERE e.kind = 'decision' AND r.ladder_name = ? ORDER BY coalesce(e.step, -1), e.t, e.seq""",
        [name],
    ).fetchall()
    cols = ("kind", "step", "t", "host", "data")
    return pl.DataFrame(
        [dict(zip(cols, r, strict=True)) for r in rows],
        schema={"kind": pl.String, "step": pl.Int64, "t": pl.Float64, "host": pl.Int64, "data": pl.String},
    )
