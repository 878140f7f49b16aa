"""The ingest data model: a log file (`LogFile`), a chunk of its lines (`Chunk`, `read_chunk`), a file's
progress and seq bookkeeping (`FileState`), and everything one write transaction adds (`Batch`); and the
judge of one line, `check_line` (`observatory.events.validate_event` plus the store's field rules,
`observatory.ingest.rules`, which the bulk path certifies with too).

`observatory.ingest.passes` drives passes and transactions; `msgspec_lines` certifies the common lines
in bulk and hands this module what it cannot (`check_line`, one by one, or `plain_ingest_chunk` for a
piece of odd lines); tests check that the bulk path stores what judging every line alone stores.
"""

from __future__ import annotations

import errno
import functools
import gzip
import json
import math
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from observatory import provenance, settings
from observatory.events import (
    KINDS,
    OBSERVATORY_HOST,
    ValidationError,
    decode_number,
    is_final_failure,
    json_text,
    validate_event,
)
from observatory.ingest.appends import Appends
from observatory.ingest.rules import check_ranges
from observatory.logtail import LinkRefused, open_under
from observatory.redact import scrub_event, scrub_text

RAW_CAP = 4096  # bytes of a rejected line kept in rejected_events.raw


class Rejection(str):
    """An `emit` message about rejected lines, which `ingest -q` leaves out (the summary counts them)."""


MESSAGE_LIMIT = 200  # rejection messages kept per batch and report (the rest: rejected_events, ingest_files)
# Lines that no check could accept (their first byte is neither `{` nor whitespace) and that fall past a
# file's `max_rejected_per_file` are counted in bulk, not judged one by one: a junk bomb costs a scan.
# The stored rejections and every count are the same either way (tests turn it off to compare).
JUNK_FAST = True
_JUNK_FIRST = np.ones(256, bool)
_JUNK_FIRST[[9, 10, 11, 12, 13, 32, ord("{")]] = False  # whitespace: a blank line is skipped, not rejected


@dataclass(frozen=True)
class LogFile:
    root: str  # the runs dir it is in
    rel: str  # "<run>/events.<host>.jsonl[.gz]": its key in the store, independent of where the runs dir is
    # ("findings:<run>/events.1000.jsonl" in the runs dir's findings folder: `observatory.findings.root`)
    run: str  # run folder
    host: int  # from the file name
    gz: bool
    size: int
    mtime: float

    @property
    def path(self) -> Path:
        """Where it is (made when asked: a pass over 10^5 logs reads a few of them)."""
        return Path(self.root, self.rel.partition(":")[2] or self.rel)  # `findings:<run>/...`: its folder


# ----------------------------------------------------------------- reading


@dataclass
class Chunk:
    data: bytes  # complete lines, each ending in b"\n"
    end: int  # offset after `data` (and after any skipped oversized line)
    oversized: list[
        tuple[int, int, bytes]
    ]  # (index among lines of this chunk, length, head) of skipped lines
    tail: bytes  # bytes after the last newline when EOF was reached (a torn line), capped
    tail_len: int
    eof: bool
    error: str | None = None  # e.g. a corrupt gzip stream
    transient: bool = False  # an error that may go away (permissions): report, do not record


def _is_transient(e: BaseException) -> bool:
    return isinstance(e, OSError) and not isinstance(e, gzip.BadGzipFile)


def _read_error(lf: LogFile, e: BaseException) -> str:
    if lf.gz and not _is_transient(e):
        return f"corrupt or truncated gzip stream ({type(e).__name__}: {e}); lines before it were read"
    return f"cannot read: {e}"


def _fd(lf: LogFile) -> int:
    """The log opened read-only below its runs dir, never through a symbolic link (`open_under`: a link to
    the signing key or `/etc/passwd` is refused, not read), and non-blocking (a FIFO named like a log)."""
    return open_under(lf.root, lf.rel.partition(":")[2] or lf.rel, os.O_RDONLY | os.O_NONBLOCK)


