"""Event-log files written in one go with given `t` and `seq` (the simulator's writer).

`EventFile` streams one (run, host) log to a temporary file beside its place: each event is the
live writer's envelope (`v, run, kind, step, t, host, seq, data`) in compact JSON, `seq` from 0,
`t` as given. Rare kinds are checked with `events.validate_event`; the bulk kinds are checked on
their first line in each file (valid, and exactly what `json.dumps` writes) and then written in
bulk: `expert_load` rows straight from numpy integer arrays (`decimal_rows`). `put_path` moves a
finished file into place unless different content is already there, like `interop.put_file`.
"""

from __future__ import annotations

import filecmp
import json
import math
import os
from pathlib import Path

import numpy as np

from observatory.events import RUN_ID_RE, VERSION, encode_nonfinite, encode_value, validate_event

__all__ = ["EventFile", "decimal_rows", "put_path"]

_PAIRS = np.array([ord(str(i // 10)) | ord(str(i % 10)) << 8 for i in range(100)], np.uint16)  # "00".."99"


def decimal_rows(a: np.ndarray) -> list[bytes]:
    """Each row of a 2-D array of integers in [0, 2^32) as `json.dumps` writes a list's inside: b"3,0,17"."""
    n, e = a.shape
    if a.size and (a.min() < 0 or a.max() >= 1 << 32):
        raise ValueError("counts must be in [0, 2^32)")
    v = np.ascontiguousarray(a, dtype=np.uint32).reshape(-1)
    width = np.ones(v.size, np.int64)  # digits of each value
    for k in range(1, 10):
        width += v >= 10**k
    w2 = (int(width.max(initial=1)) + 1) // 2 * 2  # digit columns, an even number: two digits at a time
    buf = np.empty((v.size, w2 + 2), np.uint8)  # digits right-aligned, a comma, padding
    pairs = np.empty((v.size, w2 // 2), np.uint16)
    x = v.copy()
    for i in range(w2 // 2 - 1, -1, -1):
        q = x // 100  # (x % 100 is several times slower than x - q * 100 in numpy)
        pairs[:, i] = _PAIRS[x - q * 100]
        x = q
    buf[:, :w2] = pairs.view(np.uint8)
    buf[:, w2] = ord(",")
    keep = np.arange(w2 + 2) >= (w2 - width)[:, None]
    keep[:, w2 + 1] = False
    flat = buf[keep].tobytes()  # each value's digits, then a comma
    lens = (width + 1).reshape(n, e).sum(axis=1)
    ends = np.cumsum(lens)
    return [flat[s : t - 1] for s, t in zip((ends - lens).tolist(), ends.tolist(), strict=True)]


def _dumps(ev: dict) -> bytes:
    return (json.dumps(ev, separators=(",", ":"), allow_nan=False) + "\n").encode()


class EventFile:
    """One (run, host) event log, streamed to a file beside its final place: seq from 0, given `t`."""

    def __init__(self, runs_dir: Path, run: str, host: int):
        if not RUN_ID_RE.match(run):
            raise ValueError(f"run id {run!r} must match [A-Za-z0-9._-]{{1,128}}")
        self.run, self.host = run, host
        self.path = Path(runs_dir) / run / f"events.{host}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # the temporary name holds no "events"/"jsonl", so no ingest glob picks it up
        self.tmp = self.path.parent / f".simulate-{os.getpid()}-{host}.partial"
        self._f = open(self.tmp, "wb", buffering=1 << 20)
        self.seq = self.metric_values = self.expert_rows = self.bytes = 0
        self._checked: set[str] = set()

    def _envelope(self, kind: str, step: int | None, t: float) -> dict:
        ev = {"v": VERSION, "run": self.run, "kind": kind, "step": step, "t": round(t, 3), "host": self.host}
        ev["seq"] = self.seq
        self.seq += 1
        return ev

    def _write(self, line: bytes, kind: str) -> None:
        if kind not in self._checked:  # the first line of each kind: valid, and what json.dumps would write
            ev = validate_event(json.loads(line), run_folder=self.run, host=self.host)
            assert _dumps(ev) == line, line[:200]
            self._checked.add(kind)
        self._f.write(line)
        self.bytes += len(line)

    def event(self, kind: str, data: dict, step: int | None, t: float) -> None:
        ev = self._envelope(kind, step, t)
        ev["data"] = encode_value(data)
        validate_event(ev, run_folder=self.run, host=self.host)
        self._write(_dumps(ev), kind)

    def metrics(self, step: int, t: float, values: dict[str, float]) -> None:
        ev = self._envelope("metrics", step, t)
        ev["data"] = {k: v if math.isfinite(v) else encode_nonfinite(v) for k, v in values.items()}
        self._write(_dumps(ev), "metrics")
        self.metric_values += len(values)

    def expert_loads(self, step: int, t: float, routed: np.ndarray, dropped: np.ndarray) -> None:
        """One `expert_load` event per layer (row) of `routed` and `dropped` (layers x experts)."""
        rs, ds = decimal_rows(routed), decimal_rows(dropped)
        for layer, (r, d) in enumerate(zip(rs, ds, strict=True)):
            ev = self._envelope("expert_load", step, t)
            ev["data"] = {"layer": layer}
            head = _dumps(ev)[:-3]  # ...,"data":{"layer":L  (without }}\n)
            self._write(b"".join((head, b',"routed":[', r, b'],"dropped":[', d, b"]}}\n")), "expert_load")
        self.expert_rows += routed.size

    def close(self) -> None:
        self._f.close()


def put_path(tmp: Path, path: Path, replace: bool) -> str:
    """Move a finished file into place: new | unchanged | replaced | conflict (as `interop.put_file`)."""
    state = "new"
    if path.exists():
        if filecmp.cmp(tmp, path, shallow=False):
            tmp.unlink()
            return "unchanged"
        if not replace:
            tmp.unlink()
            return "conflict"
        state = "replaced"
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return state
