"""A runs dir in object storage: `s3://bucket/prefix` or `gs://bucket/prefix`.

Objects cannot be appended, so a (run, host) stream is a sequence of immutable chunk objects, each
created with a must-not-exist precondition, and each announced by a tiny journal object whose key
starts with the writer's clock, so a reader finds new chunks with one LIST from where it stopped:

    <prefix>/<run>/events.<host>/<n:010d>.jsonl          chunk n: whole lines, spool bytes [a, b)
    <prefix>/_journal/<ms:013d>-<run>-<host>-<n:010d>    empty; written after chunk n
    <prefix>/_findings/<run>/events.1000.<origin>/<n:010d>.jsonl    an observatory's findings of the run
    <prefix>/_journal/<ms:013d>-<run>-1000.<origin>-<n:010d>        ... announced in the same journal
    <prefix>/_findings/_analyst                          the origin of the observatory that runs the analyses
    <prefix>/_packs/<ms>-<run>-<host>-<n>                the chunks announced from the last pack's journal key
                                                         to this one, in one object (`pack`): a catch-up's GETs

`<origin>` (6 hex) names the observatory that wrote a findings stream: each numbers its findings of a run
from `seq_base(origin)`, so two observatories never write the same key nor the same (run, 1000, seq).

- `location`/`is_url`/`safe`: parse a runs dir (a URL stays a string; a local path a `Path`), and the
  form of a URL that may be printed (no user, password or query: credentials come from the cloud's
  standard environment and files, never from the URL);
- `Bucket`: the few requests we make (create-only put, get, list after a key), counted;
- `Uploader`: a writer's spool file (a local event log) rolled into chunks on its own thread.

One library for both clouds: fsspec's s3fs and gcsfs (docs/scaling.md says why). s3fs reads
`AWS_ENDPOINT_URL`, gcsfs `STORAGE_EMULATOR_HOST`, so the same code talks to the emulators.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from observatory.events import RUN_ID_RE

__all__ = [
    "SCHEMES",
    "is_url",
    "location",
    "safe",
    "tag",
    "Bucket",
    "Uploader",
    "upload_runs",
    "staged",
    "chunk_key",
    "mirror_of",
    "findings_tag",
    "journal_key",
    "parse_journal",
    "FINDINGS",
    "ANALYST",
    "seq_base",
    "url_of",
    "send_spool",
    "PACKS",
    "pack",
    "unpack",
]

SCHEMES = ("s3", "gs", "gcs")
_URL_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
JOURNAL = "_journal"
FINDINGS = "_findings"
ANALYST = f"{FINDINGS}/_analyst"
PACKS = "_packs"
ORIGIN_RE = re.compile(r"^[0-9a-f]{6}$")
_FOUND_RE = re.compile(r"^1000\.[0-9a-f]{6}$")  # a findings stream's host: 1000.<origin>
_JOURNAL_RE = re.compile(r"^(\d{13})-([A-Za-z0-9._-]{1,128})-(\d+|1000\.[0-9a-f]{6})-(\d{10})$")


def is_url(where: Any) -> bool:
    """True for `scheme://...` (a bucket, or a scheme we refuse); False for a local path."""
    return isinstance(where, str) and bool(_URL_RE.match(where))


def safe(url: str) -> str:
    """The URL without user, password, query or fragment: the form we print, log and show."""
    m = _URL_RE.match(url)
    if not m:
        return url
    rest = url[m.end() :].split("?", 1)[0].split("#", 1)[0]
    host, _, path = rest.partition("/")
    host = host.rpartition("@")[2]
    return f"{m.group(1).lower()}://{host}" + (f"/{path}" if path else "")


def location(where: Any) -> str | Path:
    """A runs dir as given: a bucket URL (checked, normalised: `gcs://` is `gs://`, no trailing slash) or a
    local `Path`. Raises ValueError for a scheme we do not speak or a URL carrying a credential."""
    if isinstance(where, Path) or not is_url(str(where)):
        return Path(where)
    url = str(where)
    scheme = _URL_RE.match(url).group(1).lower()
    shown = safe(url)
    if scheme not in SCHEMES:
        raise ValueError(
            f"{shown}: runs dir must be a local folder, s3://bucket/prefix or gs://bucket/prefix"
        )
    rest = url[len(scheme) + 3 :]
    if "@" in rest.split("/", 1)[0] or "?" in rest or "#" in rest:
        raise ValueError(
            f"{shown}: a runs dir URL must not carry a user, password or query; credentials come from the "
            "cloud's environment (AWS_* variables, ~/.aws, GOOGLE_APPLICATION_CREDENTIALS, gcloud)"
        )
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"{shown}: no bucket name")
    prefix = prefix.strip("/")
    return f"{'gs' if scheme == 'gcs' else scheme}://{bucket}" + (f"/{prefix}" if prefix else "")


def tag(url: str) -> str:
    """A folder name for a bucket's local files (a writer's spool, a reader's mirror): readable and unique."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", url.split("://", 1)[1]).strip("-")[:60]
    return f"{name}-{hashlib.sha256(url.encode()).hexdigest()[:8]}"


