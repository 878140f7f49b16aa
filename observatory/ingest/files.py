"""The event logs of a runs dir: which to read, how far each is read, and reading one within a batch.

Layout: `<runs>/<run>/events.<host>.jsonl` (and `.jsonl.gz`, import copies), and the observatory's
own `events.1000.jsonl` under the runs dir's findings folders (`observatory.findings.roots`). A file's
progress is its row of `ingest_files` (byte offset, line, seq range), written in the
same transaction as the rows it covers.
"""

from __future__ import annotations

import collections
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from observatory import findings
from observatory.ingest.folders import SETTLED_S, Folders
from observatory.ingest.model import Batch, Chunk, FileState, LogFile, read_chunk, read_rest
from observatory.ingest.msgspec_lines import METRICS_PIECE_BYTES, ingest_chunk, ingest_small
from observatory.ingest.rules import HOST
from observatory.store.arrow import column

__all__ = [
    "FILE_RE",
    "GZ_BATCH_BYTES",
    "Scan",
    "scan",
    "with_work",
    "pending_bytes",
    "load_state",
    "by_run_host",
    "index_row",
    "siblings",
    "process_file",
    "save_files",
]

FILE_RE = re.compile(r"^events\.(\d+)\.jsonl(\.gz)?$")
GZ_BATCH_BYTES = 256 << 20  # .gz has no cheap seek, so take bigger bites


FINDINGS = "findings:"  # a store path's prefix for the runs dir's findings folder (run ids have no ":")


@dataclass
class Scan:
    """Every event log under a runs dir and its findings folder, as three parallel columns (store path,
    size, mtime): only the files with work become `LogFile`s, a batch's worth at a time (`with_work`). A
    store path is `<run>/<file>` in the runs dir, `findings:<run>/<file>` in the findings folder,
    `findings.<origin>:<run>/<file>` in another observatory's (a bucket's: `observatory.findings.roots`).

    The columns are tuples of strings and numbers, and the files with work a pass lists (`_Listing`) are
    too: the garbage collector stops looking into such a tuple once it has seen it. At 10^5 runs a
    catch-up keeps them for its whole length, and as lists and `LogFile`s each of the collector's full
    passes (dozens in a catch-up) took ~0.25 s, ~10% of the catch-up (bench/bench_many_runs.py)."""

    root: str
    findings: str | None = None  # the findings folder (`observatory.findings.root`), when apart
    others: tuple[tuple[str, str], ...] = ()  # (store path prefix, folder) of other observatories' findings
    rel: tuple[str, ...] = ()
    size: tuple[int, ...] = ()
    mtime: tuple[float, ...] = ()
    _table: pa.Table | None = field(default=None, repr=False, compare=False)
    # the files with work, listed once for a store (`with_work`'s budgeted calls)
    _work: _Listing | None = field(default=None, repr=False, compare=False)
    # the folders' listings the scan used and kept (`ingest.folders`); a batch writes what changed
    folders: Folders | None = field(default=None, repr=False, compare=False)

    def sig(self) -> tuple:
        """What a follower compares between passes: nothing on disk changed when it is equal."""
        return (self.rel, self.size, self.mtime)

    def table(self) -> pa.Table:
        """The three columns as one Arrow table, made once: each batch of a catch-up joins it with the store
        (`with_work`), and at 10^5 files it took 0.05 s to make."""
        if self._table is None or self._table.num_rows != len(self.rel):
            self._table = pa.table(
                {
                    "path": column(self.rel, pa.string()),
                    "size": column(self.size, pa.int64()),
                    "mtime": column(self.mtime, pa.float64()),
                }
            )
        return self._table

    def read_to_end(self, rels: Iterable[str]) -> None:
        """These files' new bytes are stored (their batch committed): no later batch of this pass lists them."""
        if self._work is not None:
            self._work.read_to_end(rels)

    def without(self, rel: str) -> Scan:
        keep = [i for i, r in enumerate(self.rel) if r != rel]
        return Scan(
            self.root,
            self.findings,
            self.others,
            tuple(self.rel[i] for i in keep),
            tuple(self.size[i] for i in keep),
            tuple(self.mtime[i] for i in keep),
            folders=self.folders,
        )

    def file(self, rel: str, size: int, mtime: float) -> LogFile:
        where = self.root
        if rel.startswith(FINDINGS):
            where = self.findings
        elif ":" in rel:  # run ids have no ":"
            where = dict(self.others)[rel[: rel.index(":") + 1]]
        run, host, gz = _parts(rel)
        return LogFile(where, rel, run, host, gz, size, mtime)


