"""The `observatory` tracker type for Levanter: every `Tracker` method onto our event log.

Levanter builds its trackers from `trainer.tracker` in the YAML config through a draccus
registry; `ObservatoryConfig` registers there as `type: observatory`. The tracker writes
through `observatory.writer.Run`, whose background thread does the serialising and the
disk, so a training step only pays for a dict and a queue put.

How Levanter's calls map (docs/levanter.md has the metric-name table):

- `log_hyperparameters` -> `run_start.config`. `run_start` is written at the first
  `log_hyperparameters` (Levanter sends the whole config right after building the
  trackers), so the config lands in `run_start` itself; any other call that comes first
  writes `run_start` with an empty config, and a later `log_hyperparameters` becomes a
  `config_diff`. Values JSON cannot hold (dtypes, paths, durations, enums, dataclasses)
  are converted, never raised on; secrets are redacted.
- `log` -> `metrics`, plus `expert_load`, `eval` and `histogram` events (see `names`).
  A `SummaryStats` value becomes `<name>/min`, `/max`, `/mean`, `/rms`, `/variance`,
  `/nonzero_count` and, when it carries one, a `histogram` event. `step=None` (what
  `jit_log` sends from inside jit) is held and written with the next step Levanter logs,
  which is the step being computed when it ran; `finish` writes what is left.
- `log_summary` -> `summary`; `log_artifact` and `log_html` -> `artifact`.
- `finish` -> `run_end(completed)`. An exception that ends the program (Levanter's
  `train_lm` does not catch it) -> `failure` + `run_end(failed)`, through a chained
  `sys.excepthook`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import hashlib
import math
import os
import re
import sys
import traceback
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

import jax
import numpy as np
from levanter.tracker import NoopTracker, Tracker, TrackerConfig
from levanter.tracker.histogram import Histogram, SummaryStats

from observatory import settings
from observatory.events import RUN_ID_RE
from observatory.integrations.levanter.names import translate
from observatory.redact import redact
from observatory.writer import Run, new_run_id

__all__ = ["ObservatoryTracker", "ObservatoryConfig", "jsonable"]

STATS = ("min", "max", "mean", "rms", "variance", "nonzero_count")
# Mixtral logs each expert's share of a layer's assignments; without the config's batch and
# sequence sizes the counts are written out of this many (parts per million).
SHARE_SCALE = 1_000_000
MAX_LIST = 1000  # longer arrays in a config are summarised, not stored


def jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-ready copy of a config value; whatever it is, never raise."""
    try:
        return _jsonable(value, depth)
    except Exception:
        return _text(value)


def _text(value: Any) -> str:
    try:
        return repr(value)[:500]
    except Exception:
        return f"<{type(value).__name__}>"


def _jsonable(v: Any, depth: int) -> Any:
    if depth > 32:
        return _text(v)
    if v is None or isinstance(v, (bool, int, str)) and not isinstance(v, enum.Enum):
        return v
    if isinstance(v, float):
        return v  # NaN/inf: the writer stores their string form
    if isinstance(v, enum.Enum):  # str-subclass enums included
        return jsonable(v.value, depth + 1)
    if isinstance(v, Mapping):
        return {str(k): jsonable(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=str) if isinstance(v, (set, frozenset)) else v
        return [jsonable(x, depth + 1) for x in items]
    if isinstance(v, (PurePath, os.PathLike)):
        return os.fspath(v)
    if isinstance(v, dt.timedelta):
        return v.total_seconds()
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, np.dtype):
        return str(v)
    if isinstance(v, type):  # jnp.float32 and friends are scalar types; classes in general
        try:
            return str(np.dtype(v))
        except TypeError:
            return f"{v.__module__}.{v.__qualname__}"
    if isinstance(v, (np.generic, np.ndarray, jax.Array)):
        a = np.asarray(v)
        if a.ndim == 0:
            return a.item()
        return a.tolist() if a.size <= MAX_LIST else f"array{list(a.shape)} {a.dtype}"
    if dataclasses.is_dataclass(v):
        return {f.name: jsonable(getattr(v, f.name, None), depth + 1) for f in dataclasses.fields(v)}
    if callable(v):
        return getattr(v, "__qualname__", None) or _text(v)
    return _text(v)