def mirror_of(url: str, db: Path) -> Path:
    """The local runs dir into which a store `db` reads bucket `url` (`observatory.ingest.bucket_source`)."""
    return Path(f"{db}.bucket") / tag(url) / "runs"


def findings_tag(runs_dir: Any) -> str | None:
    """For a bucket runs dir (its URL, or a store's mirror of it), the name of its findings folder (the
    bucket's tag: every store on this machine reads and writes the same one); None for a local runs dir."""
    if is_url(str(runs_dir)):
        return tag(location(str(runs_dir)))
    p = Path(runs_dir)
    if p.name == "runs" and p.parent.parent.name.endswith(".bucket"):
        return p.parent.name
    return None


def url_of(runs_dir: Any) -> str | None:
    """The bucket URL of a runs dir: itself, or the bucket a store's mirror (`mirror_of`) reads; else None."""
    if is_url(str(runs_dir)):
        return location(str(runs_dir))
    if findings_tag(runs_dir) is None:
        return None
    try:
        return location((Path(runs_dir).parent / "url").read_text().strip())
    except (OSError, ValueError):
        return None


def seq_base(origin: str) -> int:
    """The first seq of an observatory's findings of a run in a bucket: its origin's own range of 2^32."""
    return int(origin, 16) << 32


def chunk_key(run: str, host: int | str, n: int) -> str:
    """A host's chunk n; for a findings stream (`host` "1000.<origin>"), under `_findings/`."""
    if isinstance(host, str):
        return f"{FINDINGS}/{run}/events.{host}/{n:010d}.jsonl"
    return f"{run}/events.{host}/{n:010d}.jsonl"


def journal_key(ms: int, run: str, host: int | str, n: int) -> str:
    return f"{JOURNAL}/{ms:013d}-{run}-{host}-{n:010d}"


PACK_BYTES = 64 << 20  # a pack's chunk bytes: the packer stops adding chunks past this
PACK_MAX_BYTES = 4 * PACK_BYTES  # what a reader inflates at most (a bigger pack is refused, the journal read)


def pack(items: list[tuple[str, int | str, int, bytes]]) -> bytes:
    """Chunks `(run, host, n, bytes)` as one gzip object: a JSON line indexing them, then their bytes. Event
    lines shrink ~5x, so a replica's catch-up moves a fifth of the bytes (and a cloud bills a fifth)."""
    head = json.dumps([[run, host, n, len(body)] for run, host, n, body in items]).encode() + b"\n"
    z = zlib.compressobj(1, wbits=31)
    return b"".join([z.compress(head), *(z.compress(body) for *_, body in items), z.flush()])


