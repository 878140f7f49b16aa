"""The law `L(C) = E + A * C^(-alpha)` and its robust fit.

C is the training compute in FLOPs (`6 * N_active * D`, see trainer/ladder.py for
what else is counted). Fitting (`fit_power_law`, and `fit_curves` for several curves
at once): Huber loss (delta = 1e-3) on log residuals `log L_pred - log L_obs`,
minimised with scipy's L-BFGS-B from the best points of a grid of starts; E may be
fixed. C is divided by a reference compute (the geometric mean of the rungs' C) so
that log A stays near O(1).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize
from scipy.special import huber
from threadpoolctl import ThreadpoolController

__all__ = ["PowerLaw", "fit_power_law", "fit_curves", "one_blas_thread"]


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
    Plain Python on purpose: a ladder is a few dozen points, where numpy's per-call
    overhead costs more than the loop.
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


def fit_curves(x, Y, W, delta, fix_e, n_starts, extra_starts=()):
    """Minimise the shared-E objective over curves Y (F, n) at x (n,) with weights W (F, n). Returns (theta, objective, fitted (F,) bool).

    A curve with fewer than two distinct points carrying weight is not fitted (its
    parameters stay at the start and `fitted` says so).
    """
    F = Y.shape[0]
    fitted = np.array([len(set(x[np.isfinite(Y[j]) & (W[j] > 0)].tolist())) >= 2 for j in range(F)])
    pts = [
        [
            (float(x[i]), float(np.log(Y[j, i])), float(W[j, i]))
            for i in range(len(x))
            if np.isfinite(Y[j, i]) and W[j, i] > 0
        ]
        if fitted[j]
        else []
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
            _objective,
            s,
            args=(pts, delta),
            jac=True,
            method="L-BFGS-B",
            bounds=bounds,
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
    with one_blas_thread():
        theta, obj, _ = fit_curves(np.log(c / c_ref), y[None, :], w[None, :], delta, fix_e, n_starts)
    return PowerLaw(
        E=float(theta[0]), log_a=float(theta[1]), alpha=float(theta[2]), c_ref=c_ref, objective=obj
    )


def one_blas_thread():
    """Limit BLAS to one thread while fitting: each L-BFGS-B step is tiny, so a BLAS thread
    pool adds only hand-off overhead, the more so on a busy machine."""
    return _controller().limit(limits=1, user_api="blas")


@functools.cache
def _controller() -> ThreadpoolController:
    """The controller (it inspects the loaded libraries), made on first use."""
    return ThreadpoolController()
