"""Import W&B offline runs (`wandb/offline-run-*/run-*.wandb`) into our event logs.

Mapping (one W&B run -> one run `wandb-<W&B run id>`, host 0):

- `run` record -> `run_start`: config (values are JSON in `value_json`, W&B's own `_wandb`
  key dropped, secrets redacted), display name, tags, and `wandb` = {id, project, entity,
  group, job_type}. Later `config` records are merged in (the run_start holds the final config).
- `history` record -> one `metrics` event at its `_step` (else the record's step number),
  `t` = its `_timestamp`; nested keys flattened with `/`; `_runtime`, `_timestamp`, `_step`
  and other `_`-prefixed keys are not metrics. Histograms and media (values with a `_type`)
  and non-numbers are skipped and counted.
- `stats` records (W&B's system metrics: CPU, memory, disk, network, GPU) -> `heartbeat` events
  at their time and the highest step logged before them, under our telemetry names (`wandb_stats`).
- `summary` records are merged; `exit` -> `run_end` with status `completed` (exit code 0)
  or `failed`, `final_step`, the scalar `summary` and the `exit_code`.
- No `exit` record (the run crashed, the file is truncated, or the run is still live) -> no
  `run_end` but a `failure` (`type` crashed) with `final: true` at its last event's time
  (`RunLogBuilder.crashed`): the store shows the run crashed there, from the log alone. Imported
  again once the source has grown, the log goes on after that marker (`interop.continued`).

Damaged files import what is valid; every unreadable region is reported with its byte
offset (see `wandb_reader`). One bad file never stops the import of the others.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from observatory.events import is_final_failure
from observatory.interop import ImportResult, RunLogBuilder, flatten, safe_run_id, settle
from observatory.interop.wandb_reader import Problem, WandbLogReader
from observatory.interop.wandb_stats import Environment, stats_heartbeat

__all__ = ["find_wandb_files", "convert_wandb_file", "merge_sessions", "import_wandb"]

_FILE_ID_RE = re.compile(r"^run-(.+)\.wandb$")
_NOT_METRICS = {"_step", "_runtime", "_timestamp", "_wandb"}


def find_wandb_files(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Every `.wandb` file under the given files or folders (a `wandb/` dir, a run dir, a file)."""
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_file():
            found.append(p.resolve())
        elif p.is_dir():
            # resolved, so W&B's `latest-run` symlink does not import its run twice
            found.extend(sorted(q.resolve() for q in p.rglob("*.wandb") if q.is_file()))
        else:
            raise FileNotFoundError(f"{p}: no such file or folder")
    return sorted(set(found), key=found.index)


def _json(value_json: str) -> Any:
    # W&B writes NaN/Infinity as bare tokens, which Python's json accepts
    return json.loads(value_json) if value_json else None


def _item_value(item) -> Any:
    """A HistoryItem's value: the typed oneof (newer writers) or `value_json` (all writers)."""
    which = item.WhichOneof("value")
    if which is None:
        return _json(item.value_json)
    if which == "none":
        return None
    if which == "json":
        return _json(item.json)
    return getattr(item, which)


def _item_path(item) -> list[str]:
    return list(item.nested_key) if len(item.nested_key) else [item.key]


def _item_key(item) -> tuple[str, ...]:
    nk = item.nested_key
    return tuple(nk) if len(nk) else (item.key,)


def _history_row(hist, skipped: Counter) -> tuple[int, float | None, dict[str, float]]:
    """One history record -> (step, t, {flat name: value}). Raises ValueError on bad JSON.

    The hot path of an import: all of a row's `value_json` strings are parsed with one
    `json.loads` call, and only keys with a nested path build a nested dict.
    """
    keys: list[tuple[str, ...]] = []
    raws: list[str] = []
    typed: dict[int, Any] = {}
    for i, item in enumerate(hist.item):
        keys.append(_item_key(item))
        raw = item.value_json
        if raw:  # what every W&B writer fills in
            raws.append(raw)
        else:
            typed[i] = _item_value(item)
            raws.append("null")
    try:
        values = json.loads("[" + ",".join(raws) + "]")
    except ValueError:
        for key, raw in zip(keys, raws, strict=True):  # find the culprit, for the message
            try:
                json.loads(raw)
            except ValueError as e:
                raise ValueError(f"value of {'/'.join(key)!r} is not JSON ({e}): {raw[:60]!r}") from None
        raise
    for i, v in typed.items():
        values[i] = v
    flat: dict[str, float] = {}
    nested: dict = {}
    special: dict[str, Any] = {}
    for key, v in zip(keys, values, strict=True):
        name = key[0]
        if name.startswith("_"):
            if len(key) == 1:
                special[name] = v
        elif len(key) > 1:
            _set_path(nested, list(key), v)
        elif type(v) is float or type(v) is int:
            flat[name] = float(v)
        else:
            flatten(v, name, flat, skipped)
    if nested:
        flatten(nested, "", flat, skipped)
    step = special.get("_step")
    if isinstance(step, float) and step.is_integer():
        step = int(step)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        step = hist.step.num
    t = special.get("_timestamp")
    t = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) else None
    return step, t, flat


