"""The one door for SQL typed by a person: `observatory sql`, the dashboard's console, and any later HTTP API.

`run_user_sql` runs each query in a worker process of a small warm pool
(`user_sql_worker`), under limits that hold whatever the query does:

- **policy**: one SELECT-style statement, checked on DuckDB's own parse against an
  allow-list of table functions and a deny-list of scalar functions and system views
  (`user_sql_worker.Policy`); a read-only connection, external access off,
  configuration locked;
- **memory**: DuckDB's `memory_limit` and `threads` (`sql_memory_limit_mb`,
  `sql_threads`), no spilling to disk, and an address-space rlimit on the worker, so
  even one huge string or list fails cleanly;
- **time**: DuckDB is interrupted at `sql_time_limit_ms`; a worker that has not
  answered by `sql_kill_after` times the limit (a long scalar function) is killed and
  replaced;
- **concurrency**: at most `sql_max_concurrent` queries at once per process; the rest
  wait up to `sql_queue_wait_ms`, then get `QueryBusy`;
- **size**: at most `sql_max_rows` rows (`truncated` says more matched) and
  `sql_max_result_mb` of result;
- **no disclosure**: every message and every string of a result is scrubbed of the
  server's paths (store, its folder, home, temp dir, working directory), as a second
  net behind the policy.

`warm_up_in_background` starts the pool's first worker once per process without
waiting for it (the dashboard calls it as it starts), so the first visitor's query
does not pay a worker's start-up; `pool_status` says how many workers are alive
and ready.
"""

from __future__ import annotations

import atexit
import io
import os
import pickle
import select
import struct
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observatory import settings, store
from observatory.queries.user_sql_worker import scrub, write_frame

__all__ = [
    "QueryError",
    "QueryInterrupted",
    "QueryBusy",
    "QueryResult",
    "run_user_sql",
    "warm_up",
    "warm_up_in_background",
    "pool_status",
]

MAX_SQL_CHARS = 100_000  # a longer statement is refused before it reaches a worker
_START_TIMEOUT_S = 60.0  # a new worker has this long to import DuckDB and warm up
_MAX_QUERIES_PER_WORKER = 200  # then it is replaced, so fragmentation cannot eat its memory room


class QueryError(Exception):
    """A user query that was refused or failed. Carries the SQL and, when a limit caused it, the setting.

    `peak_memory_mb` and `elapsed_ms` are the query's, where the worker measured them.
    """

    def __init__(self, message: str, sql: str, setting: str | None = None):
        super().__init__(message)
        self.message = message
        self.sql = sql
        self.setting = setting
        self.peak_memory_mb: float | None = None
        self.elapsed_ms: float | None = None


class QueryInterrupted(QueryError):
    """A user query ran past `sql_time_limit_ms`."""


class QueryBusy(QueryError):
    """`sql_max_concurrent` user queries were already running for all of `sql_queue_wait_ms`."""


@dataclass
class QueryResult:
    columns: list[str]
    rows: list[tuple]
    truncated: bool  # more rows existed than max_rows
    sql: str
    elapsed_ms: float = 0.0
    types: list[str] = field(default_factory=list)
    peak_memory_mb: float = 0.0  # the worker's peak RSS during the query, above its RSS before it

    def as_dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r, strict=True)) for r in self.rows]


def _env_hint(name: str) -> str:
    return f"setting {name}, env {settings.SETTINGS[name].env}"


def run_user_sql(db, sql: str, max_rows: int | None = None, time_limit_ms: int | None = None) -> QueryResult:
    """Run one read-only query typed by a person, in a guarded worker process (see the module doc).

    `db` is the store's path (None: the default store). Raises `QueryError` (refused or
    failed; `setting` names the limit that stopped it), `QueryInterrupted` (time),
    `QueryBusy` (too many at once) or `store.StoreBusy` (the store stayed locked).
    """
    sql = (sql or "").strip()
    max_rows = settings.get("sql_max_rows") if max_rows is None else int(max_rows)
    limit_ms = settings.get("sql_time_limit_ms") if time_limit_ms is None else int(time_limit_ms)
    memory_mb, threads = _key()
    if len(sql) > MAX_SQL_CHARS:
        raise QueryError(f"the statement is longer than {MAX_SQL_CHARS:,} characters", sql)
    path = Path(os.path.abspath(db if db is not None else store.default_db()))
    if not path.exists():
        with store.connect(path):  # creates the empty store: the worker cannot write
            pass
    paths = _server_paths(path)
    req = {
        "db": str(path),
        "sql": sql,
        "max_rows": max_rows,
        "limit_ms": limit_ms,
        "kill_after": float(settings.get("sql_kill_after")),
        "memory_mb": memory_mb,
        "threads": threads,
        "lock_timeout_s": settings.get("lock_timeout_s"),
        "max_result_bytes": settings.get("sql_max_result_mb") << 20,
        "scrub": paths,
    }
    with _GATE.slot(sql):
        reply = _POOL.run(req)
    kind = reply["kind"]
    if kind == "ok":
        return QueryResult(
            columns=reply["columns"],
            rows=reply["rows"],
            truncated=reply["truncated"],
            sql=sql,
            elapsed_ms=reply.get("elapsed_ms", 0.0),
            types=reply["types"],
            peak_memory_mb=reply.get("peak_kb", 0) / 1024,
        )
    if kind == "store_busy":
        raise store.StoreBusy(
            f"the store stayed busy for {req['lock_timeout_s']} s waiting to read; another process holds it "
            f"({_env_hint('lock_timeout_s')})"
        )
    message = scrub(str(reply.get("message", "")), paths)
    err = _error(kind, message, sql, limit_ms, memory_mb, reply)
    err.peak_memory_mb = reply.get("peak_kb", 0) / 1024 if "peak_kb" in reply else None
    err.elapsed_ms = reply.get("elapsed_ms")
    raise err


