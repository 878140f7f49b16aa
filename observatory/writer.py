"""The event writer: `observatory.init(...)` → `Run` with `log`, `event`, `finish`.

The call site never waits on the disk: `log` validates its arguments (programmer
errors raise here, with a clear message), stamps the envelope and puts a small
tuple on a bounded queue. A background thread serialises, writes, flushes and
fsyncs at least every `flush_interval` seconds. A full queue drops the event,
counts it, and the count is reported as `writer/dropped_events` in the next
`metrics` event that makes it through.

    run = observatory.init(config={"lr": 3e-4})
    for step in range(100):
        run.log({"train/loss": loss}, step=step)
    run.finish()
"""

from __future__ import annotations

import atexit
import json
import math
import os
import queue
import re
import secrets
import signal
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from observatory import bucket as _bucket
from observatory import provenance, settings
from observatory.events import OBSERVATORY_HOST, PHASES, RUN_ID_RE, STATUSES, VERSION, encode_value
from observatory.logtail import last_seq as _tail
from observatory.logtail import next_attempt as _attempt
from observatory.logtail import open_under
from observatory.redact import redact

# Encodes a clean event (finite floats, ints, str keys: `metrics` and `expert_load`) ~15x faster
# than json.dumps, as the same JSON values (floats round-trip; `1e16` rather than `1e+16`).
_CLEAN = msgspec.json.Encoder()

__all__ = ["init", "Run", "Sink", "new_run_id", "log_path", "check_event", "encode_event", "append_shared"]


class Sink(Protocol):
    """Somewhere else events go too (e.g. a W&B mirror). Called on the writer thread."""

    def write(self, events: list[dict]) -> None: ...

    def close(self) -> None: ...


def new_run_id(name: str | None = None) -> str:
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-")[:96] if name else "run"
    return f"{stem or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


def check_step(step: Any, where: str) -> int | None:
    """A step as an int >= 0 (numpy ints welcome) or None; raise naming `where` otherwise."""
    if step is None:
        return None
    if isinstance(step, bool) or not isinstance(step, int):
        try:
            import numpy as np  # numpy ints from training loops are fine

            if isinstance(step, np.integer):
                step = int(step)
            else:
                raise TypeError
        except (ImportError, TypeError):
            raise TypeError(f"{where}: step must be an int, got {type(step).__name__} {step!r:.40}") from None
    if step < 0:
        raise ValueError(f"{where}: step must be >= 0, got {step}")
    return step


