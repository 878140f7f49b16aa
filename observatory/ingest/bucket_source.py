"""Read: a bucket runs dir's new chunks into a local mirror, which the rest of ingest reads as a runs dir.

A pass lists the bucket's journal (`<prefix>/_journal/`, one empty object per chunk, named by the writer's
clock) from `journal_margin_s` before the newest entry it saw, so an idle pass is one LIST whatever the
number of runs, and fetches only the chunks past each stream's cursor (concurrently). A finished run's
chunks are never listed nor fetched again. A first pass (no state) lists the whole journal: a catch-up.

The mirror of a store `<db>` is `<db>.bucket/<bucket tag>/runs/<run>/events.<host>.jsonl`, the chunks
appended in order; the cursor of each stream (`next chunk, mirror bytes`) is the file `state/<run>.<host>`
beside it, written after the bytes: a pass cut short is repaired by cutting the mirror file back to its
cursor. A chunk that is not whole lines of UTF-8 (half written, corrupt) is not appended: it goes to
`rejected_events` with its key and reason, and the stream goes on with the next chunk.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from observatory import bucket, store

__all__ = ["BucketSource"]

_STATE = "journal"


class BucketSource:
    """One bucket runs dir read into one store's mirror; `pull` is one pass."""

    def __init__(self, url: str, db: Path, margin_s: float):
        self.bucket = bucket.Bucket(url)
        self.url = self.bucket.url
        self.db = db
        self.mirror = bucket.mirror_of(self.url, db)
        self.state = self.mirror.parent / "state"
        self.mirror.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        self.margin_ms = int(margin_s * 1000)
        self.chunks = 0  # chunks read so far

    def _cursor(self, run: str, host: int) -> tuple[int, int]:
        try:
            n, end = (self.state / f"{run}.{host}").read_text().split()
            return int(n), int(end)
        except (OSError, ValueError):
            return 0, 0

    def _save(self, name: str, text: str) -> None:
        tmp = self.state / f".{name}.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.state / name)

    def pull(self, emit: Callable[[str], None]) -> int:
        """Fetch the new chunks into the mirror; return how many were read."""
        try:
            last = (self.state / _STATE).read_text().strip()
        except OSError:
            last = ""
        after = ""
        if last:
            ms = int(last.split("/", 1)[1][:13])
            after = f"{bucket.JOURNAL}/{max(0, ms - self.margin_ms):013d}"
        names = self.bucket.list_after(f"{bucket.JOURNAL}/", after)
        newest: dict[tuple[str, int], int] = {}
        for name in names:
            got = bucket.parse_journal(name.split("/", 1)[1])
            if got is not None:
                _, run, host, n = got
                newest[(run, host)] = max(n, newest.get((run, host), -1))
        wanted: dict[tuple[str, int], tuple[int, int, list[int]]] = {}
        for (run, host), top in newest.items():
            n, end = self._cursor(run, host)
            if top >= n:
                wanted[(run, host)] = (n, end, list(range(n, top + 1)))
        keys = [bucket.chunk_key(run, host, i) for (run, host), (_, _, ns) in wanted.items() for i in ns]
        got_all: dict[str, bytes | BaseException] = {}
        for i in range(0, len(keys), 1000):
            got_all.update(self.bucket.get_many(keys[i : i + 1000]))
        read = 0
        rejected: list[tuple] = []
        for (run, host), (n, end, ns) in wanted.items():
            path = self.mirror / run / f"events.{host}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as f:
                if f.tell() != end:
                    f.truncate(end)  # a pass cut short between the bytes and the cursor
                    f.seek(end)
                for i in ns:
                    key = bucket.chunk_key(run, host, i)
                    body = got_all.get(key)
                    if isinstance(body, BaseException) or body is None:
                        emit(
                            f"{self.bucket.key_url(key)}: cannot read ({type(body).__name__}); retrying next pass"
                        )
                        break
                    why = _bad(body)
                    if why:
                        shown = self.bucket.key_url(key)
                        emit(f"{shown}: chunk quarantined: {why}")
                        raw = bytes(body[:4096]).decode("utf-8", "replace")
                        rejected.append((shown, run, 0, "(chunk)", why, raw, time.time()))
                    else:
                        f.write(body)
                    n, end = i + 1, f.tell()
                    read += 1
                f.flush()
            if rejected:
                _quarantine(self.db, rejected)
                rejected = []
            self._save(f"{run}.{host}", f"{n} {end}\n")
        if names and names[-1] > last:
            self._save(_STATE, names[-1] + "\n")
        self.chunks += read
        return read


def _bad(body: bytes) -> str | None:
    """Why a chunk is not whole lines of UTF-8 (a writer uploads only those), or None."""
    if not body:
        return "empty chunk"
    if not body.endswith(b"\n"):
        return "half-written chunk: its last line has no newline"
    try:
        bytes(body).decode("utf-8")
    except UnicodeDecodeError as e:
        return f"corrupt chunk: not UTF-8 at byte {e.start}"
    return None


def _quarantine(db: Path, rows: list[tuple]) -> None:
    with store.write_connection(db) as con:
        store.ensure_schema(con)
        con.executemany("INSERT INTO rejected_events VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
