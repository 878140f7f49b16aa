"""Export a run: its event log as one JSON Lines file, or its metrics as parquet / csv.

- `jsonl`: every event of the run, all hosts merged in time order, each line exactly as it
  is in the run's event files (so nothing is re-encoded and nothing is lost), except that a
  line holding a secret is re-encoded with it hidden, as ingest stores it. Read from the
  runs dir, the source of truth. Lines that break the contract (the ones ingest rejects)
  and a torn final line are left out and counted. `import_events_jsonl` is the inverse: it
  splits such a file back into `<runs dir>/<run>/events.<host>.jsonl`, ready to ingest.
- `parquet` / `csv`: the metrics long table `(run, step, name, value, t, host)` from the
  store, streamed batch by batch.
- `export_partitioned`: the whole store as Hive-partitioned Parquet, `DIR/kind=<kind>/run=<run>/`,
  one table per kind (`runs`, `metrics`, `expert_load`, and each event kind), for DuckDB, Spark,
  Trino or ClickHouse to read in place. Written by DuckDB's `COPY ... PARTITION_BY` from a
  read-only connection into a folder beside DIR, renamed to DIR when complete.
"""

from __future__ import annotations

import gzip
import heapq
import json
import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from observatory import findings
from observatory.events import OBSERVATORY_HOST, RUN_ID_RE, ValidationError, validate_event
from observatory.markup import CSV_FORMULA
from observatory.redact import scrub_event

__all__ = [
    "FORMATS",
    "ExportResult",
    "export_run",
    "run_event_files",
    "import_events_jsonl",
    "PartitionedResult",
    "export_partitioned",
]

FORMATS = ("jsonl", "parquet", "csv")
_FILE_RE = re.compile(r"^events\.(\d+)\.jsonl(\.gz)?$")


class ExportError(ValueError):
    """The run cannot be exported (not found, no event files); the message says why."""


@dataclass
class ExportResult:
    run: str
    format: str
    out: str
    rows: int = 0  # events (jsonl) or metric values (parquet, csv)
    skipped: int = 0  # lines left out: invalid or torn (jsonl only)


def run_event_files(runs_dir: str | os.PathLike, run: str) -> list[tuple[int, Path]]:
    """`(host, path)` of the run's event files, plain or gzip-compressed, its findings-folder file too."""
    if not RUN_ID_RE.match(run):
        raise ExportError(f"{run!r} is not a run id ([A-Za-z0-9._-]{{1,128}})")
    folder = Path(runs_dir) / run
    if folder.is_symlink():  # a log writer's link may point anywhere: never read through (as ingest)
        raise ExportError(f"run {run!r}: its folder {folder} is a symbolic link; not read")
    if not folder.is_dir():
        raise ExportError(f"run {run!r} has no folder {folder} in the runs dir (is --runs-dir right?)")
    files = []
    for p in sorted(folder.iterdir()):
        m = _FILE_RE.match(p.name)
        if m and p.is_file() and not p.is_symlink():
            files.append((int(m.group(1)), p))
    own = findings.path(runs_dir, run)  # the observatory's own events, in the runs dir's findings folder
    if own.parent != folder and own.is_file():
        files.append((OBSERVATORY_HOST, own))
    for prefix, top in findings.roots(runs_dir):  # other observatories' (a bucket's replica: `found/`)
        other = top / run / findings.NAME
        if prefix != "findings:" and other.is_file() and not other.is_symlink():
            files.append((OBSERVATORY_HOST, other))
    if not files:
        raise ExportError(f"run {run!r}: no events.<host>.jsonl files in {folder}")
    return files


