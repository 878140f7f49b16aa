"""Ingest: event logs → DuckDB store, incremental, exactly-once, every line validated.

    report = ingest("data/runs", "data/observatory.duckdb")          # one pass
    ingest(runs, db, follow=True, stop_event=ev)                      # tail until stopped

Layout read: `<runs>/<run>/events.<host>.jsonl` (and `.jsonl.gz`, import copies).

How one pass works (one short write transaction per batch, see `store.py`):

1. Scan the runs dir; stat every log. A plain log with bytes past its stored
   offset, or a `.gz` whose size or mtime changed, has work.
2. Take the write lock, open the store, read `ingest_files` (offsets, seq ranges).
3. For each file, read up to a byte budget of complete lines from its offset.
   Bytes go to DuckDB zero-copy as an Arrow string column; DuckDB's JSON reader
   parses them and a conservative vectorised check (`_STAGE_SQL`) marks the lines
   that are certainly valid `metrics` / `expert_load` events (the hot, bulky
   kinds). Every other line -- other kinds, NaN strings, anything odd -- is
   decoded in Python and checked by `observatory.events.validate_event`, which
   stays the one definition of "valid" (tests check the fast path never accepts
   what it rejects). Seq order and (run, host, seq) duplicates are checked for
   every line in file order.
4. Rows go in as bulk `INSERT ... SELECT` from the staged Arrow data; rejected
   lines go to `rejected_events`; the file's new offset goes to `ingest_files`;
   `runs` is updated; the dashboard's rollups hook runs -- all in one transaction,
   so a kill at any point leaves either all of the batch or none of it.
5. Commit, close, release the lock; then the anomaly hook runs (it writes its
   findings as events, which the next pass ingests).

Torn last lines (no final newline) wait while the run may be live and are
recorded as `truncated` once it ended or went quiet for `stale_after_s`.
"""

from __future__ import annotations

import gzip
import importlib
import json
import math
import os
import re
import signal
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from observatory import settings, store
from observatory.events import (
    KINDS,
    STATUSES,
    ValidationError,
    decode_number,
    encode_value,
    validate_event,
)

__all__ = ["ingest", "rebuild", "IngestReport", "LogFile", "scan"]

FILE_RE = re.compile(r"^events\.(\d+)\.jsonl(\.gz)?$")
RAW_CAP = 4096  # bytes of a rejected line kept in rejected_events.raw
BATCH_BYTES = 32 << 20  # input bytes per write transaction: keeps each lock hold well under a second or two
GZ_BATCH_BYTES = 256 << 20  # .gz has no cheap seek, so take bigger bites
MESSAGE_LIMIT = 200  # rejection messages kept in a report (all of them are in rejected_events)

U16, U32, I32, I64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 31) - 1, (1 << 63) - 1


@dataclass
class IngestReport:
    """What one `ingest` call did. `messages` are `file:line: reason` lines."""

    files: int = 0
    events: int = 0
    metric_values: int = 0
    expert_rows: int = 0
    rejected: int = 0
    duplicates: int = 0
    truncated: int = 0
    bytes: int = 0
    seconds: float = 0.0
    passes: int = 0
    fast_events: int = 0  # of `events`, how many the vectorised path accepted (the rest: validate_event)
    runs: set[str] = field(default_factory=set)
    messages: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"ingested {self.events} events ({self.metric_values} metric values, {self.expert_rows} "
            f"expert-load rows) from {self.files} file reads, {self.bytes / 1e6:.1f} MB in {self.seconds:.2f} s; "
            f"{self.rejected} rejected, {self.duplicates} duplicates skipped, {self.truncated} truncated"
        )


@dataclass(frozen=True)
class LogFile:
    path: Path  # where it is
    rel: str  # "<run>/events.<host>.jsonl[.gz]": its key in the store, independent of where the runs dir is
    run: str  # run folder
    host: int  # from the file name
    gz: bool
    size: int
    mtime: float


def scan(runs_dir: Path) -> list[LogFile]:
    """Every event log under the runs dir; a run's `.gz` copies come before its live files."""
    out = []
    try:
        run_dirs = sorted(p for p in Path(runs_dir).iterdir() if p.is_dir())
    except FileNotFoundError:
        return []
    for d in run_dirs:
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            m = FILE_RE.match(name)
            if not m:
                continue
            p = d / name
            try:
                st = p.stat()
            except OSError:
                continue
            out.append(LogFile(p, f"{d.name}/{name}", d.name, int(m.group(1)), bool(m.group(2)), st.st_size, st.st_mtime))
    out.sort(key=lambda f: (f.run, f.host, not f.gz, f.rel))
    return out


# ----------------------------------------------------------------- reading


@dataclass
class _Chunk:
    data: bytes  # complete lines, each ending in b"\n"
    end: int  # offset after `data` (and after any skipped oversized line)
    oversized: list[tuple[int, int, bytes]]  # (index among lines of this chunk, length, head) of skipped lines
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


