"""The iso-FLOP analysis (observatory.ladder.isoflop) against numpy's polyfit, a published grid and a
simulated grid whose compute-optimal exponents are known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from observatory.ladder.isoflop import Cell, compute_multiplier, fit_envelope, fit_isoflop

# marin-community/marin issue #8003 ("[grug] Aug hero iso-FLOP sweep", 2026-08-06): paloma macro loss per
# cell, tokens = steps x batch x 8192; the compute-optimal tokens and loss at the minimum per budget.
MARIN_8003 = [
    (1e18, "d512", 5.77e9, 3.399),
    (1e18, "d768", 2.33e9, 3.364),
    (1e18, "d1024", 9.23e8, 3.456),
    (3e18, "d512", 1.73e10, 3.298),
    (3e18, "d768", 7.00e9, 3.204),
    (3e18, "d1024", 2.77e9, 3.224),
    (3e18, "d1280", 1.57e9, 3.289),
]
MARIN_8003_OPTIMA = {1e18: (2.84e9, 3.361), 3e18: (5.08e9, 3.198)}


def chinchilla_grid(budgets=(1e18, 3e18, 1e19, 3e19), k=7, sd=0.0, seed=0):
    """Cells of L(N, D) = E + A/N^alpha + B/D^beta on C = 6ND, k sizes per budget around the optimum.
    Its optimum: N* ∝ C^(beta/(alpha+beta)), D* ∝ C^(alpha/(alpha+beta))."""
    E, A, B, alpha, beta = 1.69, 406.4, 410.7, 0.34, 0.28
    rng = np.random.default_rng(seed)
    cells = []
    for c in budgets:
        n_opt = (alpha * A / (beta * B)) ** (1 / (alpha + beta)) * (c / 6) ** (beta / (alpha + beta))
        for i, n in enumerate(n_opt * np.geomspace(1 / 8, 8, k)):
            d = c / (6 * n)
            loss = (
                E + A / n**alpha + B / d**beta + rng.normal(0, sd) if sd else E + A / n**alpha + B / d**beta
            )
            cells.append(Cell(f"c{c:.0e}-{i}", c, d, float(loss), float(n)))
    return cells, beta / (alpha + beta), alpha / (alpha + beta)


def test_vertex_matches_numpy_polyfit():
    cells, _, _ = chinchilla_grid(sd=0.01, seed=3)
    iso = fit_isoflop(cells, n_boot=200)
    for f in iso.budgets:
        cs = [c for c in cells if c.budget == f.budget]
        x = np.log10([c.tokens for c in cs])  # another base: the same vertex
        coef = np.polyfit(x, [c.loss for c in cs], 2)
        xv = -coef[1] / (2 * coef[0])
        assert f.tokens == pytest.approx(10**xv, rel=1e-9)
        assert f.loss == pytest.approx(np.polyval(coef, xv), rel=1e-12)
        pc = np.polyfit(np.log([c.params for c in cs]), [c.loss for c in cs], 2)
        assert f.params == pytest.approx(math.exp(-pc[1] / (2 * pc[0])), rel=1e-9)
        assert f.params_from == "fit"
        assert f.tokens_lo < f.tokens < f.tokens_hi and f.loss_lo < f.loss < f.loss_hi


def test_published_grid_reproduces_its_optima():
    cells = [Cell(f"{c:.0e}-{w}", c, d, loss) for c, w, d, loss in MARIN_8003]
    iso = fit_isoflop(cells, n_boot=500)
    for f in iso.budgets:
        tokens, loss = MARIN_8003_OPTIMA[f.budget]
        assert f.status == "ok"
        assert f.tokens == pytest.approx(tokens, rel=0.005)  # the issue gives 3 significant figures
        assert round(f.loss, 3) == loss
        assert f.params_from == "C/6D"  # the issue gives widths, not parameter counts
    # 1e18 has 3 cells (an exact fit); 3e18's fourth gives the residual noise both intervals use
    assert iso.noise_from == "residuals" and iso.noise > 0
    assert iso.budgets[0].tokens_lo < 2.84e9 < iso.budgets[0].tokens_hi
    assert iso.frontier is not None and iso.frontier.budgets == 2


def test_frontier_recovers_the_known_exponents_and_recommends_inside_its_interval():
    cells, a_n, a_d = chinchilla_grid(sd=0.003, seed=1)
    iso = fit_isoflop(cells, n_boot=400, budget=1e20)
    fr = iso.frontier
    assert fr.a_n == pytest.approx(a_n, abs=0.03) and fr.a_d == pytest.approx(a_d, abs=0.03)
    assert fr.a_n_lo < fr.a_n < fr.a_n_hi and fr.a_d_lo < fr.a_d < fr.a_d_hi
    rec = iso.recommendation
    assert rec["params_lo"] < rec["params"] < rec["params_hi"]
    assert rec["tokens_lo"] < rec["tokens"] < rec["tokens_hi"]
    assert rec["params"] * rec["tokens"] * 6 == pytest.approx(1e20, rel=0.15)
    assert rec["note"] == "extrapolated beyond the grid's budgets"


def test_too_few_cells_and_no_minimum_are_said_per_budget_never_nan():
    good, _, _ = chinchilla_grid(budgets=(1e18, 1e19), k=5, sd=0.002)
    cap = [Cell("cap-a", 1e20, 1e9, 2.5), Cell("cap-b", 1e20, 2e9, 2.8), Cell("cap-c", 1e20, 4e9, 2.5)]
    cells = [*good, Cell("two-a", 3e19, 1e9, 3.0), Cell("two-b", 3e19, 2e9, 2.9), *cap]
    iso = fit_isoflop(cells, n_boot=100, budget=5e19)
    by = {f.budget: f for f in iso.budgets}
    assert by[3e19].status == "too_few_cells" and "2 distinct token count(s)" in by[3e19].message
    assert by[1e20].status == "no_minimum" and "opens downwards" in by[1e20].message
    assert by[1e20].tokens is None and by[3e19].tokens is None
    assert iso.frontier.budgets == 2  # the two good budgets only
    text = json.dumps(iso.as_dict(), allow_nan=False)  # raises on a NaN
    assert '"no_minimum"' in text


def test_an_exact_grid_has_no_interval_and_says_why():
    cells = [Cell(f"{c:.0e}-{w}", c, d, loss) for c, w, d, loss in MARIN_8003[:3]]
    iso = fit_isoflop(cells)
    assert iso.noise is None and iso.budgets[0].tokens_lo is None
    assert any("give noise" in n for n in iso.notes)
    with_noise = fit_isoflop(cells, noise=0.005)
    assert with_noise.noise_from == "given" and with_noise.budgets[0].tokens_lo is not None


def test_bad_cells_are_named():
    with pytest.raises(ValueError, match="cell r1: loss nan"):
        fit_isoflop([Cell("r1", 1e18, 1e9, float("nan"))])


def test_compute_multiplier_recovers_a_known_speedup():
    base, _, _ = chinchilla_grid(sd=0.002, seed=5)
    # the variant reaches at C what the baseline reaches at C / 0.7: it needs 0.7x the compute
    var, _, _ = chinchilla_grid(sd=0.002, seed=6)
    E, A, B, alpha, beta = 1.69, 406.4, 410.7, 0.34, 0.28
    var = [
        Cell(
            "v" + c.run,
            c.budget,
            c.tokens,
            E + A / (c.params / 0.7**0.5) ** alpha + B / (c.tokens / 0.7**0.5) ** beta,
        )
        for c in var
    ]
    m = compute_multiplier(fit_envelope(base), fit_envelope(var))
    assert m.value == pytest.approx(0.7, rel=0.08)
    assert m.lo is not None and m.lo < m.value < m.hi
    assert m.text().startswith(f"reaches the baseline's loss with {m.value:.2f}×")


def test_many_columns_at_once_match_polyfit_column_by_column():
    from observatory.ladder.isoflop import _fit_many

    rng = np.random.default_rng(0)
    x = np.log(np.geomspace(1e8, 1e10, 7))  # log tokens ~ 18-23: the ill-conditioned case
    ys = rng.normal(3, 0.1, (7, 50))
    for deg in (1, 2):
        many = _fit_many(x, ys, deg)
        for b in range(ys.shape[1]):
            assert many[:, b] == pytest.approx(np.polyfit(x, ys[:, b], deg), rel=1e-7, abs=1e-9)


def test_a_variant_that_never_reaches_the_baseline_gives_nan_not_a_number_made_up():
    base, _, _ = chinchilla_grid(sd=0.002, seed=5)
    worse = [Cell("w" + c.run, c.budget, c.tokens, c.loss + 1.0, c.params) for c in base]
    m = compute_multiplier(fit_envelope(base), fit_envelope(worse))
    assert math.isnan(m.value)