def unpack(data: bytes, most: int = PACK_MAX_BYTES) -> list[tuple[str, int | str, int, bytes]]:
    """`pack`'s chunks; ValueError for an object that is not one, or that inflates past `most` bytes."""
    try:
        z = zlib.decompressobj(wbits=31)
        data = z.decompress(data, most + 1)
    except zlib.error as e:
        raise ValueError(f"a pack that is not gzip ({e})") from None
    if len(data) > most or not z.eof:
        raise ValueError(f"a pack of over {most:,} bytes, or cut short")
    cut = data.index(b"\n") + 1
    index, out, at = json.loads(data[:cut]), [], cut
    for run, host, n, size in index:
        host_ok = (isinstance(host, int) and host >= 0) or (isinstance(host, str) and _FOUND_RE.match(host))
        if (
            not (isinstance(run, str) and RUN_ID_RE.match(run))
            or not host_ok
            or not isinstance(n, int)
            or n < 0
        ):
            raise ValueError(f"a pack's index names no stream at {run!r} {host!r} chunk {n!r}")
        if not isinstance(size, int) or size < 0 or at + size > len(data):
            raise ValueError(f"a pack's index does not match its bytes at {run!r} chunk {n!r}")
        out.append((run, host, n, data[at : at + size]))
        at += size
    return out


def parse_journal(name: str) -> tuple[str, str, int | str, int] | None:
    """`(key, run, host, n)` of a journal object's name (after `_journal/`), or None for another name; the
    host of a findings stream is the string "1000.<origin>"."""
    m = _JOURNAL_RE.match(name)
    if m is None or not RUN_ID_RE.match(m.group(2)):  # "." and ".." are folders, never run ids
        return None
    host = m.group(3)
    return name, m.group(2), int(host) if host.isdigit() else host, int(m.group(4))


