"""Scaling-ladder fits: predict a big run's loss curve from a ladder of small runs.

The law is `L(C) = E + A * C^(-alpha)`, C the training compute in FLOPs
(`6 * N_active * D`, see trainer/ladder.py for what else is counted). It is fit

- to each rung's final eval loss, and
- at every schedule fraction f (5%, 10%, ..., 100%) to the rungs' eval loss at
  that fraction, so a target's whole curve is forecast, not only its end. By
  default E is shared by all fractions (see `FitConfig.shared_e`).

Fitting (`fit_power_law`): Huber loss (delta = 1e-3) on log residuals
`log L_pred - log L_obs`, minimised with scipy's L-BFGS-B from the best points of
a grid of starts; E may be fixed. C is divided by a reference compute (the
geometric mean of the rungs' C) so that log A stays near O(1).

Seeds: a rung may be trained with several seeds (runs with the same `rung` label,
`ladder.seed` in run_start). `average_seeds` averages them at every fraction and the
rung stays one unit everywhere below; the seeds' spread (`seed_noise`) is the
run-to-run noise the band uses (else `NOISE_DEFAULT`).

Uncertainty (`fit_ladder`): a bootstrap over whole rungs (a rung's whole curve, all
its seeds, is one unit: its points are not independent), refit at every fraction with the
same resampled rungs so the band is coherent along the curve, each resampled rung's
curve also moved by one draw of the run-to-run noise (so three or four rungs, which
a 3-parameter law can nearly interpolate, still show how far such noise throws the
extrapolation); the band's
quantiles (default 5%..95%, a 90% band) are then widened, in log space and in
quadrature, by the forward prediction error at that fraction (the largest rung
predicted from the smaller rungs alone: an extrapolation, as the target's forecast
is, from the most rungs), scaled up by how much farther from the rungs' centre the
target lies than that held-out rung did from its fit's, because four rungs cannot
show in a bootstrap how wrong an extrapolation can be; and by
the target's own run-to-run noise (`FitConfig.noise`), which no fit to other runs
can predict. Leave-one-rung-out errors (each rung from all the others) are
reported too (`FitConfig.loo="max"` bands with them, as FIT_VERSION 3 did); for
the smallest rung that is a backward extrapolation, which says little about a
forecast forward and made the band +-67% on the sample ladder.

Backtest (`backtest`): leave the largest rung out, fit the others, forecast its
curve; report the final-loss error in % and the share of its curve points
inside the band.

Pre-registration and watching (`observatory.ladder.watch`: `write_forecast`,
`check_target`, also importable from here): the forecast
is written as a `forecast` event by host 1000 into the target's run folder before
the target's `run_start`; while the target runs, each eval is compared with the
band and K consecutive evals outside it write an `anomaly` (detector
`ladder_deviation`). Both are events, so what the observatory said and when is
part of the record.

This module holds no SQL; the store is read through `observatory.queries.ladder`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber
from scipy.stats import norm

__all__ = [
    "FRACTIONS",
    "NOISE_DEFAULT",
    "average_seeds",
    "seed_noise",
    "METHOD",
    "FIT_VERSION",
    "DETECTOR",
    "FitConfig",
    "Rung",
    "PowerLaw",
    "LadderFit",
    "ForecastPoint",
    "Forecast",
    "Backtest",
    "fit_power_law",
    "fit_ladder",
    "backtest",
    "compare",
    "fit_version",
]

FRACTIONS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))  # 5% .. 100%
METHOD = "powerlaw-huber-log(delta=1e-3)/L-BFGS-B; band: rung bootstrap + forward held-out-rung error"
# 1: no rung-noise draws in the bootstrap; 2: with them; 3: a rung's seeds averaged, noise measured
# from seeds; 4: the band widened by forward errors (a rung from the smaller rungs), not leave-one-out
FIT_VERSION = "4"
NOISE_DEFAULT = 0.003  # run-to-run noise assumed when the rungs have no seeds to measure it from
DETECTOR = "ladder_deviation"
EVAL_METRIC = "eval/loss"


# ------------------------------------------------------------------ data types


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
    # backward extrapolation), or "none". FIT_VERSION 3 used "max": on the sample ladder its
    # largest error was predicting the smallest rung backwards (32%), a band of +-67%.
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
    # One E for every schedule fraction (else each fraction fits its own E, A, alpha). On the sample
    # ladder the independent fits land the held-out final loss closer (+0.8% vs +2.4%) but their
    # mid-curve forecasts swing by 5-7% (3 free parameters through 3 rungs at every fraction), which
    # would make a clean target "deviate"; the shared E keeps the curve coherent.
    shared_e: bool = True
    fractions: tuple[float, ...] = FRACTIONS

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
            raise ValueError(f"FitConfig.noise must be a relative 1-sigma noise in [0, 0.5), got {self.noise}")
        if self.noise_draws < 1:
            raise ValueError(f"FitConfig.noise_draws must be >= 1, got {self.noise_draws}")
        if self.loo not in ("forward", "max", "rms", "none"):
            raise ValueError(f"FitConfig.loo must be 'forward', 'max', 'rms' or 'none', got {self.loo!r}")
        if not self.fractions or any(not (0 < f <= 1) for f in self.fractions):
            raise ValueError(f"FitConfig.fractions must be in (0, 1], got {self.fractions}")

    @property
    def n_free(self) -> int:
        return 3 if self.fix_e is None else 2


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
class PowerLaw:
    """L(C) = E + A * (C / c_ref)^(-alpha); `a_abs` is A for C in FLOPs."""

    E: float
    log_a: float  # log A, A relative to c_ref
    alpha: float
    c_ref: float
    objective: float = 0.0

    def __call__(self, flops):
        x = np.log(np.asarray(flops, dtype=float) / self.c_ref)
        return self.E + np.exp(self.log_a - self.alpha * x)

    @property
    def a_abs(self) -> float:
        return float(np.exp(self.log_a + self.alpha * np.log(self.c_ref)))

    def as_dict(self) -> dict:
        return {"E": self.E, "A": self.a_abs, "alpha": self.alpha, "objective": self.objective}


# -------------------------------------------------------------------- the fit
#
# One objective serves both the single-curve fit and the ladder fit: F curves (schedule
# fractions) share E, each has its own (log A_j, alpha_j). theta = [E, log A_0, alpha_0,
# log A_1, alpha_1, ...]. E can be shared because it is the loss an infinitely large model
# reaches at *any* fixed fraction of a fixed tokens-per-parameter schedule: as C grows
# both N and the tokens seen by fraction f grow without bound. Sharing it lets a
# three-rung ladder (the backtest) still determine E from the curvature of all 20
# fractions instead of interpolating three points exactly. `FitConfig(shared_e=False)`
# fits each fraction on its own (F = 1 per call).


def _objective(theta, pts, delta):
    """Weighted Huber on log residuals, scaled by 1/delta^2 so L-BFGS-B's tolerances bite; with gradient.

    pts[j] lists (x_i, log L_ij, w_i) for curve j, x = log(C / c_ref), w = bootstrap count.
    Plain Python on purpose: a ladder is a few dozen points and numpy's per-call
    overhead made this 4x slower than the loop.
    """
    e = theta[0]
    f = g_e = 0.0
    grad = [0.0] * len(theta)
    for j, curve in enumerate(pts):
        log_a, alpha = theta[1 + 2 * j], theta[2 + 2 * j]
        g_a = g_alpha = 0.0
        for xi, li, wi in curve:
            p = math.exp(log_a - alpha * xi)  # the power-law term
            pred = e + p
            r = math.log(pred) - li  # log residual
            if abs(r) <= delta:
                f += wi * 0.5 * r * r
                d = r
            else:
                f += wi * delta * (abs(r) - 0.5 * delta)
                d = delta if r > 0 else -delta
            d *= wi / pred  # d huber / d pred
            g_e += d
            g_a += d * p
            g_alpha -= d * xi * p
        grad[1 + 2 * j], grad[2 + 2 * j] = g_a, g_alpha
    grad[0] = g_e
    s = 1.0 / (delta * delta)
    return f * s, np.array(grad) * s


_ALPHAS = np.array([0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.45, 0.6, 0.8, 1.2])
_E_FRACS = np.array([0.0, 0.2, 0.4, 0.6, 0.75, 0.85, 0.92, 0.97])


def _grid_starts(x, Y, W, delta, fix_e, k):
    """The k best (E, [log A_j, alpha_j]...) starts of a grid over E (shared) and alpha (per curve).

    x (n,), Y (F, n) losses with NaN where missing, W (F, n) weights. For each E and
    alpha, log A is the least-squares value of log(L - E) + alpha x; each curve keeps
    its best alpha, and E candidates are ranked by the total Huber objective.
    """
    ymin = np.nanmin(Y)
    es = np.array([fix_e]) if fix_e is not None else _E_FRACS * ymin
    starts = []
    for e in es:
        theta, total = [e], 0.0
        for yj, wj in zip(Y, W, strict=True):
            m = np.isfinite(yj) & (wj > 0)
            lx, ly, lw = x[m], yj[m], wj[m]
            if not m.any():
                theta += [0.0, 0.3]
                continue
            # (len(_ALPHAS),) candidate log A per alpha, weighted least squares
            la = ((np.log(ly - e)[None, :] + _ALPHAS[:, None] * lx[None, :]) * lw).sum(1) / lw.sum()
            pred = e + np.exp(la[:, None] - _ALPHAS[:, None] * lx[None, :])
            obj = (lw * huber(delta, np.log(pred) - np.log(ly)[None, :])).sum(1)
            b = int(np.argmin(obj))
            theta += [la[b], _ALPHAS[b]]
            total += obj[b]
        starts.append((total, np.array(theta)))
    starts.sort(key=lambda t: t[0])
    return [t for _, t in starts[:k]]


def _fit_curves(x, Y, W, delta, fix_e, n_starts, extra_starts=()):
    """Minimise the shared-E objective. Returns (theta, objective, fitted (F,) bool).

    A curve with fewer than two distinct points carrying weight is not fitted (its
    parameters stay at the start and `fitted` says so).
    """
    F = Y.shape[0]
    fitted = np.array([len(set(x[np.isfinite(Y[j]) & (W[j] > 0)].tolist())) >= 2 for j in range(F)])
    pts = [
        [(float(x[i]), float(np.log(Y[j, i])), float(W[j, i])) for i in range(len(x))
         if np.isfinite(Y[j, i]) and W[j, i] > 0] if fitted[j] else []
        for j in range(F)
    ]
    ymin = float(np.nanmin(np.where(W > 0, Y, np.nan)))
    e_hi = ymin * (1 - 1e-6)
    bounds = [(fix_e, fix_e) if fix_e is not None else (0.0, e_hi)] + [(-40.0, 40.0), (1e-4, 3.0)] * F
    starts = _grid_starts(x, Y, W, delta, fix_e, n_starts) if n_starts else []
    for s in extra_starts:
        s = np.array(s, dtype=float)
        s[0] = fix_e if fix_e is not None else min(max(s[0], 0.0), e_hi * (1 - 1e-6))
        starts.append(s)
    if not starts:
        starts = _grid_starts(x, Y, W, delta, fix_e, 1)
    best = None
    for s in starts:
        res = minimize(
            _objective, s, args=(pts, delta), jac=True, method="L-BFGS-B", bounds=bounds,
            options={"maxiter": 2000, "maxfun": 5000, "ftol": 1e-12, "gtol": 1e-9},
        )
        if best is None or res.fun < best.fun:
            best = res
    return best.x, float(best.fun) * delta**2, fitted


def fit_power_law(
    flops: Sequence[float],
    loss: Sequence[float],
    *,
    delta: float = 1e-3,
    fix_e: float | None = None,
    n_starts: int = 3,
    weights: Sequence[float] | None = None,
) -> PowerLaw:
    """Fit L(C) = E + A C^-alpha to points (C, L) by Huber on log residuals.

    L-BFGS-B runs from the `n_starts` best points of a grid over (E, alpha); `fix_e`
    holds E fixed; `weights` (e.g. bootstrap counts) weight the points.
    """
    c = np.asarray(flops, dtype=float)
    y = np.asarray(loss, dtype=float)
    w = np.ones_like(c) if weights is None else np.asarray(weights, dtype=float)
    if c.shape != y.shape or c.ndim != 1 or w.shape != c.shape:
        raise ValueError(f"flops, loss and weights must be 1-D and the same length, got {c.shape}, {y.shape}")
    ok = np.isfinite(c) & np.isfinite(y) & (c > 0) & (y > 0) & (w > 0)
    c, y, w = c[ok], y[ok], w[ok]
    need = 3 if fix_e is None else 2
    if len(np.unique(c)) < need:
        raise ValueError(
            f"a power law with {'free' if fix_e is None else 'fixed'} E needs >= {need} distinct compute "
            f"values, got {len(np.unique(c))}"
        )
    if fix_e is not None and fix_e >= y.min():
        raise ValueError(f"fix_e={fix_e} must be below the smallest observed loss {y.min():.4f}")
    c_ref = float(np.exp(np.log(c).mean()))
    with _one_blas_thread():
        theta, obj, _ = _fit_curves(np.log(c / c_ref), y[None, :], w[None, :], delta, fix_e, n_starts)
    return PowerLaw(E=float(theta[0]), log_a=float(theta[1]), alpha=float(theta[2]), c_ref=c_ref, objective=obj)


_CONTROLLER = None


def _one_blas_thread():
    """Limit BLAS to one thread while fitting: each L-BFGS-B step is tiny, and OpenBLAS's thread
    pool made it 7x slower on a busy 2-core machine."""
    global _CONTROLLER
    if _CONTROLLER is None:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
    return _CONTROLLER.limit(limits=1, user_api="blas")


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
    noise_source: str = "default"  # "config", "seeds (dof N)" or "default"

    @property
    def final(self) -> PowerLaw:
        return self.laws[max(self.laws)]

    def loo_halfwidth(self, fraction: float) -> float:
        """Log half-width the held-out rung errors add to the band at `fraction`: with
        `loo="forward"` the largest rung's error predicted from the smaller rungs (the ladder's
        own most recent extrapolation, from the most rungs), else the largest or rms
        leave-one-rung-out error."""
        if self.config.loo == "forward":
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
        scaled in proportion. Otherwise (FIT_VERSION 3): in units of the last step
        log(C_max / C_prev) beyond the largest rung.
        """
        cs = sorted({r.flops for r in self.rungs})
        c = np.atleast_1d(np.asarray(flops, dtype=float))
        if len(cs) < 2:
            return np.ones_like(c)
        lc = np.log(cs)
        if self.config.loo == "forward":
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
        draws = self.boot.get(fraction)
        lo_b = hi_b = np.zeros_like(value)
        if draws is not None and len(draws) >= 2:
            x = np.log(c / law.c_ref)
            preds = draws[:, 0:1] + np.exp(draws[:, 1:2] - draws[:, 2:3] * x[None, :])  # (B, m)
            w = self.boot_w[fraction]
            qs = [np.quantile(preds, qq, axis=0, weights=w, method="inverted_cdf") for qq in (q, 1 - q)]
            lo_b = np.minimum(np.log(qs[0] / value), 0.0)
            hi_b = np.maximum(np.log(qs[1] / value), 0.0)
        h = self.loo_halfwidth(fraction) * self.extrapolation_scale(c)  # (m,)
        z = float(norm.ppf(0.5 + self.config.level / 2)) * self.noise / math.sqrt(seeds)  # the target's own noise
        low = value * np.exp(-np.sqrt(lo_b**2 + h**2 + z**2))
        high = value * np.exp(np.sqrt(hi_b**2 + h**2 + z**2))
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
                {"run": r.run, "rung": r.rung, "flops": r.flops, "params_active": r.params_active,
                 "params_total": r.params_total, "tokens": r.tokens, "final_loss": r.final_loss,
                 "seeds": r.n_seeds, "runs": list(r.runs or (r.run,))}
                for r in self.rungs
            ],
            "noise": {"value": self.noise, "source": self.noise_source},
            "final": self.final.as_dict(),
            "fractions": {
                f"{f:.2f}": {**law.as_dict(), "loo_halfwidth": self.loo_halfwidth(f)}
                for f, law in sorted(self.laws.items())
            },
            "loo_final": self.loo_err.get(max(self.laws), {}),
            "forward_final": self.fwd_err.get(max(self.laws), {}),
            "bootstrap_resamples": int(len(self.boot.get(max(self.laws), ()))),
        }


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
            raise ValueError(f"rung {label!r}: its seed runs differ in compute "
                             + ", ".join(f"{r.run}: C={r.flops:.6g}" for r in rs) + "; seeds of a rung must "
                             "train the same model on the same tokens")
        fracs = sorted(set().union(*(r.curve for r in rs)))
        curve = {f: float(np.mean([r.curve[f] for r in rs if f in r.curve])) for f in fracs}
        runs = tuple(x for r in rs for x in (r.runs or (r.run,)))
        out.append(Rung(run=rs[0].run, rung=label, flops=rs[0].flops, curve=curve,
                        params_active=rs[0].params_active, params_total=rs[0].params_total,
                        tokens=rs[0].tokens, steps=rs[0].steps, seed=None, runs=runs))
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
    payload = [("+".join(r.runs) if len(r.runs) > 1 else r.run, r.flops, sorted(r.curve.items()))
               for r in sorted(rungs, key=lambda r: r.run)]
    return f"{FIT_VERSION}:{hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:12]}"


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
        return cfg.noise, "config"
    sd, dof = seed_noise(rungs)
    if dof >= cfg.min_noise_dof and math.isfinite(sd):
        return sd, f"seeds (dof {dof})"
    return NOISE_DEFAULT, "default"


