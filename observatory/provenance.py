"""Which findings are the observatory's own: an Ed25519 signature anyone can check.

Anomalies, forecasts and alerts (`FINDING_KINDS`) are what the observatory says about a
run, and pages, reports and the alert rules take them as its word. They are written into
the run's folder or the findings folder, where anyone who can write a log may write too. So
the observatory signs each finding it writes with its private key (`key_file`: 32 random
bytes, kept with the store's data, never in the runs dir, mode 0600), and ingest stores a
line of host 1000's file that is a finding only when its signature checks out against a
trusted public key: this observatory's own, or one listed in `trusted_keys` (the committed
samples' key by default, a lab's earlier keys after a rotation, another lab whose logs one
mirrors). Each signature names its key (`key_id`), so a rotated-out key's findings stay valid
while its public half is trusted, and a public mirror of the logs, or a reader of an
exported JSONL, checks them with the lab's public key alone (`public_key`, shown on the
dashboard's About menu and by `observatory export`).

An `anomaly` or `alert` in any other file, a finding added to `events.1000.jsonl` by hand,
or one signed with an untrusted key is a rejected line with its reason: kept as text in
`rejected_events`, never shown as a finding, never an open alert that keeps the real episode
from being sent. A `forecast` in a run's own log is its writer's pre-registration and is
stored as theirs (its host says whose).

The signature is over the event as ingest reads it (`canonical`: the envelope and `data`,
keys sorted), in the line's `sig` field: `ed25519:<key id>:<base64 signature>`. A finding an
older observatory signed with HMAC-SHA256 of the same key file (64 hex digits) is still
accepted by the observatory that holds that file, and by no other.

`cryptography` is imported when a key is used: a training script's writer never signs.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import re
import secrets
import stat
import sys
from pathlib import Path

from observatory import settings
from observatory.events import OBSERVATORY_HOST

__all__ = [
    "FINDING_KINDS",
    "key",
    "public_key",
    "key_id",
    "trusted",
    "sign",
    "signed",
    "signer",
    "judge",
    "SAMPLE_KEY",
]

FINDING_KINDS = frozenset({"anomaly", "forecast", "alert"})
VERDICT_KINDS = frozenset({"anomaly", "alert"})  # only the observatory detects and alerts: in no other file
_FIELDS = ("v", "run", "kind", "step", "t", "host", "seq", "data")
PREFIX = "ed25519:"
# The public half of the key the committed samples (data/samples) are signed with; its private half is not
# in the repository. Trusted by default (`trusted_keys`), so `observatory ingest --runs-dir data/samples`
# stores the samples' forecasts and anomalies on any install.
SAMPLE_KEY = settings.SETTINGS["trusted_keys"].default
_SIG_RE = re.compile(r"^ed25519:([0-9a-f]{16}):([A-Za-z0-9+/]{86}==)$")
_HMAC_RE = re.compile(r"^[0-9a-f]{64}$")


def _key_path() -> str:
    return os.path.abspath(settings.get("key_file"))


def key():
    """The observatory's private signing key (an `Ed25519PrivateKey`) from `key_file`, made on first use:
    32 random bytes in hex, readable by its owner only (a warning when the group or others may read it)."""
    return _private(_key_path())


def _seed(path: str) -> bytes:
    return _seed_cached(path)


@functools.lru_cache(maxsize=4)
def _seed_cached(path: str) -> bytes:
    p = Path(path)
    try:
        return _read_seed(p)
    except FileNotFoundError:
        pass
    p.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:  # another process made it first
        return _read_seed(p)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    return _read_seed(p)


def _read_seed(p: Path) -> bytes:
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))  # the key itself is never a link
    with os.fdopen(fd) as f:
        mode = os.fstat(f.fileno()).st_mode
        text = f.read(200).strip()
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        print(
            f"observatory: warning: key_file {p} may be read or written by its group or others "
            f"(mode {stat.S_IMODE(mode):o}); chmod 600 it: whoever reads it can sign findings",
            file=sys.stderr,
        )
    seed = bytes.fromhex(text)
    if len(seed) != 32:
        raise ValueError(f"key_file {p} must hold 32 bytes in hex, not {len(seed)}")
    return seed


@functools.lru_cache(maxsize=4)
def _private(path: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(_seed(path))


def _raw_public(priv) -> bytes:
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return priv.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def warn_if_reachable(runs_dir) -> bool:
    """Whether the key file lies under the runs dir, where a log writer may read it (and sign what it
    likes): said once on stderr per runs dir and key file; the findings are still signed."""
    return _reachable(os.path.realpath(runs_dir), os.path.realpath(_key_path()))


@functools.lru_cache(maxsize=16)
def _reachable(runs_dir: str, key_path: str) -> bool:
    if os.path.commonpath([runs_dir, key_path]) != runs_dir:
        return False
    print(
        f"observatory: warning: key_file {key_path} is inside the runs dir {runs_dir}: whoever writes a "
        "log there can read it and sign findings; move it (OBSERVATORY_KEY_FILE) off the runs dir",
        file=sys.stderr,
    )
    return True


def public_key() -> str:
    """This observatory's public key as text (`ed25519:<base64 of its 32 bytes>`): what a lab publishes."""
    return PREFIX + base64.b64encode(_raw_public(key())).decode()