def _open(lf: LogFile):
    return gzip.open(lf.path, "rb") if lf.gz else open(lf.path, "rb")


def _read_chunk(lf: LogFile, offset: int, budget: int, max_line: int) -> _Chunk:
    """Up to `budget` bytes of complete lines from `offset`; never holds more than ~budget in memory.

    A line longer than the budget is skipped while streaming (its first bytes kept
    for the rejection), so a 100 MB line costs a scan, not 100 MB of memory.
    """
    oversized: list[tuple[int, int, bytes]] = []
    try:
        f = _open(lf)
    except OSError as e:
        return _Chunk(b"", offset, [], b"", 0, True, f"cannot open: {e.strerror or e}", transient=True)
    with f:
        try:
            f.seek(offset)
            buf = f.read(budget)
        except (OSError, EOFError, zlib.error) as e:
            return _Chunk(b"", offset, [], b"", 0, True, _read_error(lf, e), transient=_is_transient(e))
        last = buf.rfind(b"\n")
        if last >= 0:
            data = buf[: last + 1]
            return _Chunk(data, offset + len(data), oversized, b"", 0, False)
        if len(buf) < budget:  # EOF and no newline: a torn final line (or nothing)
            return _Chunk(b"", offset, [], buf[:RAW_CAP], len(buf), True)
        # one line longer than the whole budget: stream past it
        head, n = buf[:RAW_CAP], len(buf)
        while True:
            try:
                block = f.read(1 << 20)
            except (OSError, EOFError, zlib.error) as e:
                return _Chunk(b"", offset, [], head, n, True, _read_error(lf, e), transient=_is_transient(e))
            if not block:
                return _Chunk(b"", offset, [], head, n, True)  # still torn at EOF
            i = block.find(b"\n")
            if i >= 0:
                n += i
                return _Chunk(b"", offset + n + 1, [(0, n, head)], b"", 0, False)
            n += len(block)


# ------------------------------------------------------------ fast path SQL

# One row per staged line. `ok` is true only for lines that are certainly valid
# metrics / expert_load events: DuckDB's JSON transform coerces types (1.5 -> 2,
# true -> 1.0), so the raw JSON text of each field is checked by pattern. Anything
# this does not accept is decided by validate_event in Python.
_STAGE_SQL = r"""
CREATE OR REPLACE TEMP TABLE _stage AS
WITH e AS (
    SELECT lineno, try(json_transform_strict(line,
        '{"v":"JSON","run":"JSON","kind":"JSON","step":"JSON","t":"JSON","host":"JSON","seq":"JSON","data":"JSON"}')) AS e
    FROM _lines
), f AS (
    SELECT lineno,
        e.data AS data,
        coalesce(e.v = '1' AND e.run = $run AND e.host = $host
            AND regexp_full_match(e.step, '\d{1,9}') AND regexp_full_match(e.seq, '\d{1,18}')
            AND regexp_full_match(e.t, '-?\d{1,17}(\.\d+)?([eE][-+]?\d{1,3})?'), false) AS env_ok,
        try_cast(e.seq AS BIGINT) AS seq, try_cast(e.step AS BIGINT) AS step, try_cast(e.t AS DOUBLE) AS t,
        -- every metric value is a bare JSON number (no strings, bools, nulls, objects)
        e.kind = '"metrics"' AND NOT regexp_matches(e.data, ':\s*[^-0-9\s]') AS m_ok,
        CASE WHEN e.kind = '"expert_load"' AND regexp_full_match(e.data,
                 '\{(?:"(?:layer|routed|dropped)":(?:\d{1,4}|\[(?:\d{1,9}(?:,\d{1,9})*)?\]),?){3}\}')
             THEN try(json_transform_strict(e.data, '{"layer":"USMALLINT","routed":["UINTEGER"],"dropped":["UINTEGER"]}')) END AS x
    FROM e
), g AS (
    SELECT *,
        -- the chunk's common metric names as a STRUCT (4x cheaper than a MAP); exactly those keys:
        -- all present (strict) and as many ':' as keys (names here have no ':', values are numbers)
        CASE WHEN m_ok AND length(data) - length(replace(data, ':', '')) = {n_keys}
             THEN try(json_transform_strict(data, '{struct}')) END AS ms
    FROM f
), h AS (
    SELECT *, CASE WHEN m_ok AND ms IS NULL THEN try(json_transform_strict(data, '"MAP(VARCHAR, DOUBLE)"')) END AS m
    FROM g
)
SELECT lineno, seq, step, t, ms, m, x,
    env_ok AND (
        ms IS NOT NULL
        OR (m IS NOT NULL AND NOT list_contains(map_keys(m), '') AND NOT list_has_any(map_values(m), [NULL::DOUBLE]))
        OR (x IS NOT NULL AND x.layer IS NOT NULL AND x.routed IS NOT NULL AND x.dropped IS NOT NULL
            AND len(x.routed) = len(x.dropped) AND len(x.routed) <= 65536
            AND NOT list_has_any(x.routed, [NULL::UINTEGER]) AND NOT list_has_any(x.dropped, [NULL::UINTEGER]))
    ) AS ok
FROM h
"""

