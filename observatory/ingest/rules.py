"""The store's field rules for a valid line, declared once: each bound, the field it names and its reason.

A line is valid when `observatory.events.validate_event` accepts it (the event contract) and its values
fit the store's columns (the bounds below). Both ways of judging lines take the bounds from here:

- `check_ranges` (called by `model.check_line`, one line at a time) raises each rule's own reason;
- the bulk path (`msgspec_lines`) certifies a decoded line with `certain` (the envelope) and the same
  bounds for the payload (`LAYER` in `layouts.ExpertData`'s type, `EXPERTS` and `COUNT` over the count
  lists). It never rejects a line on a rule: a line it cannot certify goes to `check_line`, which says why.

So a bound changed here changes both paths; `tests/test_ingest_fast.py` checks that with a tightened one.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from observatory.events import SUPPORTED_VERSIONS, ValidationError

U16, U32, I32, I64 = (1 << 16) - 1, (1 << 32) - 1, (1 << 31) - 1, (1 << 63) - 1


@dataclass(frozen=True)
class Bound:
    """An integer field's range: `lo <= value <= hi`, or `field` is rejected for `reason` (which may say
    `{value}`, `{hi}` and `{above}`, the first value out of range above)."""

    field: str
    lo: int
    hi: int
    reason: str

    def ok(self, value: int) -> bool:
        return self.lo <= value <= self.hi

    def check(self, value: int) -> None:
        if not self.lo <= value <= self.hi:
            raise ValidationError(self.field, self.reason.format(value=value, hi=self.hi, above=self.hi + 1))

    def check_all(self, values: list[int]) -> None:
        lo, hi = self.lo, self.hi
        for v in values:
            if not lo <= v <= hi:
                self.check(v)


SEQ = Bound("seq", 0, I64, "seq {value} does not fit a 64-bit integer")
HOST = Bound("host", 0, U16, "host {value} is above {hi}")
# the step column of each kind's table: expert_load's is INTEGER, every other's BIGINT
STEP = {
    "expert_load": Bound("step", 0, I32, "step {value} is too large for the store"),
    "": Bound("step", 0, I64, "step {value} is too large for the store"),  # any other kind
}
HEARTBEAT_STEP = Bound(
    "data.step", 0, I64, "the step a heartbeat is at must be >= 0 and fit a 64-bit integer"
)
LAYER = Bound("data.layer", 0, U16, "at most {above} layers and experts")
EXPERTS = Bound("data.layer", 0, U16 + 1, "at most {hi} layers and experts")  # entries of routed, dropped
COUNT = Bound("data.routed", 0, U32, "counts must be below {above}")  # each routed and dropped count


def step_rule(kind: str) -> Bound:
    return STEP.get(kind) or STEP[""]


def check_ranges(ev: dict) -> None:
    """An event `validate_event` accepted whose values must still fit the store's columns: raise the first
    rule it breaks."""
    kind, step, data = ev["kind"], ev.get("step"), ev["data"]
    SEQ.check(ev["seq"])
    if step is not None:
        step_rule(kind).check(step)
    if kind == "heartbeat" and isinstance(data.get("step"), int):
        HEARTBEAT_STEP.check(data["step"])
    HOST.check(ev["host"])
    if kind == "expert_load":
        if step is None:
            raise ValidationError("step", "expert_load needs a step")
        LAYER.check(data["layer"])
        EXPERTS.check(len(data["routed"]))
        COUNT.check_all(data["routed"])
        COUNT.check_all(data["dropped"])


def certain(decoded: list, run: str | list[str], host: int | list[int]) -> list[bool]:
    """For each line the bulk path decoded (a typed Struct; None: it did not decode), whether its envelope
    is one `validate_event` and `check_ranges` accept for sure: a metrics or expert_load line (the kinds
    whose field types msgspec checked strictly, `bulk_kind`) in a file of `run` and `host` (each line's,
    when lists; the host passed `HOST`). False: `check_line` decides.

    Stricter than the rules where the bulk path cannot be sure: a step is required (the typed columns need
    one) and `t` must be finite (JSON has no literal for the others). One call a piece, the bounds read
    once: a call a line cost twice the checks themselves."""
    versions, seq_lo, seq_hi, isfinite = SUPPORTED_VERSIONS, SEQ.lo, SEQ.hi, math.isfinite
    steps = {kind: (rule.lo, rule.hi) for kind, rule in STEP.items()}
    runs = itertools.repeat(run) if isinstance(run, str) else run
    hosts = itertools.repeat(host) if isinstance(host, int) else host
    out = []
    for e, run_, host_ in zip(decoded, runs, hosts, strict=False):  # a repeat is endless
        kind = getattr(e.__class__, "bulk_kind", None)
        if kind is None:
            out.append(False)
            continue
        lo, hi = steps.get(kind) or steps[""]
        step = e.step
        out.append(
            e.v in versions
            and e.run == run_
            and e.host == host_
            and step is not None
            and lo <= step <= hi
            and seq_lo <= e.seq <= seq_hi
            and isfinite(e.t)
        )
    return out
