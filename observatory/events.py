"""The event log format, version 1: one schema, declared once.

`docs/events.md` is the public contract; this module is its executable form. The writer, the validator used by ingest, the DuckDB DDL in
`store.py` and the docs test all follow from `KINDS` below.

An event on disk is one JSON object per line::

    {"v":1,"run":"ladder-d64","kind":"metrics","step":120,"t":1764400000.125,
     "host":0,"seq":57,"data":{"train/loss":3.12}}

Non-finite floats are written as the strings "nan", "inf", "-inf" (JSON has no
such literals) and read back as IEEE values.
"""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "VERSION",
    "SUPPORTED_VERSIONS",
    "RUN_ID_RE",
    "KINDS",
    "KIND_NAMES",
    "STATUSES",
    "PHASES",
    "OBSERVATORY_HOST",
    "ValidationError",
    "Kind",
    "Field",
    "validate_event",
    "is_final_failure",
    "encode_value",
    "json_text",
    "decode_number",
    "encode_nonfinite",
    "describe",
    "fmt_value",
]

VERSION = 1
SUPPORTED_VERSIONS = (1,)
RUN_ID_RE = re.compile(r"^(?!\.\.?$)[A-Za-z0-9._-]{1,128}$")  # "." and ".." are folders, never run ids
NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "+inf": math.inf}
OBSERVATORY_HOST = 1000  # host id of events the observatory itself writes (forecasts, anomalies, decisions)
STATUSES = ("completed", "failed", "preempted", "killed")
PHASES = ("init", "compile", "train", "eval", "checkpoint", "shutdown")
ALERT_STATES = ("open", "resolved")
SEVERITIES = ("info", "warn", "critical")