_INSERT_FAST_METRICS_MAP = """
INSERT INTO metrics
SELECT $run, step, unnest(map_keys(m)), unnest(map_values(m)), t, $host
FROM _stage SEMI JOIN _acc USING (lineno) WHERE m IS NOT NULL
"""
_INSERT_FAST_METRICS_STRUCT = """
INSERT INTO metrics
SELECT $run, step, unnest({names}), unnest({values}), t, $host
FROM _stage SEMI JOIN _acc USING (lineno) WHERE ms IS NOT NULL
"""
_INSERT_FAST_EXPERTS = """
INSERT INTO expert_load
SELECT $run, step, x.layer, unnest(range(len(x.routed))), unnest(x.routed), unnest(x.dropped)
FROM _stage SEMI JOIN _acc USING (lineno) WHERE x IS NOT NULL
"""

_STRUCT_KEY_RE = re.compile(r"^[A-Za-z0-9_./+@=-]{1,128}$")  # safe inside SQL and JSON literals, no ':'
_PLACEHOLDER_KEYS = ["__observatory_no_struct__"]  # a struct no real line matches: everything takes the MAP


def _metric_keys(data: bytes) -> list[str]:
    """Metric names of the chunk's first metrics line, when they are plain enough for the STRUCT path."""
    i = data.find(b'"kind":"metrics"')
    if i < 0:
        return _PLACEHOLDER_KEYS
    start = data.rfind(b"\n", 0, i) + 1
    end = data.find(b"\n", i)
    try:
        keys = list(json.loads(data[start:end])["data"])
    except (ValueError, KeyError, TypeError):
        return _PLACEHOLDER_KEYS
    if not keys or len(keys) > 2000 or not all(_STRUCT_KEY_RE.match(k) for k in keys):
        return _PLACEHOLDER_KEYS
    return keys


def _stage_sql(keys: list[str]) -> tuple[str, str]:
    struct = json.dumps(dict.fromkeys(keys, "DOUBLE"), separators=(",", ":"))
    stage = _STAGE_SQL.replace("{n_keys}", str(len(keys))).replace("{struct}", struct)
    names = "[" + ", ".join(f"'{k}'" for k in keys) + "]"
    values = "[" + ", ".join(f'ms."{k}"' for k in keys) + "]"
    return stage, _INSERT_FAST_METRICS_STRUCT.replace("{names}", names).replace("{values}", values)


def _lines_table(data: bytes, base_line: int) -> tuple[pa.Table, np.ndarray]:
    """(lineno, line) with the lines of `data` as a zero-copy Arrow column; also the line offsets."""
    nl = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    offs = np.empty(len(nl) + 1, np.int64)
    offs[0] = 0
    offs[1:] = nl + 1
    lines = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(nl), [None, pa.py_buffer(offs), pa.py_buffer(data)])
    lineno = pa.array(np.arange(base_line + 1, base_line + 1 + len(nl), dtype=np.int64))
    return pa.table({"lineno": lineno, "line": lines}), offs


# --------------------------------------------------------------- a batch


class _Batch:
    """Everything one transaction adds, gathered in Python lists and staged Arrow tables."""

    def __init__(self, now: float):
        self.now = now
        self.rejected: list[tuple] = []  # (file, run, line, field, reason, raw, ingested_at)
        self.events: list[tuple] = []  # (run, host, seq, kind, step, t, v, known, data_json)
        self.metrics: dict[str, list] = {k: [] for k in ("run", "step", "name", "value", "t", "host")}
        self.experts: dict[str, list] = {k: [] for k in ("run", "step", "layer", "expert", "routed", "dropped")}
        self.lifecycle: list[dict] = []  # run_start / run_end events, applied to `runs`
        self.activity: dict[str, list] = {}  # run -> [max t, max step]
        self.touched: dict[str, set[str]] = {"metrics": set(), "expert_load": set()}
        self.messages: list[str] = []
        self.n_events = self.n_metric_values = self.n_expert_rows = 0
        self.n_duplicates = self.n_truncated = 0
        self.n_bytes = self.n_files = 0
        self.n_fast = 0  # events accepted by the vectorised fast path

    def reject(self, lf: LogFile, line: int, fld: str | None, reason: str, raw: bytes | str) -> None:
        if isinstance(raw, bytes):
            raw = raw[:RAW_CAP].decode("utf-8", "replace")
        self.rejected.append((lf.rel, lf.run, line, fld, reason, raw[:RAW_CAP], self.now))
        if len(self.messages) < MESSAGE_LIMIT:
            self.messages.append(f"{lf.path}:{line}: {reason}")

    def saw(self, run: str, t: float | None, step: int | None) -> None:
        a = self.activity.setdefault(run, [None, None])
        if t is not None and not math.isnan(t) and (a[0] is None or t > a[0]):
            a[0] = t
        if step is not None and (a[1] is None or step > a[1]):
            a[1] = step


