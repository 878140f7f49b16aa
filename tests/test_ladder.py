"""The ladder fit: parameter recovery, bootstrap, band behaviour, backtest, deviation logic."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from observatory.ladder.backtest import backtest
from observatory.ladder.fit import FitConfig, _resamples, fit_ladder
from observatory.ladder.powerlaw import fit_power_law
from observatory.ladder.rungs import FRACTIONS, Rung, average_seeds, seed_noise
from observatory.ladder.watch import band_at_steps, curve_by_fraction, deviations

E, A, ALPHA = 2.0, 800.0, 0.25


def law(c, f=1.0):
    """The synthetic truth: loss at fraction f of a run of compute c (a power law in compute spent)."""
    return E + A * (f * c) ** -ALPHA


def synth_rungs(flops, noise=0.002, seed=0):
    """Rungs whose whole curve shares one noise draw (rungs, not points, are the noisy unit)
    plus a little independent per-point noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i, c in enumerate(flops):
        common = rng.normal(0, noise)
        curve = {f: law(c, f) * math.exp(common + rng.normal(0, noise / 4)) for f in FRACTIONS}
        out.append(Rung(run=f"r{i}", rung=f"r{i}", flops=c, curve=curve, steps=100))
    return out


def test_fit_power_law_recovers_known_parameters():
    rng = np.random.default_rng(1)
    c = np.geomspace(1e10, 1e14, 8)
    y = law(c) * np.exp(rng.normal(0, 0.002, c.size))
    p = fit_power_law(c, y)
    assert p.E == pytest.approx(E, rel=0.03)
    assert p.alpha == pytest.approx(ALPHA, rel=0.1)
    assert p.a_abs == pytest.approx(A, rel=0.5)  # A trades off against alpha; the curve is what matters
    assert np.max(np.abs(p(c) / law(c) - 1)) < 0.005


def test_fit_power_law_fix_e_and_errors():
    c = np.geomspace(1e10, 1e13, 5)
    p = fit_power_law(c, law(c), fix_e=E)
    assert p.E == E
    assert p.alpha == pytest.approx(ALPHA, rel=1e-3)
    with pytest.raises(ValueError, match="below the smallest observed loss"):
        fit_power_law(c, law(c), fix_e=10.0)
    with pytest.raises(ValueError, match="needs >= 3 distinct"):
        fit_power_law(c[:2], law(c[:2]))


def test_huber_resists_an_outlier():
    c = np.geomspace(1e10, 1e14, 9)
    y = law(c)
    y[4] *= 1.05  # one broken rung
    p = fit_power_law(c, y)
    clean = np.delete(np.arange(9), 4)
    assert np.max(np.abs(p(c[clean]) / law(c[clean]) - 1)) < 0.003


def test_resamples_enumerate_the_exact_bootstrap():
    counts, prob = _resamples([1, 2, 3, 4], 2, 200, 0)
    assert len(counts) == 35 - 4  # multisets of 4 from 4, minus the 4 single-rung ones
    assert (counts.sum(1) == 4).all()
    assert prob.sum() == pytest.approx(1.0)
    # all-distinct resample: 4!/4^4 before renormalising by the dropped single-rung mass 4/256
    i = next(k for k, w in enumerate(counts) if (w == 1).all())
    assert prob[i] == pytest.approx((24 / 256) / (1 - 4 / 256))
    # many rungs: random draws instead
    counts, prob = _resamples(list(range(10)), 2, 50, 0)
    assert counts.shape == (50, 10)


@pytest.mark.slow
def test_ladder_forecasts_the_target_curve():
    # five rungs over 16x compute, 0.1% run-to-run noise, a target 4x past the largest
    rungs = synth_rungs(list(np.geomspace(1e10, 1.6e11, 5)), noise=0.001)
    fit = fit_ladder(rungs)
    target = 6.4e11
    fc = fit.forecast(target, steps=1000)
    assert [p.step for p in fc.points] == [round(f * 1000) for f in FRACTIONS]
    truth = [law(target, p.fraction) for p in fc.points]
    inside = [p.low <= t <= p.high for p, t in zip(fc.points, truth, strict=True)]
    assert sum(inside) >= 0.9 * len(inside)
    assert abs(fc.final.value / law(target) - 1) < 0.01
    assert all(p.low < p.value < p.high for p in fc.points)


