"""The Sweeps page under streamlit's AppTest over a real store: every view draws from the URL's
selection, bad selections are said, more groups than drawn are said, and log writers' labels stay inert."""

from __future__ import annotations

import json
import re

import pytest
from dashboard_fixtures import chart_specs
from streamlit.testing.v1 import AppTest
from sweep_fixtures import make_sweep_store

from observatory.dashboard.pages import sweeps as sweeps_page
from observatory.interop import RunLogBuilder, ingest_runs

TIMEOUT = 60
HOSTILE = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    runs_dir, db = make_sweep_store(tmp_path_factory.mktemp("sweeps-page"))
    for i, width in enumerate((HOSTILE, "**bold** [x](javascript:alert(1))")):
        b = RunLogBuilder(f"evil-{i}")
        b.start(1.8e9 + i, {"model": {"width": width}, "optimizer": {"lr": 1e-3 * (i + 1)}}, project="evil")
        for s in range(1, 4):
            b.add("metrics", {"train/loss": 3.0 - s / 10 - i / 10}, s, 1.8e9 + i + s)
        b.add("run_end", {"status": "completed", "final_step": 3}, 3, 1.8e9 + i + 9)
        b.write(runs_dir)
    ingest_runs(runs_dir, db)
    with pytest.MonkeyPatch.context() as mp:  # the module's pages read this store
        mp.setenv("OBSERVATORY_DB", str(db))
        yield runs_dir, db


def page(**query) -> AppTest:
    at = AppTest.from_string(
        "from observatory.dashboard.pages import sweeps\nsweeps.render()\n", default_timeout=TIMEOUT
    )
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def text(at) -> str:
    return "\n".join(
        str(e.value) for kind in ("markdown", "caption", "info", "success", "error") for e in at.get(kind)
    )


QUERY = {
    "sel": "ladder = isoflop-sim",
    "metric": "eval:eval",
    "by": "config.budget",
    "var": "ladder = isoflop-var",
    "rows": "config.budget",
    "cols": "config.model.width",
    "budget": "1e19",
}


@pytest.mark.slow  # six script runs, ~7 s
def test_every_view_draws_from_the_url(store):
    at = page(**QUERY)
    assert not at.exception
    assert list(at.radio[0].options) == list(sweeps_page.VIEWS) and at.radio[0].value == "Curves"
    assert "20 run\\(s\\) selected" in text(at)
    kinds = {}
    for view in sweeps_page.VIEWS:
        at = page(**QUERY, view=view)
        assert not at.exception, view
        figs = chart_specs(at)
        kinds[view] = sorted({t.get("type", "scatter") for f in figs for t in f["data"]})
        body = text(at)
        if view == "Table":
            assert "(live?run=isoflop-sim-1e17-n0)" in body  # the pivot's cells link to their runs
        if view == "Iso-FLOP":
            assert "N\\* ∝ C^0.45" in body and "At C = 1e+19\\: params" in body
            assert list(at.dataframe[0].value["status"]) == ["ok"] * 4
        if view == "Variant vs baseline":
            assert "The variant reaches the baseline's loss with 0.7" in body
    assert kinds["Parallel coordinates"] == ["parcoords"]
    assert all(kinds[v] == ["scatter"] for v in ("Curves", "Scatter", "Iso-FLOP", "Variant vs baseline"))
    assert kinds["Table"] == []  # Markdown
    assert (
        at.query_params["sel"] == "ladder = isoflop-sim" and at.query_params["view"] == "Variant vs baseline"
    )


def test_more_groups_than_drawn_are_said(store, monkeypatch):
    monkeypatch.setattr(sweeps_page, "MAX_GROUPS", 2)
    at = page(sel="ladder = isoflop-sim", metric="train/loss", by="config.budget", x="tokens", view="Curves")
    assert not at.exception
    assert "20 run\\(s\\) in 4 group\\(s\\); showing the 2 largest" in text(at)
    curves = chart_specs(at)[0]
    named = {
        t["name"]
        for t in curves["data"]
        if t.get("name") and t.get("mode") == "lines" and "line" in t and t["line"].get("width") == 2
    }
    assert len(named) == 2 and all("(n=5)" in n for n in named)


def test_a_bad_selection_is_said_where(store):
    at = page(sel="ladder == x")
    assert not at.exception
    assert "at character 9" in at.error[0].value
    assert not chart_specs(at)


def test_nothing_selected_and_no_cells(store):
    at = page(sel="project = nothing")
    assert not at.exception and "No run matches" in at.info[0].value
    at = page(sel="project = lr", metric="train/loss", view="Iso-FLOP")
    assert not at.exception
    assert any("no cells\\: 3 run\\(s\\) selected" in i.value for i in at.info)


def test_writer_labels_stay_inert(store):
    specs, body = [], []
    for view in ("Curves", "Table", "Scatter", "Parallel coordinates"):
        at = page(
            view=view,
            sel="project = evil",
            metric="train/loss",
            by="config.model.width",
            key="config.model.width",
            color="config.model.width",
            rows="config.model.width",
            cols="config.optimizer.lr",
            pkeys="config.model.width,config.optimizer.lr",
        )
        assert not at.exception, view
        specs += chart_specs(at)
        body.append(text(at))
    specs, body = json.dumps(specs), "\n".join(body)
    assert HOSTILE not in specs, specs[max(0, specs.find(HOSTILE) - 300) : specs.find(HOSTILE) + 40]
    assert "&lt;img src=x onerror=alert(1)&gt;" in specs
    assert not re.search(r"(?<!\\)<img", body) and "](javascript" not in body
    assert "\\<img src=x onerror=alert\\(1\\)\\>" in body  # the pivot's row label, escaped


def test_a_selection_past_the_views_bound_asks_for_a_narrower_one(store, monkeypatch):
    monkeypatch.setattr(sweeps_page, "MAX_VIEW_RUNS", 10)
    at = page(sel="ladder = isoflop-sim")
    assert not at.exception
    assert "20 runs selected; the views draw at most 10" in at.info[0].value
    assert not chart_specs(at)