def published() -> str:
    """What a lab shows readers (the dashboard's About, `observatory export`): this observatory's public key
    when its key file exists (none is made here), and the other trusted keys, in Markdown."""
    lines = ["Findings (forecasts, anomalies, alerts) are signed with Ed25519; check a line's `sig` with:"]
    own = None
    if os.path.exists(_key_path()):
        try:
            own = public_key()
            lines.append(f"- this observatory's key `{key_id(own)}`: `{own}`")
        except (OSError, ValueError, ImportError):
            pass
    for text in settings.get("trusted_keys").replace(",", " ").split():
        try:
            kid = key_id(text)
        except ValueError:
            continue
        if text != own:
            whose = "the committed samples' key" if text == SAMPLE_KEY else "trusted"
            lines.append(f"- {whose} `{kid}`: `{text}`")
    return "\n".join(lines)


def key_id(public: str) -> str:
    """A public key's short name in signatures: the first 16 hex digits of SHA-256 of its 32 bytes."""
    return hashlib.sha256(_decode_public(public)).hexdigest()[:16]


def _decode_public(text: str) -> bytes:
    if not text.startswith(PREFIX):
        raise ValueError(f"a public key is {PREFIX}<base64 of 32 bytes>, not {text[:60]!r}")
    try:
        raw = base64.b64decode(text[len(PREFIX) :], validate=True)
    except binascii.Error as e:
        raise ValueError(f"public key {text[:60]!r}: not base64 ({e})") from None
    if len(raw) != 32:
        raise ValueError(f"public key {text[:60]!r}: {len(raw)} bytes, not 32")
    return raw


def trusted() -> dict[str, str]:
    """{key id: public key} of every key whose signatures are accepted: this observatory's own (when its key
    file can be read or made) and those of `trusted_keys`."""
    return _trusted(settings.get("trusted_keys"), _key_path())


@functools.lru_cache(maxsize=8)
def _trusted(listed: str, path: str) -> dict[str, str]:
    out = {}
    for text in listed.replace(",", " ").split():
        out[key_id(text)] = text  # a malformed key: ValueError naming it (`judge` says so)
    try:
        own = public_key()
    except (OSError, ValueError):
        return out
    out[key_id(own)] = own
    return out


@functools.lru_cache(maxsize=64)
def _verifier(public: str):
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(_decode_public(public))


def canonical(ev: dict) -> bytes:
    """What is signed: the event's envelope and data as JSON, keys sorted (not its `sig`)."""
    return json.dumps(
        {k: ev.get(k) for k in _FIELDS}, sort_keys=True, separators=(",", ":"), ensure_ascii=True
    ).encode()


def sign(ev: dict, private=None) -> str:
    """`ev`'s signature with `private` (an `Ed25519PrivateKey`; this observatory's key by default)."""
    private = key() if private is None else private
    kid = hashlib.sha256(_raw_public(private)).hexdigest()[:16]
    return f"{PREFIX}{kid}:{base64.b64encode(private.sign(canonical(ev))).decode()}"


def signed(ev: dict, private=None) -> dict:
    """`ev` (as written to disk: encoded data, final seq) with its `sig`: for tools that write lines themselves."""
    return {**ev, "sig": sign(ev, private)}


def signer(ev: dict) -> str | None:
    """The key id a finding's `sig` names (None when it names none): who signed it, for a page to say."""
    m = _SIG_RE.match(ev.get("sig") or "") if isinstance(ev.get("sig"), str) else None
    return m.group(1) if m else None


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
        return f"{kind}: not signed (no sig); findings no trusted key signed are not shown"
    if _HMAC_RE.match(sig):
        return _judge_hmac(ev, kind, sig)
    m = _SIG_RE.match(sig)
    if m is None:
        return f"{kind}: its sig is not ed25519:<key id>:<base64 signature>"
    try:
        keys = trusted()
    except ValueError as e:
        return f"{kind}: cannot check its signature: trusted_keys: {e}"
    public = keys.get(m.group(1))
    if public is None:
        return f"{kind}: signed by key {m.group(1)}, which is not trusted (trusted_keys); not shown"
    from cryptography.exceptions import InvalidSignature

    try:
        _verifier(public).verify(base64.b64decode(m.group(2)), canonical(ev))
    except (InvalidSignature, ValueError):
        return f"{kind}: its signature does not match key {m.group(1)}: altered or forged; not shown"
    return None


def _judge_hmac(ev: dict, kind: str, sig: str) -> str | None:
    """A finding an older observatory signed with HMAC-SHA256 of its key file: valid only where that file is."""
    try:
        mine = hmac.new(_seed(_key_path()), canonical(ev), hashlib.sha256).hexdigest()
    except (OSError, ValueError) as e:
        return f"{kind}: cannot check its signature: key_file {settings.get('key_file')}: {e}"
    if not hmac.compare_digest(sig, mine):
        return f"{kind}: its HMAC signature is not this observatory's (key_file); findings it did not write are not shown"
    return None
