"""Alert delivery on its own thread: a channel that hangs never delays the follower, a full queue says so.

The receiver is a real HTTP server on 127.0.0.1 (apprise's json:// target) that holds every
request for 40 s, as a webhook whose far end has hung."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import event, write_lines
from polling import wait_until

from observatory import store
from observatory.alerts.delivery import Delivery
from observatory.alerts.rules import Channel
from observatory.pipeline import ingest

HANG_S = 40.0


class Hung(BaseHTTPRequestHandler):
    got: list = []
    release = threading.Event()

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append(time.monotonic())
        type(self).release.wait(HANG_S)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def hung():
    Hung.got, Hung.release = [], threading.Event()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Hung)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_port
    Hung.release.set()
    srv.shutdown()
    srv.server_close()


def _max_step(db, run: str):
    try:
        with store.connect(db, timeout_s=0.5) as con:
            return con.execute("SELECT max(step) FROM metrics WHERE run = ?", [run]).fetchall()[0][0]
    except Exception:
        return None


@pytest.mark.timing  # a step within 2 s of wall clock: judged in `make test`'s quiet timing pass
def test_a_hung_channel_never_delays_the_follower(runs_dir, db_path, hung, tmp_path, monkeypatch):
    """A stalled run opens an alert whose webhook hangs 40 s; meanwhile a live run's new step is in the
    store within 2 s (sent on the follower's thread, the pass waited for the channel's timeout first)."""
    rules = tmp_path / "alerts.yaml"
    rules.write_text(f"channels:\n  - url: json://127.0.0.1:{hung}/hook\n    name: hung-hook\n")
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(rules))
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "300")
    now = time.time()
    write_lines(
        runs_dir / "silent" / "events.0.jsonl",
        [event("silent", "run_start", {"config": {}}, 0, step=0, t=now - 1060)]
        + [event("silent", "metrics", {"train/loss": 3.0}, i, step=i, t=now - 1000) for i in (1, 2)],
    )
    live = runs_dir / "live" / "events.0.jsonl"
    write_lines(live, [event("live", "run_start", {"config": {}}, 0, step=0, t=now)])
    write_lines(live, [event("live", "metrics", {"train/loss": 3.0}, 1, step=1, t=now)])
    stop, said = threading.Event(), []
    follower = threading.Thread(
        target=ingest,
        args=(runs_dir, db_path),
        kwargs={"follow": True, "stop_event": stop, "emit": said.append},
    )
    follower.start()
    try:
        wait_until(lambda: Hung.got, 30.0, what=lambda: f"the alert never reached the receiver: {said}")
        wait_until(lambda: _max_step(db_path, "live") == 1, 10.0, what="step 1 in the store")
        for step in (2, 3):  # while the receiver holds the alert's request
            write_lines(live, [event("live", "metrics", {"train/loss": 3.0}, step, step=step, t=time.time())])
            t0 = time.monotonic()
            wait_until(
                lambda s=step: _max_step(db_path, "live") == s,
                2.0,
                what=f"step {step} in the store within 2 s while the channel hangs",
            )
            assert time.monotonic() - t0 <= 2.0
            assert not Hung.release.is_set() and time.monotonic() - Hung.got[0] < HANG_S
    finally:
        Hung.release.set()  # the hang ends: the follower's exit need not wait out the channel's timeout
        stop.set()
        follower.join(60)
    assert not follower.is_alive()


def test_a_full_queue_drops_the_message_and_says_so(hung):
    """One message hangs at the channel, one waits in a queue of one, the third is refused: said, counted,
    naming the channel and the message; the queue takes messages again once the channel answers."""
    said: list[str] = []
    d = Delivery(said.append, size=1, timeout_s=HANG_S + 5, retries=0)
    chans = [Channel(f"json://127.0.0.1:{hung}/hook", "hook", "info")]
    assert d.put(chans, "critical", "[CRITICAL] r1: stalled", "body") == ["hook"]
    wait_until(lambda: Hung.got, 10.0, what="the worker holds the first")
    assert d.put(chans, "critical", "[CRITICAL] r2: stalled", "body") == ["hook"]  # waits in the queue
    assert d.put(chans, "critical", "[CRITICAL] r3: stalled", "body") == []  # full
    assert d.dropped == 1
    assert [m for m in said if "delivery queue is full" in m and "hook" in m and "r3: stalled" in m]
    Hung.release.set()
    d.close(10.0)
    assert len(Hung.got) == 2 and d.failed == 0


def test_a_channel_that_times_out_is_tried_again_then_said(hung):
    """Each send waits at most its timeout; a failed one is retried once, then said, and the worker goes on."""
    said: list[str] = []
    d = Delivery(said.append, timeout_s=0.5, retries=1, retry_wait_s=0.1)
    chans = [Channel(f"json://127.0.0.1:{hung}/hook", "hook", "info")]
    t0 = time.monotonic()
    assert d.put(chans, "warn", "[WARN] r: slow", "body") == ["hook"]
    assert time.monotonic() - t0 < 0.5  # put returns at once
    wait_until(lambda: d.failed == 1, 20.0, what="the channel failed once")
    assert len(Hung.got) == 2  # the first try and one retry
    assert [m for m in said if "not delivered after 2 tries" in m]
    d.close(1.0)