def _set_path(tree: dict, path: list[str], value: Any) -> None:
    node = tree
    for k in path[:-1]:
        nxt = node.get(k)
        if not isinstance(nxt, dict):
            nxt = node[k] = {}
        node = nxt
    node[path[-1]] = value


def _del_path(tree: dict, path: list[str]) -> None:
    node = tree
    for k in path[:-1]:
        node = node.get(k)
        if not isinstance(node, dict):
            return
    node.pop(path[-1], None)


def _scalars(tree: dict, skipped: Counter | None) -> dict[str, float]:
    return flatten(
        {k: v for k, v in tree.items() if k not in _NOT_METRICS and not k.startswith("_")}, "", None, skipped
    )


def convert_wandb_file(
    path: str | os.PathLike, run_prefix: str = "wandb"
) -> tuple[RunLogBuilder, ImportResult]:
    """Read one `.wandb` file into an in-memory event log. Never raises for damaged input."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2 as pb

    path = Path(path)
    res = ImportResult(source=path)
    reader = WandbLogReader(path)
    run_rec = None
    config: dict = {}
    summary_raw: dict[tuple[str, ...], str] = {}
    exit_rec = None
    rows: list[tuple[int, float | None, dict[str, float]]] = []  # (step, t, values)
    # W&B's system-stats records with the number of history rows before each (the events keep the source's
    # order, so a re-import of a grown file only appends); read once the environment (CPU count, GPUs) is known
    stats: list[tuple[int, Any]] = []
    env = Environment()
    first_t: float | None = None
    bad: list[Problem] = []
    for offset, payload in reader:
        rec = pb.Record()
        try:
            rec.ParseFromString(payload)
        except DecodeError as e:
            bad.append(Problem(offset, len(payload), f"record does not parse as a W&B Record ({e})"))
            continue
        res.records += 1
        kind = rec.WhichOneof("record_type")
        if kind == "history":
            try:
                step, t, values = _history_row(rec.history, res.skipped)
            except ValueError as e:  # bad JSON inside a record whose CRC passed
                bad.append(Problem(offset, len(payload), f"history row: {e}"))
                continue
            if t is not None and first_t is None:
                first_t = t
            rows.append((step, t, values))
        elif kind == "run":
            run_rec = rec.run
            for item in rec.run.config.update:
                _set_config(config, item, bad, offset, len(payload))
        elif kind == "config":
            for item in rec.config.update:
                _set_config(config, item, bad, offset, len(payload))
            for item in rec.config.remove:
                _del_path(config, _item_path(item))
        elif kind == "summary":
            # keep the raw JSON of the latest value per key; parse once at the end (W&B
            # writes a summary update beside every history row)
            for item in rec.summary.update:
                summary_raw[_item_key(item)] = item.value_json
            for item in rec.summary.remove:
                gone = _item_key(item)
                for key in [k for k in summary_raw if k[: len(gone)] == gone]:
                    del summary_raw[key]
        elif kind == "exit":
            exit_rec = rec.exit
        elif kind == "stats":
            stats.append((len(rows), rec.stats))
        elif kind == "environment":
            env.update(rec.environment)
        # other records (console output, files, W&B's own telemetry) are not run data
    problems = reader.problems + bad
    res.problems = [f"{path}: {p}" for p in sorted(problems, key=lambda p: p.offset)]
    res.truncated = reader.truncated

    if run_rec is None and not rows and exit_rec is None:
        res.error = (
            "no readable W&B records"
            + (f" ({res.problems[0]})" if res.problems else "")
            + (" (empty file)" if not path.stat().st_size else "")
        )
        return RunLogBuilder(safe_run_id(run_prefix, "invalid")), res

    source_id = run_rec.run_id if run_rec is not None and run_rec.run_id else None
    if source_id is None:
        m = _FILE_ID_RE.match(path.name)
        source_id = m.group(1) if m else path.stem
    res.run = safe_run_id(run_prefix, source_id)
    log = RunLogBuilder(res.run)

    start_t = None
    if run_rec is not None and run_rec.HasField("start_time"):
        start_t = run_rec.start_time.seconds + run_rec.start_time.nanos / 1e9
    if start_t is None or start_t <= 0:
        start_t = first_t if first_t is not None else path.stat().st_mtime
    config.pop("_wandb", None)
    wandb_info = {}
    if run_rec is not None:
        wandb_info = {
            k: v
            for k, v in (
                ("id", run_rec.run_id),
                ("project", run_rec.project),
                ("entity", run_rec.entity),
                ("group", run_rec.run_group),
                ("job_type", run_rec.job_type),
                ("host", run_rec.host),
            )
            if v
        }
    log.start(
        start_t,
        config,
        name=run_rec.display_name if run_rec is not None else None,
        tags=list(run_rec.tags) if run_rec is not None else None,
        wandb=wandb_info,
        imported_from="wandb",
    )

    last_t = start_t
    final_step = None
    pending = iter(stats)
    nxt = next(pending, None)
    for i, (step, t, values) in enumerate([*rows, (None, None, None)]):
        while nxt is not None and (
            nxt[0] <= i or step is None
        ):  # the stats records W&B wrote before this row
            last_t = max(last_t, _heartbeat(log, res, env, nxt[1], final_step))
            nxt = next(pending, None)
        if step is None:
            break
        t = last_t if t is None else t
        last_t = max(last_t, t)
        final_step = step if final_step is None else max(final_step, step)
        if not values:
            continue
        log.add("metrics", values, step, t)
        res.metric_events += 1
        res.values += len(values)

    if exit_rec is not None:
        res.status = "completed" if exit_rec.exit_code == 0 else "failed"
        end_t = max(last_t, start_t + exit_rec.runtime) if exit_rec.runtime else last_t
        end = {"status": res.status, "final_step": final_step, "exit_code": exit_rec.exit_code}
        summary: dict = {}
        for key, raw in summary_raw.items():
            try:
                _set_path(summary, list(key), _json(raw))
            except ValueError:
                res.skipped["bad summary value"] += 1
        scalars = _scalars(summary, None)
        if scalars:
            end["summary"] = scalars
        log.add("run_end", end, None, end_t)
    else:
        why = "its file is truncated" if res.truncated else "the run crashed or is still running"
        log.crashed(last_t, f"W&B log without an exit record ({why}): imported up to its last whole record")
    return log, res


def _heartbeat(log: RunLogBuilder, res: ImportResult, env: Environment, stats, step: int | None) -> float:
    """One W&B stats record as a heartbeat at `step` (the highest logged before it); returns its time."""
    t, telemetry = stats_heartbeat(stats, env, res.skipped)
    if telemetry:
        log.add("heartbeat", {**telemetry, **({"step": step} if step is not None else {})}, step, t)
        res.heartbeats += 1
    return t


def merge_sessions(logs: list[RunLogBuilder]) -> RunLogBuilder:
    """The sessions of a resumed W&B run (in time order) as one event log.

    One `run_start` (the first session's, with the config as the last session left it),
    every session's metrics, and the end of the last session only, its `run_end` or its
    final `failure` (an earlier session's end was not the end of the run).
    """
    merged = RunLogBuilder(logs[0].run)
    start = dict(logs[0].events[0]["data"])
    config = dict(start.get("config") or {})
    for log in logs[1:]:
        config.update(log.events[0]["data"].get("config") or {})
    start["config"] = config
    start["resumed_sessions"] = len(logs)
    merged.add("run_start", start, None, logs[0].events[0]["t"])
    for i, log in enumerate(logs):
        for ev in log.events[1:]:
            if (ev["kind"] == "run_end" or is_final_failure(ev["kind"], ev["data"])) and i < len(logs) - 1:
                continue
            merged.add(ev["kind"], ev["data"], ev["step"], ev["t"])
    return merged


def _set_config(config: dict, item, bad: list, offset: int, length: int) -> None:
    try:
        _set_path(config, _item_path(item), _json(item.value_json))
    except ValueError as e:
        bad.append(Problem(offset, length, f"config value {_item_path(item)}: {e}"))


def import_wandb(
    paths: Iterable[str | os.PathLike],
    runs_dir: str | os.PathLike,
    db: str | os.PathLike | None = None,
    *,
    ingest: bool = True,
    replace: bool = False,
    progress: Callable[[dict], None] | None = None,
) -> list[ImportResult]:
    """Import every `.wandb` file under `paths` into `runs_dir`, then ingest into `db`.

    Returns one `ImportResult` per file, in order. A file that cannot be read at all gets
    `error` set; the others are imported regardless. `progress` is called after each file
    with `{"done", "total", "unit": "files"}`.
    """
    converted: list[tuple[RunLogBuilder | None, ImportResult]] = []
    files = find_wandb_files(paths)
    for i, f in enumerate(files):
        try:
            converted.append(convert_wandb_file(f))
        except Exception as e:  # one bad file never stops the others
            converted.append((None, ImportResult(source=f, error=f"{type(e).__name__}: {e}")))
        if progress is not None:
            progress({"done": i + 1, "total": len(files), "unit": "files", "what": f.name})
    # a resumed W&B run is several files (one per session) with one run id: one run here
    sessions: dict[str, list[tuple[RunLogBuilder, ImportResult]]] = {}
    for log, res in converted:
        if log is not None and res.error is None:
            sessions.setdefault(res.run, []).append((log, res))
    for parts in sessions.values():
        parts.sort(key=lambda p: (p[0].events[0]["t"], str(p[1].source)))
        log = merge_sessions([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
        try:
            state = log.write(runs_dir, replace)
        except OSError as e:
            for _, res in parts:
                res.error = f"cannot write the run's event log: {e}"
            continue
        for i, (_, res) in enumerate(parts):
            settle(res, state)
            if len(parts) > 1:
                res.status = parts[-1][1].status
                res.note = f"session {i + 1} of {len(parts)} of a resumed W&B run, imported as one run"
    results = [res for _, res in converted]
    if ingest and any(r.written for r in results):
        from observatory.interop import ingest_runs

        ingest_runs(runs_dir, db, rebuild=any(r.written == "replaced" for r in results))
    return results
