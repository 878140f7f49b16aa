"""One run's details beyond its curves: its summary, histograms, artifacts and where it came from.

- `run_summary(con, run)`: the `run_summary` view for one run (latest metric values,
  overridden key by key by its `summary` events: wandb's `run.summary`, Levanter's
  `log_summary`);
- `histogram_names` / `histograms(con, run, name)`: the `histograms` view;
- `artifacts(con, run)`: its `artifact` events, newest first;
- `run_info(con, run)`: project, group, notes, source and tags from `runs`.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["run_summary", "histogram_names", "histograms", "artifacts", "run_info"]


def run_summary(con, run: str) -> list[dict[str, Any]]:
    """The run's summary as [{key, value, t, origin}] sorted by key; `value` is the decoded JSON.

    `origin` is `summary` (set by a summary event) or `metric` (the metric's latest value).
    """
    rows = con.execute(
        "SELECT key, value, t, origin FROM run_summary WHERE run = $run ORDER BY key", {"run": run}
    ).fetchall()
    return [{"key": k, "value": json.loads(v), "t": t, "origin": o} for k, v, t, o in rows]


def histogram_names(con, run: str) -> list[tuple[str, int]]:
    """[(name, number of steps)] of the run's histograms, by name."""
    return con.execute(
        "SELECT name, count(*) FROM histograms WHERE run = $run GROUP BY name ORDER BY name", {"run": run}
    ).fetchall()


def histograms(con, run: str, name: str) -> list[dict[str, Any]]:
    """Every step's histogram `name` of the run, in step order: step, bucket_limits, bucket_counts, min, max, count."""
    cols = ("step", "t", "bucket_limits", "bucket_counts", "min", "max", "count")
    rows = con.execute(
        f"SELECT {', '.join(cols)} FROM histograms WHERE run = $run AND name = $name ORDER BY step NULLS LAST, t",
        {"run": run, "name": name},
    ).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]


def artifacts(con, run: str) -> list[dict[str, Any]]:
    """The run's `artifact` events, newest first: step, t, name, type, path, bytes, digest."""
    rows = con.execute(
        """SELECT step, t, data->>'$.name', data->>'$.type', data->>'$.path',
                  TRY_CAST(data->>'$.bytes' AS BIGINT), data->>'$.digest'
           FROM events WHERE run = $run AND kind = 'artifact' AND known ORDER BY t DESC, host, seq DESC""",
        {"run": run},
    ).fetchall()
    cols = ("step", "t", "name", "type", "path", "bytes", "digest")
    return [dict(zip(cols, r, strict=True)) for r in rows]


def run_info(con, run: str) -> dict[str, Any] | None:
    """The run's project, group, notes, source (a dict) and tags, or None when it is not in the store."""
    row = con.execute(
        "SELECT project, run_group, notes, source, tags FROM runs WHERE run = $run", {"run": run}
    ).fetchone()
    if row is None:
        return None
    project, group, notes, source, tags = row
    return {
        "project": project,
        "group": group,
        "notes": notes,
        "source": json.loads(source) if source else None,
        "tags": list(tags or []),
    }
