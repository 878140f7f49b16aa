"""The msgspec path: a chunk of metrics / expert_load lines decoded in one call, appended as Arrow columns.

`ingest_chunk` stands in for `ingest_lines._ingest_chunk` and gives the same store,
line for line. It cuts the chunk into pieces of ~`PIECE_BYTES` complete lines and,
for each piece:

1. checks the bytes: UTF-8, no line over `max_line_bytes`; lines that do not start
   with `{` and end with `}` (blank, torn, junk) go to the slow path one by one;
2. decodes the other lines with one `msgspec` `decode_lines` call into typed
   Structs (a tagged union on `kind`); msgspec is strict (no bool for int, no
   float for int, no NaN literals, no strings for numbers), so a decode error means
   "something unusual here": the whole piece goes to the existing path
   (`_ingest_chunk`: DuckDB staging + `validate_event`), which decides it;
3. certifies each decoded event with the checks `validate_event` and the store's
   ranges would make (v, run == folder, host == file's host, step/seq ranges,
   finite t and values, no empty name, routed/dropped shapes); an event that fails,
   and every event of another kind, goes to `_slow_line` -- validate_event decides;
4. checks seqs in file order exactly as the old path does (`_FileState`), builds
   numpy/Arrow columns (metric names dictionary-encoded) and INSERTs them, on a
   worker thread while the next piece decodes (DuckDB releases the GIL).

Why a decoded line is one line: every line given to msgspec starts with `{` and
ends with `}`, and `}` <newline> `{` is a syntax error inside any JSON container,
so no value can span two lines; with as many values as lines, each line holds
exactly one.

`ENABLED = False` forces the old path (the differential test compares the two).
"""

from __future__ import annotations

import itertools
import math
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Annotated, Union

import numpy as np
import pyarrow as pa

from observatory.events import KINDS, RUN_ID_RE
from observatory.ingest_lines import (
    I32,
    I64,
    RAW_CAP,
    U16,
    U32,
    LogFile,
    _Batch,
    _Chunk,
    _FileState,
    _ingest_chunk,
    _slow_line,
)

try:  # optional: without msgspec every chunk takes the old path
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a declared dependency
    msgspec = None

__all__ = ["ENABLED", "PIECE_BYTES", "ingest_chunk"]

ENABLED = True  # False: every chunk takes ingest_lines._ingest_chunk (the reference)
PIECE_BYTES = 4 << 20  # bytes decoded per step; the previous piece's INSERT overlaps the next decode

_LBRACE, _RBRACE, _CR, _NL = ord("{"), ord("}"), ord("\r"), ord("\n")

if msgspec is not None:
    from msgspec import Meta, Struct

    class _ExpertData(Struct):
        layer: Annotated[int, Meta(ge=0, le=U16)]
        # the JSON text of the lists, parsed in bulk by `_int_lists` (msgspec still checks the syntax):
        # 2 x 64 Python ints per event would cost as much as decoding the rest of the line
        routed: msgspec.Raw
        dropped: msgspec.Raw

    class _Metrics(Struct, tag_field="kind", tag="metrics"):
        v: int
        run: str
        t: float
        host: int
        seq: int
        data: dict[str, float]  # (K,) name -> value; duplicate keys: the last wins, as in json.loads
        step: int | None = None

    class _Expert(Struct, tag_field="kind", tag="expert_load"):
        v: int
        run: str
        t: float
        host: int
        seq: int
        data: _ExpertData
        step: int | None = None

    # every other known kind: decoded to nothing (fields skipped, JSON still checked), sent to _slow_line
    _OTHERS = tuple(
        msgspec.defstruct(f"_Other_{k}", [], tag_field="kind", tag=k) for k in KINDS if k not in ("metrics", "expert_load")
    )
    _DECODER = msgspec.json.Decoder(Union[(_Metrics, _Expert, *_OTHERS)])  # noqa: UP007 (a built union)
    _DECODE_ERRORS: tuple = (msgspec.MsgspecError, RecursionError)


