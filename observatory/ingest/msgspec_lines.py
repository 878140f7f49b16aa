"""Validate: a chunk of event lines decoded in one msgspec call, certified in bulk, appended as Arrow columns.

`ingest_chunk` gives the store that `model.check_line` (validate_event and the store's ranges),
judging every line alone, would give, line for line (`ENABLED = False` judges every line so:
the tests' reference). It cuts the chunk into pieces of ~`PIECE_BYTES` complete lines
(`METRICS_PIECE_BYTES` where they are metrics lines) and, for each piece:

1. checks the bytes: UTF-8, no line over `max_line_bytes`; lines that do not start
   with `{` and end with `}` (blank, torn, junk) go to `check_line` one by one;
2. decodes the other lines with one `msgspec` `decode_lines` call into typed
   Structs (a tagged union on `kind`). A metrics line's `data` goes into a `Layout`
   (its metric names as the float fields of a Struct built at run time, learnt from
   the first piece decoded with dict `data`, shared by runs that log the same names):
   the values of a piece come out as one (lines x names) matrix, with no per-value
   Python objects. msgspec is strict (no bool for int, no float for int, no NaN
   literals, no strings for numbers), so a decode error means "something unusual
   here": the piece is decoded again with dicts (new names outgrow the layout), then
   around the odd line, and a line that still does not decode (a "nan" string, say)
   goes to `check_line`; a piece with many such lines goes whole to
   `model.plain_ingest_chunk` (every line by `check_line`);
3. certifies each decoded event by the rules of `observatory.ingest.rules`, the ones
   `check_line` judges by: `rules.certain` for the envelope (version, run == folder,
   host == file's host, the step and seq bounds, a finite t), the rules' bounds for the
   payload (`LAYER` in the decoder's type, `EXPERTS` and `COUNT` over the count lists),
   finite values and no empty name; an event that is not certain, and every event of
   another kind, goes to `check_line` -- validate_event and the rules decide;
4. checks seqs in file order exactly as `check_line` does (`FileState`), builds
   numpy/Arrow columns (run and metric names dictionary-encoded) and holds them for
   one INSERT per `INSERT_ROWS` rows (`ingest.appends`), on the ingester's thread.

Why a decoded line is one line: every line given to msgspec starts with `{` and
ends with `}`, and `}` <newline> `{` is a syntax error inside any JSON container,
so no value can span two lines; with as many values as lines, each line holds
exactly one.

"""

from __future__ import annotations

import functools
import itertools
import math
import re

import numpy as np
import pyarrow as pa

from observatory.events import RUN_ID_RE
from observatory.ingest import rules
from observatory.ingest.layouts import (
    DATA,
    DECODE_ERRORS,
    DECODER,
    LAYOUT_MAX,
    SMALL,
    SMALL_LAYOUT_MAX,
    ExpertLine,
    Layout,
    Layouts,
    MetricsLine,
    astuple,
    msgspec,
)
from observatory.ingest.model import (
    Batch,
    Chunk,
    FileState,
    LogFile,
    check_line,
    plain_ingest_chunk,
    seq_ok,
)
from observatory.store.arrow import column, numeric

__all__ = ["ENABLED", "PIECE_BYTES", "METRICS_PIECE_BYTES", "Layouts", "ingest_chunk", "ingest_small"]

ENABLED = True  # False: every line is judged alone, model.plain_ingest_chunk (the tests' reference)
PIECE_BYTES = 4 << 20  # bytes decoded per step (a piece with expert_load lines)
# ... and a piece of metrics lines alone. Their decoded events (a Struct of ~60 floats a line) of a 4 MB
# piece outgrow the CPU's caches: `_plan` took 0.025 s for a 4 MB piece of the 535b log against 0.003 s
# for 1 MB here, and a catch-up of its 20k steps through the CLI went ~3% faster. expert_load pieces cost
# the same per byte at either size (their count lists stay raw JSON), and 4x as many of them cost their
# per-piece work in rows and INSERTs: that log's ingest took ~20% longer in 1 MB pieces.
METRICS_PIECE_BYTES = 1 << 20
# rows gathered before an INSERT: enough that a sweep's thousands of small files cost a few INSERTs, few
# enough that the decoded rows held in memory stay small (a row group, `store.ROW_GROUP_ROWS`, is 8 of them)
INSERT_ROWS = 1 << 17