@pytest.mark.slow
def test_band_narrows_as_rungs_are_added():
    """More rungs over the same compute range: a tighter bootstrap and smaller forward errors."""
    target = 1.2e12
    widths = []
    for n in (4, 6, 8):
        rungs = synth_rungs(np.geomspace(1e10, 3e11, n), noise=0.002, seed=3)
        fc = fit_ladder(rungs, FitConfig(n_boot=40)).forecast(target)
        widths.append(math.log(fc.final.high / fc.final.low))
    assert widths[0] > widths[1] > widths[2], widths
    assert widths[2] > 2 * 1.645 * 0.003 * 0.99  # never below the run-to-run noise floor


def test_backtest_on_synthetic_ladder():
    rungs = synth_rungs([1e10, 2.2e10, 5e10, 1.1e11], noise=0.001)
    bt = backtest(rungs)
    assert bt.held_out == "r3"
    assert abs(bt.final_error_pct) < 1.0
    assert bt.coverage >= 0.9
    assert bt.final_low <= bt.final_obs <= bt.final_high


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_forward_errors_predict_each_rung_from_the_smaller_rungs_only():
    """The band's held-out term: the largest rung from the rungs below it (as a forecast
    extrapolates), not each rung from all the others; the smallest rung, predicted backwards,
    does not widen it."""
    rungs = synth_rungs([1e10, 2.2e10, 5e10, 1.1e11, 2.4e11], noise=0.002, seed=5)
    rungs[0] = Rung(
        run="r0", rung="r0", flops=1e10, curve={f: v * 1.2 for f, v in rungs[0].curve.items()}, steps=100
    )
    fit = fit_ladder(rungs, FitConfig(n_boot=20))
    # rungs with >= 2 smaller rungs get a forward error; every rung a leave-one-out error
    assert set(fit.fwd_err[1.0]) == {"r2", "r3", "r4"} and set(fit.loo_err[1.0]) == {
        f"r{i}" for i in range(5)
    }
    # the largest rung's forward error is exactly the backtest's (both fit the four smaller rungs)
    bt = backtest(rungs, FitConfig(n_boot=20))
    assert 100 * (math.exp(fit.fwd_err[1.0]["r4"]) - 1) == pytest.approx(bt.final_error_pct, abs=1e-3)
    # the broken smallest rung, left out, is predicted ~17% low from the others: the largest LOO error,
    # and the "max" band takes it; the forward band does not see it
    assert max(fit.loo_err[1.0].values(), key=abs) == fit.loo_err[1.0]["r0"] < math.log(0.9)
    assert fit.loo_halfwidth(1.0) == pytest.approx(
        abs(fit.fwd_err[1.0]["r4"])
    )  # the ladder's own last extrapolation
    assert fit.loo_halfwidth(1.0) < 0.5 * abs(fit.loo_err[1.0]["r0"])
    old = fit_ladder(rungs, FitConfig(n_boot=20, loo="max"))
    assert old.loo_halfwidth(1.0) == pytest.approx(abs(fit.loo_err[1.0]["r0"]))
    narrow, wide = fit.forecast(5e11).final, old.forecast(5e11).final
    assert narrow.value == pytest.approx(wide.value) and narrow.high - narrow.low < 0.75 * (
        wide.high - wide.low
    )


def test_fit_config_validates():
    with pytest.raises(ValueError, match="level"):
        FitConfig(level=1.5)
    with pytest.raises(ValueError, match="loo"):
        FitConfig(loo="median")
    with pytest.raises(ValueError, match="needs >= 3"):
        fit_ladder(synth_rungs([1e10, 2e10]))
    fit_ladder(synth_rungs([1e10, 2e10]), FitConfig(fix_e=E))  # two rungs are enough with E fixed


