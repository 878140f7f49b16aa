"""SQL: a read-only console over the store, with a schema browser, examples and CSV download.

Every statement goes through `observatory.queries.user_sql.run_user_sql`, the one
safe entry point (a guarded worker process: read-only, no ATTACH / INSTALL / LOAD /
COPY / SET, limits on time, memory, concurrency, rows and result size). Its typed
errors are shown as they are: each names what was refused, or the setting that stopped it.
The console (examples, form, last result) is a fragment: running a query reruns it alone,
not the schema browser beside it.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

import polars as pl
import streamlit as st

from observatory import settings, store
from observatory.dashboard.cache import db_path, derive, query
from observatory.markup import CSV_FORMULA
from observatory.queries import dashboard as qd
from observatory.queries import user_sql

# Column types shown as they are; every other column (HUGEINT, INTERVAL, BLOB, UUID, UNION,
# lists, structs, maps, a column of mixed types, ...) is shown as text: Arrow and the browser's
# table have no faithful form for all of them, and one unshown type must not take down the page
_NATIVE = (
    pl.Boolean,
    pl.Int8,
    pl.Int16,
    pl.Int32,
    pl.Int64,
    pl.UInt8,
    pl.UInt16,
    pl.UInt32,
    pl.UInt64,
    pl.Float32,
    pl.Float64,
    pl.String,
    pl.Date,
    pl.Datetime,
    pl.Time,
    pl.Decimal,
)


def to_frame(result: user_sql.QueryResult) -> pl.DataFrame:
    """The rows of a `run_user_sql` result as a frame the page can show, whatever DuckDB types it holds.

    Columns of plain scalar types keep their type; any other column is text (`as_text`).
    Repeated column names (`SELECT 1 a, 2 a`) get a suffix instead of overwriting each other."""
    if not result.columns:
        return pl.DataFrame()
    columns = []
    for i, name in enumerate(_unique(result.columns)):
        values = [r[i] for r in result.rows]
        try:
            col = pl.Series(name, values, strict=False)
        except Exception:  # values polars cannot hold in one column
            col = None
        if col is None or not isinstance(col.dtype, _NATIVE):
            col = pl.Series(name, [as_text(v) for v in values], dtype=pl.String)
        columns.append(col)
    return pl.DataFrame(columns)


def _unique(names: list[str]) -> list[str]:
    seen: set[str] = set()
    out = []
    for name in names:
        shown, n = name, 1
        while shown in seen:
            n += 1
            shown = f"{name} ({n})"
        seen.add(shown)
        out.append(shown)
    return out


def as_text(v: Any) -> str | None:
    """A result value as text: nested values as JSON, bytes as DuckDB writes a BLOB (`\\xNN` escapes)."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return _blob_text(v)
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(_jsonable(v), ensure_ascii=False)
    return str(v)


def _blob_text(b: bytes) -> str:
    return "".join(chr(c) if 32 <= c < 127 and c != 92 else f"\\x{c:02X}" for c in b)


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k if isinstance(k, str) else as_text(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (str, bool, int, float)):
        return v
    return as_text(v)


def csv_text(frame: pl.DataFrame) -> str:
    """The frame as CSV (`to_frame` has made every column a type CSV can write), a text cell that a
    spreadsheet would run as a formula prefixed with `'` (`markup.CSV_FORMULA`)."""
    texts = [c for c, t in frame.schema.items() if t == pl.Utf8]
    frame = frame.with_columns(
        pl.when(pl.col(c).str.contains(CSV_FORMULA)).then("'" + pl.col(c)).otherwise(pl.col(c)).alias(c)
        for c in texts
    )
    return frame.write_csv()


# Material icons ship with Streamlit's own font; emoji need a system emoji font (Debian's
# chromium without one draws missing-glyph boxes)
SCHEMA_ICONS = {"table": ":material/table_chart:", "view": ":material/visibility:"}


def schema_tables(sch: pl.DataFrame) -> list[tuple[str, str, Any]]:
    """(kind, table, its columns and types as an Arrow table) of each table, then each view.

    Arrow, which `st.dataframe` sends as it is: built once per schema answer for all viewers
    (`cache.derive`), not converted again by each one."""
    out = []
    for kind in ("table", "view"):
        part = sch.filter(pl.col("kind") == kind)
        for table in part["table"].unique(maintain_order=True).to_list():
            out.append(
                (kind, table, part.filter(pl.col("table") == table).select("column", "type").to_arrow())
            )
    return out


SCHEMA_TTL_S = 30.0  # how long the schema browser's answer is kept (the data's answers: `cache_ttl_s`)


def _schema_browser() -> None:
    st.subheader("Schema")
    # the schema changes with the store's tables (a new version's DDL), not with each ingest batch: a
    # viewer opening this page should not wait for the ingester's write lock to list them again
    for kind, table, cols in derive(schema_tables, query(qd.schema, ttl_s=SCHEMA_TTL_S)):
        with st.expander(table, icon=SCHEMA_ICONS[kind]):
            st.dataframe(cols, hide_index=True, key=f"sql_schema_{table}")