class _FileState:
    """A file's row of `ingest_files`, plus the seq ranges of its (run, host) siblings."""

    def __init__(self, row: dict | None, lf: LogFile, sibling_ranges: list[tuple[int, int]]):
        row = row or {}
        self.offset = row.get("byte_offset") or 0
        self.line = row.get("line") or 0
        self.first_seq = row.get("first_seq")
        self.last_seq = row.get("last_seq")
        self.cursor = row.get("cursor_seq")
        self.siblings = sibling_ranges
        if self.offset > (lf.size if not lf.gz else math.inf) or (lf.gz and row and row.get("size") != lf.size):
            # the file shrank or was replaced: read it again; seqs already stored count as duplicates
            if self.first_seq is not None:
                self.siblings = [*self.siblings, (self.first_seq, self.last_seq)]
            self.offset = self.line = 0
            self.cursor = None

    def check_seq(self, seq: int) -> str | None:
        """None to accept; "dup" for an already stored event; else the rejection reason."""
        if self.cursor is not None and seq <= self.cursor:
            return f"seq {seq} is not above the previous seq {self.cursor} in this file"
        self.cursor = seq
        for lo, hi in self.siblings:
            if lo <= seq <= hi:
                return "dup"
        self.first_seq = seq if self.first_seq is None else min(self.first_seq, seq)
        self.last_seq = seq if self.last_seq is None else max(self.last_seq, seq)
        return None


def _slow_line(b: _Batch, lf: LogFile, st: _FileState, lineno: int, raw: bytes) -> None:
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
    try:
        validate_event(ev, run_folder=lf.run, host=lf.host)
        _check_store_ranges(ev)
    except ValidationError as e:
        b.reject(lf, lineno, e.field, f"{e.field}: {e.reason}", raw)
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
    b.saw(run, t, step)
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
    else:
        dj = json.dumps(encode_value(data), separators=(",", ":"))
        b.events.append((run, lf.host, ev["seq"], kind, step, t, ev["v"], kind in KINDS, dj))
        if kind in ("run_start", "run_end"):
            b.lifecycle.append({"run": run, "kind": kind, "t": t, "step": step, "data": data})


def _check_store_ranges(ev: dict) -> None:
    """Values valid JSON and valid events can still overflow a store column; say which."""
    if ev["seq"] > I64:
        raise ValidationError("seq", f"seq {ev['seq']} does not fit a 64-bit integer")
    step = ev.get("step")
    if step is not None and step > (I32 if ev["kind"] == "expert_load" else I64):
        raise ValidationError("step", f"step {step} is too large for the store")
    if ev["host"] > U16:
        raise ValidationError("host", f"host {ev['host']} is above {U16}")
    if ev["kind"] == "expert_load":
        d = ev["data"]
        if step is None:
            raise ValidationError("step", "expert_load needs a step")
        if d["layer"] > U16 or len(d["routed"]) > U16 + 1:
            raise ValidationError("data.layer", f"at most {U16 + 1} layers and experts")
        if any(v > U32 for v in d["routed"]) or any(v > U32 for v in d["dropped"]):
            raise ValidationError("data.routed", f"counts must be below {U32 + 1}")