def ingest_chunk(con, b: _Batch, lf: LogFile, st: _FileState, ch: _Chunk, max_line: int) -> None:
    """Validate and stage one chunk of complete lines from one file: same effect as `_ingest_chunk`."""
    if not ENABLED or msgspec is None or not ch.data or not RUN_ID_RE.match(lf.run) or lf.host > U16:
        _ingest_chunk(con, b, lf, st, ch, max_line)
        return
    data = ch.data
    offset0 = ch.end - len(data)
    pieces, pos = [], 0
    while pos < len(data):
        end = data.rfind(b"\n", pos, pos + PIECE_BYTES)
        if end < 0:  # one line longer than a piece
            end = data.find(b"\n", pos + PIECE_BYTES)
        pieces.append((pos, end + 1))
        pos = end + 1
    pool = ThreadPoolExecutor(1, thread_name_prefix="observatory-ingest") if len(pieces) > 1 else None
    pending: Future | None = None
    try:
        for lo, hi in pieces:
            piece = data[lo:hi]
            plan = _plan(piece, lf, max_line)
            if plan is None:
                _wait(pending)
                pending = None
                _ingest_chunk(con, b, lf, st, _Chunk(piece, offset0 + hi, [], b"", 0, False), max_line)
                continue
            tables = _apply(b, lf, st, piece, plan)
            st.offset = offset0 + hi
            _wait(pending)
            pending = None
            if tables is not None:
                if pool is None:
                    _insert(con, lf, *tables)
                else:
                    pending = pool.submit(_insert, con, lf, *tables)
        _wait(pending)
        pending = None
    finally:
        if pending is not None:  # an error is on its way out: let the INSERT finish before the rollback
            try:
                pending.result()
            except Exception:
                pass
        if pool is not None:
            pool.shutdown(wait=True)


def _wait(f: Future | None) -> None:
    if f is not None:
        f.result()


class _Plan:
    """One piece decoded: per line its event (None: slow path) and where the line is."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray, events: list):
        self.starts = starts  # (L,) offset of each line in the piece
        self.ends = ends  # (L,) offset of its newline
        self.events = events  # (L,) _Metrics / _Expert certified by _certify, else None


def _plan(piece: bytes, lf: LogFile, max_line: int) -> _Plan | None:
    """Decode a piece; None when the old path must take all of it."""
    if not piece.isascii():
        try:
            piece.decode("utf-8")  # msgspec does not check UTF-8 inside fields it skips; json.loads would
        except UnicodeDecodeError:
            return None
    arr = np.frombuffer(piece, np.uint8)
    ends = np.flatnonzero(arr == _NL)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if int((ends - starts).max()) > max_line:
        return None  # the old path rejects oversized lines by length
    last = arr[ends - 1]
    shaped = (arr[starts] == _LBRACE) & ((last == _RBRACE) | ((last == _CR) & (arr[ends - 2] == _RBRACE)))
    good = np.flatnonzero(shaped)
    if len(good) < len(ends) // 2:
        return None  # mostly not event lines: nothing to gain
    if len(good) == len(ends):
        text = piece
    else:
        text = b"".join(piece[s : e + 1] for s, e in zip(starts[good].tolist(), ends[good].tolist(), strict=True))
    try:
        decoded = _DECODER.decode_lines(text)
    except _DECODE_ERRORS:
        return None
    if len(decoded) != len(good):
        return None  # cannot happen for lines shaped {...} (see the module docstring); be safe anyway
    events: list = [None] * len(ends)
    run, host = lf.run, lf.host
    for i, e in zip(good.tolist(), decoded, strict=True):
        c = e.__class__
        if c is _Metrics:
            step = e.step
            if (e.v == 1 and e.run == run and e.host == host and step is not None and 0 <= step <= I64
                    and 0 <= e.seq <= I64 and -math.inf < e.t < math.inf):  # fmt: skip
                events[i] = e
        elif c is _Expert:
            step = e.step
            if (e.v == 1 and e.run == run and e.host == host and step is not None and 0 <= step <= I32
                    and 0 <= e.seq <= I64 and -math.inf < e.t < math.inf):  # fmt: skip
                events[i] = e
    return _Plan(starts, ends, events)


def _metric_columns(evs: list) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(E,) events -> (lens (E,), values (N,), names dictionary, codes (N,) into it)."""
    datas = [e.data for e in evs]
    lens = np.fromiter(map(len, datas), np.int64, len(datas))
    n = int(lens.sum())
    values = np.fromiter(itertools.chain.from_iterable(d.values() for d in datas), np.float64, n)
    index: dict[str, int] = {}
    layouts: dict[tuple, np.ndarray] = {}  # a key sequence -> its codes; a chunk usually has a handful
    parts = []
    for d in datas:
        key = tuple(d)
        codes = layouts.get(key)
        if codes is None:
            codes = layouts[key] = np.array([index.setdefault(k, len(index)) for k in key], np.int32)
        parts.append(codes)
    codes = np.concatenate(parts) if parts else np.empty(0, np.int32)
    return lens, values, list(index), codes


