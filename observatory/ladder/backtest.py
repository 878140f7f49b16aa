"""Backtest a ladder: leave the largest rung out, fit the others, forecast its curve.

Reports the final-loss error in % and the share of its curve points inside the band.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

from observatory.ladder.fit import FitConfig, fit_ladder
from observatory.ladder.rungs import Forecast, Rung, average_seeds

__all__ = ["Backtest", "compare", "backtest"]


@dataclass(frozen=True)
class Backtest:
    held_out: str
    run: str
    flops: float
    final_pred: float
    final_low: float
    final_high: float
    final_obs: float
    final_error_pct: float  # 100 * (pred - obs) / obs
    coverage: float  # share of the held-out curve's points inside the band
    points: list[dict]  # fraction, step, value, low, high, observed, inside
    held_out_basis: str = "measured"  # the band's held-out term for this fit (`LadderFit.held_out`)
    warnings: list[str] = field(default_factory=list)  # the fit's (`LadderFit.warnings`)

    def as_dict(self) -> dict:
        return asdict(self)


def compare(forecast: Forecast, curve: dict[float, float]) -> list[dict]:
    """Forecast points joined with an observed curve (fraction -> loss)."""
    rows = []
    for p in forecast.points:
        obs = curve.get(p.fraction)
        inside = None if obs is None else bool(p.low <= obs <= p.high)
        rows.append({**asdict(p), "observed": obs, "inside": inside})
    return rows


def backtest(
    rungs: Sequence[Rung],
    config: FitConfig | None = None,
    name: str = "ladder",
    progress: Callable[[dict], None] | None = None,
) -> Backtest:
    """Leave the largest rung (all its seeds) out, fit the rest, forecast its (seed-mean) curve, score it.

    The band is for the held-out rung as observed: the mean of its seeds, so the forecast's
    own-noise term is noise / sqrt(seeds). `progress`: as for `fit_ladder`, of that fit.
    """
    held = average_seeds(rungs)[-1]
    rest = [r for r in rungs if r.rung != held.rung]
    fit = fit_ladder(rest, config, name=name, progress=progress)
    fc = fit.forecast(held.flops, held.steps, seeds=held.n_seeds)
    rows = compare(fc, held.curve)
    scored = [r for r in rows if r["inside"] is not None]
    fin = fc.final
    obs = held.final_loss
    if obs is None:
        raise ValueError(f"held-out rung {held.rung!r} has no final eval")
    return Backtest(
        held_out=held.rung,
        run=held.run,
        flops=held.flops,
        final_pred=fin.value,
        final_low=fin.low,
        final_high=fin.high,
        final_obs=obs,
        final_error_pct=100.0 * (fin.value - obs) / obs,
        coverage=sum(r["inside"] for r in scored) / len(scored) if scored else float("nan"),
        points=rows,
        held_out_basis=fit.held_out,
        warnings=list(fit.warnings),
    )
