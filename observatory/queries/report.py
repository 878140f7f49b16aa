"""SQL for post-mortem reports: one run's summary, timeline, metric windows, expert load, ladder.

Every query orders its rows fully, so the same store gives the same report.
"""

from __future__ import annotations

import json
import math
from typing import Any

from observatory.store import RUN_COLUMNS, RUN_JSON_COLUMNS

__all__ = [
    "TIMELINE_KINDS",
    "run_info",
    "run_events",
    "metric_names",
    "metric_series",
    "nonfinite_steps",
    "eval_series",
    "expert_load_by_layer",
    "expert_load_matrix",
    "drop_series",
    "ladder_runs",
    "last_value",
    "last_writer_t",
    "report_runs",
]

TIMELINE_KINDS = (
    "run_start",
    "run_end",
    "failure",
    "anomaly",
    "decision",
    "config_diff",
    "checkpoint",
    "eval",
    "forecast",
    "note",
)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def run_info(con, run: str) -> dict[str, Any] | None:
    """The run's `runs` row; for a records folder (events but no run_start, e.g. `decisions/`),
    a row of NULLs so the report can show its records. None when the store has neither."""
    row = con.execute(f"SELECT {', '.join(RUN_COLUMNS)} FROM runs WHERE run = ?", [run]).fetchall()
    if not row:
        if not con.execute("SELECT count(*) FROM events WHERE run = ?", [run]).fetchall()[0][0]:
            return None
        row = [tuple(run if c == "run" else None for c in RUN_COLUMNS)]
    out = dict(zip(RUN_COLUMNS, row[0], strict=True))
    for c in RUN_JSON_COLUMNS:
        if isinstance(out[c], str):
            out[c] = json.loads(out[c])
    out["tags"] = list(out["tags"] or [])
    return out


def report_runs(con) -> list[dict[str, Any]]:
    """Every run a report can be written for: [{run, status, start_time, last_event_t}], newest first."""
    rows = con.execute(
        "SELECT run, status, start_time, last_event_t FROM runs"
        " ORDER BY start_time DESC NULLS LAST, last_event_t DESC NULLS LAST, run"
    ).fetchall()
    return [{"run": r[0], "status": r[1], "start_time": r[2], "last_event_t": r[3]} for r in rows]


def last_writer_t(con, run: str, below_host: int) -> float | None:
    """Newest event time from the run's own writers (hosts below `below_host`): the observatory's
    findings, written later as host 1000, must not make a dead run look alive."""
    row = con.execute(
        """
        SELECT greatest(
            (SELECT max(t) FROM events WHERE run = $run AND host < $h),
            (SELECT max(t) FROM metrics WHERE run = $run AND host < $h))
        """,
        {"run": run, "h": below_host},
    ).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def run_events(con, run: str, kinds: tuple[str, ...] = TIMELINE_KINDS) -> list[dict[str, Any]]:
    """The run's non-metric events of `kinds`, by step (unstepped first), then time, host, seq."""
    rows = con.execute(
        """
        SELECT kind, step, t, host, seq, data FROM events
        WHERE run = ? AND kind IN (SELECT unnest(?::VARCHAR[]))
        ORDER BY step NULLS FIRST, t, host, seq
        """,
        [run, list(kinds)],
    ).fetchall()
    return [
        {"kind": r[0], "step": r[1], "t": r[2], "host": r[3], "seq": r[4], "data": json.loads(r[5] or "{}")}
        for r in rows
    ]


def metric_names(con, run: str) -> list[str]:
    return [
        r[0]
        for r in con.execute(
            "SELECT DISTINCT name FROM metrics WHERE run = ? ORDER BY name", [run]
        ).fetchall()
    ]


