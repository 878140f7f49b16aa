"""Hostile SQL for the user-SQL door, and the judge that says what each statement did.

`CORPUS` is a list of `Case(label, sql, expect, slow)`: `expect` is "refused" (it must
not run), "harmless" (it must run and return rows) or "any" (either, as long as it does
no harm); `slow` ones run into a time or memory limit. The SQL may name `{store}`,
`{dir}` (the store's folder), `{canary}` (a file there holding a secret) and `{url}`
(an HTTP listener on localhost that counts connections).

`Probe` sets up a store with those around it and judges each statement:

- **refused**: a `QueryError` (any of them: refused, interrupted, memory, busy);
- **harmless**: it ran;
- **harmful**, with the reasons, if any of these happened: a server path (the store, its
  folder, $HOME, the temp dir, the working directory) or the canary's secret is in the
  result or the message; a file in the store's folder or under ~/.duckdb changed; the
  listener saw a connection; it took more than 1.5x `sql_time_limit_ms`; its worker's peak
  memory grew more than 1.5x `sql_memory_limit_mb`; it changed the locked settings; or
  it raised anything but a `QueryError`.

Used by tests/test_sql_guard.py and bench/bench_public.py.
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

TIME_LIMIT_MS = 1000
MEMORY_LIMIT_MB = 256
SECRET = "CANARY-7f3a9c1e-do-not-show"


@dataclass(frozen=True)
class Case:
    label: str
    sql: str
    expect: str = "refused"  # "refused" | "harmless" | "any"
    slow: bool = False


def _nested(open_: str, inner: str, close: str, n: int) -> str:
    return open_ * n + inner + close * n


R, H, A = "refused", "harmless", "any"

# The corpus in order, as blocks of cases that share an expectation: (expect, slow, {label: sql}).
_BLOCKS: list[tuple[str, bool, dict[str, str]]] = [
    (
        R,
        False,
        {
            # writes
            "insert": "INSERT INTO runs (run) VALUES ('x')",
            "update": "UPDATE runs SET name = 'x'",
            "delete": "DELETE FROM runs",
            "create-table": "CREATE TABLE t AS SELECT 1 AS a",
            "create-view": "CREATE VIEW v AS SELECT 1 AS a",
            "create-macro": "CREATE MACRO m(x) AS x",
            "create-temp": "CREATE TEMP TABLE t (a INT)",
            "create-secret": "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')",
            "drop": "DROP TABLE runs",
            "alter": "ALTER TABLE runs ADD COLUMN x INT",
            "truncate": "TRUNCATE runs",
            "insert-select": "INSERT INTO runs SELECT * FROM runs",
            "delete-in-cte": "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
            "insert-in-cte": "WITH x AS (INSERT INTO runs (run) VALUES ('x') RETURNING *) SELECT * FROM x",
            "update-in-cte": "WITH x AS (UPDATE runs SET name = 'x' RETURNING *) SELECT count(*) FROM x",
            "checkpoint": "CHECKPOINT",
            "checkpoint-fn": "SELECT * FROM checkpoint()",
            "force-checkpoint-fn": "SELECT * FROM force_checkpoint()",
            "vacuum": "VACUUM",
            "begin": "BEGIN TRANSACTION",
            "prepare": "PREPARE p AS SELECT 1",
            "execute": "EXECUTE p",
            "set-variable": "SET VARIABLE x = 1",
            # ATTACH and friends
            "attach-file": "ATTACH '{dir}/other.duckdb' AS o",
            "attach-memory": "ATTACH ':memory:' AS m",
            "attach-store-rw": "ATTACH '{store}' AS w",
            "detach": "DETACH store",
            "use": "USE system",
            # COPY / EXPORT / IMPORT
            "copy-to": "COPY runs TO '{dir}/out.csv'",
            "copy-query-to": "COPY (SELECT 1) TO '{dir}/out.parquet' (FORMAT parquet)",
            "copy-from": "COPY runs FROM '{canary}'",
            "export": "EXPORT DATABASE '{dir}/export'",
            "import": "IMPORT DATABASE '{dir}'",
            # extensions
            "install": "INSTALL httpfs",
            "force-install": "FORCE INSTALL json",
            "load": "LOAD httpfs",
            "load-path": "LOAD '{dir}/evil.duckdb_extension'",
            # settings
            "set-external": "SET enable_external_access = true",
            "set-memory": "SET memory_limit = '100GB'",
            "set-global-lock": "SET GLOBAL lock_configuration = false",
            "reset": "RESET threads",
            "pragma": "PRAGMA database_list",
            "pragma-progress": "PRAGMA enable_progress_bar",
            "call-pragma": "CALL pragma_version()",
            "call-settings": "CALL duckdb_settings()",
            "pragma-view": "SELECT * FROM pragma_database_list",
            "pragma-fn-case": "select * from PRAGMA_storage_info('runs')",
            "pragma-show": "SELECT * FROM pragma_show('runs')",
            "pragma-user-agent": "SELECT * FROM pragma_user_agent()",
            "enable-logging": "SELECT * FROM enable_logging()",
            "enable-profiling": "SELECT * FROM enable_profiling()",
            # file and network readers
            "read-csv": "SELECT * FROM read_csv('{canary}')",
            "read-csv-list": "SELECT * FROM read_csv(['{canary}'])",
            "read-csv-cast": "SELECT * FROM read_csv('{canary}'::VARCHAR)",
            "replacement-scan": "SELECT * FROM '{canary}'",
            "replacement-quoted": 'SELECT * FROM "{canary}"',
            "read-text": "SELECT * FROM read_text('{canary}')",
            "read-blob": "SELECT * FROM read_blob('/etc/passwd')",
            "read-parquet-glob": "SELECT * FROM read_parquet('{dir}/*.parquet')",
            "glob-dir": "SELECT * FROM glob('{dir}/*')",
            "glob-root": "FROM glob('/*')",
            "read-json-url": "SELECT * FROM read_json_auto('{url}/x.json')",
            "read-csv-url": "SELECT * FROM read_csv_auto('{url}/x.csv')",
            "url-replacement": "SELECT * FROM '{url}/x.parquet'",
            "read-duckdb": "SELECT * FROM read_duckdb('{store}')",
            "sniff-csv": "SELECT * FROM sniff_csv('{canary}')",
            "parquet-metadata": "SELECT * FROM parquet_metadata('{canary}')",
            # several statements in one
            "multi-drop": "SELECT 1; DROP TABLE runs",
            "multi-attach": "SELECT 1; ATTACH ':memory:' AS m",
            "multi-comment": "SELECT 1 /* ; */ ; SET threads = 64",
            "multi-line-comment": "SELECT 1 -- hi\n; INSTALL httpfs",
            "multi-in-string": "SELECT ';' ; DELETE FROM runs",
            # query() and serialized SQL
            "query-fn": "SELECT * FROM query('SELECT * FROM duckdb_settings()')",
            "query-table": "SELECT * FROM query_table('runs')",
            "query-attach": "FROM query('ATTACH '':memory:'' AS x')",
            "execute-serialized": "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT * FROM duckdb_settings()'))",
            "serialize-plan": "SELECT json_serialize_plan('SELECT * FROM runs')",
            # catalog functions that show settings, paths and secrets
            "settings": "SELECT * FROM duckdb_settings()",
            "settings-case": "select * from DuCkDb_SeTtInGs()",
            "settings-quoted": 'SELECT * FROM "duckdb_settings"()',
            "settings-qualified": "SELECT * FROM system.main.duckdb_settings()",
            "settings-comment": "SELECT * FROM duckdb_settings/**/()",
            "settings-subquery": "SELECT name FROM (SELECT * FROM duckdb_settings()) s",
            "settings-scalar-subquery": "SELECT (SELECT max(value) FROM duckdb_settings()) AS v",
            "settings-summarize": "SUMMARIZE SELECT * FROM duckdb_settings()",
            "settings-explain": "EXPLAIN SELECT * FROM duckdb_settings()",
            "settings-explain-analyze": "EXPLAIN ANALYZE SELECT * FROM duckdb_settings()",
            "databases-cte": "WITH s AS (SELECT * FROM duckdb_databases()) SELECT * FROM s",
            "databases-lateral": "SELECT * FROM range(1) r, LATERAL (SELECT path FROM duckdb_databases()) d",
            "databases-in": "SELECT * FROM runs WHERE run IN (SELECT path FROM duckdb_databases())",
            "databases-view": "SELECT * FROM duckdb_databases",
            "databases-describe": "DESCRIBE SELECT * FROM duckdb_databases()",
            "cte-scope-trick": "SELECT * FROM (WITH duckdb_databases AS (SELECT 1) SELECT 1), duckdb_databases",
            "cte-shadow": "WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings",
            "pg-settings": "SELECT * FROM pg_catalog.pg_settings",
            "pg-settings-bare": "SELECT * FROM pg_settings",
            "pg-settings-summarize": "SUMMARIZE pg_settings",
            "pg-settings-show": "SHOW pg_settings",
            "secrets": "SELECT * FROM duckdb_secrets()",
            "which-secret": "SELECT * FROM which_secret('s3://x/y', 's3')",
            "extensions": "SELECT * FROM duckdb_extensions()",
            "extension-repositories": "SELECT * FROM duckdb_extension_repositories()",
            "temporary-files": "SELECT * FROM duckdb_temporary_files()",
            "memory": "SELECT * FROM duckdb_memory()",
            "logs": "SELECT * FROM duckdb_logs",
            "variables": "SELECT * FROM duckdb_variables()",
            "sqlite-master": "SELECT * FROM sqlite_master",
            "current-setting": "SELECT current_setting('temp_directory')",
            "current-setting-case": "SELECT CURRENT_SETTING('secret_directory')",
            "current-setting-lambda": "SELECT list_transform([1], x -> current_setting('home_directory'))",
            "current-setting-where": "SELECT 1 WHERE current_setting('allowed_paths') IS NOT NULL",
            "getenv": "SELECT getenv('HOME')",
            "write-log": "SELECT write_log('x')",
            "nextval": "SELECT nextval('s')",
            "show-setting": "SHOW memory_limit",
            "show-secret-directory": "SHOW secret_directory",
            "show-temp-directory": 'SHOW "TEMP_DIRECTORY"',
            # Unicode look-alikes: refused, or unknown to DuckDB
            "unicode-long-s": "SELECT * FROM duckdb_\u017fettings()",
            "unicode-fullwidth": "SELECT * FROM \uff24\uff35\uff23\uff2b\uff24\uff22_settings()",
            "unicode-pg": "SELECT * FROM pg_\u017fettings",
            "unicode-kelvin": "SELECT * FROM duc\u212adb_databases()",
        },
    ),
    (H, False, {"unicode-rtl": "SELECT '\u202e' || 'x' AS s"}),
    (
        A,
        False,
        {
            "nul-byte": "SELECT 'a\x00b' AS s",
            # Python objects of the worker, by name
            "python-scan-req": "SELECT * FROM req",
            "python-scan-os": "SELECT * FROM os",
        },
    ),
    # paths the user typed come back scrubbed
    (H, False, {"echo-store-path": "SELECT '{store}' AS p"}),
    (R, False, {"error-store-path": "SELECT error('{store}')"}),
    (
        H,
        False,
        {
            "echo-home": "SELECT '{home}/x' AS p",
            # harmless catalog and session functions
            "current-database": "SELECT current_database(), current_schema(), version()",
            "current-query": "SELECT current_query()",
            "duckdb-tables": "SELECT * FROM duckdb_tables()",
            "information-schema": "SELECT * FROM information_schema.tables",
            "show-all-tables": "SHOW ALL TABLES",
            "show-databases": "SHOW DATABASES",
            "test-all-types": "SELECT * FROM test_all_types()",
            "json-each": """SELECT * FROM json_each('{"a": 1}')""",
        },
    ),
    (
        A,
        False,
        {
            # deep nesting and long statements
            "nested-parens": "SELECT " + _nested("(", "1", ")", 3000),
            "nested-lists": "SELECT " + _nested("[", "1", "]", 3000),
            "nested-subqueries": "SELECT * FROM " + "(SELECT * FROM " * 300 + "runs" + ") t" * 300,
            "long-expression": "SELECT 1" + " + 1" * 20000,
        },
    ),
    (R, False, {"over-long-text": "SELECT '" + "x" * 200_000 + "'"}),
    (
        A,
        True,
        {
            # huge results, long runs, bombs
            "repeat-2g": "SELECT repeat('x', 2000000000)",
            "repeat-2g-length": "SELECT length(repeat('x', 2000000000))",
            "repeat-nested-1g": "SELECT length(repeat(repeat('x', 1000000), 1000))",
            "list-2g": "SELECT list(i) FROM range(2000000000) t(i)",
            "array-agg-strings": "SELECT length(array_agg(repeat('x', 10000))) FROM range(1000000)",
            "string-agg-md5": "SELECT length(string_agg(md5(i::VARCHAR), ',')) FROM range(100000000) t(i)",
            "big-sort": "SELECT * FROM range(50000000) t(i) ORDER BY random() LIMIT 1",
            "cross-join": "SELECT count(*) FROM range(100000000) a, range(100000000) b",
            "count-1e12": "SELECT count(*) FROM range(1000000000000)",
            "generate-series-1e12": "SELECT max(generate_series) FROM generate_series(1, 1000000000000)",
            "unnest-1e8": "SELECT unnest(range(100000000))",
            "repeat-rows": "SELECT count(*) FROM repeat(repeat('x', 100000), 100000000)",
            "sleep": "SELECT sleep_ms(60000)",
            "pg-sleep": "SELECT pg_sleep(60)",
            "md5-loop": "SELECT sum(length(md5(i::VARCHAR))) FROM range(100000000000) t(i)",
            "recursive-count": "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r",
            "recursive-doubling": "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) SELECT length(s) FROM r LIMIT 100",
            "regexp-bomb": "SELECT regexp_matches(repeat('a', 100000000), '(a+)+$')",
            "regexp-replace-bomb": "SELECT length(regexp_replace(repeat('a', 50000000), '(a|aa)*b', 'x'))",
            "wide-result": "SELECT repeat('x', 1000000) AS s FROM range(200)",
        },
    ),
]
CORPUS: list[Case] = [
    Case(label, sql, expect, slow) for expect, slow, cases in _BLOCKS for label, sql in cases.items()
]


@dataclass
class Verdict:
    case: Case
    outcome: str  # "refused" | "harmless" | "harmful"
    reasons: list[str] = field(default_factory=list)
    message: str = ""
    elapsed_ms: float = 0.0
    peak_memory_mb: float = 0.0

    @property
    def expected(self) -> bool:
        return self.outcome != "harmful" and self.case.expect in (self.outcome, "any")


class _Listener:
    """A TCP listener on localhost that counts the connections it gets."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


