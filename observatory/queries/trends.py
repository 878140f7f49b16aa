"""Queries behind the slow-change detectors (`observatory.detect.trend`): every run of a scan at once.

A scan of 10^5 small runs makes three queries here, not 10^5: the runs long enough for a trend (a series
spanning `min_span` steps, from `metric_series`) and their 64-step bucket means (`metrics_r64`), their eval
losses, and the failures of every run (a crash loop needs no length).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from observatory.events import OBSERVATORY_HOST

__all__ = ["trend_points", "failures_of", "baseline_levels"]

Points = dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]  # run -> metric -> (steps, values)


def _split(out: Points, runs: np.ndarray, names, steps: np.ndarray, values: np.ndarray) -> None:
    """Rows sorted by (run, name, step) into `out[run][name] = (steps, values)`."""
    if not len(runs):
        return
    keys = np.char.add(np.char.add(runs.astype(str), "\x00"), np.asarray(names).astype(str))
    cut = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    for lo, hi in zip(np.append(0, cut).tolist(), np.append(cut, len(keys)).tolist(), strict=True):
        out[str(runs[lo])][str(names[lo])] = (steps[lo:hi].astype(np.int64), values[lo:hi].astype(float))


def trend_points(con, runs: list[str], names: list[str], eval_name: str, min_span: int) -> Points:
    """Of `runs`, those with a series of `names` spanning `min_span` steps or more: each such series' mean per
    64-step bucket (the last step logged in it, the mean of its finite values; the bucket the last step is
    in, which may still fill, left out), and their eval losses (`eval_name`: the datasets' mean at each
    eval). Sorted by step."""
    out: Points = defaultdict(dict)
    if not runs:
        return out
    long = """SELECT s.run, s.name, s.last_step FROM metric_series s
           WHERE s.run IN (SELECT unnest($runs::VARCHAR[])) AND s.name IN (SELECT unnest($names::VARCHAR[]))
             AND s.last_step - s.first_step >= $span"""
    params = {"runs": list(runs), "names": list(names), "span": int(min_span)}
    r = con.execute(
        f"""WITH l AS ({long})
           SELECT b.run, b.name, b.last_step AS step, b.sum / (b.n - b.n_nonfinite) AS v
           FROM metrics_r64 b JOIN l ON b.run = l.run AND b.name = l.name
           WHERE b.bucket < l.last_step // 64 AND b.n > b.n_nonfinite
           ORDER BY b.run, b.name, b.bucket""",
        params,
    ).fetchnumpy()
    _split(out, np.asarray(r["run"]), np.asarray(r["name"]), np.asarray(r["step"]), np.asarray(r["v"]))
    e = con.execute(
        f"""WITH l AS ({long})
           SELECT run, step, avg(TRY_CAST(json_extract_string(data, '$.loss') AS DOUBLE)) AS v FROM events
           WHERE kind = 'eval' AND step IS NOT NULL AND run IN (SELECT DISTINCT run FROM l)
           GROUP BY run, step HAVING v IS NOT NULL ORDER BY run, step""",
        params,
    ).fetchnumpy()
    runs_e = np.asarray(e["run"])
    _split(out, runs_e, np.full(len(runs_e), eval_name), np.asarray(e["step"]), np.asarray(e["v"]))
    return out


def failures_of(con, runs: list[str]) -> dict[str, list[dict]]:
    """Each of `runs`' `failure` events (step, host, type, message, action) in the order they were written."""
    if not runs:
        return {}
    rows = con.execute(
        """SELECT run, step, host, data->>'type', data->>'message', data->>'action' FROM events
           WHERE kind = 'failure' AND host <> ? AND run IN (SELECT unnest(?::VARCHAR[]))
           ORDER BY run, t, host, seq""",
        [OBSERVATORY_HOST, list(runs)],
    ).fetchall()
    out: dict[str, list[dict]] = defaultdict(list)
    for run, step, host, typ, msg, action in rows:
        out[run].append({"step": step, "host": host, "type": typ, "message": msg, "action": action})
    return out


def baseline_levels(con, runs: list[str], names: list[str]) -> dict[str, tuple[str, dict[str, float]]]:
    """Of `runs`, those whose config names a baseline run (`baseline_run`, or `alerts.baseline_run`): that
    run's id and the median of its 64-step means of each of `names` it logged."""
    if not runs:
        return {}
    rows = con.execute(
        """WITH b AS (
             SELECT run, coalesce(json_extract_string(config, '$.baseline_run'),
                                  json_extract_string(config, '$.alerts.baseline_run')) AS base
             FROM runs WHERE run IN (SELECT unnest($runs::VARCHAR[])))
           SELECT b.run, b.base, r.name, median(r.sum / (r.n - r.n_nonfinite)) AS level
           FROM b JOIN metrics_r64 r ON r.run = b.base
           WHERE b.base IS NOT NULL AND r.name IN (SELECT unnest($names::VARCHAR[])) AND r.n > r.n_nonfinite
           GROUP BY ALL ORDER BY ALL""",
        {"runs": list(runs), "names": list(names)},
    ).fetchall()
    out: dict[str, tuple[str, dict[str, float]]] = {}
    for run, base, name, level in rows:
        if level is not None and level > 0:
            out.setdefault(run, (base, {}))[1][name] = float(level)
    return out