_LBRACE, _RBRACE, _CR, _NL = ord("{"), ord("}"), ord("\r"), ord("\n")


def ingest_chunk(con, b: Batch, lf: LogFile, st: FileState, ch: Chunk, max_line: int) -> None:
    """Validate and stage one chunk of complete lines from one file: same effect as `plain_ingest_chunk`.

    The certified rows go to `b.appends`, inserted once `INSERT_ROWS` of them are held, or at the batch's
    end (`b.appends.drain()`)."""
    if (
        not ENABLED
        or msgspec is None
        or not ch.data
        or not RUN_ID_RE.match(lf.run)
        or not rules.HOST.ok(lf.host)
    ):
        plain_ingest_chunk(b, lf, st, ch, max_line)
        return
    if b.layouts is None:
        b.layouts = Layouts()  # a batch of no ingester's (a test's): it learns for itself
    data = ch.data
    offset0 = ch.end - len(data)
    insert = functools.partial(_insert, con)
    for hi, piece, plan in _plans(data, lf, max_line, b.layouts):
        if plan is None:
            plain_ingest_chunk(b, lf, st, Chunk(piece, offset0 + hi, [], b"", 0, False), max_line)
            continue
        tables = _apply(b, lf, st, piece, plan)
        st.offset = offset0 + hi
        if tables is not None:
            b.appends.hold(tables, sum(t.num_rows for t in tables if t is not None), insert, INSERT_ROWS)


def _plans(data: bytes, lf: LogFile, max_line: int, layouts: Layouts):
    """(end in `data`, bytes, _Plan) of each piece of complete lines, in order, cut and decoded when needed:
    `METRICS_PIECE_BYTES` at first and after a piece without expert_load rows, else `PIECE_BYTES`. The
    bytes are one copy out of the chunk (~2-3 ms a 4 MB piece). A process pool does not pay on 2 shared
    cores: a forked decoder measured no faster here, and spawned workers would re-import the caller's
    main script."""
    pos, size = 0, min(PIECE_BYTES, METRICS_PIECE_BYTES)
    while pos < len(data):
        end = data.rfind(b"\n", pos, pos + size)
        if end < 0:  # one line longer than a piece
            end = data.find(b"\n", pos + size)
        piece = data[pos : end + 1]
        plan = _plan(piece, lf.run, lf.host, max_line, layouts)
        yield end + 1, piece, plan
        pos = end + 1
        size = PIECE_BYTES if plan is None or len(plan.x_lens) else min(PIECE_BYTES, METRICS_PIECE_BYTES)


class _Plan:
    """One piece decoded and certified, as arrays.

    Lines are (L,); `cls` says which are certainly valid: 1 metrics, 2 expert_load;
    0 means `check_line` (validate_event) decides. Metric rows (N,) and expert rows (R,)
    are those of the certified events, in line order.
    """

    def __init__(self, starts, ends, cls, seq, step, t, metrics, experts):
        self.starts, self.ends = starts, ends  # (L,) where each line starts; its newline
        self.cls = cls  # (L,) int8
        # (L,) int64, int64, float64; meaningful where cls > 0, but seq also where a line check_line judges
        # decoded with a seq in the store's range (else -1)
        self.seq, self.step, self.t = seq, step, t
        self.m_lens, self.m_values, self.m_names, self.m_codes = metrics  # (M,), (N,), names, (N,) int32
        self.x_lens, self.x_layers, self.x_routed, self.x_dropped = (
            experts  # (X,), (X,) uint16, (R,), (R,) uint32
        )


