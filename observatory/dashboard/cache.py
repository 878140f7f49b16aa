"""The dashboard's query cache: store queries on one read-only connection per batch, shared by all sessions.

`query(fn, *args)` / `query_all((fn, *args), ...)` run `observatory.queries`
functions on ONE fresh read-only connection per batch (`observatory.store.connect`,
which waits out a busy store) and cache each result for `cache_ttl_s` seconds
across ALL sessions, one fill at a time, so a hundred viewers of a live run cost
one round of queries every couple of seconds. If the store stays busy past the
retry budget, the page shows the last good result (or a calm "store busy" note);
a lock error never reaches the page.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import duckdb
import numpy as np

from observatory import settings, store

__all__ = ["StoreBusy", "db_path", "query", "query_all"]


class StoreBusy(RuntimeError):
    """The store stayed locked past the retry budget and no earlier result exists."""


def db_path() -> str:
    return str(settings.get("db"))


# key -> (monotonic time it goes stale, value). Shared by every session of this server process;
# stale entries stay as the last good answer for when the store is busy.
_CACHE: dict[str, tuple[float, Any]] = {}
_CACHE_LOCK = threading.Lock()
# One fill at a time per process: concurrent viewers that miss together wait for the first
# one's connection and then find its results cached (N viewers, one query).
_FILL_LOCK = threading.Lock()
_KEEP_S = 600.0  # how long a stale entry may serve as the "last good" answer


def _key(fn: Callable, args: tuple, kwargs: dict) -> str:
    name = f"{fn.__module__}:{fn.__qualname__}"
    return f"{db_path()}|{name}|{json.dumps([list(args), kwargs], sort_keys=True, default=_jsonable)}"


def _lookup(keys: list[str], now: float) -> dict[int, Any]:
    with _CACHE_LOCK:
        return {i: _CACHE[k][1] for i, k in enumerate(keys) if k in _CACHE and _CACHE[k][0] > now}


def query_all(*calls) -> list[Any]:
    """Several queries as one unit of work: cache hits are free, all misses share ONE connection.

    Each call is a tuple `(fn, arg1, arg2, ...)`; fn(con, *args) must be a module-level
    function and the args JSON-serialisable (they form the cache key). Results are cached
    for `cache_ttl_s` across all sessions. Opening the store costs more than most of these
    queries, hence the batching.
    """
    parsed = [(c[0], tuple(c[1:])) for c in calls]
    keys = [_key(fn, args, {}) for fn, args in parsed]
    out = _lookup(keys, time.monotonic())
    if len(out) < len(keys):
        with _FILL_LOCK:
            out.update(_lookup(keys, time.monotonic()))  # filled while we waited?
            missing = [i for i in range(len(keys)) if i not in out]
            if missing:
                try:
                    with store.connect(db_path()) as con:
                        for i in missing:
                            fn, args = parsed[i]
                            out[i] = fn(con, *args)
                            _put(keys[i], out[i])
                except (duckdb.IOException, store.StoreBusy) as e:  # busy past the retry budget
                    if isinstance(e, duckdb.IOException) and "lock" not in str(e).lower():
                        raise
                    with _CACHE_LOCK:
                        stale = {i: _CACHE[keys[i]][1] for i in missing if keys[i] in _CACHE}
                    if len(stale) < len(missing):
                        raise StoreBusy(
                            "the store is being written right now; this view refreshes by itself"
                        ) from None
                    out.update(stale)
    return [out[i] for i in range(len(keys))]


def _put(key: str, value: Any) -> None:
    now = time.monotonic()
    with _CACHE_LOCK:
        _CACHE[key] = (now + float(settings.get("cache_ttl_s")), value)
        if len(_CACHE) > 4096:
            for k in [k for k, (t, _) in _CACHE.items() if t < now - _KEEP_S]:
                del _CACHE[k]


def query(fn: Callable, *args) -> Any:
    """`fn(con, *args)` on a read-only connection, cached for cache_ttl_s across sessions."""
    return query_all((fn, *args))[0]


def _jsonable(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"query argument {o!r} is not JSON-serialisable")