def _parts(rel: str) -> tuple[str, int, bool]:
    """(run, host, gz) of a store path."""
    run, name = (rel.partition(":")[2] or rel).split("/", 1)
    m = FILE_RE.match(name)
    return run, int(m.group(1)), bool(m.group(2))


class _Listing:
    """A pass's files with work in ingest order, as columns (store path, size, mtime, new bytes), and which of
    them a batch of the pass has read to their end; `take` makes the next batch's `LogFile`s."""

    def __init__(self, key: str, rows: list[tuple[str, int, float, int]]):
        self.key = key
        self.rel, self.size, self.mtime, self.todo = (
            (tuple(c) for c in zip(*rows, strict=True)) if rows else ((),) * 4
        )
        self.index = {r: i for i, r in enumerate(self.rel)}  # str -> int: a dict the collector skips too
        self.done = bytearray(len(rows))
        self.pos = 0  # every file before it is read to its end

    def read_to_end(self, rels: Iterable[str]) -> None:
        for r in rels:
            i = self.index.get(r)
            if i is not None:
                self.done[i] = 1

    def take(self, scan: Scan, budget: int) -> tuple[list[LogFile], bool]:
        """The next files not read to their end whose new bytes before them are under `budget`; whether
        others are left."""
        n, done = len(self.rel), self.done
        while self.pos < n and done[self.pos]:
            self.pos += 1
        out, before, i = [], 0, self.pos
        while i < n and before < budget:
            if not done[i]:
                out.append(scan.file(self.rel[i], self.size[i], self.mtime[i]))
                before += self.todo[i]
            i += 1
        return out, i < n


def scan(
    runs_dir: Path,
    skip: set[str] | None = None,
    emit: Callable[[str], None] | None = None,
    folders: Folders | None = None,
) -> Scan:
    """Every event log under the runs dir and its findings folder but those in `skip`; a host the store
    cannot keep is said once (through `emit`) and added to `skip`.

    One `stat` per log, and one `scandir` per folder, but for the folders `folders` kept the listing of
    (`ingest.folders`: one `stat` of the folder instead), with plain strings and lists: a pass over a lab's
    10^5 run folders costs what those syscalls do. Which files have work is the store's to say
    (`with_work`: one join in DuckDB, not a dict of 10^5 rows in Python)."""
    skip = set() if skip is None else skip
    tops = [(prefix, str(top)) for prefix, top in findings.roots(runs_dir)]
    top = next((t for prefix, t in tops if prefix == FINDINGS), None)
    out = Scan(str(runs_dir), top, tuple((p, t) for p, t in tops if p != FINDINGS), folders=folders)
    cols: tuple[list[str], list[int], list[float]] = ([], [], [])
    seen: list[str] = []  # the folders seen that have a kept listing: any other kept listing is of one gone
    since = time.time_ns() - SETTLED_S * 1_000_000_000
    _scan_into(cols, out.root, "", skip, emit, folders, seen, since)
    for prefix, folder in tops:
        _scan_into(cols, folder, prefix, skip, emit, folders, seen, since)
    if folders is not None and len(folders.entries) > len(seen):
        folders.forget(set(seen))
    out.rel, out.size, out.mtime = (tuple(c) for c in cols)
    return out


def _scan_into(
    out: tuple[list, list, list],
    root: str,
    prefix: str,
    skip: set[str],
    emit: Callable[[str], None] | None,
    folders: Folders | None,
    seen: list[str],
    since: int,
) -> None:
    rel, size, mtime = out
    try:
        with os.scandir(root) as it:
            entries = [(e.name, e.is_symlink()) for e in it if e.is_dir()]
    except (FileNotFoundError, NotADirectoryError):
        return
    run_dirs = [name for name, link in entries if not link]
    for name in (name for name, link in entries if link and prefix + name not in skip):
        # a run folder that is a link may point anywhere (the store's folder, /etc): never read through
        skip.add(prefix + name)
        if emit is not None:
            emit(f"{root}/{name}: a symbolic link to a folder; not read (a run folder must be a real folder)")
    kept = folders.kept(root, len(run_dirs)) if folders is not None else None
    stat = os.stat
    for run in run_dirs:
        d, key = f"{root}/{run}", prefix + run
        if kept is None:
            names = _names(d)
        else:
            try:
                folder_mtime = stat(d).st_mtime_ns  # before the listing: a name added meanwhile changes it
            except OSError:
                continue
            entry = kept.get(key)
            if entry is not None and entry[0] == folder_mtime:
                names = entry[1]
            else:
                names = _names(d)
                if names is not None and folder_mtime <= since:
                    folders.put(key, folder_mtime, names)
                    entry = folders.entries[key]
            if entry is not None:
                seen.append(key)
        if names is None:
            continue
        for name in names:
            r = f"{key}/{name}"
            if r in skip:
                continue
            if (m := FILE_RE.match(name)) is None:  # (a kept listing is the store's: not trusted blindly)
                continue
            host = m.group(1)
            if not HOST.ok(int(host)):
                # the store keeps hosts as USMALLINT (ingest_files, every table): say so once and go on
                if emit is not None:
                    emit(
                        f"{d}/{name}: host {host} in the file name is above {HOST.hi}, the largest host the "
                        f"store keeps; file skipped (rename it events.<host>.jsonl with a host in 0..{HOST.hi})"
                    )
                skip.add(r)
                continue
            try:
                st = os.lstat(f"{d}/{name}")  # a link is listed as one, and its read refuses it
            except OSError:
                continue
            rel.append(r)
            size.append(st.st_size)
            mtime.append(st.st_mtime)


