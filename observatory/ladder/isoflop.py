"""Iso-FLOP analysis: the compute-optimal model size and token count per budget, the frontier across
budgets, a recommendation for a new budget, and a variant's effective compute against a baseline.

An iso-FLOP grid trains, at each compute budget C, a handful of model sizes, each on the tokens the
budget leaves it (C ≈ 6·N·D). Per budget the final loss is a U in log(tokens):

    L(log D) = a·(log D)² + b·log D + c          vertex: log D* = -b / 2a, L* = L(log D*)

and, when every cell knows its (active) parameters, the same in log(params) gives N*; else N* = C / (6·D*).
The frontier is N* ∝ C^a_N and D* ∝ C^a_D (a straight line in log-log through the budgets' vertices).

Intervals (`level`, 90 % by default) come from a parametric bootstrap: every cell's loss is redrawn
around its budget's fitted U with the cells' noise (the pooled residual sd of the per-budget fits, or
`noise` when the caller knows the run-to-run spread, e.g. the ladder's seeds), every fit is redone on
the draws, and the quantiles of the vertices, exponents and recommendations are the interval. A budget
with fewer than 3 distinct token counts, or whose U opens downwards (no minimum), is said so in its
`status` and `message`, never a silent NaN; it is left out of the frontier.

Shapes: cells (n,), per budget x (k,), draws (k, B) with B = n_boot.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

__all__ = [
    "Cell",
    "BudgetFit",
    "Frontier",
    "IsoFlop",
    "Envelope",
    "Multiplier",
    "fit_isoflop",
    "fit_envelope",
    "compute_multiplier",
    "finite_json",
]

MIN_CELLS = 3  # distinct token counts a quadratic needs


@dataclass(frozen=True)
class Cell:
    """One finished run of the grid: its budget C (FLOPs), tokens D, active params N (None: unknown), loss."""

    run: str
    budget: float
    tokens: float
    loss: float
    params: float | None = None


@dataclass
class BudgetFit:
    """One budget's U. `status`: ok | extrapolated (vertex outside the cells' tokens) | too_few_cells |
    no_minimum. Numbers are None when the status says there is no vertex."""

    budget: float
    n: int
    status: str
    message: str
    tokens: float | None = None  # D*
    tokens_lo: float | None = None
    tokens_hi: float | None = None
    params: float | None = None  # N*
    params_lo: float | None = None
    params_hi: float | None = None
    params_from: str | None = None  # "fit" (quadratic in log N) or "C/6D"
    loss: float | None = None  # L* at the vertex
    loss_lo: float | None = None
    loss_hi: float | None = None
    coef: list[float] | None = None  # [a, b, c] in natural log(tokens)
    runs: list[str] = field(default_factory=list)

    @property
    def has_vertex(self) -> bool:
        return self.status in ("ok", "extrapolated")


@dataclass
class Frontier:
    """N* = n_k·C^a_n and D* = d_k·C^a_d over the budgets with a vertex; intervals from the bootstrap."""

    budgets: int
    a_n: float
    a_n_lo: float | None
    a_n_hi: float | None
    a_d: float
    a_d_lo: float | None
    a_d_hi: float | None
    log_n_k: float
    log_d_k: float


@dataclass
class IsoFlop:
    budgets: list[BudgetFit]
    frontier: Frontier | None
    noise: float | None  # the loss sd the bootstrap drew with
    noise_from: str  # "residuals", "given", or why there is none
    level: float
    recommendation: dict | None = None  # {budget, params, params_lo, params_hi, tokens, tokens_lo, ...}
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return finite_json(asdict(self))


def finite_json(x):
    """NaN and inf as None, so JSON stays JSON (a missing number is said in a message, not as NaN)."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: finite_json(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [finite_json(v) for v in x]
    return x


def _fit_many(x: np.ndarray, ys: np.ndarray, deg: int) -> np.ndarray:
    """`np.polyfit(x, ys, deg)` for many columns ys (k, B) at once: (deg + 1, B), numpy's order.

    One pseudo-inverse of the (centred) Vandermonde matrix serves every column, so a thousand bootstrap
    draws cost one small matrix product instead of a least-squares solve over all of them."""
    m = float(np.mean(x))
    p = np.linalg.pinv(np.vander(x - m, deg + 1)) @ ys  # in t = x - m
    if deg == 1:
        a, b = p
        return np.stack([a, b - a * m])
    a, b, c = p  # a t^2 + b t + c with t = x - m
    return np.stack([a, b - 2 * a * m, a * m * m - b * m + c])


