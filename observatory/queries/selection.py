"""Run selection the way a lab names its runs: a small parsed language, run as one SQL statement.

    project = moe and config.optimizer.lr > 1e-3 and config.model.width in (768, 1024) and finished

A selection is clauses joined by `and` (or `;`); the empty text selects every run. A clause is

- `finished` (status completed), or `FIELD OP VALUE`, `FIELD in (V, V, ...)`, `FIELD ~ TEXT` (contains);
- FIELD: `project`, `group`, `tag` (one of the run's tags), `status`, `name`, `run`, `ladder`, `rung`,
  `started`, `ended` (a date `2026-11-01`, a time `2026-11-01T12:00`, or Unix seconds), or a dotted
  key into a run_start object: `config.<path>`, `ladder.<key>`, `model.<key>`, `data.<key>`, `code.<key>`;
- OP: `=`, `!=`, `<`, `<=`, `>`, `>=`; a number compares as a number, anything else as text
  (quote it, `'...'` or `"..."`, when it has spaces or operators).

The text comes from a URL, so it is hostile input: it is parsed into `Clause`s and every value, key path
and list reaches DuckDB as a bound parameter, never pasted into SQL. Its length, clause count, list length
and key depth are bounded (`SelectionError` names what is wrong and where).

Restarts are folded into their run: a run resumed from another run's checkpoint under the same `name`,
started after it, is an attempt of that run, not a run of its own (a parent cycle in bad data folds
nothing: each run of it is its own). A selected run is the root of such a chain: its id,
config and labels are the first attempt's, its status, steps and end the newest attempt's (`last`),
and `attempts` lists the ids oldest first (the newest holds the final values).
"""

from __future__ import annotations

import datetime as dt
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from observatory import settings
from observatory.store import run_status_sql

__all__ = [
    "Clause",
    "Selection",
    "SelectionError",
    "parse_selection",
    "selected_sql",
    "key_sql",
    "MAX_TEXT",
    "MAX_CLAUSES",
    "MAX_LIST",
    "MAX_DEPTH",
    "SEGMENT",
    "FOLDED_COLUMNS",
]

MAX_TEXT = 2000  # characters of selection text
MAX_CLAUSES = 32
MAX_LIST = 256  # values in one `in (...)`
MAX_DEPTH = 8  # segments of a dotted key
JSON_COLUMNS = ("config", "ladder", "model", "data", "code")
FIELDS = {  # field -> its column in the folded row
    "project": "project",
    "group": "run_group",
    "tag": "tags",
    "status": "status",
    "name": "name",
    "run": "run",
    "ladder": "ladder_name",
    "rung": "ladder_rung",
    "started": "start_time",
    "ended": "end_time",
}
OPS = ("=", "!=", "<", "<=", ">", ">=", "in", "~")
LATE_FIELDS = ("status", "ended")  # the newest attempt's: filtered after the restarts are folded
SEGMENT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_TOKEN = re.compile(
    r"\s*(?:(?P<op><=|>=|!=|=|<|>|~|\(|\)|,|;)|(?P<q>'[^']*'|\"[^\"]*\")|(?P<w>[^\s=<>!~(),;'\"]+)|(?P<bad>\S))"
)

# The columns a folded run row has (`selected_sql`'s `selected` CTE), in order.
FOLDED_COLUMNS = (
    "run",
    "last",
    "attempts",
    "name",
    "project",
    "run_group",
    "tags",
    "status",
    "start_time",
    "end_time",
    "last_step",
    "ladder_name",
    "ladder_rung",
    "budget",
    "tokens",
    "params",
)


class SelectionError(ValueError):
    """A selection text that does not parse; the message names the position and what was expected."""


@dataclass(frozen=True)
class Clause:
    field: str  # a FIELDS name, or a dotted key starting with one of JSON_COLUMNS
    op: str  # one of OPS; "finished" is status = completed
    values: tuple[Any, ...]  # floats or strings; one value unless op is "in"


@dataclass(frozen=True)
class Selection:
    """Parsed clauses; or (`roots`) the run ids a selection resolved to, so the views that follow read
    only those runs and their restarts instead of evaluating the clauses over every run again."""

    text: str
    clauses: tuple[Clause, ...]
    roots: tuple[str, ...] | None = None


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None or m.end() == pos:
            break
        if m.lastgroup == "bad":
            raise SelectionError(f"at character {m.start('bad') + 1}: unexpected {m.group('bad')!r}")
        kind = m.lastgroup
        out.append((kind, m.group(kind), m.start(kind) + 1))
        pos = m.end()
    return out