def _names(folder: str) -> tuple[str, ...] | None:
    """The event logs' names in a folder; None when it cannot be listed."""
    try:
        with os.scandir(folder) as it:
            return tuple(e.name for e in it if e.name.startswith("events.") and FILE_RE.match(e.name))
    except OSError:
        return None


# a file has work when the store has no row for it, or (a plain log) it is longer than the offset read,
# or shorter (replaced: read again), or (a .gz, read whole) its size or mtime changed
_WITH_WORK = """
SELECT s.path, s.size, s.mtime, f.byte_offset FROM _scan s LEFT JOIN ingest_files f ON f.path = s.path
WHERE f.path IS NULL
   OR (CASE WHEN s.path LIKE '%.gz' THEN f.size IS DISTINCT FROM s.size OR f.mtime <> s.mtime
            ELSE s.size <> f.byte_offset END)
"""


def with_work(
    con, scan: Scan, only: str | None = None, budget: int | None = None
) -> tuple[list[LogFile], bool]:
    """The scanned files the store has not read to their end, in ingest order: by run, host, a run's
    `.gz` copies before its live files; and whether some were left out. `budget`: only the first files
    whose new bytes before them are under it, of those no batch of this pass has read to their end
    (`Scan.read_to_end`). A pass lists its files with work once (one join of the scan with the store) and
    each batch takes the next budget's worth: at 10^5 runs a catch-up takes dozens of batches, and joining
    every file again for each cost a tenth of a second a batch. A file a batch read only part of keeps its
    place at the head, with its new bytes as listed (more than it has left: a batch takes fewer files)."""
    if budget is None or only is not None:
        return [scan.file(*r[:3]) for r in _listed(con, scan, only)], False
    key = str(getattr(con, "path", id(con)))
    if scan._work is None or scan._work.key != key:
        scan._work = _Listing(key, _listed(con, scan))
    return scan._work.take(scan, budget)


def _listed(con, scan: Scan, only: str | None = None) -> list[tuple[str, int, float, int]]:
    """(store path, size, mtime, new bytes: a .gz's whole size) of every scanned file with work, in ingest
    order: by run, host, a run's `.gz` copies before its live files."""
    con.register("_scan", scan.table())
    try:
        if only is not None:
            rows = con.execute(f"SELECT * FROM ({_WITH_WORK}) WHERE path = ?", [only]).fetchall()
        else:
            rows = con.execute(_WITH_WORK).fetchall()
    finally:
        con.unregister("_scan")

    def order(row: tuple) -> tuple:
        run, host, gz = _parts(row[0])
        return run, host, not gz, row[0]

    return [
        (rel, size, mtime, size if rel.endswith(".gz") else max(size - (offset or 0), 0))
        for rel, size, mtime, offset in sorted(rows, key=order)
    ]


