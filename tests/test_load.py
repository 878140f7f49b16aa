"""Many viewers at once: the dashboard's shared cache, and a short run of `bench/bench_load.py`.

The cache tests check the two rules that let N viewers cost one query: a viewer
with a recent answer never queues behind another's fill, and figures derived
from a cached answer are built once for all sessions. The load test holds 5
viewers (Streamlit's own websocket protocol) on the Live, Experts and SQL pages
for 20 s while a trainer writes and `ingest --follow` runs, and asserts what holds
whatever the machine's load: no error reaches a viewer, every page is drawn, the Live
page refreshes itself, RSS stays bounded. The time figures (first chart against one
viewer, staleness) are the bench's: `python bench/bench_load.py`.
"""

from __future__ import annotations

import asyncio
import re
import sys
import threading
import time
from pathlib import Path

import pytest
from polling import holds_for, wait_until

from observatory.dashboard import cache

ROOT = Path(__file__).resolve().parents[1]

# every test here judges wall-clock behaviour (TTLs of tenths of a second, a view's first chart
# within its dwell): `make test` runs them in its quiet timing pass, not among the other tests
pytestmark = [pytest.mark.timing, pytest.mark.usefixtures("query_cache")]  # each test: a fresh server's cache


CALLS: list[float] = []
GATE = threading.Event()


def slow_answer(con, tag: str) -> str:
    """A query that waits for GATE (a fill in progress) and counts its runs."""
    CALLS.append(time.monotonic())
    GATE.wait(10)
    return f"answer {tag} #{len(CALLS)}"


def quick_answer(con, tag: str) -> str:
    return f"quick {tag} {time.monotonic()}"


def test_a_recent_answer_does_not_wait_for_a_fill(empty_store):
    CALLS.clear()
    GATE.set()
    first = cache.query(slow_answer, "a")
    assert cache.query(slow_answer, "a") == first and len(CALLS) == 1  # fresh: one query for both
    time.sleep(0.35)  # past due, but less than one TTL past: recent
    GATE.clear()
    filler = threading.Thread(target=cache.query, args=(slow_answer, "a"))
    filler.start()  # this viewer fills, and waits on the store
    wait_until(lambda: len(CALLS) >= 2, what="the fill started")
    t0 = time.monotonic()
    assert cache.query(slow_answer, "a") == first  # the others take the recent answer at once
    assert time.monotonic() - t0 < 0.2
    GATE.set()
    filler.join(10)
    assert cache.query(slow_answer, "a") != first  # the fill renewed it
    assert len(CALLS) == 2


def test_an_old_answer_waits_for_the_fill(empty_store):
    CALLS.clear()
    GATE.set()
    first = cache.query(slow_answer, "b")
    time.sleep(0.7)  # more than one TTL past due: too old to show while a fill runs
    GATE.clear()
    filler = threading.Thread(target=cache.query, args=(slow_answer, "b"))
    filler.start()
    wait_until(lambda: len(CALLS) >= 2, what="the fill started")
    got: list[str] = []
    waiter = threading.Thread(target=lambda: got.append(cache.query(slow_answer, "b")))
    waiter.start()
    holds_for(lambda: not got, 0.2, what="queued behind the fill")
    GATE.set()
    filler.join(10)
    waiter.join(10)
    assert got and got[0] != first and len(CALLS) == 2  # and then served by it: still one query


def test_a_recent_answer_is_shown_while_the_ingester_writes_and_refilled_after(empty_store):
    """A viewer whose batch has a recent answer (less than one TTL past due) does not wait for the
    write lock: it is shown that answer at once, and the keeper refills the batch once the writer is
    done. An older answer waits for the writer as before."""
    from observatory import store

    fresh = cache.query(quick_answer, "w")
    key = cache._key(quick_answer, ("w",), {})
    old = cache.query(quick_answer, "o")
    time.sleep(0.35)  # both past due (TTL 0.3 s), less than one TTL past: recent
    writer = store.write_connection(empty_store)
    try:
        assert store.writer_active(empty_store)
        t0 = time.monotonic()
        assert cache.query(quick_answer, "w") == fresh  # shown at once, not after the writer
        assert time.monotonic() - t0 < 0.1
        time.sleep(0.4)  # "o" is now more than one TTL past due: too old to show
        got: list[str] = []
        waiter = threading.Thread(target=lambda: got.append(cache.query(quick_answer, "o")))
        waiter.start()
        holds_for(lambda: not got, 0.3, what="it waits for the writer")
        assert cache.CACHE.entries[key][1] == fresh  # the keeper does not wait for the writer to refill it
    finally:
        writer.close()
    assert not store.writer_active(empty_store)
    waiter.join(10)
    assert got and got[0] != old
    # the keeper's refill, with nobody asking
    wait_until(
        lambda: cache.CACHE.entries[key][1] != fresh,
        3,
        what="the keeper refilled the batch once the writer was done",
    )