def _open(lf: LogFile):
    # only regular files: opening a FIFO named like a log would block the ingester forever
    fd = _fd(lf)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = (
                "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
            )
            raise OSError(errno.EINVAL, f"not a regular file ({what})")
        os.set_blocking(fd, True)
        f = open(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    if not lf.gz:
        return f
    g = gzip.GzipFile(fileobj=f, mode="rb")
    g.myfileobj = f  # closed with it (as `gzip.open` of a path does)
    return g


def read_chunk(lf: LogFile, offset: int, budget: int, max_line: int) -> Chunk:
    """Up to `budget` bytes of complete lines from `offset`; never holds more than ~budget in memory.

    A line longer than the budget is skipped while streaming (its first bytes kept
    for the rejection), so a 100 MB line costs a scan, not 100 MB of memory.
    """
    oversized: list[tuple[int, int, bytes]] = []
    try:
        f = _open(lf)
    except LinkRefused as e:  # for good: said once, stored with no byte of what the link points to
        return Chunk(b"", offset, [], b"", 0, True, f"not read: {e.strerror}")
    except OSError as e:
        return Chunk(b"", offset, [], b"", 0, True, f"cannot open: {e.strerror or e}", transient=True)
    with f:
        try:
            f.seek(offset)
            buf = f.read(budget)
        except (OSError, EOFError, zlib.error) as e:
            return Chunk(b"", offset, [], b"", 0, True, _read_error(lf, e), transient=_is_transient(e))
        last = buf.rfind(b"\n")
        if last >= 0:
            data = buf[: last + 1]
            if len(buf) < budget:  # a short read: the file's end is here (with a torn line after, or not)
                tail = buf[last + 1 :]
                return Chunk(data, offset + len(data), oversized, tail[:RAW_CAP], len(tail), True)
            return Chunk(data, offset + len(data), oversized, b"", 0, False)
        if len(buf) < budget:  # EOF and no newline: a torn final line (or nothing)
            return Chunk(b"", offset, [], buf[:RAW_CAP], len(buf), True)
        # one line longer than the whole budget: stream past it
        head, n = buf[:RAW_CAP], len(buf)
        while True:
            try:
                block = f.read(1 << 20)
            except (OSError, EOFError, zlib.error) as e:
                return Chunk(b"", offset, [], head, n, True, _read_error(lf, e), transient=_is_transient(e))
            if not block:
                return Chunk(b"", offset, [], head, n, True)  # still torn at EOF
            i = block.find(b"\n")
            if i >= 0:
                n += i
                return Chunk(b"", offset + n + 1, [(0, n, head)], b"", 0, False)
            n += len(block)


def read_rest(lf: LogFile, offset: int, most: int) -> Chunk | None:
    """The rest of a plain log from `offset`, when it is at most `most` bytes of complete lines to the size
    it was listed at: the chunk `read_chunk` would give (its last). None otherwise (grown since it was
    listed, a torn or oversized last line, not a regular file, unreadable): `read_chunk` reads it then.

    One open (non-blocking: a FIFO named like a log opens at once, and is refused as not a regular file),
    one fstat, one read of the bytes listed and one more: a sweep's catch-up reads 10^5 logs of a few KB,
    and Python's buffered file cost more than the system calls (27 against 15 us a file here)."""
    want = lf.size - offset
    if lf.gz or not 0 < want <= most:
        return None
    try:
        fd = _fd(lf)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.pread(fd, want + 1, offset)  # one byte more: a file that grew since is read as any other
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) != want or not data.endswith(b"\n"):
        return None
    return Chunk(data, offset + want, [], b"", 0, True)


# --------------------------------------------------------------- a batch


