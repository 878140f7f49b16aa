"""Alert messages delivered on a thread of their own, behind a bounded queue.

The ingester (`observatory.pipeline.Analyses`) owns one `Delivery`. `put` queues a message for
the channels that take it and returns at once, so a slow or hung channel never delays a pass:
the worker sends each message to each of its channels in turn (`channels.send_one`: a
connect and a read timeout), once more after a failure (`RETRIES`, `RETRY_WAIT_S` apart),
then says what was not delivered. When `QUEUE_MAX` messages already wait (a channel hangs
while a storm of alerts opens), `put` drops the message and says so, naming it; the `alert`
event is written either way, so the store and the pages still show the alert.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

from observatory.alerts import channels
from observatory.alerts.rules import Channel

__all__ = ["Delivery", "QUEUE_MAX", "RETRIES"]

QUEUE_MAX = 256  # messages waiting for the worker; a full queue drops the newest and says so
RETRIES = 1  # sends again after a failed send, per channel and message
RETRY_WAIT_S = 1.0


class Delivery:
    """A bounded queue of alert messages and the one thread that sends them (started with the first)."""

    def __init__(
        self,
        emit: Callable[[str], None],
        *,
        size: int = QUEUE_MAX,
        timeout_s: float = channels.TIMEOUT_S,
        retries: int = RETRIES,
        retry_wait_s: float = RETRY_WAIT_S,
    ):
        self.emit = emit
        self.size, self.timeout_s, self.retries, self.retry_wait_s = size, timeout_s, retries, retry_wait_s
        self._queue: queue.Queue = queue.Queue(maxsize=size)
        self._thread: threading.Thread | None = None
        self.dropped = 0  # messages a full queue refused
        self.failed = 0  # (message, channel) sends that failed every try

    def put(
        self, chans: list[Channel], severity: str, title: str, body: str, mention: tuple[str, ...] = ()
    ) -> list[str]:
        """Queue the message for the channels that take `severity`; the names of those it is queued for
        (none when the queue is full: said, and counted in `dropped`). `mention`: the rule's mentions."""
        to = channels.takers(chans, severity)
        if not to:
            return []
        try:
            self._queue.put_nowait((to, severity, title, body, mention))
        except queue.Full:
            self.dropped += 1
            self.emit(
                f"observatory alerts: the delivery queue is full ({self.size} messages wait: a channel is slow "
                f"or hung); not sent to {', '.join(c.name for c in to)}: {title} "
                f"({self.dropped} dropped so far; the alert is stored and shown all the same)"
            )
            return []
        if self._thread is None:
            # a daemon: a channel that hangs past the end of the process must not keep it alive
            self._thread = threading.Thread(target=self._work, name="observatory-alerts", daemon=True)
            self._thread.start()
        return [c.name for c in to]

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                to, severity, title, body, mention = item
                for c in to:
                    self._send(c, severity, title, body, mention)
            finally:
                self._queue.task_done()

    def _send(self, c: Channel, severity: str, title: str, body: str, mention: tuple[str, ...]) -> None:
        for attempt in range(1 + self.retries):
            if attempt:
                time.sleep(self.retry_wait_s)
            try:
                if channels.send_one(c, severity, title, body, self.timeout_s, mention):
                    return
            except Exception as e:  # a plugin's own error: the worker goes on with the next message
                self.emit(f"observatory alerts: channel {c.name}: {type(e).__name__}: {e}")
        self.failed += 1
        self.emit(
            f"observatory alerts: channel {c.name}: not delivered after {1 + self.retries} tries: {title}"
        )

    def close(self, timeout_s: float | None = None) -> None:
        """Let the queued messages leave, waiting at most `timeout_s` (default: one timeout and retry per
        channel of one message) for them; what is still queued then is said and left behind."""
        if self._thread is None:
            return
        wait = (
            timeout_s
            if timeout_s is not None
            else (2 * self.timeout_s + self.retry_wait_s) * (1 + self.retries)
        )
        try:
            self._queue.put(None, timeout=wait)
        except queue.Full:
            pass
        self._thread.join(wait)
        if self._thread.is_alive():
            left = self._queue.qsize()
            self.emit(
                f"observatory alerts: {left} alert message(s) not sent yet at exit (a channel is slow or hung)"
            )
        self._thread = None