def _plan(
    piece: bytes,
    run: str | None,
    host: int,
    max_line: int,
    layouts: Layouts,
    lines: tuple[list, list] | None = None,
) -> _Plan | None:
    """Decode and certify a piece; None when `plain_ingest_chunk` must take all of it. `lines`: the piece is
    several files' lines (`ingest_small`), each line's (run, host) in two lists; `run` is SMALL then."""
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
        return None  # plain_ingest_chunk rejects oversized lines by length
    last = arr[ends - 1]
    shaped = (arr[starts] == _LBRACE) & ((last == _RBRACE) | ((last == _CR) & (arr[ends - 2] == _RBRACE)))
    good = np.flatnonzero(shaped)
    if len(good) < len(ends) // 2:
        return None  # mostly not event lines: nothing to gain
    if len(good) == len(ends):
        text = piece
    else:
        text = b"".join(
            piece[s : e + 1] for s, e in zip(starts[good].tolist(), ends[good].tolist(), strict=True)
        )
    decoded = _decode(text, run, layouts)
    if decoded is None:  # some line does not fit the types (a "nan" string, say): decode line by line
        decoded = [
            _decode_line(piece[s : e + 1])
            for s, e in zip(starts[good].tolist(), ends[good].tolist(), strict=True)
        ]
        if sum(e is None for e in decoded) > len(decoded) // 8 + 1:
            return None  # many odd lines: each judged alone
    if len(decoded) != len(good):
        return None  # cannot happen for lines shaped {...} (see the module docstring); be safe anyway
    events: list = [None] * len(ends)  # (L,) the certified events, None for check_line
    judged: list[tuple[int, int]] = []  # (line, seq) of the others decoded with a seq in range
    at = good.tolist()
    if lines is None:
        sure = rules.certain(decoded, run, host)
    else:  # each line's own run and host
        sure = rules.certain(decoded, [lines[0][i] for i in at], [lines[1][i] for i in at])
    seq_lo, seq_hi = rules.SEQ.lo, rules.SEQ.hi
    for i, e, ok in zip(at, decoded, sure, strict=True):
        if ok:
            events[i] = e
        elif e is not None and (s := e.seq).__class__ is int and seq_lo <= s <= seq_hi:
            judged.append((i, s))
    # payload checks the decoder's types cannot make: finite values, no empty metric name, count lists
    m_lines = [i for i, e in enumerate(events) if e is not None and e.__class__.metrics]
    metrics = _metric_columns([events[i] for i in m_lines])
    if not np.isfinite(metrics[1]).all() or "" in metrics[2]:
        for i in m_lines:
            if not _finite_named(events[i].data):
                events[i] = None  # validate_event decides (inf as a JSON number, an empty name)
        m_lines = [i for i in m_lines if events[i] is not None]
        metrics = _metric_columns([events[i] for i in m_lines])
    x_lines = [i for i, e in enumerate(events) if e is not None and e.__class__ is ExpertLine]
    counts = _expert_counts([events[i] for i in x_lines])
    if counts is None:  # some list is odd (spaces, negative, huge, not a list, lengths differ): per event
        for i in x_lines:
            if _expert_counts([events[i]]) is None:
                events[i] = None
        x_lines = [i for i in x_lines if events[i] is not None]
        counts = _expert_counts([events[i] for i in x_lines])
        assert counts is not None
    layers = np.fromiter((events[i].data.layer for i in x_lines), np.uint16, len(x_lines))
    n = len(events)
    cls = np.zeros(n, np.int8)
    cls[m_lines] = 1
    cls[x_lines] = 2
    seq, step, t = np.full(n, -1, np.int64), np.full(n, -1, np.int64), np.full(n, math.nan)
    if judged:
        at, seqs = zip(*judged, strict=True)
        seq[list(at)] = seqs
    for lines in (m_lines, x_lines):
        if lines:
            evs = [events[i] for i in lines]
            seq[lines], step[lines], t[lines] = (
                [e.seq for e in evs],
                [e.step for e in evs],
                [e.t for e in evs],
            )
    return _Plan(starts, ends, cls, seq, step, t, metrics, (counts[0], layers, counts[1], counts[2]))


