"""Many-run queries over a selection (`observatory.queries.selection`): the selected runs, one metric's
final or best value per run with chosen config keys, and group curves (mean, sd, min, max, n per x bucket).

Each is one SQL statement over the selection, whatever the number of runs: no loop of statements per run.
A metric is a metric name (`train/loss`: its last logged value, or its lowest finite value for `best`),
or `eval:<dataset>`: the `loss` of that dataset's `eval` events (the last one, or the lowest).
"""

from __future__ import annotations

from typing import Any

from observatory import settings
from observatory.queries.selection import (
    FOLDED_COLUMNS,
    MAX_DEPTH,
    SEGMENT,
    Selection,
    SelectionError,
    key_sql,
    parse_selection,
    selected_sql,
)
from observatory.store.schema import METRIC_RESOLUTIONS

__all__ = [
    "select_runs",
    "count_selected",
    "final_values",
    "group_curves",
    "sweep_keys",
    "metric_choices",
    "selected_roots",
    "X_AXES",
    "MAX_KEYS",
]

X_AXES = ("step", "tokens", "flops", "time")
MAX_KEYS = 8  # config keys in one view (group-by, pivot, parallel coordinates)
_OUT = [c for c in FOLDED_COLUMNS if c != "attempts"]


def _sel(sel: Selection | str | list | tuple | None) -> Selection:
    """A selection from its text, or from the run ids `selected_roots` resolved it to."""
    if isinstance(sel, Selection):
        return sel
    if isinstance(sel, list | tuple):
        return Selection("", (), tuple(sel))
    return parse_selection(sel)


def selected_roots(
    con, sel: Selection | str | None, limit: int = 10_001, now: float | None = None
) -> list[str]:
    """The selected runs' ids (each the first attempt of its restarts), at most `limit`, in id order: pass
    them to the other functions here in place of the text, so a page's views read only these runs."""
    head, params = selected_sql(_sel(sel), now, lean=True)
    return [
        r[0]
        for r in con.execute(
            f"{head} SELECT run FROM selected ORDER BY run LIMIT {int(limit)}", params
        ).fetchall()
    ]


def select_runs(
    con, sel: Selection | str | None, limit: int | None = 1000, offset: int = 0, now: float | None = None
) -> list[dict[str, Any]]:
    """The selected (folded) runs, newest first: FOLDED_COLUMNS as dicts, `limit` from `offset`."""
    head, params = selected_sql(_sel(sel), now)
    sql = f"{head} SELECT {', '.join(FOLDED_COLUMNS)} FROM selected ORDER BY start_time DESC NULLS LAST, run"
    if limit is not None:
        sql += f" LIMIT {int(limit)} OFFSET {int(offset)}"
    return [dict(zip(FOLDED_COLUMNS, r, strict=True)) for r in con.execute(sql, params).fetchall()]


def count_selected(con, sel: Selection | str | None, now: float | None = None) -> int:
    head, params = selected_sql(_sel(sel), now, lean=True)
    return con.execute(f"{head} SELECT count(*) FROM selected", params).fetchall()[0][0]


def _keys(keys) -> list[str]:
    keys = [k for k in keys if k]
    if len(keys) > MAX_KEYS:
        raise SelectionError(f"{len(keys)} keys; at most {MAX_KEYS}")
    return keys


