"""Core queries: runs with their live status, metric series, rejected lines.

Every function takes an open connection (the caller owns it:
`with observatory.store.connect(db) as con:`). SQL typed by a person goes through
`observatory.queries.user_sql.run_user_sql` instead.
"""

from __future__ import annotations

import re
import time
from typing import Any

from observatory import settings
from observatory.store import run_status_sql

__all__ = [
    "RUN_COLUMNS",
    "search_runs",
    "count_runs",
    "run_facets",
    "list_runs",
    "metric_series",
    "rejected",
    "loss_names",
    "loss_name",
    "LAST_LOSS_SQL",
]

# Columns `list_runs` returns, in order.
RUN_COLUMNS = (
    "run",
    "name",
    "status",
    "start_time",
    "end_time",
    "last_event_t",
    "last_step",
    "final_step",
    "parent_run",
    "parent_step",
    "ladder_name",
    "ladder_rung",
    "tags",
    "project",
    "run_group",
)


SEARCH_WORDS = 8  # words of a run search that are matched (the rest ignored, and the page says so)
SEARCH_WORD_CHARS = 64
SEARCH_TEXT_CHARS = 256  # the whole text, as a run id prefix


def search_words(text: str | None) -> list[str]:
    """The words a run search matches: the first `SEARCH_WORDS` distinct ones, each at most `SEARCH_WORD_CHARS`."""
    words: dict[str, None] = {}
    for m in re.finditer(r"\S+", text or ""):
        words.setdefault(m.group(0)[:SEARCH_WORD_CHARS].lower())
        if len(words) == SEARCH_WORDS:
            break
    return list(words)


def _run_filter(
    text: str | None, status, projects, groups, ladders=(), tags=(), runs=None, name: str | None = None
) -> tuple[str, dict[str, Any]]:
    """The WHERE of a run search over `runs` with its `status` computed (see `search_runs`) and its parameters.

    `text`: every word matches the run id, name, project, group, ladder or a tag (case-insensitive,
    anywhere in them); a run whose id is the whole text or starts with it matches too. Bounded: its first
    `SEARCH_WORDS` distinct words, each cut to `SEARCH_WORD_CHARS` (a 3,000-word `?q=` cost 5 s a view)."""
    words = search_words(text)
    where = [
        "(len($status::VARCHAR[]) = 0 OR list_contains($status::VARCHAR[], status))",
        "($name IS NULL OR name = $name)",
        "(len($projects::VARCHAR[]) = 0 OR list_contains($projects::VARCHAR[], project))",
        "(len($groups::VARCHAR[]) = 0 OR list_contains($groups::VARCHAR[], run_group))",
        "(len($ladders::VARCHAR[]) = 0 OR list_contains($ladders::VARCHAR[], ladder_name))",
        "(len($tags::VARCHAR[]) = 0 OR len(list_intersect($tags::VARCHAR[], coalesce(tags, []))) > 0)",
    ]
    statuses = [] if status is None else [status] if isinstance(status, str) else list(status)
    params: dict[str, Any] = {
        "status": statuses,
        "projects": list(projects),
        "groups": list(groups),
        "ladders": list(ladders),
        "tags": list(tags),
        "name": name,
    }
    if runs is not None:
        where.append("run IN (SELECT unnest($runs::VARCHAR[]))")
        params["runs"] = list(runs)
    for i, w in enumerate(words):
        hay = (
            "lower(concat_ws(' ', run, name, project, run_group, ladder_name, ladder_rung, "
            "array_to_string(coalesce(tags, []), ' ')))"
        )
        where.append(f"(starts_with(run, $raw) OR contains({hay}, $w{i}))")
        params[f"w{i}"] = w
    if words:
        params["raw"] = (text or "").strip()[:SEARCH_TEXT_CHARS]
    return " AND ".join(where), params


def _filtered(now: float | None, *filters) -> tuple[str, dict[str, Any], str]:
    """`_run_filter` of `filters`, with the `runs` columns that compute each run's status at `now`."""
    where, params = _run_filter(*filters)
    params["cut"] = (time.time() if now is None else now) - settings.get("stale_after_s")
    cols = ", ".join(f"{run_status_sql('$cut')} AS status" if c == "status" else c for c in RUN_COLUMNS)
    return where, params, cols