def _decode(text: bytes, run: str | None, layouts: Layouts, depth: int = 0) -> list | None:
    """Every line of `text` decoded (None if some line does not fit): into the run's layout (SMALL: the
    small files' one) when it has one that fits, else with dict `data`, from which the layout is learnt
    for the next pieces (`run` None: dict `data`, nothing learnt).

    A line whose value is of the wrong type (a "nan" string, say) fails the decode at that line, which
    msgspec names (`$[i]`): the lines before it decoded, so the piece is decoded around it, the line
    alone by `_decode_line` (None: validate_event decides), instead of line by line (~3x the piece's time)."""
    layout = layouts.of(run) if run is not None else None
    for decoder in (layout.decoder, DECODER) if layout is not None else (DECODER,):
        try:
            decoded = decoder.decode_lines(text)
        except DECODE_ERRORS as e:
            split = _split_at(e, text) if depth < _SPLITS_MAX else None
            if split is None:
                continue  # names outside the layout: the dict decode learns them; else line by line
            head, line, tail = split
            # around a line the dict decode failed at: dicts again, nothing learnt from a piece that failed
            within = run if decoder is not DECODER else None
            parts = [
                _decode(head, within, layouts, depth + 1) if head else [],
                [_decode_line(line)],
                _decode(tail, within, layouts, depth + 1) if tail else [],
            ]
            return None if any(p is None for p in parts) else [ev for p in parts for ev in p]
        if (
            decoder is DECODER
            and run is not None
            and (run not in layouts.by_run or layout is not None or run == SMALL)
        ):
            _learn(
                layouts, run, decoded, layout
            )  # none yet, or names outside it (SMALL: the next sweep's, maybe)
        return decoded
    return None


_UNNAMEABLE = re.compile(r'["\\\x00-\x1f]')  # what msgspec refuses in a renamed field's name
_AT_LINE = re.compile(r" - at `\$\[(\d+)\]")  # where msgspec's ValidationError says decode_lines failed
_SPLITS_MAX = 16  # lines a piece is decoded around before it goes line by line


def _split_at(e: Exception, text: bytes) -> tuple[bytes, bytes, bytes] | None:
    """(the lines before, the line, the lines after) the one a layout's `decode_lines` failed at for a value
    of the wrong type; None for any other failure (a name outside the layout: the dict decode learns it)."""
    m = _AT_LINE.search(str(e)) if isinstance(e, msgspec.ValidationError) else None
    if m is None or "unknown field" in str(e):
        return None
    i, pos = int(m.group(1)), 0
    for _ in range(i):  # the i-th line's start; each line of `text` ends with a newline
        pos = text.find(b"\n", pos) + 1
        if pos == 0:
            return None
    end = text.find(b"\n", pos)
    if end < 0:
        return None
    return text[:pos], text[pos : end + 1], text[end + 1 :]


def _learn(layouts: Layouts, run: str, decoded: list, old: Layout | None) -> None:
    """The run's layout: the names of this piece, in their order, then the old layout's others; none past
    LAYOUT_MAX names (the run decodes into dicts from then on). SMALL: the old layout's names only while
    they fit in SMALL_LAYOUT_MAX, else this piece's alone (the next sweep's)."""
    names = dict.fromkeys(
        itertools.chain.from_iterable(e.data for e in decoded if e.__class__ is MetricsLine)
    )
    if not names:
        return  # no metrics here: look again at the next piece
    most = SMALL_LAYOUT_MAX if run == SMALL else LAYOUT_MAX
    if old is not None and (run != SMALL or len(names) + len(old.names) <= most):
        names.update(dict.fromkeys(old.names))
    # msgspec cannot name a field with a quote, a backslash or a control character: such a run's metrics
    # decode into dicts (the line is as valid as any)
    if len(names) > most or "" in names or any(map(_UNNAMEABLE.search, names)):
        layouts.set(run, None)
        return
    layouts.set(run, tuple(names))  # runs of one sweep log the same names: one layout for all


def _decode_line(line: bytes):
    try:
        return DECODER.decode(line)
    except DECODE_ERRORS:
        return None  # validate_event decides