def _apply(b: _Batch, lf: LogFile, st: _FileState, piece: bytes, plan: _Plan):
    """Route every line of a decoded piece, in file order; the (metrics, expert_load) tables to insert."""
    events, starts, ends = plan.events, plan.starts, plan.ends
    # payload checks the decoder's types cannot make: finite values, no empty metric name
    m_lines = [i for i, e in enumerate(events) if e is not None and e.__class__ is _Metrics]
    lens, values, names, codes = _metric_columns([events[i] for i in m_lines])
    bad_values = not np.isfinite(values).all()
    if bad_values or "" in names:
        for i in m_lines:
            d = events[i].data
            if "" in d or not all(math.isfinite(v) for v in d.values()):
                events[i] = None  # validate_event decides (nan/inf as JSON numbers, an empty name)
        m_lines = [i for i in m_lines if events[i] is not None]
        lens, values, names, codes = _metric_columns([events[i] for i in m_lines])
    x_lines = [i for i, e in enumerate(events) if e is not None and e.__class__ is _Expert]
    counts = _expert_counts([events[i] for i in x_lines])
    if counts is None:  # some list is odd (spaces, negative, huge, not a list, lengths differ): per event
        for i in x_lines:
            if _expert_counts([events[i]]) is None:
                events[i] = None  # validate_event decides
        x_lines = [i for i in x_lines if events[i] is not None]
        counts = _expert_counts([events[i] for i in x_lines])
        assert counts is not None
    base = st.line
    n = len(events)
    certified = [e is not None for e in events]
    seqs = np.fromiter((e.seq if e is not None else -1 for e in events), np.int64, n)
    if all(certified) and st.accept_all(seqs):
        accepted = np.ones(n, bool)  # the common case: no per-line bookkeeping at all
    else:
        accepted = np.zeros(n, bool)
        for i in range(n):
            lineno = base + 1 + i
            if certified[i]:
                verdict = st.check_seq(int(seqs[i]))
                if verdict is None:
                    accepted[i] = True
                elif verdict == "dup":
                    b.n_duplicates += 1
                else:
                    b.reject(lf, lineno, "seq", verdict, piece[starts[i] : min(ends[i], starts[i] + RAW_CAP)])
            else:
                _slow_line(b, lf, st, lineno, piece[starts[i] : ends[i]])
    st.line += n
    n_acc = int(accepted.sum())
    if not n_acc:
        return None
    acc_idx = np.flatnonzero(accepted).tolist()
    b.n_events += n_acc
    b.n_fast += n_acc
    b.saw(lf.run, max(events[i].t for i in acc_idx), max(events[i].step for i in acc_idx), lf.host)
    mt = _metrics_table(events, m_lines, accepted, lens, values, names, codes)
    xt = _experts_table(events, x_lines, accepted, *counts)
    if mt is not None:
        b.n_metric_values += mt.num_rows
        b.touched["metrics"].add(lf.run)
    if xt is not None:
        b.n_expert_rows += xt.num_rows
        b.touched["expert_load"].add(lf.run)
    return mt, xt


def _metrics_table(events, m_lines, accepted, lens, values, names, codes) -> pa.Table | None:
    """(N,) rows of step, name (dictionary-encoded), value, t for the accepted metrics events."""
    keep = accepted[m_lines] if m_lines else np.zeros(0, bool)
    if not keep.any():
        return None
    steps = np.fromiter((events[i].step for i in m_lines), np.int64, len(m_lines))
    ts = np.fromiter((events[i].t for i in m_lines), np.float64, len(m_lines))
    if not keep.all():
        rows = np.repeat(keep, lens)
        values, codes = values[rows], codes[rows]
        steps, ts, lens = steps[keep], ts[keep], lens[keep]
    if int(lens.sum()) == 0:
        return None  # only empty `data` objects: events, but no values
    name = pa.DictionaryArray.from_arrays(_arrow(codes), _strings(names))
    return pa.table({"step": _arrow(np.repeat(steps, lens)), "name": name, "value": _arrow(values),
                     "t": _arrow(np.repeat(ts, lens))})  # fmt: skip


