"""Scaling-ladder fits: predict a big run's loss curve from a ladder of small runs.

The law (`observatory.ladder.powerlaw`) is fit

- to each rung's final eval loss, and
- at every schedule fraction f (5%, 10%, ..., 100%) to the rungs' eval loss at
  that fraction, so a target's whole curve is forecast, not only its end. By
  default E is shared by all fractions (see `FitConfig.shared_e`).

A rung's seeds are averaged first and travel together from then on
(`observatory.ladder.rungs.average_seeds`).

Uncertainty (`fit_ladder`): a bootstrap over whole rungs (a rung's whole curve, all
its seeds, is one unit: its points are not independent), refit at every fraction with the
same resampled rungs so the band is coherent along the curve, each resampled rung's
curve also moved by one draw of the run-to-run noise (so three or four rungs, which
a 3-parameter law can nearly interpolate, still show how far such noise throws the
extrapolation), and beside it refits of every rung each moved by a draw of that noise (a
parametric bootstrap; the wider of the two counts); the band's
quantiles (default 5%..95%, a 90% band) are then widened, in log space and in
quadrature, by the forward prediction error at that fraction (the largest rung
predicted from the smaller rungs alone: an extrapolation, as the target's forecast
is, from the most rungs), scaled up by how much farther from the rungs' centre the
target lies than that held-out rung did from its fit's, because four rungs cannot
show in a bootstrap how wrong an extrapolation can be; and by
the target's own run-to-run noise (`FitConfig.noise`), which no fit to other runs
can predict. Leave-one-rung-out errors (each rung from all the others) are
reported too (`FitConfig.loo="max"` or `"rms"` bands with them); for the smallest
rung that is a backward extrapolation, which says little about a forecast forward
and often is the largest error of all, so such a band is much wider.

With as many free parameters as rungs (E, A, alpha through 3 rungs) no rung is left over to
measure the held-out error (`LadderFit.held_out`): "proxy" widens the band by the largest
rung's error under the law with E = 0 (one parameter fewer), "none" (2 rungs, E fixed)
gives no band; both add a warning (`LadderFit.warnings`). `FitConfig.e_range` carries E's
own uncertainty: the fit at E values across the range, the band their envelope.

The backtest (`observatory.ladder.backtest`) scores this on the ladder itself;
pre-registering a target's forecast and watching the target against it is
`observatory.ladder.watch`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace

import numpy as np
from scipy.stats import norm

from observatory.ladder.powerlaw import PowerLaw, fit_curves, one_blas_thread
from observatory.ladder.rungs import (
    FRACTIONS,
    METHOD,
    NOISE_DEFAULT,
    Forecast,
    ForecastPoint,
    Rung,
    average_seeds,
    fit_version,
    seed_noise,
)

__all__ = ["FitConfig", "LadderFit", "fit_ladder"]


@dataclass(frozen=True)
class FitConfig:
    """How a ladder is fit. Defaults are what `observatory ladder fit` uses."""

    delta: float = 1e-3  # Huber threshold on log residuals (0.1% of the loss)
    fix_e: float | None = None  # irreducible loss E held fixed instead of fitted
    n_boot: int = 200  # bootstrap resamples of whole rungs
    level: float = 0.9  # central coverage of the band
    n_starts: int = 3  # L-BFGS-B runs, started from the best grid points
    seed: int = 0
    # Widen the band by the "forward" error (the largest rung predicted from the smaller rungs
    # only: an extrapolation, as the target's forecast is), or by the "max" or "rms"
    # leave-one-rung-out error (each rung from all the others, which for the smallest rung is a
    # backward extrapolation), or "none". "forward" by default: the smallest rung predicted
    # backwards is often the largest leave-one-out error, and says little about a forecast forward.
    loo: str = "forward"
    # Run-to-run noise of one run's eval loss (relative, 1 sigma): a target's own seed noise is
    # something no fit to other runs can predict, and a 3-parameter law through 3-4 rungs leaves
    # too few residual degrees of freedom to estimate it from the law's residuals. None: measured
    # from the rungs' seeds (`seed_noise`, pooled spread of a rung's seeds at the final eval) when
    # they give >= `min_noise_dof` degrees of freedom, else NOISE_DEFAULT. A rung averaging k
    # seeds is moved by noise / sqrt(k) in the bootstrap; the band always includes +-z*noise for
    # the target's own (single-run) noise.
    noise: float | None = None
    min_noise_dof: int = 3
    noise_draws: int = 32  # bootstrap refits with rung-level noise draws (resamples are repeated to reach it)
    # One E for every schedule fraction (else each fraction fits its own E, A, alpha). Independent
    # fits can land a held-out final loss closer, but their mid-curve forecasts swing by several
    # percent (3 free parameters through 3 rungs at every fraction), which would make a clean target
    # "deviate"; the shared E keeps the curve coherent.
    shared_e: bool = True
    fractions: tuple[float, ...] = FRACTIONS
    # A range [lo, hi] E is believed to lie in (a prior, e.g. another lab's fit): the ladder is fit with
    # E held at `e_grid` values across it (and at `fix_e`, the forecast's E, if given; else the middle)
    # and the band is the envelope of those fits' bands, so it carries E's own uncertainty.
    e_range: tuple[float, float] | None = None
    e_grid: int = 5

    def __post_init__(self):
        if not (self.delta > 0):
            raise ValueError(f"FitConfig.delta must be > 0, got {self.delta}")
        if self.fix_e is not None and not (self.fix_e >= 0 and math.isfinite(self.fix_e)):
            raise ValueError(f"FitConfig.fix_e must be a finite loss >= 0, got {self.fix_e}")
        if self.n_boot < 0:
            raise ValueError(f"FitConfig.n_boot must be >= 0, got {self.n_boot}")
        if not (0 < self.level < 1):
            raise ValueError(f"FitConfig.level must be in (0, 1), e.g. 0.9, got {self.level}")
        if self.n_starts < 1:
            raise ValueError(f"FitConfig.n_starts must be >= 1, got {self.n_starts}")
        if self.noise is not None and not (0 <= self.noise < 0.5):
            raise ValueError(
                f"FitConfig.noise must be a relative 1-sigma noise in [0, 0.5), got {self.noise}"
            )
        if self.noise_draws < 1:
            raise ValueError(f"FitConfig.noise_draws must be >= 1, got {self.noise_draws}")
        if self.loo not in ("forward", "max", "rms", "none"):
            raise ValueError(f"FitConfig.loo must be 'forward', 'max', 'rms' or 'none', got {self.loo!r}")
        if not self.fractions or any(not (0 < f <= 1) for f in self.fractions):
            raise ValueError(f"FitConfig.fractions must be in (0, 1], got {self.fractions}")
        if self.e_range is not None:
            lo, hi = self.e_range
            if not (0 <= lo < hi and math.isfinite(hi)):
                raise ValueError(f"--e-range LO HI must be 0 <= LO < HI, got {lo} {hi}")
            if self.fix_e is not None and not (lo <= self.fix_e <= hi):
                raise ValueError(f"--fix-e {self.fix_e} must lie inside --e-range {lo} {hi}")
            if self.e_grid < 2:
                raise ValueError(f"FitConfig.e_grid must be >= 2, got {self.e_grid}")

    @property
    def n_free(self) -> int:
        return 3 if self.fix_e is None and self.e_range is None else 2


# ------------------------------------------------------------- ladder fitting


@dataclass
class LadderFit:
    """Laws at every schedule fraction, the bootstrap's parameter draws and the LOO errors."""

    name: str
    rungs: list[Rung]
    config: FitConfig
    laws: dict[float, PowerLaw]  # fraction -> fit on all rungs
    boot: dict[float, np.ndarray]  # fraction -> (B, 3) bootstrap (E, log A, alpha), c_ref as laws[f]
    boot_w: dict[float, np.ndarray]  # fraction -> (B,) probability of each bootstrap resample
    loo_err: dict[float, dict[str, float]]  # fraction -> rung -> log(pred / obs) with that rung left out
    # fraction -> rung -> log(pred / obs) predicted from the smaller rungs only (rungs with >= 2 below them)
    fwd_err: dict[float, dict[str, float]] = field(default_factory=dict)
    noise: float = NOISE_DEFAULT  # run-to-run noise of one run (relative, 1 sigma) the band uses
    noise_source: str = "default"  # "given", "seeds (dof N)" or "default"
    # How the band's held-out term was measured: "measured" (a rung predicted from fewer rungs than it,
    # with every free parameter fit without it), "proxy" (as many free parameters as rungs: nothing
    # left to measure, so the largest rung predicted from the smaller ones by the law with E = 0, one
    # parameter fewer, stands in, wider as a rule) or "none" (no band: nothing to measure it with).
    held_out: str = "measured"
    warnings: list[str] = field(default_factory=list)
    e_fits: list[LadderFit] = field(
        default_factory=list
    )  # fits at E across `config.e_range` (the band's envelope)
    noise_fits: dict[float, np.ndarray] = field(
        default_factory=dict
    )  # fraction -> (D, 3) refits of noise draws

    @property
    def has_band(self) -> bool:
        return self.held_out != "none" or bool(self.e_fits)

    @property
    def final(self) -> PowerLaw:
        return self.laws[max(self.laws)]

    def loo_halfwidth(self, fraction: float) -> float:
        """Log half-width the held-out rung errors add to the band at `fraction`: with
        `loo="forward"` the largest rung's error predicted from the smaller rungs (the ladder's
        own most recent extrapolation, from the most rungs), else the largest or rms
        leave-one-rung-out error."""
        if self.config.loo == "forward" or (self.held_out == "proxy" and self.config.loo != "none"):
            top = max(self.rungs, key=lambda r: r.flops).rung
            e = self.fwd_err.get(fraction, {}).get(top)
            return 0.0 if e is None or not math.isfinite(e) else abs(e)
        errs = np.abs(np.array(list(self.loo_err.get(fraction, {}).values()), dtype=float))
        errs = errs[np.isfinite(errs)]
        if self.config.loo == "none" or errs.size == 0:
            return 0.0
        return float(np.sqrt((errs**2).mean()) if self.config.loo == "rms" else errs.max())

    def extrapolation_scale(self, flops) -> np.ndarray:
        """How much farther `flops` extrapolates than the held-out error was measured (>= 1).

        Extrapolation error grows with distance. `loo="forward"`: the largest rung was
        predicted at log-distance log C_max - mean(log C of the smaller rungs) from the centre of
        the rungs it was fit to; a target at log C - mean(log C of all rungs) gets the error
        scaled in proportion. Otherwise: in units of the last step
        log(C_max / C_prev) beyond the largest rung.
        """
        cs = sorted({r.flops for r in self.rungs})
        c = np.atleast_1d(np.asarray(flops, dtype=float))
        if len(cs) < 2:
            return np.ones_like(c)
        lc = np.log(cs)
        if self.config.loo == "forward" or self.held_out == "proxy":
            return np.maximum(1.0, (np.log(c) - lc.mean()) / (lc[-1] - lc[:-1].mean()))
        return np.maximum(1.0, np.log(c / cs[-1]) / (lc[-1] - lc[-2]))

    def predict(self, fraction: float, flops, seeds: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(value, low, high), each (m,), at compute `flops` (array-like) for one schedule fraction.

        `seeds`: how many seed runs the observed curve being forecast averages (its own noise
        shrinks by sqrt(seeds)); a target is one run.
        """
        law = self.laws[fraction]
        c = np.atleast_1d(np.asarray(flops, dtype=float))
        value = law(c)  # (m,)
        q = (1 - self.config.level) / 2
        lo_b = hi_b = np.zeros_like(value)
        x = np.log(c / law.c_ref)
        # the rung bootstrap, and the noise refits (every rung moved by the run-to-run noise): the wider of the two
        for draws, w in (
            (self.boot.get(fraction), self.boot_w.get(fraction)),
            (self.noise_fits.get(fraction), None),
        ):
            if draws is None or len(draws) < 2:
                continue
            preds = draws[:, 0:1] + np.exp(draws[:, 1:2] - draws[:, 2:3] * x[None, :])  # (B, m)
            qs = [np.quantile(preds, qq, axis=0, weights=w, method="inverted_cdf") for qq in (q, 1 - q)]
            lo_b = np.maximum(lo_b, -np.minimum(np.log(qs[0] / value), 0.0))
            hi_b = np.maximum(hi_b, np.maximum(np.log(qs[1] / value), 0.0))
        h = self.loo_halfwidth(fraction) * self.extrapolation_scale(c)  # (m,)
        z = (
            float(norm.ppf(0.5 + self.config.level / 2)) * self.noise / math.sqrt(seeds)
        )  # the target's own noise
        low = value * np.exp(-np.sqrt(lo_b**2 + h**2 + z**2))
        high = value * np.exp(np.sqrt(hi_b**2 + h**2 + z**2))
        if self.held_out == "none":
            low, high = np.full_like(value, np.nan), np.full_like(value, np.nan)
        for (
            other
        ) in self.e_fits:  # E across its range: the envelope of their forecasts and bands (fmin: NaN-free)
            v_e, lo_e, hi_e = other.predict(fraction, c, seeds)
            low, high = np.fmin(low, np.fmin(v_e, lo_e)), np.fmax(high, np.fmax(v_e, hi_e))
        return value, low, high

    def forecast(self, flops: float, steps: int | None = None, seeds: int = 1) -> Forecast:
        """The forecast curve for a run of compute `flops` and `steps` optimizer steps (`seeds` runs averaged)."""
        pts = []
        for f in sorted(self.laws):
            v, lo, hi = self.predict(f, flops, seeds)
            step = None if steps is None else int(round(f * steps))
            pts.append(ForecastPoint(f, step, float(v[0]), float(lo[0]), float(hi[0])))
        return Forecast(flops=float(flops), steps=steps, points=pts)

    def summary(self) -> dict:
        """JSON-ready: the final-loss law, the per-fraction laws, LOO errors, rung list."""
        return {
            "ladder": self.name,
            "method": METHOD,
            "fit_version": fit_version(self.rungs),
            "config": {k: v for k, v in asdict(self.config).items() if k != "fractions"},
            "rungs": [
                {
                    "run": r.run,
                    "rung": r.rung,
                    "flops": r.flops,
                    "params_active": r.params_active,
                    "params_total": r.params_total,
                    "tokens": r.tokens,
                    "final_loss": r.final_loss,
                    "seeds": r.n_seeds,
                    "runs": list(r.runs or (r.run,)),
                }
                for r in self.rungs
            ],
            "noise": {"value": self.noise, "source": self.noise_source},
            "band": {
                "held_out": self.held_out,
                "has_band": self.has_band,
                "warnings": self.warnings,
                "e_range": None if self.config.e_range is None else list(self.config.e_range),
                "e_values": [f.final.E for f in self.e_fits],
            },
            "final": self.final.as_dict(),
            "fractions": {
                f"{f:.2f}": {**law.as_dict(), "loo_halfwidth": self.loo_halfwidth(f)}
                for f, law in sorted(self.laws.items())
            },
            "loo_final": self.loo_err.get(max(self.laws), {}),
            "forward_final": self.fwd_err.get(max(self.laws), {}),
            "bootstrap_resamples": int(len(self.boot.get(max(self.laws), ()))),
        }


def _matrix(rungs, fractions):
    """x (n,) log compute over c_ref, Y (F, n) loss with NaN where a rung has no eval, c_ref."""
    c = np.array([r.flops for r in rungs], dtype=float)
    c_ref = float(np.exp(np.log(c).mean()))
    Y = np.array([[r.curve.get(f, np.nan) for r in rungs] for f in fractions], dtype=float)
    Y[~(Y > 0)] = np.nan  # non-finite or non-positive losses cannot be fit in log space
    return np.log(c / c_ref), Y, c_ref


def _noise(rungs: Sequence[Rung], cfg: FitConfig) -> tuple[float, str]:
    """The run-to-run noise the band uses: the config's, else measured from seeds, else the default."""
    if cfg.noise is not None:
        return cfg.noise, "given"
    sd, dof = seed_noise(rungs)
    if dof >= cfg.min_noise_dof and math.isfinite(sd):
        return sd, f"seeds (dof {dof})"
    return NOISE_DEFAULT, "default"


def fit_ladder(
    rungs: Sequence[Rung],
    config: FitConfig | None = None,
    name: str = "ladder",
    progress: Callable[[dict], None] | None = None,
) -> LadderFit:
    """Fit every schedule fraction, bootstrap over whole rungs, leave-one-rung-out and forward errors.

    `rungs` may hold several seeds of a rung (same `rung` label): they are averaged at
    every fraction (`average_seeds`) and are one unit everywhere after that. A fraction
    is fit when at least two rungs have an eval there. Each fraction has its own
    (E, A, alpha) unless `config.shared_e`. Resamples and leave-one-out subsets with
    fewer than three distinct rungs cannot determine E: they keep the full fit's.
    `progress` is called before each bootstrap resample and each held-out rung, and at
    the end, with `{"done", "total", "unit": "rounds"}`.
    """
    cfg = config or FitConfig()
    if cfg.e_range is not None:
        return _fit_e_range(rungs, cfg, name, progress)
    noise, noise_source = _noise(rungs, cfg)
    rungs = average_seeds(rungs)
    n_distinct = len({r.flops for r in rungs})
    if n_distinct < cfg.n_free:
        raise ValueError(
            f"ladder {name!r} has {n_distinct} rungs with distinct compute; fitting needs >= {cfg.n_free}"
            + ("" if cfg.fix_e is not None else " (or fix E with --fix-e to fit two)")
        )
    fractions = [f for f in cfg.fractions if sum(1 for r in rungs if f in r.curve) >= 2]
    no_final = [r for r in rungs if 1.0 not in r.curve]
    if 1.0 not in fractions:
        raise ValueError(
            f"ladder {name!r}: fewer than 2 rungs have a final (100%) eval: "
            + "; ".join(
                f"rung {r.rung} (run {r.run}): {r.problem or 'no eval at its last step'}" for r in no_final
            )
        )
    warnings = [
        f"rung {r.rung} (run {r.run}) has no final (100%) eval, so the final-loss fit leaves it out: "
        f"{r.problem or 'no eval at its last step'}"
        for r in no_final
    ]
    x, Y, c_ref = _matrix(rungs, fractions)
    if cfg.fix_e is not None and cfg.fix_e >= np.nanmin(Y):
        raise ValueError(f"--fix-e {cfg.fix_e} must be below the smallest observed loss {np.nanmin(Y):.4f}")
    n, F = len(rungs), len(fractions)
    ones = np.ones_like(Y)

    def solve(w, y, e_fix, starts, n_starts):
        """(F, 3) per-fraction (E, log A, alpha) and (F,) fitted mask for rung weights w (n,), losses y (F, n)."""
        out, ok = np.zeros((F, 3)), np.zeros(F, bool)
        if cfg.shared_e:
            th, _, fitted = fit_curves(
                x,
                y,
                ones * w[None, :],
                cfg.delta,
                e_fix[0],
                n_starts,
                [] if starts is None else [_pack(starts)],
            )
            for j in range(F):
                out[j] = (th[0], th[1 + 2 * j], th[2 + 2 * j])
            return out, fitted
        for j in range(F):
            th, _, fitted = fit_curves(
                x,
                y[j : j + 1],
                w[None, :],
                cfg.delta,
                e_fix[j],
                n_starts,
                [] if starts is None else [starts[j]],
            )
            out[j], ok[j] = th, fitted[0]
        return out, ok

    with one_blas_thread():
        full, _ = solve(np.ones(n), Y, [cfg.fix_e] * F, None, cfg.n_starts)

        def sub(w, y=Y):  # a refit started from the full fit; E kept when < 3 distinct rungs
            distinct = len({rungs[i].flops for i in range(n) if w[i] > 0})
            e_fix = [
                cfg.fix_e if cfg.fix_e is not None else (None if distinct >= 3 else full[j, 0])
                for j in range(F)
            ]
            return solve(w, y, e_fix, full, 0)

        # bootstrap over whole rungs: a resample (rung counts) is shared by every fraction, and each
        # resampled rung's whole curve is moved by one draw of the run-to-run noise
        counts, prob = _resamples([r.flops for r in rungs], 2, cfg.n_boot, cfg.seed)
        reps = max(1, math.ceil(cfg.noise_draws / max(len(counts), 1))) if noise > 0 else 1
        rng = np.random.default_rng(cfg.seed)
        sigma = noise / np.sqrt([r.n_seeds for r in rungs])  # (n,) a rung's mean of k seeds: noise / sqrt(k)
        boot: dict[float, list] = {f: [] for f in fractions}
        boot_w: dict[float, list] = {f: [] for f in fractions}
        rounds = len(counts) + (n if n >= 3 else 0)
        for k, (w, pr) in enumerate(zip(counts, prob, strict=True)):
            if progress is not None:
                progress({"done": k, "total": rounds, "unit": "rounds"})
            for _ in range(reps):
                eps = rng.normal(0.0, 1.0, n) * sigma if noise > 0 else np.zeros(n)
                th, ok = sub(w, Y * np.exp(eps)[None, :])
                for j, f in enumerate(fractions):
                    if ok[j]:
                        boot[f].append(th[j])
                        boot_w[f].append(pr / reps)

        # the noise refits: every rung present, each moved by one draw of its noise (a parametric bootstrap:
        # with three or four rungs most resamples above repeat a rung and borrow E, so they alone
        # understate how far the rungs' noise throws an extrapolation)
        noise_fits: dict[float, list] = {f: [] for f in fractions}
        for _ in range(cfg.noise_draws if noise > 0 and cfg.n_boot > 0 else 0):
            th, ok = sub(np.ones(n), Y * np.exp(rng.normal(0.0, 1.0, n) * sigma)[None, :])
            for j, f in enumerate(fractions):
                if ok[j]:
                    noise_fits[f].append(th[j])

        def held_out(i, w, into):  # fit the rungs weighted w, record log(pred / obs) for rung i
            th, ok = sub(w)
            for j, f in enumerate(fractions):
                if ok[j] and np.isfinite(Y[j, i]):
                    into[f][rungs[i].rung] = float(
                        math.log((th[j, 0] + math.exp(th[j, 1] - th[j, 2] * x[i])) / Y[j, i])
                    )

        # leave-one-rung-out: predict each rung's curve from all the others; forward: from the
        # smaller rungs only (an extrapolation one rung out, as a target's forecast is)
        loo: dict[float, dict[str, float]] = {f: {} for f in fractions}
        fwd: dict[float, dict[str, float]] = {f: {} for f in fractions}
        if n >= 3:
            for i, held in enumerate(rungs):
                if progress is not None:
                    progress({"done": len(counts) + i, "total": rounds, "unit": "rounds"})
                w = np.ones(n)
                w[i] = 0
                held_out(i, w, loo)
                smaller = np.array([1.0 if r.flops < held.flops else 0.0 for r in rungs])
                if len({r.flops for r in rungs if r.flops < held.flops}) < 2:
                    continue
                if np.array_equal(smaller, w):  # the largest rung: its leave-one-out fit is the forward one
                    for f in fractions:
                        if held.rung in loo[f]:
                            fwd[f][held.rung] = loo[f][held.rung]
                else:
                    held_out(i, smaller, fwd)

        # As many free parameters as rungs: a rung held out leaves fewer rungs than parameters, and the
        # held-out fits above borrowed E from the full fit, which saw that rung (their errors read ~0).
        held = "measured" if n_distinct > cfg.n_free else ("proxy" if cfg.fix_e is None else "none")
        if (
            held == "proxy"
        ):  # the largest rung from the smaller ones by the law with E = 0 (one parameter fewer)
            top = max(range(n), key=lambda i: rungs[i].flops)
            smaller = np.array([1.0 if r.flops < rungs[top].flops else 0.0 for r in rungs])
            loo = {f: {} for f in fractions}
            fwd = {f: {} for f in fractions}
            th, ok = solve(smaller, Y, [0.0] * F, None, cfg.n_starts)
            for j, f in enumerate(fractions):
                if ok[j] and np.isfinite(Y[j, top]):
                    fwd[f][rungs[top].rung] = float(th[j, 1] - th[j, 2] * x[top] - math.log(Y[j, top]))
    params = "E, A, α" if cfg.fix_e is None else "A, α; E fixed"
    if held == "proxy":
        warnings.append(
            f"{n_distinct} rungs and {cfg.n_free} free parameters ({params}): no rung is left over to "
            "measure the forecast's error with; the band is widened by the error of the law with "
            "E = 0 on the largest rung instead. Add a rung, or give E's range (--e-range LO HI)."
        )
    elif held == "none":
        warnings.append(
            f"{n_distinct} rungs and {cfg.n_free} free parameters ({params}): nothing is left over to "
            "measure the forecast's error with, so there is no band. Add a rung"
            + (", or give E's range (--e-range LO HI)." if cfg.e_range is None else ".")
        )
    if progress is not None:
        progress({"done": rounds, "total": rounds, "unit": "rounds"})
    laws = {
        f: PowerLaw(float(full[j, 0]), float(full[j, 1]), float(full[j, 2]), c_ref)
        for j, f in enumerate(fractions)
    }
    return LadderFit(
        name=name,
        rungs=list(rungs),
        config=cfg,
        laws=laws,
        boot={f: np.array(v, dtype=float).reshape(-1, 3) for f, v in boot.items()},
        boot_w={f: np.array(v, dtype=float) for f, v in boot_w.items()},
        loo_err=loo,
        fwd_err=fwd,
        noise=noise,
        noise_source=noise_source,
        held_out=held,
        warnings=warnings,
        noise_fits={f: np.array(v, dtype=float).reshape(-1, 3) for f, v in noise_fits.items()},
    )


def _fit_e_range(rungs: Sequence[Rung], cfg: FitConfig, name: str, progress) -> LadderFit:
    """The ladder fit with E held at `cfg.e_grid` values across `cfg.e_range` (and at `cfg.fix_e`): the
    forecast is the fit at `fix_e` (else the range's middle), its band the envelope of all their bands."""
    lo, hi = cfg.e_range
    ymin = min((v for r in rungs for v in r.curve.values() if v > 0), default=math.inf)
    if hi >= ymin:
        raise ValueError(f"--e-range {lo} {hi}: E must stay below the smallest observed loss {ymin:.4f}")
    centre = cfg.fix_e if cfg.fix_e is not None else (lo + hi) / 2
    grid = sorted(
        [float(centre)]
        + [
            e
            for e in np.linspace(lo, hi, cfg.e_grid).tolist()
            if not math.isclose(e, centre, rel_tol=1e-9, abs_tol=1e-12)
        ]
    )
    fits = []
    for k, e in enumerate(grid):
        if progress is not None:
            progress({"done": k, "total": len(grid), "unit": "E values"})
        fits.append(fit_ladder(rungs, replace(cfg, fix_e=e, e_range=None), name=name))
    if progress is not None:
        progress({"done": len(grid), "total": len(grid), "unit": "E values"})
    main = fits[grid.index(float(centre))]
    main.config = replace(cfg, fix_e=float(centre))
    main.e_fits = [f for f in fits if f is not main]
    main.warnings = [w for w in main.warnings if "free parameters" not in w]
    if main.held_out == "none":
        main.warnings.append(
            f"{len({r.flops for r in rungs})} rungs and 2 free parameters (A, α; E in its range): "
            "nothing is left over to measure the fit's error with, so the band spans E's range only."
        )
    return main


def _pack(per_fraction: np.ndarray) -> np.ndarray:
    """(F, 3) per-fraction parameters as the shared-E vector [E, log A_0, alpha_0, ...] (E of the first)."""
    return np.concatenate([[per_fraction[0, 0]], per_fraction[:, 1:].ravel()])


def _resamples(flops: Sequence[float], min_distinct: int, n_boot: int, seed: int):
    """Bootstrap resamples of whole rungs as (m, n) counts with their probabilities (m,).

    With few rungs the distinct resamples (multisets of size n) are few, C(2n-1, n):
    35 for 4 rungs, so when they number at most `n_boot` they are enumerated with
    their exact multinomial probabilities (no Monte Carlo noise); otherwise `n_boot`
    are drawn at random. Resamples with fewer than `min_distinct` distinct rungs say
    nothing about a slope and are dropped (the rest renormalised).
    """
    n = len(flops)
    distinct = lambda w: len({flops[i] for i in range(n) if w[i] > 0})  # noqa: E731
    if math.comb(2 * n - 1, n) <= max(n_boot, 1):
        rows, probs = [], []
        for combo in itertools.combinations_with_replacement(range(n), n):
            w = np.bincount(combo, minlength=n)
            if distinct(w) >= min_distinct:
                rows.append(w)
                probs.append(math.factorial(n) / math.prod(math.factorial(int(k)) for k in w) / n**n)
        counts, prob = np.array(rows, dtype=float).reshape(-1, n), np.array(probs)
    else:
        rng = np.random.default_rng(seed)
        counts = np.array([np.bincount(rng.integers(0, n, n), minlength=n) for _ in range(n_boot)], float)
        counts = counts[[distinct(w) >= min_distinct for w in counts]].reshape(-1, n)
        prob = np.ones(len(counts))
    return counts, (prob / prob.sum() if prob.size else prob)
