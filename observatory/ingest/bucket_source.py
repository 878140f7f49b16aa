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

Another observatory's findings stream (`_findings/<run>/events.1000.<origin>/`) is mirrored the same way
into `found/<origin>/<run>/events.1000.jsonl` (cursor `state/found-<origin>/<run>`), which ingest reads
as a findings folder (`observatory.findings.roots`); this machine's own stream is not fetched: its
findings folder has it. `analyst` says whether this store runs the analyses (the bucket's `_analyst`).

Packs: the analyst's follower (`pack`) writes every `PACK_CHUNKS` settled journal entries' chunks as one
object `_packs/<the last entry's name>`, so a new mirror (a new replica, a rebuilt store) catches up
with one GET per pack instead of one per chunk, then lists the journal from the last pack's key.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from observatory import bucket, findings, store
from observatory.events import OBSERVATORY_HOST
from observatory.ingest.model import RAW_CAP
from observatory.redact import scrub_text

__all__ = ["BucketSource"]

_STATE = "journal"
_BATCH = 256  # chunks fetched at once (concurrently)
_PER_PASS = 16 * _BATCH
PACK_CHUNKS = 1000  # chunks a pack holds
_PACKS_AT_ONCE = 4  # packs fetched at once by a catch-up


class BucketSource:
    """One bucket runs dir read into one store's mirror; `pull` is one pass."""

    def __init__(self, url: str, db: Path, margin_s: float):
        self.bucket = bucket.Bucket(url)
        self.url = self.bucket.url
        self.db = db
        self.mirror = bucket.mirror_of(self.url, db)
        self.state = self.mirror.parent / "state"
        self.found = self.mirror.parent / "found"
        self.mirror.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        url = self.mirror.parent / "url"  # `bucket.url_of` the mirror: where findings written there go
        if not url.exists():
            url.write_text(self.url + "\n")
        self.origin = findings.origin(findings.root(self.url))
        self.margin_ms = int(margin_s * 1000)
        self.chunks = 0  # chunks read so far
        self._packed: str | None = None  # the journal key of the last pack (`pack`), once listed

    def analyst(self, want: str, emit: Callable[[str], None]) -> bool:
        """Whether this store runs the analyses (`bucket_analyst`): "yes" takes the role (writes this
        origin into `_findings/_analyst`), "no" never; "auto" takes it when no observatory has it yet."""
        if want not in ("auto", "yes", "no"):
            raise ValueError(f"OBSERVATORY_BUCKET_ANALYST={want!r}: must be auto, yes or no")
        if want == "no":
            return False
        if want == "yes":
            self.bucket.put(bucket.ANALYST, self.origin.encode())
            return True
        if self.bucket.put_new(bucket.ANALYST, self.origin.encode()):
            return True
        holder = (self.bucket.get(bucket.ANALYST) or b"").decode("utf-8", "replace").strip()
        if holder != self.origin:
            emit(
                f"observatory ingest: {self.url}: a replica; observatory {holder[:16]} runs the analyses and "
                "this store reads its findings (OBSERVATORY_BUCKET_ANALYST=yes takes the role over)"
            )
        return holder == self.origin

    def _name(self, run: str, host: int | str) -> str:
        """A stream's cursor file under `state/`."""
        if isinstance(host, str):
            return f"found-{host.split('.', 1)[1]}/{run}"
        return f"{run}.{host}"

    def _file(self, run: str, host: int | str) -> Path:
        """A stream's mirror file."""
        if isinstance(host, str):
            return self.found / host.split(".", 1)[1] / run / findings.NAME
        return self.mirror / run / f"events.{host}.jsonl"

    def _cursor(self, run: str, host: int | str) -> tuple[int, int]:
        try:
            n, end = (self.state / self._name(run, host)).read_text().split()
            return int(n), int(end)
        except (OSError, ValueError):
            return 0, 0

    def _save(self, name: str, text: str) -> None:
        target = self.state / name
        target.parent.mkdir(exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp")
        tmp.write_text(text)
        os.replace(tmp, target)

    def pull(self, emit: Callable[[str], None]) -> int:
        """Fetch the new chunks into the mirror (a new mirror first from the bucket's packs); return how
        many were read."""
        last = self._last()
        read = 0
        if not last:
            read += self._from_packs(emit)
            last = self._last()
        after = ""
        if last:
            ms = int(last.split("/", 1)[1][:13])
            after = f"{bucket.JOURNAL}/{max(0, ms - self.margin_ms):013d}"
        names = self.bucket.list_after(f"{bucket.JOURNAL}/", after)
        newest: dict[tuple[str, int | str], int] = {}
        for name in names:
            got = bucket.parse_journal(name.split("/", 1)[1])
            if got is not None:
                _, run, host, n = got
                newest[(run, host)] = max(n, newest.get((run, host), -1))
        more, again = self._fetch(newest, {}, emit)
        read += more
        if names and names[-1] > last and not again:
            self._save(_STATE, names[-1] + "\n")
        self.chunks += read
        return read

    def send(self, emit: Callable[[str], None]) -> None:
        """This machine's findings that wait to go to the bucket (`findings.resend`), on this client."""
        left = findings.resend(self.url, self.bucket)
        if left:
            emit(f"observatory ingest: {self.url}: findings of {left} runs not sent yet; retrying next pass")

    def _last(self) -> str:
        """The newest journal key this mirror has read through ("" for a new mirror)."""
        try:
            return (self.state / _STATE).read_text().strip()
        except OSError:
            return ""

    def _from_packs(self, emit: Callable[[str], None]) -> int:
        """A new mirror's catch-up: the bucket's packs in order (one GET each for up to `PACK_CHUNKS`
        chunks), the journal's state saved after each; stops at one that cannot be read (the journal,
        listed from there, has the rest)."""
        packs = self.bucket.list_after(f"{bucket.PACKS}/")
        read = 0
        for a in range(0, len(packs), _PACKS_AT_ONCE):
            got = self.bucket.get_many(packs[a : a + _PACKS_AT_ONCE])
            for key in packs[a : a + _PACKS_AT_ONCE]:
                try:
                    if isinstance(got[key], BaseException):
                        raise got[key]
                    items = bucket.unpack(bytes(got[key]))
                except Exception as e:
                    emit(
                        f"{self.bucket.key_url(key)}: cannot read this pack ({type(e).__name__}); reading the journal"
                    )
                    return read
                newest: dict[tuple[str, int | str], int] = {}
                for run, host, n, _ in items:
                    newest[(run, host)] = max(n, newest.get((run, host), -1))
                pre = {bucket.chunk_key(run, host, n): body for run, host, n, body in items}
                more, again = self._fetch(newest, pre, emit)
                read += more
                if again:
                    return read
                self._save(_STATE, f"{bucket.JOURNAL}/{key.split('/', 1)[1]}\n")
        return read

    def _fetch(self, newest: dict, pre: dict, emit: Callable[[str], None]) -> tuple[int, bool]:
        """Each stream from its cursor to `newest[stream]`, the chunks not in `pre` fetched; (chunks read,
        whether the journal must be listed from the same key again)."""
        mine = (
            f"{OBSERVATORY_HOST}.{self.origin}"  # this machine's own findings: its findings folder has them
        )
        # each stream from its cursor to the newest chunk announced, fetched _BATCH chunks at a time (memory
        # stays bounded; a stream stops at its first chunk that cannot be read: retried on the next pass)
        # at most _PER_PASS chunks of a stream a pass: the journal is then listed from the same key again
        cursors: dict[tuple[str, int | str], list] = {}
        windows: list[tuple[tuple[str, int | str], range]] = []
        again = False
        for stream, top in newest.items():
            if stream[1] == mine:
                continue
            n, end = self._cursor(*stream)
            cursors[stream] = [n, end, False]
            if top >= n + _PER_PASS:
                top, again = n + _PER_PASS - 1, True
            windows += [(stream, range(a, min(a + _BATCH, top + 1))) for a in range(n, top + 1, _BATCH)]
        read = 0
        group: list[tuple[tuple[str, int | str], range]] = []
        for k, window in enumerate(windows):
            group.append(window)
            if k + 1 < len(windows) and sum(len(w) for _, w in group) < _BATCH:
                continue
            keys = [bucket.chunk_key(*stream, i) for stream, w in group for i in w if not cursors[stream][2]]
            got = self.bucket.get_many([k for k in keys if k not in pre])
            got.update((k, pre[k]) for k in keys if k in pre)
            for stream, w in group:
                read += self._append(stream, w, got, cursors[stream], emit)
            group = []
        return read, again or any(c[2] == "retry" for c in cursors.values())

    def pack(self, emit: Callable[[str], None], chunks: int | None = None) -> int:
        """The analyst's part: the next `chunks` journal entries after the last pack, once all are older
        than this mirror's newest entry by `journal_margin_s`, fetched and written as one pack (create-only:
        a second packer of the same entries makes the same key); fewer when their bytes reach
        `bucket.PACK_BYTES`. Returns how many chunks it packed."""
        chunks = chunks or PACK_CHUNKS
        if self._packed is None:
            packs = self.bucket.list_after(f"{bucket.PACKS}/")
            self._packed = f"{bucket.JOURNAL}/{packs[-1].split('/', 1)[1]}" if packs else ""
        last = self._last()
        if not last:
            return 0
        cutoff = _ms(last) - self.margin_ms
        names = self.bucket.list_after(f"{bucket.JOURNAL}/", self._packed, limit=chunks)
        names = [n for n in names if _ms(n) < cutoff]
        if len(names) < chunks:
            return 0
        # fetched _BATCH at a time, and no more once the pack holds PACK_BYTES: a huge run's big chunks make
        # a pack of fewer entries (the pack is named by its last entry), so memory stays bounded
        items: list[tuple[str, int | str, int, bytes]] = []
        size, end, seen = 0, "", set()
        for a in range(0, len(names), _BATCH):
            part = {n: bucket.parse_journal(n.split("/", 1)[1]) for n in names[a : a + _BATCH]}
            keys = {n: bucket.chunk_key(*p[1:]) for n, p in part.items() if p}
            # a chunk announced twice (a journal put retried) is packed once
            keys = {n: k for n, k in keys.items() if k not in seen and not seen.add(k)}
            got = self.bucket.get_many(list(keys.values()))
            for name in part:
                key = keys.get(name)
                if key is not None:
                    if isinstance(got[key], BaseException):
                        emit(
                            f"{self.bucket.key_url(key)}: cannot read ({type(got[key]).__name__}); not packed yet"
                        )
                        return 0
                    items.append((*part[name][1:], bytes(got[key])))
                    size += len(items[-1][-1])
                end = name
                if size >= bucket.PACK_BYTES:
                    break
            if size >= bucket.PACK_BYTES:
                break
        self.bucket.put_new(f"{bucket.PACKS}/{end.split('/', 1)[1]}", bucket.pack(items))
        self._packed = end
        return len(items)

    def _append(self, stream: tuple[str, int], window: range, got: dict, cur: list, emit) -> int:
        """Append a window of a stream's chunks to its mirror file, then save its cursor; chunks read."""
        run, host = stream
        n, end, stopped = cur
        if stopped:
            return 0
        path = self._file(run, host)
        path.parent.mkdir(parents=True, exist_ok=True)
        rejected, read = [], 0
        with open(path, "ab") as f:
            if f.tell() != end:
                f.truncate(end)  # a pass cut short between the bytes and the cursor
                f.seek(end)
            for i in window:
                key = bucket.chunk_key(run, host, i)
                body = got.get(key)
                if not isinstance(body, (bytes, bytearray, memoryview)):
                    # not there (announced too early, or by someone else): the stream waits for its next
                    # announcement; any other failure (the network): this pass's journal is listed again
                    emit(f"{self.bucket.key_url(key)}: cannot read ({type(body).__name__}); retrying later")
                    cur[2] = True if isinstance(body, FileNotFoundError) else "retry"
                    break
                why = _bad(body)
                if why:
                    shown = self.bucket.key_url(key)
                    emit(f"{shown}: chunk quarantined: {why}")
                    raw = scrub_text(bytes(body[:RAW_CAP]).decode("utf-8", "replace"))[0]  # public text
                    rejected.append((shown, run, 0, "(chunk)", why, raw, time.time()))
                else:
                    f.write(body)
                n, end = i + 1, f.tell()
                read += 1
        if rejected:
            _quarantine(self.db, rejected)
        if read:
            cur[0], cur[1] = n, end
            self._save(self._name(run, host), f"{n} {end}\n")
        return read


def _ms(key: str) -> float:
    """The writer's clock (Unix ms) a journal key begins with; inf for a key that does not."""
    head = key.split("/", 1)[1][:13]
    return int(head) if head.isdigit() else float("inf")


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