def _valid_lines(run: str, host: int, path: Path, counts: dict) -> Iterator[tuple[tuple, bytes]]:
    """`((t, host, seq), line)` for each line of one event file that ingest would accept."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                counts["skipped"] += 1  # torn final write
                continue
            try:
                ev = validate_event(json.loads(raw), run_folder=run, host=host)
            except (ValueError, ValidationError):
                counts["skipped"] += 1
                continue
            data, n = scrub_event(ev["kind"], ev["data"])
            if n:  # the log keeps the secret (the runs dir is private); what leaves it does not
                raw = json.dumps({**ev, "data": data}, separators=(",", ":")).encode() + b"\n"
            yield (float(ev["t"]), host, ev["seq"]), raw


def _export_jsonl(runs_dir, run: str, out) -> ExportResult:
    counts = {"skipped": 0}
    streams = [_valid_lines(run, host, path, counts) for host, path in run_event_files(runs_dir, run)]
    res = ExportResult(run, "jsonl", str(out))
    with _open_out(out, "wb") as f:
        for _, line in heapq.merge(*streams, key=lambda item: item[0]):
            f.write(line)
            res.rows += 1
    res.skipped = counts["skipped"]
    return res


def _csv_safe(batch):
    """`batch` with each text cell a spreadsheet would run as a formula (a metric named `=cmd|…`) prefixed
    with `'` (`markup.CSV_FORMULA`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    cols = []
    for col in batch.columns:
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            bad = pc.fill_null(pc.match_substring_regex(col, CSV_FORMULA), False)
            col = pc.if_else(bad, pc.binary_join_element_wise("'", col, ""), col)
        cols.append(col)
    return pa.RecordBatch.from_arrays(cols, schema=batch.schema)


def _export_table(db, run: str, fmt: str, out) -> ExportResult:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from observatory.queries import export as q
    from observatory.store import connect

    res = ExportResult(run, fmt, str(out))
    with connect(db) as con:
        if not q.run_exists(con, run):
            near = q.similar_runs(con, run)
            hint = (
                f"; runs that look alike: {', '.join(near)}"
                if near
                else "; the store has no runs (ingest first)"
            )
            raise ExportError(f"run {run!r} is not in the store {db}{hint}")
        reader = q.metrics_reader(con, run)
        if fmt == "parquet":
            with pq.ParquetWriter(str(out), reader.schema, compression="zstd") as w:
                for batch in reader:
                    w.write_batch(batch)
                    res.rows += batch.num_rows
        else:
            with _open_out(out, "wb") as f, pacsv.CSVWriter(f, reader.schema) as w:
                for batch in reader:
                    w.write_batch(_csv_safe(batch))
                    res.rows += batch.num_rows
    return res


class _Stdout:
    def __enter__(self):
        import sys

        return sys.stdout.buffer

    def __exit__(self, *exc):
        return False


def _open_out(out, mode: str):
    return _Stdout() if str(out) == "-" else open(out, mode)


def export_run(
    run: str,
    fmt: str,
    out: str | os.PathLike | None = None,
    *,
    runs_dir: str | os.PathLike,
    db: str | os.PathLike,
) -> ExportResult:
    """Export one run. `out` defaults to `<run>.<fmt>`; "-" writes to stdout (jsonl, csv)."""
    if fmt not in FORMATS:
        raise ExportError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    out = out if out is not None else f"{run}.{fmt}"
    if str(out) == "-" and fmt == "parquet":
        raise ExportError("parquet cannot go to stdout; give --out FILE")
    if fmt == "jsonl":
        return _export_jsonl(runs_dir, run, out)
    return _export_table(db, run, fmt, out)


@dataclass
class PartitionedResult:
    out: Path
    rows: dict[str, int]  # table (runs, metrics, expert_load, events) -> rows written
    runs: int
    files: int


def export_partitioned(out: str | os.PathLike, *, db: str | os.PathLike) -> PartitionedResult:
    """Write the store as Hive-partitioned Parquet under `out` (which must not exist, or be empty).

    Layout: `out/kind=<kind>/run=<run>/data_0.parquet`, `kind` one of `runs`, `metrics`,
    `expert_load` or an event kind (`unknown` for a kind that is not a plain name; its
    `raw_kind` column keeps it). Every path component starts with `kind=` or `run=`, and run
    ids are checked against the run id rule first, so no value can name a path outside `out`.
    """
    from observatory.queries import export as q
    from observatory.store import connect

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} exists and is not an empty folder; an export is never merged into another")
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        with connect(db) as con:
            runs = q.run_ids(con)
            bad = [r for r in runs if not RUN_ID_RE.match(r) or r in (".", "..")]
            if bad:
                raise ExportError(f"run ids that are not safe as paths: {', '.join(map(repr, bad[:5]))}")
            rows = q.copy_partitioned(con, str(tmp))
        if out.exists():
            out.rmdir()
        tmp.mkdir(parents=True, exist_ok=True)  # an empty store writes no files
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return PartitionedResult(out, rows, len(runs), sum(1 for _ in out.rglob("*.parquet")))


def import_events_jsonl(
    path: str | os.PathLike, runs_dir: str | os.PathLike, replace: bool = False
) -> dict[tuple[str, int], str]:
    """Split an exported (or any) event JSON Lines file into the runs dir, one file per (run, host).

    Lines are copied byte for byte; each keeps its place in its host's file, so seq order
    holds. Returns `{(run, host): state}`, states as in `interop.put_file`.
    Raises `ValueError` naming the file and line of anything that is not a valid event.
    """
    from observatory.interop import put_file

    path = Path(path)
    parts: dict[tuple[str, int], list[bytes]] = {}
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                ev = validate_event(json.loads(raw))
            except ValidationError as e:
                raise ValueError(f"{path}:{n}: field {e.field}: {e.reason}") from None
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from None
            parts.setdefault((ev["run"], ev["host"]), []).append(raw if raw.endswith(b"\n") else raw + b"\n")
    return {
        key: put_file(Path(runs_dir) / key[0] / f"events.{key[1]}.jsonl", b"".join(lines), replace)
        for key, lines in parts.items()
    }
