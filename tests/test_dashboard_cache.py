"""The dashboard's shared cache is bounded by bytes: a visitor's distinct queries cannot grow the server.

Every distinct query a visitor can cause (a run id that exists, a metric name, a page of a
table) is an entry of `observatory.dashboard.cache`. It used to be bounded by age only
(entries younger than 10 minutes were all kept), so 200 distinct answers of 0.8 MB took the
server +160 MB for ten minutes. Now the least recently used entries go once the cache holds
`dashboard_cache_mb`.
"""

from __future__ import annotations

import gc

import polars as pl
import psutil
import pytest

from observatory.dashboard import cache

ROWS = 100_000  # 800 KB of int64 per answer


def big_answer(con, i: int, rows: int = ROWS) -> pl.DataFrame:
    """A distinct answer of `rows` int64 per `i`, as a visitor's distinct deep link would make."""
    return pl.from_arrow(con.sql(f"SELECT range + {int(i)} AS x FROM range({int(rows)})").to_arrow_table())


def held_bytes() -> int:
    """What the cache holds of `big_answer`'s frames, counted from its entries (whatever else it counts)."""
    return sum(
        v[1].estimated_size() for v in list(cache.CACHE.entries.values()) if isinstance(v[1], pl.DataFrame)
    )


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_many_distinct_queries_keep_the_cache_and_the_server_under_the_bound(
    empty_store, query_cache, monkeypatch
):
    monkeypatch.setenv("OBSERVATORY_DASHBOARD_CACHE_MB", "4")
    gc.collect()
    rss0 = psutil.Process().memory_info().rss
    for i in range(200):  # 160 MB of answers in all
        assert cache.query(big_answer, i).height == ROWS
    assert held_bytes() <= 4 << 20
    assert cache.cached_bytes()[0] <= 4 << 20
    gc.collect()
    grown_mb = (psutil.Process().memory_info().rss - rss0) / 2**20
    assert grown_mb < 80, f"the server grew {grown_mb:.0f} MB for a cache of 4 MB"
    # the least recently used go first: the newest answers are still hits (the same object)
    assert cache.query(big_answer, 199) is cache.query(big_answer, 199)


def test_an_answer_larger_than_the_cache_is_served_not_kept(empty_store, query_cache, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_DASHBOARD_CACHE_MB", "1")
    small = cache.query(big_answer, 1)  # 0.8 MB: kept
    assert cache.cached_bytes()[0] == cache.size_of(small) and cache.query(big_answer, 1) is small
    big = cache.query(big_answer, 2, 2 * ROWS)  # 1.6 MB: its viewer gets it, the cache keeps it not
    assert big.height == 2 * ROWS and cache.query(big_answer, 2, 2 * ROWS) is not big
    assert cache.query(big_answer, 1) is small  # and it did not push the small one out


def test_derived_results_are_bounded_by_bytes_too(query_cache, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_DASHBOARD_CACHE_MB", "2")
    for i in range(40):  # 40 distinct 0.8 MB figures' worth of derived results
        cache.derive(_frame_of, i)
    assert cache.cached_bytes()[1] <= 2 << 20
    assert sum(1 for k in query_cache.derived if k[1] == "_frame_of") <= 3


def _frame_of(i: int) -> pl.DataFrame:
    return pl.DataFrame({"x": pl.int_range(0, ROWS, eager=True) + i})
