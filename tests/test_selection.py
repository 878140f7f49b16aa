"""Run selection (observatory.queries.selection) and the sweep queries over a real store."""

from __future__ import annotations

import re

import pytest
from sweep_fixtures import make_sweep_store

from observatory.queries.selection import MAX_TEXT, SelectionError, parse_selection
from observatory.queries.sweeps import count_selected, final_values, group_curves, select_runs, sweep_keys
from observatory.store import connect


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    _, db = make_sweep_store(tmp_path_factory.mktemp("sweeps"))
    with connect(db) as con:
        yield con


def ids(con, text):
    return sorted(r["run"] for r in select_runs(con, text, limit=None))


def test_parse_grammar():
    s = parse_selection(
        "project = lr and config.optimizer.lr > 1e-3 ; config.model.width in (768, 'x y') and finished"
    )
    assert [(c.field, c.op, c.values) for c in s.clauses] == [
        ("project", "=", ("lr",)),
        ("config.optimizer.lr", ">", (1e-3,)),
        ("config.model.width", "in", (768.0, "x y")),
        ("status", "=", ("completed",)),
    ]
    assert parse_selection("").clauses == ()
    assert parse_selection("started >= 2026-11-01").clauses[0].values == (1793491200.0,)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("projekt = x", "unknown field 'projekt'"),
        ("project =", "at the end: expected a value"),
        ("project = x or name = y", "at character 13: expected and"),
        ("config.a'b = 1", "at character"),
        ("config.a.b.c.d.e.f.g.h.i = 1", "at most 8 segments"),
        ("name in (a, b", "at the end: expected , or )"),
        ("started > yesterday", "is not a date"),
        ("project = x and", "expected a clause after and"),
        ("config.x = 1; DROP TABLE runs", "at character 15: unknown field 'DROP'"),
    ],
)
def test_bad_selections_say_where(text, message):
    with pytest.raises(SelectionError, match=re.escape(message)):
        parse_selection(text)


def test_bounds():
    with pytest.raises(SelectionError, match=f"at most {MAX_TEXT}"):
        parse_selection("name = " + "x" * MAX_TEXT)
    with pytest.raises(SelectionError, match="at most 32"):
        parse_selection(" and ".join(["finished"] * 33))
    with pytest.raises(SelectionError, match="at most 256"):
        parse_selection("name in (" + ", ".join(map(str, range(300))) + ")")


def test_restarts_fold_into_their_run(store):
    rows = {r["run"]: r for r in select_runs(store, "project = lr", limit=None)}
    assert sorted(rows) == ["lr-a", "lr-a-fork", "lr-b"]  # lr-a-r1 is an attempt of lr-a
    a = rows["lr-a"]
    assert a["attempts"] == ["lr-a", "lr-a-r1"] and a["last"] == "lr-a-r1"
    assert a["status"] == "completed" and a["last_step"] == 100  # the newest attempt's
    assert ids(store, "project = lr and finished") == ["lr-a", "lr-a-fork"]


def test_fields_and_config_values(store):
    assert ids(store, "config.optimizer.lr > 1e-3 and project = lr") == ["lr-b"]
    assert ids(store, "config.optimizer.lr <= 1e-3 and project = lr") == ["lr-a", "lr-a-fork"]
    assert ids(store, "config.optimizer.lr in (0.0005, 0.003) and group = lr-sweep") == ["lr-a-fork", "lr-b"]
    assert ids(store, "tag = 'hot lr'") == ["lr-b"]
    assert ids(store, "tag in (seed0, seed1)") == ["lr-a", "lr-b"]
    assert ids(store, "name ~ FORK") == ["lr-a-fork"]
    assert ids(store, "status = failed") == ["lr-b"]
    assert ids(store, "group = lr-sweep and status != failed") == ["lr-a", "lr-a-fork"]
    assert len(ids(store, "ladder = isoflop-sim and config.budget = 1e18")) == 5
    assert len(ids(store, "ladder.budget >= 1e18 and project = variant")) == 10
    assert ids(store, "started < 1780000001") == ["isoflop-sim-1e17-n0", "isoflop-var-1e17-n0"]
    assert ids(store, "started >= 2026-09-21T00:00:00") == ["lr-a", "lr-a-fork", "lr-b"]
    assert count_selected(store, "") == 40 + 3


