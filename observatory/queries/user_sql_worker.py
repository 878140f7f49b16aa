"""The worker process behind `user_sql.run_user_sql`, and the policy it checks each statement against.

A worker is a fresh interpreter (`python -c ... main()`), never a fork of the server: it
imports DuckDB, warms up, then locks itself in before it reads its first query:

- `RLIMIT_AS`: its address space may grow by `sql_memory_limit_mb` past its warm size, so
  one big string or list fails with an out-of-memory error instead of taking the machine;
- `RLIMIT_FSIZE` 0 (with SIGXFSZ ignored) and `RLIMIT_CORE` 0: it cannot write a byte to a file;
- its stdout points at /dev/null (DuckDB prints nothing on the server's terminal); it
  talks to the server over a private copy of the pipe.

Each request is one query: the policy check, a read-only store connection with external
access off, DuckDB's own `memory_limit` and `threads`, no spilling to disk, progress
printing off, configuration locked, an interrupt at the time limit, the row cap, and every
string of the result scrubbed of the server's paths. The server kills the worker if the
interrupt does not land.

The policy works on DuckDB's own parse of the statement (`json_serialize_sql`), never on
the SQL text: one SELECT-style statement; table functions from an allow-list
(`TABLE_FUNCTIONS`); no scalar function that shows the server's settings or environment
(`SCALAR_DENY`, prefixes `SCALAR_DENY_PREFIXES`, and every built-in macro that calls one);
no system view but the harmless catalog ones (`SYSTEM_VIEWS`).

Frames on the pipe: 8-byte big-endian length, then a pickle. The server unpickles with an
allow-list of classes (`user_sql`), so even a worker that DuckDB's own bugs let someone
take over cannot make the server run code.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import resource
import signal
import struct
import sys
import threading
import time
import unicodedata
from typing import Any, BinaryIO

__all__ = [
    "STATEMENTS",
    "TABLE_FUNCTIONS",
    "SCALAR_DENY",
    "SCALAR_DENY_PREFIXES",
    "SYSTEM_VIEWS",
    "SHOW_SPECIAL",
    "QUERY_NODES",
    "Refused",
    "Policy",
    "scrub",
    "write_frame",
    "main",
]

# Statement kinds that run: DESCRIBE, SHOW, SUMMARIZE, FROM-first and VALUES parse as SELECT.
STATEMENTS = frozenset({"SELECT", "EXPLAIN"})

# Table functions a query may call: generators and the catalog functions that show names
# and types only. Everything else is refused: file readers, query()/query_table(),
# json_execute_serialized_sql, and the ones that show settings, paths or secrets
# (duckdb_settings, duckdb_databases, duckdb_extensions, duckdb_secrets, which_secret,
# duckdb_temporary_files, duckdb_memory, duckdb_logs, pragma_*, ...).
TABLE_FUNCTIONS = frozenset(
    {
        "range",
        "generate_series",
        "unnest",
        "repeat",
        "repeat_row",
        "json_each",
        "json_tree",
        "duckdb_tables",
        "duckdb_columns",
        "duckdb_views",
        "duckdb_schemas",
        "duckdb_types",
        "duckdb_constraints",
        "duckdb_indexes",
        "duckdb_dependencies",
        "duckdb_functions",
        "duckdb_keywords",
        "duckdb_optimizers",
        "pg_timezone_names",
        "icu_calendar_names",
        "test_all_types",
    }
)

# Table functions that read files: refused with the words DuckDB itself uses for them.
_FILE_READER = re.compile(r"^(read_|parquet_|sniff_|glob$|seq_scan$|arrow_scan|pandas_scan|python_)")

# Scalar functions that show the server's settings or environment, or act on the session.
SCALAR_DENY = frozenset(
    {
        "current_setting",
        "getenv",
        "which_secret",
        "write_log",
        "json_serialize_plan",
        "json_execute_serialized_sql",
        "nextval",
        "currval",
        "enable_logging",
        "disable_logging",
    }
)
SCALAR_DENY_PREFIXES = ("pragma_", "duckdb_", "__internal")

# Views of DuckDB's system catalog a query may read: names and types of tables and columns.
SYSTEM_VIEWS = frozenset(
    {
        "duckdb_columns",
        "duckdb_constraints",
        "duckdb_indexes",
        "duckdb_schemas",
        "duckdb_tables",
        "duckdb_types",
        "duckdb_views",
        "character_sets",
        "check_constraints",
        "columns",
        "constraint_column_usage",
        "constraint_table_usage",
        "key_column_usage",
        "referential_constraints",
        "schemata",
        "table_constraints",
        "tables",
        "views",
    }
)

# Query nodes a statement may hold: no INSERT/UPDATE/DELETE inside a CTE.
QUERY_NODES = frozenset({"SELECT_NODE", "SET_OPERATION_NODE", "RECURSIVE_CTE_NODE", "CTE_NODE"})

# `SHOW TABLES`, `SHOW ALL TABLES` and `SHOW DATABASES` (names only).
SHOW_SPECIAL = frozenset({"tables", "__show_tables_expanded", "databases"})


class Refused(Exception):
    """The statement is refused by the policy; the message says what and why."""


def _ascii_lower(name: str) -> str:
    """A name as DuckDB folds it: ASCII letters to lower case, the rest as they are."""
    return "".join(c.lower() if c.isascii() else c for c in name)


def _folds(name: str) -> set[str]:
    """Every way a name may fold: DuckDB's (ASCII lower case) and Unicode's (casefold, NFKC)."""
    return {_ascii_lower(name), name.casefold(), unicodedata.normalize("NFKC", name).casefold()}


class Policy:
    """The statement check, with the system relation and macro names of this DuckDB build."""

    def __init__(self, con):
        self._con = con  # an in-memory connection: it parses, it never runs user SQL
        rels = con.execute(
            "SELECT view_name FROM duckdb_views() WHERE database_name IN ('system', 'temp') "
            "UNION SELECT table_name FROM duckdb_tables() WHERE database_name IN ('system', 'temp')"
        ).fetchall()
        self.system_relations = frozenset(r[0].lower() for r in rels) - SYSTEM_VIEWS
        self.settings = frozenset(
            r[0].lower() for r in con.execute("SELECT name FROM duckdb_settings()").fetchall()
        )
        macros = con.execute(
            "SELECT DISTINCT function_name, macro_definition FROM duckdb_functions() "
            "WHERE function_type IN ('macro', 'table_macro') AND macro_definition IS NOT NULL"
        ).fetchall()
        denied = set(SCALAR_DENY)
        bad_word = re.compile(
            r"\b("
            + "|".join(re.escape(p) + r"\w*" for p in SCALAR_DENY_PREFIXES)
            + "|"
            + "|".join(re.escape(n) for n in sorted(SCALAR_DENY))
            + r")\s*\("
        )
        for name, definition in macros:
            if bad_word.search(definition or ""):
                denied.add(name.lower())
        self.scalar_deny = frozenset(denied)

    # ---------------------------------------------------------------- checks

    def check(self, sql: str) -> str:
        """The one statement of `sql`, or `Refused`. `sql` has already been stripped."""
        import duckdb

        try:
            statements = duckdb.extract_statements(sql)
        except duckdb.Error as e:
            raise Refused(f"SQL does not parse: {_first_line(e)}") from None
        if not statements:
            raise Refused("no SQL statement given")
        if len(statements) > 1:
            raise Refused("one statement at a time, please (found several separated by ';')")
        kind = statements[0].type.name
        if kind not in STATEMENTS:
            raise Refused(
                f"{kind} statements are refused: the store is read-only here and only SELECT-style queries "
                "run (no ATTACH, INSTALL, LOAD, COPY, SET, PRAGMA, EXPORT, CREATE, INSERT, PIVOT, ...)"
            )
        self._check_tree(self._explained(sql) if kind == "EXPLAIN" else sql)
        return sql

    def _explained(self, sql: str) -> str:
        """The statement an EXPLAIN explains (the first suffix, token by token, that is one statement), if a SELECT.

        Not the first suffix that is a SELECT: `EXPLAIN ANALYZE CREATE TABLE t AS SELECT 1` ends in one."""
        import duckdb

        for offset, _ in duckdb.tokenize(sql)[1:]:
            inner = sql[offset:]
            try:
                parsed = duckdb.extract_statements(inner)
            except duckdb.Error:
                continue
            if len(parsed) == 1:
                if parsed[0].type.name == "SELECT":
                    return inner
                raise Refused(
                    f"EXPLAIN of a {parsed[0].type.name} statement is refused: only SELECT-style queries"
                )
        raise Refused("EXPLAIN of anything but one SELECT-style query is refused")

    def _check_tree(self, sql: str) -> None:
        raw = self._con.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()[0]
        try:
            tree = json.loads(raw)
        except RecursionError:
            raise Refused("the query is nested too deeply to be checked") from None
        if tree.get("error"):
            raise Refused(
                f"this statement cannot be checked ({tree.get('error_message', 'no reason given')}); "
                "write it as a plain SELECT"
            )
        if len(tree.get("statements", [])) != 1:
            raise Refused("one statement at a time, please")
        stack: list[Any] = [tree["statements"][0]]
        table_function_nodes: set[int] = set()
        while stack:
            node = stack.pop()
            if isinstance(node, list):
                stack.extend(node)
                continue
            if not isinstance(node, dict):
                continue
            kind = node.get("type")
            if isinstance(kind, str) and kind.endswith("_NODE") and kind not in QUERY_NODES:
                what = kind.removesuffix("_NODE").removesuffix("_QUERY")
                raise Refused(f"{what} inside a query is refused: the store is read-only here")
            if kind == "TABLE_FUNCTION":
                fn = node.get("function") or {}
                table_function_nodes.add(id(fn))
                self._table_function(str(fn.get("function_name", "")))
            elif kind == "BASE_TABLE":
                self._relation(str(node.get("table_name", "")))
            elif kind == "SHOW_REF":
                self._show(node)
            elif node.get("class") == "FUNCTION" and id(node) not in table_function_nodes:
                self._scalar(str(node.get("function_name", "")))
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))

    def _table_function(self, name: str) -> None:
        folded = _ascii_lower(name)
        if folded in TABLE_FUNCTIONS:
            return
        if _FILE_READER.match(folded):
            raise Refused(f"{name}() reads files: file and network access is disabled by configuration here")
        raise Refused(
            f"the table function {name}() is refused: only generators and catalog functions run here "
            f"({', '.join(sorted(TABLE_FUNCTIONS))})"
        )

    def _scalar(self, name: str) -> None:
        for folded in _folds(name):
            if folded in self.scalar_deny or folded.startswith(SCALAR_DENY_PREFIXES):
                raise Refused(f"the function {name}() is refused: it shows the server's settings or state")

    def _relation(self, name: str) -> None:
        if _folds(name) & self.system_relations:
            raise Refused(
                f"the system view {name} is refused: it shows the server's settings or paths "
                "(duckdb_tables, duckdb_columns, duckdb_views and information_schema are allowed)"
            )

    def _show(self, node: dict) -> None:
        name = str(node.get("table_name") or "").strip('"')
        if node.get("show_type") == "SHOW_SPECIAL":
            if _ascii_lower(name) not in SHOW_SPECIAL:
                raise Refused(
                    f"SHOW {name} is refused: SHOW TABLES, SHOW ALL TABLES and SHOW DATABASES run here"
                )
        elif _folds(name) & self.settings:
            raise Refused(f"SHOW {name} is refused: the server's settings are not shown here")
        elif name:
            self._relation(name)


def _unconvertible(e: BaseException, types: list[str]) -> str:
    """The message for a result value DuckDB computed but Python cannot hold (`INTERVAL 100000000 YEARS`)."""
    odd = sorted({t for t in types if t.split("(")[0] in _UNCONVERTIBLE})
    which = f" (this result has {', '.join(odd)} columns)" if odd else ""
    return (
        f"a value of the result is out of the range this console can show{which}: "
        f"{type(e).__name__}: {_first_line(e)}. Cast the column to VARCHAR (`SELECT x::VARCHAR ...`) to see it as text"
    )


# DuckDB types whose values may not fit Python's: their names head the message above
_UNCONVERTIBLE = frozenset(
    {"INTERVAL", "DATE", "TIME", "TIMESTAMP", "TIMESTAMP WITH TIME ZONE", "TIME WITH TIME ZONE"}
)


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


# ------------------------------------------------------------------ scrubbing


def scrub(value: Any, paths: list[tuple[str, str]]) -> Any:
    """`value` with every server path in `paths` ((path, label), longest first) replaced by its label.

    Strings, bytes and the lists, tuples and dicts around them; other values as they are.
    A path matches only as a whole path: `/tmp` in `/tmp/x`, not in `/tmpx` or `a/tmp`.
    """
    if not paths:
        return value
    return _scrub(value, _scrubber(tuple(paths)))


_SCRUBBERS: dict[tuple, Any] = {}


def _scrubber(paths: tuple[tuple[str, str], ...]):
    if paths not in _SCRUBBERS:
        alt = "|".join(re.escape(p) for p, _ in paths)
        labels = dict(paths)
        text = re.compile(rf"(?<![\w.~-])({alt})(?![\w.~-])")
        blob = re.compile(text.pattern.encode())
        blabels = {p.encode(): lab.encode() for p, lab in paths}
        _SCRUBBERS.clear()
        _SCRUBBERS[paths] = (
            lambda s: text.sub(lambda m: labels[m.group(1)], s),
            lambda b: blob.sub(lambda m: blabels[m.group(1)], b),
        )
    return _SCRUBBERS[paths]


def _scrub(v: Any, fns) -> Any:
    if isinstance(v, str):
        return fns[0](v)
    if isinstance(v, bytes):
        return fns[1](v)
    if isinstance(v, (list, tuple)):
        return type(v)(_scrub(x, fns) for x in v)
    if isinstance(v, dict):
        return {_scrub(k, fns): _scrub(x, fns) for k, x in v.items()}
    return v


def _plain(v: Any) -> Any:
    """Values as the server can unpickle them: plain types, dates, decimals, UUIDs; anything else as text."""
    if isinstance(v, (str, int, float, bool, type(None), bytes)):
        return v
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    if isinstance(v, dict):
        return {_plain(k): _plain(x) for k, x in v.items()}
    module = type(v).__module__
    if module in ("datetime", "decimal", "uuid"):
        return v
    return str(v)


# ------------------------------------------------------------------ frames


def write_frame(out: BinaryIO, obj: Any) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    out.write(struct.pack(">Q", len(data)) + data)
    out.flush()


def _read_exact(inp: BinaryIO, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = inp.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _read_frame(inp: BinaryIO) -> Any:
    head = _read_exact(inp, 8)
    if head is None:
        return None
    body = _read_exact(inp, struct.unpack(">Q", head)[0])
    return None if body is None else pickle.loads(body)


# ------------------------------------------------------------------ memory


def _status_kb(field: str, pid: int | str = "self") -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _reset_peak() -> None:
    """Reset VmHWM (the peak RSS) to the current RSS, so the next peak is this query's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


