"""Import TensorBoard event files (`events.out.tfevents.*`) into our event logs.

One run per directory that holds tfevents files (a directory's several files, e.g. from a
restarted job, are one run, read in file-name order, which is creation order). The run id
is `tb-<path of the directory relative to the PATH given>`, `/` replaced by `-`, or
`tb-<directory name>` when PATH itself holds the files.

Scalars become `metrics` at their step, `t` = the event's wall time, tag names kept as they
are (TensorBoard tags are already `/`-namespaced). Events are read with TensorBoard's own
`EventFileLoader`, which also migrates legacy `simple_value` scalars to the tensor form, so
files from TF1, TF2, tensorboardX and PyTorch's writer all read the same way. Histograms,
images, text and other plugins' data are skipped and counted by plugin.

TensorBoard files have no end-of-run record, so the importer writes `run_end` with the
status the user chose (default `completed`, marked `status_inferred`), or none at all
(`status=None`: the run then shows as crashed).
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from observatory.interop import ImportResult, RunLogBuilder, safe_run_id, settle

__all__ = ["find_tfevents_dirs", "convert_tensorboard_dir", "import_tensorboard"]

_PATTERN = "*tfevents*"


def find_tfevents_dirs(paths: Iterable[str | os.PathLike]) -> list[tuple[Path, str]]:
    """`(directory, run id)` for every directory under `paths` that holds tfevents files."""
    out: list[tuple[Path, str]] = []
    seen: set[Path] = set()
    for root in map(Path, paths):
        if root.is_file():
            dirs, base = [root.parent], root.parent.parent
        elif root.is_dir():
            dirs = sorted({f.parent for f in root.rglob(_PATTERN) if f.is_file()})
            base = root.parent if root in dirs else root
        else:
            raise FileNotFoundError(f"{root}: no such file or folder")
        for d in dirs:
            if d.resolve() in seen:
                continue
            seen.add(d.resolve())
            rel = d.relative_to(base).as_posix() if d != base else d.name
            out.append((d, safe_run_id("tb", rel.replace("/", "-"))))
    return out


def _record_offsets(path: Path) -> tuple[list[int], bool]:
    """Start offsets of the TFRecord frames in a file, and whether it ends mid-frame.

    Frame: length u64 LE | masked CRC32C of length u32 | data | masked CRC32C of data u32.
    Only lengths are followed here (TensorBoard's reader checks the CRCs), to say where a
    reader that stopped early stopped.
    """
    import struct

    offsets: list[int] = []
    size = path.stat().st_size
    with open(path, "rb") as f:
        pos = 0
        while pos + 12 <= size:
            f.seek(pos)
            (length,) = struct.unpack("<Q", f.read(8))
            end = pos + 12 + length + 4
            if end > size:
                return offsets, True
            offsets.append(pos)
            pos = end
    return offsets, pos != size


def _scalar(value, skipped) -> float | None:
    """A summary value as a float if it is a scalar, else None (counted in `skipped`)."""
    from tensorboard.util import tensor_util

    kind = value.WhichOneof("value")
    if kind == "simple_value":  # not migrated (older loaders); kept for safety
        return float(value.simple_value)
    plugin = value.metadata.plugin_data.plugin_name or kind or "unknown"
    if kind != "tensor" or plugin != "scalars":
        skipped[plugin] += 1
        return None
    arr = tensor_util.make_ndarray(value.tensor)
    if arr.size != 1 or arr.dtype.kind not in "fiub":
        skipped["non-scalar tensor"] += 1
        return None
    return float(arr.reshape(()))


def convert_tensorboard_dir(directory: Path, run_id: str, status: str | None = "completed"):
    """Read one directory's tfevents files into an in-memory event log."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto import event_pb2
    from tensorboard.data_compat import migrate_event

    res = ImportResult(source=directory, run=run_id)
    files = sorted(f for f in directory.glob(_PATTERN) if f.is_file())
    by_step: dict[int, tuple[float, dict[str, float]]] = {}  # step -> (last wall time, values)
    first_t: float | None = None
    # the loader stops quietly at a bad or torn record; `_record_offsets` tells us where
    logging.getLogger("tensorboard").setLevel(logging.ERROR)
    for f in files:
        n = 0
        try:
            for raw in RawEventFileLoader(str(f)).Load():
                n += 1
                res.records += 1
                ev = migrate_event(event_pb2.Event.FromString(raw))  # legacy simple_value -> scalars
                if first_t is None and ev.wall_time > 0:
                    first_t = ev.wall_time
                if ev.WhichOneof("what") != "summary":
                    continue
                for value in ev.summary.value:
                    x = _scalar(value, res.skipped)
                    if x is None:
                        continue
                    step = max(0, int(ev.step))
                    t, vals = by_step.get(step, (ev.wall_time, {}))
                    vals[value.tag] = x
                    by_step[step] = (max(t, ev.wall_time), vals)
        except Exception as e:  # one damaged file never stops the others
            res.problems.append(f"{f}: stopped after {n} records: {type(e).__name__}: {e}")
            continue
        offsets, torn = _record_offsets(f)
        if n < len(offsets):
            res.problems.append(
                f"{f}: byte {offsets[n]}: record {n + 1} of {len(offsets)} is corrupt (CRC); "
                f"it and the {len(offsets) - n - 1} after it were not read"
            )
        elif torn:
            res.truncated = True
    if first_t is None:
        res.error = "no readable TensorBoard events" + (f" ({res.problems[0]})" if res.problems else "")
        return RunLogBuilder(run_id), res

    log = RunLogBuilder(run_id)
    log.start(first_t, {}, name=directory.name, tags=["tensorboard"], imported_from="tensorboard")
    last_t, final_step = first_t, None
    for step in sorted(by_step):
        t, vals = by_step[step]
        log.add("metrics", vals, step, t if math.isfinite(t) and t > 0 else last_t)
        last_t = max(last_t, t)
        final_step = step
        res.metric_events += 1
        res.values += len(vals)
    if status is not None:
        log.add(
            "run_end", {"status": status, "final_step": final_step, "status_inferred": True}, None, last_t
        )
        res.status = status
    else:  # --status none: no end recorded, so none is invented; the store shows it crashed at its last event
        log.crashed(last_t, "TensorBoard records no run end; imported with --status none")
    return log, res


def import_tensorboard(
    paths: Iterable[str | os.PathLike],
    runs_dir: str | os.PathLike,
    db: str | os.PathLike | None = None,
    *,
    status: str | None = "completed",
    ingest: bool = True,
    replace: bool = False,
    progress: Callable[[dict], None] | None = None,
) -> list[ImportResult]:
    """Import every tfevents directory under `paths` into `runs_dir`, then ingest into `db`.

    `progress` is called after each directory (one run) with `{"done", "total", "unit": "runs"}`.
    """
    results = []
    dirs = find_tfevents_dirs(paths)
    for directory, run_id in dirs:
        try:
            log, res = convert_tensorboard_dir(directory, run_id, status)
            if res.error is None:
                settle(res, log.write(runs_dir, replace))
        except Exception as e:
            res = ImportResult(source=directory, run=run_id, error=f"{type(e).__name__}: {e}")
        results.append(res)
        if progress is not None:
            progress({"done": len(results), "total": len(dirs), "unit": "runs", "what": run_id})
    if ingest and any(r.written for r in results):
        from observatory.interop import ingest_runs

        ingest_runs(runs_dir, db, rebuild=any(r.written == "replaced" for r in results))
    return results