class Batch:
    """Everything one transaction adds, gathered in Python lists and staged Arrow tables."""

    def __init__(self, now: float, max_rejected: int | None = None, layouts: Any = None):
        self.now = now
        # the ingester's `msgspec_lines.Layouts` (what it learnt of its runs' metric names); None: a new one
        self.layouts = layouts
        # rejected lines stored per file, in all passes (`max_rejected_per_file`); past it they are counted only
        self.max_rejected = int(
            settings.get("max_rejected_per_file") if max_rejected is None else max_rejected
        )
        self.rejected: list[tuple] = []  # (file, run, line, field, reason, raw, ingested_at)
        self.n_rejected = 0  # rejected lines, stored or not
        self.files: dict[str, FileState] = {}  # rel -> the state of each file this batch reads (`track`)
        self.dropped: dict[
            str, tuple[LogFile, int]
        ] = {}  # rel -> (file, rejected lines not stored in this batch)
        self.events: list[tuple] = []  # (run, host, seq, kind, step, t, v, known, data_json)
        self.metrics: dict[str, list] = {k: [] for k in ("run", "step", "name", "value", "t", "host")}
        self.experts: dict[str, list] = {
            k: [] for k in ("run", "step", "layer", "expert", "routed", "dropped")
        }
        self.heartbeats: list[tuple] = []  # (run, host, seq, t, step, phase)
        self.telemetry: dict[str, list] = {k: [] for k in ("run", "host", "t", "name", "value")}
        self.lifecycle: list[dict] = []  # run_start / run_end / final failure events, applied to `runs`
        self.activity: dict[str, list] = {}  # run -> [max t, max step], from the run's own processes
        self.observed: set[str] = set()  # runs that got events written by the observatory itself (host 1000)
        self.touched: dict[str, set[str]] = {"metrics": set(), "expert_load": set()}
        self.new_runs: set[str] = set()  # runs the store had no row of before this batch (`runs.update_runs`)
        self.metrics_start = self.experts_start = 0  # rows `metrics`, `expert_load` had before this batch
        self.appends = Appends()  # the msgspec path's rows, held for one INSERT per `INSERT_ROWS`
        self.messages: list[str] = []
        self.n_events = self.n_metric_values = self.n_expert_rows = self.n_duplicates = self.n_truncated = 0
        self.n_bytes = self.n_files = 0
        self.n_fast = 0  # events accepted by a vectorised check (SQL or msgspec), not one by one
        self.redactions: dict[str, int] = {}  # run -> values hidden by `observatory.redact` in this batch

    def hid(self, run: str, n: int) -> None:
        if n:
            self.redactions[run] = self.redactions.get(run, 0) + n

    def track(self, lf: LogFile, st: FileState) -> None:
        """Count `lf`'s rejections on `st` (its row of `ingest_files`): the per-file cap spans passes."""
        self.files[lf.rel] = st

    def reject(self, lf: LogFile, line: int, fld: str | None, reason: str, raw: bytes | str) -> None:
        if self.room(lf) == 0:
            # a hostile log (a gzip bomb of bad lines) must not fill the store: count it, keep no text
            self.count_dropped(lf, 1)
            return
        self.n_rejected += 1
        st = self.files.get(lf.rel)
        if st is not None:
            st.rejected += 1
        if isinstance(raw, bytes):
            raw = raw[:RAW_CAP].decode("utf-8", "replace")
        # the raw line, the reason (which may quote a value) and the field (which may name a metric) are
        # public text: secrets hidden
        raw, n_raw = scrub_text(raw[:RAW_CAP])
        reason, n_reason = scrub_text(reason)
        fld, n_fld = scrub_text(fld) if fld else (fld, 0)
        self.hid(lf.run, n_raw + n_reason + n_fld)
        self.rejected.append((lf.rel, lf.run, line, fld, reason, raw[:RAW_CAP], self.now))
        if len(self.messages) < MESSAGE_LIMIT:
            self.messages.append(Rejection(f"{lf.path}:{line}: {reason}"))

    def room(self, lf: LogFile) -> int | None:
        """Rejected lines of `lf` that may still be stored with their text (None: `lf` is not tracked)."""
        st = self.files.get(lf.rel)
        return None if st is None else max(0, self.max_rejected - (st.rejected - st.rejected_dropped))

    def count_dropped(self, lf: LogFile, n: int) -> None:
        """`n` rejected lines of a tracked `lf` past its cap: what `reject` does to each such line, at once."""
        st = self.files[lf.rel]
        self.n_rejected += n
        st.rejected += n
        st.rejected_dropped += n
        self.dropped[lf.rel] = (lf, self.dropped.get(lf.rel, (lf, 0))[1] + n)

    def dropped_messages(self) -> list[str]:
        """One line per file whose rejected lines went past `max_rejected` in this batch."""
        out = []
        for rel, (lf, n) in self.dropped.items():
            st = self.files[rel]
            out.append(
                Rejection(
                    f"{lf.path}: {n:,} more rejected lines not stored in rejected_events: this file has "
                    f"{st.rejected:,} rejected lines, the first {st.rejected - st.rejected_dropped:,} stored "
                    f"(max_rejected_per_file, env {settings.SETTINGS['max_rejected_per_file'].env}; "
                    'counts: observatory sql "SELECT path, rejected, rejected_dropped FROM ingest_files")'
                )
            )
        return out

    def saw(self, run: str, t: float | None, step: int | None, host: int = 0) -> None:
        if host == OBSERVATORY_HOST:
            # findings about a run are not signs of life: they must not revive a crashed run
            self.observed.add(run)
            return
        a = self.activity.setdefault(run, [None, None])
        if t is not None and not math.isnan(t) and (a[0] is None or t > a[0]):
            a[0] = t
        if step is not None and (a[1] is None or step > a[1]):
            a[1] = step