def _to_float(name: str, value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(f"log: metric {name!r} is a bool; log it as 0 or 1")
    try:
        f = float(value)  # ints, floats, numpy and jax scalars
    except (TypeError, ValueError):
        raise TypeError(
            f"log: metric {name!r} must be a number, got {type(value).__name__} {value!r:.40}"
        ) from None
    return f


class Run:
    """A live run's event writer. Create with `observatory.init`."""

    def __init__(
        self,
        run_id: str,
        runs_dir: Path | str,
        host: int = 0,
        *,
        queue_size: int = 100_000,
        flush_interval: float = 0.2,
        sinks: Iterable[Sink] = (),
        install_signal_handlers: bool = True,
        heartbeat_s: float | None = None,
        seq_from: int = 0,
        chunk_s: float | None = None,
        chunk_mb: float | None = None,
    ):
        """`seq_from`: number events from at least this seq (a file that continues the numbering of another
        file of the same run and host: the observatory's findings folder beside a run folder's own).
        `runs_dir`: a folder, or a bucket URL (`s3://bucket/prefix`, `gs://...`): then the log is spooled to
        `spool_dir` and uploaded from there as chunk objects every `chunk_s` seconds or `chunk_mb` MB."""
        if not RUN_ID_RE.match(run_id):
            raise ValueError(f"run id {run_id!r} must match [A-Za-z0-9._-]{{1,128}}")
        if isinstance(host, bool) or not isinstance(host, int) or host < 0:
            raise ValueError(f"host must be an int >= 0, got {host!r}")
        self.id = run_id
        self.host = host
        where = _bucket.location(runs_dir)
        self.bucket = _bucket.Bucket(where) if isinstance(where, str) else None
        if self.bucket is not None and host >= OBSERVATORY_HOST:
            raise ValueError(f"host {host}: the observatory's own hosts write to a local findings folder")
        self.runs_dir = where  # the runs dir as given: a Path, or a bucket URL
        self.path = log_path(where, run_id, host)  # the local file: the log, or a bucket's spool
        self.dir = self.path.parent
        self.dir.mkdir(parents=True, exist_ok=True)
        # opened first, and never through a link: a run folder or log linked elsewhere (the signing key,
        # alerts.yaml) is refused, not appended to (`LinkRefused`, an OSError)
        self._file = open(
            open_under(self.dir.parent, f"{run_id}/{self.path.name}", os.O_WRONLY | os.O_APPEND | os.O_CREAT),
            "ab",
            buffering=0,
        )
        # The observatory's own file (host >= 1000) has several writers at once (`decide new` while
        # `ingest --follow` runs the detectors, a ladder forecast): each batch is appended under an
        # exclusive flock, numbered from the file's tail. A training host's file has one writer and
        # keeps the lock-free hot path.
        self._shared = host >= OBSERVATORY_HOST
        self._end: int | None = None  # file size after our last append (shared files only)
        self._uploader = None
        if self.bucket is not None:
            self._uploader = _bucket.Uploader(
                self.bucket,
                self.path,
                run_id,
                host,
                settings.get("chunk_s") if chunk_s is None else chunk_s,
                settings.get("chunk_mb") if chunk_mb is None else chunk_mb,
            )
            seq_from = max(seq_from, self._uploader.seq_from)  # a stream the bucket has and this spool not
        self._seq = self._next_seq()  # assigned on the writer thread, so file order is seq order
        # the restart attempt this process is: 0 for a new log, one past the newest phase's for a resumed one
        self.attempt = 0 if self._seq == 0 else _attempt(self.path)
        self._seq = max(self._seq, seq_from)
        self._phase: str | None = None
        # (step, monotonic s) of the newest logged step, and where the heartbeat's step-time window starts:
        # each heartbeat says this process's own seconds per step since the one before (`perf/step_time_s`)
        self._clock: tuple[int, float] | None = None
        self._anchor: tuple[int, float] | None = None
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._dropped = 0
        self._dropped_reported = 0
        self._logged = 0
        self._signal: int | None = None
        self._exiting = False
        self._lock = threading.RLock()  # re-entrant: a signal handler may run while the main thread holds it
        self._flush_interval = flush_interval
        self._sinks = list(sinks)
        self._finished = False
        self._last_step: int | None = None
        if not self._shared:
            self._terminate_torn_line()  # shared files: done under the lock, at the first append
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"observatory-writer-{run_id}", daemon=True)
        self._thread.start()
        every = settings.get("heartbeat_s") if heartbeat_s is None else heartbeat_s
        if every and every > 0 and not self._shared:
            from observatory.telemetry import Heartbeat, Sampler

            self._sampler = Sampler()  # this run's: its byte counters start at its first heartbeat
            Heartbeat(self._heartbeat, float(every), self._stop, f"observatory-heartbeat-{run_id}").start()
        self._old_handlers: dict[int, Any] = {}
        if install_signal_handlers and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        atexit.register(self._atexit)

    # ------------------------------------------------------------- public API

    @property
    def where(self) -> str:
        """Where the log goes, as it may be shown: its file, or its chunks' prefix in the bucket."""
        if self.bucket is None:
            return str(self.path)
        return self.bucket.key_url(f"{self.id}/events.{self.host}/")

    @property
    def dropped_events(self) -> int:
        """Events the full queue forced us to drop so far."""
        return self._dropped

    @property
    def logged_events(self) -> int:
        """Events accepted onto the queue so far."""
        return self._logged

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Log scalar metrics at an optimizer step. Values: numbers, NaN and inf included."""
        step = check_step(step, "log")
        if step is None:
            raise TypeError("log: step is required")
        if not isinstance(metrics, Mapping):
            raise TypeError(f"log: metrics must be a dict of name to number, got {type(metrics).__name__}")
        data = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or not name:
                raise TypeError(f"log: metric names must be non-empty strings, got {name!r}")
            data[name] = _to_float(name, value)
        self._put_metrics(data, step)

    def _put_metrics(self, data: dict[str, float], step: int) -> None:
        """Queue a `metrics` event of checked floats, with the queue's drop count when it grew."""
        if self._phase in ("init", "compile"):  # a step's values: this process trains now
            self.phase("train", step=step)
        self._clock = (step, time.monotonic())
        # NaN/inf need their string form on disk; finite values can be dumped as they are
        clean = all(map(math.isfinite, data.values()))
        dropped = self._dropped
        if dropped > self._dropped_reported:
            data["writer/dropped_events"] = float(
                dropped
            )  # cumulative count of events the full queue dropped
        if self._put("metrics", data, step, clean=clean) and dropped > self._dropped_reported:
            self._dropped_reported = dropped

    def log_expert_load(self, step: int, layer: int, routed: Iterable[int], dropped: Iterable[int]) -> None:
        """Per-expert routed and dropped assignment counts for one layer."""
        step = check_step(step, "log_expert_load")
        if step is None:
            raise TypeError("log_expert_load: step is required")
        if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
            raise ValueError(f"log_expert_load: layer must be an int >= 0, got {layer!r}")
        r = _counts("routed", routed)
        d = _counts("dropped", dropped)
        if len(r) != len(d):
            raise ValueError(f"log_expert_load: {len(r)} routed counts but {len(d)} dropped counts")
        self._put("expert_load", {"layer": layer, "routed": r, "dropped": d}, step, clean=True)

    def event(self, kind: str, data: Mapping[str, Any], step: int | None = None) -> None:
        """Any other event kind (eval, checkpoint, note, failure, decision, ...)."""
        self._put(kind, dict(data), check_event(kind, data, step))

    def phase(self, name: str, budget_s: float | None = None, step: int | None = None) -> None:
        """Say this process enters a phase: init, compile, train, eval, checkpoint or shutdown. `budget_s`: how long
        it may take before it counts as a hang (a long eval or a synchronous save is not a stall); `step`: the
        step it is at (default: the last one logged)."""
        if name not in PHASES:
            raise ValueError(f"phase: must be one of {', '.join(PHASES)}, got {name!r}")
        if budget_s is not None and (
            isinstance(budget_s, bool) or not isinstance(budget_s, (int, float)) or budget_s <= 0
        ):
            raise ValueError(f"phase: budget_s must be a number of seconds > 0, got {budget_s!r}")
        step = self._last_step if step is None else check_step(step, "phase")
        self._phase = name
        # the step-time window restarts: an eval's or a save's seconds are not a step's
        self._anchor = None if step is None else (step, time.monotonic())
        data: dict[str, Any] = {"phase": name, "attempt": self.attempt}
        if budget_s is not None:
            data["budget_s"] = float(budget_s)
        self._put("phase", data, step)

    def _shutdown(self) -> None:
        """The `shutdown` phase, once, before the end a finishing or killed process writes."""
        if self._phase not in (None, "shutdown"):
            self._phase = "shutdown"
            self._put("phase", {"phase": "shutdown", "attempt": self.attempt}, self._last_step, force=True)

    def _heartbeat(self) -> None:
        data: dict[str, Any] = {
            k: v for k, v in self._sampler.sample(str(self.dir)).items() if math.isfinite(v)
        }
        if self._phase is not None:
            data["phase"] = self._phase
        if self._last_step is not None:
            data["step"] = self._last_step
        clock, anchor = self._clock, self._anchor
        # a step logged since the window began: its pace, and the next window starts there
        if clock is not None and (anchor is None or clock[1] > anchor[1]):
            if anchor is not None and clock[0] > anchor[0]:
                data["perf/step_time_s"] = (clock[1] - anchor[1]) / (clock[0] - anchor[0])
            self._anchor = clock
        if not self._finished:
            self._put("heartbeat", data, self._last_step, clean=True)

    def note(self, text: str, author: str | None = None, step: int | None = None) -> None:
        self.event("note", {"text": text, **({"author": author} if author else {})}, step)

    def finish(self, status: str = "completed", final_step: int | None = None) -> None:
        """Write `run_end`, flush everything to disk and stop the writer thread."""
        if status not in STATUSES:
            raise ValueError(f"finish: status must be one of {', '.join(STATUSES)}, got {status!r}")
        with self._lock:
            if self._finished:
                return
            self._finished = True
        self._shutdown()
        fs = self._last_step if final_step is None else final_step
        self._put("run_end", {"status": status, "final_step": fs}, None, force=True)
        self.close()

    def close(self) -> None:
        """Flush and stop without writing run_end (used by finish and by a dying process)."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=30)
        uploader, self._uploader = self._uploader, None
        if uploader is not None and threading.current_thread() is not self._thread:
            uploader.close(settings.get("upload_timeout_s"))  # the last chunk, retried for a while
        if not self._exiting:
            atexit.unregister(self._atexit)  # closed runs need no exit hook (and can be freed)
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old)
            except (ValueError, TypeError):
                pass
        self._old_handlers.clear()

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything queued so far is on disk."""
        self._queue.join() if timeout is None else self._wait_empty(timeout)

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if self._finished:
            return False
        if exc_type is None:
            self.finish("completed")
        elif issubclass(exc_type, (KeyboardInterrupt, SystemExit)) or self._signal is not None:
            self._finish_killed()
        else:
            self._shutdown()
            self.event(
                "failure",
                {
                    "type": "exception",
                    "message": f"{exc_type.__name__}: {exc}",
                    "traceback": "".join(traceback.format_exception(exc_type, exc, tb))[-20000:],
                    "action": "halt",
                },
                step=self._last_step,
            )
            self.finish("failed")
        return False

    # -------------------------------------------------------------- internals

    def _next_seq(self) -> int:
        """Continue numbering after what an earlier writer of this file wrote (resume)."""
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return 0
        last, _torn = _tail(self.path, size)
        return 0 if last is None else last + 1

    def _put(self, kind: str, data: dict, step: int | None, force: bool = False, clean: bool = False) -> bool:
        """Queue an event without waiting (unless `force`); False when the full queue dropped it."""
        if self._finished and not force:
            raise RuntimeError(f"run {self.id} is finished; start a new one with observatory.init")
        if step is not None:
            self._last_step = step if self._last_step is None else max(self._last_step, step)
        item = (kind, step, time.time(), data, clean)
        try:
            if force:
                self._queue.put(item, timeout=30)
            else:
                self._queue.put_nowait(item)
            self._logged += 1
            return True
        except queue.Full:
            self._dropped += 1
            return False

    def _terminate_torn_line(self) -> None:
        """A resumed writer must not glue its first event onto a line a dead writer left torn."""
        try:
            size = self.path.stat().st_size
            if size:
                with open(self.path, "rb") as f:
                    f.seek(size - 1)
                    if f.read(1) != b"\n":
                        self._file.write(b"\n")
        except OSError:
            pass

    def _wait_empty(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.005)

    def _encode(self, item) -> bytes:
        seq = self._seq
        self._seq += 1
        return encode_event(self.id, self.host, seq, item)

    def _loop(self) -> None:
        last_sync = time.monotonic()
        while True:
            batch = []
            try:
                batch.append(self._queue.get(timeout=self._flush_interval))
                while len(batch) < 10_000:
                    batch.append(self._queue.get_nowait())
            except queue.Empty:
                pass
            if batch:
                self._write(batch)
            now = time.monotonic()
            if batch or now - last_sync > self._flush_interval:
                try:
                    os.fsync(self._file.fileno())
                except OSError:
                    pass
                last_sync = now
            for _ in batch:
                self._queue.task_done()
            if self._stop.is_set() and self._queue.empty():
                break
        for sink in self._sinks:
            try:
                sink.close()
            except Exception as e:  # a mirror must never take the run down
                _warn(f"sink {sink!r} failed to close: {e}")
        try:
            self._file.close()
        except OSError:
            pass

    def _encode_batch(self, batch: list) -> bytes:
        return b"".join(map(self._encode, batch))

    def _append_shared(self, batch: list) -> bytes:
        """Append a batch to a file other processes append to: whole lines, seqs after theirs."""

        def encode(seq: int) -> bytes:
            self._seq = max(self._seq, seq)
            return self._encode_batch(batch)

        payload, self._end = append_shared(self._file, self.path, self._end, encode)
        return payload

    def _write(self, batch: list) -> None:
        try:
            if self._shared:
                payload = self._append_shared(batch)
            else:
                payload = self._encode_batch(batch)
                self._file.write(payload)
        except OSError as e:
            self._dropped += len(batch)
            _warn(f"cannot write {self.path}: {e}; {len(batch)} events lost")
            return
        if self._sinks:
            events = [json.loads(line) for line in payload.splitlines()]
            for sink in self._sinks:
                try:
                    sink.write(events)
                except Exception as e:
                    _warn(f"sink {sink!r} failed: {e}")

    def _on_signal(self, signum, frame) -> None:
        # Do not write from inside the handler: the main thread may be interrupted while it holds
        # the queue's lock. Unwind it with an exception instead; __exit__ or atexit then writes
        # failure(signal) and run_end(killed) and flushes.
        self._signal = signum
        old = self._old_handlers.get(signum)
        if callable(old) and old is not signal.default_int_handler:
            old(signum, frame)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise SystemExit(128 + signum)

    def _finish_killed(self) -> None:
        name = signal.Signals(self._signal).name if self._signal else "interrupt"
        self._shutdown()
        self._put(
            "failure",
            {"type": "signal", "message": f"{name} received", "action": "halt"},
            self._last_step,
            force=True,
        )
        self.finish("killed")

    def _atexit(self) -> None:
        self._exiting = True  # do not unregister from inside the atexit machinery
        if not self._finished and self._signal is not None:
            self._finish_killed()
        elif not self._stop.is_set():
            self.close()


