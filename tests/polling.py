"""Waiting in tests without guessing how long: poll a condition until it holds, or fail at a deadline.

A fixed `time.sleep(0.3)` either wastes time (the thing happened at once) or misses under load (it took
longer). `wait_until` returns as soon as the condition holds and fails, saying what it waited for, only
after a deadline generous enough for a loaded CI machine. `holds_for` is the other side: a condition that
must stay true (a reader kept out while a writer holds the store) for a while.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

# generous: a test that waits for something that happens in milliseconds on a quiet machine can take
# seconds on a loaded CI one; a deadline only bounds how long a real failure takes to report
TIMEOUT_S = 30.0


def wait_until(
    pred: Callable[[], T], timeout: float = TIMEOUT_S, every: float = 0.01, what: str | Callable[[], str] = ""
) -> T:
    """`pred()`'s first truthy value, polled every `every` s; AssertionError after `timeout` s, saying
    `what` (or what `what()` says then: the state that did not come)."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"not within {timeout:g} s: {said or getattr(pred, '__name__', pred)}")
        time.sleep(every)


def holds_for(pred: Callable[[], object], seconds: float, every: float = 0.01, what: str = "") -> None:
    """`pred()` stays truthy for `seconds`; AssertionError the first time it is not."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        assert pred(), f"stopped holding: {what or getattr(pred, '__name__', pred)}"
        time.sleep(every)