_COUNT_CHARS = b"0123456789,"


def _int_lists(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """JSON arrays written plainly as `[1,2,3]` (decimal ints <= U32, no spaces): (lens (E,), values (sum,)).

    None when any is not of that form; the caller then checks event by event. The text is
    valid JSON already (msgspec checked it), so digits and commas between `[` and `]` can
    only be a list of non-negative integers.
    """
    if b"".join(r[:1] for r in raws) != b"[" * len(raws) or b"".join(r[-1:] for r in raws) != b"]" * len(raws):
        return None
    inner = [r[1:-1] for r in raws]
    text = b",".join(x for x in inner if x)
    if text.translate(None, _COUNT_CHARS):
        return None
    lens = np.fromiter((x.count(b",") + 1 if x else 0 for x in inner), np.int64, len(inner))
    # strtoll-style parse: a number too long for int64 comes back as 2**63 - 1 (clamped, not wrapped),
    # so every count above U32 shows as one (tests/test_ingest_fast.py has 10**29 in a list)
    values = np.fromstring(text, np.int64, sep=",") if text else np.empty(0, np.int64)
    if len(values) != int(lens.sum()) or (len(values) and int(values.max()) > U32):
        return None
    return lens, values.astype(np.uint32)


def _expert_counts(evs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(lens (E,), routed (R,), dropped (R,)) of expert_load events, or None if some event is not certain."""
    routed = _int_lists([bytes(e.data.routed) for e in evs])
    dropped = _int_lists([bytes(e.data.dropped) for e in evs])
    if routed is None or dropped is None:
        return None
    lens = routed[0]
    if not np.array_equal(lens, dropped[0]) or (len(lens) and int(lens.max()) > U16 + 1):
        return None
    return lens, routed[1], dropped[1]


def _experts_table(events, x_lines, accepted, lens, routed, dropped) -> pa.Table | None:
    """(R,) rows of step, layer, expert, routed, dropped: one per expert of each accepted event."""
    keep = accepted[x_lines] if x_lines else np.zeros(0, bool)
    if not keep.any():
        return None
    steps = np.fromiter((events[i].step for i in x_lines), np.int32, len(x_lines))
    layers = np.fromiter((events[i].data.layer for i in x_lines), np.uint16, len(x_lines))
    if not keep.all():
        rows = np.repeat(keep, lens)
        routed, dropped = routed[rows], dropped[rows]
        steps, layers, lens = steps[keep], layers[keep], lens[keep]
    r = int(lens.sum())
    if r == 0:
        return None  # only empty lists: events, but no rows
    first = np.repeat(np.cumsum(lens) - lens, lens)  # (R,) row index of each row's event's first expert
    cols = {
        "step": np.repeat(steps, lens),
        "layer": np.repeat(layers, lens),
        "expert": (np.arange(r, dtype=np.int64) - first).astype(np.uint16),
        "routed": routed,
        "dropped": dropped,
    }
    return pa.table({k: _arrow(v) for k, v in cols.items()})


def _strings(names: list[str]) -> pa.Array:
    """An Arrow string array built from buffers (`pa.array` would import pandas: ~0.5 s, once)."""
    encoded = [n.encode("utf-8", "surrogatepass") for n in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, encoded), np.int32, len(encoded)), out=offsets[1:])
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def _arrow(a: np.ndarray) -> pa.Array:
    """A zero-copy Arrow array of a 1-D numeric numpy array (not `pa.array`: see `ingest_lines._i64`)."""
    a = np.ascontiguousarray(a)
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [None, pa.py_buffer(a)])


def _insert(con, lf: LogFile, mt: pa.Table | None, xt: pa.Table | None) -> None:
    """Append one piece's rows (runs on the worker thread; DuckDB releases the GIL meanwhile)."""
    if mt is not None:
        con.register("_fast_m", mt)
        con.execute("INSERT INTO metrics SELECT $run, step, name, value, t, $host FROM _fast_m", {"run": lf.run, "host": lf.host})
        con.unregister("_fast_m")
    if xt is not None:
        con.register("_fast_x", xt)
        con.execute("INSERT INTO expert_load SELECT $run, step, layer, expert, routed, dropped FROM _fast_x", {"run": lf.run})
        con.unregister("_fast_x")
