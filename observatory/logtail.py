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
    """A resumed log's next attempt: one past the newest `phase` event's in its last MiB (1 when none is)."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            f.seek(max(0, size - (1 << 20)))
            data = f.read()
    except OSError:
        return 1
    for raw in reversed(data.split(b"\n")):
        if b'"phase"' not in raw:
            continue
        try:
            ev = json.loads(raw)
            if ev.get("kind") == "phase" and isinstance(ev["data"].get("attempt"), int):
                return ev["data"]["attempt"] + 1
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return 1
