"""A ladder end to end: event logs -> ingest -> fit -> pre-registered forecast -> target -> deviation anomaly.

The fast tests write real event logs with `observatory.init` (rungs whose eval losses
follow a known law), ingest them into a real DuckDB file and drive the real CLI.
The slow test trains real targets with the trainer against the committed sample
ladder: a clean one and one pushed off course with `inject=lr_spike`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import observatory
from observatory import findings
from observatory.cli import main as cli
from observatory.ladder.rungs import DETECTOR, FIT_VERSION
from observatory.ladder.watch import check_targets, forecast_band
from observatory.pipeline import ingest
from observatory.store import connect

pytestmark = pytest.mark.slow  # each test ingests a store and fits a ladder (seconds)

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "samples"
E, A, ALPHA = 2.0, 800.0, 0.25
STEPS = 100


def law(c, f=1.0):
    return E + A * (f * c) ** -ALPHA


def write_run(
    runs_dir,
    run_id,
    flops,
    *,
    target=False,
    push=None,
    seed=0,
    rung=None,
    ladder_seed=None,
    offset=None,
    name="syn",
):
    """A run whose eval loss follows `law` (x `push` from 40% of the schedule on, if given).

    rung/ladder_seed: write it as seed `ladder_seed` of rung `rung` (ladder.seed in run_start);
    offset: the run's whole-curve log offset (default: a 0.1% random draw).
    """
    rng = np.random.default_rng(seed)
    ladder = {
        "name": name,
        "rung": "target" if target else (rung or run_id),
        "flops": flops,
        "steps": STEPS,
        "params_active": int(math.sqrt(flops / 12)),
        "tokens": int(math.sqrt(flops / 3)),
    }
    if ladder_seed is not None:
        ladder["seed"] = ladder_seed
    if target:
        ladder["target"] = True
    common = rng.normal(0, 0.001) if offset is None else offset
    with observatory.init(
        run_id=run_id,
        runs_dir=runs_dir,
        config={"steps": STEPS},
        ladder=ladder,
        install_signal_handlers=False,
    ) as run:
        for step in range(1, STEPS + 1):
            f = step / STEPS
            loss = law(flops, f) * math.exp(common + rng.normal(0, 0.0003))
            if push and f >= 0.4:
                loss *= push
            run.log({"train/loss": loss * 1.01}, step=step)
            if step % 5 == 0:
                run.event("eval", {"dataset": "syn/heldout", "loss": loss}, step=step)
    return run_id


RUNG_FLOPS = [1e10, 2.2e10, 5e10, 1.1e11]
TARGET_FLOPS = 4.4e11


@pytest.fixture
def ladder_store(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    for i, c in enumerate(RUNG_FLOPS):
        write_run(runs, f"syn-r{i}", c, seed=i)
    ingest(runs, db, emit=None)
    return runs, db


def invoke(*args):
    res = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def test_fit_json_and_list(ladder_store):
    runs, db = ladder_store
    assert "syn" in invoke("ladder", "list")
    out = json.loads(invoke("ladder", "fit", "syn", "--json"))
    fit = out["fit"]
    assert [r["run"] for r in fit["rungs"]] == [f"syn-r{i}" for i in range(4)]
    assert fit["final"]["E"] == pytest.approx(E, rel=0.15)
    assert set(fit["fractions"]) == {f"{0.05 * i:.2f}" for i in range(1, 21)}
    bt = out["backtest"]
    assert bt["held_out"] == "syn-r3"
    assert abs(bt["final_error_pct"]) < 1.0
    assert bt["coverage"] >= 0.9
    assert out["forecast"] is None  # no target yet
    text = invoke("ladder", "fit", "syn")
    assert "backtest" in text and "L(C) =" in text and "the band uses fwd" in text
    # the forward error (syn-r3 from syn-r0..r2) is the band's held-out term; --band picks another
    assert fit["config"]["loo"] == "forward" and set(fit["forward_final"]) == {"syn-r2", "syn-r3"}
    h = fit["fractions"]["1.00"]["loo_halfwidth"]
    assert h == pytest.approx(abs(fit["forward_final"]["syn-r3"]))
    old = json.loads(invoke("ladder", "fit", "syn", "--json", "--band", "max", "--no-backtest"))["fit"]
    assert old["fractions"]["1.00"]["loo_halfwidth"] == pytest.approx(
        max(abs(e) for e in old["loo_final"].values())
    )
    out = invoke(
        "ladder", "forecast", "syn", "--target", "syn-x", "--flops", "1e12", "--band", "none", "--dry-run"
    )
    assert '"band": "none"' in out


def test_fit_errors_are_clear(ladder_store):
    res = CliRunner().invoke(cli, ["ladder", "fit", "nope"])
    assert res.exit_code != 0 and "no ladder named 'nope'" in res.output
    res = CliRunner().invoke(cli, ["ladder", "fit", "syn", "--fix-e", "9"])
    assert res.exit_code != 0 and "below the smallest observed loss" in res.output


def _forecast_then_run(runs, db, run_id, push=None):
    invoke(
        "ladder", "forecast", "syn", "--target", run_id, "--flops", str(TARGET_FLOPS), "--steps", str(STEPS)
    )
    write_run(runs, run_id, TARGET_FLOPS, target=True, push=push, seed=7)
    ingest(runs, db, emit=None)


def test_forecast_is_pre_registered_and_clean_target_stays_inside(ladder_store):
    runs, db = ladder_store
    _forecast_then_run(runs, db, "syn-target")
    # on disk: the forecast (host 1000) was written before the target's run_start (host 0)
    fc = json.loads(findings.path(runs, "syn-target").read_text().splitlines()[0])
    start = json.loads((runs / "syn-target" / "events.0.jsonl").read_text().splitlines()[0])
    assert fc["kind"] == "forecast" and start["kind"] == "run_start"
    assert fc["t"] < start["t"]
    assert fc["data"]["pre_registered"] is True
    assert fc["data"]["source"]["ladder"] == "syn" and fc["data"]["source"]["fit_version"].startswith(
        FIT_VERSION + ":"
    )
    assert len(fc["data"]["points"]) == 20 and fc["data"]["target_step"] == STEPS
    # in the store, too
    with connect(db) as con:
        (t_fc,) = con.execute(
            "SELECT t FROM events WHERE kind = 'forecast' AND run = 'syn-target'"
        ).fetchone()
        (t_start,) = con.execute("SELECT start_time FROM runs WHERE run = 'syn-target'").fetchone()
    assert t_fc < t_start
    band = forecast_band(db, "syn-target")
    assert list(band.columns) == ["step", "fraction", "value", "low", "high"] and len(band) == 20
    assert check_targets(db, runs, ["syn-target"]) == []
    out = json.loads(invoke("ladder", "fit", "syn", "--json"))  # the target is found in the store
    assert out["forecast"]["target"] == "syn-target"
    assert out["forecast"]["final_inside"] is True
    assert sum(bool(p["inside"]) for p in out["forecast"]["points"]) >= 18


def test_target_pushed_off_course_gets_one_deviation_anomaly(ladder_store):
    runs, db = ladder_store
    _forecast_then_run(runs, db, "syn-pushed", push=1.08)
    found = check_targets(db, runs, ["syn-pushed"])
    found += check_targets(db, runs, ["syn-pushed"])  # idempotent before ingest (reads events.1000.jsonl)
    ingest(runs, db, emit=None)
    found += check_targets(db, runs, ["syn-pushed"])  # ... and after
    with connect(db) as con:
        rows = con.execute(
            "SELECT step, data FROM events WHERE kind = 'anomaly' AND run = 'syn-pushed' "
            "AND json_extract_string(data, '$.detector') = ?",
            [DETECTOR],
        ).fetchall()
    assert len(rows) == 1, rows
    d = json.loads(rows[0][1])
    assert d["window"][0] == 40  # the first eval after the push
    assert d["window"][1] - d["window"][0] >= 10  # k = 3 evals, 5 steps apart
    assert d["severity"] in ("warn", "critical") and "above" in d["message"]
    assert len(found) <= 1  # written once, whoever called first (ingest's hook or us)


def test_forecast_for_started_run_is_marked_not_pre_registered(ladder_store):
    runs, db = ladder_store
    write_run(runs, "syn-late", TARGET_FLOPS, target=True, seed=3)
    ingest(runs, db, emit=None)
    res = CliRunner().invoke(cli, ["ladder", "forecast", "syn", "--target", "syn-late"])
    assert res.exit_code == 0, res.output
    assert "NOT pre-registered" in res.output
    fc = json.loads(findings.path(runs, "syn-late").read_text().splitlines()[0])
    assert fc["data"]["pre_registered"] is False


@pytest.mark.skipif(
    not any(SAMPLES.glob("ladder-cpu-*/events.0.jsonl.gz")), reason="sample ladder not generated"
)
def test_real_trainer_lr_spike_leaves_the_band(tmp_path):
    """Real trainer runs against the committed sample ladder: the smallest rung's recipe retrained
    clean stays inside the band the ladder forecasts for it; with inject=lr_spike it leaves it."""
    pytest.importorskip("jax")
    from trainer.ladder import load_ladder_spec, plan
    from trainer.runtime import enable_compile_cache
    from trainer.train import train

    enable_compile_cache()  # the rung's shapes were compiled when the samples were made

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    spec = load_ladder_spec(ROOT / "trainer" / "configs" / "ladder_cpu.yaml")
    rungs, _ = plan(spec)
    for p in rungs:  # the sample rungs only (not the sample target)
        (runs / p.run_id).mkdir(parents=True)
        for f in (SAMPLES / p.run_id).glob("events.*.jsonl.gz"):
            (runs / p.run_id / f.name).write_bytes(f.read_bytes())
    ingest(runs, db, emit=None)
    rung = rungs[0]
    for run_id, extra in (("re-clean", ()), ("re-spike", ("inject=lr_spike@30:x30",))):
        from trainer.config import apply_overrides, from_dict

        cfg = from_dict(apply_overrides(rung.cfg.to_dict(), list(extra)))
        res = CliRunner().invoke(
            cli,
            [
                "ladder",
                "forecast",
                spec.name,
                "--target",
                run_id,
                "--runs-dir",
                str(runs),
                "--db",
                str(db),
                "--flops",
                repr(rung.ladder["flops"]),
                "--steps",
                str(rung.cfg.steps),
            ],
        )
        assert res.exit_code == 0, res.output
        train(cfg, runs, run_id=run_id, ladder={**rung.ladder, "rung": "target", "target": True})
    ingest(runs, db, emit=None)  # ingest's hook (anomalies.after_ingest) may already run the check
    found = {a["run"] for a in check_targets(db, runs, ["re-clean", "re-spike"])}
    ingest(runs, db, emit=None)
    with connect(db) as con:
        stored = {
            r[0]
            for r in con.execute(
                "SELECT run FROM events WHERE kind = 'anomaly' AND json_extract_string(data, '$.detector') = ?",
                [DETECTOR],
            ).fetchall()
        }
    assert "re-spike" in found | stored
    assert "re-clean" not in found | stored


def test_ladder_page_renders(ladder_store):
    from streamlit.testing.v1 import AppTest

    runs, db = ladder_store
    _forecast_then_run(runs, db, "syn-pushed", push=1.08)
    check_targets(db, runs, ["syn-pushed"])
    ingest(runs, db, emit=None)
    at = AppTest.from_string(
        "from observatory.dashboard.pages import ladder\nladder.render()\n", default_timeout=120
    ).run()
    assert not at.exception, at.exception
    assert [m.label for m in at.metric][:2] == ["Rungs", "α (final loss)"]
    assert at.metric[0].value == "4"
    text = " ".join(m.value for m in at.markdown)
    assert "outside" in text and "deviation" in text


def test_seeded_ladder_through_the_store(tmp_path, monkeypatch):
    """Two seeds per rung, written as separate runs with ladder.seed: the store counts 4 rungs of 8
    runs, the fit averages each rung's seeds, measures the seeds' spread as the run-to-run noise,
    and the forecast event names every seed run it used."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    for i, c in enumerate(RUNG_FLOPS):
        for k, off in enumerate((-0.004, 0.004)):  # seeds 0.8% apart: sd 0.57% in log loss
            write_run(
                runs,
                f"sd-r{i}" + (f"-s{k}" if k else ""),
                c,
                seed=10 * i + k,
                rung=f"r{i}",
                ladder_seed=k,
                offset=off,
                name="sd",
            )
    ingest(runs, db, emit=None)
    assert "sd                           4     8" in invoke("ladder", "list")
    out = json.loads(invoke("ladder", "fit", "sd", "--json"))
    fit = out["fit"]
    assert [(r["rung"], r["seeds"], r["runs"]) for r in fit["rungs"]] == [
        (f"r{i}", 2, [f"sd-r{i}", f"sd-r{i}-s1"]) for i in range(4)
    ]
    assert fit["noise"]["value"] == pytest.approx(0.008 / math.sqrt(2), rel=0.1)
    assert fit["noise"]["source"] == "seeds (dof 4)"
    assert abs(out["backtest"]["final_error_pct"]) < 1.0
    # the mean of the two seeds is (nearly) the law: the fit's final loss lands on it
    assert fit["rungs"][3]["final_loss"] == pytest.approx(law(RUNG_FLOPS[3]), rel=0.002)
    invoke(
        "ladder",
        "forecast",
        "sd",
        "--target",
        "sd-target",
        "--flops",
        str(TARGET_FLOPS),
        "--steps",
        str(STEPS),
    )
    fc = json.loads(findings.path(runs, "sd-target").read_text().splitlines()[0])["data"]
    assert len(fc["source"]["rungs"]) == 8 and fc["source"]["noise_source"] == "seeds (dof 4)"
    assert math.log(fc["high"] / fc["value"]) >= 1.645 * fc["source"]["noise"] * 0.99  # the target is one run