def check_event(kind: str, data: Mapping[str, Any], step: int | None) -> int | None:
    """An `event`'s kind, data and step as the contract has them (TypeError, ValueError); its step."""
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"event: kind must be a non-empty string, got {kind!r}")
    if not isinstance(data, Mapping):
        raise TypeError(f"event: data must be a dict, got {type(data).__name__}")
    step = check_step(step, "event")
    from observatory.events import ValidationError, validate_data

    try:
        validate_data(kind, encode_value(dict(data)))
    except ValidationError as e:
        raise ValueError(f"event({kind!r}): {e}") from None
    return step


def encode_event(run_id: str, host: int, seq: int, item: tuple) -> bytes:
    """One event's line: `item` is (kind, step, t, data, clean); `clean` data (metrics, expert_load) is
    already JSON's. The observatory's findings are signed (`provenance.signed`)."""
    kind, step, t, data, clean = item
    ev = {"v": VERSION, "run": run_id, "kind": kind, "step": step, "t": t, "host": host, "seq": seq}
    ev["data"] = data if clean else encode_value(data)
    if clean:  # the hot path (metrics, expert_load)
        try:
            return _CLEAN.encode(ev) + b"\n"
        except (TypeError, OverflowError, msgspec.EncodeError):
            pass  # an int beyond 64 bits, an odd type: json.dumps below says what it can
    line = json.dumps(ev, separators=(",", ":"), allow_nan=False, default=_json_default)
    if host == OBSERVATORY_HOST and kind in provenance.FINDING_KINDS:
        # signed as ingest will read it back: the line's own JSON values
        try:
            line = json.dumps(provenance.signed(json.loads(line)), separators=(",", ":"), allow_nan=False)
        except (OSError, ValueError, ImportError) as e:  # no key: written, and ingest says it is unsigned
            _warn(f"cannot sign a {kind} with key_file {settings.get('key_file')}: {e}")
    return (line + "\n").encode()