def _vertex(coef: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Vertex (x*, y*) of quadratics with coefficients (3, B) (numpy's polyfit order); NaN where a <= 0."""
    a, b, c = coef
    with np.errstate(divide="ignore", invalid="ignore"):
        x = np.where(a > 0, -b / (2 * a), np.nan)
    return x, a * x * x + b * x + c


def _q(draws: np.ndarray, level: float) -> tuple[float | None, float | None]:
    """The central `level` interval of the finite draws; (None, None) when fewer than half are finite."""
    ok = draws[np.isfinite(draws)]
    if ok.size < max(10, draws.size // 2):
        return None, None
    lo, hi = np.quantile(ok, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)


def _group(cells: Iterable[Cell]) -> dict[float, list[Cell]]:
    out: dict[float, list[Cell]] = {}
    for c in cells:
        for v, name in ((c.budget, "budget"), (c.tokens, "tokens"), (c.loss, "loss")):
            if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
                raise ValueError(f"cell {c.run}: {name} {v!r} is not a positive number")
        out.setdefault(float(c.budget), []).append(c)
    return dict(sorted(out.items()))


def fit_isoflop(
    cells: Sequence[Cell],
    *,
    level: float = 0.9,
    n_boot: int = 1000,
    noise: float | None = None,
    seed: int = 0,
    budget: float | None = None,
) -> IsoFlop:
    """Fit every budget's U, the frontier, and (`budget`) a recommendation for a new budget.

    `noise`: the sd of one cell's loss (e.g. the spread of a ladder's seeds); None: the pooled residual
    sd of the budgets' fits (needs a budget with more than 3 cells)."""
    if not 0 < level < 1:
        raise ValueError(f"level {level} must be in (0, 1), e.g. 0.9")
    groups = _group(cells)
    rng = np.random.default_rng(seed)
    fits: list[BudgetFit] = []
    xs: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]] = {}
    sse, dof = 0.0, 0
    for c_budget, cs in groups.items():
        x = np.log([c.tokens for c in cs])
        y = np.array([c.loss for c in cs])
        runs = [c.run for c in cs]
        distinct = len(np.unique(np.round(x, 9)))
        if distinct < MIN_CELLS:
            fits.append(
                BudgetFit(
                    c_budget,
                    len(cs),
                    "too_few_cells",
                    f"{distinct} distinct token count(s); a quadratic needs {MIN_CELLS}",
                    runs=runs,
                )
            )
            continue
        coef = np.polyfit(x, y, 2)
        resid = y - np.polyval(coef, x)
        sse += float(resid @ resid)
        dof += len(cs) - 3
        px = None
        if all(c.params is not None and c.params > 0 for c in cs):
            px = np.log([c.params for c in cs])
            if len(np.unique(np.round(px, 9))) < MIN_CELLS:
                px = None
        xs[c_budget] = (x, y, px, coef)
        if coef[0] <= 0:
            fits.append(
                BudgetFit(
                    c_budget,
                    len(cs),
                    "no_minimum",
                    "the loss is not U-shaped in log(tokens) (the quadratic opens downwards): "
                    "add cells on both sides of the best one",
                    coef=[float(v) for v in coef],
                    runs=runs,
                )
            )
            continue
        vx, vy = _vertex(coef[:, None])
        inside = x.min() <= vx[0] <= x.max()
        f = BudgetFit(
            c_budget,
            len(cs),
            "ok" if inside else "extrapolated",
            "" if inside else "the minimum lies outside the cells' tokens: add a cell beyond it",
            tokens=float(np.exp(vx[0])),
            loss=float(vy[0]),
            coef=[float(v) for v in coef],
            runs=runs,
        )
        if px is not None:
            pc = np.polyfit(px, y, 2)
            pv, _ = _vertex(pc[:, None])
            f.params, f.params_from = (float(np.exp(pv[0])), "fit") if np.isfinite(pv[0]) else (None, None)
        if f.params is None:
            f.params, f.params_from = c_budget / (6 * f.tokens), "C/6D"
        fits.append(f)

    notes: list[str] = []
    if noise is not None:
        sigma, noise_from = float(noise), "given"
    elif dof > 0:
        sigma, noise_from = math.sqrt(sse / dof), "residuals"
    else:
        sigma = None
        noise_from = "none: every budget's U passes exactly through 3 cells; give noise (a cell's loss sd)"
        notes.append("no intervals: " + noise_from)

    # (budget) -> draws of log D*, log N*, L* (B,)
    draws: dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    if sigma is not None and sigma > 0 and n_boot > 0:
        for f in fits:
            if not f.has_vertex:
                continue
            x, y, px, coef = xs[f.budget]
            yy = np.polyval(coef, x)[:, None] + rng.normal(0, sigma, (len(x), n_boot))  # (k, B)
            vx, vy = _vertex(_fit_many(x, yy, 2))
            if px is not None and f.params_from == "fit":
                vn, _ = _vertex(_fit_many(px, yy, 2))
            else:
                vn = np.log(f.budget / 6) - vx
            draws[f.budget] = (vx, vn, vy)
            f.tokens_lo, f.tokens_hi = (None if v is None else math.exp(v) for v in _q(vx, level))
            f.params_lo, f.params_hi = (None if v is None else math.exp(v) for v in _q(vn, level))
            f.loss_lo, f.loss_hi = _q(vy, level)
            if f.tokens_lo is None:
                f.message = (f.message + "; " if f.message else "") + (
                    "most redraws with the cells' noise have no minimum: the vertex is not determined"
                )

    good = [f for f in fits if f.has_vertex]
    frontier = None
    rec = None
    if len(good) >= 2:
        lc = np.log([f.budget for f in good])
        ln = np.log([f.params for f in good])
        ld = np.log([f.tokens for f in good])
        a_n, k_n = np.polyfit(lc, ln, 1)
        a_d, k_d = np.polyfit(lc, ld, 1)
        lims: dict[str, tuple] = {"a_n": (None, None), "a_d": (None, None)}
        dn = dd = None
        if all(f.budget in draws for f in good):
            dn = np.stack([draws[f.budget][1] for f in good])  # (budgets, B)
            dd = np.stack([draws[f.budget][0] for f in good])
            ok = np.isfinite(dn).all(0) & np.isfinite(dd).all(0)
            dn, dd = dn[:, ok], dd[:, ok]
            if dn.shape[1] >= 10:
                pn = _fit_many(lc, dn, 1)  # (2, B')
                pd = _fit_many(lc, dd, 1)
                lims = {"a_n": _q(pn[0], level), "a_d": _q(pd[0], level)}
            else:
                dn = dd = None
        frontier = Frontier(
            len(good), float(a_n), *lims["a_n"], float(a_d), *lims["a_d"], float(k_n), float(k_d)
        )
        if budget is not None:
            lb = math.log(budget)
            rec = {
                "budget": budget,
                "params": math.exp(k_n + a_n * lb),
                "tokens": math.exp(k_d + a_d * lb),
                "params_lo": None,
                "params_hi": None,
                "tokens_lo": None,
                "tokens_hi": None,
            }
            if dn is not None:
                pn, pd = _fit_many(lc, dn, 1), _fit_many(lc, dd, 1)
                for key, p in (("params", pn), ("tokens", pd)):
                    lo, hi = _q(p[1] + p[0] * lb, level)
                    rec[f"{key}_lo"], rec[f"{key}_hi"] = (
                        None if lo is None else math.exp(lo),
                        None if hi is None else math.exp(hi),
                    )
            if not min(f.budget for f in good) <= budget <= max(f.budget for f in good):
                rec["note"] = "extrapolated beyond the grid's budgets"
    elif budget is not None:
        notes.append(f"no recommendation: {len(good)} budget(s) with a minimum; a frontier needs 2")
    return IsoFlop(fits, frontier, sigma, noise_from, level, rec, notes)


# ------------------------------------------------------------------ a variant against a baseline


Z90 = 1.6448536269514722  # the normal quantile of 0.95: a 90 % interval is +-Z90 sd


@dataclass
class Envelope:
    """The best loss reached at each compute: log L as a polynomial in log C (a quadratic from 4 budgets
    on, which bends as E + A·C^-alpha does; a line below), with bootstrap draws of its coefficients.

    `points`: [(C, L, sd)]: per budget the iso-FLOP vertex loss and its sd (from its interval) when the
    budget has one, else the best cell and the cells' pooled noise."""

    points: list[tuple[float, float, float | None]]
    coef: np.ndarray  # (deg + 1,) in numpy's polyfit order, x = log C, y = log L
    draws: np.ndarray | None  # (deg + 1, B)

    def loss(self, flops):
        return np.exp(np.polyval(self.coef, np.log(np.asarray(flops, dtype=float))))

    def band(self, flops, level: float = 0.9) -> tuple[np.ndarray, np.ndarray] | None:
        """Lower and upper loss at each of `flops` (m,) from the draws; None without draws."""
        if self.draws is None:
            return None
        ly = _polyval(self.draws, np.log(np.asarray(flops, dtype=float)))  # (m, B)
        lo, hi = np.quantile(ly, [(1 - level) / 2, (1 + level) / 2], axis=1)
        return np.exp(lo), np.exp(hi)

    def flops_at(self, loss, coef: np.ndarray | None = None) -> np.ndarray:
        """The compute where the envelope (or each of the draws' envelopes, `coef` (deg + 1, B), with its own
        `loss` when that is (B,)) first reaches `loss`, searched from 1/100 of the smallest budget to 100x
        the largest; NaN where it never does."""
        coef = self.coef[:, None] if coef is None else coef
        cs = [p[0] for p in self.points]
        grid = np.linspace(math.log(min(cs)) - math.log(100), math.log(max(cs)) + math.log(100), 800)
        y = _polyval(coef, grid)  # (800, B)
        target = np.log(np.broadcast_to(np.asarray(loss, dtype=float), (coef.shape[1],)))
        below = y <= target[None, :]
        first = np.argmax(below, axis=0)
        ok = below.any(axis=0) & (first > 0)
        j = np.clip(first, 1, len(grid) - 1)
        cols = np.arange(coef.shape[1])
        y0, y1 = y[j - 1, cols], y[j, cols]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = (y0 - target) / (y0 - y1)
        x = grid[j - 1] + frac * (grid[j] - grid[j - 1])
        return np.where(ok, np.exp(x), np.nan)


def _polyval(coef: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Polynomials (deg + 1, B) in numpy's order at points x (m,): (m, B), by Horner's rule."""
    y = np.zeros((len(x), coef.shape[1]))
    for c in coef:
        y = y * x[:, None] + c[None, :]
    return y


def fit_envelope(cells: Sequence[Cell], *, n_boot: int = 1000, seed: int = 0, level: float = 0.9) -> Envelope:
    """The loss-against-compute envelope of a grid (or of any runs: each run is its own budget)."""
    groups = _group(cells)
    iso = fit_isoflop(cells, n_boot=n_boot, seed=seed, level=level)
    by = {f.budget: f for f in iso.budgets}
    z = Z90 if level == 0.9 else float(np.sqrt(2) * _erfinv(level))
    pts = []
    for c, cs in groups.items():
        f = by[c]
        if f.has_vertex:
            sd = (f.loss_hi - f.loss_lo) / (2 * z) if f.loss_lo is not None else iso.noise
            pts.append((c, f.loss, sd))
        else:
            pts.append((c, min(x.loss for x in cs), iso.noise))
    if len(pts) < 2:
        raise ValueError(f"an envelope needs runs at 2 or more budgets, got {len(pts)}")
    deg = 2 if len(pts) >= 4 else 1
    lc = np.log([p[0] for p in pts])
    ll = np.log([p[1] for p in pts])
    coef = np.polyfit(lc, ll, deg)
    draws = None
    sds = np.array([p[2] if p[2] else np.nan for p in pts])
    if np.isfinite(sds).all() and n_boot > 0:
        rng = np.random.default_rng(seed + 1)
        yy = ll[:, None] + rng.normal(0, 1, (len(pts), n_boot)) * (sds / np.exp(ll))[:, None]  # (k, B)
        draws = _fit_many(lc, yy, deg)
    if deg == 2 and coef[0] < 0:  # bending downwards: no saturating law does; a line is the safer shape
        coef = np.polyfit(lc, ll, 1)
        draws = None if draws is None else _fit_many(lc, yy, 1)
    return Envelope(pts, coef, draws)


def _erfinv(y: float) -> float:
    from scipy.special import erfinv

    return float(erfinv(y))


@dataclass
class Multiplier:
    """The variant's compute to reach the baseline's loss, over the baseline's compute for it."""

    loss: float  # the baseline's loss it is measured at (its envelope at its largest budget)
    flops: float  # the baseline's compute there
    value: float
    lo: float | None
    hi: float | None
    level: float

    def text(self) -> str:
        band = "" if self.lo is None else f" [{self.lo:.2f}, {self.hi:.2f}]"
        return f"reaches the baseline's loss with {self.value:.2f}×{band} the compute"


def compute_multiplier(baseline: Envelope, variant: Envelope, level: float = 0.9) -> Multiplier:
    """Effective compute multiplier at the baseline's loss at its largest budget: C_variant(L_b) / C_b from
    the fitted envelopes (< 1: the variant needs less compute); its interval from both envelopes' draws
    (each draw's baseline loss at C_b, found on that draw's variant envelope)."""
    c_b = max(p[0] for p in baseline.points)
    l_b = float(baseline.loss(c_b))
    value = float(variant.flops_at(l_b)[0] / c_b)
    lo = hi = None
    if baseline.draws is not None and variant.draws is not None:
        n = min(baseline.draws.shape[1], variant.draws.shape[1])
        lbs = np.exp(_polyval(baseline.draws[:, :n], np.array([math.log(c_b)]))[0])  # (B,)
        m = variant.flops_at(lbs, variant.draws[:, :n]) / c_b
        m = m[np.isfinite(m) & (m > 0)]
        if m.size >= max(10, n // 2):
            lo, hi = (float(v) for v in np.quantile(m, [(1 - level) / 2, (1 + level) / 2]))
    return Multiplier(l_b, float(c_b), value, lo, hi, level)