def warm_up(n: int = 1) -> None:
    """Have `n` workers started and ready (at most `sql_max_concurrent`), so no query waits for one."""
    _POOL.warm_up(n)


def warm_up_in_background(n: int = 1) -> threading.Thread:
    """`warm_up(n)` on a daemon thread, once per process (per pool): later calls return the same thread.

    For a server's start: the caller does not wait for the worker to import DuckDB.
    """
    return _POOL.warm_in_background(n)


def pool_status() -> dict[str, int]:
    """{"alive": worker processes running, "ready": of the idle ones, those started and waiting for a query}."""
    return _POOL.status()


def _key() -> tuple[int, int]:
    return int(settings.get("sql_memory_limit_mb")), int(settings.get("sql_threads"))


def _error(kind: str, message: str, sql: str, limit_ms: int, memory_mb: int, reply: dict) -> QueryError:
    if kind == "interrupted":
        return QueryInterrupted(
            f"query took longer than {limit_ms} ms and was stopped ({_env_hint('sql_time_limit_ms')})",
            sql,
            "sql_time_limit_ms",
        )
    if kind in ("memory", "died"):
        what = f" ({message})" if message else ""
        return QueryError(
            f"query needed more than the memory limit of {memory_mb} MB and was stopped{what} "
            f"({_env_hint('sql_memory_limit_mb')})",
            sql,
            "sql_memory_limit_mb",
        )
    if kind == "settings_changed":
        return QueryError("the query changed the connection's locked settings; its result is withheld", sql)
    if kind == "too_big":
        return QueryError(
            f"the result is larger than {settings.get('sql_max_result_mb')} MB "
            f"({_env_hint('sql_max_result_mb')}); select fewer columns or rows",
            sql,
            "sql_max_result_mb",
        )
    return QueryError(message, sql)


def _server_paths(db: Path) -> list[tuple[str, str]]:
    """(path, label) of every server path a result or message must not show, longest first."""
    found: dict[str, str] = {}

    def add(p: Any, label: str) -> None:
        for variant in {str(p), os.path.realpath(str(p))}:
            if variant and variant not in ("/", ".") and len(variant) > 1:
                found.setdefault(variant.rstrip("/"), label)

    add(db, "<store>")
    add(db.parent, "<store dir>")
    add(Path.home(), "<home>")
    if os.environ.get("HOME"):
        add(os.environ["HOME"], "<home>")
    add(tempfile.gettempdir(), "<tmp>")
    add(os.getcwd(), "<cwd>")
    return sorted(found.items(), key=lambda kv: -len(kv[0]))


# ------------------------------------------------------------------ concurrency


class _Gate:
    """At most `sql_max_concurrent` queries at once; a newcomer waits `sql_queue_wait_ms`, then is busy."""

    def __init__(self):
        self._cond = threading.Condition()
        self.active = 0

    @contextmanager
    def slot(self, sql: str):
        most = max(1, settings.get("sql_max_concurrent"))
        with self._cond:
            if not self._cond.wait_for(lambda: self.active < most, settings.get("sql_queue_wait_ms") / 1000):
                raise QueryBusy(
                    f"busy: {most} user queries are already running, the most at once "
                    f"({_env_hint('sql_max_concurrent')}); try again in a moment",
                    sql,
                    "sql_max_concurrent",
                )
            self.active += 1
        try:
            yield
        finally:
            with self._cond:
                self.active -= 1
                self._cond.notify()


# ------------------------------------------------------------------ workers

_BOOT = "from observatory.queries.user_sql_worker import main; main()"
_ENV_KEEP = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "SYSTEMROOT")


