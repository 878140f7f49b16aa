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

CORPUS: list[Case] = [
    # writes
    Case("insert", "INSERT INTO runs (run) VALUES ('x')"),
    Case("update", "UPDATE runs SET name = 'x'"),
    Case("delete", "DELETE FROM runs"),
    Case("create-table", "CREATE TABLE t AS SELECT 1 AS a"),
    Case("create-view", "CREATE VIEW v AS SELECT 1 AS a"),
    Case("create-macro", "CREATE MACRO m(x) AS x"),
    Case("create-temp", "CREATE TEMP TABLE t (a INT)"),
    Case("create-secret", "CREATE SECRET s (TYPE s3, KEY_ID 'x', SECRET 'y')"),
    Case("drop", "DROP TABLE runs"),
    Case("alter", "ALTER TABLE runs ADD COLUMN x INT"),
    Case("truncate", "TRUNCATE runs"),
    Case("insert-select", "INSERT INTO runs SELECT * FROM runs"),
    Case("delete-in-cte", "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x"),
    Case("insert-in-cte", "WITH x AS (INSERT INTO runs (run) VALUES ('x') RETURNING *) SELECT * FROM x"),
    Case("update-in-cte", "WITH x AS (UPDATE runs SET name = 'x' RETURNING *) SELECT count(*) FROM x"),
    Case("checkpoint", "CHECKPOINT"),
    Case("checkpoint-fn", "SELECT * FROM checkpoint()"),
    Case("force-checkpoint-fn", "SELECT * FROM force_checkpoint()"),
    Case("vacuum", "VACUUM"),
    Case("begin", "BEGIN TRANSACTION"),
    Case("prepare", "PREPARE p AS SELECT 1"),
    Case("execute", "EXECUTE p"),
    Case("set-variable", "SET VARIABLE x = 1"),
    # ATTACH and friends
    Case("attach-file", "ATTACH '{dir}/other.duckdb' AS o"),
    Case("attach-memory", "ATTACH ':memory:' AS m"),
    Case("attach-store-rw", "ATTACH '{store}' AS w"),
    Case("detach", "DETACH store"),
    Case("use", "USE system"),
    # COPY / EXPORT / IMPORT
    Case("copy-to", "COPY runs TO '{dir}/out.csv'"),
    Case("copy-query-to", "COPY (SELECT 1) TO '{dir}/out.parquet' (FORMAT parquet)"),
    Case("copy-from", "COPY runs FROM '{canary}'"),
    Case("export", "EXPORT DATABASE '{dir}/export'"),
    Case("import", "IMPORT DATABASE '{dir}'"),
    # extensions
    Case("install", "INSTALL httpfs"),
    Case("force-install", "FORCE INSTALL json"),
    Case("load", "LOAD httpfs"),
    Case("load-path", "LOAD '{dir}/evil.duckdb_extension'"),
    # settings
    Case("set-external", "SET enable_external_access = true"),
    Case("set-memory", "SET memory_limit = '100GB'"),
    Case("set-global-lock", "SET GLOBAL lock_configuration = false"),
    Case("reset", "RESET threads"),
    Case("pragma", "PRAGMA database_list"),
    Case("pragma-progress", "PRAGMA enable_progress_bar"),
    Case("call-pragma", "CALL pragma_version()"),
    Case("call-settings", "CALL duckdb_settings()"),
    Case("pragma-view", "SELECT * FROM pragma_database_list"),
    Case("pragma-fn-case", "select * from PRAGMA_storage_info('runs')"),
    Case("pragma-show", "SELECT * FROM pragma_show('runs')"),
    Case("pragma-user-agent", "SELECT * FROM pragma_user_agent()"),
    Case("enable-logging", "SELECT * FROM enable_logging()"),
    Case("enable-profiling", "SELECT * FROM enable_profiling()"),
    # file and network readers
    Case("read-csv", "SELECT * FROM read_csv('{canary}')"),
    Case("read-csv-list", "SELECT * FROM read_csv(['{canary}'])"),
    Case("read-csv-cast", "SELECT * FROM read_csv('{canary}'::VARCHAR)"),
    Case("replacement-scan", "SELECT * FROM '{canary}'"),
    Case("replacement-quoted", 'SELECT * FROM "{canary}"'),
    Case("read-text", "SELECT * FROM read_text('{canary}')"),
    Case("read-blob", "SELECT * FROM read_blob('/etc/passwd')"),
    Case("read-parquet-glob", "SELECT * FROM read_parquet('{dir}/*.parquet')"),
    Case("glob-dir", "SELECT * FROM glob('{dir}/*')"),
    Case("glob-root", "FROM glob('/*')"),
    Case("read-json-url", "SELECT * FROM read_json_auto('{url}/x.json')"),
    Case("read-csv-url", "SELECT * FROM read_csv_auto('{url}/x.csv')"),
    Case("url-replacement", "SELECT * FROM '{url}/x.parquet'"),
    Case("read-duckdb", "SELECT * FROM read_duckdb('{store}')"),
    Case("sniff-csv", "SELECT * FROM sniff_csv('{canary}')"),
    Case("parquet-metadata", "SELECT * FROM parquet_metadata('{canary}')"),
    # several statements in one
    Case("multi-drop", "SELECT 1; DROP TABLE runs"),
    Case("multi-attach", "SELECT 1; ATTACH ':memory:' AS m"),
    Case("multi-comment", "SELECT 1 /* ; */ ; SET threads = 64"),
    Case("multi-line-comment", "SELECT 1 -- hi\n; INSTALL httpfs"),
    Case("multi-in-string", "SELECT ';' ; DELETE FROM runs"),
    # query() and serialized SQL
    Case("query-fn", "SELECT * FROM query('SELECT * FROM duckdb_settings()')"),
    Case("query-table", "SELECT * FROM query_table('runs')"),
    Case("query-attach", "FROM query('ATTACH '':memory:'' AS x')"),
    Case(
        "execute-serialized",
        "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT * FROM duckdb_settings()'))",
    ),
    Case("serialize-plan", "SELECT json_serialize_plan('SELECT * FROM runs')"),
    # catalog functions that show settings, paths and secrets
    Case("settings", "SELECT * FROM duckdb_settings()"),
    Case("settings-case", "select * from DuCkDb_SeTtInGs()"),
    Case("settings-quoted", 'SELECT * FROM "duckdb_settings"()'),
    Case("settings-qualified", "SELECT * FROM system.main.duckdb_settings()"),
    Case("settings-comment", "SELECT * FROM duckdb_settings/**/()"),
    Case("settings-subquery", "SELECT name FROM (SELECT * FROM duckdb_settings()) s"),
    Case("settings-scalar-subquery", "SELECT (SELECT max(value) FROM duckdb_settings()) AS v"),
    Case("settings-summarize", "SUMMARIZE SELECT * FROM duckdb_settings()"),
    Case("settings-explain", "EXPLAIN SELECT * FROM duckdb_settings()"),
    Case("settings-explain-analyze", "EXPLAIN ANALYZE SELECT * FROM duckdb_settings()"),
    Case("databases-cte", "WITH s AS (SELECT * FROM duckdb_databases()) SELECT * FROM s"),
    Case("databases-lateral", "SELECT * FROM range(1) r, LATERAL (SELECT path FROM duckdb_databases()) d"),
    Case("databases-in", "SELECT * FROM runs WHERE run IN (SELECT path FROM duckdb_databases())"),
    Case("databases-view", "SELECT * FROM duckdb_databases"),
    Case("databases-describe", "DESCRIBE SELECT * FROM duckdb_databases()"),
    Case("cte-scope-trick", "SELECT * FROM (WITH duckdb_databases AS (SELECT 1) SELECT 1), duckdb_databases"),
    Case("cte-shadow", "WITH pg_settings AS (SELECT 1 AS a) SELECT * FROM pg_settings"),
    Case("pg-settings", "SELECT * FROM pg_catalog.pg_settings"),
    Case("pg-settings-bare", "SELECT * FROM pg_settings"),
    Case("pg-settings-summarize", "SUMMARIZE pg_settings"),
    Case("pg-settings-show", "SHOW pg_settings"),
    Case("secrets", "SELECT * FROM duckdb_secrets()"),
    Case("which-secret", "SELECT * FROM which_secret('s3://x/y', 's3')"),
    Case("extensions", "SELECT * FROM duckdb_extensions()"),
    Case("extension-repositories", "SELECT * FROM duckdb_extension_repositories()"),
    Case("temporary-files", "SELECT * FROM duckdb_temporary_files()"),
    Case("memory", "SELECT * FROM duckdb_memory()"),
    Case("logs", "SELECT * FROM duckdb_logs"),
    Case("variables", "SELECT * FROM duckdb_variables()"),
    Case("sqlite-master", "SELECT * FROM sqlite_master"),
    Case("current-setting", "SELECT current_setting('temp_directory')"),
    Case("current-setting-case", "SELECT CURRENT_SETTING('secret_directory')"),
    Case("current-setting-lambda", "SELECT list_transform([1], x -> current_setting('home_directory'))"),
    Case("current-setting-where", "SELECT 1 WHERE current_setting('allowed_paths') IS NOT NULL"),
    Case("getenv", "SELECT getenv('HOME')"),
    Case("write-log", "SELECT write_log('x')"),
    Case("nextval", "SELECT nextval('s')"),
    Case("show-setting", "SHOW memory_limit"),
    Case("show-secret-directory", "SHOW secret_directory"),
    Case("show-temp-directory", "SHOW \"TEMP_DIRECTORY\""),
    # Unicode look-alikes: refused, or unknown to DuckDB
    Case("unicode-long-s", "SELECT * FROM duckdb_\u017fettings()"),
    Case("unicode-fullwidth", "SELECT * FROM \uff24\uff35\uff23\uff2b\uff24\uff22_settings()"),
    Case("unicode-pg", "SELECT * FROM pg_\u017fettings"),
    Case("unicode-kelvin", "SELECT * FROM duc\u212adb_databases()"),
    Case("unicode-rtl", "SELECT '\u202e' || 'x' AS s", H),
    Case("nul-byte", "SELECT 'a\x00b' AS s", A),
    # Python objects of the worker, by name
    Case("python-scan-req", "SELECT * FROM req", A),
    Case("python-scan-os", "SELECT * FROM os", A),
    # paths the user typed come back scrubbed
    Case("echo-store-path", "SELECT '{store}' AS p", H),
    Case("error-store-path", "SELECT error('{store}')"),
    Case("echo-home", "SELECT '{home}/x' AS p", H),
    # harmless catalog and session functions
    Case("current-database", "SELECT current_database(), current_schema(), version()", H),
    Case("current-query", "SELECT current_query()", H),
    Case("duckdb-tables", "SELECT * FROM duckdb_tables()", H),
    Case("information-schema", "SELECT * FROM information_schema.tables", H),
    Case("show-all-tables", "SHOW ALL TABLES", H),
    Case("show-databases", "SHOW DATABASES", H),
    Case("test-all-types", "SELECT * FROM test_all_types()", H),
    Case("json-each", """SELECT * FROM json_each('{"a": 1}')""", H),
    # deep nesting and long statements
    Case("nested-parens", "SELECT " + _nested("(", "1", ")", 3000), A),
    Case("nested-lists", "SELECT " + _nested("[", "1", "]", 3000), A),
    Case("nested-subqueries", "SELECT * FROM " + "(SELECT * FROM " * 300 + "runs" + ") t" * 300, A),
    Case("long-expression", "SELECT 1" + " + 1" * 20000, A),
    Case("over-long-text", "SELECT '" + "x" * 200_000 + "'"),
    # huge results, long runs, bombs
    Case("repeat-2g", "SELECT repeat('x', 2000000000)", A, True),
    Case("repeat-2g-length", "SELECT length(repeat('x', 2000000000))", A, True),
    Case("repeat-nested-1g", "SELECT length(repeat(repeat('x', 1000000), 1000))", A, True),
    Case("list-2g", "SELECT list(i) FROM range(2000000000) t(i)", A, True),
    Case("array-agg-strings", "SELECT length(array_agg(repeat('x', 10000))) FROM range(1000000)", A, True),
    Case("string-agg-md5", "SELECT length(string_agg(md5(i::VARCHAR), ',')) FROM range(100000000) t(i)", A, True),
    Case("big-sort", "SELECT * FROM range(50000000) t(i) ORDER BY random() LIMIT 1", A, True),
    Case("cross-join", "SELECT count(*) FROM range(100000000) a, range(100000000) b", A, True),
    Case("count-1e12", "SELECT count(*) FROM range(1000000000000)", A, True),
    Case("generate-series-1e12", "SELECT max(generate_series) FROM generate_series(1, 1000000000000)", A, True),
    Case("unnest-1e8", "SELECT unnest(range(100000000))", A, True),
    Case("repeat-rows", "SELECT count(*) FROM repeat(repeat('x', 100000), 100000000)", A, True),
    Case("sleep", "SELECT sleep_ms(60000)", A, True),
    Case("pg-sleep", "SELECT pg_sleep(60)", A, True),
    Case("md5-loop", "SELECT sum(length(md5(i::VARCHAR))) FROM range(100000000000) t(i)", A, True),
    Case("recursive-count", "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r", A, True),
    Case(
        "recursive-doubling",
        "WITH RECURSIVE r(s) AS (SELECT 'x' UNION ALL SELECT s || s FROM r) SELECT length(s) FROM r LIMIT 100",
        A,
        True,
    ),
    Case("regexp-bomb", "SELECT regexp_matches(repeat('a', 100000000), '(a+)+$')", A, True),
    Case("regexp-replace-bomb", "SELECT length(regexp_replace(repeat('a', 50000000), '(a|aa)*b', 'x'))", A, True),
    Case("wide-result", "SELECT repeat('x', 1000000) AS s FROM range(200)", A, True),
]  # fmt: skip


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
        for name, value in (("store", self.db), ("dir", self.dir), ("canary", self.canary),
                            ("url", self.listener.url), ("home", self.home)):  # fmt: skip
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