def test_curve_by_fraction_snaps_evals_to_five_percent_marks():
    pts = [{"step": s, "loss": 10.0 - s / 100} for s in (0, 5, 10, 15, 33, 100)]
    c = curve_by_fraction(pts, 100)
    assert c == {0.05: 9.95, 0.1: 9.9, 0.15: 9.85, 1.0: 9.0}  # 0 and 33 are no 5% mark


def test_deviations_need_k_consecutive_evals_outside():
    points = [{"step": s, "value": 3.0, "low": 2.9, "high": 3.1} for s in (10, 100)]
    evals = [
        {"step": s, "loss": v}
        for s, v in [
            (5, 9.0),
            (10, 3.0),
            (20, 3.3),
            (30, 3.4),
            (40, 3.0),
            (50, 3.2),
            (60, 3.3),
            (70, 3.5),
            (80, 3.0),
        ]
    ]
    assert deviations(points, evals, k=4) == []
    ex = deviations(points, evals, k=3)
    assert [e["window"] for e in ex] == [[50, 70]]  # step 5 has no band; 20-30 is only two
    assert ex[0]["above"]
    assert [e["window"] for e in deviations(points, evals, k=2)] == [[20, 30], [50, 70]]
    v, lo, hi = band_at_steps(points, [5, 55, 100, 101])
    assert np.isnan(lo[0]) and np.isnan(lo[3]) and lo[1] == pytest.approx(2.9)


def test_independent_e_per_fraction():
    rungs = synth_rungs([1e10, 2.2e10, 5e10, 1.1e11], noise=0.0005)
    fit = fit_ladder(rungs, FitConfig(shared_e=False, noise_draws=4))
    es = {round(law.E, 6) for law in fit.laws.values()}
    assert len(es) > 1  # each fraction has its own E
    assert abs(fit.forecast(4.4e11).final.value / law(4.4e11) - 1) < 0.02


# ------------------------------------------------------------ seeds per rung


