"""Bring your own ladder: a table of points -> event logs -> store -> forecast with an honest band.

Real parts throughout: the importer writes event logs, real ingest puts them in a DuckDB file,
the real CLI fits and forecasts. The failure modes of hand-written ladder logs (issue 39) are
written with `observatory.init` as a user's trainer would write them.
"""

from __future__ import annotations

import json
import math
import re

import pytest
from click.testing import CliRunner
from polling import wait_until

import observatory
from observatory import findings
from observatory.cli import main as cli
from observatory.interop.ladder_points import PointsError, import_points
from observatory.ladder.fit import FitConfig, fit_ladder
from observatory.ladder.rungs import Rung
from observatory.ladder.watch import load_ladder
from observatory.pipeline import ingest, rebuild
from observatory.store import connect

E, A, ALPHA = 1.8, 1.5, 0.15


def law(c):
    return E + A * (c / 1e18) ** -ALPHA


def chinchilla(c):
    """Hoffmann et al.'s fitted L(N, D) = 1.69 + 406.4/N^0.34 + 410.7/D^0.28 at its compute-optimal split
    of C = 6ND: points a lab could publish, which our one-term law only approximates."""
    e, a, b, al, be = 1.69, 406.4, 410.7, 0.34, 0.28
    g = (al * a / (be * b)) ** (1 / (al + be))
    n = g * (c / 6) ** (be / (al + be))
    return e + a / n**al + b / (c / 6 / n) ** be


def cli_run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def ok(*args):
    res = cli_run(*args)
    assert res.exit_code == 0, res.output
    return res.output