class Bucket:
    """The requests Observatory makes of a bucket, on one fsspec filesystem; `requests` counts them."""

    def __init__(self, url: str):
        url = location(url)
        if not isinstance(url, str):
            raise ValueError(f"{url}: not a bucket URL")
        self.url = url
        self.scheme, _, rest = url.partition("://")
        self.bucket, _, self.prefix = rest.partition("/")
        self.requests = 0
        self.skew_ms: float | None = None  # the store's clock minus this host's (`Uploader`), once measured
        self._lock = threading.Lock()
        try:
            self.fs = self._filesystem()
        except ImportError as e:
            raise ImportError(
                f"{self.url}: a bucket runs dir needs s3fs and gcsfs: pip install 'observatory[bucket]' ({e})"
            ) from None

    def _filesystem(self):
        if self.scheme == "s3":
            import s3fs

            # max_concurrency 1: a chunk (a few MB) is one GET; above 1, s3fs first HEADs every object it reads
            # (to split a large one into ranges): twice the requests of a catch-up
            return s3fs.S3FileSystem(skip_instance_cache=True, max_concurrency=1)
        else:
            # gcsfs.core's class: the package default also asks a gRPC control plane for the bucket's layout
            # (zonal or hierarchical namespaces), which we do not use and an emulator does not answer
            from gcsfs.core import GCSFileSystem

            emulated = os.environ.get("STORAGE_EMULATOR_HOST", "") not in ("", "default")
            return GCSFileSystem(skip_instance_cache=True, token="anon" if emulated else None)

    def _count(self, n: int = 1) -> None:
        with self._lock:
            self.requests += n

    def _path(self, key: str) -> str:
        return f"{self.bucket}/{self.prefix}/{key}" if self.prefix else f"{self.bucket}/{key}"

    def key_url(self, key: str) -> str:
        return f"{self.scheme}://{self._path(key)}"

    def put_new(self, key: str, data: bytes) -> bool:
        """Create the object; False when it exists already (S3 If-None-Match, GCS ifGenerationMatch=0)."""
        self._count()
        try:
            self.fs.pipe_file(self._path(key), data, mode="create")
        except FileExistsError:
            return False
        return True

    def put(self, key: str, data: bytes) -> None:
        """Create or replace the object."""
        self._count()
        self.fs.pipe_file(self._path(key), data)

    def get(self, key: str) -> bytes | None:
        """The object's bytes; None when there is none."""
        self._count()
        try:
            return bytes(self.fs.cat_file(self._path(key)))
        except FileNotFoundError:
            return None

    def clock_ms(self, key: str) -> float | None:
        """The store's clock when the object was written (S3 LastModified, to the second; GCS `updated`),
        in Unix ms; None when the store does not say."""
        self._count()
        info = self.fs.info(self._path(key))
        when = info.get("LastModified") or info.get("mtime")
        return when.timestamp() * 1000 if hasattr(when, "timestamp") else None

    def size(self, key: str) -> int:
        self._count()
        return int(self.fs.info(self._path(key))["size"])

    def get_many(self, keys: list[str]) -> dict[str, bytes | BaseException]:
        """The objects' bytes, fetched concurrently; a failed one maps to its exception."""
        if not keys:
            return {}
        self._count(len(keys))
        paths = [self._path(k) for k in keys]
        # cat_ranges: one GET each, concurrently (`cat` of a list would HEAD each path first)
        got = self.fs.cat_ranges(paths, None, None, on_error="return")
        return dict(zip(keys, got, strict=True))

    def list_after(self, prefix: str, after: str = "", limit: int | None = None) -> list[str]:
        """Keys (relative to the runs dir) under `prefix` that sort after `after`, in order (the first `limit`
        of them): one request a page of 1,000. GCS's `startOffset` is inclusive and an emulator may ignore
        it: filtered here too."""
        full = self._path(prefix)[len(self.bucket) + 1 :]
        start = self._path(after)[len(self.bucket) + 1 :] if after else ""
        cut = len(self.prefix) + 1 if self.prefix else 0
        keys: list[str] = []
        token = None
        while True:
            self._count()
            if self.scheme == "s3":
                kw: dict[str, Any] = {"Bucket": self.bucket, "Prefix": full, "MaxKeys": 1000}
                if start:
                    kw["StartAfter"] = start
                if token:
                    kw["ContinuationToken"] = token
                page = self.fs.call_s3("list_objects_v2", **kw)
                names = [o["Key"] for o in page.get("Contents", [])]
                token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
            else:
                kw = {"prefix": full, "maxResults": 1000, "json_out": True}
                if start:
                    kw["startOffset"] = start
                if token:
                    kw["pageToken"] = token
                page = self.fs.call("GET", "b/{}/o", self.bucket, **kw)
                names = [o["name"] for o in page.get("items", [])]
                token = page.get("nextPageToken")
            keys.extend(n[cut:] for n in names if n > start)
            if limit is not None and len(keys) >= limit:
                return keys[:limit]
            if not token:
                return keys


def upload_runs(local: Path, url: str, chunk_mb: float = 8.0) -> list[str]:
    """Upload a local runs dir's event logs (`<run>/events.<host>.jsonl`, written whole by an import or a
    simulation) as chunks; a stream the bucket has already is left alone. Returns what was left alone."""
    b = Bucket(url)
    size = max(1, int(chunk_mb * 1e6))
    kept = []
    for log in sorted(Path(local).glob("*/events.*.jsonl")):
        run, host = log.parent.name, int(log.name.split(".")[1])
        if b.list_after(f"{run}/events.{host}/"):
            kept.append(b.key_url(f"{run}/events.{host}/"))
            continue
        data, n = log.read_bytes(), 0
        while data:
            cut = data.rfind(b"\n", 0, size) + 1 or data.find(b"\n") + 1 or len(data)
            b.put_new(chunk_key(run, host, n), data[:cut])
            b.put_new(journal_key(int(time.time() * 1000), run, host, n), b"")
            data, n = data[cut:], n + 1
    return kept