def fit_ladder(rungs: Sequence[Rung], config: FitConfig | None = None, name: str = "ladder") -> LadderFit:
    """Fit every schedule fraction, bootstrap over whole rungs, leave-one-rung-out and forward errors.

    `rungs` may hold several seeds of a rung (same `rung` label): they are averaged at
    every fraction (`average_seeds`) and are one unit everywhere after that. A fraction
    is fit when at least two rungs have an eval there. Each fraction has its own
    (E, A, alpha) unless `config.shared_e`. Resamples and leave-one-out subsets with
    fewer than three distinct rungs cannot determine E: they keep the full fit's.
    """
    cfg = config or FitConfig()
    noise, noise_source = _noise(rungs, cfg)
    rungs = average_seeds(rungs)
    n_distinct = len({r.flops for r in rungs})
    if n_distinct < cfg.n_free:
        raise ValueError(
            f"ladder {name!r} has {n_distinct} rungs with distinct compute; fitting needs >= {cfg.n_free}"
            + ("" if cfg.fix_e is not None else " (or fix E with --fix-e to fit two)")
        )
    fractions = [f for f in cfg.fractions if sum(1 for r in rungs if f in r.curve) >= 2]
    if 1.0 not in fractions:
        raise ValueError(f"ladder {name!r}: fewer than 2 rungs have a final (100%) eval")
    x, Y, c_ref = _matrix(rungs, fractions)
    if cfg.fix_e is not None and cfg.fix_e >= np.nanmin(Y):
        raise ValueError(f"--fix-e {cfg.fix_e} must be below the smallest observed loss {np.nanmin(Y):.4f}")
    n, F = len(rungs), len(fractions)
    ones = np.ones_like(Y)

    def solve(w, y, e_fix, starts, n_starts):
        """(F, 3) per-fraction (E, log A, alpha) and (F,) fitted mask for rung weights w (n,), losses y (F, n)."""
        out, ok = np.zeros((F, 3)), np.zeros(F, bool)
        if cfg.shared_e:
            th, _, fitted = _fit_curves(x, y, ones * w[None, :], cfg.delta, e_fix[0], n_starts,
                                        [] if starts is None else [_pack(starts)])
            for j in range(F):
                out[j] = (th[0], th[1 + 2 * j], th[2 + 2 * j])
            return out, fitted
        for j in range(F):
            th, _, fitted = _fit_curves(x, y[j : j + 1], w[None, :], cfg.delta, e_fix[j], n_starts,
                                        [] if starts is None else [starts[j]])
            out[j], ok[j] = th, fitted[0]
        return out, ok

    with _one_blas_thread():
        full, _ = solve(np.ones(n), Y, [cfg.fix_e] * F, None, cfg.n_starts)

        def sub(w, y=Y):  # a refit started from the full fit; E kept when < 3 distinct rungs
            distinct = len({rungs[i].flops for i in range(n) if w[i] > 0})
            e_fix = [cfg.fix_e if cfg.fix_e is not None else (None if distinct >= 3 else full[j, 0])
                     for j in range(F)]
            return solve(w, y, e_fix, full, 0)

        # bootstrap over whole rungs: a resample (rung counts) is shared by every fraction, and each
        # resampled rung's whole curve is moved by one draw of the run-to-run noise
        counts, prob = _resamples([r.flops for r in rungs], 2, cfg.n_boot, cfg.seed)
        reps = max(1, math.ceil(cfg.noise_draws / max(len(counts), 1))) if noise > 0 else 1
        rng = np.random.default_rng(cfg.seed)
        sigma = noise / np.sqrt([r.n_seeds for r in rungs])  # (n,) a rung's mean of k seeds: noise / sqrt(k)
        boot: dict[float, list] = {f: [] for f in fractions}
        boot_w: dict[float, list] = {f: [] for f in fractions}
        for w, pr in zip(counts, prob, strict=True):
            for _ in range(reps):
                eps = rng.normal(0.0, 1.0, n) * sigma if noise > 0 else np.zeros(n)
                th, ok = sub(w, Y * np.exp(eps)[None, :])
                for j, f in enumerate(fractions):
                    if ok[j]:
                        boot[f].append(th[j])
                        boot_w[f].append(pr / reps)

        def held_out(i, w, into):  # fit the rungs weighted w, record log(pred / obs) for rung i
            th, ok = sub(w)
            for j, f in enumerate(fractions):
                if ok[j] and np.isfinite(Y[j, i]):
                    into[f][rungs[i].rung] = float(math.log((th[j, 0] + math.exp(th[j, 1] - th[j, 2] * x[i])) / Y[j, i]))

        # leave-one-rung-out: predict each rung's curve from all the others; forward: from the
        # smaller rungs only (an extrapolation one rung out, as a target's forecast is)
        loo: dict[float, dict[str, float]] = {f: {} for f in fractions}
        fwd: dict[float, dict[str, float]] = {f: {} for f in fractions}
        if n >= 3:
            for i, held in enumerate(rungs):
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

    laws = {f: PowerLaw(float(full[j, 0]), float(full[j, 1]), float(full[j, 2]), c_ref)
            for j, f in enumerate(fractions)}
    return LadderFit(
        name=name, rungs=list(rungs), config=cfg, laws=laws,
        boot={f: np.array(v, dtype=float).reshape(-1, 3) for f, v in boot.items()},
        boot_w={f: np.array(v, dtype=float) for f, v in boot_w.items()},
        loo_err=loo, fwd_err=fwd, noise=noise, noise_source=noise_source,
    )


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


