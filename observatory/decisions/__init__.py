"""Decision history: experiments, interventions and policies as structured, queryable records.

A decision is written as `decision` events (see EVENTS.md): the first carries the
whole record, every later one only the fields it changes, so each decision's own
history stays visible in the log. The store folds them into the current state
(`observatory.queries.decisions.DECISIONS_SQL`).

Events go, as host `OBSERVATORY_HOST`, into the folder of the first linked run,
or into the pseudo-run folder `decisions/` (no `run_start`) when no linked run
exists locally. Updates go to the folder the decision was created in.

    from observatory import decisions
    d = decisions.new(runs_dir, db, title="Enable z-loss", kind="intervention",
                      runs=[{"run": "d512", "step": 1200}], action="z_loss=1e-4")
    decisions.update(runs_dir, db, d.id, status="running")

Markdown (export/import, and `decide new FILE`) lives in `observatory.decisions.markdown`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from observatory.events import OBSERVATORY_HOST, RUN_ID_RE, decode_number

__all__ = [
    "KINDS",
    "STATUSES",
    "TRANSITIONS",
    "DECISIONS_RUN",
    "Forecast",
    "Trigger",
    "RunLink",
    "Cost",
    "Decision",
    "new",
    "update",
    "get",
    "list_decisions",
    "history",
    "after_ingest",
    "parse_run_link",
    "slugify",
]

KINDS = ("experiment", "intervention", "policy")
STATUSES = ("proposed", "running", "succeeded", "failed", "abandoned")
# proposed -> running -> succeeded | failed | abandoned; a proposal may also be dropped unrun.
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "proposed": ("running", "abandoned"),
    "running": ("succeeded", "failed", "abandoned"),
    "succeeded": (),
    "failed": (),
    "abandoned": (),
}
DECISIONS_RUN = "decisions"  # pseudo-run folder for decisions not linked to a local run
AUTO_AUTHOR = "observatory"
NO_ACTION = ("", "halt", "none")  # failure actions that are not an intervention


def _text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ValueError(f"decision field {name!r} must be text, got {type(value).__name__} {value!r:.60}")
    return value


def _opt_int(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"decision field {name!r} must be an integer >= 0, got {value!r:.60}")
    return value


def _opt_number(name: str, value: Any) -> float | None:
    if value is None:
        return None
    x = decode_number(value)
    if x is None:
        raise ValueError(f"decision field {name!r} must be a number, got {value!r:.60}")
    return x


def _mapping(name: str, value: Any) -> Mapping:
    if not isinstance(value, Mapping):
        raise ValueError(
            f"decision field {name!r} must be a mapping, got {type(value).__name__} {value!r:.60}"
        )
    return value


def _check_keys(name: str, value: Mapping, allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise ValueError(f"decision field {name!r} has unknown keys {unknown}; allowed: {', '.join(allowed)}")


@dataclass(frozen=True)
class Forecast:
    """A pre-registered prediction: `metric` will reach `value` (under `assumptions`)."""

    metric: str
    value: float
    assumptions: str = ""

    def __post_init__(self):
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"forecast.metric must be a metric name like 'train/loss', got {self.metric!r}")
        object.__setattr__(self, "value", _opt_number("forecast.value", self.value))
        if self.value is None:
            raise ValueError("forecast.value is required (the predicted number)")
        object.__setattr__(self, "assumptions", _text("forecast.assumptions", self.assumptions))

    @classmethod
    def from_dict(cls, d: Any) -> Forecast:
        d = _mapping("forecast", d)
        _check_keys("forecast", d, ("metric", "value", "assumptions"))
        return cls(d.get("metric"), d.get("value"), d.get("assumptions") or "")

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"metric": self.metric, "value": self.value}
        if self.assumptions:
            out["assumptions"] = self.assumptions
        return out


@dataclass(frozen=True)
class Trigger:
    """What set an intervention off: `rule` (e.g. '> 6 sigma over 128 steps') on `metric` at `step`."""

    metric: str
    rule: str = ""
    step: int | None = None

    def __post_init__(self):
        if not isinstance(self.metric, str) or not self.metric:
            raise ValueError(f"trigger.metric must be a metric or signal name, got {self.metric!r}")
        object.__setattr__(self, "rule", _text("trigger.rule", self.rule))
        _opt_int("trigger.step", self.step)

    @classmethod
    def from_dict(cls, d: Any) -> Trigger:
        d = _mapping("trigger", d)
        _check_keys("trigger", d, ("metric", "rule", "step"))
        return cls(d.get("metric"), d.get("rule") or "", d.get("step"))

    def to_dict(self) -> dict:
        out: dict[str, Any] = {"metric": self.metric}
        if self.rule:
            out["rule"] = self.rule
        if self.step is not None:
            out["step"] = self.step
        return out


@dataclass(frozen=True)
class RunLink:
    """A run (and optionally the step) the decision is about."""

    run: str
    step: int | None = None

    def __post_init__(self):
        if not isinstance(self.run, str) or not RUN_ID_RE.match(self.run):
            raise ValueError(
                f"runs[].run must be a run id matching [A-Za-z0-9._-]{{1,128}}, got {self.run!r}"
            )
        _opt_int("runs[].step", self.step)

    @classmethod
    def from_any(cls, d: Any) -> RunLink:
        if isinstance(d, str):
            return parse_run_link(d)
        d = _mapping("runs[]", d)
        _check_keys("runs[]", d, ("run", "step"))
        return cls(d.get("run"), d.get("step"))

    def to_dict(self) -> dict:
        return {"run": self.run} if self.step is None else {"run": self.run, "step": self.step}


@dataclass(frozen=True)
class Cost:
    """What the decision cost: optimizer steps, tokens and hours lost or spent."""

    steps: int | None = None
    tokens: int | None = None
    hours: float | None = None

    def __post_init__(self):
        _opt_int("cost.steps", self.steps)
        _opt_int("cost.tokens", self.tokens)
        h = _opt_number("cost.hours", self.hours)
        if h is not None and not (h >= 0):
            raise ValueError(f"cost.hours must be >= 0, got {self.hours!r}")
        object.__setattr__(self, "hours", h)

    @classmethod
    def from_dict(cls, d: Any) -> Cost:
        d = _mapping("cost", d)
        _check_keys("cost", d, ("steps", "tokens", "hours"))
        return cls(d.get("steps"), d.get("tokens"), d.get("hours"))

    def to_dict(self) -> dict:
        return {
            k: v
            for k, v in (("steps", self.steps), ("tokens", self.tokens), ("hours", self.hours))
            if v is not None
        }


def parse_run_link(text: str) -> RunLink:
    """'run' or 'run@step' (the CLI's form) as a RunLink."""
    run, _, step = text.partition("@")
    if step and not step.isdigit():
        raise ValueError(f"run link {text!r}: the step after '@' must be an integer >= 0")
    return RunLink(run, int(step) if step else None)


def slugify(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")[:60].strip("-")
    return slug or "decision"


@dataclass(frozen=True)
class Decision:
    """One decision record, validated. Empty text fields are ""; absent structures are None or ()."""

    id: str
    title: str
    kind: str = "experiment"
    status: str = "proposed"
    hypothesis: str = ""
    goal: str = ""
    forecast: Forecast | None = None
    trigger: Trigger | None = None  # interventions: what set it off
    action: str = ""  # skip batches, roll back to step X, lower LR, enable z-loss...
    alternatives: tuple[str, ...] = ()
    runs: tuple[RunLink, ...] = ()
    config_diff: Mapping[str, Any] = field(default_factory=dict)  # {"dotted.key": [old, new]}
    evidence: tuple[Any, ...] = ()  # links (str) or metric snapshots / event refs (mappings)
    cost: Cost | None = None
    outcome: str = ""
    follow_up: str = ""
    author: str = ""
    created: float | None = None  # Unix seconds
    updated: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys from newer writers, kept verbatim

    def __post_init__(self):
        if not isinstance(self.id, str) or not RUN_ID_RE.match(self.id):
            raise ValueError(
                f"decision id must match [A-Za-z0-9._-]{{1,128}} (it names a file), got {self.id!r}"
            )
        if not isinstance(self.title, str) or not self.title.strip():
            raise ValueError(f"decision {self.id}: title must be non-empty text")
        if self.kind not in KINDS:
            raise ValueError(f"decision {self.id}: kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.status not in STATUSES:
            raise ValueError(
                f"decision {self.id}: status must be one of {', '.join(STATUSES)}, got {self.status!r}"
            )
        for name in ("hypothesis", "goal", "action", "outcome", "follow_up", "author"):
            object.__setattr__(self, name, _text(name, getattr(self, name)))
        set_ = object.__setattr__
        if self.forecast is not None and not isinstance(self.forecast, Forecast):
            set_(self, "forecast", Forecast.from_dict(self.forecast))
        if self.trigger is not None and not isinstance(self.trigger, Trigger):
            set_(self, "trigger", Trigger.from_dict(self.trigger))
        if self.cost is not None and not isinstance(self.cost, Cost):
            set_(self, "cost", Cost.from_dict(self.cost))
        alts = self.alternatives
        if (
            isinstance(alts, str)
            or not isinstance(alts, Iterable)
            or not all(isinstance(a, str) for a in alts)
        ):
            raise ValueError(f"decision {self.id}: alternatives must be a list of text, got {alts!r:.80}")
        set_(self, "alternatives", tuple(alts))
        if isinstance(self.runs, (str, Mapping)) or not isinstance(self.runs, Iterable):
            raise ValueError(
                f"decision {self.id}: runs must be a list of {{run, step}}, got {self.runs!r:.80}"
            )
        set_(self, "runs", tuple(r if isinstance(r, RunLink) else RunLink.from_any(r) for r in self.runs))
        diff = _mapping("config_diff", self.config_diff or {})
        for key, change in diff.items():
            if not isinstance(key, str) or not isinstance(change, (list, tuple)) or len(change) != 2:
                raise ValueError(
                    f"decision {self.id}: config_diff must map 'dotted.key' to [old, new], got {key!r}: {change!r:.60}"
                )
        set_(self, "config_diff", {k: list(v) for k, v in diff.items()})
        ev = self.evidence
        if isinstance(ev, (str, Mapping)) or not isinstance(ev, Iterable):
            raise ValueError(
                f"decision {self.id}: evidence must be a list of links or mappings, got {ev!r:.80}"
            )
        ev = tuple(ev)
        if not all(isinstance(e, (str, Mapping)) for e in ev):
            raise ValueError(f"decision {self.id}: each evidence item must be a link (text) or a mapping")
        set_(self, "evidence", ev)
        for name in ("created", "updated"):
            set_(self, name, _opt_number(name, getattr(self, name)))
        set_(self, "extra", dict(_mapping("extra", self.extra or {})))

    # ---------------------------------------------------------------- dicts

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Decision:
        """A record from a folded state or front matter; unknown keys land in `extra`."""
        d = dict(_mapping("decision", d))
        known = {f.name for f in fields(cls)} - {"extra"}
        extra = {k: d.pop(k) for k in list(d) if k not in known}
        for k in ("hypothesis", "goal", "action", "outcome", "follow_up", "author", "config_diff"):
            if d.get(k) is None:
                d.pop(k, None)
        for k in ("alternatives", "runs", "evidence"):
            if d.get(k) is None:
                d.pop(k, None)
        if "id" not in d or "title" not in d:
            raise ValueError(f"decision {d.get('id', '?')}: id and title are required")
        return cls(**d, extra=extra)

    def to_dict(self, *, times: bool = True) -> dict[str, Any]:
        """JSON-able dict of every non-empty field (the form events and front matter use)."""
        out: dict[str, Any] = {"id": self.id, "title": self.title, "kind": self.kind, "status": self.status}
        for name in ("hypothesis", "goal"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if self.forecast:
            out["forecast"] = self.forecast.to_dict()
        if self.trigger:
            out["trigger"] = self.trigger.to_dict()
        if self.action:
            out["action"] = self.action
        if self.alternatives:
            out["alternatives"] = list(self.alternatives)
        if self.runs:
            out["runs"] = [r.to_dict() for r in self.runs]
        if self.config_diff:
            out["config_diff"] = {k: list(v) for k, v in self.config_diff.items()}
        if self.evidence:
            out["evidence"] = [dict(e) if isinstance(e, Mapping) else e for e in self.evidence]
        if self.cost and self.cost.to_dict():
            out["cost"] = self.cost.to_dict()
        for name in ("outcome", "follow_up", "author"):
            if getattr(self, name):
                out[name] = getattr(self, name)
        if times:
            for name in ("created", "updated"):
                if getattr(self, name) is not None:
                    out[name] = getattr(self, name)
        out.update(self.extra)
        return out

    def field_value(self, name: str) -> Any:
        """A field as it appears in an event payload (None when empty)."""
        return self.to_dict().get(name)

    def check_transition(self, new_status: str) -> None:
        if new_status == self.status:
            return
        if new_status not in STATUSES:
            raise ValueError(
                f"decision {self.id}: status must be one of {', '.join(STATUSES)}, got {new_status!r}"
            )
        allowed = TRANSITIONS[self.status]
        if new_status not in allowed:
            hint = f"allowed next: {', '.join(allowed)}" if allowed else "it is final; record a new decision"
            raise ValueError(f"decision {self.id}: cannot go from {self.status} to {new_status} ({hint})")


# ------------------------------------------------------------------ store side


def _connect(db):
    from observatory.store import connect

    return connect(db)


def _with_con(db, fn):
    """Run fn(con) on an open connection, or open (and close) one read-only for a path."""
    if hasattr(db, "execute"):
        return fn(db)
    with _connect(db) as con:
        return fn(con)


def _state_to_decision(row: dict) -> Decision:
    state = dict(row["state"])
    state["created"] = row["created"]
    state["updated"] = row["updated"]
    return Decision.from_dict(state)


def get(db, decision_id: str) -> Decision | None:
    """The current state of one decision, or None."""
    from observatory.queries import decisions as q

    rows = _with_con(db, lambda con: q.current_states(con, [decision_id]))
    return _state_to_decision(rows[0]) if rows else None


def list_decisions(
    db, *, status: str | None = None, kind: str | None = None, run: str | None = None
) -> list[Decision]:
    """Every decision's current state, oldest first, optionally filtered."""
    from observatory.queries import decisions as q

    out = [_state_to_decision(r) for r in _with_con(db, q.current_states)]
    return [
        d
        for d in out
        if (status is None or d.status == status)
        and (kind is None or d.kind == kind)
        and (run is None or any(link.run == run for link in d.runs))
    ]


def history(db, decision_id: str) -> list[dict]:
    """One decision's events in order: [{run, host, seq, step, t, data}]."""
    from observatory.queries import decisions as q

    return _with_con(db, lambda con: q.decision_events(con, decision_id))


def _home(db, decision_id: str) -> str | None:
    from observatory.queries import decisions as q

    rows = _with_con(db, lambda con: q.current_states(con, [decision_id]))
    return rows[0]["home_run"] if rows else None


def _write_events(runs_dir, run: str, items: list[tuple[dict, int | None]]) -> None:
    """Append decision events to <runs_dir>/<run>/events.1000.jsonl through the normal writer."""
    from observatory.writer import init

    w = init(
        run_id=run, runs_dir=runs_dir, host=OBSERVATORY_HOST, write_start=False, install_signal_handlers=False
    )
    try:
        for data, step in items:
            w.event("decision", data, step=step)
    finally:
        w.close()  # flush; never finish(): that would write a run_end into someone's run


def _folder_for(runs_dir, d: Decision) -> str:
    for link in d.runs:
        if (Path(runs_dir) / link.run).is_dir():
            return link.run
    return DECISIONS_RUN


def _event_step(d: Decision) -> int | None:
    return d.runs[0].step if d.runs else None


def _ingest(runs_dir, db) -> bool:
    """Bring the store up to date after writing; False when ingest is not available."""
    try:
        from observatory.ingest import ingest
    except ImportError:
        return False
    ingest(runs_dir, db)
    return True


def unique_id(db, title: str) -> str:
    from observatory.queries import decisions as q

    taken = _with_con(db, q.decision_ids)
    base = slugify(title)
    cand, n = base, 2
    while cand in taken:
        cand, n = f"{base}-{n}", n + 1
    return cand


def new(runs_dir, db, *, ingest: bool = True, now: float | None = None, **fields_: Any) -> Decision:
    """Record a new decision (validated), write its first event, and ingest it.

    `fields_` are Decision fields; `id` defaults to a slug of the title. Raises
    ValueError for bad fields or an id already in use.
    """
    now = time.time() if now is None else now
    if not fields_.get("id"):
        fields_["id"] = unique_id(db, str(fields_.get("title") or ""))
    elif get(db, fields_["id"]) is not None:
        raise ValueError(f"decision {fields_['id']!r} already exists; use `decide update`")
    fields_.setdefault("created", now)
    fields_.setdefault("updated", fields_["created"])
    d = Decision(**fields_)
    _write_events(runs_dir, _folder_for(runs_dir, d), [(d.to_dict(), _event_step(d))])
    if ingest:
        _ingest(runs_dir, db)
    return d


def diff_fields(old: Decision, new_: Decision) -> dict[str, Any]:
    """The payload fields in which two records differ (None for a field that was cleared)."""
    a, b = old.to_dict(times=False), new_.to_dict(times=False)
    return {k: b.get(k) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def update(
    runs_dir, db, decision_id: str, *, ingest: bool = True, now: float | None = None, **changes: Any
) -> Decision:
    """Change fields of a decision: validates the status transition, writes one event with the changes."""
    cur = get(db, decision_id)
    if cur is None:
        raise ValueError(
            f"no decision {decision_id!r} in the store (run `observatory ingest` if it was just written)"
        )
    if "id" in changes and changes["id"] != decision_id:
        raise ValueError("a decision's id cannot change; record a new decision instead")
    if "status" in changes:
        cur.check_transition(changes["status"])
    now = time.time() if now is None else now
    nxt = replace(cur, **changes, updated=now)
    delta = diff_fields(cur, nxt)
    if not delta:
        return cur
    _write_events(
        runs_dir,
        _home(db, decision_id) or DECISIONS_RUN,
        [({"id": decision_id, **delta, "updated": now}, None)],
    )
    if ingest:
        _ingest(runs_dir, db)
    return nxt


# ------------------------------------------------------------ automatic records


def _auto_id(ev: dict) -> str:
    host = "" if ev["host"] == 0 else f"h{ev['host']}-"
    return f"auto-{ev['run']}-{host}{ev['seq']}"[:128]


def _auto_record(ev: dict) -> Decision | None:
    data, run, step = ev["data"], ev["run"], ev["step"]
    ref = {"event": {"run": run, "host": ev["host"], "seq": ev["seq"], "kind": ev["kind"], "step": step}}
    if ev["kind"] == "config_diff":
        changes = data.get("changes")
        against = data.get("against") or {}
        if not isinstance(changes, Mapping) or not changes:
            return None
        links = [RunLink(run, step)]
        if isinstance(against.get("run"), str) and RUN_ID_RE.match(against["run"]) and against["run"] != run:
            links.append(
                RunLink(against["run"], against.get("step") if isinstance(against.get("step"), int) else None)
            )
        where = f"{against.get('run')}@{against.get('step')}" if against else "its parent"
        keys = ", ".join(sorted(changes))
        return Decision(
            id=_auto_id(ev),
            title=f"Config change in {run} against {where}: {keys}"[:200],
            kind="experiment",
            status="proposed",
            hypothesis="Recorded automatically from a config_diff; state why these settings changed.",
            runs=tuple(links),
            config_diff={
                k: list(v) if isinstance(v, (list, tuple)) and len(v) == 2 else [None, v]
                for k, v in changes.items()
            },
            evidence=(ref,),
            author=AUTO_AUTHOR,
        )
    action = data.get("action")
    if not isinstance(action, str) or action.strip().lower() in NO_ACTION:
        return None
    ftype = str(data.get("type") or "failure")
    at = f" at step {step}" if step is not None else ""
    return Decision(
        id=_auto_id(ev),
        title=f"{action} after {ftype}{at} in {run}"[:200],
        kind="intervention",
        status="running",  # the action was taken; a person records whether it worked
        trigger=Trigger(
            "train/loss" if ftype == "nan_loss" else ftype, str(data.get("message") or "")[:2000], step
        ),
        action=action,
        runs=(RunLink(run, step),),
        evidence=(ref,),
        author=AUTO_AUTHOR,
    )


def _ids_in_file(path: Path) -> set[str]:
    """Decision ids already written to a host file but maybe not ingested yet (keeps re-runs idempotent)."""
    import json

    ids: set[str] = set()
    if not path.exists():
        return ids
    with open(path, "rb") as f:
        for raw in f:
            if b'"decision"' not in raw:
                continue
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("kind") == "decision" and isinstance(ev.get("data"), dict):
                ids.add(str(ev["data"].get("id")))
    return ids


def after_ingest(
    db, runs_dir, touched_runs: Iterable[str] | None = None, *, now: float | None = None
) -> set[str]:
    """Create decision records for new config changes and for failures handled with an action.

    Call after an ingest pass with the runs it touched (None: all). `db` is a path or an
    open connection (pass the ingester's own connection while it holds the store: DuckDB
    will not open a second, read-only one in the same process). Ids are deterministic
    (`auto-<run>-<seq>`), so calling it twice writes nothing new. Returns the runs whose
    folders got new events: ingest those again so the records reach the store.
    """
    from observatory.queries import decisions as q

    runs = None if touched_runs is None else sorted(set(touched_runs) - {DECISIONS_RUN})

    def load(con):
        return q.auto_sources(con, runs), q.decision_ids(con)

    sources, known = _with_con(db, load)
    by_run: dict[str, list[tuple[dict, int | None]]] = {}
    now = time.time() if now is None else now
    file_ids: dict[str, set[str]] = {}
    for ev in sources:
        rec = _auto_record(ev)
        if rec is None or rec.id in known:
            continue
        run = ev["run"]
        if run not in file_ids:
            file_ids[run] = _ids_in_file(Path(runs_dir) / run / f"events.{OBSERVATORY_HOST}.jsonl")
        if rec.id in file_ids[run]:
            continue
        rec = replace(
            rec, created=ev["t"] if ev["t"] is not None and math.isfinite(ev["t"]) else now, updated=now
        )
        by_run.setdefault(run, []).append((rec.to_dict(), ev["step"]))
    for run, items in by_run.items():
        _write_events(runs_dir, run, items)
    return set(by_run)