def _scalar(v: Any) -> float | None:
    """A number from a Python, numpy or jax scalar (0-d arrays included); None if it is not one."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, (np.generic, np.ndarray, jax.Array)) and np.ndim(v) == 0:
        a = np.asarray(v)
        if a.dtype.kind in "biuf":
            return float(a)
    return None


def _flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in metrics.items():
        name = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, name + "/"))
        else:
            out[name] = v
    return out


def _flat_config(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat_config(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d} if prefix else {}


def _merge(base: dict, new: dict) -> dict:
    out = dict(base)
    for k, v in new.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


class _Payload:
    """One `log` call's values, sorted into what each becomes."""

    def __init__(self) -> None:
        self.scalars: dict[str, float] = {}
        self.arrays: dict[str, Any] = {}  # name -> ndarray, or (limits, counts) of a histogram
        self.histograms: dict[str, dict] = {}
        self.summary: dict[str, Any] = {}

    def add(self, metrics: Mapping[str, Any]) -> None:
        for name, v in _flatten(metrics).items():
            x = _scalar(v)
            if x is not None:
                self.scalars[name] = x
            elif isinstance(v, SummaryStats):
                self._stats(name, v)
            elif isinstance(v, Histogram):
                self.histogram(name, v.bucket_limits, v.bucket_counts, {})
            elif isinstance(v, (np.ndarray, jax.Array)) and np.asarray(v).dtype.kind in "biuf":
                self.arrays[name] = np.asarray(v)
            elif v is not None:
                # strings and other values: stored where wandb shows them, as the run's summary
                self.summary[name] = v if isinstance(v, str) else _text(v)

    def merge(self, other: _Payload) -> None:
        self.scalars.update(other.scalars)
        self.arrays.update(other.arrays)
        self.histograms.update(other.histograms)
        self.summary.update(other.summary)

    def __bool__(self) -> bool:
        return bool(self.scalars or self.arrays or self.histograms or self.summary)

    def _stats(self, name: str, s: SummaryStats) -> None:
        for stat in STATS:
            x = _scalar(getattr(s, stat, None))
            if x is not None:
                self.scalars[f"{name}/{stat}"] = x
        if s.histogram is not None:
            extra = {
                k: getattr(s, a)
                for k, a in (
                    ("min", "min"),
                    ("max", "max"),
                    ("sum", "sum"),
                    ("sum_squares", "sum_squares"),
                    ("count", "num"),
                )
            }
            self.histogram(name, s.histogram.bucket_limits, s.histogram.bucket_counts, extra)

    def histogram(self, name: str, limits: Any, counts: Any, extra: dict) -> None:
        lim = np.asarray(limits, dtype=float).ravel()
        cnt = np.asarray(counts, dtype=float).ravel()
        if lim.size != cnt.size + 1:
            return
        self.arrays.setdefault(name, (lim, cnt))
        data: dict[str, Any] = {
            "name": name,
            "bucket_limits": lim.tolist(),
            "bucket_counts": [max(0, int(round(c))) if math.isfinite(c) else 0 for c in cnt],
        }
        for k, v in extra.items():
            x = _scalar(v)
            if x is not None:
                data[k] = x
        self.histograms[name] = data