def _value_sql(metric: str, best: bool, params: dict[str, Any]) -> tuple[str, str]:
    """(CTE body giving (run, value) keyed by the selected runs' newest attempts, its note): the final value
    is the newest attempt's; the best is the lowest over every attempt of the run."""
    scope = "(SELECT unnest(attempts) FROM selected)" if best else "(SELECT last FROM selected)"
    if metric.startswith("eval:"):
        params["ds"] = metric[5:]
        # the selected runs' evals first, then their JSON (a filter on it went first: every eval of the store)
        rows = f"""WITH evs AS MATERIALIZED (SELECT run, step, t, host, seq, data FROM events
                                            WHERE kind = 'eval' AND known AND run IN {scope})
                   SELECT run, step, t, host, seq, TRY_CAST(data->>'$.loss' AS DOUBLE) AS v FROM evs
                   WHERE data->>'$.dataset' = $ds"""
        kind = "eval"
        if not best:
            return f"SELECT run, arg_max(v, (step, t, host, seq)) AS value FROM ({rows}) GROUP BY run", kind
    else:
        params["metric"] = metric
        kind = "metric"
        if not best:
            return (
                f"SELECT run, last_value AS value FROM metric_series WHERE name = $metric AND run IN {scope}",
                kind,
            )
        res = METRIC_RESOLUTIONS[0]
        # the finest rollup's min, and the rows it has not rolled up yet (its min is over finite values)
        rows = f"""SELECT run, min AS v FROM metrics_r{res} WHERE name = $metric AND run IN {scope}
                   UNION ALL
                   SELECT run, value FROM metrics WHERE name = $metric AND isfinite(value) AND NOT replaced
                     AND run IN {scope}
                     AND rowid >= (SELECT coalesce(max(next_rowid), 0) FROM rollup_state WHERE source = 'metrics')"""
    return (
        f"""SELECT a.last AS run, min(x.v) FILTER (WHERE isfinite(x.v)) AS value
            FROM (SELECT last, unnest(attempts) AS att FROM selected) a JOIN ({rows}) x ON x.run = a.att
            GROUP BY a.last""",
        kind,
    )


def final_values(
    con,
    sel: Selection | str | None,
    metric: str,
    keys=(),
    best: bool = False,
    limit: int = 100_000,
    now: float | None = None,
) -> dict[str, Any]:
    """One row per selected run that logged `metric`: the folded run's columns, `value` (final, or best),
    and the value of each of `keys` (dotted, e.g. `config.model.width`, as text). Returns
    {"rows": [...], "keys": [...], "selected": n, "missing": runs without the metric, "truncated": bool}."""
    keys = _keys(keys)
    sel = _sel(sel)
    head, params = selected_sql(sel, now)
    body, _ = _value_sql(metric, best, params)
    kcols = "".join(f", {key_sql(k, f'k{i}', params, 's.')} AS k{i}" for i, k in enumerate(keys))
    # the count of selected runs rides along (a second statement would resolve the selection again)
    sql = f"""{head}, vals AS MATERIALIZED ({body})
        SELECT {", ".join("s." + c for c in _OUT)}, s.attempts, s.code->>'$.commit' AS commit, v.value{kcols},
               (SELECT count(*) FROM selected) AS total
        FROM selected s JOIN vals v ON v.run = s.last
        ORDER BY s.budget NULLS LAST, s.tokens NULLS LAST, s.run LIMIT {int(limit) + 1}"""
    rows = con.execute(sql, params).fetchall()
    total = rows[0][-1] if rows else count_selected(con, sel, params["cut"] + settings.get("stale_after_s"))
    truncated = len(rows) > limit
    rows = [r[:-1] for r in rows[:limit]]
    cols = [*_OUT, "attempts", "commit", "value", *(f"k{i}" for i in range(len(keys)))]
    out = []
    for r in rows:
        d = dict(zip(cols, r, strict=True))
        d["keys"] = {k: d.pop(f"k{i}") for i, k in enumerate(keys)}
        out.append(d)
    return {
        "rows": out,
        "keys": keys,
        "selected": total,
        "missing": total - len(rows) if not truncated else None,
        "truncated": truncated,
    }