def _value(kind: str, tok: str) -> Any:
    if kind == "q":
        return tok[1:-1]
    try:
        x = float(tok)
    except ValueError:
        return tok
    return x if math.isfinite(x) else tok


def _when(v: Any, where: str) -> float:
    """A date, an ISO time or Unix seconds as Unix seconds (UTC when no zone is given)."""
    if isinstance(v, float):
        return v
    try:
        d = dt.datetime.fromisoformat(str(v))
    except ValueError:
        raise SelectionError(f"{where}: {v!r} is not a date (2026-11-01), a time or Unix seconds") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return d.timestamp()


def _field(word: str, where: str) -> str:
    low = word.lower()
    if low in FIELDS or low == "tags":
        return "tag" if low == "tags" else low
    head, _, rest = word.partition(".")
    if head.lower() in JSON_COLUMNS and rest:
        segs = rest.split(".")
        if len(segs) > MAX_DEPTH or not all(SEGMENT.match(s) for s in segs):
            raise SelectionError(
                f"{where}: key {word[:80]!r}: at most {MAX_DEPTH} segments of letters, digits, _ or -"
            )
        return head.lower() + "." + rest
    raise SelectionError(
        f"{where}: unknown field {word[:80]!r}; use one of {', '.join(FIELDS)}, finished, "
        f"or a key such as config.optimizer.lr ({', '.join(c + '.' for c in JSON_COLUMNS)})"
    )


def parse_selection(text: str | None) -> Selection:
    """The clauses of a selection text; raises `SelectionError` naming the position of the problem."""
    text = (text or "").strip()
    if len(text) > MAX_TEXT:
        raise SelectionError(f"selection is {len(text)} characters; at most {MAX_TEXT}")
    toks = _tokens(text)
    clauses: list[Clause] = []
    i = 0

    def expect(kinds: tuple[str, ...], what: str) -> tuple[str, str, int]:
        if i >= len(toks):
            raise SelectionError(f"at the end: expected {what}")
        t = toks[i]
        if t[0] not in kinds:
            raise SelectionError(f"at character {t[2]}: expected {what}, got {t[1][:40]!r}")
        return t

    while i < len(toks):
        kind, word, at = expect(("w",), "a field (project, config.x, ...) or finished")
        where = f"at character {at}"
        i += 1
        if word.lower() == "finished":
            clauses.append(Clause("status", "=", ("completed",)))
        else:
            field = _field(word, where)
            if i < len(toks) and toks[i][0] == "w" and toks[i][1].lower() == "in":
                i += 1
                expect(("op",), "(")
                if toks[i][1] != "(":
                    raise SelectionError(f"at character {toks[i][2]}: expected ( after in")
                i += 1
                values = []
                while True:
                    k, v, _ = expect(("w", "q"), "a value")
                    values.append(_value(k, v))
                    i += 1
                    k, v, p = expect(("op",), ", or )")
                    i += 1
                    if v == ")":
                        break
                    if v != ",":
                        raise SelectionError(f"at character {p}: expected , or ) in the list")
                if len(values) > MAX_LIST:
                    raise SelectionError(f"{where}: {len(values)} values in the list; at most {MAX_LIST}")
                op = "in"
            else:
                _, op, p = expect(("op",), "an operator (=, !=, <, <=, >, >=, ~, in)")
                if op not in OPS:
                    raise SelectionError(f"at character {p}: expected an operator, got {op!r}")
                i += 1
                k, v, _ = expect(("w", "q"), "a value")
                i += 1
                values = [_value(k, v)]
            if field in ("started", "ended"):
                values = [_when(v, where) for v in values]
            clauses.append(Clause(field, op, tuple(values)))
        if len(clauses) > MAX_CLAUSES:
            raise SelectionError(f"more than {MAX_CLAUSES} clauses; at most {MAX_CLAUSES}")
        if i < len(toks):
            t = toks[i]
            if t[0] == "w" and t[1].lower() == "and" or t[0] == "op" and t[1] == ";":
                i += 1
                if i >= len(toks):
                    raise SelectionError("at the end: expected a clause after and")
            else:
                raise SelectionError(f"at character {t[2]}: expected and, got {t[1][:40]!r}")
    return Selection(text, tuple(clauses))