def metric_series(
    con,
    run: str,
    names: list[str],
    lo: int | None = None,
    hi: int | None = None,
    max_points: int | None = None,
) -> dict[str, list[tuple[int, float]]]:
    """{name: [(step, value), ...]} over steps [lo, hi]; a step logged twice keeps its newest value.

    With `max_points`, a long series is cut into max_points/2 step buckets and each bucket
    keeps its lowest and its highest point, so a one-step spike survives at any length.
    Non-finite values are left out then (`nonfinite_steps` lists them).
    """
    if not names:
        return {}
    params = [run, list(names), lo, lo, hi, hi]
    base = """
        SELECT name, step, arg_max(value, t) AS value FROM metrics
        WHERE run = ? AND name IN (SELECT unnest(?::VARCHAR[])) AND step IS NOT NULL AND NOT replaced
          AND (?::BIGINT IS NULL OR step >= ?::BIGINT) AND (?::BIGINT IS NULL OR step <= ?::BIGINT)
        GROUP BY name, step
    """
    if max_points is None:
        rows = con.execute(base + " ORDER BY name, step", params).fetchall()
    else:
        rows = con.execute(
            f"""
            WITH s AS ({base}),
            w AS (SELECT name, greatest(1, ceil((max(step) - min(step) + 1) / ?)::BIGINT) AS width,
                         min(step) AS s0, count(*) AS n FROM s GROUP BY name),
            b AS (
                SELECT s.name, (s.step - w.s0) // w.width AS bucket, w.n,
                       arg_min(s.step, s.value) AS lo_step, min(s.value) AS lo_v,
                       arg_max(s.step, s.value) AS hi_step, max(s.value) AS hi_v
                FROM s JOIN w USING (name) WHERE isfinite(s.value) GROUP BY ALL
            )
            SELECT name, step, value FROM s JOIN w USING (name) WHERE w.n <= ?
            UNION
            SELECT name, lo_step, lo_v FROM b WHERE n > ?
            UNION
            SELECT name, hi_step, hi_v FROM b WHERE n > ?
            ORDER BY 1, 2
            """,
            [*params, max(1, max_points // 2), max_points, max_points, max_points],
        ).fetchall()
    out: dict[str, list[tuple[int, float]]] = {n: [] for n in names}
    for name, step, value in rows:
        out[name].append((int(step), math.nan if value is None else float(value)))
    return out


def eval_series(con, run: str, field: str = "loss") -> list[tuple[int, float]]:
    """[(step, value)] of one field (`loss`, `bpb`) of a run's `eval` events, the datasets' mean at a step."""
    rows = con.execute(
        """SELECT step, avg(TRY_CAST(json_extract_string(data, '$.' || ?) AS DOUBLE)) AS v FROM events
           WHERE run = ? AND kind = 'eval' AND step IS NOT NULL GROUP BY step HAVING v IS NOT NULL ORDER BY step""",
        [field, run],
    ).fetchall()
    return [(int(s), float(v)) for s, v in rows]


def nonfinite_steps(con, run: str, name: str) -> list[int]:
    rows = con.execute(
        "SELECT DISTINCT step FROM metrics WHERE run = ? AND name = ? AND step IS NOT NULL AND NOT replaced"
        " AND (value IS NULL OR NOT isfinite(value)) ORDER BY step",
        [run, name],
    ).fetchall()
    return [int(r[0]) for r in rows]


def last_value(con, run: str, name: str, finite: bool = False) -> tuple[int, float] | None:
    """(step, value) of the newest step of a metric (the newest finite one if `finite`)."""
    row = con.execute(
        f"""
        SELECT step, arg_max(value, t) AS v FROM metrics
        WHERE run = ? AND name = ? AND step IS NOT NULL AND NOT replaced {"AND isfinite(value)" if finite else ""}
        GROUP BY step ORDER BY step DESC LIMIT 1
        """,
        [run, name],
    ).fetchone()
    return None if row is None else (int(row[0]), math.nan if row[1] is None else float(row[1]))


def expert_load_by_layer(con, run: str) -> list[dict[str, Any]]:
    """Per layer over the whole run: routed, dropped, drop fraction, hottest expert's share vs the mean,
    experts that never got a token."""
    rows = con.execute(
        """
        WITH per_expert AS (
            SELECT layer, expert, sum(routed) AS routed, sum(dropped) AS dropped
            FROM expert_load WHERE run = ? GROUP BY layer, expert
        )
        SELECT layer, count(*) AS experts, sum(routed) AS routed, sum(dropped) AS dropped,
               sum(dropped)::DOUBLE / nullif(sum(routed), 0) AS drop_fraction,
               max(routed)::DOUBLE / nullif(avg(routed), 0) AS max_over_mean,
               arg_max(expert, routed) AS hottest,
               count(*) FILTER (WHERE routed = 0) AS dead
        FROM per_expert GROUP BY layer ORDER BY layer
        """,
        [run],
    ).fetchall()
    cols = ("layer", "experts", "routed", "dropped", "drop_fraction", "max_over_mean", "hottest", "dead")
    return [dict(zip(cols, r, strict=True)) for r in rows]


def expert_load_matrix(con, run: str) -> tuple[list[int], list[int], list[list[float]]]:
    """(layers, experts, share[layer][expert]): each expert's share of its layer's routed assignments."""
    rows = con.execute(
        """
        SELECT layer, expert, sum(routed)::DOUBLE / nullif(sum(sum(routed)) OVER (PARTITION BY layer), 0)
        FROM expert_load WHERE run = ? GROUP BY layer, expert ORDER BY layer, expert
        """,
        [run],
    ).fetchall()
    layers = sorted({int(r[0]) for r in rows})
    experts = sorted({int(r[1]) for r in rows})
    li = {v: i for i, v in enumerate(layers)}
    ei = {v: i for i, v in enumerate(experts)}
    z = [[0.0] * len(experts) for _ in layers]
    for layer, expert, share in rows:
        z[li[int(layer)]][ei[int(expert)]] = float(share or 0.0)
    return layers, experts, z


def drop_series(con, run: str) -> list[tuple[int, float]]:
    """(step, dropped / routed over all layers) from expert_load."""
    rows = con.execute(
        """
        SELECT step, sum(dropped)::DOUBLE / nullif(sum(routed), 0) FROM expert_load
        WHERE run = ? GROUP BY step ORDER BY step
        """,
        [run],
    ).fetchall()
    return [(int(s), float(v) if v is not None else math.nan) for s, v in rows]


def ladder_runs(con, ladder_name: str, metric: str = "train/loss") -> list[dict[str, Any]]:
    """Runs of one ladder with their last step and last finite value of `metric`."""
    rows = con.execute(
        """
        SELECT r.run, r.ladder_rung, r.status, coalesce(r.final_step, r.last_step) AS steps,
               (SELECT arg_max(m.value, m.step) FROM metrics m
                 WHERE m.run = r.run AND m.name = ? AND isfinite(m.value) AND NOT m.replaced) AS final
        FROM runs r WHERE r.ladder_name = ? ORDER BY r.ladder_rung NULLS LAST, r.run
        """,
        [metric, ladder_name],
    ).fetchall()
    return [{"run": r[0], "rung": r[1], "status": r[2], "steps": r[3], "final": _num(r[4])} for r in rows]