def _finite_named(d) -> bool:
    """No empty name and every value finite (a layout's NaN fields are absent names)."""
    if d.__class__ is dict:
        return "" not in d and all(math.isfinite(v) for v in d.values())
    return all(v != v or math.isfinite(v) for v in astuple(d))


def _metric_columns(evs: list) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """(E,) events -> (lens (E,), values (N,), names dictionary, codes (N,) into it)."""
    datas = [e.data for e in evs]
    kind = datas[0].__class__ if datas else dict
    if kind is not dict and all(d.__class__ is kind for d in datas):
        return _layout_columns(evs)
    if kind is not dict or not all(d.__class__ is dict for d in datas):
        # a piece decoded around a line, its parts into different layouts or dicts: every `data` as a dict
        datas = [d if d.__class__ is dict else _as_dict(d) for d in datas]
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


def _as_dict(data) -> dict[str, float]:
    """A layout's `data` as the dict the dict decoder gives (NaN fields are absent names)."""
    return {k: v for k, v in zip(data.__class__.names, astuple(data), strict=True) if v == v}


def _layout_columns(evs: list) -> tuple[np.ndarray, np.ndarray, list[str], np.ndarray]:
    """`_metric_columns` of events decoded into one layout: an (E, K) matrix, NaN where a name is absent."""
    names = evs[0].data.__class__.names
    # the fields' floats straight into one buffer: np.array over a list of tuples costs ~2x (shape discovery)
    flat = itertools.chain.from_iterable(map(astuple, map(DATA, evs)))
    mat = np.fromiter(flat, np.float64, len(evs) * len(names)).reshape(len(evs), len(names))
    present = ~np.isnan(mat)
    codes = np.nonzero(present)[1]  # row-major: line by line, each line's names in layout order
    return present.sum(1, dtype=np.int64), mat[present], list(names), codes.astype(np.int32)


def _apply(b: Batch, lf: LogFile, st: FileState, piece: bytes, plan: _Plan):
    """Route every line of a decoded piece, in file order; the (metrics, expert_load) tables to insert."""
    accepted = _accept(b, lf, st, piece, plan.starts, plan.ends, plan.cls, plan.seq)
    n_acc = int(accepted.sum())
    if not n_acc:
        return None
    b.n_events += n_acc
    b.n_fast += n_acc
    b.saw(lf.run, float(plan.t[accepted].max()), int(plan.step[accepted].max()), lf.host)
    m, x = plan.cls == 1, plan.cls == 2
    n_m, n_x = int(m.sum()), int(x.sum())
    one = np.zeros(max(n_m, n_x), np.int32)  # every event's run: this file's, the only one
    mt = _metrics_table(
        plan, accepted[m], plan.step[m], plan.t[m], [lf.run], one[:n_m], np.full(n_m, lf.host)
    )
    xt = _experts_table(plan, accepted[x], plan.step[x], [lf.run], one[:n_x])
    _touched(b, mt, xt, [lf.run], [lf.run])
    return mt, xt


def _touched(b: Batch, mt: pa.Table | None, xt: pa.Table | None, m_runs, x_runs) -> None:
    """Count the rows of the tables, and mark their runs (`m_runs`, `x_runs`) for the rollups and detectors."""
    if mt is not None:
        b.n_metric_values += mt.num_rows
        b.touched["metrics"].update(m_runs)
    if xt is not None:
        b.n_expert_rows += xt.num_rows
        b.touched["expert_load"].update(x_runs)


def _accept(b: Batch, lf: LogFile, st: FileState, piece: bytes, starts, ends, cls, seqs) -> np.ndarray:
    """(L,) which lines of one file's decoded lines (in file order, at `starts`..`ends` of `piece`) are
    accepted certified events; the others are rejected, duplicates, or judged by `check_line`."""
    base = st.line
    n = len(cls)
    certified = cls > 0
    if certified.all() and st.accept_all(seqs):
        accepted = certified  # the common case: no per-line bookkeeping at all
    else:
        # in file order: each run of consecutive certified lines at once where `accept_all` takes it
        # whole (as many `check_seq` calls would), line by line where it does not; other lines one by one
        accepted = np.zeros(n, bool)
        edges = np.flatnonzero(np.diff(certified.astype(np.int8))) + 1
        for lo, hi in zip([0, *edges.tolist()], [*edges.tolist(), n], strict=True) if n else ():
            if certified[lo] and st.accept_all(seqs[lo:hi]):
                accepted[lo:hi] = True
                continue
            for i in range(lo, hi):
                lineno = base + 1 + i
                if certified[i]:
                    accepted[i] = seq_ok(b, lf, st, lineno, int(seqs[i]), piece, int(starts[i]), int(ends[i]))
                else:
                    check_line(b, lf, st, lineno, piece[starts[i] : ends[i]])
    st.line += n
    return accepted


