"""The report of the sample ladder's first target (`ladder-cpu-d72`) says one thing, and draws it.

Its forecast of eval/loss at step 200 (from a `forecast` event, pre-registered by the decision
`first-target-d72`) is compared with the eval the run logged at step 200 (1.8036, below the
band), in one row; the summary's headline says it missed; the forecast chart shows the run's
evals from step 0 with the verdict on it; the Reports page shows the report once, as tall as it is.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from observatory import demo
from observatory.pipeline import ingest
from observatory.report.collect import build
from observatory.report.figures import forecast

RUN = "ladder-cpu-d72"


pytestmark = pytest.mark.slow  # its store: a ladder ingested and fitted (~5 s)


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("samples")
    demo.seed_samples(tmp / "runs")
    ingest(tmp / "runs", tmp / "obs.duckdb", emit=None)
    return tmp / "obs.duckdb"


def test_forecast_against_the_eval_that_exists_in_one_row(db):
    rep = build(db, RUN)
    rows = [(k, v) for k, v in rep.summary if k.startswith("forecast")]
    assert rows == [("forecast eval/loss", "1.90666 -> actual 1.80358 (below band)")]
    (f,) = rep.forecasts
    assert f["actual_step"] == 200 and f["verdict"] == "below band"
    assert "decision first-target-d72" in f["source_text"]
    assert any(line.startswith("The forecast eval/loss 1.90666") and "missed" in line for line in rep.story)


def test_forecast_chart_draws_the_evals_from_step_0_and_the_verdict(db):
    fig = forecast(build(db, RUN))
    assert fig.layout.xaxis.range[0] == 0 and fig.layout.xaxis.range[1] >= 200
    actual = next(t for t in fig.data if t.name == "eval/loss (actual)")
    assert len(actual.x) >= 10 and actual.x[-1] == 200
    assert [a.text for a in fig.layout.annotations] == ["actual 1.804: below band"]
    assert "below band" in fig.layout.title.text


def test_reports_page_shows_the_report_once_as_tall_as_it_is(db, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = AppTest.from_string(
        "from observatory.dashboard.pages import reports\nreports.render()\n", default_timeout=120
    )
    at.query_params["run"] = RUN
    at.run()
    assert not at.exception
    assert not any("missed" in m.value for m in at.markdown)  # the story is in the report, not also above it
    (frame,) = at.get("iframe")
    assert frame.proto.srcdoc.count("The forecast eval/loss 1.90666") == 1
    # its height ("content", no inner scroll) is checked in chromium: tests/test_wandb_browser.py