def test_a_slow_fill_serves_the_viewers_queued_behind_it(empty_store):
    """A fill slower than the TTL: the viewers that waited for it take its answer, they do not refill."""
    CALLS.clear()
    GATE.clear()
    batch = ((quick_answer, "q"), (slow_answer, "s"))  # the quick answer is past due when the slow one lands
    threads = [threading.Thread(target=cache.query_all, args=batch) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.5)  # > TTL 0.3 s: the one filling is slow
    GATE.set()
    for t in threads:
        t.join(10)
    assert len(CALLS) == 1


def test_a_slow_fill_holds_up_only_its_own_batch(empty_store):
    """Another page's (another batch's) first query does not queue behind a slow fill."""
    CALLS.clear()
    GATE.clear()
    filler = threading.Thread(target=cache.query, args=(slow_answer, "slow-page"))
    filler.start()
    wait_until(lambda: CALLS, what="the fill started")
    t0 = time.monotonic()
    assert cache.query(quick_answer, "other-page").startswith("quick other-page")
    assert time.monotonic() - t0 < 1.0  # not the 10 s the slow fill waits for its gate
    GATE.set()
    filler.join(10)


KEPT: list[float] = []


def kept_answer(con, tag: str) -> str:
    KEPT.append(time.monotonic())
    return f"kept {tag} #{len(KEPT)}"


def test_a_live_batch_is_kept_fresh_while_asked_for(empty_store, monkeypatch):
    """keep_fresh: refilled in the background just before it falls due, until nobody asks for it."""
    monkeypatch.setattr(cache, "_HOT_FOR_S", 1.0)
    KEPT.clear()
    first = cache.query_all((kept_answer, "live"), keep_fresh=True)[0]
    time.sleep(0.9)  # three TTLs, nobody asking: the keeper refilled it
    assert len(KEPT) >= 2
    t0 = time.monotonic()
    now = cache.query_all((kept_answer, "live"), keep_fresh=True)[0]
    assert now != first and time.monotonic() - t0 < 0.05  # a fresh answer, found, not filled
    time.sleep(1.5)  # past _HOT_FOR_S since the last ask: no longer refilled
    n = len(KEPT)
    time.sleep(0.6)
    assert len(KEPT) == n