def _ingest_chunk(con, b: _Batch, lf: LogFile, st: _FileState, ch: _Chunk, max_line: int) -> None:
    """Validate and stage one chunk of complete lines from one file."""
    base = st.line
    if not ch.data:
        for _, n, head in ch.oversized:
            b.reject(lf, base + 1, "(line)", f"line is {n} bytes, over max_line_bytes={max_line}", head)
        st.line += len(ch.oversized)
        st.offset = ch.end
        return
    tbl, offs = _lines_table(ch.data, base)
    n = tbl.num_rows
    lengths = np.diff(offs)
    big = lengths > max_line + 1
    try:
        tbl = tbl.set_column(1, "line", tbl.column("line").cast(pa.large_string()))  # validates UTF-8
    except pa.ArrowInvalid:
        big |= np.array([not _is_utf8(ch.data[offs[i] : offs[i + 1]]) for i in range(n)])
    if big.any():
        # oversized and non-UTF-8 lines take the slow path (which rejects them); the rest is staged
        keep = pa.array(~big)
        tbl = tbl.filter(keep)
        tbl = tbl.set_column(1, "line", tbl.column("line").cast(pa.large_string()))
    con.register("_lines", tbl)
    stage_sql, insert_struct = _stage_sql(_metric_keys(ch.data))
    con.execute(stage_sql, {"run": json.dumps(lf.run), "host": str(lf.host)})
    con.unregister("_lines")
    staged = con.execute("SELECT lineno, seq, ok FROM _stage ORDER BY lineno").fetchnumpy()
    ok_of = dict.fromkeys(staged["lineno"][staged["ok"]].tolist())
    seq_of = dict(zip(staged["lineno"].tolist(), staged["seq"].tolist(), strict=True)) if ok_of else {}
    accepted: list[int] = []
    for i in range(n):
        lineno = base + 1 + i
        if lineno in ok_of:
            verdict = st.check_seq(seq_of[lineno])
            if verdict is None:
                accepted.append(lineno)
            elif verdict == "dup":
                b.n_duplicates += 1
            else:
                b.reject(lf, lineno, "seq", verdict, ch.data[offs[i] : min(offs[i + 1] - 1, offs[i] + RAW_CAP)])
        elif big[i] and lengths[i] > max_line + 1:
            raw = ch.data[offs[i] : offs[i] + RAW_CAP]
            b.reject(lf, lineno, "(line)", f"line is {lengths[i] - 1} bytes, over max_line_bytes={max_line}", raw)
        else:
            _slow_line(b, lf, st, lineno, ch.data[offs[i] : offs[i + 1] - 1])
    if accepted:
        con.register("_acc", pa.table({"lineno": pa.array(accepted, pa.int64())}))
        params = {"run": lf.run, "host": lf.host}
        n_metric = con.execute(insert_struct, params).fetchall()[0][0]
        n_metric += con.execute(_INSERT_FAST_METRICS_MAP, params).fetchall()[0][0]
        n_expert = con.execute(_INSERT_FAST_EXPERTS, {"run": lf.run}).fetchall()[0][0]
        t_max, step_max = con.execute("SELECT max(t), max(step) FROM _stage SEMI JOIN _acc USING (lineno)").fetchall()[0]
        con.unregister("_acc")
        b.n_events += len(accepted)
        b.n_fast += len(accepted)
        b.n_metric_values += n_metric
        b.n_expert_rows += n_expert
        b.saw(lf.run, t_max, step_max)
        if n_metric:
            b.touched["metrics"].add(lf.run)
        if n_expert:
            b.touched["expert_load"].add(lf.run)
    st.line += n
    st.offset = ch.end


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


# ------------------------------------------------------------------ writing


def _flush(con, b: _Batch) -> None:
    """Bulk-append everything slow-path lines produced."""
    m = b.metrics
    if m["run"]:
        con.register(
            "_m",
            pa.table(
                {
                    "run": pa.array(m["run"], pa.string()),
                    "step": pa.array(m["step"], pa.int64()),
                    "name": pa.array(m["name"], pa.string()),
                    "value": pa.array(m["value"], pa.float64()),
                    "t": pa.array(m["t"], pa.float64()),
                    "host": pa.array(m["host"], pa.uint16()),
                }
            ),
        )
        con.execute("INSERT INTO metrics SELECT * FROM _m")
        con.unregister("_m")
    x = b.experts
    if x["run"]:
        con.register(
            "_x",
            pa.table(
                {
                    "run": pa.array(x["run"], pa.string()),
                    "step": pa.array(x["step"], pa.int32()),
                    "layer": pa.array(x["layer"], pa.uint16()),
                    "expert": pa.array(x["expert"], pa.uint16()),
                    "routed": pa.array(x["routed"], pa.uint32()),
                    "dropped": pa.array(x["dropped"], pa.uint32()),
                }
            ),
        )
        con.execute("INSERT INTO expert_load SELECT * FROM _x")
        con.unregister("_x")
    if b.events:
        cols = list(zip(*b.events, strict=True))
        names = ("run", "host", "seq", "kind", "step", "t", "v", "known", "data")
        types = (pa.string(), pa.uint16(), pa.int64(), pa.string(), pa.int64(), pa.float64(), pa.uint16(), pa.bool_(), pa.string())
        con.register("_e", pa.table({k: pa.array(c, t) for k, c, t in zip(names, cols, types, strict=True)}))
        con.execute("INSERT INTO events SELECT run, host, seq, kind, step, t, v, known, data::JSON FROM _e")
        con.unregister("_e")
    if b.rejected:
        con.executemany(
            "INSERT INTO rejected_events (file, run, line, field, reason, raw, ingested_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
            b.rejected,
        )


_RUN_COLS = (
    "run", "name", "status", "start_time", "end_time", "last_event_t", "last_step", "final_step",
    "parent_run", "parent_step", "ladder_name", "ladder_rung", "ladder", "config", "tags", "code", "data", "mesh", "model",
)  # fmt: skip
_JSON_COLS = ("ladder", "config", "code", "data", "mesh", "model")