def group_curves(
    con,
    sel: Selection | str | None,
    metric: str,
    keys=(),
    x: str = "step",
    max_groups: int = 12,
    max_points: int = 200,
    now: float | None = None,
) -> dict[str, Any]:
    """Curves of `metric` for the selected runs, grouped by up to two `keys`: per group and x bucket the
    mean, sd, min, max and n over the group's runs (each run's bucket mean first). Only the `max_groups`
    largest groups are drawn; `groups` says how many matched. x: step, tokens (data/tokens), flops
    (tokens x model.flops_per_token) or time (seconds since the run's start; its restarts' too). Returns {"data": frame(group, i, x, mean, sd, min, max, n),
    "groups": [{"group", "n"}] drawn, "matched_groups", "runs", "x"}."""
    if x not in X_AXES:
        raise SelectionError(f"x {x!r}: one of {', '.join(X_AXES)}")
    keys = _keys(keys)[:2]
    head, params = selected_sql(_sel(sel), now)
    params["metric"] = metric
    gexpr = (
        " || ' · ' || ".join(
            f"coalesce({key_sql(k, f'g{i}', params, 's.')}, '∅')" for i, k in enumerate(keys)
        )
        or "'all'"
    )
    # 1. the runs that logged the metric (in any attempt), their group, FLOPs per token, steps, start, attempts
    runs = con.execute(
        f"""{head} SELECT s.run, {gexpr}, TRY_CAST(s.model->>'$.flops_per_token' AS DOUBLE), min(m.first_step),
                          max(m.last_step), s.start_time, s.attempts
            FROM (SELECT *, unnest(attempts) AS att FROM selected) s
            JOIN metric_series m ON m.run = s.att AND m.name = $metric GROUP BY ALL""",
        params,
    ).fetchall()
    sizes: dict[str, int] = {}
    for r in runs:
        sizes[r[1]] = sizes.get(r[1], 0) + 1
    groups = [
        {"group": g, "n": n} for g, n in sorted(sizes.items(), key=lambda kv: (-kv[1], kv[0]))[:max_groups]
    ]
    empty = {"data": None, "groups": groups, "matched_groups": len(sizes), "runs": len(runs), "x": x}
    keep = {g["group"] for g in groups}
    kept = [r for r in runs if r[1] in keep]
    if not kept:
        return empty
    lo, hi = min(r[3] for r in kept), max(r[4] for r in kept)
    width = max(1, -(-(hi - lo + 1) // max(1, max_points)))
    # wall time is in the raw rows only (the rollups keep steps): x = time reads them at any width
    res = 1 if x == "time" else max([1, *(r for r in METRIC_RESOLUTIONS if r <= width)])
    width = -(-width // res) * res
    # a restarted run's curve is stitched: each attempt up to the step the next one resumed from
    later = [a for r in kept for a in r[6][1:]]
    resumed = (
        dict(
            con.execute(
                "SELECT run, parent_step FROM runs WHERE run IN (SELECT unnest(?::VARCHAR[]))", [later]
            ).fetchall()
        )
        if later
        else {}
    )
    segs = [
        (a, r[0], resumed.get(r[6][i + 1]) if i + 1 < len(r[6]) else None)
        for r in kept
        for i, a in enumerate(r[6])
    ]
    # 2. their points: the metric's rows (and the tokens' when x needs them), semi-joined to the attempts'
    # ids, one scan a name (`name = ?` is pushed into the scan; `name IN (?, ?)` was checked after it)
    ids = [a for a, _, _ in segs]
    names = list(dict.fromkeys([metric, *(["data/tokens"] if x in ("tokens", "flops") else [])]))
    rin = "(SELECT unnest(?::VARCHAR[]))"
    one = (
        f"SELECT run, name, step, value AS v, value AS vlast, t FROM metrics WHERE name = ? AND run IN {rin} "
        "AND NOT replaced AND isfinite(value)"
        if res == 1
        else f"SELECT run, name, last_step AS step, sum / nullif(n - n_nonfinite, 0) AS v, last AS vlast, NULL AS t "
        f"FROM metrics_r{res} WHERE name = ? AND run IN {rin}"
    )
    src = " UNION ALL ".join([one] * len(names))
    data = con.sql(
        f"""WITH seg AS (SELECT unnest(?::VARCHAR[]) AS att, unnest(?::VARCHAR[]) AS run, unnest(?::BIGINT[]) AS cut),
            m AS MATERIALIZED (SELECT seg.run, m.name, m.step, m.v, m.vlast, m.t FROM ({src}) m
                               JOIN seg ON seg.att = m.run WHERE seg.cut IS NULL OR m.step <= seg.cut),
            k AS (SELECT unnest(?::VARCHAR[]) AS run, unnest(?::VARCHAR[]) AS grp, unnest(?::DOUBLE[]) AS fpt,
                         unnest(?::DOUBLE[]) AS t0),
            pts AS (SELECT k.grp, m.run, (m.step - ?) // ? AS i, max(m.step) AS step, avg(m.v) AS v,
                           max(m.t) - any_value(k.t0) AS wall
                    FROM m JOIN k USING (run) WHERE m.name = ? GROUP BY ALL),
            tok AS (SELECT m.run, (m.step - ?) // ? AS i, max(m.vlast) AS tokens
                    FROM m WHERE m.name = 'data/tokens' GROUP BY ALL)
        SELECT p.grp AS "group", p.i, avg(CASE ? WHEN 'step' THEN p.step WHEN 'tokens' THEN t.tokens
                                            WHEN 'time' THEN p.wall ELSE t.tokens * k.fpt END) AS x,
               avg(p.v) AS mean, stddev_samp(p.v) AS sd, min(p.v) AS min, max(p.v) AS max, count(*) AS n
        FROM pts p LEFT JOIN tok t USING (run, i) JOIN k USING (run)
        GROUP BY p.grp, p.i HAVING x IS NOT NULL ORDER BY p.grp, p.i""",
        params=[
            ids,
            [r for _, r, _ in segs],
            [c for _, _, c in segs],
            *[v for n in names for v in (n, ids)],
            [r[0] for r in kept],
            [r[1] for r in kept],
            [r[2] for r in kept],
            [r[5] for r in kept],
            (lo // res) * res,
            width,
            metric,
            (lo // res) * res,
            width,
            x,
        ],
    ).pl()
    return {**empty, "data": data}


def sweep_keys(con, sel: Selection | str | None, limit: int = 200, now: float | None = None) -> list[str]:
    """The dotted config keys (leaves) the selected runs' configs have, most common first (bounded)."""
    head, params = selected_sql(_sel(sel), now)
    rows = con.execute(
        f"""{head}, sample AS (SELECT config FROM selected WHERE json_type(config) = 'OBJECT' LIMIT 2000)
            SELECT j.fullkey AS p, count(*) AS n FROM sample, json_tree(sample.config) j
            WHERE j.type NOT IN ('OBJECT', 'ARRAY') GROUP BY p ORDER BY n DESC, p LIMIT {int(limit)}""",
        params,
    ).fetchall()
    out = []
    for (
        p,
        _,
    ) in rows:  # only keys a selection can name (letters, digits, _ and -): a writer's others are left out
        key = "config." + p[2:].replace('"', "") if p.startswith("$.") and "[" not in p else None
        if key and len(key.split(".")) <= MAX_DEPTH + 1 and all(SEGMENT.match(x) for x in key.split(".")[1:]):
            out.append(key)
    return out


def metric_choices(con, sel: Selection | str | None, limit: int = 300, now: float | None = None) -> list[str]:
    """What a view can show for the selected runs: `eval:<dataset>` for each eval dataset, then metric
    names, most common first (bounded)."""
    head, params = selected_sql(_sel(sel), now, lean=True)  # the runs' ids are all it reads of them
    rows = con.execute(
        # the selected runs' evals first, their datasets then (every eval's JSON in the store was parsed
        # before the filter on run: 90 ms of the page at 10^5 runs)
        f"""{head}, lasts AS (SELECT last AS run FROM selected),
            evals AS MATERIALIZED (SELECT run, data FROM events
                                   WHERE kind = 'eval' AND known AND run IN (SELECT run FROM lasts))
            SELECT n FROM (
                SELECT 'eval:' || (data->>'$.dataset') AS n, count(DISTINCT run) AS c, 0 AS o FROM evals
                WHERE data->>'$.dataset' IS NOT NULL
                GROUP BY 1
                UNION ALL
                SELECT name, count(*), 1 FROM metric_series WHERE run IN (SELECT run FROM lasts) GROUP BY 1
            ) ORDER BY o, c DESC, n LIMIT {int(limit)}""",
        params,
    ).fetchall()
    return [r[0] for r in rows]