def key_path(key: str) -> tuple[str, str]:
    """(column, JSON path) of a dotted key `config.a.b` -> ("config", '$."a"."b"')."""
    head, _, rest = key.partition(".")
    return head, "$." + ".".join(f'"{s}"' for s in rest.split("."))


def key_sql(key: str, param: str, params: dict[str, Any], alias: str = "") -> str:
    """SQL text of a dotted key's value (VARCHAR) with its path bound as `$param`."""
    col, path = key_path(_field(key, "key"))
    params[param] = path
    return f"json_extract_string({alias}{col}, ${param})"


def _clause_sql(c: Clause, n: int, params: dict[str, Any]) -> str:
    p = f"s{n}"
    nums = [v for v in c.values if isinstance(v, float)]
    texts = [str(v) for v in c.values if not isinstance(v, float)]
    if c.field in FIELDS or c.field == "tag":
        col = FIELDS[c.field]
        text_col, num_col = col, f"TRY_CAST({col} AS DOUBLE)"
    else:
        text_col = key_sql(c.field, f"{p}k", params)
        num_col = f"TRY_CAST({text_col} AS DOUBLE)"
    if c.field == "tag":
        values = [str(v if not isinstance(v, float) else _num_text(v)) for v in c.values]
        if c.op == "~":
            params[p] = values[0]
            return f"len(list_filter(coalesce(tags, []), lambda x: contains(lower(x), lower(${p})))) > 0"
        if c.op not in ("=", "in", "!="):
            raise SelectionError(f"tag takes =, !=, ~ or in, not {c.op}")
        # one list_contains a value: at 10^5 runs a tenth of the cost of list_intersect or list_has_any
        for i, v in enumerate(values):
            params[f"{p}_{i}"] = v
        # (a plain list_contains is pushed into the scan of `runs`; wrapped in coalesce it costs 3x more)
        has = " OR ".join(f"list_contains(tags, ${p}_{i})" for i in range(len(values)))
        return f"NOT coalesce({has}, false)" if c.op == "!=" else f"({has})"
    if c.op == "~":
        params[p] = str(c.values[0]) if not nums else _num_text(nums[0])
        return f"contains(lower({text_col}), lower(${p}))"
    if c.op == "in":
        parts = []
        if nums:
            params[p + "n"] = nums
            parts.append(f"list_contains(${p}n::DOUBLE[], {num_col})")
        if texts:
            params[p + "t"] = texts
            parts.append(f"list_contains(${p}t::VARCHAR[], {text_col})")
        return "(" + " OR ".join(parts) + ")"
    sql_op = "<>" if c.op == "!=" else c.op
    params[p] = c.values[0]
    if nums:
        return f"{num_col} {sql_op} ${p}"
    return f"{text_col} {sql_op} ${p}"


def _num_text(x: float) -> str:
    return str(int(x)) if x.is_integer() else repr(x)


