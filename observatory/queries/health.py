"""Every host's health: the Health page's reads, from `heartbeats` and `host_telemetry`.

`health_view` is the page's one query batch for a run: per host, its newest heartbeat (age, step,
phase) and newest value of a few telemetry names; the hosts × time matrix of one telemetry name (or
of seconds per step, from each host's own heartbeats); and the telemetry names the run has. The
matrix is bucketed in SQL to at most `buckets` columns, so 1,000 hosts come back as one 1,000 × 200
array, not 10^7 rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["health_view", "host_series", "host_names_total", "STEP_TIME", "SUMMARY_NAMES"]

LATEST_S = (
    300.0  # the hosts table's telemetry: each host's newest values within this of the run's newest beat
)
STEP_TIME = "seconds per step"  # the matrix of each host's own step rate, from its heartbeats
SUMMARY_NAMES = (
    "system/cpu_percent",
    "system/rss_bytes",
    "system/mem_available_bytes",
    "accel/0/hbm_used_bytes",
    "accel/0/hbm_limit_bytes",
    "accel/0/util",
)


def _hosts(con, run: str) -> dict[str, Any]:
    rows = con.execute(
        """
        SELECT host, max(t) AS last_t, arg_max(step, t) AS step, arg_max(phase, t) AS phase, count(*) AS beats
        FROM heartbeats WHERE run = $run GROUP BY host ORDER BY host
        """,
        {"run": run},
    ).fetchall()
    # the newest values of the hosts that beat in the run's last LATEST_S (a host silent longer shows its age,
    # not stale numbers): a scan of the newest rows, not of every row (20M at 1,000 hosts x 100k steps)
    newest = max((r[1] for r in rows), default=None)
    latest = (
        []
        if newest is None
        else con.execute(
            """
        SELECT host, name, arg_max(value, t) FROM host_telemetry
        WHERE run = $run AND t >= $since AND list_contains($names::VARCHAR[], name) GROUP BY ALL
        """,
            {"run": run, "names": list(SUMMARY_NAMES), "since": newest - LATEST_S},
        ).fetchall()
    )
    per: dict[int, dict[str, float]] = {}
    for host, name, value in latest:
        per.setdefault(host, {})[name] = value
    return {
        "host": [r[0] for r in rows],
        "last_t": [r[1] for r in rows],
        "step": [r[2] for r in rows],
        "phase": [r[3] for r in rows],
        "beats": [r[4] for r in rows],
        **{n: [per.get(r[0], {}).get(n) for r in rows] for n in SUMMARY_NAMES},
    }


def _matrix(con, run: str, name: str, buckets: int) -> dict[str, Any] | None:
    """hosts × time buckets of `name` (mean per bucket), or of seconds per step (STEP_TIME)."""
    ext = con.execute(
        "SELECT min(t), max(t), count(*) / count(DISTINCT host) FROM heartbeats WHERE run = $run",
        {"run": run},
    ).fetchone()
    if ext[0] is None:
        return None
    # a bucket spans two heartbeat intervals at least, so it holds two beats of a host (a step rate needs
    # two) and no column is empty between beats: 17 beats of an 8.5-minute run make 8 columns, not 200 of
    # which 183 are blank
    span = ext[1] - ext[0]
    buckets = int(max(1, min(buckets, (ext[2] - 1) // 2)))
    t0, width = ext[0], max(span / buckets, 1e-9)
    params = {"run": run, "t0": t0, "w": width, "n": buckets - 1}
    if name == STEP_TIME:
        sql = """
            SELECT host, least(CAST(floor((t - $t0) / $w) AS BIGINT), $n) AS b,
                   (max(t) - min(t)) / nullif(max(step) - min(step), 0) AS v
            FROM heartbeats WHERE run = $run AND step IS NOT NULL GROUP BY ALL
        """
    else:
        params["name"] = name
        sql = """
            SELECT host, least(CAST(floor((t - $t0) / $w) AS BIGINT), $n) AS b, avg(value) AS v
            FROM host_telemetry WHERE run = $run AND name = $name GROUP BY ALL
        """
    rows = con.execute(sql, params).fetchnumpy()
    if not len(rows["host"]):
        return None
    hosts = np.unique(rows["host"])
    z = np.full((len(hosts), buckets), np.nan, dtype=np.float64)
    v = np.asarray(rows["v"], dtype=np.float64)
    if np.ma.isMaskedArray(rows["v"]):
        v = np.ma.filled(rows["v"].astype(np.float64), np.nan)
    z[np.searchsorted(hosts, rows["host"]), rows["b"]] = v
    return {
        "hosts": hosts.tolist(),
        "t": (t0 + width * (np.arange(buckets) + 0.5)).tolist(),  # each column's middle
        "t0": t0,  # the first heartbeat, and the last
        "t1": ext[1],
        "z": z,
        "name": name,
    }


# telemetry names a page lists (the measure picker) and draws (one host's chart): a writer may send 90k
# names a host, and each listed or drawn one costs every visitor's view (the summary names come first)
MAX_NAMES_LISTED = 200
MAX_NAMES_DRAWN = 40
_FIRST_NAMES = """
    SELECT name, count(*) OVER () AS total FROM (SELECT DISTINCT name FROM host_telemetry WHERE {where})
    ORDER BY NOT list_contains($summary::VARCHAR[], name), name LIMIT $k
