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

__all__ = ["StoreBusy", "cached_bytes", "db_path", "derive", "limit_memory", "query", "query_all", "size_of"]


class StoreBusy(RuntimeError):
    """The store stayed locked past the retry budget and no earlier result exists."""


def db_path() -> str:
    return str(settings.get("db"))


# key -> (monotonic time it was filled, value, its size in bytes), least recently used first. Shared
# by every session of this server process; stale entries stay as the last good answer for when the
# store is busy. Bounded by bytes (`dashboard_cache_mb`), not only by age: every distinct query a
# visitor can make (a run id, a metric name) is an entry.
_CACHE: OrderedDict[str, tuple[float, Any, int]] = OrderedDict()
_BYTES = [0]  # the sizes of _CACHE's values, summed
_CACHE_LOCK = threading.Lock()
# One fill at a time per batch: concurrent viewers that miss the same batch together wait for the
# first one's connection and then find its results cached (N viewers, one query). Other batches
# (another page's, another run's) fill beside it: one slow fill holds up only its own viewers.
_FILL_LOCKS: dict[tuple[str, ...], threading.Lock] = {}
_KEEP_S = 600.0  # how long a stale entry may serve as the "last good" answer


def _key(fn: Callable, args: tuple, kwargs: dict) -> str:
    name = f"{fn.__module__}:{fn.__qualname__}"
    return f"{db_path()}|{name}|{json.dumps([list(args), kwargs], sort_keys=True, default=_jsonable)}"


def _fill_lock(keys: list[str]) -> threading.Lock:
    """The lock that one fill of this batch holds."""
    batch = tuple(keys)
    with _CACHE_LOCK:
        lock = _FILL_LOCKS.get(batch)
        if lock is None:
            if len(_FILL_LOCKS) > 1024:  # forget idle batches' locks
                for b in [b for b, x in _FILL_LOCKS.items() if not x.locked()]:
                    del _FILL_LOCKS[b]
            lock = _FILL_LOCKS[batch] = threading.Lock()
        return lock


def _lookup(keys: list[str], max_age_s: float) -> dict[int, Any]:
    """The cached results of `keys` filled less than `max_age_s` ago, by position."""
    since = time.monotonic() - max_age_s
    with _CACHE_LOCK:
        out = {i: _CACHE[k][1] for i, k in enumerate(keys) if k in _CACHE and _CACHE[k][0] > since}
        for i in out:
            _CACHE.move_to_end(keys[i])
        return out


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
    parsed = [(c[0], tuple(c[1:])) for c in calls]
    keys = [_key(fn, args, {}) for fn, args in parsed]
    ttl = float(settings.get("cache_ttl_s") if ttl_s is None else ttl_s)
    if keep_fresh:
        _keep(keys, parsed)
    out = _lookup(keys, ttl)
    if len(out) < len(keys):
        recent = _lookup(keys, 2 * ttl)
        if len(recent) == len(keys) and store.writer_active(db_path()):
            _refill_soon(keys, parsed)  # recent, and opening the store now would wait for the writer
            return [recent[i] for i in range(len(keys))]
        asked = time.monotonic()
        fill_lock = _fill_lock(keys)
        filling = not fill_lock.acquire(blocking=len(recent) < len(keys))
        if filling:  # another viewer is filling: answers one TTL past due do, rather than queue behind it
            return [recent[i] for i in range(len(keys))]
        try:
            # filled while we waited (by the viewer we queued behind): that answer will do, even when
            # the fill took longer than the TTL; else every viewer in the queue would fill in turn
            out.update(_lookup(keys, max(ttl, time.monotonic() - asked)))
            # the whole batch, not only its stale part: its entries then age together, and
            # the next fill is again one connection rather than one per part
            if len(out) < len(keys):
                try:
                    out.update(_fill(keys, parsed))
                except store.StoreBusy:  # busy past the retry budget
                    with _CACHE_LOCK:
                        stale = {i: _CACHE[k][1] for i, k in enumerate(keys) if k in _CACHE}
                    if len(stale) < len(keys):
                        raise StoreBusy(
                            "the store is being written right now; this view refreshes by itself"
                        ) from None
                    out.update(stale)
        finally:
            fill_lock.release()
    return [out[i] for i in range(len(keys))]


def limit_memory(con) -> None:
    """`dashboard_memory_limit_mb` on a page-query connection: the process's DuckDB instance (buffer
    cache and working memory) stays under it, whatever the store's size; more spills to disk."""
    con.execute(f"SET memory_limit = '{int(settings.get('dashboard_memory_limit_mb'))}MiB'")