class ValidationError(ValueError):
    """An event that breaks the contract. `field` names the offending field."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


@dataclass(frozen=True)
class Field:
    name: str
    type: (
        str  # "str", "int", "number", "bool", "object", "list", "int_list", "number_list", "str_list", "any"
    )
    required: bool = False
    doc: str = ""


@dataclass(frozen=True)
class Kind:
    name: str
    doc: str
    fields: tuple[Field, ...] = ()
    table: str = "events"  # the store table its rows land in


# The kinds, one line each ("name [-> table]: doc"), each followed by its data fields, indented
# ("name type[!][: doc]", "!" marking a required field). `_kinds` reads this into `KINDS`.
_KIND_SPEC = """
run_start -> runs: A run begins: its resolved config and where it came from.
    config object: full resolved config, nested; secrets redacted
    name str: human-readable name
    parent object: {run, step} when forked or resumed from a checkpoint
    ladder object: {name, rung, ...} when part of a scaling ladder
    code object: {commit, dirty}
    data object: {name, fingerprint, tokens}
    mesh object: {data, expert, processes, devices}
    model object: {params_total, params_active, flops_per_token}
    tags str_list: free-form labels
    project str: project the run belongs to (wandb's `project`)
    group str: group of runs it belongs to (wandb's `group`)
    notes str: free text about the run
    source object: {trainer, version}: who wrote the log, e.g. levanter
metrics -> metrics: Flat map of `/`-namespaced scalar name to number.
expert_load -> expert_load: Per-expert routed and dropped assignment counts for one layer at one step.
    layer int!: layer index
    routed int_list!: assignments the router made, per expert
    dropped int_list!: assignments cut by capacity, per expert
eval: Held-out evaluation.
    dataset str!: name of the eval set
    loss number!: mean loss
    bpb number: bits per byte
checkpoint: A checkpoint was written.
    path str!: where it lives
    bytes int: size on disk
config_diff: What changed against another run's config.
    against object!: {run, step}
    changes object!: {"dotted.key": [old, new]}
decision: A decision record or an update to one; later events with the same id update it.
    id str!: decision id
forecast: A pre-registered prediction.
    metric str!: the predicted metric
    target_step int: step the value is for
    points list: curve points [{step, value, low, high}, ...]
    value number: predicted value
    low number: band low
    high number: band high
    method str: how it was made
    source object: ladder name and fit version
anomaly: A detector's finding.
    detector str!: detector name
    metric str: metric it looked at
    severity str!: info, warn or critical
    message str!: what was seen
    window int_list: [first_step, last_step]
failure: Something went wrong, and what was done about it.
    type str!: nan_loss, exception, signal, hardware, data, ...
    message str!: what happened
    traceback str: Python traceback
    action str: halt, skip_batch, rollback, ...
    final bool: true when its writer stopped here without a run_end: the run is crashed from this event on
note: Free text.
    text str!: Markdown
    author str
summary: The run's summary values, name to number, string or bool; later ones override key by key.
histogram: A distribution at one step (bucket i holds values in [limits[i], limits[i+1])).
    name str!: what is distributed, a metric-like name
    bucket_limits number_list!: n + 1 bucket edges
    bucket_counts int_list!: n counts
    min number
    max number
    sum number
    sum_squares number
    count number
artifact: A file the run produced: a config, an HLO dump, a checkpoint manifest.
    name str!: artifact name
    type str!: artifact type
    path str!: where it lives
    bytes int: size on disk
    digest str: content digest
phase: A process enters a phase of its life; with `attempt`, which restart it belongs to.
    phase str!: init, compile, train, eval, checkpoint or shutdown
    attempt int!: the restart attempt this process belongs to: 0 first, +1 for each resume
    budget_s number: how long this phase may take before it counts as a hang
heartbeat: A living process's pulse, every heartbeat_s: its phase, step and host telemetry (a flat map of numbers).
    phase str: the phase it is in
    step int: the step it is at
alert: An alert rule opened or resolved; written by the observatory (host 1000).
    rule str!: the rule that fired
    state str!: open or resolved
    severity str!: info, warn or critical
    message str!: what fired
    finding object: the anomaly it came from, if any
    host int: the host it concerns
    attempt int: the restart attempt it concerns
    channels str_list: where it was sent, without secrets
run_end: A run ended.
    status str!: completed, failed, preempted or killed
    final_step int: last optimizer step
"""


def _kinds(spec: str) -> dict[str, Kind]:
    """`_KIND_SPEC` as {name: Kind}, in its order."""
    kinds: list[Kind] = []
    for line in spec.strip("\n").splitlines():
        head, _, doc = line.partition(":")
        if not line.startswith(" "):  # a kind: "name [-> table]: doc"
            name, _, table = head.partition(" -> ")
            kinds.append(Kind(name, doc.strip(), (), table or "events"))
            continue
        name, typ = head.split()  # a field of the kind above: "name type[!][: doc]"
        field = Field(name, typ.rstrip("!"), typ.endswith("!"), doc.strip())
        kinds[-1] = replace(kinds[-1], fields=(*kinds[-1].fields, field))
    return {k.name: k for k in kinds}


KINDS: dict[str, Kind] = _kinds(_KIND_SPEC)
KIND_NAMES = tuple(KINDS)


# --------------------------------------------------------------------- numbers


def decode_number(x: Any) -> float | None:
    """A JSON number, or one of the non-finite strings, as a float; None if neither."""
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        return NONFINITE.get(x.strip().lower())
    return None


def encode_nonfinite(x: float) -> float | str:
    """A float as JSON can hold it: NaN and infinities become strings."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


def encode_value(obj: Any) -> Any:
    """Recursively replace non-finite floats by their string form (for json.dumps)."""
    if isinstance(obj, float):
        return encode_nonfinite(obj)
    if isinstance(obj, dict):
        return {k: encode_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode_value(v) for v in obj]
    return obj


def json_text(obj: Any, separators: tuple[str, str] = (",", ":")) -> str:
    """`json.dumps(encode_value(obj))`, with the walk only for a value that holds a non-finite float (which
    `allow_nan=False` refuses): a config or an eval is dumped as it is, in one C call."""
    try:
        return _encoder(separators).encode(obj)
    except ValueError:
        return json.dumps(encode_value(obj), separators=separators)


@functools.lru_cache(maxsize=4)
def _encoder(separators: tuple[str, str]) -> json.JSONEncoder:
    """`json.dumps`' encoder for these separators, made once (dumps makes one a call: ~1.5 us of a line's
    ~20 us that `check_line` takes)."""
    return json.JSONEncoder(separators=separators, allow_nan=False)


def is_final_failure(kind: str, data: Any) -> bool:
    """A `failure` with `final: true`: its writer stopped there without a `run_end`, so the run is
    `crashed` from that event's time at once (not after `stale_after_s` of silence), as a `run_end`
    ends it; events its writers log after it make it running again."""
    return kind == "failure" and isinstance(data, dict) and data.get("final") is True


# ------------------------------------------------------------------ validation


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_field(kind: str, f: Field, value: Any) -> None:
    where = f"data.{f.name}"
    ok = True
    if f.type == "str":
        ok = isinstance(value, str)
    elif f.type == "int":
        ok = _is_int(value)
    elif f.type == "number":
        ok = decode_number(value) is not None
    elif f.type == "bool":
        ok = isinstance(value, bool)
    elif f.type == "object":
        ok = isinstance(value, dict)
    elif f.type == "list":
        ok = isinstance(value, list)
    elif f.type == "int_list":
        ok = isinstance(value, list) and all(_is_int(v) for v in value)
    elif f.type == "number_list":
        ok = isinstance(value, list) and all(decode_number(v) is not None for v in value)
    elif f.type == "str_list":
        ok = isinstance(value, list) and all(isinstance(v, str) for v in value)
    if not ok:
        raise ValidationError(where, f"{kind} expects {f.type}, got {type(value).__name__}")


def validate_data(kind: str, data: dict) -> None:
    """Check a kind's payload; unknown kinds are not checked (they are kept raw)."""
    spec = KINDS.get(kind)
    if spec is None:
        return
    if kind == "metrics":
        for name, value in data.items():
            if not name:
                raise ValidationError("data", "metrics has an empty metric name")
            if decode_number(value) is None:
                raise ValidationError(
                    f"data.{name}", f"metric value must be a number or nan/inf string, got {value!r:.60}"
                )
        return
    if kind == "summary":
        for name, value in data.items():
            if not name:
                raise ValidationError("data", "summary has an empty name")
            if not isinstance(value, (str, bool)) and decode_number(value) is None:
                raise ValidationError(
                    f"data.{name}", f"summary value must be a number, string or bool, got {value!r:.60}"
                )
        return
    for f in spec.fields:
        if f.name not in data or data[f.name] is None:
            if f.required:
                raise ValidationError(f"data.{f.name}", f"{kind} requires {f.name}")
            continue
        _check_field(kind, f, data[f.name])
    if kind == "expert_load":
        if data["layer"] < 0:
            raise ValidationError("data.layer", "must be >= 0")
        if len(data["routed"]) != len(data["dropped"]):
            raise ValidationError("data.dropped", "routed and dropped must have one entry per expert each")
        if any(v < 0 for v in data["routed"]) or any(v < 0 for v in data["dropped"]):
            raise ValidationError("data.routed", "counts must be >= 0")
    elif kind == "histogram" and len(data["bucket_limits"]) != len(data["bucket_counts"]) + 1:
        raise ValidationError("data.bucket_limits", "needs one more edge than bucket_counts has counts")
    elif kind == "run_end" and data["status"] not in STATUSES:
        raise ValidationError("data.status", f"must be one of {', '.join(STATUSES)}")
    elif kind in ("anomaly", "alert") and data["severity"] not in SEVERITIES:
        raise ValidationError("data.severity", f"must be one of {', '.join(SEVERITIES)}")
    if kind == "phase" and data["phase"] not in PHASES:
        raise ValidationError("data.phase", f"must be one of {', '.join(PHASES)}")
    elif kind == "phase" and data["attempt"] < 0:
        raise ValidationError("data.attempt", "must be >= 0")
    elif kind == "alert" and data["state"] not in ALERT_STATES:
        raise ValidationError("data.state", f"must be one of {', '.join(ALERT_STATES)}")
    elif kind == "heartbeat":
        for name, value in data.items():
            if not name:
                raise ValidationError("data", "heartbeat has an empty telemetry name")
            if name not in ("phase", "step") and decode_number(value) is None:
                raise ValidationError(f"data.{name}", f"telemetry value must be a number, got {value!r:.60}")


def validate_event(ev: Any, *, run_folder: str | None = None, host: int | None = None) -> dict:
    """Validate one decoded JSON line against the envelope and its kind's payload.

    Raises `ValidationError` naming the field. Returns the event (unchanged).
    `run_folder` and `host`, when given, are what the file's location says.
    """
    if not isinstance(ev, dict):
        raise ValidationError("(line)", f"an event is a JSON object, got {type(ev).__name__}")
    v = ev.get("v")
    if not _is_int(v):
        raise ValidationError("v", "missing or not an integer")
    if v not in SUPPORTED_VERSIONS:
        raise ValidationError("v", f"unknown format version {v} (this reader knows {SUPPORTED_VERSIONS})")
    run = ev.get("run")
    if not isinstance(run, str) or not RUN_ID_RE.match(run):
        raise ValidationError(
            "run", "missing or not a run id matching [A-Za-z0-9._-]{1,128} (and not . or ..)"
        )
    if run_folder is not None and run != run_folder:
        raise ValidationError("run", f"run id {run!r} does not match its folder {run_folder!r}")
    kind = ev.get("kind")
    if not isinstance(kind, str) or not kind:
        raise ValidationError("kind", "missing or not a string")
    step = ev.get("step")
    if step is not None and (not _is_int(step) or step < 0):
        raise ValidationError("step", "must be an integer >= 0 or null")
    t = ev.get("t")
    if decode_number(t) is None or isinstance(t, str):
        raise ValidationError("t", "missing or not a number (Unix seconds)")
    h = ev.get("host")
    if not _is_int(h) or h < 0:
        raise ValidationError("host", "missing or not an integer >= 0")
    if host is not None and h != host:
        raise ValidationError("host", f"host {h} does not match its file name (events.{host}.jsonl)")
    seq = ev.get("seq")
    if not _is_int(seq) or seq < 0:
        raise ValidationError("seq", "missing or not an integer >= 0")
    data = ev.get("data")
    if not isinstance(data, dict):
        raise ValidationError("data", "missing or not an object")
    validate_data(kind, data)
    return ev


# ---------------------------------------------------------------- one-line text

DESCRIBE_MAX = 300  # characters of a one-line summary


def fmt_value(x: Any) -> str:
    """A value as text shows it: "-" for None, floats to 6 significant digits (nan/inf as is)."""
    if x is None:
        return "-"
    if isinstance(x, float):
        return str(x) if not math.isfinite(x) else f"{x:.6g}"
    return str(x)


def _describe(kind: str, d: dict) -> str:
    if kind == "failure":
        act = f"; action: {d['action']}" if d.get("action") else ""
        final = "; the writer stopped here" if d.get("final") is True else ""
        return f"{d.get('type', '?')}: {d.get('message', '')}{act}{final}"
    if kind == "anomaly":
        w = d.get("window")
        where = f" (steps {w[0]}-{w[1]})" if isinstance(w, list) and len(w) == 2 else ""
        return f"[{d.get('severity', '?')}] {d.get('detector', '?')} on {d.get('metric', '-')}: {d.get('message', '')}{where}"
    if kind == "decision":
        if "title" in d:
            return f"{d.get('id')}: {d['title']} ({d.get('kind', '?')}, {d.get('status', '?')})"
        changed = [x for x in d if x not in ("id", "created", "updated")]
        return f"{d.get('id')}: " + ", ".join(
            f"{x} -> {fmt_value(d[x]) if not isinstance(d[x], (dict, list)) else '…'}" for x in changed
        )
    if kind == "config_diff":
        a = d.get("against") if isinstance(d.get("against"), dict) else {}
        ch = d.get("changes") if isinstance(d.get("changes"), dict) else {}
        return f"against {a.get('run')}@{a.get('step')}: " + ", ".join(
            f"{key} {v[0]!r} -> {v[1]!r}" if isinstance(v, list) and len(v) == 2 else f"{key} {v!r}"
            for key, v in sorted(ch.items())
        )
    if kind == "checkpoint":
        size = f" ({d['bytes'] / 1e6:.1f} MB)" if isinstance(d.get("bytes"), (int, float)) else ""
        return f"{d.get('path', '?')}{size}"
    if kind == "eval":
        return f"{d.get('dataset', '?')} loss {fmt_value(d.get('loss'))}"
    if kind == "run_start":
        p = d.get("parent")
        return "run started" + (f" from {p.get('run')}@{p.get('step')}" if isinstance(p, dict) else "")
    if kind == "run_end":
        return f"run ended: {d.get('status')} at step {d.get('final_step')}"
    if kind == "forecast":
        return f"forecast {d.get('metric')} = {fmt_value(d.get('value'))} at step {d.get('target_step', '-')}"
    if kind == "note":
        return str(d.get("text", ""))
    if kind == "phase":
        budget = f" (budget {fmt_value(d['budget_s'])} s)" if d.get("budget_s") is not None else ""
        return f"{d.get('phase', '?')}, attempt {d.get('attempt', '?')}{budget}"
    if kind == "alert":
        return (
            f"[{d.get('severity', '?')}] {d.get('rule', '?')} {d.get('state', '?')}: {d.get('message', '')}"
        )
    if kind == "artifact":
        size = f" ({d['bytes'] / 1e6:.1f} MB)" if isinstance(d.get("bytes"), (int, float)) else ""
        return f"{d.get('type', '?')} {d.get('name', '?')}: {d.get('path', '?')}{size}"
    return json.dumps(d, sort_keys=True, default=str)


def describe(kind: str, data: Any) -> str:
    """One line of plain text for an event (timelines, chart hovers); at most DESCRIBE_MAX characters.

    `data` may be the payload or its JSON text (as the store's `events.data` comes back).
    The text is not escaped: each place that renders it escapes for its own medium.
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except ValueError:
            data = {"text": data}
    s = _describe(kind, data if isinstance(data, dict) else {})
    return s if len(s) <= DESCRIBE_MAX else s[: DESCRIBE_MAX - 3] + "..."
