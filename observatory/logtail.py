"""The end of an event log, read back by a writer that appends to it: the last seq, a torn last line, the
newest restart attempt (a resumed process numbers its events and its attempt after the dead one's); and
`open_under`, the one way a log under a runs dir is opened (no symbolic link followed below the runs dir)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

__all__ = ["last_seq", "next_attempt", "open_under", "LinkRefused"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)


class LinkRefused(OSError):
    """A file or folder below a runs dir is a symbolic link (or not what it should be): not followed."""


def open_under(root, rel: str, flags: int, mode: int = 0o644) -> int:
    """A file descriptor of `root/rel`, opened without following a symbolic link anywhere below `root`.

    A log writer may link `events.0.jsonl`, or its whole run folder, to any file the observatory's user
    can read or write (its signing key, `alerts.yaml`, `/etc/passwd`): each part of `rel` is opened with
    `O_NOFOLLOW` relative to the folder before it (`openat`), so a link, a link swapped in after a scan
    included, is refused with `LinkRefused`. `root` itself (the runs dir the operator named) may be a link.
    Where the platform has no `O_NOFOLLOW` or `dir_fd`, each part is `lstat`ed first instead."""
    parts = str(rel).split("/")
    if "" in parts or "." in parts or ".." in parts:
        raise LinkRefused(errno.EINVAL, f"not a path below the runs dir: {rel!r}")
    if not (_NOFOLLOW and os.open in os.supports_dir_fd):  # pragma: no cover (Windows)
        import stat

        where = Path(root)
        for i, p in enumerate(parts):
            where = where / p
            try:
                st = os.lstat(where)
            except FileNotFoundError:
                if i == len(parts) - 1:
                    break
                raise
            if stat.S_ISLNK(st.st_mode):
                raise LinkRefused(errno.ELOOP, f"{where} is a symbolic link: not followed")
        return os.open(where, flags, mode)
    fd = None  # the first part is opened by its path (`root` may be a link; the part itself may not)
    try:
        for i, p in enumerate(parts):
            last = i == len(parts) - 1
            try:
                how = (flags if last else os.O_RDONLY | _DIRECTORY) | _NOFOLLOW
                nxt = (
                    os.open(os.path.join(root, p), how, mode)
                    if fd is None
                    else os.open(p, how, mode, dir_fd=fd)
                )
            except OSError as e:
                if e.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
                    where = "/".join(parts[: i + 1])
                    raise LinkRefused(
                        errno.ELOOP, f"{where} is a symbolic link (or not a folder): not followed"
                    ) from None
                raise
            if fd is not None:
                os.close(fd)
            fd = nxt
        return fd
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise


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