"""


def _names(con, where: str, params: dict, k: int) -> tuple[list[str], int]:
    """(the first `k` telemetry names matching `where`, the summary names first; how many there are)."""
    rows = con.execute(
        _FIRST_NAMES.format(where=where), {**params, "summary": list(SUMMARY_NAMES), "k": k}
    ).fetchall()
    return [r[0] for r in rows], (rows[0][1] if rows else 0)


def health_view(con, run: str, name: str, buckets: int = 200) -> dict[str, Any]:
    """The Health page's data for `run`: its hosts' newest state, the matrix of `name`, the names it has (the
    first `MAX_NAMES_LISTED`; `names_total` says how many)."""
    names, total = _names(con, "run = $run", {"run": run}, MAX_NAMES_LISTED)
    return {
        "hosts": _hosts(con, run),
        "matrix": _matrix(con, run, name, buckets),
        "names": [STEP_TIME, *names],
        "names_total": total,
    }


def host_series(con, run: str, host: int, max_points: int = 2000) -> dict[str, dict[str, list]]:
    """One host's telemetry names over time (bucketed to `max_points` per name): {name: {t, value}}; the
    first `MAX_NAMES_DRAWN` names, the summary names first (`host_names_total` says how many it has)."""
    names, _ = _names(con, "run = $run AND host = $host", {"run": run, "host": host}, MAX_NAMES_DRAWN)
    ext = con.execute(
        "SELECT min(t), max(t) FROM host_telemetry WHERE run = $run AND host = $host",
        {"run": run, "host": host},
    ).fetchone()
    if ext[0] is None:
        return {}
    width = max((ext[1] - ext[0]) / max_points, 1e-9)
    rows = con.execute(
        """
        SELECT name, min(t) AS t, avg(value) AS v FROM host_telemetry
        WHERE run = $run AND host = $host AND list_contains($names::VARCHAR[], name)
        GROUP BY name, CAST(floor((t - $t0) / $w) AS BIGINT) ORDER BY name, t
        """,
        {"run": run, "host": host, "t0": ext[0], "w": width, "names": names},
    ).fetchall()
    out: dict[str, dict[str, list]] = {}
    for name, t, v in rows:
        d = out.setdefault(name, {"t": [], "value": []})
        d["t"].append(t)
        d["value"].append(v)
    return out


def host_names_total(con, run: str, host: int) -> int:
    """How many telemetry names one host sent (the page says how many it did not draw)."""
    return con.execute(
        "SELECT count(DISTINCT name) FROM host_telemetry WHERE run = $run AND host = $host",
        {"run": run, "host": host},
    ).fetchone()[0]