def _metrics_table(
    plan: _Plan,
    keep: np.ndarray,
    steps: np.ndarray,
    ts: np.ndarray,
    runs: list[str],
    run_of: np.ndarray,
    host: np.ndarray,
) -> pa.Table | None:
    """(N,) rows of run and name (dictionary-encoded), step, value, t, host of the accepted metrics events
    (`keep` (M,)); `run_of` (M,) each event's index into `runs`, `host` (M,) its host."""
    if not keep.any():
        return None
    lens, values, codes = plan.m_lens, plan.m_values, plan.m_codes
    if not keep.all():
        rows = np.repeat(keep, lens)
        values, codes = values[rows], codes[rows]
        steps, ts, lens = steps[keep], ts[keep], lens[keep]
        run_of, host = run_of[keep], host[keep]
    if int(lens.sum()) == 0:
        return None  # only empty `data` objects: events, but no values
    name = pa.DictionaryArray.from_arrays(numeric(codes), _strings(plan.m_names))
    steps, ts = np.repeat(steps, lens), np.repeat(ts, lens)
    return pa.table(
        {
            "run": _coded(runs, np.repeat(run_of, lens)),
            "step": numeric(steps),
            "name": name,
            "value": numeric(values),
            "t": numeric(ts),
            "host": numeric(np.repeat(host, lens).astype(np.uint16)),
        }
    )


_COUNT_CHARS = b"0123456789,"


def _int_lists(raws: list[bytes]) -> tuple[np.ndarray, np.ndarray] | None:
    """JSON arrays written plainly as `[1,2,3]` (decimal ints within `COUNT`, no spaces): (lens (E,), values (sum,)).

    None when any is not of that form; the caller then checks event by event. The text is
    valid JSON already (msgspec checked it), so digits and commas between `[` and `]` can
    only be a list of non-negative integers.
    """
    if b"".join(r[:1] for r in raws) != b"[" * len(raws) or b"".join(r[-1:] for r in raws) != b"]" * len(
        raws
    ):
        return None
    inner = [r[1:-1] for r in raws]
    text = b",".join(x for x in inner if x)
    if text.translate(None, _COUNT_CHARS):
        return None
    lens = np.fromiter((x.count(b",") + 1 if x else 0 for x in inner), np.int64, len(inner))
    # strtoll-style parse: a number too long for int64 comes back as 2**63 - 1 (clamped, not wrapped),
    # so every count above U32 (`COUNT`'s bound) shows as one (tests/test_ingest_fast.py has 10**29 in a list)
    values = np.fromstring(text, np.int64, sep=",") if text else np.empty(0, np.int64)
    if len(values) != int(lens.sum()) or (len(values) and not rules.COUNT.ok(int(values.max()))):
        return None
    return lens, values.astype(np.uint32)