def _update_runs(con, b: _Batch) -> None:
    """Fold this batch's lifecycle events and activity into `runs` (one row per touched run)."""
    touched = sorted(set(b.activity) | {e["run"] for e in b.lifecycle})
    if not touched:
        return
    rows = con.execute(f"SELECT {', '.join(_RUN_COLS)} FROM runs WHERE run IN (SELECT unnest($r))", {"r": touched}).fetchall()
    existing = {r[0]: dict(zip(_RUN_COLS, r, strict=True)) for r in rows}
    out = []
    for run in touched:
        r = existing.get(run) or dict.fromkeys(_RUN_COLS)
        r["run"] = run
        for c in _JSON_COLS:
            if isinstance(r[c], str):
                r[c] = json.loads(r[c])
        if r["status"] in (None, "crashed"):
            r["status"] = "running"  # new events from a run shown as crashed: it is alive after all
        for e in sorted((e for e in b.lifecycle if e["run"] == run), key=lambda e: e["t"]):
            d = e["data"]
            if e["kind"] == "run_start":
                if r["end_time"] is not None and e["t"] >= r["end_time"]:
                    r["status"], r["end_time"], r["final_step"] = "running", None, None  # resumed
                r["start_time"] = e["t"] if r["start_time"] is None else min(r["start_time"], e["t"])
                for key in ("name", "config", "ladder", "code", "data", "mesh", "model", "tags"):
                    if d.get(key) is not None:
                        r[key] = d[key]
                parent = d.get("parent") or {}
                if isinstance(parent, dict) and parent.get("run") is not None:
                    r["parent_run"], r["parent_step"] = str(parent["run"]), _int_or_none(parent.get("step"))
                ladder = d.get("ladder") or {}
                if isinstance(ladder, dict) and ladder:
                    r["ladder_name"] = _str_or_none(ladder.get("name"))
                    r["ladder_rung"] = _str_or_none(ladder.get("rung"))
            elif r["end_time"] is None or e["t"] >= r["end_time"]:  # run_end
                r["status"], r["end_time"] = d["status"], e["t"]
                r["final_step"] = _int_or_none(d.get("final_step"))
                if r["final_step"] is None:
                    r["final_step"] = r["last_step"]
        t, step = b.activity.get(run, (None, None))
        if t is not None and (r["last_event_t"] is None or t > r["last_event_t"]):
            r["last_event_t"] = t
        if step is not None and (r["last_step"] is None or step > r["last_step"]):
            r["last_step"] = step
        if r["name"] is None:
            r["name"] = run
        for c in _JSON_COLS:
            r[c] = None if r[c] is None else json.dumps(encode_value(r[c]))
        out.append(tuple(r[c] for c in _RUN_COLS))
    placeholders = ", ".join("?::JSON" if c in _JSON_COLS else "?" for c in _RUN_COLS)
    con.executemany(f"INSERT OR REPLACE INTO runs ({', '.join(_RUN_COLS)}) VALUES ({placeholders})", out)


def _int_or_none(x: Any) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and abs(x) <= I64 else None


def _str_or_none(x: Any) -> str | None:
    return None if x is None else str(x)


def _mark_crashed(con, now: float) -> None:
    con.execute(
        "UPDATE runs SET status = 'crashed' WHERE status = 'running' AND last_event_t < $cut",
        {"cut": now - settings.get("stale_after_s")},
    )


# --------------------------------------------------------------- the passes


def _optional_module(name: str):
    """observatory.<name> if that module exists (another engineer's hook), else None."""
    try:
        return importlib.import_module(f"observatory.{name}")
    except ModuleNotFoundError as e:
        if e.name == f"observatory.{name}":
            return None
        raise


def _load_state(con) -> tuple[dict[str, dict], dict[str, str]]:
    cols = ("path", "run", "host", "byte_offset", "line", "first_seq", "last_seq", "cursor_seq", "size", "mtime")
    rows = {r[0]: dict(zip(cols, r, strict=True)) for r in con.execute(f"SELECT {', '.join(cols)} FROM ingest_files").fetchall()}
    status = dict(con.execute("SELECT run, status FROM runs").fetchall())
    return rows, status


def _has_work(lf: LogFile, row: dict | None) -> bool:
    if row is None:
        return True
    if lf.gz:
        return row["size"] != lf.size or row["mtime"] != lf.mtime
    return lf.size != row["byte_offset"]


def _siblings(lf: LogFile, rows: dict[str, dict]) -> list[tuple[int, int]]:
    return [
        (r["first_seq"], r["last_seq"])
        for path, r in rows.items()
        if path != lf.rel and r["run"] == lf.run and r["host"] == lf.host and r["first_seq"] is not None
    ]


def _process_file(con, b: _Batch, lf: LogFile, st: _FileState, budget: int, ended: bool, max_line: int) -> tuple[int, bool]:
    """Ingest from `st.offset` until EOF or `budget` bytes; returns (bytes consumed, reached EOF)."""
    read_size = max(GZ_BATCH_BYTES if lf.gz else budget, max_line + 2)
    used = 0
    while used < budget:
        start = st.offset
        ch = _read_chunk(lf, start, read_size, max_line)
        if ch.error and ch.transient:
            b.messages.append(f"{lf.path}: {ch.error}; will retry")
            return used, False
        if ch.error:
            b.reject(lf, st.line + 1, "(file)", ch.error, b"")
            return used, True
        if ch.data or ch.oversized:
            _ingest_chunk(con, b, lf, st, ch, max_line)
        used += ch.end - start
        if ch.eof:
            if ch.tail_len and (ended or _ended_in_batch(b, lf.run)):
                what = f"a {ch.tail_len}-byte final line" if ch.tail_len <= max_line else "an oversized final line"
                b.reject(lf, st.line + 1, "(line)", f"truncated: {what} has no newline (the writer died mid-line)", ch.tail)
                b.n_truncated += 1
                st.offset += ch.tail_len
                st.line += 1
            return used, True
        if ch.end == start:
            break
    return used, False