def _snapshot(*roots: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for root in roots:
        if not root.exists():
            continue
        for dirpath, dirs, files in os.walk(root):
            dirs[:] = [d for d in dirs if d != "runs"]  # the event logs: nobody writes there here
            for name in files:
                p = Path(dirpath) / name
                try:
                    st = p.stat()
                except OSError:
                    continue
                out[str(p)] = (st.st_size, st.st_mtime_ns)
    return out


class Probe:
    """A store with a canary and a listener around it; `judge(case)` runs one case and says what it did."""

    def __init__(self, db: Path):
        self.db = db
        self.dir = db.parent
        self.canary = self.dir / "secret.csv"
        self.canary.write_text(f"secret\n{SECRET}\n")
        self.listener = _Listener()
        self.home = Path.home()
        self.needles = sorted(
            {
                SECRET,
                str(db),
                os.path.realpath(db),
                str(self.dir),
                str(self.home),
                os.environ.get("HOME", str(self.home)),
                tempfile.gettempdir(),
                os.getcwd(),
            }
            - {"", "/"},
            key=len,
            reverse=True,
        )
        self.watched = (self.dir, self.home / ".duckdb")

    def sql(self, case: Case) -> str:
        sql = case.sql
        for name, value in (
            ("store", self.db),
            ("dir", self.dir),
            ("canary", self.canary),
            ("url", self.listener.url),
            ("home", self.home),
        ):
            sql = sql.replace("{" + name + "}", str(value))
        return sql

    def judge(self, case: Case) -> Verdict:
        from observatory.queries import user_sql

        user_sql.warm_up()  # the time judged is the query's, not a worker's start-up
        sql = self.sql(case)
        before, seen = _snapshot(*self.watched), self.listener.connections
        t0 = time.perf_counter()
        text, reasons, peak = "", [], 0.0
        try:
            res = user_sql.run_user_sql(self.db, sql)
            outcome = "harmless"
            text = repr(res.columns) + repr(res.rows)
            peak = res.peak_memory_mb
        except user_sql.QueryError as e:
            outcome = "refused"
            text = e.message
            peak = e.peak_memory_mb or 0.0
            if "changed the connection's locked settings" in e.message:
                reasons.append("changed the locked settings")
        except Exception as e:  # anything else is a hole in the door
            outcome = "harmful"
            text = f"{type(e).__name__}: {e}"
            reasons.append(f"raised {type(e).__name__}")
        elapsed_ms = (time.perf_counter() - t0) * 1000
        time.sleep(0.05 if seen == self.listener.connections else 0)  # a late connection still counts
        for needle in self.needles:
            if needle in text:
                reasons.append(f"shows {'the canary secret' if needle == SECRET else repr(needle)}")
        after = _snapshot(*self.watched)
        changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        if changed:
            reasons.append(f"changed files {changed[:3]}")
        if self.listener.connections != seen:
            reasons.append("opened a network connection")
        if elapsed_ms > 1.5 * TIME_LIMIT_MS:
            reasons.append(f"ran {elapsed_ms:.0f} ms (limit {TIME_LIMIT_MS})")
        if peak > 1.5 * MEMORY_LIMIT_MB:
            reasons.append(f"peaked at {peak:.0f} MB (limit {MEMORY_LIMIT_MB})")
        return Verdict(case, "harmful" if reasons else outcome, reasons, text[:300], elapsed_ms, peak)

    def close(self) -> None:
        self.listener.close()


def limits_env() -> dict[str, str]:
    """The settings the corpus is judged under."""
    return {
        "OBSERVATORY_SQL_TIME_LIMIT_MS": str(TIME_LIMIT_MS),
        "OBSERVATORY_SQL_MEMORY_LIMIT_MB": str(MEMORY_LIMIT_MB),
        "OBSERVATORY_SQL_THREADS": "2",
    }