def selected_sql(sel: Selection, now: float | None = None, lean: bool = False) -> tuple[str, dict[str, Any]]:
    """`WITH RECURSIVE ... selected AS (...)`: the folded runs the selection names (FOLDED_COLUMNS plus the
    run_start objects config, ladder, model, data, code of the first attempt), and its parameters.
    Append a SELECT over `selected`.

    What it reads grows with what is selected, not with the store: `runs` is filtered once by the first
    attempt's clauses (plain columns first: DuckDB checks a JSON clause only on the rows they keep) and
    the rows it keeps are carried whole; the restarts the fold follows come from the runs that name a
    parent (a small part of a store), never from a join of every run with every run.
    `lean`: `selected` holds only run, last and attempts (what a count or the run ids need; status,
    end_time and last_step too when a clause on status or ended needs them): the runs' JSON columns are
    not read at all (at 10^5 runs, half the cost)."""
    params: dict[str, Any] = {"cut": (time.time() if now is None else now) - settings.get("stale_after_s")}
    # clauses on the first attempt's fields filter `runs` before the fold; status and ended are the newest
    # attempt's, so they filter after it
    late = [_clause_sql(c, n, params) for n, c in enumerate(sel.clauses) if c.field in LATE_FIELDS] or [
        "true"
    ]
    early = [
        _clause_sql(c, n, params)
        for n, c in sorted(enumerate(sel.clauses), key=lambda nc: nc[1].field not in FIELDS)
        if c.field not in LATE_FIELDS
    ]
    status = run_status_sql("$cut")
    if sel.roots is not None:
        late = ["true"]
    bare = lean and late == ["true"]  # no clause on the newest attempt: its status is not read either
    cols = ", ".join(_LEAN_COLUMNS[:4] if bare else _LEAN_COLUMNS) if lean else "*"
    if sel.roots is not None:  # resolved already: start the fold from these runs only
        params["roots"] = list(sel.roots)
        base = f"SELECT {cols} FROM runs WHERE run IN (SELECT unnest($roots::VARCHAR[]))"
        firsts = "SELECT * FROM base"
    else:  # the runs the early clauses keep that are not a restart of their parent (same name)
        base = f"SELECT {cols} FROM runs WHERE " + " AND ".join(early or ["true"])
        firsts = """SELECT * FROM base b WHERE parent_run IS NULL OR NOT EXISTS (
            SELECT 1 FROM parents p WHERE p.run = b.parent_run AND p.name = b.name AND p.start_time < b.start_time)"""
    if bare:
        del params["cut"]  # nothing reads a status (DuckDB refuses a parameter no statement names)
        newest, selected = "", "f.root AS run, f.last, f.attempts FROM folded f"
    else:
        newest = f"""newest AS (
        SELECT run, {status} AS status, end_time, last_step FROM firsts
        UNION ALL
        SELECT run, {status} AS status, end_time, last_step FROM runs
        WHERE run IN (SELECT last FROM folded WHERE last <> root) AND run NOT IN (SELECT run FROM firsts)
    ),"""
        selected = f"""{_LEAN_SELECTED if lean else _SELECTED}
            FROM folded f JOIN firsts r ON r.run = f.root JOIN newest l ON l.run = f.last"""
    sql = f"""
    WITH RECURSIVE base AS MATERIALIZED ({base}),
    -- the parents of the kept runs that name one, by id (a semi-join DuckDB prunes with the few ids; as a join
    -- of the kept runs with `runs` it scanned every run's three columns)
    parents AS MATERIALIZED (
        SELECT run, name, start_time FROM runs WHERE run IN (SELECT parent_run FROM base WHERE parent_run IS NOT NULL)
    ),
    firsts AS MATERIALIZED ({firsts}),
    restarts AS MATERIALIZED (SELECT run, parent_run, name, start_time FROM runs WHERE parent_run IS NOT NULL),
    chain(root, run, name, t, depth) AS (
        SELECT run, run, name, start_time, 0 FROM firsts
        UNION
        SELECT c.root, r.run, c.name, r.start_time, c.depth + 1 FROM chain c
        JOIN restarts r ON r.parent_run = c.run AND r.name = c.name AND r.start_time > c.t
        WHERE c.depth < 1000
    ),
    folded AS MATERIALIZED (
        SELECT root, arg_max(run, (depth, run)) AS last, list(run ORDER BY depth, run) AS attempts
        FROM (SELECT root, run, min(depth) AS depth FROM chain GROUP BY root, run) GROUP BY root
    ),
    {newest}
    selected AS MATERIALIZED (
        SELECT * FROM (SELECT {selected}) WHERE {" AND ".join(late)}
    )
    """
    return sql, params


# the columns of `runs` a lean selection reads, and what its `selected` holds
_LEAN_COLUMNS = (  # the first four are what the fold reads
    "run",
    "name",
    "start_time",
    "parent_run",
    "status",
    "end_time",
    "last_step",
    "last_event_t",
    "phase",
    "phase_t",
    "phase_budget_s",
)
_LEAN_SELECTED = "f.root AS run, f.last, f.attempts, l.status, l.end_time, l.last_step"
_SELECTED = """f.root AS run, f.last, f.attempts, r.name, r.project, r.run_group, r.tags,
                   l.status,
                   r.start_time, l.end_time, l.last_step, r.ladder_name, r.ladder_rung,
                   coalesce(TRY_CAST(r.ladder->>'$.budget' AS DOUBLE), TRY_CAST(r.ladder->>'$.flops' AS DOUBLE))
                       AS budget,
                   coalesce(TRY_CAST(r.ladder->>'$.tokens' AS DOUBLE), TRY_CAST(r.data->>'$.tokens' AS DOUBLE))
                       AS tokens,
                   coalesce(TRY_CAST(r.ladder->>'$.params_active' AS DOUBLE),
                            TRY_CAST(r.model->>'$.params_active' AS DOUBLE)) AS params,
                   r.config, r.ladder, r.model, r.data, r.code"""