def _fill(keys: list[str], parsed: list[tuple[Callable, tuple]], db: str | None = None) -> dict[int, Any]:
    """Run the whole batch on one connection to `db` (default: the store's path now) and cache each
    result; the caller holds its fill lock.

    Raises `store.StoreBusy` when the store stays busy past the retry budget.
    """
    try:
        with store.connect(db or db_path()) as con:
            limit_memory(con)
            return _fill_on(con, keys, parsed)
    except duckdb.IOException as e:
        if "lock" not in str(e).lower():
            raise
        raise store.StoreBusy(str(e)) from None


def _fill_on(con, keys: list[str], parsed: list[tuple[Callable, tuple]]) -> dict[int, Any]:
    """Run the batch on the open connection `con` and cache each result."""
    out: dict[int, Any] = {}
    for i, (fn, args) in enumerate(parsed):
        out[i] = fn(con, *args)
        _put(keys[i], out[i])
    return out


# batch -> (when a viewer last asked for it, its calls, its store): the keep_fresh batches the keeper
# refills, each from the store its keys name
_HOT: dict[tuple[str, ...], tuple[float, list, str]] = {}
_HOT_FOR_S = 5.0  # a batch nobody asked for in this long is no longer refilled
_HOT_MAX = 8  # at most this many batches are kept fresh (the most recently asked)
_MIN_REFILL_S = 0.5  # on the store's changes, a hot batch is refilled at most this often
_SOON: dict[tuple[str, ...], tuple[list, str]] = {}  # batch -> (its calls, its store): one refill each
_KEEPER: list[threading.Thread] = []
_STOP = threading.Event()


@atexit.register
def _stop_keeper() -> None:
    # before the interpreter stops its daemon threads: one stopped inside DuckDB aborts the process
    _STOP.set()
    for t in _KEEPER:
        t.join(10)


def _keep(keys: list[str], parsed: list) -> None:
    with _CACHE_LOCK:
        _HOT[tuple(keys)] = (time.monotonic(), parsed, db_path())
        if len(_HOT) > _HOT_MAX:
            del _HOT[min(_HOT, key=lambda b: _HOT[b][0])]
    _start_keeper()


def _refill_soon(keys: list[str], parsed: list) -> None:
    """Have the keeper fill this batch once, soon (it waits for the store, no viewer does)."""
    with _CACHE_LOCK:
        _SOON[tuple(keys)] = (parsed, db_path())
        if len(_SOON) > _HOT_MAX * 4:
            _SOON.pop(next(iter(_SOON)))
    _start_keeper()


def _start_keeper() -> None:
    with _CACHE_LOCK:
        if not _KEEPER:
            t = threading.Thread(target=_keeper, name="observatory-cache-keeper", daemon=True)
            t.start()
            _KEEPER.append(t)


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


def _keeper() -> None:
    """Refill each hot batch soon after the store changes (a commit), and when its oldest entry is three
    quarters of a TTL old; forever (a daemon). So a live run's answer is about one fill behind the
    ingester's last commit, and at most about one TTL old."""
    filled: dict[tuple[str, ...], tuple] = {}  # batch -> the store's stamp when last refilled here
    while not _STOP.wait(min(0.1, float(settings.get("cache_ttl_s")) / 4)):
        ttl = float(settings.get("cache_ttl_s"))
        now = time.monotonic()
        with _CACHE_LOCK:
            for b in [b for b, (t, _, _) in _HOT.items() if now - t > _HOT_FOR_S]:
                del _HOT[b]
            # the batch viewers asked for last first (in practice the Live panel's)
            hot = {
                b: (parsed, db, [_CACHE[k][0] if k in _CACHE else -math.inf for k in b])
                for b, (_, parsed, db) in sorted(_HOT.items(), key=lambda kv: -kv[1][0])
            }
        for b in [b for b in filled if b not in hot]:
            del filled[b]
        due: dict[str, list] = {}  # store -> its due batches, each (keys, calls, the store's stamp), in order
        for b, (parsed, db, times) in hot.items():
            age = now - min(times)
            stamp = _stamp(db)
            filled.setdefault(b, stamp)  # first seen: a viewer has just filled it
            if age >= 0.75 * ttl or (stamp != filled[b] and age >= _MIN_REFILL_S):
                due.setdefault(db, []).append((list(b), parsed, stamp))
        with _CACHE_LOCK:  # the batches viewers were shown a recent answer of while the store was written
            soon = dict(_SOON)
            _SOON.clear()
        for b, (parsed, db) in soon.items():
            if b in hot or len(_lookup(list(b), ttl)) == len(b):
                continue  # the keeper's own, or a viewer filled it meanwhile
            if store.writer_active(db):  # not yet: the keeper must not wait here (the hot batches are due)
                with _CACHE_LOCK:
                    _SOON.setdefault(b, (parsed, db))
                continue
            due.setdefault(db, []).append((list(b), parsed, _stamp(db)))
        for db, batches in due.items():  # each store's due batches on ONE connection
            if _STOP.is_set():
                return
            _refill(db, batches, filled)


