"""`observatory isoflop` and `observatory sweep ...` over a real store (the CLI/JSON twins of the
Sweeps page's views), and the iso-FLOP fit of the simulated grid against its stated ground truth."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sweep_fixtures import make_sweep_store

from observatory.cli import main
from observatory.decisions import store as decisions
from observatory.interop.simulate_isoflop import TRUTH, optimum


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_sweep_store(tmp_path_factory.mktemp("sweeps-cli"))


def cli(store, *args):
    runs_dir, db = store
    res = CliRunner().invoke(main, [*args, "--runs-dir", str(runs_dir), "--db", str(db)])
    return res


def test_isoflop_json_recovers_the_simulated_truth(store):
    res = cli(store, "isoflop", "ladder = isoflop-sim", "--metric", "eval:eval", "--budget", "1e19", "--json")
    assert res.exit_code == 0, res.output
    view = json.loads(res.output)
    fit = view["fit"]
    assert len(view["cells"]) == 20 and view["skipped"] == [] and fit["noise_from"] == "residuals"
    a, b = TRUTH["alpha"], TRUTH["beta"]
    for f in fit["budgets"]:
        n_opt, d_opt = optimum(f["budget"])
        assert f["status"] == "ok" and f["params_from"] == "fit"
        assert f["tokens"] == pytest.approx(d_opt, rel=0.25)  # 5 sizes over 16x, loss noise 0.005
        assert f["params"] == pytest.approx(n_opt, rel=0.25)
    fr = fit["frontier"]
    assert fr["a_n"] == pytest.approx(b / (a + b), abs=0.06) and fr["a_d"] == pytest.approx(
        a / (a + b), abs=0.06
    )
    assert fr["a_n_lo"] < fr["a_n"] < fr["a_n_hi"]
    rec = fit["recommendation"]
    assert rec["params_lo"] < optimum(1e19)[0] < rec["params_hi"]


def test_isoflop_text_says_what_is_missing(store):
    res = cli(store, "isoflop", "project = lr", "--metric", "train/loss")
    assert res.exit_code == 1 and "no cells: 3 run(s) selected, 3 with train/loss" in res.output
    ok = cli(store, "isoflop", "ladder = isoflop-sim and config.budget <= 1e17", "--metric", "eval:eval")
    assert ok.exit_code == 0, ok.output
    assert "1e+17   5" in ok.output and "noise:" in ok.output
    bad = cli(store, "isoflop", "ladder == x", "--metric", "eval:eval")
    assert bad.exit_code == 1 and "at character 9" in bad.output and "Traceback" not in bad.output


def test_sweep_runs_values_table_curves(store):
    r = json.loads(cli(store, "sweep", "runs", "project = lr", "--json").output)
    assert r["selected"] == 3 and {x["run"] for x in r["runs"]} == {"lr-a", "lr-a-fork", "lr-b"}
    v = json.loads(
        cli(
            store,
            "sweep",
            "values",
            "ladder = isoflop-sim",
            "--metric",
            "eval:eval",
            "--key",
            "config.budget",
            "--json",
        ).output
    )
    assert len(v["rows"]) == 20 and "config.budget" in v["rows"][0]["keys"]
    t = cli(
        store,
        "sweep",
        "table",
        "ladder = isoflop-sim",
        "--metric",
        "eval:eval",
        "--rows",
        "config.budget",
        "--cols",
        "config.model.width",
        "--json",
    )
    pv = json.loads(t.output)
    assert pv["rows"] == ["1e+17", "3e+17", "1e+18", "3e+18"]
    assert sum(len(runs) for row in pv["cells"].values() for runs in row.values()) == 20
    curves = ("sweep", "curves", "ladder = isoflop-sim", "--metric", "train/loss", "--by", "config.budget")
    c = json.loads(cli(store, *curves, "--x", "flops", "--max-groups", "2", "--json").output)
    assert c["matched_groups"] == 4 and len(c["groups"]) == 2 and c["points"]
    text = cli(store, *curves, "--max-groups", "2")
    assert "20 run(s) in 4 group(s); drawing the 2 largest" in text.output


def test_compare_recovers_the_variant_multiplier_and_records_it(store):
    res = cli(
        store,
        "sweep",
        "compare",
        "ladder = isoflop-sim",
        "ladder = isoflop-var",
        "--metric",
        "eval:eval",
        "--record",
        "variant vs baseline",
        "--json",
    )
    assert res.exit_code == 0, res.output
    view = json.loads(res.output)
    m = view["multiplier"]
    # the variant is worth 1.4x the compute: it reaches a loss with 1/1.4 = 0.71x the compute
    assert m["value"] == pytest.approx(1 / 1.4, rel=0.03)
    assert m["lo"] < 1 / 1.4 < m["hi"] and m["lo"] < m["value"] < m["hi"]
    assert view["text"].startswith("reaches the baseline's loss with 0.")
    d = decisions.get(store[1], view["decision"])
    ev = d.evidence[0]
    assert ev["kind"] == "compute_multiplier" and ev["value"] == m["value"]
    assert len(ev["baseline"]["runs"]) == 20 and ev["variant"]["selection"] == "ladder = isoflop-var"
    assert len(d.runs) == 40


def test_compare_says_when_the_variant_never_reaches_the_baseline(store):
    # the lr runs have no budget: no envelope at all; the grid against a slice of itself that is far worse
    res = cli(
        store, "sweep", "compare", "ladder = isoflop-sim", "project = lr", "--metric", "eval:eval", "--json"
    )
    view = json.loads(res.output)
    assert res.exit_code == 0 and view["multiplier"] is None
    assert "variant: an envelope needs runs at 2 or more budgets, got 0" in view["message"]
    text = cli(store, "sweep", "compare", "ladder = isoflop-sim", "project = lr", "--metric", "eval:eval")
    assert text.exit_code == 1 and "variant: an envelope needs" in text.output


def test_published_cells_imported_as_a_ladder_table_fit_through_the_cli(tmp_path):
    """The CSV path of docs/ladder.md: marin #8003's cells as `ladder import` rows, then `observatory isoflop`."""
    from test_isoflop import MARIN_8003, MARIN_8003_OPTIMA

    from observatory.interop.ladder_points import import_points

    csv = tmp_path / "marin-8003.csv"
    csv.write_text(
        "ladder,rung,flops,tokens,loss,source\n"
        + "".join(f"marin-8003,{c:.0e}-{w},{c},{int(d)},{loss},marin #8003\n" for c, w, d, loss in MARIN_8003)
    )
    runs_dir, db = tmp_path / "runs", tmp_path / "s.duckdb"
    import_points(csv, runs_dir, db)
    res = CliRunner().invoke(
        main,
        [
            "isoflop",
            "ladder = marin-8003",
            "--metric",
            "eval:eval",
            "--json",
            "--runs-dir",
            str(runs_dir),
            "--db",
            str(db),
        ],
    )
    assert res.exit_code == 0, res.output
    fit = json.loads(res.output)["fit"]
    for b in fit["budgets"]:
        tokens, loss = MARIN_8003_OPTIMA[b["budget"]]
        assert b["tokens"] == pytest.approx(tokens, rel=0.005) and round(b["loss"], 3) == loss


def test_a_nan_final_value_is_json_null(tmp_path):
    from observatory.interop import RunLogBuilder, ingest_runs

    b = RunLogBuilder("nan-run")
    b.start(1.7e9, {"lr": 1})
    b.add("metrics", {"train/loss": 2.0}, 1, 1.7e9 + 1)
    b.add("metrics", {"train/loss": float("nan")}, 2, 1.7e9 + 2)
    b.write(tmp_path / "runs")
    ingest_runs(tmp_path / "runs", tmp_path / "s.duckdb")
    res = cli(
        (tmp_path / "runs", tmp_path / "s.duckdb"), "sweep", "values", "", "--metric", "train/loss", "--json"
    )
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["rows"][0]["value"] is None