def test_a_live_batch_is_refilled_when_the_store_changes(empty_store, monkeypatch):
    """The keeper refills a hot batch soon after a commit (the store's stamp changes), not only by age."""
    import os

    monkeypatch.setenv("OBSERVATORY_CACHE_TTL_S", "30")
    KEPT.clear()
    cache.query_all((kept_answer, "stamp"), keep_fresh=True)
    time.sleep(0.8)
    assert len(KEPT) == 1  # the store unchanged, the answer young: not refilled
    st = os.stat(empty_store)
    os.utime(empty_store, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # what a commit does to it
    wait_until(lambda: len(KEPT) >= 2, 3, what="a refill after the commit")
    assert len(KEPT) == 2


ON: list[tuple[str, object]] = []


def noted_answer(con, tag: str) -> str:
    ON.append((tag, con))  # the connection object itself: kept alive here, so `is` tells connections apart
    return f"noted {tag} #{len(ON)}"


def test_hot_batches_are_refilled_on_one_connection_last_asked_first(empty_store, monkeypatch):
    """After a commit the keeper refills every hot batch of the store on ONE connection (one wait for
    the writer, one open), the batch viewers asked for last first: a page kept fresh beside the Live
    panel does not make the panel's refill wait for a second connection."""
    import os

    monkeypatch.setenv("OBSERVATORY_CACHE_TTL_S", "30")  # no refill by age: only the commit's
    ON.clear()
    cache.query_all((noted_answer, "page"), keep_fresh=True)
    time.sleep(0.05)
    cache.query_all((noted_answer, "panel"), keep_fresh=True)  # asked last
    time.sleep(0.8)  # past _MIN_REFILL_S
    assert [t for t, _ in ON] == ["page", "panel"]  # the viewers' own fills, nothing else yet
    ON.clear()
    st = os.stat(empty_store)
    os.utime(empty_store, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # what a commit does to it
    wait_until(lambda: len(ON) >= 2, 3, what="both hot batches refilled after the commit")
    assert [t for t, _ in ON] == ["panel", "page"]
    assert ON[0][1] is ON[1][1], "both refills ran on the same connection"


def test_a_batch_with_its_own_lifetime_outlives_the_ttl(empty_store):
    """`ttl_s` (the SQL page's schema): the answer is served past `cache_ttl_s` without a fill."""
    slow_changing = cache.query(quick_answer, "schema", ttl_s=30)
    data = cache.query(quick_answer, "data")
    time.sleep(0.7)  # more than two TTLs (0.3 s)
    assert cache.query(quick_answer, "schema", ttl_s=30) == slow_changing
    assert cache.query(quick_answer, "data") != data


def test_a_batch_is_filled_whole(empty_store):
    """Entries of one batch age together: the next fill of the batch is one connection again."""
    CALLS.clear()
    GATE.set()
    cache.query_all((slow_answer, "c1"), (slow_answer, "c2"))
    cache.query(slow_answer, "c2")  # fresh
    time.sleep(0.35)
    cache.query(slow_answer, "c1")  # c1 alone renewed
    n = len(CALLS)
    time.sleep(0.1)  # c1 fresh, c2 past due
    cache.query_all((slow_answer, "c1"), (slow_answer, "c2"))
    assert len(CALLS) == n + 2


def test_derive_builds_once_per_cached_answer():
    built: list[int] = []

    def figure(frame, smoothing):
        built.append(1)
        return {"n": len(frame), "smoothing": smoothing}

    a, b = [1, 2, 3], [1, 2, 3]
    assert cache.derive(figure, a, 0.5) is cache.derive(figure, a, 0.5)
    assert len(built) == 1
    cache.derive(figure, b, 0.5)  # an equal but new answer (a new fill): built again
    cache.derive(figure, a, 0.0)  # another smoothing: built again
    assert len(built) == 3


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.subprocess
def test_five_viewers_for_20_s_while_training(tmp_path):
    """The bench itself, short: its figures' lines say what held (`Figures.lines` in bench/bench_load.py)."""
    import subprocess

    cmd = [sys.executable, str(ROOT / "bench" / "bench_load.py"), "--viewers", "5", "--duration", "20"]
    cmd += ["--single-views", "3", "--dwell", "5", "8", "--ramp", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=tmp_path)
    report = out.stdout + out.stderr
    print(report)
    assert out.returncode == 0, report
    assert "arriving over the first 2 s" in report, report
    assert "  errors: 0 " in report, report
    for page in ("live", "experts", "sql"):  # every page was viewed under load: a row of its views
        assert re.search(rf"^  {page} .*\(\d+ / [1-9]\d* views\)$", report, re.M), report
    refreshes = re.search(r"^  staleness \(s\): .*\((\d+) refreshes\)$", report, re.M)
    assert refreshes and int(refreshes[1]) > 0, report  # the Live page refreshed by itself
    # the time figures (first chart vs one viewer, staleness) are the bench's to judge:
    # `python bench/bench_load.py`; here, what must hold whatever the machine's load
    assert re.search(r"PASS  peak RSS < ", report), report


async def _sql_view(port: int, sql: str) -> tuple[list[str], list[str]]:
    """The SQL page opened over Streamlit's websocket protocol, then its form submitted as a browser does:
    (element types of the opening run, element types of the run the submit started)."""
    from load_viewer import rerun, session, sql_submit
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

    runs: list[list[str]] = [[]]
    ids: dict[str, str] = {}
    page_hash = ""
    async with session(port) as ws:
        await ws.send(rerun("sql", ""))
        while True:
            msg = ForwardMsg()
            msg.ParseFromString(await asyncio.wait_for(ws.recv(), 60))
            kind = msg.WhichOneof("type")
            if kind == "new_session":
                page_hash = msg.new_session.page_script_hash
            elif kind == "navigation":  # the SQL page's own script, which a rerun of it names
                page_hash = msg.navigation.page_script_hash or page_hash
            elif kind == "delta" and msg.delta.HasField("new_element"):
                el = msg.delta.new_element
                runs[-1].append(el.WhichOneof("type"))
                if el.WhichOneof("type") == "text_area":
                    ids["area"], ids["fragment"] = el.text_area.id, msg.delta.fragment_id
                elif el.WhichOneof("type") == "button" and el.button.is_form_submitter:
                    ids["button"] = el.button.id
            elif kind == "script_finished":
                if len(runs) == 2:
                    return runs[0], runs[1]
                assert "area" in ids and "button" in ids, runs
                runs.append([])
                await ws.send(sql_submit(page_hash, ids["area"], ids["button"], sql, ids["fragment"]))


@pytest.mark.browser  # a real Streamlit server (no chromium: its own protocol)
def test_running_a_query_reruns_the_console_alone(tmp_path):
    """The SQL console is a fragment: a submitted query redraws the console and its result, not the
    schema browser beside it (a table of columns per store table, sent again on every full run)."""
    import asyncio as _asyncio

    from browser_fixtures import dashboard
    from dashboard_fixtures import make_store

    _, db = make_store(tmp_path)
    with dashboard(db, tmp_path / "server.log") as url:
        opening, submitted = _asyncio.run(
            _sql_view(int(url.rsplit(":", 1)[1]), "SELECT run FROM runs ORDER BY run")
        )
    assert opening.count("dataframe") >= 10  # the schema browser: one per table
    assert submitted.count("dataframe") == 1, submitted  # the result, and nothing of the schema
    assert "text_area" in submitted  # the console itself was redrawn
