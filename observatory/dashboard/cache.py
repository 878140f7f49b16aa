"""The dashboard's query cache: store queries on one read-only connection per batch, shared by all sessions.

`query(fn, *args)` / `query_all((fn, *args), ...)` run `observatory.queries`
functions on ONE fresh read-only connection per batch (`observatory.store.connect`,
which waits out a busy store) and cache each result for `cache_ttl_s` seconds
across ALL sessions, one fill of a batch at a time, so a hundred viewers of a live run cost
one round of queries a second. While one viewer fills, the others
do not queue behind it: a result at most one `cache_ttl_s` past due is served as
it is (the fill under way, or the next viewer's, renews it), so a page waits for
the store only when it has nothing recent to show. The same holds while the ingester
writes: a viewer whose batch has such a recent result does not wait for the write
lock (a follower's batch holds it ~0.3 s under load, a third of the time), it is shown
that result and the keeper thread refills the batch once the writer is done. If the store stays busy past
the retry budget, the page shows the last good result (or a calm "store busy"
note); a lock error never reaches the page.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np

from observatory import settings, store

__all__ = [
    "CACHE",
    "QueryCache",
    "StoreBusy",
    "cached_bytes",
    "db_path",
    "derive",
    "limit_memory",
    "query",
    "query_all",
    "size_of",
]


class StoreBusy(RuntimeError):
    """The store stayed locked past the retry budget and no earlier result exists."""


def db_path() -> str:
    return str(settings.get("db"))


_KEEP_S = 600.0  # how long a stale entry may serve as the "last good" answer
_HOT_FOR_S = 5.0  # a batch nobody asked for in this long is no longer refilled
_HOT_MAX = 8  # at most this many batches are kept fresh (the most recently asked)
_MIN_REFILL_S = 0.5  # on the store's changes, a hot batch is refilled at most this often
_DERIVED_MAX = 128  # a Live view's version is ~10 entries (figures and their wire forms)
_PLAIN = (str, int, float, bool, type(None))


def _key(fn: Callable, args: tuple, kwargs: dict) -> str:
    name = f"{fn.__module__}:{fn.__qualname__}"
    return f"{db_path()}|{name}|{json.dumps([list(args), kwargs], sort_keys=True, default=_jsonable)}"


class QueryCache:
    """The answers of page queries and the results derived from them, shared by every session of a server
    process, and the keeper thread that refills the hot ones.

    One per dashboard process, reached as `CACHE` through this module's functions: Streamlit runs every
    session's script on a thread of one process, and sharing answers between those sessions is what the
    cache is for, so no session could own it. A test that wants an empty one sets `CACHE` to a new
    `QueryCache()` and `stop()`s it after; nothing clears one."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # around the dicts below; never held while waiting for the store
        # key -> (monotonic time it was filled, value, its size in bytes), least recently used first; stale
        # entries stay as the last good answer for when the store is busy. Bounded by bytes
        # (`dashboard_cache_mb`), not only by age: every distinct query a visitor can make is an entry.
        self.entries: OrderedDict[str, tuple[float, Any, int]] = OrderedDict()
        self.bytes = 0  # the sizes of `entries`' values, summed
        # One fill at a time per batch: concurrent viewers that miss the same batch together wait for the
        # first one's connection and then find its results cached (N viewers, one query). Other batches
        # (another page's, another run's) fill beside it: one slow fill holds up only its own viewers.
        self.fill_locks: dict[tuple[str, ...], threading.Lock] = {}
        # batch -> (when a viewer last asked for it, its calls, its store): the keep_fresh batches the
        # keeper refills, each from the store its keys name
        self.hot: dict[tuple[str, ...], tuple[float, list, str]] = {}
        self.soon: dict[tuple[str, ...], tuple[list, str]] = {}  # batch -> (its calls, its store): one refill
        self.keeper: threading.Thread | None = None
        self.stopping = threading.Event()
        # (fn, args by identity or value) -> (args, result, its bytes): the newest derived results; at most
        # _DERIVED_MAX of them and `dashboard_cache_mb` of results
        self.derived: OrderedDict[tuple, tuple[tuple, Any, int]] = OrderedDict()
        self.derived_bytes = 0
        self.building: dict[tuple, threading.Event] = {}  # keys being derived right now, set when done

    def fill_lock(self, keys: list[str]) -> threading.Lock:
        """The lock that one fill of this batch holds."""
        batch = tuple(keys)
        with self.lock:
            lock = self.fill_locks.get(batch)
            if lock is None:
                if len(self.fill_locks) > 1024:  # forget idle batches' locks
                    for b in [b for b, x in self.fill_locks.items() if not x.locked()]:
                        del self.fill_locks[b]
                lock = self.fill_locks[batch] = threading.Lock()
            return lock

    def lookup(self, keys: list[str], max_age_s: float) -> dict[int, Any]:
        """The cached results of `keys` filled less than `max_age_s` ago, by position."""
        since = time.monotonic() - max_age_s
        entries = self.entries
        with self.lock:
            out = {i: entries[k][1] for i, k in enumerate(keys) if k in entries and entries[k][0] > since}
            for i in out:
                entries.move_to_end(keys[i])
            return out

    def query_all(self, *calls, keep_fresh: bool = False, ttl_s: float | None = None) -> list[Any]:
        """`query_all` (the module's function) on this cache."""
        parsed = [(c[0], tuple(c[1:])) for c in calls]
        keys = [_key(fn, args, {}) for fn, args in parsed]
        ttl = float(settings.get("cache_ttl_s") if ttl_s is None else ttl_s)
        if keep_fresh:
            self.keep(keys, parsed)
        out = self.lookup(keys, ttl)
        if len(out) < len(keys):
            recent = self.lookup(keys, 2 * ttl)
            if len(recent) == len(keys) and store.writer_active(db_path()):
                self.refill_soon(keys, parsed)  # recent, and opening the store now would wait for the writer
                return [recent[i] for i in range(len(keys))]
            asked = time.monotonic()
            fill_lock = self.fill_lock(keys)
            filling = not fill_lock.acquire(blocking=len(recent) < len(keys))
            if filling:  # another viewer is filling: answers one TTL past due do, rather than queue behind it
                return [recent[i] for i in range(len(keys))]
            try:
                # filled while we waited (by the viewer we queued behind): that answer will do, even when
                # the fill took longer than the TTL; else every viewer in the queue would fill in turn
                out.update(self.lookup(keys, max(ttl, time.monotonic() - asked)))
                # the whole batch, not only its stale part: its entries then age together, and
                # the next fill is again one connection rather than one per part
                if len(out) < len(keys):
                    try:
                        out.update(self.fill(keys, parsed))
                    except store.StoreBusy:  # busy past the retry budget
                        with self.lock:
                            stale = {i: self.entries[k][1] for i, k in enumerate(keys) if k in self.entries}
                        if len(stale) < len(keys):
                            raise StoreBusy(
                                "the store is being written right now; this view refreshes by itself"
                            ) from None
                        out.update(stale)
            finally:
                fill_lock.release()
        return [out[i] for i in range(len(keys))]

    def fill(
        self, keys: list[str], parsed: list[tuple[Callable, tuple]], db: str | None = None
    ) -> dict[int, Any]:
        """Run the whole batch on one connection to `db` (default: the store's path now) and cache each
        result; the caller holds its fill lock.

        Raises `store.StoreBusy` when the store stays busy past the retry budget.
        """
        try:
            with store.connect(db or db_path()) as con:
                limit_memory(con)
                return self.fill_on(con, keys, parsed)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower():
                raise
            raise store.StoreBusy(str(e)) from None

    def fill_on(self, con, keys: list[str], parsed: list[tuple[Callable, tuple]]) -> dict[int, Any]:
        """Run the batch on the open connection `con` and cache each result."""
        out: dict[int, Any] = {}
        for i, (fn, args) in enumerate(parsed):
            out[i] = fn(con, *args)
            self.put(keys[i], out[i])
        return out

    def keep(self, keys: list[str], parsed: list) -> None:
        with self.lock:
            self.hot[tuple(keys)] = (time.monotonic(), parsed, db_path())
            if len(self.hot) > _HOT_MAX:
                del self.hot[min(self.hot, key=lambda b: self.hot[b][0])]
        self.start_keeper()

    def refill_soon(self, keys: list[str], parsed: list) -> None:
        """Have the keeper fill this batch once, soon (it waits for the store, no viewer does)."""
        with self.lock:
            self.soon[tuple(keys)] = (parsed, db_path())
            if len(self.soon) > _HOT_MAX * 4:
                self.soon.pop(next(iter(self.soon)))
        self.start_keeper()

    def start_keeper(self) -> None:
        with self.lock:
            if self.keeper is None:
                self.keeper = threading.Thread(
                    target=self._keep_fresh, name="observatory-cache-keeper", daemon=True
                )
                self.keeper.start()
                # before the interpreter stops its daemon threads: one stopped inside DuckDB aborts the process
                atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the keeper thread (at exit, or the end of a test's cache)."""
        self.stopping.set()
        if self.keeper is not None:
            self.keeper.join(10)

    def _keep_fresh(self) -> None:
        """Refill each hot batch soon after the store changes (a commit), and when its oldest entry is three
        quarters of a TTL old; until `stop` (a daemon). So a live run's answer is about one fill behind the
        ingester's last commit, and at most about one TTL old."""
        filled: dict[tuple[str, ...], tuple] = {}  # batch -> the store's stamp when last refilled here
        while not self.stopping.wait(min(0.1, float(settings.get("cache_ttl_s")) / 4)):
            ttl = float(settings.get("cache_ttl_s"))
            now = time.monotonic()
            with self.lock:
                for b in [b for b, (t, _, _) in self.hot.items() if now - t > _HOT_FOR_S]:
                    del self.hot[b]
                # the batch viewers asked for last first (in practice the Live panel's)
                hot = {
                    b: (parsed, db, [self.entries[k][0] if k in self.entries else -math.inf for k in b])
                    for b, (_, parsed, db) in sorted(self.hot.items(), key=lambda kv: -kv[1][0])
                }
            for b in [b for b in filled if b not in hot]:
                del filled[b]
            due: dict[
                str, list
            ] = {}  # store -> its due batches, each (keys, calls, the store's stamp), in order
            for b, (parsed, db, times) in hot.items():
                age = now - min(times)
                stamp = _stamp(db)
                filled.setdefault(b, stamp)  # first seen: a viewer has just filled it
                if age >= 0.75 * ttl or (stamp != filled[b] and age >= _MIN_REFILL_S):
                    due.setdefault(db, []).append((list(b), parsed, stamp))
            with self.lock:  # the batches viewers were shown a recent answer of while the store was written
                soon = dict(self.soon)
                self.soon.clear()
            for b, (parsed, db) in soon.items():
                if b in hot or len(self.lookup(list(b), ttl)) == len(b):
                    continue  # the keeper's own, or a viewer filled it meanwhile
                if store.writer_active(
                    db
                ):  # not yet: the keeper must not wait here (the hot batches are due)
                    with self.lock:
                        self.soon.setdefault(b, (parsed, db))
                    continue
                due.setdefault(db, []).append((list(b), parsed, _stamp(db)))
            for db, batches in due.items():  # each store's due batches on ONE connection
                if self.stopping.is_set():
                    return
                self.refill(db, batches, filled)

    def refill(self, db: str, due: list[tuple[list[str], list, tuple]], filled: dict) -> None:
        """Fill the `due` batches of store `db` one after another on one connection (one wait for the
        store, one open), in the order given: the batch viewers asked for last first. A batch a viewer is
        filling is left to that viewer; one that fails is left to the next viewer's own fill."""
        locks = []
        try:
            for d in due:
                lock = self.fill_lock(d[0])
                if lock.acquire(blocking=False):
                    locks.append((lock, d))
            if not locks:
                return
            with store.connect(db) as con:
                limit_memory(con)
                for _, (keys, parsed, stamp) in locks:
                    if self.stopping.is_set():
                        return
                    try:
                        self.fill_on(con, keys, parsed)
                        # the stamp from before the fill: a commit during it is seen next
                        filled[tuple(keys)] = stamp
                    except duckdb.IOException:
                        raise  # the connection itself failed: the rest of this round is left to the next one
                    except Exception:  # this batch's own error, which the next viewer's own fill will show
                        pass
        except Exception:  # busy, or the store cannot be opened now: the next round tries again
            pass
        finally:
            for lock, _ in locks:
                lock.release()

    def put(self, key: str, value: Any) -> None:
        """Cache `value`; the least recently used entries go while the cache holds more than its bytes.
        A value larger than the whole budget is not kept (its viewer gets it, the next one queries)."""
        now = time.monotonic()
        n = size_of(value)
        budget = cache_budget()
        entries = self.entries
        with self.lock:
            old = entries.pop(key, None)
            if old is not None:
                self.bytes -= old[2]
            if n <= budget:
                entries[key] = (now, value, n)
                self.bytes += n
            while entries and (self.bytes > budget or next(iter(entries.values()))[0] < now - _KEEP_S):
                self.bytes -= entries.popitem(last=False)[1][2]

    def cached_bytes(self) -> tuple[int, int]:
        with self.lock:
            return self.bytes, self.derived_bytes

    def derive(self, fn: Callable, *args) -> Any:
        """`derive` (the module's function) on this cache."""
        key = (fn.__module__, fn.__qualname__, *(a if isinstance(a, _PLAIN) else ("id", id(a)) for a in args))
        with self.lock:
            hit = self.derived.get(key)
            if hit is not None:
                self.derived.move_to_end(key)
                return hit[1]
            building = self.building.get(key)
            if building is None:
                self.building[key] = threading.Event()
        if building is not None:  # another session is building it: wait for that one, not build it too
            building.wait(30)
            with self.lock:
                hit = self.derived.get(key)
            return hit[1] if hit is not None else fn(*args)
        try:
            value = fn(*args)
            n, budget = size_of(value), cache_budget()
            with self.lock:
                if n <= budget:
                    # holding the args keeps their ids theirs while the entry lives
                    self.derived[key] = (args, value, n)
                    self.derived_bytes += n
                while self.derived and (len(self.derived) > _DERIVED_MAX or self.derived_bytes > budget):
                    self.derived_bytes -= self.derived.popitem(last=False)[1][2]
        finally:
            with self.lock:
                self.building.pop(key).set()
        return value


CACHE = QueryCache()  # this server process's (see `QueryCache`)


def query_all(*calls, keep_fresh: bool = False, ttl_s: float | None = None) -> list[Any]:
    """Several queries as one unit of work: cache hits are free, all misses share ONE connection.

    Each call is a tuple `(fn, arg1, arg2, ...)`; fn(con, *args) must be a module-level
    function and the args JSON-serialisable (they form the cache key). Results are cached
    for `cache_ttl_s` across all sessions. Opening the store costs more than most of these
    queries, hence the batching.

    keep_fresh: the batch of a view that refreshes by itself (a live run). A background
    thread then refills it just before it falls due, for as long as some viewer keeps asking
    (`_HOT_FOR_S`), so its viewers find a fresh answer and none waits for the store: its
    data is at most about one `cache_ttl_s` old when shown.

    ttl_s: this batch's lifetime instead of `cache_ttl_s`, for answers that change far more rarely
    than the data (the store's schema).
    """
    return CACHE.query_all(*calls, keep_fresh=keep_fresh, ttl_s=ttl_s)


def query(fn: Callable, *args, ttl_s: float | None = None) -> Any:
    """`fn(con, *args)` on a read-only connection, cached for cache_ttl_s (or `ttl_s`) across sessions."""
    return CACHE.query_all((fn, *args), ttl_s=ttl_s)[0]


def derive(fn: Callable, *args) -> Any:
    """`fn(*args)` once for all sessions while its arguments are the same objects; the result is shared.

    For pure functions of cached results, such as a page's figures built from a query's
    frames: twenty viewers of one live run then build its charts once per refresh, not
    twenty times (each build is many small frame operations, and under load their thread
    hand-offs cost more than the queries). Arguments match by identity (the objects
    `query_all` hands out) or, for numbers and strings, by value. Callers must not mutate
    the result.
    """
    return CACHE.derive(fn, *args)


def cached_bytes() -> tuple[int, int]:
    """(bytes the query cache holds, bytes the derived results hold), as `size_of` counts them."""
    return CACHE.cached_bytes()


def limit_memory(con) -> None:
    """`dashboard_memory_limit_mb` on a page-query connection: the process's DuckDB instance (buffer
    cache and working memory) stays under it, whatever the store's size; more spills to disk."""
    con.execute(f"SET memory_limit = '{int(settings.get('dashboard_memory_limit_mb'))}MiB'")


def _stamp(db: str) -> tuple:
    """(mtime, size) of the store and its WAL: changes with each commit of the ingester. A stat, no lock."""
    out = []
    for p in (db, db + ".wal"):
        try:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


def cache_budget() -> int:
    """Bytes the query cache may hold (`dashboard_cache_mb`); the derived results as many again."""
    return int(settings.get("dashboard_cache_mb")) << 20


def size_of(v: Any, _depth: int = 0) -> int:
    """About how many bytes `v` holds: frames and arrays by their buffers, containers by their items."""
    if hasattr(v, "estimated_size"):  # a polars frame or series
        return int(v.estimated_size())
    if hasattr(v, "nbytes"):  # numpy, pyarrow
        return int(v.nbytes)
    if isinstance(v, (str, bytes)):
        return sys.getsizeof(v)
    if _depth < 8 and isinstance(v, dict):
        return sys.getsizeof(v) + sum(size_of(k, _depth + 1) + size_of(x, _depth + 1) for k, x in v.items())
    if _depth < 8 and isinstance(v, (list, tuple, set, frozenset)):
        return sys.getsizeof(v) + sum(size_of(x, _depth + 1) for x in v)
    return sys.getsizeof(v)


def _jsonable(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"query argument {o!r} is not JSON-serialisable")
