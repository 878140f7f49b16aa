"""Mirror a live run to Weights & Biases: a writer `Sink` that never makes anyone wait.

    from observatory.interop.wandb_mirror import WandbMirror

    mirror = WandbMirror(project="moe-ladder", mode="offline", run_id=run_id, config=cfg)
    run = observatory.init(run_id=run_id, config=cfg, sinks=[mirror])

The writer calls `write(events)` on its background thread after the events are on disk, and
`close()` when the run ends. The mirror only appends the events to its own bounded queue
and returns; a second thread, started on the first write, does the slow parts:
`wandb.init` (about a second offline, longer online) and `run.log`. So neither the training
step nor our own event log ever waits for W&B. If the queue fills (W&B far behind), events
are dropped and counted (`dropped`), never blocking; if W&B fails, the mirror says so once
on stderr and stops mirroring; the run goes on.

What is sent:

- `run_start` -> `wandb.init(config=<the run_start config, already redacted>, name, tags)`
- `metrics` -> `run.log(values, step=step)` (the strings "nan"/"inf" as floats)
- `eval` -> `run.log({"eval/<dataset>/<field>": value}, step=step)`
- `run_end` -> summary `final_step`/`status`, then `run.finish(exit_code=0 if completed else 1)`
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from observatory.events import decode_number
from observatory.redact import redact

__all__ = ["WandbMirror", "MODES"]

MODES = ("offline", "online")
_STOP = object()


class WandbMirror:
    """A writer Sink that sends metrics, config and summary to W&B on its own thread.

    Args:
        project: W&B project name.
        mode: "offline" (writes `wandb/offline-run-*`, sync later with `wandb sync`) or
            "online". Use no mirror at all for "disabled".
        run_id: W&B run id; use our run id so the two line up.
        config: run config, used if the first events do not include our `run_start`.
        dir: where W&B keeps its files (default: W&B's own, env WANDB_DIR).
        name, tags, entity: passed to `wandb.init`.
        queue_size: events held while W&B catches up; beyond that they are dropped, counted.
        finish_timeout_s: how long `close()` waits for W&B to finish uploading/writing.
    """

    def __init__(
        self,
        project: str,
        mode: str = "offline",
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
        *,
        dir: str | os.PathLike | None = None,
        name: str | None = None,
        tags: Iterable[str] | None = None,
        entity: str | None = None,
        queue_size: int = 100_000,
        finish_timeout_s: float = 120.0,
    ):
        if mode not in MODES:
            raise ValueError(
                f"WandbMirror: mode must be one of {', '.join(MODES)}, got {mode!r} "
                "(for wandb.mode=disabled construct no mirror)"
            )
        if not isinstance(project, str) or not project:
            raise ValueError(f"WandbMirror: project must be a non-empty string, got {project!r}")
        if queue_size < 1:
            raise ValueError(f"WandbMirror: queue_size must be >= 1, got {queue_size}")
        self.project = project
        self.mode = mode
        self.run_id = run_id
        self.config = redact(dict(config or {}))
        self.dir = Path(dir) if dir is not None else None
        self.name = name
        self.tags = list(tags) if tags is not None else None
        self.entity = entity
        self.finish_timeout_s = finish_timeout_s
        self.dropped = 0  # events not mirrored because the queue was full
        self.sent = 0  # events handed to W&B
        self.error: str | None = None  # set once W&B failed; mirroring stopped
        self.wandb_run = None  # the wandb Run, once initialised
        self._queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"WandbMirror(project={self.project!r}, mode={self.mode!r}, run_id={self.run_id!r})"

    # ----------------------------------------------------------- Sink protocol

    def write(self, events: list[dict]) -> None:
        """Queue events for W&B and return at once (called on the writer thread)."""
        if self.error is not None or self._closed:
            return
        self._ensure_thread()
        for ev in events:
            try:
                self._queue.put_nowait(ev)
            except queue.Full:
                self.dropped += 1

    def close(self) -> None:
        """Let W&B catch up and finish the W&B run (bounded by `finish_timeout_s`)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return  # nothing was ever written: no W&B run was started
        self._queue.put(_STOP)
        thread.join(timeout=self.finish_timeout_s)
        if thread.is_alive():
            _warn(f"W&B did not finish within {self.finish_timeout_s:.0f}s; its run may be incomplete")
        if self.dropped:
            _warn(f"{self.dropped} events were not mirrored to W&B (its queue was full)")

    # ----------------------------------------------------------------- thread

    def _ensure_thread(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._loop, name="observatory-wandb-mirror", daemon=True
                )
                self._thread.start()

    def _loop(self) -> None:
        finished = False
        while True:
            ev = self._queue.get()
            if ev is _STOP:
                break
            if self.error is not None or finished:
                continue  # drain without sending
            try:
                finished = self._send(ev) or finished
            except Exception as e:  # W&B trouble must never reach the run
                self.error = f"{type(e).__name__}: {e}"
                _warn(f"mirroring to W&B stopped: {self.error}")
        if self.wandb_run is not None and not finished and self.error is None:
            try:
                self.wandb_run.finish()
            except Exception as e:
                _warn(f"W&B finish failed: {type(e).__name__}: {e}")

    def _init(self, start: Mapping[str, Any] | None) -> None:
        import wandb

        config = dict(start.get("config") or {}) if start else self.config
        kwargs: dict[str, Any] = {
            "project": self.project,
            "mode": self.mode,
            "config": config,
            "reinit": "create_new",  # several runs in one process (tests, sweeps) stay apart
        }
        if self.run_id is not None:
            # a resumed training run (same run id) continues its W&B run instead of failing
            kwargs["id"], kwargs["resume"] = self.run_id, "allow"
        name = self.name or (start.get("name") if start else None)
        tags = self.tags if self.tags is not None else (start.get("tags") if start else None)
        for key, value in (("name", name), ("tags", tags), ("entity", self.entity)):
            if value:
                kwargs[key] = value
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
            kwargs["dir"] = str(self.dir)
        self.wandb_run = wandb.init(**kwargs)

    def _send(self, ev: dict) -> bool:
        """Send one event; True once the W&B run is finished."""
        kind = ev.get("kind")
        if self.wandb_run is None:
            self._init(ev.get("data") if kind == "run_start" else None)
            if kind == "run_start":
                self.sent += 1
                return False
        step = ev.get("step")
        data = ev.get("data") or {}
        if kind == "metrics" and step is not None:
            values = {k: decode_number(v) for k, v in data.items()}
            self.wandb_run.log({k: v for k, v in values.items() if v is not None}, step=step)
        elif kind == "eval" and step is not None:
            prefix = f"eval/{data.get('dataset', 'eval')}"
            values = {f"{prefix}/{k}": decode_number(v) for k, v in data.items() if k != "dataset"}
            self.wandb_run.log({k: v for k, v in values.items() if v is not None}, step=step)
        elif kind == "run_end":
            self.wandb_run.summary["status"] = data.get("status")
            if data.get("final_step") is not None:
                self.wandb_run.summary["final_step"] = data["final_step"]
            self.wandb_run.finish(exit_code=0 if data.get("status") == "completed" else 1)
            self.sent += 1
            return True
        else:
            return False
        self.sent += 1
        return False


def _warn(msg: str) -> None:
    print(f"observatory wandb mirror: {msg}", file=sys.stderr)