def test_tag_clauses_and_a_restart_kept_by_its_own_labels(store):
    # lr-a-r1 has no tags, so `tag != seed0` keeps it before the fold: it is still lr-a's attempt, never a run
    assert ids(store, "tag != seed0 and project = lr") == ["lr-a-fork", "lr-b"]
    assert ids(store, "tag != 'hot lr' and tag != seed1 and project = lr") == ["lr-a", "lr-a-fork"]
    assert ids(store, "tag ~ HOT") == ["lr-b"]
    assert ids(store, "tag in (nothing, 'hot lr')") == ["lr-b"]
    assert ids(store, "tag = seed0 and config.optimizer.lr > 1e-4") == ["lr-a"]
    assert select_runs(store, "tag = seed0")[0]["attempts"] == ["lr-a", "lr-a-r1"]


def test_the_lean_selection_agrees_with_the_full_one(store):
    from observatory.queries.sweeps import selected_roots

    # ids and counts read no JSON column, and no status unless a clause names it (status, ended, finished)
    for text in (
        "project = lr",
        "project = lr and finished",
        "tag != seed0 and project = lr",
        "status = failed",
        "",
    ):
        assert selected_roots(store, text) == ids(store, text), text
        assert count_selected(store, text) == len(ids(store, text)), text
    assert selected_roots(store, "project = lr and finished") == [
        "lr-a",
        "lr-a-fork",
    ]  # lr-a: its restart's status


def test_hostile_text_is_a_value_not_sql(store):
    assert ids(store, 'name = "x\' OR 1=1 --"') == []
    assert ids(store, "config.optimizer.lr = '1; DROP TABLE runs'") == []
    assert count_selected(store, "") == 43  # the table is still there


def test_final_values_eval_and_metric_with_keys(store):
    got = final_values(
        store, "ladder = isoflop-sim", "eval:eval", keys=["config.budget", "config.model.width"]
    )
    assert len(got["rows"]) == 20 and got["missing"] == 0 and not got["truncated"]
    r = got["rows"][0]
    assert r["budget"] == 1e17 and r["tokens"] > 0 and r["params"] > 0 and 2 < r["value"] < 5
    assert set(r["keys"]) == {"config.budget", "config.model.width"}
    m = final_values(store, "project = lr", "train/loss")
    by = {r["run"]: r["value"] for r in m["rows"]}
    assert by["lr-a"] == pytest.approx(3.0 - 0.01 * 100)  # the newest attempt's last value
    best = final_values(store, "project = lr", "train/loss", best=True)
    assert {r["run"]: r["value"] for r in best["rows"]}["lr-b"] == pytest.approx(3.0 - 0.01 * 30)
    none = final_values(store, "project = lr", "eval:eval")
    assert none["rows"] == [] and none["missing"] == 3


def test_group_curves_mean_band_and_bound(store):
    g = group_curves(
        store, "ladder = isoflop-sim", "train/loss", keys=["config.budget"], x="tokens", max_groups=3
    )
    assert g["matched_groups"] == 4 and len(g["groups"]) == 3 and g["runs"] == 20
    d = g["data"]
    assert set(d["group"].unique()) == {x["group"] for x in g["groups"]}
    assert (d["n"] == 5).all() and (d["min"] <= d["mean"]).all() and (d["mean"] <= d["max"]).all()
    assert (d["x"] > 0).all()
    one = group_curves(store, "project = lr", "train/loss", x="step")
    assert one["groups"] == [{"group": "all", "n": 3}]