def append_shared(f, path: Path, end: int | None, encode) -> tuple[bytes, int]:
    """Append `encode(first seq)`'s lines to `f`, a file other processes append to (the observatory's own),
    under an exclusive flock: numbered after the file's last seq unless its size is still `end` (our last
    append's), a line a dead writer left torn ended first. Returns the payload and the file's new size."""
    import fcntl

    fd = f.fileno()
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # blocks for at most one other writer's batch append
        locked = True
    except OSError as e:  # a filesystem without flock: append unlocked rather than lose events
        _warn(f"cannot lock {path} ({e}); appending without the lock")
        locked = False
    try:
        size = os.fstat(fd).st_size
        lead, seq = b"", 0
        if size != end:
            # someone else appended since our last write (or this is our first): number after them,
            # and end a line a dead writer left torn rather than glue our first event onto it
            last, torn = _tail(path, size)
            if last is not None:
                seq = last + 1
            if torn:
                lead = b"\n"
        payload = encode(seq)
        f.write(lead + payload)
        return payload, size + len(lead) + len(payload)
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)


def log_path(runs_dir: Path | str, run_id: str, host: int) -> Path:
    """The local file a run's host writes: in the runs dir's run folder, or a bucket's spool."""
    where = _bucket.location(runs_dir)
    base = Path(settings.get("spool_dir")) / _bucket.tag(where) if isinstance(where, str) else where
    return base / run_id / f"events.{host}.jsonl"


