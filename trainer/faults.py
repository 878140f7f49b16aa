"""Fault injection: real instabilities for the observatory to catch.

    inject=lr_spike@STEP:xFACTOR   the learning rate of step STEP is multiplied by FACTOR
    inject=bad_batch@STEP          step STEP trains on a batch of one repeated byte
    inject=nan@STEP                step STEP's loss (and so its gradients) is NaN
    inject=crash@STEP              a RuntimeError is raised before step STEP (the exception path)
    inject=lr_drift@STEP:xFACTOR   from step STEP the learning rate drifts up, linearly in steps, to FACTOR
                                   times its schedule at the run's last step (a slow divergence)

Give `inject=` several times (or a list in YAML) for several faults. Each fault fires
once: a rollback that replays STEP does not fire it again, as a transient fault
would not recur (a drift is no event: it holds from its step on, replayed or not). A resumed
run is a new process with a new plan: a crash at STEP crashes it again (a crash loop).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Fault", "FaultPlan", "parse_faults", "InjectedCrash"]

KINDS = ("lr_spike", "bad_batch", "nan", "crash", "lr_drift")
FACTORED = ("lr_spike", "lr_drift")  # the kinds that take :xFACTOR
_RE = re.compile(r"^(?P<kind>[a-z_]+)@(?P<step>\d+)(?::x(?P<factor>[0-9.eE+-]+))?$")


class InjectedCrash(RuntimeError):
    """Raised by `inject=crash@STEP`."""


@dataclass(frozen=True)
class Fault:
    kind: str
    step: int
    factor: float = 1.0  # lr_spike and lr_drift only

    def __str__(self) -> str:
        return f"{self.kind}@{self.step}" + (f":x{self.factor:g}" if self.kind in FACTORED else "")


def parse_faults(specs) -> list[Fault]:
    """Parse `inject` entries; ValueError names the bad entry and the accepted forms."""
    out = []
    for s in specs or ():
        m = _RE.match(str(s).strip())
        if not m or m["kind"] not in KINDS:
            raise ValueError(
                f"inject: cannot parse {s!r}; expected one of lr_spike@STEP:xFACTOR, bad_batch@STEP, "
                "nan@STEP, crash@STEP, lr_drift@STEP:xFACTOR"
            )
        kind, step = m["kind"], int(m["step"])
        if kind in FACTORED:
            if m["factor"] is None:
                raise ValueError(f"inject: {s!r} needs a factor, e.g. {kind}@{step}:x10")
            try:
                factor = float(m["factor"])
            except ValueError:
                raise ValueError(f"inject: {s!r}: factor {m['factor']!r} is not a number") from None
            out.append(Fault(kind, step, factor))
        else:
            if m["factor"] is not None:
                raise ValueError(f"inject: {s!r}: only lr_spike takes a :xFACTOR (and lr_drift)")
            out.append(Fault(kind, step))
    return out


class FaultPlan:
    """Which faults fire at a step; each fires at most once."""

    def __init__(self, specs):
        self.faults = parse_faults(specs)
        self.fired: set[str] = set()

    def at(self, step: int) -> list[Fault]:
        due = [f for f in self.faults if f.step == step and str(f) not in self.fired]
        for f in due:
            self.fired.add(str(f))
        return due

    def lr_factor(self, due: list[Fault], step: int | None = None, last: int | None = None) -> float:
        """The LR multiplier of a step: the spikes due at it, and every drift begun by it (`step` of `last`)."""
        x = 1.0
        for f in due:
            if f.kind == "lr_spike":
                x *= f.factor
        if step is not None and last is not None:
            for f in self.faults:
                if f.kind == "lr_drift" and step >= f.step:
                    x *= 1 + (f.factor - 1) * (step - f.step) / max(1, last - f.step)
        return x