def test_sweep_keys(store):
    keys = sweep_keys(store, "ladder = isoflop-sim")
    assert {"config.budget", "config.model.width", "config.optimizer.lr"} <= set(keys)


def test_resolved_roots_give_the_same_views_as_the_text(store):
    from observatory.queries.sweeps import selected_roots

    text = "project = lr"
    roots = selected_roots(store, text)
    assert roots == ["lr-a", "lr-a-fork", "lr-b"]  # lr-a-r1 folded into lr-a
    by_text = final_values(store, text, "train/loss", ["config.optimizer.lr"])
    by_roots = final_values(store, roots, "train/loss", ["config.optimizer.lr"])
    assert by_roots["rows"] == by_text["rows"] and by_roots["selected"] == 3
    assert {r["run"]: r["attempts"] for r in select_runs(store, roots)}["lr-a"] == ["lr-a", "lr-a-r1"]
    assert selected_roots(store, "", limit=2) == ["isoflop-sim-1e17-n0", "isoflop-sim-1e17-n1"]


def test_a_parent_cycle_folds_nothing(tmp_path):
    from observatory.interop import RunLogBuilder, ingest_runs

    for run, parent in (("cyc-a", "cyc-b"), ("cyc-b", "cyc-a")):
        b = RunLogBuilder(run)
        b.start(1.7e9, {"lr": 1}, name="same", parent={"run": parent, "step": 1})
        b.add("run_end", {"status": "completed", "final_step": 1}, 1, 1.7e9 + 1)
        b.write(tmp_path / "runs")
    ingest_runs(tmp_path / "runs", tmp_path / "s.duckdb")
    with connect(tmp_path / "s.duckdb") as con:
        assert {r["run"]: r["attempts"] for r in select_runs(con, "")} == {
            "cyc-a": ["cyc-a"],
            "cyc-b": ["cyc-b"],
        }


def test_a_restarted_runs_curve_is_stitched_and_wall_time_counts_from_its_start(store):
    # lr-a logged steps 1-50 (preempted), lr-a-r1 resumed at 50 and logged 50-100: one curve of 100 steps
    g = group_curves(store, "run = lr-a", "train/loss", x="step", max_points=1000)
    d = g["data"]
    assert g["runs"] == 1 and d["x"].to_list() == list(range(1, 101)) and (d["n"] == 1).all()
    assert d["mean"].to_list()[-1] == pytest.approx(3.0 - 0.01 * 100)
    t = group_curves(store, "run = lr-a", "train/loss", x="time", max_points=1000)["data"]
    assert t["x"].to_list()[0] == pytest.approx(0.0) and t["x"].to_list()[-1] == pytest.approx(99.0)


def test_best_is_over_every_attempt_and_final_is_the_newest(tmp_path):
    from observatory.interop import RunLogBuilder, ingest_runs

    # the first attempt reached 1.0 before it died; the restart never got below 2.0
    for run, parent, t0, losses in (
        ("x", None, 1.7e9, [3.0, 1.0, 2.5]),
        ("x-r1", {"run": "x", "step": 3}, 1.8e9, [2.2, 2.0]),
    ):
        b = RunLogBuilder(run)
        b.start(t0, {"lr": 1}, name="x", parent=parent)
        for i, v in enumerate(losses):
            b.add("metrics", {"train/loss": v}, (parent["step"] if parent else 0) + i + 1, t0 + i)
        b.write(tmp_path / "runs")
    ingest_runs(tmp_path / "runs", tmp_path / "s.duckdb")
    with connect(tmp_path / "s.duckdb") as con:
        best = final_values(con, "", "train/loss", best=True)["rows"]
        final = final_values(con, "", "train/loss")["rows"]
    assert [(r["run"], r["attempts"], r["value"]) for r in best] == [("x", ["x", "x-r1"], 1.0)]
    assert [(r["run"], r["value"]) for r in final] == [("x", 2.0)]