class ObservatoryTracker(Tracker):
    """A Levanter `Tracker` writing one run's event log (`<runs_dir>/<run_id>/events.<host>.jsonl`)."""

    name: str = "observatory"

    def __init__(
        self,
        run_id: str,
        runs_dir: str | os.PathLike,
        *,
        name: str | None = None,
        tags: list[str] | None = None,
        host: int = 0,
        **writer_options: Any,
    ):
        self.run = Run(run_id, runs_dir, host, **writer_options)
        self.run.phase("init")  # Levanter's first logged step says "train" (the writer's rule)
        self.run_name = name
        self.tags = list(tags or [])
        self._config: dict[str, Any] = {}
        self._flat: dict[str, Any] = {}  # the config as dotted keys, for the name table's divisors
        self._started = False
        self._step: int | None = None
        self._pending = _Payload()  # step=None values, written with the next step
        self._assignments: int | None = (
            None  # router assignments per layer per step (Mixtral shares -> counts)
        )
        self._loads_written: set[tuple[int, int]] = set()  # (step, layer): one expert_load each
        self._ended = False
        self._old_hook = sys.excepthook
        sys.excepthook = self._excepthook

    # ---------------------------------------------------------------- Tracker API

    def log_hyperparameters(self, hparams: dict[str, Any]) -> None:
        config = jsonable(hparams)
        if not isinstance(config, dict):
            config = {"hparams": config}
        self._assignments = _assignments(config) or self._assignments
        if not self._started:
            self._start(config)
            return
        merged = _merge(self._config, config)
        old, new = _flat_config(redact(self._config)), _flat_config(redact(merged))
        changes = {k: [old.get(k), v] for k, v in new.items() if old.get(k) != v}
        changes.update({k: [v, None] for k, v in old.items() if k not in new})
        self._config = merged
        self._flat = _flat_config(merged)
        if changes:
            self.run.event(
                "config_diff",
                {"against": {"run": self.run.id, "step": self._step}, "changes": changes},
                step=self._step,
            )

    def log(self, metrics: Mapping[str, Any], *, step: int | None, commit: bool | None = None) -> None:
        self._ensure_started()
        payload = _Payload()
        payload.add(jax.device_get(dict(metrics)))
        if step is None:
            self._pending.merge(payload)
            if commit and self._step is not None:
                self._write(self._step, self._take_pending(), loads=False)
            return
        step = int(step)
        self._step = step if self._step is None else max(self._step, step)
        if self._pending:
            self._write(step, self._take_pending(), loads=False)
        self._write(step, payload, loads=True)

    def log_summary(self, metrics: Mapping[str, Any]) -> None:
        self._ensure_started()
        payload = _Payload()
        values = jax.device_get(dict(metrics))
        payload.add(values)
        data: dict[str, Any] = {**payload.scalars, **payload.summary}
        data.update({k: v for k, v in _flatten(values).items() if isinstance(v, bool)})
        if data:
            self.run.event("summary", redact(data), step=self._step)

    def log_artifact(self, artifact_path, *, name: str | None = None, type: str | None = None) -> None:
        self._ensure_started()
        path = os.fspath(artifact_path)
        data: dict[str, Any] = {
            "name": name or os.path.basename(path.rstrip("/")) or path,
            "type": type or "file",
            "path": path,
        }
        size, digest = _size_and_digest(path)
        if size is not None:
            data["bytes"] = size
        if digest is not None:
            data["digest"] = digest
        self.run.event("artifact", data, step=self._step)

    def log_html(self, key: str, html_path, *, step: int | None, commit: bool | None = None) -> None:
        self.log_artifact(html_path, name=key, type="html")

    def finish(self) -> None:
        self._end("completed")

    # ----------------------------------------------------------------- internals

    def _start(self, config: dict[str, Any]) -> None:
        self._started = True
        self._config = config
        self._flat = _flat_config(config)
        data: dict[str, Any] = {
            "config": redact(config),
            "source": {"trainer": "levanter", "version": _levanter_version()},
            "mesh": {"processes": jax.process_count(), "devices": jax.device_count()},
        }
        if self.run_name:
            data["name"] = self.run_name
        if self.tags:
            data["tags"] = self.tags
        self.run.event("run_start", data)

    def _ensure_started(self) -> None:
        if not self._started:
            self._start({})

    def _take_pending(self) -> _Payload:
        p, self._pending = self._pending, _Payload()
        return p

    def _write(self, step: int, p: _Payload, *, loads: bool) -> None:
        tr = translate(p.scalars, p.arrays, self._flat)
        if tr.metrics:
            self.run.log(tr.metrics, step=step)
        for ds, ev in tr.evals.items():
            self.run.event("eval", {"dataset": ds, **ev}, step=step)
        for name, a in p.arrays.items():
            if isinstance(a, np.ndarray) and name not in tr.claimed and a.size:
                # an array no row of the name table reads: kept as the distribution of its values
                finite = a[np.isfinite(a)] if a.dtype.kind == "f" else a
                if finite.size:
                    counts, limits = np.histogram(finite, bins=31)
                    p.histogram(
                        name, limits, counts, {"min": finite.min(), "max": finite.max(), "count": a.size}
                    )
        for h in p.histograms.values():
            self.run.event("histogram", h, step=step)
        if p.summary:
            self.run.event("summary", redact(p.summary), step=step)
        if loads:  # values jit_log sends without a step (e.g. an eval forward pass) stay metrics only
            self._expert_loads(step, tr.loads, tr.counts)

    def _expert_loads(
        self, step: int, shares: dict[int, dict[int, float]], counts: dict[int, list[int]]
    ) -> None:
        layers = dict(counts)
        scale = self._assignments or SHARE_SCALE
        for layer, by_expert in shares.items():
            if layer not in layers and by_expert:
                got = [by_expert.get(j, 0.0) for j in range(max(by_expert) + 1)]
                layers[layer] = [max(0, round(x * scale)) if math.isfinite(x) else 0 for x in got]
        self._loads_written = {k for k in self._loads_written if k[0] >= step}
        for layer in sorted(layers):
            if (step, layer) in self._loads_written:
                continue
            self._loads_written.add((step, layer))
            routed = layers[layer]
            # neither model reports drops per expert: per-layer drop fractions stay metrics
            self.run.log_expert_load(step, layer, routed, [0] * len(routed))

    def _end(self, status: str) -> None:
        if self._ended:
            return
        self._ended = True
        if self._pending and self._step is not None:
            self._write(self._step, self._take_pending(), loads=False)
        self._ensure_started()
        if sys.excepthook == self._excepthook:
            sys.excepthook = self._old_hook
        self.run.finish(status, final_step=self._step)

    def fail(self, exc: BaseException) -> None:
        """Record an exception that ended training: `failure` + `run_end(failed)`."""
        if self._ended:
            return
        self._ensure_started()
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:]
        self.run.event(
            "failure",
            {
                "type": "exception",
                "message": f"{type(exc).__name__}: {exc}"[:2000],
                "traceback": tb,
                "action": "halt",
            },
            step=self._step,
        )
        self._end("failed")

    def _excepthook(self, exc_type, exc, tb) -> None:
        if issubclass(exc_type, Exception):
            try:
                self.fail(exc)
            except Exception as e:  # the original error matters more than ours
                print(f"observatory tracker: could not record the failure: {e}", file=sys.stderr)
        self._old_hook(exc_type, exc, tb)


