"""Dashboard pages under streamlit's AppTest, over a real store built by the real writer and ingester.

Each page: data appears, its filters and controls change what is shown, and no
exception escapes (`assert not at.exception`). Charts are checked through the
plotly spec each page sends to the browser.
"""

from __future__ import annotations

import base64
import json
import os

import numpy as np
import pytest
from dashboard_fixtures import BASE_STEPS, make_store
from streamlit.testing.v1 import AppTest

from observatory.dashboard.charts import marker_text

TIMEOUT = 60


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    runs_dir, db = make_store(tmp)
    old = os.environ.get("OBSERVATORY_DB")
    os.environ["OBSERVATORY_DB"] = str(db)
    yield runs_dir, db
    if old is None:
        os.environ.pop("OBSERVATORY_DB", None)
    else:
        os.environ["OBSERVATORY_DB"] = old


def page(name: str, **query) -> AppTest:
    at = AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=TIMEOUT
    )
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def specs(at: AppTest) -> list[dict]:
    return [json.loads(c.proto.spec) for c in at.get("plotly_chart")]


def arr(v) -> np.ndarray:
    """A plotly spec array: a list, or plotly's base64 typed array {dtype, bdata, shape}."""
    if isinstance(v, dict) and "bdata" in v:
        a = np.frombuffer(base64.b64decode(v["bdata"]), dtype=np.dtype(v["dtype"]))
        return a.reshape([int(x) for x in str(v.get("shape", len(a))).split(",")])
    return (
        np.array([np.nan if x is None else x for x in v], dtype=float)
        if v and not isinstance(v[0], list)
        else np.array([[np.nan if x is None else x for x in row] for row in v], dtype=float)
    )


def traces(spec: dict, name_part: str) -> list[dict]:
    return [t for t in spec["data"] if name_part in (t.get("name") or "")]


def test_app_routes_to_runs_page(store):
    at = AppTest.from_file("../app.py", default_timeout=TIMEOUT).run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Runs"]


def test_runs_page_lists_runs_and_filters(store):
    at = page("runs")
    assert not at.exception
    df = at.dataframe[0].value
    assert sorted(df["run"].str.replace("live?run=", "", regex=False)) == [
        "base-run",
        "crashed-run",
        "fork-run",
    ]
    status = dict(zip(df["run"], df["status"], strict=True))
    assert "crashed" in status["live?run=crashed-run"]  # silent without run_end: never "running" forever
    assert "completed" in status["live?run=base-run"]
    base = df[df["run"] == "live?run=base-run"].iloc[0]
    assert base["progress"] == pytest.approx(1.0)
    assert base["tokens"] == BASE_STEPS * 1024
    assert base["ladder"] == "tiny / d32"

    at.text_input(key="runs_q").input("fork").run()
    assert not at.exception
    assert list(at.dataframe[0].value["run"]) == ["live?run=fork-run"]
    assert at.query_params["q"] == ["fork"] or at.query_params["q"] == "fork"  # the filter is a link

    at.text_input(key="runs_q").input("").run()
    at.multiselect(key="runs_status").select("crashed").run()
    assert list(at.dataframe[0].value["run"]) == ["live?run=crashed-run"]

    at.multiselect(key="runs_status").unselect("crashed").run()
    at.multiselect(key="runs_tags").select("fork").run()
    assert list(at.dataframe[0].value["run"]) == ["live?run=fork-run"]