def _counts(what: str, values: Iterable[int]) -> list[int]:
    """Per-expert counts as Python ints >= 0 (numpy/jax arrays welcome); raise on anything else."""
    kind = getattr(getattr(values, "dtype", None), "kind", None)
    if kind in ("i", "u"):  # integer arrays (numpy, jax): checked without a Python loop
        if values.size and values.min() < 0:
            raise ValueError(f"log_expert_load: {what} counts must be >= 0, got {values.min()}")
        return values.tolist()
    vals = values.tolist() if hasattr(values, "tolist") else list(values)
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, int):
            if isinstance(v, float) and v.is_integer():
                continue
            raise TypeError(
                f"log_expert_load: {what} counts must be integers, got {type(v).__name__} {v!r:.40}"
            )
    out = [int(v) for v in vals]
    if out and min(out) < 0:
        raise ValueError(f"log_expert_load: {what} counts must be >= 0, got {min(out)}")
    return out


def _json_default(o: Any) -> Any:
    # numpy / jax scalars and arrays, Paths, sets
    if hasattr(o, "tolist"):
        return encode_value(o.tolist())
    if isinstance(o, (Path, set, frozenset)):
        return str(o) if isinstance(o, Path) else sorted(o)
    return str(o)


def _warn(msg: str) -> None:
    import sys

    print(f"observatory writer: {msg}", file=sys.stderr)