def _ended_in_batch(b: _Batch, run: str) -> bool:
    last = [e["kind"] for e in b.lifecycle if e["run"] == run]
    return bool(last) and last[-1] == "run_end"


def _save_file(con, lf: LogFile, st: _FileState, done: bool) -> None:
    size = lf.size if (done or not lf.gz) else None  # a .gz counts as read only when read to its end
    con.execute(
        "INSERT OR REPLACE INTO ingest_files VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (lf.rel, lf.run, lf.host, st.offset, st.line, st.first_seq, st.last_seq, st.cursor, size, lf.mtime),
    )


def _run_batch(db: Path, files: list[LogFile], only: str | None, use_rollups: bool) -> tuple[_Batch | None, bool]:
    """One write transaction over files with work. Returns (batch or None if idle, more work left)."""
    rollups = _optional_module("rollups") if use_rollups else None
    now = time.time()
    stale = settings.get("stale_after_s")
    max_line = int(settings.get("max_line_bytes"))
    with store.write_connection(db) as con:
        con.execute("SET enable_progress_bar = false")
        if (str(db), _db_sig(db)) not in _ENSURED or not _has_schema(con):
            store.ensure_schema(con)  # DDL costs ~0.1 s a batch; once per store file is enough
            _ENSURED.add((str(db), _db_sig(db)))
        con.execute("BEGIN TRANSACTION")
        try:
            rows, status = _load_state(con)
            b = _Batch(now)
            used, more, did = 0, False, False
            for lf in files:
                if (only is not None and lf.rel != only) or not _has_work(lf, rows.get(lf.rel)):
                    continue
                if used >= BATCH_BYTES:
                    more = True
                    break
                st = _FileState(rows.get(lf.rel), lf, _siblings(lf, rows))
                ended = lf.gz or status.get(lf.run) in STATUSES or now - lf.mtime > stale
                n, done = _process_file(con, b, lf, st, BATCH_BYTES - used, ended, max_line)
                used += n
                b.n_bytes += n
                b.n_files += 1
                _save_file(con, lf, st, done)
                rows[lf.rel] = {"run": lf.run, "host": lf.host, "first_seq": st.first_seq, "last_seq": st.last_seq}
                did = True
                if used >= BATCH_BYTES:
                    more = True
            if not did:
                con.execute("ROLLBACK")
                return None, False
            _flush(con, b)
            _update_runs(con, b)
            _mark_crashed(con, now)
            if rollups is not None and (b.touched["metrics"] or b.touched["expert_load"]):
                rollups.after_ingest(con, b.touched)
            con.execute("COMMIT")
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except Exception:
                pass
            raise
    return b, more


def _has_schema(con) -> bool:
    import duckdb

    try:
        con.execute("SELECT 1 FROM ingest_files LIMIT 0").fetchall()
        return True
    except duckdb.CatalogException:
        return False


_ENSURED: set = set()  # (inode, device) of store files whose schema this process made sure of


class _Follower:
    """State kept between passes of one `ingest` call."""

    def __init__(self):
        self.sig: Any = None
        self.skip: set[str] = set()
        self.use_rollups = True
        self.last_crash_check = 0.0


def _db_sig(db: Path) -> Any:
    try:
        st = db.stat()
        return (st.st_ino, st.st_dev)
    except FileNotFoundError:
        return None