def seeded_rungs(flops, offsets, noise=0.0005, seed=0):
    """Rungs trained with len(offsets) seeds each: seed k's whole curve is the law times
    exp(offsets[k] + a small per-point noise), labelled like load_ladder does (same rung, own seed)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, c in enumerate(flops):
        for k, off in enumerate(offsets):
            curve = {f: law(c, f) * math.exp(off + rng.normal(0, noise)) for f in FRACTIONS}
            out.append(
                Rung(
                    run=f"r{i}" + (f"-s{k}" if k else ""),
                    rung=f"r{i}",
                    flops=c,
                    curve=curve,
                    steps=100,
                    seed=k,
                )
            )
    return out


def test_average_seeds_means_every_fraction_and_keeps_the_rung_as_one_unit():
    runs = seeded_rungs([1e10, 2e10], [-0.02, 0.0, 0.02])
    avg = average_seeds(runs)
    assert [r.rung for r in avg] == ["r0", "r1"]
    r0 = avg[0]
    assert r0.runs == ("r0", "r0-s1", "r0-s2") and r0.n_seeds == 3 and r0.seed is None
    for f in FRACTIONS:
        assert r0.curve[f] == pytest.approx(np.mean([r.curve[f] for r in runs[:3]]))
    # a seed still running (no final eval yet) adds the points it has
    partial = [*runs[:2], Rung(run="r0-s2", rung="r0", flops=1e10, curve={0.05: 9.0}, seed=2)]
    r0p = average_seeds(partial)[0]
    assert r0p.curve[1.0] == pytest.approx(np.mean([runs[0].curve[1.0], runs[1].curve[1.0]]))
    assert r0p.curve[0.05] == pytest.approx(np.mean([runs[0].curve[0.05], runs[1].curve[0.05], 9.0]))
    # one run per rung: returned as is
    single = synth_rungs([1e10, 2e10])
    assert average_seeds(single) == single
    with pytest.raises(ValueError, match="differ in compute"):
        average_seeds([runs[0], Rung(run="x", rung="r0", flops=3e10, curve={1.0: 3.0}, seed=1)])


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_the_fit_sees_the_seed_mean_and_the_bootstrap_moves_whole_rungs():
    flops = [1e10, 2.2e10, 5e10, 1.1e11]
    runs = seeded_rungs(flops, [-0.03, 0.01, 0.02], seed=1)
    fit = fit_ladder(runs, FitConfig(noise=0.003))
    pre = fit_ladder(average_seeds(runs), FitConfig(noise=0.003))
    assert [r.rung for r in fit.rungs] == ["r0", "r1", "r2", "r3"] and all(r.n_seeds == 3 for r in fit.rungs)
    for f in fit.laws:  # seeds averaged first: the same laws as fitting the averaged rungs
        assert fit.laws[f].E == pytest.approx(pre.laws[f].E, abs=1e-9)
        assert fit.laws[f].alpha == pytest.approx(pre.laws[f].alpha, abs=1e-9)
    # the bootstrap resamples the 4 rungs (31 multisets with >= 2 distinct), not the 12 seed runs
    reps = math.ceil(FitConfig().noise_draws / 31)
    assert len(fit.boot[1.0]) == 31 * reps
    assert set(fit.loo_err[1.0]) == {"r0", "r1", "r2", "r3"}  # leave-one-out drops a rung with all its seeds
    # a rung's mean of 3 seeds is moved by noise / sqrt(3) in the bootstrap: a narrower band than
    # the same means taken for single runs
    single = [Rung(run=r.run, rung=r.rung, flops=r.flops, curve=r.curve, steps=r.steps) for r in pre.rungs]
    b3 = fit_ladder(runs, FitConfig(noise=0.02, loo="none")).forecast(4.4e11)
    b1 = fit_ladder(single, FitConfig(noise=0.02, loo="none")).forecast(4.4e11)
    assert b3.final.value == pytest.approx(b1.final.value)
    assert math.log(b3.final.high / b3.final.low) < math.log(b1.final.high / b1.final.low)


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_seed_noise_is_measured_from_the_seeds():
    offsets = [-0.02, 0.0, 0.02]  # sample sd 0.02 in log loss, the same at every rung
    runs = seeded_rungs([1e10, 2.2e10, 5e10, 1.1e11], offsets, noise=1e-5)
    sd, dof = seed_noise(runs)
    assert dof == 4 * 2 and sd == pytest.approx(0.02, rel=0.02)
    fit = fit_ladder(runs)
    assert fit.noise == pytest.approx(sd) and fit.noise_source == "seeds (dof 8)"
    # no seeds: the default; an explicit noise wins
    assert fit_ladder(synth_rungs([1e10, 2e10, 5e10])).noise_source == "default"
    assert fit_ladder(runs, FitConfig(noise=0.001)).noise == 0.001
    # the target is one run: its own-noise term is the full noise, a mean of k seeds gets 1/sqrt(k)
    one, three = fit.forecast(4.4e11, seeds=1).final, fit.forecast(4.4e11, seeds=3).final
    assert math.log(one.high / one.low) > math.log(three.high / three.low)
    assert math.log(one.high / one.value) >= 1.645 * sd * 0.99


def test_backtest_holds_out_every_seed_of_the_largest_rung():
    runs = seeded_rungs([1e10, 2.2e10, 5e10, 1.1e11], [-0.002, 0.0, 0.002], seed=2)
    bt = backtest(runs)
    assert bt.held_out == "r3"
    assert bt.final_obs == pytest.approx(np.mean([r.curve[1.0] for r in runs if r.rung == "r3"]))
    assert abs(bt.final_error_pct) < 1.0 and bt.coverage >= 0.9


@pytest.mark.jax
def test_ladder_spec_seeds_plan_one_run_per_rung_and_seed(tmp_path):
    pytest.importorskip("jax")
    from trainer.ladder import load_ladder_spec, plan

    base = Path(__file__).resolve().parent.parent / "trainer" / "configs" / "tiny.yaml"
    y = tmp_path / "lad.yaml"
    body = (
        f"name: lad\nbase: {base}\ntokens_per_param: 2\nrungs:\n  - {{rung: a, overrides: [model.d_model=16]}}\n"
        "  - {rung: b, overrides: [model.d_model=24]}\ntarget: {rung: t, overrides: [model.d_model=32]}\n"
    )
    y.write_text(body + "seeds: 3\n")
    spec = load_ladder_spec(y)
    assert spec.seeds == (0, 1, 2)
    rungs, tgt = plan(spec)
    assert [p.run_id for p in rungs] == ["lad-a", "lad-b", "lad-a-s1", "lad-b-s1", "lad-a-s2", "lad-b-s2"]
    for p in rungs:  # the seed sets model init and batch order, and is in run_start's ladder info
        assert p.cfg.seed == p.seed == p.ladder["seed"] and p.cfg.data.seed == p.seed
        assert p.cfg.name == p.run_id
    a0, a1 = rungs[0], rungs[2]
    assert a0.ladder["flops"] == a1.ladder["flops"] and a0.cfg.steps == a1.cfg.steps
    assert tgt.run_id == "lad-t" and tgt.seed == 0 and tgt.ladder["target"] is True
    t2 = plan(spec, target_seed=5)[1]  # another independent target run: its own seed and run id
    assert t2.run_id == "lad-t-s5" and t2.cfg.seed == t2.cfg.data.seed == t2.ladder["seed"] == 5
    assert t2.ladder["flops"] == tgt.ladder["flops"] and t2.cfg.name == "lad-t-s5"
    y.write_text(body + "seeds: [4, 7]\n")
    assert [p.run_id for p in plan(load_ladder_spec(y))[0]][:2] == ["lad-a-s4", "lad-b-s4"]
    for bad, msg in (("0", "must be >= 1"), ("[1, 1]", "distinct"), ("x", "a count"), ("[-1]", ">= 0")):
        y.write_text(body + f"seeds: {bad}\n")
        with pytest.raises(ValueError, match=msg):
            load_ladder_spec(y)


def test_rung_curves_figure_draws_each_rungs_mean_over_its_seeds():
    """The Ladder page's rung chart: one bold mean curve and one legend entry per rung, its seeds thin
    and grouped with it (a 4-rung ladder of 3 seeds is 4 legend entries, not 12)."""
    from observatory.dashboard.pages.ladder import rung_curves_figure

    runs = seeded_rungs([1e10, 2.2e10, 5e10, 1.1e11], [-0.02, 0.0, 0.02])
    fig = rung_curves_figure(runs, [])
    shown = [t for t in fig.data if t.showlegend is not False]
    assert [t.name for t in shown] == [f"r{i} (mean of 3 seeds)" for i in range(4)]
    mean_r1 = average_seeds(runs)[1]
    assert list(shown[1].y) == pytest.approx([mean_r1.curve[f] for f in sorted(mean_r1.curve)])
    seeds = [t for t in fig.data if t.showlegend is False]
    assert len(seeds) == 12 and {t.legendgroup for t in seeds} == {"r0", "r1", "r2", "r3"}
    # one seed per rung: just the rung's curve
    single = rung_curves_figure([r for r in runs if r.seed == 0], [])
    assert [t.name for t in single.data] == ["r0", "r1", "r2", "r3"]


@pytest.mark.jax
def test_trainer_ladder_plan_with_seeds_and_target_seed(capsys):
    """`trainer ladder --plan --seeds N --target-seed K`: a quick pass over fewer seeds, and another target run."""
    from trainer.ladder import main

    cfg = str(Path(__file__).resolve().parent.parent / "trainer" / "configs" / "ladder_cpu.yaml")
    assert main(["--config", cfg, "--plan", "--seeds", "2", "--target-seed", "3"]) == 0
    out = capsys.readouterr().out
    ids = [
        line.split()[2]
        for line in out.splitlines()
        if line.strip().startswith(("d24", "d32", "d40", "d48", "d72"))
    ]
    assert ids == [f"ladder-cpu-{r}{s}" for s in ("", "-s1") for r in ("d24", "d32", "d40", "d48")] + [
        "ladder-cpu-d72-s3"
    ]
    for bad in (["--seeds", "0"], ["--target-seed", "-1"]):
        assert main(["--config", cfg, "--plan", *bad]) == 2
        assert "must be >= " in capsys.readouterr().err
