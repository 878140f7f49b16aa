"""Queries behind the alert rules (`observatory.alerts`) and their Prometheus endpoint.

Each takes the runs it is for as a list and answers for all of them in one query (a lab's follower
evaluates every live run every few seconds: never a query per run). Rows come back as tuples, in the
order their docstrings give. A run's progress and phase (the `stalled` rule's clock) come from
`observatory.queries.anomalies.run_activity`, the detectors' one definition.
"""

from __future__ import annotations

from observatory.events import OBSERVATORY_HOST

__all__ = [
    "live_run_rows",
    "alert_rows",
    "finding_episodes",
    "host_last_seen",
    "metric_tails",
    "metric_median",
    "host_step_pace",
    "hbm_use",
    "last_values",
]

_RUNS = "run IN (SELECT unnest($runs::VARCHAR[]))"


def live_run_rows(con, since: float, also: list[str]) -> list[tuple]:
    """(run, project, config, status, last_step, last_event_t, start_time) of the runs `running` or `crashed`
    with an own event at or after `since`, and of the runs `also`."""
    return con.execute(
        """
        SELECT run, project, config, status, last_step, last_event_t, start_time FROM runs
        WHERE (status IN ('running', 'crashed') AND coalesce(last_event_t, start_time, 0) >= $since)
           OR run IN (SELECT unnest($also::VARCHAR[]))
        """,
        {"since": since, "also": also},
    ).fetchall()


def alert_rows(con, runs: list[str] | None = None) -> list[tuple]:
    """(run, data) of the newest `alert` event of each episode key (run, rule, host, the finding's detector and
    metric), of every run or of `runs`."""
    only = "" if runs is None else f"AND {_RUNS}"
    return con.execute(
        f"""
        SELECT run, arg_max(data, seq) FROM events
        WHERE kind = 'alert' AND host = $host {only}
        GROUP BY run, data->>'rule', data->>'host', data->'finding'->>'detector', data->'finding'->>'metric'
        """,
        {"host": OBSERVATORY_HOST} | ({} if runs is None else {"runs": runs}),
    ).fetchall()


def finding_episodes(con, runs: list[str], severities: list[str]) -> list[tuple]:
    """(run, detector, metric, newest step, count, newest message, newest severity) of the detectors' findings
    of `severities` (stalled_run aside: the `stalled` rule says that), one row per (run, detector, metric)."""
    return con.execute(
        f"""
        SELECT run, data->>'detector' AS det, data->>'metric' AS metric, max(step) AS step, count(*) AS n,
               arg_max(data->>'message', seq) AS msg, arg_max(data->>'severity', seq) AS sev
        FROM events
        WHERE kind = 'anomaly' AND host = $host AND {_RUNS}
          AND data->>'severity' IN (SELECT unnest($sevs::VARCHAR[])) AND data->>'detector' <> 'stalled_run'
        GROUP BY ALL
        """,
        {"host": OBSERVATORY_HOST, "sevs": severities, "runs": runs},
    ).fetchall()


def host_last_seen(con, runs: list[str]) -> list[tuple]:
    """(run, host, its newest event/step/heartbeat time, the run's newest such time, the run's host count)."""
    return con.execute(
        f"""
        WITH last AS (
            SELECT run, host, max(t) AS t FROM events WHERE host <> $host AND {_RUNS} GROUP BY ALL
            UNION ALL
            SELECT run, host, max(t) FROM metrics WHERE {_RUNS} GROUP BY ALL
            UNION ALL
            SELECT run, host, max(t) FROM heartbeats WHERE {_RUNS} GROUP BY ALL
        ), per AS (SELECT run, host, max(t) AS t FROM last GROUP BY ALL)
        SELECT run, host, t, max(t) OVER (PARTITION BY run) AS newest, count(*) OVER (PARTITION BY run) AS n FROM per
        """,
        {"host": OBSERVATORY_HOST, "runs": runs},
    ).fetchall()


def metric_tails(con, name: str, runs: list[str], n: int) -> dict[str, tuple[list[float], list[int]]]:
    """Each run's last `n` logged values of `name`, newest first: {run: (values, steps)} (a replayed step's
    newest value: rows not `replaced`)."""
    rows = con.execute(
        f"""
        SELECT run, list(value ORDER BY step DESC), list(step ORDER BY step DESC) FROM (
            SELECT run, step, value, row_number() OVER (PARTITION BY run ORDER BY step DESC) AS k FROM metrics
            WHERE name = $name AND {_RUNS} AND NOT replaced
        ) WHERE k <= $n GROUP BY run
        """,
        {"name": name, "n": n, "runs": runs},
    ).fetchall()
    return {run: (values, steps) for run, values, steps in rows}


def metric_median(con, run: str, name: str, lo: int, hi: int) -> float | None:
    """One run's median of a metric over steps [lo, hi] (None when it logged none there)."""
    row = con.execute(
        "SELECT median(value) FROM metrics WHERE run = $run AND name = $name AND step BETWEEN $lo AND $hi "
        "AND NOT replaced",
        {"run": run, "name": name, "lo": lo, "hi": hi},
    ).fetchall()
    return row[0][0] if row else None


def host_step_pace(con, runs: list[str], since: float) -> list[tuple]:
    """(run, host, its seconds per step by its own heartbeats since `since`, the run's median host's, the run's
    host count), for hosts with three heartbeats or more there."""
    return con.execute(
        f"""
        WITH per AS (
            SELECT run, host, (max(t) - min(t)) / nullif(max(step) - min(step), 0) AS s_per_step
            FROM heartbeats WHERE {_RUNS} AND t >= $since AND step IS NOT NULL
            GROUP BY ALL HAVING count(*) >= 3
        )
        SELECT run, host, s_per_step, median(s_per_step) OVER (PARTITION BY run) AS mid, count(*) OVER (PARTITION BY run)
        FROM per WHERE s_per_step IS NOT NULL
        """,
        {"since": since, "runs": runs},
    ).fetchall()


def hbm_use(con, runs: list[str], since: float) -> list[tuple]:
    """(run, host, accelerator, its newest memory in use, its least-squares slope in bytes/s, its limit) over the
    heartbeats since `since` (three or more)."""
    return con.execute(
        f"""
        WITH used AS (
            SELECT run, host, regexp_extract(name, '^accel/([^/]+)/', 1) AS dev, t, value FROM host_telemetry
            WHERE {_RUNS} AND t >= $since AND name LIKE 'accel/%/hbm_used_bytes'
        ), lim AS (
            SELECT run, host, regexp_extract(name, '^accel/([^/]+)/', 1) AS dev, arg_max(value, t) AS limit_bytes
            FROM host_telemetry
            WHERE {_RUNS} AND t >= $since AND name LIKE 'accel/%/hbm_limit_bytes'
            GROUP BY ALL
        )
        SELECT u.run, u.host, u.dev, arg_max(u.value, u.t), regr_slope(u.value, u.t), any_value(l.limit_bytes)
        FROM used u JOIN lim l USING (run, host, dev) GROUP BY ALL HAVING count(*) >= 3
        """,
        {"since": since, "runs": runs},
    ).fetchall()


def last_values(con, runs: list[str], names: list[str]) -> list[tuple]:
    """(run, name, last value, last time) of some metrics of some runs (`metric_series`)."""
    return con.execute(
        f"""SELECT run, name, last_value, last_t FROM metric_series
            WHERE {_RUNS} AND name IN (SELECT unnest($names::VARCHAR[]))""",
        {"runs": runs, "names": names},
    ).fetchall()