def _one_pass(runs_dir: Path, db: Path, report: IngestReport, fol: _Follower, hooks: bool, emit: Callable[[str], None]) -> None:
    files = [lf for lf in scan(runs_dir) if lf.rel not in fol.skip]
    sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in files), _db_sig(db))
    now = time.time()
    if sig == fol.sig and now - fol.last_crash_check < min(5.0, settings.get("stale_after_s") / 4):
        return  # nothing changed on disk: do not even take the lock
    fol.last_crash_check = now
    only: str | None = None
    queue = None  # set when isolating files after a failure
    while True:
        try:
            b, more = _run_batch(db, files, only, fol.use_rollups and hooks)
        except store.StoreBusy as e:
            emit(f"{db}: {e}; will retry")
            return
        except Exception as e:
            if fol.use_rollups and hooks and _from_module(e, "observatory.rollups"):
                emit(f"observatory ingest: rollups.after_ingest failed ({type(e).__name__}: {e}); "
                     "ingesting without rollups from now on")  # fmt: skip
                fol.use_rollups = False
                continue
            if only is not None:
                emit(f"{runs_dir / only}: cannot ingest ({type(e).__name__}: {e}); skipped until the next ingest")
                fol.skip.add(only)
                files = [lf for lf in files if lf.rel != only]
            queue = [lf.rel for lf in files] if queue is None else [r for r in queue if r != only]
            only = queue[0] if queue else None
            if only is None:
                break
            continue
        if b is None:
            if queue:
                queue.pop(0)
                only = queue[0] if queue else None
                if only is not None:
                    continue
            break
        report.events += b.n_events
        report.metric_values += b.n_metric_values
        report.expert_rows += b.n_expert_rows
        report.rejected += len(b.rejected)
        report.duplicates += b.n_duplicates
        report.truncated += b.n_truncated
        report.runs |= set(b.activity)
        report.files += b.n_files
        report.fast_events += b.n_fast
        report.bytes += b.n_bytes
        for msg in b.messages:
            emit(msg)
        if len(report.messages) < MESSAGE_LIMIT:
            report.messages.extend(b.messages[: MESSAGE_LIMIT - len(report.messages)])
        if hooks and b.activity:
            _anomaly_hook(db, runs_dir, set(b.activity), emit)
        if not more and queue is None:
            break
        time.sleep(0.02)  # let readers waiting at the gate in between two batches
    fol.sig = (tuple((lf.rel, lf.size, lf.mtime) for lf in scan(runs_dir) if lf.rel not in fol.skip), _db_sig(db))


def _from_module(e: BaseException, module: str) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_globals.get("__name__") == module:
            return True
        tb = tb.tb_next
    return False


def _anomaly_hook(db: Path, runs_dir: Path, runs: set[str], emit: Callable[[str], None]) -> None:
    try:
        anomalies = _optional_module("anomalies")
        if anomalies is not None:
            anomalies.after_ingest(db, runs_dir, runs)
    except Exception as e:  # a detector must never take ingest down
        emit(f"observatory ingest: anomalies.after_ingest failed: {type(e).__name__}: {e}")


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def ingest(
    runs_dir: str | os.PathLike | None = None,
    db: str | os.PathLike | None = None,
    follow: bool = False,
    stop_event: threading.Event | None = None,
    *,
    hooks: bool = True,
    emit: Callable[[str], None] | None = _stderr,
) -> IngestReport:
    """Load every event log under `runs_dir` into the store `db`; return what happened.

    Incremental and exactly-once: a second call adds only what was appended since.
    With `follow`, keep polling every `follow_interval_s` until `stop_event` is set
    or SIGINT/SIGTERM arrives (when called from the main thread). `emit` receives
    each `file:line: reason` message (default: stderr; None to stay quiet).
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    emit = emit or (lambda _msg: None)
    report = IngestReport()
    fol = _Follower()
    t0 = time.perf_counter()
    stop = stop_event or threading.Event()
    old: dict[int, Any] = {}
    if follow and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            old[sig] = signal.signal(sig, lambda *_: stop.set())
    if not runs_dir.is_dir():
        emit(f"{runs_dir}: runs dir does not exist{' (yet); waiting for it' if follow else ''}")
    try:
        while True:
            _one_pass(runs_dir, db, report, fol, hooks, emit)
            report.passes += 1
            if not follow or stop.wait(settings.get("follow_interval_s")):
                break
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
        report.seconds = time.perf_counter() - t0
    return report


def rebuild(runs_dir: str | os.PathLike | None = None, db: str | os.PathLike | None = None, *,
            emit: Callable[[str], None] | None = _stderr) -> IngestReport:  # fmt: skip
    """Recreate the store from the event logs: build a fresh file beside it, then swap it in atomically.

    Readers see the old store until the swap and the new one after; neither half-built.
    Rollups are rebuilt with it; the anomaly hook is not run (its findings are already events).
    """
    runs_dir = Path(runs_dir) if runs_dir is not None else store.default_runs_dir()
    db = Path(db) if db is not None else store.default_db()
    db.parent.mkdir(parents=True, exist_ok=True)
    tmp = db.with_name(f"{db.name}.rebuild-{os.getpid()}")
    for p in (tmp, tmp.with_name(tmp.name + ".wal")):
        p.unlink(missing_ok=True)
    try:
        report = ingest(runs_dir, tmp, hooks=False, emit=emit)
        rollups = _optional_module("rollups")
        if rollups is not None and hasattr(rollups, "rebuild_rollups"):
            with store.write_connection(tmp) as con:
                con.execute("BEGIN TRANSACTION")
                rollups.rebuild_rollups(con)
                con.execute("COMMIT")
        with store.write_connection(db) as con:  # hold the store's locks: nobody opens it mid-swap
            con.duckdb.close()
            os.replace(tmp, db)
            db.with_name(db.name + ".wal").unlink(missing_ok=True)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + ".wal"), tmp.with_name(tmp.name + ".gate"), tmp.with_name(tmp.name + ".lock")):
            p.unlink(missing_ok=True)
    return report