def _refill(db: str, due: list[tuple[list[str], list, tuple]], filled: dict) -> None:
    """Fill the `due` batches of store `db` one after another on one connection (one wait for the
    store, one open), in the order given: the batch viewers asked for last first. A batch a viewer is
    filling is left to that viewer; one that fails is left to the next viewer's own fill."""
    locks = []
    try:
        for d in due:
            lock = _fill_lock(d[0])
            if lock.acquire(blocking=False):
                locks.append((lock, d))
        if not locks:
            return
        with store.connect(db) as con:
            limit_memory(con)
            for _, (keys, parsed, stamp) in locks:
                if _STOP.is_set():
                    return
                try:
                    _fill_on(con, keys, parsed)
                    filled[tuple(keys)] = (
                        stamp  # the stamp from before the fill: a commit during it is seen next
                    )
                except duckdb.IOException:
                    raise  # the connection itself failed: the rest of this round is left to the next one
                except Exception:  # this batch's own error, which the next viewer's own fill will show
                    pass
    except Exception:  # busy, or the store cannot be opened now: the next round tries again
        pass
    finally:
        for lock, _ in locks:
            lock.release()


def _put(key: str, value: Any) -> None:
    """Cache `value`; the least recently used entries go while the cache holds more than its bytes.
    A value larger than the whole budget is not kept (its viewer gets it, the next one queries)."""
    now = time.monotonic()
    n = size_of(value)
    budget = cache_budget()
    with _CACHE_LOCK:
        old = _CACHE.pop(key, None)
        if old is not None:
            _BYTES[0] -= old[2]
        if n <= budget:
            _CACHE[key] = (now, value, n)
            _BYTES[0] += n
        while _CACHE and (_BYTES[0] > budget or next(iter(_CACHE.values()))[0] < now - _KEEP_S):
            _BYTES[0] -= _CACHE.popitem(last=False)[1][2]


def cache_budget() -> int:
    """Bytes the query cache may hold (`dashboard_cache_mb`); the derived results as many again."""
    return int(settings.get("dashboard_cache_mb")) << 20


def cached_bytes() -> tuple[int, int]:
    """(bytes the query cache holds, bytes the derived results hold), as `size_of` counts them."""
    with _CACHE_LOCK:
        return _BYTES[0], _DERIVED_BYTES[0]


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


def query(fn: Callable, *args, ttl_s: float | None = None) -> Any:
    """`fn(con, *args)` on a read-only connection, cached for cache_ttl_s (or `ttl_s`) across sessions."""
    return query_all((fn, *args), ttl_s=ttl_s)[0]


# (fn, args by identity or value) -> (args, result, its bytes): the newest derived results, shared by
# every session; at most _DERIVED_MAX of them and `dashboard_cache_mb` of results
_DERIVED: OrderedDict[tuple, tuple[tuple, Any, int]] = OrderedDict()
_DERIVED_MAX = 128  # a Live view's version is ~10 entries (figures and their wire forms)
_DERIVED_BYTES = [0]
_BUILDING: dict[tuple, threading.Event] = {}  # keys being derived right now, set when done
_PLAIN = (str, int, float, bool, type(None))


def derive(fn: Callable, *args) -> Any:
    """`fn(*args)` once for all sessions while its arguments are the same objects; the result is shared.

    For pure functions of cached results, such as a page's figures built from a query's
    frames: twenty viewers of one live run then build its charts once per refresh, not
    twenty times (each build is many small frame operations, and under load their thread
    hand-offs cost more than the queries). Arguments match by identity (the objects
    `query_all` hands out) or, for numbers and strings, by value. Callers must not mutate
    the result.
    """
    key = (fn.__module__, fn.__qualname__, *(a if isinstance(a, _PLAIN) else ("id", id(a)) for a in args))
    with _CACHE_LOCK:
        hit = _DERIVED.get(key)
        if hit is not None:
            _DERIVED.move_to_end(key)
            return hit[1]
        building = _BUILDING.get(key)
        if building is None:
            _BUILDING[key] = threading.Event()
    if building is not None:  # another session is building it: wait for that one, not build it too
        building.wait(30)
        with _CACHE_LOCK:
            hit = _DERIVED.get(key)
        return hit[1] if hit is not None else fn(*args)
    try:
        value = fn(*args)
        n, budget = size_of(value), cache_budget()
        with _CACHE_LOCK:
            if n <= budget:
                _DERIVED[key] = (
                    args,
                    value,
                    n,
                )  # holding the args keeps their ids theirs while the entry lives
                _DERIVED_BYTES[0] += n
            while _DERIVED and (len(_DERIVED) > _DERIVED_MAX or _DERIVED_BYTES[0] > budget):
                _DERIVED_BYTES[0] -= _DERIVED.popitem(last=False)[1][2]
    finally:
        with _CACHE_LOCK:
            _BUILDING.pop(key).set()
    return value


def _jsonable(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"query argument {o!r} is not JSON-serialisable")
