"""The end of an event log, read back by a writer that appends to it: the last seq, a torn last line, the
newest restart attempt (a resumed process numbers its events and its attempt after the dead one's)."""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["last_seq", "next_attempt"]


def last_seq(path: Path, size: int) -> tuple[int | None, bool]:
    """(seq of the last readable event, whether the last line is torn) in the first `size` bytes of a log."""
    if size <= 0:
        return None, False
    torn = False
    try:
        with open(path, "rb") as f:
            for span in (64 << 10, 1 << 20):  # the last line is short; look further back only if it is not
                start = max(0, size - span)
                f.seek(start)
                data = f.read(size - start)
                torn = not data.endswith(b"\n")
                lines = data.split(b"\n")
                for raw in reversed(lines[1:] if start else lines):  # lines[0] may start mid-line
                    try:
                        return int(json.loads(raw)["seq"]), torn
                    except (ValueError, KeyError, TypeError):
                        continue
                if start == 0:
                    break
    except FileNotFoundError:
        pass
    return None, torn


def next_attempt(path: Path) -> int:
    """A resumed log's next attempt: one past the newest `phase` event's (1 when the log has none).

    Read backwards a MiB at a time, so a resume costs one read of the tail in a log that says its phase at
    each eval and checkpoint, and the newest phase is found however many steps were logged since."""
    chunk = 1 << 20
    try:
        with open(path, "rb") as f:
            end = f.seek(0, 2)
            carry = b""  # the first, partial line of the chunk after this one
            while end > 0:
                start = max(0, end - chunk)
                f.seek(start)
                data = f.read(end - start) + carry
                lines = data.split(b"\n")
                carry = lines[0] if start else b""
                for raw in reversed(lines[1:] if start else lines):
                    found = _attempt_of(raw)
                    if found is not None:
                        return found + 1
                end = start
    except OSError:
        pass
    return 1


def _attempt_of(raw: bytes) -> int | None:
    if b'"phase"' not in raw:
        return None
    try:
        ev = json.loads(raw)
        if ev.get("kind") == "phase" and isinstance(ev["data"].get("attempt"), int):
            return ev["data"]["attempt"]
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return None