def _set_example() -> None:
    name = st.session_state.get("sql_example")
    if name in qd.SQL_EXAMPLES:
        st.session_state["sql_text"] = qd.SQL_EXAMPLES[name]


def render() -> None:
    st.title("SQL")
    limit_ms = settings.get("sql_time_limit_ms")
    max_rows = settings.get("sql_max_rows")
    st.caption(
        f"Read-only. Each statement runs for at most {limit_ms} ms (setting `sql_time_limit_ms`) and returns "
        f"at most {max_rows:,} rows (setting `sql_max_rows`). No files, no ATTACH, INSTALL, LOAD, COPY or SET."
    )
    left, right = st.columns([1, 3])
    with left:
        _schema_browser()
    with right:
        # a fragment: running a query (or picking an example) reruns the console alone, not the
        # schema browser beside it (some thirty tables, sent again to the browser on every full run)
        st.fragment(_console)(max_rows, limit_ms)


def _console(max_rows: int, limit_ms: int) -> None:
    """The examples, the query form and the last result: the page's fragment."""
    if "sql_text" not in st.session_state:
        st.session_state["sql_text"] = next(iter(qd.SQL_EXAMPLES.values()))
    st.selectbox(
        "Examples",
        list(qd.SQL_EXAMPLES),
        index=None,
        placeholder="Pick an example query…",
        key="sql_example",
        on_change=_set_example,
    )
    with st.form("sql_form"):
        sql = st.text_area("Query", key="sql_text", height=180)
        submitted = st.form_submit_button("Run", type="primary")
    if submitted:
        t0 = time.perf_counter()
        try:
            result = user_sql.run_user_sql(db_path(), sql, max_rows, limit_ms)
        except Exception as e:  # the typed errors carry the user-facing message
            st.session_state["sql_result"] = {"sql": sql, "error": _describe(e)}
        else:
            st.session_state["sql_result"] = {
                "sql": sql,
                "token": RESULTS.keep(to_frame(result)),
                "truncated": result.truncated,
                "ms": (time.perf_counter() - t0) * 1000,
            }
    res = st.session_state.get("sql_result")
    if not res:
        return
    if "error" in res:
        kind, msg = res["error"]
        (st.warning if kind == "interrupted" else st.error)(msg)
        return
    frame = RESULTS.get(res["token"])
    if frame is None:
        st.info(
            "This result was let go to keep the server's memory bounded (setting `sql_results_mb`, for all "
            "visitors together); run the query again to see it."
        )
        return
    note = f"{frame.height:,} rows in {res['ms']:.0f} ms"
    if res["truncated"]:
        note += f" — truncated at the row cap of {max_rows:,} (setting `sql_max_rows`)"
    st.caption(note)
    st.dataframe(frame, hide_index=True, key="sql_result_table")
    st.download_button(
        "Download CSV",
        lambda: csv_text(frame),  # made when asked for, not held beside the table by every session
        file_name="observatory-query.csv",
        mime="text/csv",
        key="sql_download",
        disabled=frame.width == 0,
    )


class Results:
    """Every session's last SQL result, token -> (frame, its bytes), oldest first: held here rather than in
    the sessions, so that all of them together stay under `sql_results_mb` (a session's state holds only
    its token; a visitor may open many sessions). One per server process (`RESULTS`)."""

    def __init__(self) -> None:
        self._frames: OrderedDict[str, tuple[pl.DataFrame, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def keep(self, frame: pl.DataFrame) -> str:
        """Keep `frame`; the oldest results go while all of them hold more than `sql_results_mb`."""
        token = secrets.token_hex(16)
        n = int(frame.estimated_size())
        budget = int(settings.get("sql_results_mb")) << 20
        with self._lock:
            self._frames[token] = (frame, n)
            self._bytes += n
            while len(self._frames) > 1 and self._bytes > budget:
                self._bytes -= self._frames.popitem(last=False)[1][1]
        return token

    def get(self, token: str) -> pl.DataFrame | None:
        with self._lock:
            hit = self._frames.get(token)
        return None if hit is None else hit[0]

    def size(self) -> int:
        """What the kept results hold, all sessions together."""
        with self._lock:
            return self._bytes


RESULTS = Results()


def _describe(e: Exception) -> tuple[str, str]:
    """('interrupted' | 'refused' | 'error', message) for an exception from run_user_sql."""
    if isinstance(e, user_sql.QueryInterrupted):
        return "interrupted", f"Interrupted: {e}"
    if isinstance(e, user_sql.QueryBusy):
        return "interrupted", f"Busy: {e}"
    if isinstance(e, user_sql.QueryError):
        return "refused", f"Refused: {e}"
    if isinstance(e, store.StoreBusy):
        return "interrupted", "The store is busy being written; run the query again in a moment."
    return "error", f"{type(e).__name__}: {e}"