# ------------------------------------------------------------------ the worker


class _Watchdog:
    """One thread, started before `_lock_in`, that interrupts a query's connection at its time limit.

    A thread made per query (`threading.Timer`) needs its stack mapped under the address-space limit, and
    after a big query had grown the worker it could not be: "can't start new thread" failed the next query.
    `disarm` holds the lock the interrupt is made under, so no interrupt lands after it returns."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._con: Any = None
        self._deadline: float | None = None
        self.fired = False
        threading.Thread(target=self._run, name="sql-watchdog", daemon=True).start()

    def arm(self, con: Any, limit_s: float) -> None:
        with self._cond:
            self._con, self._deadline, self.fired = con, time.monotonic() + limit_s, False
            self._cond.notify()

    def disarm(self) -> bool:
        """Stop watching; whether the interrupt was made."""
        with self._cond:
            self._con = self._deadline = None
            return self.fired

    def _run(self) -> None:
        with self._cond:
            while True:
                if self._deadline is None:
                    self._cond.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                con, self._con, self._deadline = self._con, None, None
                self.fired = True
                try:
                    con.interrupt()
                except Exception:  # the connection closed meanwhile: nothing left to stop
                    pass


_WATCHDOG: list[_Watchdog] = []  # the worker's one: made by `main` before the limits


def _watchdog() -> _Watchdog:
    if not _WATCHDOG:
        _WATCHDOG.append(_Watchdog())
    return _WATCHDOG[0]


def _lock_in(memory_mb: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write fails with EFBIG instead of killing us
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    room = _status_kb("VmSize") * 1024 + memory_mb * (1 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (room, room))


def _settings_sql(memory_mb: int, threads: int) -> list[str]:
    return [
        "SET temp_directory = ''",  # no spilling: a query that needs more memory fails, it writes nothing
        "SET enable_external_access = false",
        "SET python_enable_replacements = false",
        "SET autoinstall_known_extensions = false",
        "SET autoload_known_extensions = false",
        f"SET memory_limit = '{int(memory_mb)}MiB'",  # MiB, as the rlimit and the dashboard's limit count
        f"SET threads = {int(threads)}",
        "SET enable_progress_bar = false",
        "SET enable_progress_bar_print = false",
        "SET lock_configuration = true",
    ]


_GUARDED = (
    "enable_external_access",
    "lock_configuration",
    "memory_limit",
    "threads",
    "temp_directory",
    "enable_progress_bar",
    "enable_progress_bar_print",
    "python_enable_replacements",
    "autoload_known_extensions",
    "autoinstall_known_extensions",
    "allowed_directories",
    "allowed_paths",
)


def _fingerprint(con) -> list[tuple]:
    """The settings the lockdown sets, as this connection has them now."""
    return con.execute(
        "SELECT name, value FROM duckdb_settings() WHERE list_contains($names, name) ORDER BY name",
        {"names": list(_GUARDED)},
    ).fetchall()


def _after_query(failed: dict | None, before: list[tuple], after: list[tuple] | None) -> dict | None:
    """The reply a query earns once its settings are read back (None: its result may be sent).

    `after` is None when they could not be read: right after a query ran out of memory,
    DuckDB may still hold it. A failed query then keeps its own reason (the worker
    retires, as it cannot be checked); a query that succeeded has its result withheld.
    Settings that read back changed always withhold, whatever the query did.
    """
    if after is None:
        if failed is not None:
            return {**failed, "retire": True}
        return {"kind": "settings_changed", "retire": True}
    if after != before:
        return {"kind": "settings_changed", "retire": True}
    return failed


def main() -> None:
    """Serve queries on stdin/stdout until stdin closes; argv: memory limit (MB), threads."""
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    sys.stdout = open(os.devnull, "w")
    inp = sys.stdin.buffer
    memory_mb, threads = int(sys.argv[1]), int(sys.argv[2])

    import duckdb

    from observatory import store

    policy_con = duckdb.connect()
    policy = Policy(policy_con)
    for s in _settings_sql(memory_mb, threads):
        policy_con.execute(s)
    # warm up: the threads, their allocator arenas and the store code are in place before the limit
    policy_con.execute("SELECT sum(i) FROM range(1000000) t(i)").fetchall()
    policy.check("SELECT 1")
    _watchdog()  # its thread is made before the limits
    _lock_in(memory_mb)
    write_frame(out, {"kind": "ready", "pid": os.getpid()})
    while True:
        store.connection.prepare_fresh()  # the next query's own instance, made while none waits
        req = _read_frame(inp)
        if req is None:
            return
        try:
            reply = _serve(req, policy, out, store, duckdb)
        except Exception as e:  # a bug of ours or DuckDB's: this query fails, with its reason, not the worker
            reply = {"kind": "error", "message": f"the query failed: {type(e).__name__}: {_first_line(e)}"}
            reply["message"] = scrub(reply["message"], req["scrub"])
        try:
            data = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
            if reply["kind"] == "ok" and len(data) > req["max_result_bytes"]:
                keep = ("peak_kb", "elapsed_ms")
                reply = {"kind": "too_big", "bytes": len(data), **{k: reply[k] for k in keep}}
                data = pickle.dumps(reply)
        except MemoryError:
            reply = {"kind": "memory", "message": "the result did not fit in memory", "retire": True}
            data = pickle.dumps(reply)
        out.write(struct.pack(">Q", len(data)) + data)
        out.flush()
        if reply.get("retire"):
            return


def _serve(req: dict, policy: Policy, out: BinaryIO, store, duckdb) -> dict:
    t0 = time.monotonic()
    _reset_peak()
    base = _status_kb("VmRSS")
    write_frame(out, {"kind": "begin", "rss_kb": base})
    paths = req["scrub"]

    def done(reply: dict) -> dict:
        reply["peak_kb"] = max(0, _status_kb("VmHWM") - base)
        reply["elapsed_ms"] = (time.monotonic() - t0) * 1000
        if "message" in reply:
            reply["message"] = scrub(reply["message"], paths)
        return reply

    try:
        policy.check(req["sql"])
    except Refused as e:
        return done({"kind": "refused", "message": str(e)})
    except MemoryError:
        return done({"kind": "memory", "message": "the query is too large to be checked", "retire": True})
    checked = time.monotonic()
    write_frame(out, {"kind": "waiting"})
    try:
        con = store.connect(req["db"], timeout_s=req["lock_timeout_s"], fresh=True)  # its settings get locked
    except store.StoreBusy as e:
        return done({"kind": "store_busy", "message": str(e)})
    except duckdb.Error as e:
        return done({"kind": "error", "message": f"{type(e).__name__}: {_first_line(e)}"})
    write_frame(out, {"kind": "connected"})
    limit_s = max(0.0, req["limit_ms"] / 1000 - (checked - t0))
    with con:
        for s in _settings_sql(req["memory_mb"], req["threads"]):
            con.execute(s)
        before = _fingerprint(con)
        watchdog = _watchdog()
        watchdog.arm(con, limit_s)
        failed = None
        types: list[str] = []
        try:
            cur = con.execute(req["sql"])
            columns = [d[0] for d in cur.description] if cur.description else []
            types = [str(d[1]) for d in cur.description] if cur.description else []
            rows = cur.fetchmany(req["max_rows"] + 1) if columns else []
        except duckdb.InterruptException:
            failed = {"kind": "interrupted"}
        except duckdb.OutOfMemoryException as e:
            failed = {"kind": "memory", "message": _first_line(e), "retire": True}
        except MemoryError:
            failed = {"kind": "memory", "message": "out of memory", "retire": True}
        except duckdb.Error as e:
            if watchdog.fired and "interrupt" in str(e).lower():
                failed = {"kind": "interrupted"}
            else:
                failed = {"kind": "error", "message": f"{type(e).__name__}: {_first_line(e)}"}
        except (OverflowError, ValueError, TypeError, ArithmeticError) as e:
            failed = {"kind": "error", "message": _unconvertible(e, types)}
        finally:
            watchdog.disarm()
        try:
            after = _fingerprint(con)
        except (duckdb.Error, MemoryError):
            after = None
        verdict = _after_query(failed, before, after)
    if verdict is not None:
        return done(verdict)
    try:
        return done(
            {
                "kind": "ok",
                "columns": scrub(columns, paths),
                "types": types,
                "rows": [tuple(scrub(_plain(v), paths) for v in r) for r in rows[: req["max_rows"]]],
                "truncated": len(rows) > req["max_rows"],
            }
        )
    except MemoryError:
        return done({"kind": "memory", "message": "the result did not fit in memory", "retire": True})
