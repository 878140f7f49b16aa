"""A ladder's data without the fit: rungs, their seeds, forecast curves, the version stamp.

Seeds: a rung may be trained with several seeds (runs with the same `rung` label,
`ladder.seed` in run_start). `average_seeds` averages them at every fraction and the
rung stays one unit everywhere after that; the seeds' spread (`seed_noise`) is the
run-to-run noise the band uses (else `NOISE_DEFAULT`).

`fit_version` names the method (`FIT_VERSION`) and the data a fit saw, so a forecast
event says exactly what made it.

No scipy here: the store side (`observatory.ladder.watch`, run by the ingester after each batch)
needs these types and not the fit.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

__all__ = [
    "FRACTIONS",
    "METHOD",
    "FIT_VERSION",
    "NOISE_DEFAULT",
    "DETECTOR",
    "EVAL_METRIC",
    "Rung",
    "ForecastPoint",
    "Forecast",
    "average_seeds",
    "seed_noise",
    "fit_version",
    "as_run_id",
]

FRACTIONS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 5% .. 100%
METHOD = (
    "powerlaw-huber-log(delta=1e-3)/L-BFGS-B; band: rung bootstrap or noise refits + forward held-out-rung "
    "error (E=0 proxy when no rung is left over) [+ E range envelope]"
)
FIT_VERSION = "5"  # changes whenever the method changes what a forecast says
NOISE_DEFAULT = 0.003  # run-to-run noise assumed when the rungs have no seeds to measure it from
DETECTOR = "ladder_deviation"
EVAL_METRIC = "eval/loss"


@dataclass(frozen=True)
class Rung:
    """One rung: its compute and its eval loss at schedule fractions (1.0 = the final eval).

    Either one run (`seed` = its ladder.seed, if any) or, after `average_seeds`, the mean
    of several seeds of the same rung (`runs` lists them, `seed` is None).
    """

    run: str
    rung: str
    flops: float
    curve: dict[float, float]  # fraction of the schedule -> eval loss
    params_active: int | None = None
    params_total: int | None = None
    tokens: int | None = None
    steps: int | None = None
    seed: int | None = None
    runs: tuple[str, ...] = ()  # the seed runs averaged into this rung; () = just `run`
    problem: str | None = None  # why it has no final eval, as the store tells (`watch.load_ladder`)

    def __post_init__(self):
        if not (self.flops > 0 and math.isfinite(self.flops)):
            raise ValueError(f"rung {self.rung!r} (run {self.run}): flops must be > 0, got {self.flops}")

    @property
    def final_loss(self) -> float | None:
        return self.curve.get(1.0)

    @property
    def n_seeds(self) -> int:
        return max(1, len(self.runs))


@dataclass(frozen=True)
class ForecastPoint:
    fraction: float
    step: int | None
    value: float
    low: float
    high: float


@dataclass(frozen=True)
class Forecast:
    flops: float
    steps: int | None
    points: list[ForecastPoint]

    @property
    def final(self) -> ForecastPoint:
        return max(self.points, key=lambda p: p.fraction)

    def as_rows(self) -> list[dict]:
        return [asdict(p) for p in self.points]


def average_seeds(rungs: Sequence[Rung]) -> list[Rung]:
    """One `Rung` per rung label: the seeds of a rung averaged at every schedule fraction.

    Runs with the same `rung` label are seeds of one rung (they must share its compute).
    At each fraction the loss is the mean over the seeds that have an eval there (a seed
    still running adds its points as they come). A rung of one run is returned as is.
    The result is what the fit, its bootstrap (a rung's seeds always travel together)
    and the leave-one-rung-out see. Order: by compute.
    """
    groups: dict[str, list[Rung]] = {}
    for r in rungs:
        groups.setdefault(r.rung, []).append(r)
    out = []
    for label, rs in groups.items():
        if len(rs) == 1 and not rs[0].runs:
            out.append(rs[0])
            continue
        rs = sorted(rs, key=lambda r: (r.seed is None, r.seed or 0, r.run))
        if any(not math.isclose(r.flops, rs[0].flops, rel_tol=1e-9) for r in rs):
            raise ValueError(
                f"rung {label!r}: its seed runs differ in compute "
                + ", ".join(f"{r.run}: C={r.flops:.6g}" for r in rs)
                + "; seeds of a rung must "
                "train the same model on the same tokens"
            )
        fracs = sorted(set().union(*(r.curve for r in rs)))
        curve = {f: float(np.mean([r.curve[f] for r in rs if f in r.curve])) for f in fracs}
        runs = tuple(x for r in rs for x in (r.runs or (r.run,)))
        out.append(
            Rung(
                run=rs[0].run,
                rung=label,
                flops=rs[0].flops,
                curve=curve,
                params_active=rs[0].params_active,
                params_total=rs[0].params_total,
                tokens=rs[0].tokens,
                steps=rs[0].steps,
                seed=None,
                runs=runs,
                problem=None if 1.0 in curve else next((r.problem for r in rs if r.problem), None),
            )
        )
    return sorted(out, key=lambda r: (r.flops, r.rung))


def seed_noise(rungs: Sequence[Rung], fraction: float = 1.0) -> tuple[float, int]:
    """Run-to-run noise measured from seeds: (pooled 1-sigma std of log loss at `fraction`, dof).

    `rungs` are single runs (before `average_seeds`); the spread of a rung's seeds around
    their mean is pooled over rungs. dof = sum(seeds - 1) over rungs; (nan, 0) without seeds.
    """
    groups: dict[str, list[float]] = {}
    for r in rungs:
        if fraction in r.curve and r.curve[fraction] > 0:
            groups.setdefault(r.rung, []).append(math.log(r.curve[fraction]))
    ss = sum(float(((np.array(v) - np.mean(v)) ** 2).sum()) for v in groups.values())
    dof = sum(len(v) - 1 for v in groups.values())
    return (math.sqrt(ss / dof), dof) if dof > 0 else (float("nan"), 0)


def fit_version(rungs: Sequence[Rung]) -> str:
    """FIT_VERSION plus a short hash of the data a fit saw, so a forecast names exactly what it used."""
    rungs = average_seeds(rungs)
    payload = [
        ("+".join(r.runs) if len(r.runs) > 1 else r.run, r.flops, sorted(r.curve.items()))
        for r in sorted(rungs, key=lambda r: r.run)
    ]
    return f"{FIT_VERSION}:{hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:12]}"


def as_run_id(raw: str) -> str:
    """`raw` made a run id: `1e+18` becomes `1e18`, other characters a run id cannot hold become `-`."""
    raw = re.sub(r"(?<=\d)[eE]\+(?=\d)", "e", raw)
    return re.sub(r"[^A-Za-z0-9._-]+", "-", raw).strip("-.")[:128] or "run"