def init(
    run_id: str | None = None,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    runs_dir: str | os.PathLike | None = None,
    host: int = 0,
    parent: Mapping[str, Any] | None = None,
    ladder: Mapping[str, Any] | None = None,
    tags: Iterable[str] | None = None,
    *,
    code: Mapping[str, Any] | None = None,
    data: Mapping[str, Any] | None = None,
    mesh: Mapping[str, Any] | None = None,
    model: Mapping[str, Any] | None = None,
    project: str | None = None,
    group: str | None = None,
    notes: str | None = None,
    source: Mapping[str, Any] | None = None,
    sinks: Iterable[Sink] = (),
    write_start: bool = True,
    run_class: type[Run] = Run,
    **writer_options: Any,
) -> Run:
    """Start a run: create its folder, write `run_start`, return the `Run`.

    `write_start=False` is for processes other than host 0 of a multi-host run,
    which only write host-local events. `run_class` is the `Run` subclass to make
    (the wandb-compatible run of `observatory.integrations.wandb_api`).
    """
    if run_id is None:
        run_id = new_run_id(name)
    runs_dir = _bucket.location(runs_dir if runs_dir is not None else settings.get("runs"))
    if tags is not None and (isinstance(tags, str) or not all(isinstance(t, str) for t in tags)):
        raise TypeError("init: tags must be a list of strings")
    for key, value in (("project", project), ("group", group), ("notes", notes)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"init: {key} must be a string, got {type(value).__name__}")
    run = run_class(run_id, runs_dir, host, sinks=sinks, **writer_options)
    if write_start:
        start: dict[str, Any] = {"config": redact(dict(config or {}))}
        for key, value in (
            ("name", name),
            ("parent", parent),
            ("ladder", ladder),
            ("code", code),
            ("data", data),
            ("mesh", mesh),
            ("model", model),
            ("project", project),
            ("group", group),
            ("notes", None if notes is None else redact(notes)),  # free text: credential shapes hidden
            ("source", source),
        ):
            if value is not None:
                start[key] = dict(value) if isinstance(value, Mapping) else value
        if tags is not None:
            start["tags"] = list(tags)
        run._put("run_start", start, None)
    return run