def _expert_counts(evs: list) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(lens (E,), routed (R,), dropped (R,)) of expert_load events, or None if some event is not certain."""
    routed = _int_lists([bytes(e.data.routed) for e in evs])
    dropped = _int_lists([bytes(e.data.dropped) for e in evs])
    if routed is None or dropped is None:
        return None
    lens = routed[0]
    if not np.array_equal(lens, dropped[0]) or (len(lens) and not rules.EXPERTS.ok(int(lens.max()))):
        return None
    return lens, routed[1], dropped[1]


def _experts_table(
    plan: _Plan, keep: np.ndarray, steps: np.ndarray, runs: list[str], run_of: np.ndarray
) -> pa.Table | None:
    """(R,) rows of run, step, layer, expert, routed, dropped: one per expert of each accepted event (`keep`
    (X,)); `run_of` as in `_metrics_table`."""
    if not keep.any():
        return None
    lens, layers, routed, dropped = plan.x_lens, plan.x_layers, plan.x_routed, plan.x_dropped
    steps = steps.astype(np.int32)  # certified: <= 2**31 - 1
    if not keep.all():
        rows = np.repeat(keep, lens)
        routed, dropped = routed[rows], dropped[rows]
        steps, layers, lens, run_of = steps[keep], layers[keep], lens[keep], run_of[keep]
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
    return pa.table(
        {"run": _coded(runs, np.repeat(run_of, lens)), **{k: numeric(v) for k, v in cols.items()}}
    )


def _strings(names: list[str]) -> pa.Array:
    """An Arrow string array of the names (not `pa.array`, which would import pandas: see `_column`)."""
    return column(names, pa.string())


def _coded(values: list[str], codes: np.ndarray) -> pa.Array:
    """(n,) strings given as indexes into `values`, dictionary-encoded: no string per row."""
    return pa.DictionaryArray.from_arrays(numeric(codes.astype(np.int32)), _strings(values))


def _insert(con, held: list[tuple[pa.Table | None, pa.Table | None]]) -> None:
    """Append some pieces' rows, of any files, one INSERT per table (`ingest.appends` calls it)."""
    for i, (table, sql) in enumerate(
        (
            (
                "_msgspec_m",
                "INSERT INTO metrics (run, step, name, value, t, host) SELECT run, step, name, value, t, host FROM _msgspec_m",
            ),
            (
                "_msgspec_x",
                "INSERT INTO expert_load SELECT run, step, layer, expert, routed, dropped FROM _msgspec_x",
            ),
        )
    ):
        parts = [h[i] for h in held if h[i] is not None]
        if parts:
            con.register(table, pa.concat_tables(parts) if len(parts) > 1 else parts[0])
            con.execute(sql)
            con.unregister(table)


def _accept_small(b: Batch, items: list, counts: list[int], files: np.ndarray, text: bytes, plan: _Plan):
    """(L,) which lines of several files' decoded lines are accepted certified events: `_accept` of each file.

    A file whose every line decoded with a seq, the seqs rising and above its cursor, and no sibling's seqs
    to collide with (a sweep's small file, read once), passes every seq check in any order: its certified
    lines are accepted at once and only the lines `check_line` judges go one by one, in file order (so its
    rows, rejections and the batch's events come as `_accept` gives them). Others go through `_accept`."""
    cls, seq, n = plan.cls, plan.seq, len(plan.cls)
    rising = np.ones(n, bool)
    rising[1:] = seq[1:] > seq[:-1]
    heads = np.cumsum(counts) - counts  # each file's first line
    rising[heads[heads < n]] = True  # a file's first line follows no line of its own
    odd = np.bincount(files[(seq < 0) | ~rising], minlength=len(items))  # lines that rule a file out
    certified = cls > 0
    accepted = certified.copy()
    judged = np.flatnonzero(~certified).tolist()
    # each file's first and last certified seqs (-1: none), what its lines accepted at once leave in `st`
    first, last = np.full(len(items), -1, np.int64), np.full(len(items), -1, np.int64)
    at = np.flatnonzero(certified)
    if len(at):
        owners, i0 = np.unique(files[at], return_index=True)
        first[owners] = seq[at[i0]]
        last[owners] = seq[at[np.append(i0[1:], len(at)) - 1]]
    first_l, last_l = first.tolist(), last.tolist()
    j = 0  # next in `judged`
    for k, ((lf, st, ch), c) in enumerate(zip(items, counts, strict=True)):
        lo, hi = int(heads[k]), int(heads[k]) + c
        if not c:
            st.offset = ch.end
            continue
        if odd[k] or not st.clear_run(int(seq[lo]), int(seq[hi - 1])):
            accepted[lo:hi] = _accept(
                b, lf, st, text, plan.starts[lo:hi], plan.ends[lo:hi], cls[lo:hi], seq[lo:hi]
            )
            while j < len(judged) and judged[j] < hi:
                j += 1
        else:
            base = st.line - lo + 1
            while j < len(judged) and judged[j] < hi:
                i = judged[j]
                check_line(b, lf, st, base + i, text[plan.starts[i] : plan.ends[i]])
                j += 1
            st.line += c
            if last_l[k] >= 0:  # as `check_seq` of each in order would leave it (they all rise)
                st.record(first_l[k], last_l[k])
        st.offset = ch.end
    # the batch saw each run's accepted events: its latest time and step
    at = np.flatnonzero(accepted)
    if len(at):
        owners, i0 = np.unique(files[at], return_index=True)
        t_max = np.maximum.reduceat(plan.t[at], i0).tolist()
        step_max = np.maximum.reduceat(plan.step[at], i0).tolist()
        for k, t, step in zip(owners.tolist(), t_max, step_max, strict=True):
            lf = items[k][0]
            b.saw(lf.run, t, step, lf.host)
    return accepted