class FileState:
    """A file's row of `ingest_files`, plus the seq ranges of its (run, host) siblings."""

    def __init__(self, row: dict | None, lf: LogFile, sibling_ranges: list[tuple[int, int]]):
        row = row or {}
        self.offset = row.get("byte_offset") or 0
        self.line = row.get("line") or 0
        self.first_seq, self.last_seq, self.cursor = (
            row.get("first_seq"),
            row.get("last_seq"),
            row.get("cursor_seq"),
        )
        self.rejected = row.get("rejected") or 0  # rejected lines so far, stored or not (`Batch.reject`)
        self.rejected_dropped = row.get("rejected_dropped") or 0  # of those, not stored in rejected_events
        self.siblings = sibling_ranges
        self.restarted_from: int | None = None  # the offset it had when the file shrank or was replaced
        if self.offset > (lf.size if not lf.gz else math.inf) or (
            lf.gz and row and row.get("size") != lf.size
        ):
            # the file shrank or was replaced: read it again; seqs already stored count as duplicates
            if self.first_seq is not None:
                self.siblings = [*self.siblings, (self.first_seq, self.last_seq)]
            self.restarted_from = self.offset
            self.offset = self.line = 0
            self.cursor = None
        elif self.last_seq is not None and (self.cursor is None or self.cursor < self.last_seq):
            # read again after it shrank, and not past what was stored before: those seqs are duplicates
            # (in order, the cursor is never below the highest stored seq)
            self.siblings = [*self.siblings, (self.first_seq, self.last_seq)]

    # The seq rule, in one place: in a file, each seq is above the one before (the cursor); a seq in a
    # sibling file's range (the same run and host, another file) is a duplicate; an accepted seq widens
    # the file's range. `check_seq` judges one seq; `clear_run` and `record` judge and keep a rising run
    # of them at once, leaving what `check_seq` of each in order would leave.

    def clear_run(self, lo: int, hi: int) -> bool:
        """Whether a rising run of seqs from `lo` to `hi` passes `check_seq`, each in order: above the
        cursor, and in no sibling's range."""
        return (self.cursor is None or lo > self.cursor) and not any(
            s_lo <= hi and lo <= s_hi for s_lo, s_hi in self.siblings
        )

    def record(self, lo: int, hi: int) -> None:
        """Keep a rising run of accepted seqs from `lo` to `hi` (one seq: `lo == hi`)."""
        self.cursor = hi if self.cursor is None else max(self.cursor, hi)
        self.first_seq = lo if self.first_seq is None else min(self.first_seq, lo)
        self.last_seq = hi if self.last_seq is None else max(self.last_seq, hi)

    def accept_all(self, seqs: np.ndarray) -> bool:
        """`check_seq` of every seq in order accepts them all: then record them, as it would; else change nothing."""
        if len(seqs) == 0:
            return True
        lo, hi = int(seqs[0]), int(seqs[-1])
        if not bool(np.all(np.diff(seqs) > 0)) or not self.clear_run(lo, hi):
            return False  # some may be duplicates or out of order (or not: the per-line check decides)
        self.record(lo, hi)
        return True

    def check_seq(self, seq: int) -> str | None:
        """None to accept; "dup" for an already stored event; else the rejection reason."""
        if self.cursor is not None and seq <= self.cursor:
            return f"seq {seq} is not above the previous seq {self.cursor} in this file"
        if not self.clear_run(seq, seq):
            self.cursor = seq
            return "dup"
        self.record(seq, seq)
        return None


