"""The observatory's own events: where they go, one writer setup, one pending-scanner.

Forecasts, anomalies, decisions and alerts are written as host `OBSERVATORY_HOST`
(`events.1000.jsonl`), so what the observatory said, and when, is replayed with the run.
They go to a findings folder of the runs dir's own (`root`: under the `findings_dir`
setting, laid out like a runs dir), not into the run folders: those are someone's data,
maybe read-only. Ingest reads that folder with the runs dir (`observatory.ingest.files`).
`findings_in_run_folders` writes them into each run's folder instead, as does a run folder
that has such a file already (an older runs dir: one file, one numbering, per run).
Between being written and being ingested they live only in that file; `pending` reads them
back, with the contract's torn-line rule (a line without its final newline is not an event
yet).

For a bucket runs dir the findings folder is this machine's (`findings_dir/<bucket tag>`), and each
write is also sent to the bucket as a chunk of the run's findings stream of this observatory
(`bucket.send_spool`: `_findings/<run>/events.1000.<origin>/`), so every replica reads it. `origin` (the
folder's file `origin`, made once) names this observatory there; its findings of a run are numbered
from `bucket.seq_base(origin)`, so two observatories never write the same (run, 1000, seq). A write the
store has not taken yet is marked in `.unsent/`: a write given the bucket's URL sends it at once, and
each ingest pass of a store that follows the bucket sends what is marked (`resend`).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import secrets
import stat
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from observatory import bucket, provenance, settings
from observatory.events import OBSERVATORY_HOST, RUN_ID_RE
from observatory.logtail import LinkRefused, last_seq, open_under
from observatory.writer import append_shared, check_event, encode_event

__all__ = ["root", "roots", "path", "write", "pending", "pending_many", "origin", "resend"]

NAME = f"events.{OBSERVATORY_HOST}.jsonl"
UNSENT = ".unsent"  # in a bucket's findings folder: one empty file per run whose findings wait to go up


def root(runs_dir) -> Path | None:
    """The runs dir's findings folder (`<findings_dir>/<its name>-<8 hex of its absolute path>`), or None
    when `findings_in_run_folders` is set."""
    tag = bucket.findings_tag(runs_dir)  # a bucket's (its URL, or a store's mirror of it): never a run folder
    if tag is not None:
        return Path(settings.get("findings_dir")) / tag
    if settings.get("findings_in_run_folders"):
        return None
    where = os.path.abspath(runs_dir)
    tag = hashlib.sha256(where.encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return Path(settings.get("findings_dir")) / f"{os.path.basename(where) or 'runs'}-{tag}"


def roots(runs_dir) -> list[tuple[str, Path]]:
    """Where ingest reads the observatory's events besides the runs dir: `("findings:", root)`, and for a
    store's mirror of a bucket each other observatory's findings (`("findings.<origin>:", folder)`, in
    the mirror's `found/<origin>/`, laid out like a runs dir)."""
    top = root(runs_dir)
    out = [] if top is None else [("findings:", top)]
    if bucket.findings_tag(runs_dir) is not None and not bucket.is_url(str(runs_dir)):
        found = Path(runs_dir).parent / "found"
        try:
            names = sorted(os.listdir(found))
        except OSError:
            names = []
        out += [(f"findings.{o}:", found / o) for o in names if bucket.ORIGIN_RE.match(o)]
    return out


def origin(top: Path) -> str:
    """This observatory's name in a bucket (6 hex): the findings folder's file `origin`, made once (whole:
    written beside it, then linked into place, so a process of this machine never reads it half made)."""
    f = top / "origin"
    try:
        return _origin_in(f)
    except FileNotFoundError:
        pass
    top.mkdir(parents=True, exist_ok=True)
    tmp = top / f".origin.{os.getpid()}.{secrets.token_hex(4)}"
    tmp.write_text(secrets.token_hex(3) + "\n")
    try:
        os.link(tmp, f)
    except FileExistsError:  # made meanwhile by another process of this machine: theirs
        pass
    finally:
        tmp.unlink()
    return _origin_in(f)


def _origin_in(f: Path) -> str:
    text = f.read_text().strip()
    if not bucket.ORIGIN_RE.match(text):
        raise ValueError(f"{f}: not an origin (6 hex digits); remove it to make a new one")
    return text


def path(runs_dir, run: str) -> Path:
    """The run's observatory-host file: in the findings folder, or in the run's folder when asked or
    when one is there already."""
    top = root(runs_dir)
    if bucket.findings_tag(runs_dir) is not None:  # a bucket's: never a file of its mirror
        return top / run / NAME
    own = Path(runs_dir) / run / NAME
    # a link there is a log writer's, never ours (ingest refuses it): the findings folder's file is used
    mine = own.exists() and not own.is_symlink() and not own.parent.is_symlink()
    return own if top is None or mine else top / run / NAME


def write(runs_dir, run: str, kind: str, items: Iterable[tuple[dict, int | None]]) -> int:
    """Append `(data, step)` items as `kind` events to the run's observatory-host file.

    Never writes a `run_start` or `run_end`: the observatory must not start or end someone
    else's run. Returns how many events were written.
    """
    items = list(items)
    if not items:
        return 0
    provenance.warn_if_reachable(runs_dir)
    target = path(runs_dir, run)
    if not RUN_ID_RE.match(run):
        raise ValueError(f"run id {run!r} must match [A-Za-z0-9._-]{{1,128}}")
    lines = []
    try:
        for data, step in items:  # checked as `Run.event` checks them
            lines.append((kind, check_event(kind, data, step), time.time(), dict(data), False))
    finally:  # what was checked before a bad item is written, as a writer's queue would have
        if lines:
            _append(runs_dir, run, target, lines)
            url = bucket.url_of(runs_dir)
            if url is not None:  # to the bucket: now when given its URL, else by the store's next ingest pass
                _mark(root(url), run)
                if bucket.is_url(str(runs_dir)):
                    try:
                        resend(url)
                    except Exception as e:  # (no s3fs, a bad URL): kept, said
                        print(
                            f"observatory writer: {bucket.safe(url)}: findings not sent ({e})",
                            file=sys.stderr,
                        )
    return len(items)


def _mark(top: Path, run: str) -> None:
    (top / UNSENT).mkdir(parents=True, exist_ok=True)
    (top / UNSENT / run).touch()


def _send(b: bucket.Bucket, top: Path, run: str) -> bool:
    """The run's findings file's new lines to the bucket; then its mark in `.unsent/` goes."""
    try:
        host = f"{OBSERVATORY_HOST}.{origin(top)}"
        sent = bucket.send_spool(b, top / run / NAME, run, host, settings.get("chunk_mb"))
    except Exception as e:  # credentials, the disk: said, and kept for the next pass
        print(f"observatory writer: {b.url}: cannot send {run}'s findings ({e})", file=sys.stderr)
        sent = False
    if sent:
        (top / UNSENT / run).unlink(missing_ok=True)
    return sent


def resend(url: str, b: bucket.Bucket | None = None) -> int:
    """Send this machine's findings of the bucket `url` that wait in `.unsent/` (one listing; 16 runs at
    a time, on one client `b`); how many runs are still waiting."""
    from concurrent.futures import ThreadPoolExecutor

    top = root(url)
    try:
        runs = [run for run in os.listdir(top / UNSENT) if RUN_ID_RE.match(run)]
    except OSError:
        return 0
    if not runs:
        return 0
    b = b or bucket.Bucket(url)
    with ThreadPoolExecutor(16) as pool:
        return sum(1 for sent in pool.map(lambda run: _send(b, top, run), runs) if not sent)


def _append(runs_dir, run: str, target: Path, lines: list[tuple]) -> None:
    """Append the events to the run's observatory-host file in this thread (one open, never through a
    link; one flock'd append numbered after the file's tail and the run's other host-1000 files)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = open_under(target.parent.parent, f"{run}/{NAME}", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    with open(fd, "ab", buffering=0) as f:
        first = _next_seq(runs_dir, run, target)

        def encode(seq: int) -> bytes:
            start = max(first, seq)
            return b"".join(encode_event(run, OBSERVATORY_HOST, start + i, e) for i, e in enumerate(lines))

        try:
            append_shared(f, target, None, encode)
            os.fsync(f.fileno())
        except OSError as e:
            print(
                f"observatory writer: cannot write {target}: {e}; {len(lines)} events lost",
                file=sys.stderr,
                flush=True,
            )


def _next_seq(runs_dir, run: str, target: Path) -> int:
    """One past the last seq of the run's other host-1000 files (the run folder's own, and its `.gz`
    copy): the findings folder's file continues their numbering, so ingest keeps both (seqs it has from
    a sibling file of the same run and host count as duplicates)."""
    seqs = []
    if bucket.findings_tag(runs_dir) is not None:  # a bucket's: this observatory's own range of seqs
        return bucket.seq_base(origin(target.parent.parent))
    for other in (Path(runs_dir) / run / NAME, Path(runs_dir) / run / f"{NAME}.gz"):
        if other == target or not other.exists() or other.is_symlink() or other.parent.is_symlink():
            continue  # a link is a log writer's, not ours: never read through
        if other.suffix == ".gz":
            with gzip.open(other, "rb") as f:
                last = None
                for raw in f:
                    if raw.endswith(b"\n"):
                        last = raw
            try:
                seqs.append(int(json.loads(last)["seq"]))
            except (TypeError, ValueError, KeyError):
                continue
        else:
            seq, _ = last_seq(other, other.stat().st_size)
            if seq is not None:
                seqs.append(seq)
    return max(seqs) + 1 if seqs else 0


def pending(runs_dir, run: str, kind: str) -> list[dict]:
    """Events of `kind` in the run's observatory-host file, written but maybe not yet ingested.

    Skips a torn last line (no final newline), a line that is not JSON, an event whose
    `data` is not an object, and a finding without this observatory's signature: the same
    lines ingest would not store (a forged anomaly's `scanned_through` must not stop the scan).
    """
    p = path(runs_dir, run)
    return _pending_at(p.parent.parent, f"{run}/{NAME}", kind) or []


def pending_many(runs_dir, runs: Iterable[str], kind: str) -> dict[str, list[dict]]:
    """`pending` of each run: the findings folder is listed once, not looked up run by run (a scan of a
    sweep's 10^4 runs, most with no findings file)."""
    top = root(runs_dir)
    try:
        in_top = set(os.listdir(top)) if top is not None else set()
    except OSError:
        in_top = set()
    out = {}
    for run in runs:  # `path`'s rule: the run folder's own file first, else the findings folder's
        found = (
            None
            if bucket.findings_tag(runs_dir) is not None
            else _pending_at(runs_dir, f"{run}/{NAME}", kind)
        )
        if found is None and top is not None and run in in_top:
            found = _pending_at(top, f"{run}/{NAME}", kind)
        out[run] = found or []
    return out


def _pending_at(top, rel: str, kind: str) -> list[dict] | None:
    """`_pending_in` of the file `rel` under `top`; None when there is none, or it is a link (one open, not a
    stat and then an open; never through a link: a log writer's link is not our file)."""
    try:
        return _pending_in(open_under(top, rel, os.O_RDONLY | os.O_NONBLOCK), kind)
    except (FileNotFoundError, NotADirectoryError, LinkRefused):
        return None


def _pending_in(fd: int, kind: str) -> list[dict]:
    needle = f'"{kind}"'.encode()
    out = []
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return out
        for raw in f:
            if not raw.endswith(b"\n") or needle not in raw:
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if (
                isinstance(ev, dict)
                and ev.get("kind") == kind
                and isinstance(ev.get("data"), dict)
                and provenance.judge(ev, OBSERVATORY_HOST) is None  # a forged finding is not ours
            ):
                out.append(ev)
    return out