def _assignments(config: dict[str, Any]) -> int | None:
    """Router assignments per layer per step: batch size x sequence length x experts per token."""
    model = config.get("model") if isinstance(config.get("model"), dict) else {}
    trainer = config.get("trainer") if isinstance(config.get("trainer"), dict) else {}
    k = model.get("num_experts_per_tok")
    seq = config.get("train_seq_len") or model.get("max_seq_len") or model.get("seq_len")
    batch = trainer.get("train_batch_size")
    if all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in (k, seq, batch)):
        return batch * seq * k
    return None


def _levanter_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("marin-levanter")
    except PackageNotFoundError:
        return "unknown"


def _size_and_digest(path: str) -> tuple[int | None, str | None]:
    """Size in bytes (a folder: its files' total) and, for a file up to 64 MB, its sha256."""
    try:
        if os.path.isdir(path):
            total = 0
            for root, _dirs, files in os.walk(path):
                for f in files:
                    total += os.path.getsize(os.path.join(root, f))
            return total, None
        size = os.path.getsize(path)
        if size > 64 << 20:
            return size, None
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return size, "sha256:" + h.hexdigest()
    except OSError:
        return None, None


def _run_id(run_id: str | None) -> str:
    if run_id and RUN_ID_RE.match(run_id):
        return run_id
    return new_run_id(re.sub(r"[^A-Za-z0-9._-]+", "-", run_id or "levanter"))


@TrackerConfig.register_subclass("observatory")
@dataclasses.dataclass
class ObservatoryConfig(TrackerConfig):
    """`trainer.tracker: {type: observatory, ...}` in a Levanter config."""

    runs_dir: str | None = (
        None  # default: the `runs` setting (env OBSERVATORY_RUNS, else the per-user runs dir)
    )
    run_id: str | None = None  # default: Levanter's run id (trainer.id)
    name: str | None = None  # a human-readable name for the run
    tags: list[str] = dataclasses.field(default_factory=list)

    def init(self, run_id: str | None) -> Tracker:
        if jax.process_index() != 0:
            return NoopTracker()  # one event log per run: process 0 writes it
        runs_dir = self.runs_dir or settings.get("runs")
        return ObservatoryTracker(_run_id(self.run_id or run_id), runs_dir, name=self.name, tags=self.tags)