def check_line(b: Batch, lf: LogFile, st: FileState, lineno: int, raw: bytes) -> None:
    """Decode and validate one line in Python; route it to its table or to rejected_events."""
    if not raw.strip():
        return  # a blank line (e.g. the newline a resumed writer puts after a torn line)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        b.reject(lf, lineno, "(line)", f"not UTF-8 text (byte {e.start}); is this file an event log?", raw)
        return
    try:
        ev = json.loads(text)
    except (ValueError, RecursionError) as e:
        b.reject(lf, lineno, "(line)", f"bad JSON: {e}", raw)
        return
    if (
        isinstance(ev, dict)
        and text.count("{") + text.count("[") > MAX_DEPTH  # each level opens with one: else it cannot be
        and _depth(ev.get("data")) > MAX_DEPTH
    ):  # what is stored of an event: every reader
        # after this one (redaction, encoding, reports, the pages) recurses into it
        b.reject(
            lf, lineno, "data", f"data: objects and arrays nested more than {MAX_DEPTH} levels deep", raw
        )
        return
    try:
        validate_event(ev, run_folder=lf.run, host=lf.host)
        check_ranges(ev)
    except ValidationError as e:
        b.reject(lf, lineno, e.field, f"{e.field}: {e.reason}", raw)
        return
    forged = provenance.judge(ev, lf.host)  # a finding the observatory did not write
    if forged:
        b.reject(lf, lineno, "sig", forged, raw)
        return
    verdict = st.check_seq(ev["seq"])
    if verdict == "dup":
        b.n_duplicates += 1
        return
    if verdict is not None:
        b.reject(lf, lineno, "seq", verdict, raw)
        return
    run, kind, step, data = ev["run"], ev["kind"], ev.get("step"), ev["data"]
    t = float(decode_number(ev["t"]))
    b.n_events += 1
    b.saw(run, t, step, lf.host)
    if kind == "metrics":
        m = b.metrics
        for name, value in data.items():
            m["name"].append(name)
            m["value"].append(decode_number(value))
        n = len(data)
        m["run"].extend([run] * n)
        m["step"].extend([step] * n)
        m["t"].extend([t] * n)
        m["host"].extend([lf.host] * n)
        b.n_metric_values += n
        b.touched["metrics"].add(run)
    elif kind == "expert_load":
        x, n = b.experts, len(data["routed"])
        x["run"].extend([run] * n)
        x["step"].extend([step] * n)
        x["layer"].extend([data["layer"]] * n)
        x["expert"].extend(range(n))
        x["routed"].extend(data["routed"])
        x["dropped"].extend(data["dropped"])
        b.n_expert_rows += n
        b.touched["expert_load"].add(run)
    elif kind == "heartbeat":  # typed rows, not `events`: a thousand processes' pulses would swamp it
        phase = data.get("phase")
        if isinstance(phase, str):
            phase, n = _clean_text(phase[:64])
            b.hid(run, n)
        b.heartbeats.append(
            (run, lf.host, ev["seq"], t, data.get("step"), phase if isinstance(phase, str) else None)
        )
        tm = b.telemetry
        for name, value in data.items():
            if name not in ("phase", "step"):
                name, n = _clean_text(name)
                b.hid(run, n)
                tm["run"].append(run)
                tm["host"].append(lf.host)
                tm["t"].append(t)
                tm["name"].append(name)
                tm["value"].append(decode_number(value))
    else:
        data, n = scrub_event(
            kind, data
        )  # every writer's secrets, by key and by pattern (ours already hid its own)
        b.hid(run, n)
        if lf.host == OBSERVATORY_HOST and (kid := provenance.signer(ev)) is not None:
            data = {
                **data,
                "signed_by": kid,
            }  # judged above: the trusted key that signed it, for pages to say
        dj = json_text(data)
        b.events.append((run, lf.host, ev["seq"], kind, step, t, ev["v"], kind in KINDS, dj))
        if kind in ("run_start", "run_end") or is_final_failure(kind, data):
            b.lifecycle.append(
                {"run": run, "kind": kind, "t": t, "step": step, "data": data, "host": lf.host}
            )