class _Died(Exception):
    """The worker's pipe closed: it exited or was killed."""


class _Worker:
    """One worker process and its pipes; `key` is (memory limit, threads), fixed at its start."""

    def __init__(self, key: tuple[int, int]):
        self.key = key
        self.queries = 0
        self.ready = False
        self.began = False  # it took a query: its death from here on is that query's doing
        self.phase = "idle"  # of the query in hand: "checking", "connecting", "running"
        self._starting = threading.Lock()  # a warm-up thread and a query may both wait for the ready message
        env = {k: os.environ[k] for k in _ENV_KEEP if k in os.environ}
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _BOOT, str(key[0]), str(key[1])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            cwd="/",
            close_fds=True,
            start_new_session=True,  # a Ctrl-C at the terminal goes to the server, which stops its workers
        )
        self._fd = self.proc.stdout.fileno()
        os.set_blocking(self._fd, False)
        self._buf = bytearray()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read(self, deadline: float, max_bytes: int) -> dict | None:
        """The next frame, or None at `deadline`; `_Died` when the pipe closes."""
        while True:
            if len(self._buf) >= 8:
                n = struct.unpack(">Q", self._buf[:8])[0]
                if n > max_bytes:
                    raise _Died(f"frame of {n} bytes")
                if len(self._buf) >= 8 + n:
                    body = bytes(self._buf[8 : 8 + n])
                    del self._buf[: 8 + n]
                    return _SafeUnpickler(io.BytesIO(body)).load()
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self._fd], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self._fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                raise _Died("pipe closed")
            self._buf += chunk

    def start(self) -> None:
        with self._starting:
            if not self.ready:
                reply = self.read(time.monotonic() + _START_TIMEOUT_S, 1 << 16)
                if not reply or reply.get("kind") != "ready":
                    raise _Died("no ready message")
                self.ready = True

    def query(self, req: dict) -> dict:
        """Send one query and follow it to its reply; kills the worker at `sql_kill_after` x the limit."""
        self.start()
        self.queries += 1
        self.began, self.phase = False, "sent"
        write_frame(self.proc.stdin, req)
        max_bytes = req["max_result_bytes"] + (4 << 20)
        budget = req["limit_ms"] / 1000 * req["kill_after"]
        deadline = time.monotonic() + budget
        base_kb = 0
        while True:
            msg = self.read(deadline, max_bytes)
            if msg is None:  # past the deadline: DuckDB's interrupt did not land
                peak = max(0, _peak_kb(self.proc.pid) - base_kb)
                self.kill()
                return {"kind": "interrupted", "peak_kb": peak, "elapsed_ms": budget * 1000, "retire": True}
            kind = msg.get("kind")
            if kind == "begin":
                self.began, self.phase = True, "checking"
                base_kb = int(msg.get("rss_kb", 0))
            elif kind == "waiting":  # the store lock wait is not the query's time
                self.phase = "connecting"
                budget = deadline - time.monotonic()
                deadline = time.monotonic() + req["lock_timeout_s"] + 10
            elif kind == "connected":
                self.phase = "running"
                deadline = time.monotonic() + budget
            else:
                self.phase = "idle"
                return msg

    def kill(self) -> None:
        """SIGKILL now; the reaping and the pipes' closing happen off the caller's path."""
        try:
            self.proc.kill()
        except OSError:
            pass
        threading.Thread(target=self._reap, daemon=True).start()

    def _reap(self) -> None:
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _peak_kb(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class _Pool:
    """Warm workers, one per running query at most; a worker that dies or is killed is replaced at once."""

    def __init__(self):
        self._lock = threading.Lock()
        self.idle: list[_Worker] = []
        self.all: list[_Worker] = []
        self.warming: threading.Thread | None = None  # the one background warm-up, once started
        self.spares: list[threading.Thread] = []  # replacements being started off the callers' path

    def warm_up(self, n: int) -> None:
        """`n` workers started and ready (at most `sql_max_concurrent`)."""
        self.warm(_key(), min(n, max(1, settings.get("sql_max_concurrent"))))

    def warm_in_background(self, n: int) -> threading.Thread:
        """`warm_up(n)` on a daemon thread, started once: later calls return the same thread."""
        with self._lock:
            if self.warming is None:
                self.warming = threading.Thread(
                    target=self.warm_up, args=(n,), name="observatory-sql-warm-up", daemon=True
                )
                self.warming.start()
            return self.warming

    def _new(self, key: tuple[int, int]) -> _Worker:
        w = _Worker(key)
        self.all = [x for x in self.all if x.alive()] + [w]
        return w

    def _purge(self, key: tuple[int, int]) -> None:
        """Drop (and kill) idle workers that died or were started for other limits; under the lock."""
        stale = [w for w in self.idle if w.key != key or not w.alive()]
        for w in stale:
            w.kill()
        self.idle = [w for w in self.idle if w not in stale]

    def take(self, key: tuple[int, int]) -> _Worker:
        """An idle worker (else a new one, on the caller's clock). Taking the last idle one starts a spare
        in the background while fewer than `sql_max_concurrent` are alive: the next query that comes
        while this one runs finds a worker started, not ~1 s of a new process's start-up (under load
        several seconds; those were the SQL page's slowest views)."""
        with self._lock:
            self._purge(key)
            w = self.idle.pop() if self.idle else self._new(key)
            keep = max(1, settings.get("sql_max_concurrent"))
            if not self.idle and sum(x.alive() for x in self.all) < keep:
                self._spare(key, keep)
            return w

    def warm(self, key: tuple[int, int], n: int) -> None:
        with self._lock:
            self._purge(key)
            while len(self.idle) < n:
                self.idle.append(self._new(key))
            waiting = list(self.idle)
        for w in waiting:
            try:
                w.start()
            except (_Died, OSError):
                pass

    def status(self) -> dict[str, int]:
        with self._lock:
            return {
                "alive": sum(w.alive() for w in self.all),
                "ready": sum(w.ready and w.alive() for w in self.idle),
            }

    def give_back(self, w: _Worker, healthy: bool) -> None:
        with self._lock:
            keep = max(1, settings.get("sql_max_concurrent"))
            if healthy and w.alive() and w.queries < _MAX_QUERIES_PER_WORKER and len(self.idle) < keep:
                self.idle.append(w)
                return
            w.kill()
            if w.ready and len(self.idle) < keep:  # replaced off the caller's path; it warms up unwatched
                self._spare(w.key, keep)

    def _spare(self, key: tuple[int, int], keep: int) -> None:
        """Start a replacement on a thread of its own (under the lock); `settle` waits for it."""
        self.spares = [t for t in self.spares if t.is_alive()]
        self.spares.append(threading.Thread(target=self._replace, args=(key, keep), daemon=True))
        self.spares[-1].start()

    def settle(self, timeout_s: float = 30.0) -> None:
        """Wait until no worker is being started in the background (the warm-up, a replacement)."""
        with self._lock:
            pending = [t for t in (self.warming, *self.spares) if t is not None]
        for t in pending:
            t.join(timeout_s)

    def _replace(self, key: tuple[int, int], keep: int) -> None:
        w = _Worker(key)  # the fork and exec happen outside the lock
        with self._lock:
            self.all = [x for x in self.all if x.alive()] + [w]
            if len(self.idle) < keep:
                self.idle.append(w)
                return
        w.kill()

    def run(self, req: dict) -> dict:
        """The worker's reply to `req`; a worker found dead before it took the query is replaced once."""
        key = (req["memory_mb"], req["threads"])
        for attempt in (0, 1):
            w = self.take(key)
            healthy = False
            try:
                reply = w.query(req)
                healthy = not reply.get("retire")
                return reply
            except (_Died, OSError):
                if not w.ready:
                    return {
                        "kind": "error",
                        "message": "the SQL worker process did not start (see the server's log)",
                    }
                if w.began or attempt:
                    break  # the query took it down
                # else an idle worker that had died: a fresh one runs the query
            finally:
                self.give_back(w, healthy)
        return {"kind": "died", "message": "", "retire": True}

    def close(self) -> None:
        self.settle()
        with self._lock:
            for w in self.all:
                w.kill()
            self.idle, self.all = [], []


_GATE = _Gate()
_POOL = _Pool()
atexit.register(_POOL.close)


class _SafeUnpickler(pickle.Unpickler):
    """Unpickles what a worker sends: plain containers, dates, decimals, UUIDs, zoneinfo; nothing else."""

    _ALLOWED = {
        ("datetime", "datetime"),
        ("datetime", "date"),
        ("datetime", "time"),
        ("datetime", "timedelta"),
        ("datetime", "timezone"),
        ("decimal", "Decimal"),
        ("uuid", "UUID"),
        ("zoneinfo", "ZoneInfo"),
    }

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _zoneinfo_getattr
        raise pickle.UnpicklingError(f"a worker sent {module}.{name}, which is not allowed")


def _zoneinfo_getattr(obj: Any, name: str) -> Any:
    """The one `getattr` a ZoneInfo pickle needs: `ZoneInfo._unpickle`."""
    import zoneinfo

    if obj is zoneinfo.ZoneInfo and name == "_unpickle":
        return obj._unpickle
    raise pickle.UnpicklingError(f"getattr({obj!r}, {name!r}) is not allowed")