class Work:
    """The files a batch reads, in ingest order, with the store's rows of their runs: those `with_work` lists
    for the batch's budget; then, when they gave fewer bytes than their sizes said (a file that cannot be
    read just now, one that shrank, a torn last line), every other file with work (`rest`), so that a file
    that cannot be read never holds the others back."""

    def __init__(self, con, scan: Scan, only: str | None, budget: int | None):
        self.con, self.scan = con, scan
        self.files, self.left_out = with_work(con, scan, only, budget)
        self.rows, self.status = load_state(con, sorted({lf.run for lf in self.files}))
        self.by_host = by_run_host(self.rows)
        # a file alone of its (run, host) among these: its seqs depend on no other file read with it
        self.alone = collections.Counter((lf.run, lf.host) for lf in self.files)

    def rest(self) -> list[LogFile]:
        """Every file with work not listed yet, its run's rows loaded; after it nothing is left out."""
        seen = {lf.rel for lf in self.files}
        rest = [lf for lf in with_work(self.con, self.scan)[0] if lf.rel not in seen]
        rows, status = load_state(self.con, sorted({lf.run for lf in rest}))
        for path, row in rows.items():
            if path not in self.rows:
                self.rows[path] = row
                index_row(self.by_host, path, row)
        for run, st in status.items():
            self.status.setdefault(run, st)
        self.alone.update((lf.run, lf.host) for lf in rest)
        self.files += rest
        self.left_out = False
        return rest


def pending_bytes(con, scan: Scan) -> int:
    """Bytes of the scanned files past what the store has read of them: the work a progress bar counts down."""
    con.register("_scan", scan.table())
    try:
        (n,) = con.execute(
            "SELECT coalesce(sum(greatest(s.size - coalesce(f.byte_offset, 0), 0)), 0)::BIGINT "
            "FROM _scan s LEFT JOIN ingest_files f ON f.path = s.path"
        ).fetchone()
    finally:
        con.unregister("_scan")
    return n


# the columns of an `ingest_files` row, as `load_state` reads them and `save_files` writes them
_FILE_COLUMNS = (
    "path",
    "run",
    "host",
    "byte_offset",
    "line",
    "first_seq",
    "last_seq",
    "cursor_seq",
    "size",
    "mtime",
    "rejected",
    "rejected_dropped",
)