def test_live_page_curves_markers_forecast(store):
    at = page("live", run="base-run")
    assert not at.exception
    assert at.selectbox(key="pick_run").value == "base-run"
    assert len(specs(at)) == 1  # a first view sends the loss chart alone, without its controls...
    assert any("Loading the chart controls and health charts" in c.value for c in at.caption)
    assert not [s for s in at.slider if s.key == "live_smoothing"]
    at.run()  # ...and the rerun after the browser's first paint (here: the next run) draws the rest
    assert not at.exception
    assert at.slider(key="live_smoothing").value == 0.0
    charts = specs(at)
    assert len(charts) == 7  # loss + six health charts
    loss = charts[0]
    line = next(t for t in loss["data"] if t.get("name") == "train/loss")
    assert np.nanmax(arr(line["y"])) > 6.0  # the step-77 spike is there
    assert "step 77" not in json.dumps(traces(loss, "failure"))
    fail = traces(loss, "failure")[0]
    assert fail["x"] == [90] and "nan_loss" in fail["text"][0]
    assert traces(loss, "anomaly") and "6 sigma" in traces(loss, "anomaly")[0]["text"][0]
    assert traces(loss, "config diff") and "optim.lr" in traces(loss, "config diff")[0]["text"][0]
    assert traces(loss, "decision") and "D-7" in traces(loss, "decision")[0]["text"][0]
    assert traces(loss, "checkpoint")
    assert traces(loss, "forecast"), "the ladder forecast band is drawn"
    assert traces(loss, "eval val")
    assert any(t.get("name") == "NaN/inf" for t in loss["data"])  # the NaN at step 90 is marked
    titles = [c["layout"]["title"]["text"] for c in charts]
    assert "Grad norm" in titles and "Drop fraction" in titles and "Learning rate" in titles
    assert not at.error  # completed run: no banner

    # smoothing changes the drawn line but not the raw band
    at.slider(key="live_smoothing").set_value(0.9).run()
    assert not at.exception
    smoothed = next(t for t in specs(at)[0]["data"] if t.get("name") == "train/loss")
    assert not np.allclose(arr(smoothed["y"]), arr(line["y"]), equal_nan=True)

    # zoom: the window is re-queried (full resolution here, every step)
    at.slider(key="live_window_base-run").set_value((70, 80)).run()
    assert not at.exception
    zoomed = next(t for t in specs(at)[0]["data"] if t.get("name") == "train/loss")
    assert list(arr(zoomed["x"])) == list(range(70, 81))

    # another run's first view draws no slider; the smoothing chosen here survives it
    at.selectbox(key="pick_run").set_value("fork-run").run()
    assert not at.exception and not [s for s in at.slider if s.key == "live_smoothing"]
    at.run()
    assert at.slider(key="live_smoothing").value == 0.9


def test_live_page_crashed_banner(store):
    at = page("live", run="crashed-run")
    assert not at.exception
    assert at.error and "Crashed" in at.error[0].value
    assert "Not running" in at.caption[0].value  # a crashed run does not poll


def test_experts_page_heatmaps_and_layers(store):
    at = page("experts", run="base-run")
    assert not at.exception
    overview, share, drop, layers_drop, layers_hot = specs(at)  # the all-layers overview comes first
    assert overview["data"][0]["y"] == ["0", "1"]
    z = arr(share["data"][0]["z"])
    assert z.shape == (8, BASE_STEPS)  # experts x steps (short run: every step its own column)
    assert np.nansum(z, axis=0) == pytest.approx(np.ones(BASE_STEPS))  # shares of a step add up to 1
    hot = at.dataframe[0].value
    assert int(hot.iloc[0]["expert"]) == 3 and hot.iloc[0]["max_over_mean"] > 2
    # layer 0 drops nothing; layer 1 drops from the hot expert
    assert np.nansum(arr(drop["data"][0]["z"])) == 0
    at.selectbox(key="experts_layer").set_value(1).run()
    assert not at.exception
    assert at.query_params["layer"] in ("1", ["1"])
    drop1_spec = specs(at)[2]["data"][0]
    rows = drop1_spec["y"]  # experts in load order: the row of expert e is rows.index(str(e))
    drop1 = arr(drop1_spec["z"])
    assert np.nanmin(drop1[rows.index("3")]) > 0.5  # the hot expert loses most of its assignments
    assert np.nansum(drop1[rows.index("0")]) == 0
    assert len(layers_drop["data"]) == 2  # one line per layer
    # a narrower step window re-queries
    at.slider(key="experts_window_base-run").set_value((10, 20)).run()
    assert list(arr(specs(at)[1]["data"][0]["x"])) == list(range(10, 21))


