"""The decision record: what a decision is, validated field by field.

A `Decision` is an experiment, an intervention or a policy, with its hypothesis,
forecast, trigger, linked runs, config diff, evidence, cost and outcome. Its status
moves along `TRANSITIONS`. Every constructor validates and raises ValueError naming
the bad field and value.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from observatory.events import RUN_ID_RE, decode_number

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