def search_runs(
    con,
    text: str | None = None,
    status=None,
    projects=(),
    groups=(),
    ladders=(),
    tags=(),
    limit: int | None = None,
    offset: int = 0,
    now: float | None = None,
    runs=None,
    name: str | None = None,
) -> list[dict[str, Any]]:
    """Runs matching a search, newest first (a run whose id is the text itself first), `status` computed now
    (`crashed` after `stale_after_s` of silence); `limit` of them from `offset` (None: all). The one run
    search of the CLI (`observatory runs --search`), the Runs page and the run pickers, server-side: a
    page of a lab's 10^5 runs never loads the others. `status` (one or a list), `projects`, `groups`,
    `ladders` and `tags` filter (a run matches one of each list given; an empty list does not filter);
    `runs`: only these ids; `name`: only runs of this name."""
    where, params, cols = _filtered(now, text, status, projects, groups, ladders, tags, runs, name)
    exact = "run = $raw DESC, " if "raw" in params else ""
    sql = (
        f"SELECT {', '.join(RUN_COLUMNS)} FROM (SELECT {cols}, ladder FROM runs) WHERE {where} "
        f"ORDER BY {exact}coalesce(start_time, last_event_t) DESC NULLS LAST, run"
    )
    if limit is not None:
        sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
    cur = con.execute(sql, params)
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in cur.fetchall()]


def count_runs(con, *filters, now: float | None = None) -> int:
    """How many runs `search_runs` would give with no limit; `filters`: its text, status, projects, groups,
    ladders and tags, in that order."""
    where, params, cols = _filtered(now, *filters)
    return con.execute(f"SELECT count(*) FROM (SELECT {cols} FROM runs) WHERE {where}", params).fetchall()[0][
        0
    ]


def run_facets(con, now: float | None = None, top: int = 200) -> dict[str, Any]:
    """What the Runs page's filters offer, from every run at once: runs per status, and the `top` most used
    ladders, tags, projects and groups (bounded lists, however many runs)."""
    cut = (time.time() if now is None else now) - settings.get("stale_after_s")
    status = dict(
        con.execute(
            f"SELECT {run_status_sql('$cut')} AS s, count(*) FROM runs GROUP BY s", {"cut": cut}
        ).fetchall()
    )
    out: dict[str, Any] = {"status": status, "total": sum(status.values())}
    for key, expr in (
        ("ladders", "ladder_name"),
        ("projects", "project"),
        ("groups", "run_group"),
        ("tags", "unnest(coalesce(tags, []))"),
    ):
        rows = con.execute(
            f"SELECT v, count(*) AS n FROM (SELECT {expr} AS v FROM runs) WHERE v IS NOT NULL "
            f"GROUP BY v ORDER BY n DESC, v LIMIT {int(top)}"
        ).fetchall()
        out[key] = sorted(r[0] for r in rows)
    return out


def list_runs(
    con,
    status: str | None = None,
    now: float | None = None,
    projects: list[str] | tuple[str, ...] = (),
    groups: list[str] | tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Every run, newest first (`search_runs` with no search and no limit)."""
    return search_runs(con, status=status, projects=projects, groups=groups, now=now)


def loss_names() -> list[str]:
    """The `loss_names` setting as a list: a run's loss is the first of these it logged."""
    return [n.strip() for n in str(settings.get("loss_names")).split(",") if n.strip()]


def loss_name(names) -> str | None:
    """The loss among a run's metric `names`: the first of `loss_names()` it logged, or None. The one rule of
    the Live chart, the report and (as `LAST_LOSS_SQL`) the Runs table's last loss."""
    have = set(names)
    return next((n for n in loss_names() if n in have), None)


# `loss_name`'s rule in SQL, set-wise over the runs of a GROUP BY run on metric_series (its `name` and
# `last_value`), with the parameter $loss_names = loss_names(): the last value of each run's loss
LAST_LOSS_SQL = (
    "arg_min(last_value, list_position($loss_names::VARCHAR[], name)) "
    "FILTER (WHERE list_contains($loss_names::VARCHAR[], name))"
)


def metric_series(con, run: str, name: str, lo: int | None = None, hi: int | None = None) -> dict[str, list]:
    """{"step": [...], "value": [...], "t": [...]} of one metric of one run, in step order (every point)."""
    rows = con.execute(
        """SELECT step, value, t FROM metrics
           WHERE run = $run AND name = $name AND NOT replaced AND ($lo IS NULL OR step >= $lo) AND ($hi IS NULL OR step <= $hi)
           ORDER BY step, t""",
        {"run": run, "name": name, "lo": lo, "hi": hi},
    ).fetchall()
    return {"step": [r[0] for r in rows], "value": [r[1] for r in rows], "t": [r[2] for r in rows]}


def rejected(con, run: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Lines ingest rejected, newest first: file, run, line, field, reason, raw."""
    cols = ("file", "run", "line", "field", "reason", "raw", "ingested_at")
    rows = con.execute(
        f"SELECT {', '.join(cols)} FROM rejected_events WHERE $run IS NULL OR run = $run "
        "ORDER BY ingested_at DESC, file, line LIMIT $limit",
        {"run": run, "limit": limit},
    ).fetchall()
    return [dict(zip(cols, r, strict=True)) for r in rows]