# ------------------------------------------------------------------- backtest


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


def backtest(rungs: Sequence[Rung], config: FitConfig | None = None, name: str = "ladder") -> Backtest:
    """Leave the largest rung (all its seeds) out, fit the rest, forecast its (seed-mean) curve, score it.

    The band is for the held-out rung as observed: the mean of its seeds, so the forecast's
    own-noise term is noise / sqrt(seeds).
    """
    held = average_seeds(rungs)[-1]
    rest = [r for r in rungs if r.rung != held.rung]
    fit = fit_ladder(rest, config, name=name)
    fc = fit.forecast(held.flops, held.steps, seeds=held.n_seeds)
    rows = compare(fc, held.curve)
    scored = [r for r in rows if r["inside"] is not None]
    fin = fc.final
    obs = held.final_loss
    if obs is None:
        raise ValueError(f"held-out rung {held.rung!r} has no final eval")
    return Backtest(
        held_out=held.rung, run=held.run, flops=held.flops,
        final_pred=fin.value, final_low=fin.low, final_high=fin.high, final_obs=obs,
        final_error_pct=100.0 * (fin.value - obs) / obs,
        coverage=sum(r["inside"] for r in scored) / len(scored) if scored else float("nan"),
        points=rows,
    )


# The store side (loading rungs, pre-registering forecasts, watching targets) lives in
# observatory.ladder.watch; its public names are importable from here too.
_WATCH = (
    "load_ladder", "target_spec", "curve_by_fraction", "forecast_event_data", "write_forecast", "run_started",
    "band_at_steps", "deviations", "check_target", "check_targets", "forecast_band",
)  # fmt: skip


def __getattr__(name: str):
    if name in _WATCH:
        from observatory.ladder import watch as ladder_watch

        return getattr(ladder_watch, name)
    raise AttributeError(f"module 'observatory.ladder.fit' has no attribute {name!r}")