def test_compare_overlay_diff_lineage(store):
    at = page("compare", runs="base-run,fork-run")
    assert not at.exception
    overlay = specs(at)[0]
    names = {t.get("name") for t in overlay["data"]}
    assert {"base-run", "fork-run"} <= names
    at.radio(key="compare_x").set_value("tokens").run()
    assert not at.exception
    fork = next(t for t in specs(at)[0]["data"] if t.get("name") == "fork-run")
    assert arr(fork["x"])[0] == (61 + 1) * 1024  # x is tokens seen at that step
    at.radio(key="compare_x").set_value("FLOPs").run()
    fork = next(t for t in specs(at)[0]["data"] if t.get("name") == "fork-run")
    assert arr(fork["x"])[0] == pytest.approx((61 + 1) * 1024 * 1.2e6)

    diff = at.dataframe[0].value
    assert list(diff["key"]) == ["optim.lr"]  # only the differing key; the redacted secret is equal
    assert "sk-secret-value" not in json.dumps(diff.to_dict())

    at.selectbox(key="compare_lineage_run").set_value("fork-run").run()
    assert not at.exception
    graph = next(s for s in specs(at) if s["layout"]["title"]["text"].startswith("Lineage"))
    assert "base-run" in json.dumps(graph) and "@60" in json.dumps(graph)
    curve = next(s for s in specs(at) if s["layout"]["title"]["text"].startswith("Stitched"))
    base_seg = next(t for t in curve["data"] if t["name"] == "base-run")
    assert max(base_seg["x"]) == 60  # the ancestor ends at the fork step


def run_sql(at: AppTest, sql: str) -> AppTest:
    """Type into the form's editor and press Run (one submit, as in the browser)."""
    at.text_area(key="sql_text").input(sql)
    at.button[0].click()
    return at.run()


def test_sql_console_runs_refuses_and_downloads(store, monkeypatch):
    at = page("sql")
    assert not at.exception
    assert at.expander  # schema browser
    run_sql(at, "SELECT run, status FROM runs ORDER BY run")
    assert not at.exception
    df = at.dataframe[-1].value
    assert list(df["run"]) == ["base-run", "crashed-run", "fork-run"]
    assert at.get("download_button")

    for bad, word in [
        ("ATTACH '/tmp/x.duckdb' AS x", "ATTACH"),
        ("COPY runs TO '/tmp/out.csv'", "COPY"),
        ("SET threads = 1", "SET"),
        ("SELECT * FROM read_csv('/etc/passwd')", "disabled"),
        ("DELETE FROM runs", "DELETE"),
    ]:
        run_sql(at, bad)
        assert not at.exception
        msgs = [e.value for e in at.error]
        assert msgs and msgs[0].startswith(("Refused:", "Interrupted:")), (bad, msgs)
        assert word.lower() in msgs[0].lower(), (bad, msgs)

    # the example picker fills the editor
    at.selectbox(key="sql_example").set_value("Rejected lines").run()
    assert "rejected_events" in at.text_area(key="sql_text").value


def test_sql_console_interrupted_names_the_setting(store, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_SQL_TIME_LIMIT_MS", "50")
    at = page("sql")
    run_sql(at, "SELECT count(*) FROM range(100000000000) a")
    assert not at.exception
    msgs = [w.value for w in at.warning]
    assert msgs and "sql_time_limit_ms" in msgs[0]


def test_marker_hover_text_is_escaped():
    s = marker_text("note", {"text": "<script>alert(1)</script>"})
    assert "<script>" not in s and "&lt;script&gt;" in s