@functools.lru_cache(maxsize=4096)
def _clean_text(text: str) -> tuple[str, int]:
    """`scrub_text`, remembered: heartbeats repeat the same few telemetry names at every beat."""
    return scrub_text(text)


MAX_DEPTH = 64  # levels of objects and arrays in an event's data (the data object itself is 1)


def _depth(value) -> int:
    """How deeply `value` nests objects and arrays (up to MAX_DEPTH + 1), counted without recursion (a
    hostile line may nest thousands of levels: Python's own recursion would fail on it downstream)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict | list):
            deepest = max(deepest, d)
            if d <= MAX_DEPTH:  # past the limit the answer is "too deep" already
                stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def plain_ingest_chunk(b: Batch, lf: LogFile, st: FileState, ch: Chunk, max_line: int) -> None:
    """Every line of a chunk judged by `check_line`, in file order: the one definition of a valid line.
    `msgspec_lines` certifies the common lines in bulk and hands this what it cannot (a piece of odd
    lines, non-UTF-8 bytes, oversized lines, a run id or host the store cannot keep); with
    `msgspec_lines.ENABLED` off every chunk comes here (the tests' reference). Oversized lines are
    rejected by their length; junk past the file's rejected cap is counted in bulk (`_junk_past_cap`)."""
    base = st.line
    if not ch.data:
        for _, n, head in ch.oversized:
            b.reject(lf, base + 1, "(line)", f"line is {n} bytes, over max_line_bytes={max_line}", head)
        st.line += len(ch.oversized)
        st.offset = ch.end
        return
    nl = np.flatnonzero(np.frombuffer(ch.data, np.uint8) == 10)
    offs = np.empty(len(nl) + 1, np.int64)
    offs[0], offs[1:] = 0, nl + 1
    lengths = np.diff(offs)
    skip = _junk_past_cap(b, lf, ch.data, offs) if JUNK_FAST else None  # counted already
    for i in range(len(lengths)) if skip is None else np.flatnonzero(~skip).tolist():
        lineno = base + 1 + i
        if lengths[i] > max_line + 1:
            raw = ch.data[offs[i] : offs[i] + RAW_CAP]
            b.reject(
                lf, lineno, "(line)", f"line is {lengths[i] - 1} bytes, over max_line_bytes={max_line}", raw
            )
        else:
            check_line(b, lf, st, lineno, ch.data[offs[i] : offs[i + 1] - 1])
    st.line += len(lengths)
    st.offset = ch.end


def _junk_past_cap(b: Batch, lf: LogFile, data: bytes, offs: np.ndarray) -> np.ndarray | None:
    """(L,) the lines that cannot be events and fall past `lf`'s rejected cap, now counted; None if there are none.

    The first `room` such lines stay with the others, so the lines stored are those the one-by-one
    path stores: the first rejections in file order (any junk line among them is one of those `room`).
    """
    room = b.room(lf)
    if room is None or len(offs) < 2:
        return None
    junk = np.flatnonzero(_JUNK_FIRST[np.frombuffer(data, np.uint8)[offs[:-1]]])
    if len(junk) <= room:
        return None
    skip = np.zeros(len(offs) - 1, bool)
    skip[junk[room:]] = True
    b.count_dropped(lf, len(junk) - room)
    return skip


def seq_ok(
    b: Batch, lf: LogFile, st: FileState, lineno: int, seq: int, data: bytes, start: int, end: int
) -> bool:
    """A certainly valid line's seq check, in file order: True to store it; a duplicate is counted, a
    seq out of order rejected (with data[start:end], the line without its newline, capped)."""
    verdict = st.check_seq(seq)
    if verdict is None:
        return True
    if verdict == "dup":
        b.n_duplicates += 1
    else:
        b.reject(lf, lineno, "seq", verdict, data[start : min(end, start + RAW_CAP)])
    return False