def ingest_small(con, b: Batch, items: list[tuple[LogFile, FileState, Chunk]], max_line: int) -> None:
    """Several files' last chunks (complete lines to their ends; each file the only one of its run and host
    in the batch): what `ingest_chunk` of each gives, decoded in one piece.

    A catch-up of a sweep reads thousands of files of a few KB. File by file, each costs a few dozen numpy
    and Arrow calls to decode, certify and stage, more than its lines do. Here their lines are one piece:
    one `decode_lines` call, one certification, one table of rows for them all. Only the seq checks and the
    lines `check_line` judges go file by file, each in its file's order. A piece `_plan` will not take
    (non-UTF-8 bytes, an oversized line, mostly odd lines) goes file by file."""
    counts = [ch.data.count(b"\n") for _, _, ch in items]
    plan = None
    if (
        ENABLED
        and msgspec is not None
        and all(RUN_ID_RE.match(lf.run) and rules.HOST.ok(lf.host) for lf, _, _ in items)
    ):
        if b.layouts is None:
            b.layouts = Layouts()
        text = b"".join(ch.data for _, _, ch in items)
        files = np.repeat(np.arange(len(items)), counts)
        runs = [lf.run for lf, _, _ in items]
        hosts = np.array([lf.host for lf, _, _ in items], np.int64)
        line_runs = [runs[k] for k in files.tolist()]
        plan = _plan(text, SMALL, 0, max_line, b.layouts, (line_runs, hosts[files].tolist()))
    if plan is None:
        for lf, st, ch in items:
            ingest_chunk(con, b, lf, st, ch, max_line)
        return
    accepted = _accept_small(b, items, counts, files, text, plan)
    n_acc = int(accepted.sum())
    if not n_acc:
        return
    b.n_events += n_acc
    b.n_fast += n_acc
    cls = plan.cls
    m, x = cls == 1, cls == 2
    # distinct run ids (a run's files of other hosts may be among them): the rows name each once
    index: dict[str, int] = {}
    code = np.array([index.setdefault(r, len(index)) for r in runs], np.int32)[files]  # (L,) each line's run
    names = list(index)
    mt = _metrics_table(plan, accepted[m], plan.step[m], plan.t[m], names, code[m], hosts[files[m]])
    xt = _experts_table(plan, accepted[x], plan.step[x], names, code[x])
    # the runs with rows: accepted events with some value (an empty `data` or list adds none)
    m_rows = code[m][accepted[m] & (plan.m_lens > 0)]
    x_rows = code[x][accepted[x] & (plan.x_lens > 0)]
    _touched(b, mt, xt, [names[c] for c in np.unique(m_rows)], [names[c] for c in np.unique(x_rows)])
    if mt is not None or xt is not None:
        b.appends.hold(
            (mt, xt),
            sum(t.num_rows for t in (mt, xt) if t is not None),
            functools.partial(_insert, con),
            INSERT_ROWS,
        )