@contextmanager
def staged(runs_dir: Any) -> Iterator[Path]:
    """A local runs dir to write whole logs into: `runs_dir` itself, or for a bucket a temporary folder
    uploaded (`upload_runs`) when the block ends without an error."""
    where = location(runs_dir)
    if not isinstance(where, str):
        yield where
        return
    with tempfile.TemporaryDirectory(prefix="observatory-upload-") as tmp:
        yield Path(tmp)
        for key in upload_runs(Path(tmp), where):
            _warn(f"{key} is in the bucket already; its chunks are immutable, so it was left as it is")


class Uploader:
    """Rolls a spool file (a local event log that one `Run` appends) into chunk objects, on its own thread.

    A chunk is whole lines: the spool's bytes from the end of the last chunk to its last newline, once
    `chunk_s` passed since the last roll or `chunk_mb` piled up, and at `close`. `<spool>.chunks` records
    each uploaded chunk (`n end`), after its object and its journal object exist, so a restarted writer
    continues at chunk n+1 from byte `end`: a chunk uploaded but not recorded is found by its
    precondition (it exists: its size says where it ended). A store that does not answer is retried with
    back-off while the spool keeps growing on local disk: nothing is lost, it drains later.
    """

    def __init__(
        self,
        bucket: Bucket,
        spool: Path,
        run: str,
        host: int | str,
        chunk_s: float,
        chunk_mb: float,
        thread: bool = True,
    ):
        self.bucket, self.spool, self.run, self.host = bucket, spool, run, host
        self.chunk_s, self.chunk_bytes = chunk_s, max(1, int(chunk_mb * 1e6))
        self.ledger = spool.with_name(spool.name + ".chunks")
        self.next, self.done = 0, 0  # next chunk number; spool bytes uploaded
        if self.ledger.exists():
            text = self.ledger.read_text()
            if text and not text.endswith("\n"):  # torn by a kill: end it, so the next record is a line
                with open(self.ledger, "a") as f:
                    f.write("\n")
            for line in text.split("\n")[:-1]:  # whole lines: a torn last one is not one
                parts = line.split()
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    self.next, self.done = int(parts[0]) + 1, int(parts[1])
        self.seq_from = 0
        self.clock = time.time  # this host's clock; journal keys are named by the store's (`skew_ms`)
        self._resolved = self.ledger.exists() or (spool.exists() and spool.stat().st_size > 0)
        if not self._resolved:
            try:
                self._continue_stream()
            except Exception as e:
                # the store is down: training goes on; the upload thread asks again before its first chunk
                _warn(
                    f"{bucket.url}: cannot list {run}'s stream ({type(e).__name__}); if it was started on another "
                    "machine, this process's first events may repeat its seqs"
                )
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"observatory-upload-{run}", daemon=True)
        if thread:  # else the caller rolls (`send_spool`)
            self._thread.start()

    def _continue_stream(self) -> None:
        """A stream the bucket has and this machine's spool not (the run resumed elsewhere): number the
        chunks after the bucket's last one, and the events after its last seq."""
        names = self.bucket.list_after(chunk_key(self.run, self.host, 0).rsplit("/", 1)[0] + "/")
        self._resolved = True
        if not names:
            return
        last = names[-1]
        self.next = int(last.rsplit("/", 1)[1].split(".")[0]) + 1
        body = self.bucket.get_many([last])[last]
        if isinstance(body, BaseException):
            raise body
        for line in reversed(bytes(body).splitlines()):
            try:
                self.seq_from = int(json.loads(line)["seq"]) + 1
                return
            except (ValueError, KeyError, TypeError):
                continue

    def _loop(self) -> None:
        last = time.monotonic()
        wait = min(1.0, self.chunk_s)
        while not self._stop.wait(wait):
            pending = self._pending()
            if pending and (pending >= self.chunk_bytes or time.monotonic() - last >= self.chunk_s):
                wait = 1.0 if self.roll() else min(30.0, wait * 2)  # back off while the store is down
                last = time.monotonic()
            else:
                wait = min(1.0, self.chunk_s)

    def _pending(self) -> int:
        try:
            return max(0, self.spool.stat().st_size - self.done)
        except OSError:
            return 0

    def roll(self) -> bool:
        """Upload what the spool has past the last chunk, whole lines only; False when the store failed."""
        while True:
            try:
                if not self._resolved:
                    self._continue_stream()
                piece = self._piece()
                if not piece:
                    break
                self._upload(piece)
            except Exception as e:  # the network, the store, credentials: retry later, the spool keeps it
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    _warn(
                        f"{self.bucket.url}: cannot upload chunk {self.next} of {self.run} ({type(e).__name__}); retrying"
                    )
                return False
        self.failures = 0
        return True

    def _piece(self) -> bytes:
        """The next chunk's bytes: whole lines from `done`, at most `chunk_mb` (a longer line whole)."""
        try:
            with open(self.spool, "rb") as f:
                f.seek(self.done)
                data = f.read(self.chunk_bytes)
                cut = data.rfind(b"\n") + 1
                while not cut and len(data) >= self.chunk_bytes:  # one line longer than a chunk
                    more = f.read(self.chunk_bytes)
                    if not more:
                        break
                    data += more
                    cut = data.find(b"\n") + 1
        except OSError:
            return b""
        return data[:cut]

    def _upload(self, piece: bytes) -> None:
        n = self.next
        key = chunk_key(self.run, self.host, n)
        # exists already: an earlier try (a killed process, a lost answer) made it from the same spool bytes
        before = self.clock() * 1000
        made = self.bucket.put_new(key, piece)
        size = len(piece) if made else self.bucket.size(key)
        if made and self.bucket.skew_ms is None:  # (one made by an earlier try has an earlier time)
            self._measure_skew(key, before)
        ms = int(self.clock() * 1000 + (self.bucket.skew_ms or 0))
        self.bucket.put_new(journal_key(ms, self.run, self.host, n), b"")
        self.done += size
        self.next = n + 1
        with open(self.ledger, "a") as f:
            f.write(f"{n} {self.done}\n")

    def _measure_skew(self, key: str, before: float) -> None:
        """The store's clock against this host's, from the chunk just put (one HEAD, once a writer): journal
        keys are named by the store's clock when this host's is off by more than a few seconds (S3 gives
        whole seconds), so a reader that lists the journal from its margin still finds them."""
        from observatory import settings

        try:
            server = self.bucket.clock_ms(key)
        except Exception:  # asked again with the next chunk
            return
        after = self.clock() * 1000
        if server is None or before - 2000 <= server <= after + 1000:
            self.bucket.skew_ms = 0.0
            return
        self.bucket.skew_ms = server - (before + after) / 2
        if abs(self.bucket.skew_ms) > settings.get("journal_margin_s") * 1000 / 2:
            _warn(
                f"{self.bucket.url}: this host's clock is {self.bucket.skew_ms / 1000:+.0f} s off the store's; its "
                "journal entries are named by the store's clock (set the host's clock: NTP)"
            )

    def close(self, timeout: float) -> None:
        """The last roll (retried until `timeout`), then stop."""
        self._stop.set()
        self._thread.join()
        deadline = time.monotonic() + timeout
        while self._pending() and not self.roll() and time.monotonic() < deadline:
            time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        if self._pending():
            _warn(
                f"{self.bucket.url}: {self._pending()} bytes of {self.run} not uploaded yet; they stay in "
                f"{self.spool} and go up when this run's writer starts again"
            )


def send_spool(b: Bucket, spool: Path, run: str, host: str, chunk_mb: float) -> bool:
    """Upload what a local findings file (`host` "1000.<origin>") has past its ledger, now, in this thread,
    under an flock of its ledger (the processes of one machine that write findings take turns); False when
    the store failed (the bytes stay in the file: the next call sends them)."""
    import fcntl

    ledger = spool.with_name(spool.name + ".chunks")
    with open(ledger, "a") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        return Uploader(b, spool, run, host, 0.0, chunk_mb, thread=False).roll()


def _warn(msg: str) -> None:
    print(f"observatory writer: {msg}", file=sys.stderr)