@pytest.fixture
def env(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    return tmp_path, runs, db


CSV = """# published points
ladder,rung,flops,loss,tokens,params,source,target
pub,s,1e18,{0},2e10,8.3e6,"Table 3, row 1",
pub,m,4e18,{1},4e10,1.67e7,,
pub,l,1.6e19,{2},8e10,3.33e7,,
pub,xl,6.4e19,{3},1.6e11,6.67e7,,
pub,big,1e21,{4},,,,yes
pub,huge,1e23,,,,,true
"""


def write_csv(tmp_path, flops=(1e18, 4e18, 1.6e19, 6.4e19, 1e21)):
    p = tmp_path / "pub.csv"
    p.write_text(CSV.format(*(f"{law(c):.5f}" for c in flops)))
    return p


# ------------------------------------------------------------------ import


def test_import_csv_then_forecast_without_a_target(env):
    """Two commands: import a CSV of published points, forecast a run that does not exist."""
    tmp, runs, db = env
    out = ok("ladder", "import", write_csv(tmp))
    assert "5 run(s) of ladder(s) pub" in out and "1 target(s) without a loss" in out
    assert "next: observatory ladder forecast pub --flops 1e+23" in out
    # ordinary event logs: run_start with the ladder, an eval at the last step, a run_end
    lines = [json.loads(x) for x in (runs / "pub-s" / "events.0.jsonl").read_text().splitlines()]
    assert [e["kind"] for e in lines] == ["run_start", "eval", "run_end"]
    lad = lines[0]["data"]["ladder"]
    assert lad == {
        "name": "pub",
        "rung": "s",
        "flops": 1e18,
        "steps": 1,
        "tokens": 20000000000,
        "params_active": 8300000,
        "source": "Table 3, row 1",
    }
    assert lines[1]["step"] == lad["steps"] and lines[2]["data"] == {"status": "completed", "final_step": 1}
    with connect(db) as con:
        rungs, targets, _ = load_ladder(con, "pub")
    assert [r.rung for r in sorted(rungs, key=lambda r: r.flops)] == ["s", "m", "l", "xl"]
    assert [(t["run"], t["curve"]) for t in targets] == [
        ("pub-big", {1.0: pytest.approx(law(1e21), rel=1e-5)})
    ]
    # the same table again writes nothing; the store rebuilt from the logs is the same
    assert "(5 unchanged)" in ok("ladder", "import", tmp / "pub.csv")
    rebuild(runs, db, emit=None)
    with connect(db) as con:
        assert load_ladder(con, "pub")[0] == rungs

    text = ok("ladder", "forecast", "pub", "--flops", "1e21")
    assert "forecast at C=1e+21 FLOPs" in text and "90% band [" in text
    assert "run-to-run noise 0.30% (1 sigma; the default" in text
    js = json.loads(ok("ladder", "forecast", "pub", "--flops", "1e21", "--json"))
    assert js["value"] == pytest.approx(law(1e21), rel=0.01)
    assert js["low"] <= law(1e21) <= js["high"]
    assert js["noise"] == {"value": 0.003, "source": "default"} and js["band"]["held_out"] == "measured"
    assert not (runs / "pub-huge").exists()  # a target without a loss is not a run
    # N and D as the rungs relate them: C = 6ND here, D = 2400 tokens per parameter
    js2 = json.loads(ok("ladder", "forecast", "pub", "--params", "2.04e8", "--json"))
    assert js2["flops"] == pytest.approx(6 * 2.04e8 * 2400 * 2.04e8, rel=0.02)
    assert "C = 6" in js2["flops_from"]
    js3 = json.loads(ok("ladder", "forecast", "pub", "--params", "1e9", "--tokens", "1e11", "--json"))
    assert js3["flops"] == pytest.approx(6e20, rel=1e-3)
    res = cli_run("ladder", "forecast", "pub")
    assert res.exit_code == 2 and "give the run's compute" in res.output
    js4 = json.loads(ok("ladder", "forecast", "pub", "--flops", "1e21", "--noise", "0.01", "--json"))
    assert (
        js4["noise"] == {"value": 0.01, "source": "given"}
        and js4["high"] - js4["low"] > js["high"] - js["low"]
    )


def test_import_json_with_curves_seeds_and_defaults(env):
    """JSON rows with the ladder and dataset as top-level defaults, two seeds a rung and curve points."""
    tmp, runs, db = env
    rows = []
    for i, c in enumerate((1e18, 3e18, 1e19, 3e19)):
        for seed, off in ((0, 0.996), (1, 1.004)):
            for frac in (0.5, 1.0):
                rows.append(
                    {"rung": f"r{i}", "flops": c, "seed": seed, "fraction": frac, "loss": law(c * frac) * off}
                )
    p = tmp / "pts.json"
    p.write_text(json.dumps({"ladder": "js", "dataset": "web/heldout", "rows": rows}))
    res = import_points(p, runs, db)
    assert sorted(res.runs) == sorted(f"js-r{i}-s{s}" for i in range(4) for s in (0, 1))
    assert res.ingest is not None and res.ingest.rejected == 0
    with connect(db) as con:
        rungs, _, ds = load_ladder(con, "js")
    assert ds == "web/heldout" and len(rungs) == 8
    assert rungs[0].steps == 1000 and set(rungs[0].curve) == {0.5, 1.0}
    fit = fit_ladder(rungs, FitConfig(n_boot=50))
    assert fit.noise_source == "seeds (dof 4)" and fit.noise == pytest.approx(0.008 / math.sqrt(2), rel=0.05)
    assert set(fit.laws) == {0.5, 1.0}


def test_import_errors_name_the_row_and_the_field_and_write_nothing(env):
    tmp, runs, db = env
    p = tmp / "bad.csv"
    p.write_text(
        "ladder,rung,flops,loss,step,fraction,steps,run,seed\n"
        "b,a,1e18,3.0,,,,,\n"  # line 2: fine
        "b,c,1e19,,,,,,\n"  # line 3: a rung without its loss
        "b,d,1e20,2.5,0,,,,\n"  # line 4: an eval at step 0
        "b,e,-5,2.4,,,,,\n"  # line 5: flops not > 0
        "b,f,1e21,2.3,,,,x-1e+18,\n"  # line 6: a run id with a +
        "b,g,1e22,2.2,,1.5,,,\n"  # line 7: fraction past 1
        "b,h,1e23,2.1,50,,100,,\n"  # line 8: a curve without its final point
        "b,a,2e18,3.0,,,,,1\n"
    )  # line 9: a seed of rung a with other compute
    with pytest.raises(PointsError) as e:
        import_points(p, runs, db)
    msg = str(e.value)
    assert "line 3, field loss: missing" in msg
    assert "line 4, field step: 0 is before any training" in msg
    assert "line 5, field flops: '-5' must be > 0" in msg
    assert "line 6, field run: 'x-1e+18' is not a run id" in msg and "e.g. 'x-1e18'" in msg
    assert "line 7, field fraction: 1.5 must be in (0, 1]" in msg
    assert (
        "run b-h (lines 8): no loss at 100% of its schedule (its last point, line 8, is at step 50 of 100)"
        in msg
    )
    assert "line 9, field flops: rung 'a' of ladder 'b' has C=1e+18 at line 2" in msg
    assert not runs.exists() or not any(runs.iterdir())  # nothing written
    res = cli_run("ladder", "import", p)
    assert res.exit_code == 1 and "line 3, field loss" in res.output
    j = tmp / "bad.json"
    j.write_text(json.dumps([{"ladder": "b", "rung": "a", "flops": "lots", "loss": 3}]))
    with pytest.raises(PointsError, match="item 1, field flops: could not convert"):
        import_points(j, runs, db)


# --------------------------------------------- hand-written logs: each gets its own message


def _rung(runs, run, flops, *, evals=(), metrics=(), steps=100):
    with observatory.init(
        run_id=run,
        runs_dir=runs,
        ladder={"name": "hw", "rung": run, "flops": flops, "steps": steps},
        install_signal_handlers=False,
    ) as r:
        for step, loss in metrics:
            r.log({"eval/loss": loss}, step=step)
        for step, loss in evals:
            r.event("eval", {"dataset": "d", "loss": loss}, step=step)


@pytest.mark.parametrize(
    "how, expect",
    [
        ("no_final", "no eval at its last step 100 (its last eval is at step 90, 90%)"),
        ("step0", "its only eval is at step 0, before any training"),
        ("metric", "it logs its loss as a metric (eval/loss in `metrics` events), not as an `eval` event"),
    ],
)
def test_each_missing_final_eval_says_why(env, how, expect):
    """Before issue 39 all three ended in the same "fewer than 2 rungs have a final (100%) eval"."""
    _, runs, db = env
    _rung(runs, "hw-a", 1e18, evals=[(100, 3.0)])
    kw = {
        "no_final": {"evals": [(50, 3.2), (90, 2.9)]},
        "step0": {"evals": [(0, 2.8)]},
        "metric": {"metrics": [(100, 2.8)]},
    }[how]
    _rung(runs, "hw-b", 1e19, **kw)
    ingest(runs, db, emit=None)
    res = cli_run("ladder", "fit", "hw", "--fix-e", "1.0")
    assert res.exit_code == 1
    assert "rung hw-b (run hw-b): " + expect in res.output, res.output


def test_a_rejected_run_id_fails_ingest_and_is_named_by_the_ladder(env):
    """A run id like x-1e+18 is rejected line by line; ingest used to exit 0 and the ladder lost a rung
    without a word."""
    _, runs, db = env
    for i, c in enumerate((1e18, 1e19, 1e20)):
        _rung(runs, f"hw-{i}", c, evals=[(100, law(c))])
    bad = runs / "hw-1e+21"
    bad.mkdir()
    start = {
        "v": 1,
        "run": "hw-1e+21",
        "kind": "run_start",
        "step": None,
        "t": 1.0,
        "host": 0,
        "seq": 0,
        "data": {"config": {}, "ladder": {"name": "hw", "rung": "1e+21", "flops": 1e21}},
    }
    ev = {**start, "kind": "eval", "step": 100, "seq": 1, "data": {"dataset": "d", "loss": 2.0}}
    (bad / "events.0.jsonl").write_text(json.dumps(start) + "\n" + json.dumps(ev) + "\n")
    res = cli_run("ingest", "-q")
    assert res.exit_code == 1
    assert "lines of 1 run folder(s) rejected for their run id, so not in the store: hw-1e+21" in res.output
    assert "e.g. 1e18 for 1e+18" in res.output
    res = cli_run("ladder", "fit", "hw", "--no-backtest")
    assert res.exit_code == 0, res.output
    assert "warning: run folder 'hw-1e+21' names ladder 'hw' but ingest rejected" in res.output
    assert "e.g. 'hw-1e21'" in res.output


# ------------------------------------------------------------------ the band


def _rungs(flops, f=law):
    return [Rung(run=f"r{i}", rung=f"r{i}", flops=c, curve={1.0: f(c)}) for i, c in enumerate(flops)]


def test_three_rungs_with_e_free_warn_and_widen_the_band():
    """E, A and alpha through 3 rungs leave nothing to measure the error with: the held-out error the
    band used read +0.00% (it borrowed E from the fit that saw the held-out rung)."""
    rungs = _rungs([1e18, 4e18, 1.6e19], lambda c: law(c) * (1.004 if c == 4e18 else 1.0))
    fit = fit_ladder(rungs, FitConfig(noise=0.0))
    assert fit.held_out == "proxy" and "no rung is left over to measure" in fit.warnings[0]
    assert fit.loo_halfwidth(1.0) > 0.002  # the E = 0 law's error on the largest rung, not ~0
    four = fit_ladder(_rungs([1e18, 4e18, 1.6e19, 6.4e19]), FitConfig(noise=0.0))
    assert four.held_out == "measured" and not four.warnings
    # two rungs with E fixed: nothing at all to measure with: no band, and no pre-registered forecast
    two = fit_ladder(_rungs([1e18, 1e19]), FitConfig(fix_e=1.5))
    assert two.held_out == "none" and not two.has_band and "no band" in two.warnings[0]
    v, lo, hi = two.predict(1.0, [1e21])
    assert math.isfinite(v[0]) and math.isnan(lo[0]) and math.isnan(hi[0])


def test_three_rungs_warn_in_the_cli_and_a_bandless_forecast_is_not_pre_registered(env):
    tmp, runs, db = env
    p = tmp / "three.csv"
    p.write_text(
        "ladder,rung,flops,loss\n"
        + "".join(f"t3,r{i},{c},{law(c):.5f}\n" for i, c in enumerate((1e18, 4e18, 1.6e19)))
    )
    ok("ladder", "import", p)
    res = cli_run("ladder", "forecast", "t3", "--flops", "1e20")
    assert res.exit_code == 0 and "warning: 3 rungs and 3 free parameters (E, A, α)" in res.output
    assert "held-out error NOT measurable" in res.output
    res = cli_run("ladder", "forecast", "t3", "--flops", "1e20", "--fix-e", "1.7", "--target", "t3-big")
    assert res.exit_code == 0  # E fixed: 3 rungs, 2 parameters, one rung left to measure with
    fc = json.loads(findings.path(runs, "t3-big").read_text().splitlines()[0])["data"]
    assert fc["source"]["held_out"] == "measured" and fc["source"]["noise_source"] == "default"
    assert "(3 unchanged)" in ok("ladder", "import", p)
    q = tmp / "two.csv"
    q.write_text("ladder,rung,flops,loss\nt2,a,1e18,3.0\nt2,b,1e19,2.8\n")
    ok("ladder", "import", q)
    res = cli_run("ladder", "forecast", "t2", "--flops", "1e21", "--fix-e", "1.5")
    assert res.exit_code == 0 and "no band (see the warning)" in res.output
    res = cli_run("ladder", "forecast", "t2", "--flops", "1e21", "--fix-e", "1.5", "--target", "t2-big")
    assert res.exit_code == 1 and "no band to pre-register for t2-big" in res.output
    assert not (runs / "t2-big").exists()


def test_e_range_carries_es_uncertainty_into_the_band():
    """Chinchilla-like points fit with E fixed a little high miss the actual (the band left E's own
    uncertainty out); E's range carried into the band covers it."""
    rungs = _rungs([6e18, 3e19, 1.5e20, 8e20], chinchilla)
    target, actual = 5.76e23, chinchilla(5.76e23)
    fixed = fit_ladder(rungs, FitConfig(fix_e=1.8)).forecast(target).final
    assert not (fixed.low <= actual <= fixed.high)
    fit = fit_ladder(rungs, FitConfig(fix_e=1.8, e_range=(1.5, 1.9)))
    fin = fit.forecast(target).final
    assert fin.value == pytest.approx(fixed.value)  # the forecast is the fit at --fix-e
    assert fin.low <= actual <= fin.high
    assert sorted(f.final.E for f in fit.e_fits) == pytest.approx([1.5, 1.6, 1.7, 1.9])
    assert fit.summary()["band"]["e_range"] == [1.5, 1.9]
    with pytest.raises(ValueError, match="below the smallest observed loss"):
        fit_ladder(rungs, FitConfig(e_range=(1.5, 9.0)))
    with pytest.raises(ValueError, match="must lie inside --e-range"):
        FitConfig(fix_e=2.0, e_range=(1.5, 1.9))


@pytest.mark.slow
def test_the_ladder_page_shows_an_imported_ladder(env):
    from streamlit.testing.v1 import AppTest

    tmp, runs, db = env
    ok("ladder", "import", write_csv(tmp))
    p = tmp / "three.csv"
    p.write_text(
        "ladder,rung,flops,loss\n"
        + "".join(f"t3,r{i},{c},{law(c):.5f}\n" for i, c in enumerate((1e18, 4e18, 1.6e19)))
    )
    ok("ladder", "import", p)
    at = AppTest.from_string(
        "from observatory.dashboard.pages import ladder\nladder.render()\n", default_timeout=120
    )
    at.query_params["ladder"] = "pub"
    at.run()
    assert not at.exception, at.exception
    assert at.metric[0].value == "4"
    infos = " ".join(i.value for i in at.info)
    assert "not pre-registered; the fit above forecasts" in infos and "inside the band" in infos
    captions = " ".join(c.value for c in at.caption)
    assert "Run-to-run noise 0.30% per run" in captions and "the default" in captions
    at.query_params["ladder"] = "t3"
    at.run()
    assert not at.exception, at.exception
    assert any("3 rungs and 3 free parameters" in w.value for w in at.warning)


def test_an_imported_ladders_page_says_its_backtest_and_the_forecast_asked_for(env):
    """Final losses alone: the backtest is said (the largest rung from the others), not one point on a step
    axis; the rungs table has no "None"; the CLI's `--flops` forecast links to the page, which shows it."""
    from streamlit.testing.v1 import AppTest

    tmp, runs, db = env
    ok("ladder", "import", write_csv(tmp))
    printed = ok("ladder", "forecast", "pub", "--flops", "5.76e23")
    final = re.search(r"final eval loss (\d\.\d{4}), 90% band \[(\d\.\d{4}), (\d\.\d{4})\]", printed)
    link = re.search(r"on the dashboard: \S+/ladder\?ladder=pub&flops=(\S+)", printed)
    assert final and link, printed
    at = AppTest.from_string(
        "from observatory.dashboard.pages import ladder\nladder.render()\n", default_timeout=120
    )
    at.query_params["ladder"] = "pub"
    at.query_params["flops"] = link.group(1)
    at.run()
    assert not at.exception, at.exception
    keys = [c.proto.id for c in at.get("plotly_chart")]
    assert not any("ladder_backtest" in k for k in keys)  # no one-point curve on a step axis
    text = " ".join(m.value for m in at.markdown).replace("\\", "")  # as shown: md_escape's backslashes off
    assert "The largest rung, xl (C = 6.4e+19 FLOPs), forecast from the smaller rungs" in text
    v, lo, hi = final.groups()
    assert f"Forecast at C = 5.76e+23 FLOPs: final eval loss {v} [{lo}, {hi}] (90% band)" in text
    table = at.dataframe[0].value
    assert not table.isna().any().any() and "None" not in table.astype(str).to_numpy()
    assert list(table.columns) == [
        "rung",
        "run",
        "active params",
        "tokens",
        "FLOPs",
        "final eval loss",
        "fit",
    ]


def test_the_ladder_page_fits_once_per_data_version_and_shows_a_stored_fit_at_once(env, monkeypatch):
    """The first visit fits and stores the fit beside the store; a later process (a restarted dashboard)
    shows it without fitting; when the rungs change, the older fit is shown with "refitting…" beside it
    while the new version is fitted and stored."""
    import streamlit as st
    from streamlit.testing.v1 import AppTest

    from observatory.dashboard.pages import ladder as page
    from observatory.ladder import stored

    tmp, runs, db = env
    ok("ladder", "import", write_csv(tmp))
    script = "from observatory.dashboard.pages import ladder\nladder.render()\n"

    def visit():
        st.cache_data.clear()  # a new process: nothing fitted in memory
        at = AppTest.from_string(script, default_timeout=120)
        at.query_params["ladder"] = "pub"
        at.run()
        assert not at.exception, at.exception
        return at

    first = visit().metric[1].value
    assert len(list(stored.folder(db).glob("*.pkl"))) == 1
    fits = []
    real = page.fit_ladder
    monkeypatch.setattr(page, "fit_ladder", lambda *a, **k: fits.append(1) or real(*a, **k))
    again = visit()
    assert fits == [] and again.metric[1].value == first  # the stored fit, not a new one
    assert not any("refitting" in c.value for c in again.caption)
    # a rung's loss changes (the xl rung's point reimported): a new data version
    p = write_csv(tmp)
    p.write_text(
        p.read_text().replace(f"pub,xl,6.4e19,{law(6.4e19):.5f}", f"pub,xl,6.4e19,{law(6.4e19) + 0.01:.5f}")
    )
    ok("ladder", "import", p, "--replace")
    monkeypatch.setattr(page, "_fit", lambda *a: (_ for _ in ()).throw(RuntimeError("still fitting")))

    def stale_visit():
        at = AppTest.from_string(script, default_timeout=120)
        at.query_params["ladder"] = "pub"
        at.run()
        # the page reads the new rungs once the query cache's answer (cache_ttl_s) is past
        return at if any("refitting" in c.value for c in at.caption) else None

    # drawn at once with the older fit and "refitting…" beside it, before the refit (here: cut short)
    stale = wait_until(stale_visit, timeout=30, every=0.5, what="the older fit with 'refitting…'")
    assert stale.metric[1].value == first