def load_state(con, runs: list[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """({path: its ingest_files row}, {run: stored status}) of these runs' files."""
    con.register("_runs", pa.table({"run": column(runs, pa.string())}))
    try:
        rows = {
            r[0]: dict(zip(_FILE_COLUMNS, r, strict=True))
            for r in con.execute(
                f"SELECT {', '.join(_FILE_COLUMNS)} FROM ingest_files WHERE run IN (SELECT run FROM _runs)"
            ).fetchall()
        }
        status = dict(
            con.execute("SELECT run, status FROM runs WHERE run IN (SELECT run FROM _runs)").fetchall()
        )
    finally:
        con.unregister("_runs")
    return rows, status


def by_run_host(rows: dict[str, dict]) -> dict[tuple[str, int], dict[str, dict]]:
    """`load_state`'s rows grouped by (run, host): a file's siblings are looked up, not searched for."""
    out: dict[tuple[str, int], dict[str, dict]] = {}
    for path, r in rows.items():
        index_row(out, path, r)
    return out


def index_row(by_host: dict[tuple[str, int], dict[str, dict]], path: str, row: dict) -> None:
    """Put (or replace) one file's row in `by_run_host`'s index."""
    by_host.setdefault((row["run"], row["host"]), {})[path] = row


def siblings(lf: LogFile, by_host: dict[tuple[str, int], dict[str, dict]]) -> list[tuple[int, int]]:
    """Seq ranges stored from the other files of the same (run, host): their seqs are duplicates here."""
    return [
        (r["first_seq"], r["last_seq"])
        for path, r in by_host.get((lf.run, lf.host), {}).items()
        if path != lf.rel and r["first_seq"] is not None
    ]


def process_file(
    con, b: Batch, lf: LogFile, st: FileState, budget: int, ended: bool, max_line: int
) -> tuple[int, bool]:
    """Ingest from `st.offset` until EOF or `budget` bytes; returns (bytes consumed, reached EOF).

    A torn last line (no final newline) waits while the run may be live and is recorded as
    `truncated` once it `ended` (or ended in this batch).
    """
    read_size = max(GZ_BATCH_BYTES if lf.gz else budget, max_line + 2)
    b.track(lf, st)
    used = 0
    while True:  # a .gz counts as read only at its end (else it is re-read from 0, forever)
        start = st.offset
        ch = read_chunk(lf, start, read_size, max_line)
        if ch.error and ch.transient:
            b.messages.append(f"{lf.path}: {ch.error}; will retry")
            return used, False
        if ch.error:
            b.reject(lf, st.line + 1, "(file)", ch.error, b"")
            if not lf.gz:  # (a link): passed over until its size changes; a .gz's size and mtime say that
                st.offset = max(st.offset, lf.size)
            return used, True
        if ch.data or ch.oversized:
            ingest_chunk(
                con, b, lf, st, ch, max_line
            )  # certified in bulk; what it cannot certify goes to model.check_line
        used += ch.end - start
        if ch.eof:
            if ch.tail_len and (ended or _ended_in_batch(b, lf.run)):
                what = (
                    f"a {ch.tail_len}-byte final line"
                    if ch.tail_len <= max_line
                    else "an oversized final line"
                )
                b.reject(
                    lf,
                    st.line + 1,
                    "(line)",
                    f"truncated: {what} has no newline (the writer died mid-line)",
                    ch.tail,
                )
                b.n_truncated += 1
                st.offset += ch.tail_len
                st.line += 1
            return used, True
        if ch.end == start:
            break
        if not lf.gz:
            # the rest of the budget, if a whole line fits in it: a chunk ends at its last newline, so
            # reading another full `budget` read up to twice the batch's bytes
            read_size = budget - used
            if read_size < max_line + 2:
                break
    return used, False


SMALL_FILE = 64 << 10  # a file with at most this many new bytes may be decoded with others (`Small`)


class Small:
    """Small files' new bytes, read whole and decoded together (`msgspec_lines.ingest_small`): a sweep's
    thousands of runs of a few KB each, at the cost per byte of one run's log.

    `take` reads a file that has few new bytes, all of them complete lines to its end, and is the only file
    of its run and host in the batch (its seqs depend on no other file's); `flush` decodes what was taken
    (by then `METRICS_PIECE_BYTES` of it, or the batch's end) and returns those files, read to their ends.
    Any other file is for `process_file`, alone."""

    def __init__(self, con, b: Batch, max_line: int):
        self.con, self.b, self.max_line = con, b, max_line
        self.items: list[tuple[LogFile, FileState, Chunk]] = []
        self.size = 0

    def take(self, lf: LogFile, st: FileState) -> int | None:
        """The bytes taken of `lf` (decoded by a later `flush`), or None: `process_file` reads it."""
        if st.restarted_from is not None:
            return None  # (a file read again from its start says so first: alone, its message in order)
        self.b.track(lf, st)
        ch = read_rest(lf, st.offset, SMALL_FILE)
        if ch is None:
            return None  # big, grown, torn, unreadable, odd: alone, from where it was (read again)
        self.items.append((lf, st, ch))
        self.size += len(ch.data)
        return ch.end - st.offset

    def due(self) -> bool:
        return self.size >= METRICS_PIECE_BYTES

    def flush(self) -> list[tuple[LogFile, FileState]]:
        """Decode and stage what was taken; the files, each read to its end."""
        items, self.items, self.size = self.items, [], 0
        if items:
            ingest_small(self.con, self.b, items, self.max_line)
        return [(lf, st) for lf, st, _ in items]


def _ended_in_batch(b: Batch, run: str) -> bool:
    last = [e["kind"] for e in b.lifecycle if e["run"] == run]
    return bool(last) and last[-1] == "run_end"


def save_files(con, saves: list[tuple[LogFile, FileState, bool, bool]]) -> None:
    """The batch's `ingest_files` rows, one statement for the new files and one for those the store has:
    (file, its state, read to its end, the store has a row) each."""
    rows = []
    for lf, st, done, _ in saves:
        size = lf.size if (done or not lf.gz) else None  # a .gz counts as read only when read to its end
        rows.append(
            (
                lf.rel,
                lf.run,
                lf.host,
                st.offset,
                st.line,
                st.first_seq,
                st.last_seq,
                st.cursor,
                size,
                lf.mtime,
                st.rejected,
                st.rejected_dropped,
            )
        )
    cols = list(zip(*rows, strict=True))
    con.register(
        "_files",
        pa.table(
            {
                "path": column(cols[0], pa.string()),
                "run": column(cols[1], pa.string()),
                **{
                    c: column(cols[i], pa.int64())
                    for i, c in enumerate(_FILE_COLUMNS)
                    if c not in ("path", "run", "mtime")
                },
                "mtime": column(cols[_FILE_COLUMNS.index("mtime")], pa.float64()),
                "stored": column([s[3] for s in saves], pa.bool_()),
            }
        ),
    )
    try:
        sets = ", ".join(f"{c} = f.{c}" for c in _FILE_COLUMNS[1:])
        con.execute(
            f"UPDATE ingest_files SET {sets} FROM _files f WHERE f.stored AND ingest_files.path = f.path"
        )
        con.execute(
            f"INSERT INTO ingest_files ({', '.join(_FILE_COLUMNS)}) "
            f"SELECT {', '.join(_FILE_COLUMNS)} FROM _files WHERE NOT stored"
        )
    finally:
        con.unregister("_files")
