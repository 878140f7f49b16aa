"""Which findings are the observatory's own: a signature only it can make.

Anomalies, forecasts and alerts (`FINDING_KINDS`) are what the observatory says about a
run, and pages, reports and the alert rules take them as its word. They are written into
the run's folder (`events.1000.jsonl`), where anyone who can write a log can write too. So
the observatory signs each finding it writes with a key only it holds (`key_file`, kept
with the store's data, never in the runs dir), and ingest stores a line of host 1000's file
that is a finding only when its signature checks out. An `anomaly` or `alert` in any other
file, a finding added to `events.1000.jsonl` by hand, or one signed with another key is a
rejected line with its reason: kept as text in `rejected_events`, never shown as a finding,
never an open alert that keeps the real episode from being sent. A `forecast` in a run's own
log is its writer's pre-registration and is stored as theirs (its host says whose).

The signature is HMAC-SHA256 over the event as ingest reads it (`canonical`: the envelope
and `data`, keys sorted), in the line's `sig` field.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path

from observatory import settings
from observatory.events import OBSERVATORY_HOST

__all__ = ["FINDING_KINDS", "key", "sign", "signed", "judge"]

FINDING_KINDS = frozenset({"anomaly", "forecast", "alert"})
VERDICT_KINDS = frozenset({"anomaly", "alert"})  # only the observatory detects and alerts: in no other file
_FIELDS = ("v", "run", "kind", "step", "t", "host", "seq", "data")


def key() -> bytes:
    """The observatory's signing key (`key_file`), made on first use: 32 random bytes, readable by its owner only."""
    return _key(os.path.abspath(settings.get("key_file")))


@functools.lru_cache(maxsize=4)
def _key(path: str) -> bytes:
    p = Path(path)
    try:
        return bytes.fromhex(p.read_text().strip())
    except FileNotFoundError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first
        return bytes.fromhex(p.read_text().strip())
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return bytes.fromhex(p.read_text().strip())


def canonical(ev: dict) -> bytes:
    """What is signed: the event's envelope and data as JSON, keys sorted (not its `sig`)."""
    return json.dumps(
        {k: ev.get(k) for k in _FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode()


def sign(ev: dict) -> str:
    return hmac.new(key(), canonical(ev), hashlib.sha256).hexdigest()


def signed(ev: dict) -> dict:
    """`ev` (as written to disk: encoded data, final seq) with its `sig`: for tools that write lines themselves."""
    return {**ev, "sig": sign(ev)}


def judge(ev: dict, host: int) -> str | None:
    """None when `ev` may be stored; else why not. Only findings are judged; `host` is its file's."""
    if ev.get("kind") not in FINDING_KINDS:
        return None
    kind = ev["kind"]
    if host != OBSERVATORY_HOST:
        if kind not in VERDICT_KINDS:
            return None  # a forecast in a run's own log: its writer's pre-registration, stored as theirs
        return (
            f"{kind} events are the observatory's findings: only its own file (events.{OBSERVATORY_HOST}.jsonl) "
            "holds them, signed"
        )
    sig = ev.get("sig")
    if not isinstance(sig, str):
        try:
            key()
        except (OSError, ValueError) as e:  # our writer, too, writes its findings unsigned then
            return f"{kind}: not signed (no sig), and key_file {settings.get('key_file')} cannot be read: {e}"
        return f"{kind}: not signed by this observatory (no sig); findings it did not write are not shown"
    try:
        mine = sign(ev)
    except (OSError, ValueError) as e:  # the key file cannot be read or made: nothing can be checked
        return f"{kind}: cannot check its signature: key_file {settings.get('key_file')}: {e}"
    try:
        good = hmac.compare_digest(sig, mine)
    except (TypeError, ValueError):
        good = False
    if not good:
        return f"{kind}: its signature is not this observatory's (key_file); findings it did not write are not shown"
    return None
