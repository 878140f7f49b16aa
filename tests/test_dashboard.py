"""Dashboard pages under streamlit's AppTest, over a real store built by the real writer and ingester.

Each page: data appears, its filters and controls change what is shown, and no
exception escapes (`assert not at.exception`). Charts are checked through the
plotly spec each page sends to the browser.
"""

from __future__ import annotations

import base64
import json
import threading

import numpy as np
import pytest
from dashboard_fixtures import BASE_STEPS, chart_specs, make_store, page
from streamlit.testing.v1 import AppTest

import observatory
from observatory.dashboard.charts import marker_text
from observatory.dashboard.pages import runs as runs_page
from observatory.pipeline import ingest
from observatory.queries import user_sql

TIMEOUT = 60


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dash")
    runs_dir, db = make_store(tmp)
    with pytest.MonkeyPatch.context() as mp:  # the module's pages read this store
        mp.setenv("OBSERVATORY_DB", str(db))
        yield runs_dir, db


def specs(at: AppTest) -> list[dict]:
    return chart_specs(at)


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


@pytest.mark.subprocess  # the app warms a SQL worker (a child) as it starts
def test_app_routes_to_runs_page(store):
    at = AppTest.from_file("../app.py", default_timeout=TIMEOUT).run()
    assert not at.exception
    assert [t.value for t in at.title] == ["Runs"]


@pytest.mark.subprocess
def test_app_start_warms_one_sql_worker_in_the_background(store, monkeypatch, request):
    """The first page paints while the SQL console's first worker starts; reruns start no more."""
    pool = user_sql._Pool()  # as in a fresh server process
    monkeypatch.setattr(user_sql, "_POOL", pool)
    request.addfinalizer(pool.close)
    assert user_sql.pool_status() == {"alive": 0, "ready": 0}
    called, release = threading.Event(), threading.Event()
    real_warm = pool.warm

    def held_warm(key, n):
        called.set()
        release.wait(120)
        real_warm(key, n)

    monkeypatch.setattr(pool, "warm", held_warm)
    at = AppTest.from_file("../app.py", default_timeout=TIMEOUT).run()
    assert not at.exception and [t.value for t in at.title] == ["Runs"]  # painted while the warm-up waits
    assert called.wait(10) and user_sql.pool_status() == {"alive": 0, "ready": 0}  # the app started it
    release.set()
    user_sql.warm_up_in_background().join(60)  # the app's thread: a later call starts none
    assert user_sql.pool_status() == {"alive": 1, "ready": 1}  # alive before any query
    at.run()
    AppTest.from_file("../app.py", default_timeout=TIMEOUT).run()  # a second visitor
    assert user_sql.pool_status() == {"alive": 1, "ready": 1}


def test_runs_page_lists_runs_and_filters(store):
    at = page("runs")
    assert not at.exception
    df = at.dataframe[0].value
    assert sorted(df["run"]) == [
        "base-run",
        "crashed-run",
        "fork-run",
    ]
    status = dict(zip(df["run"], df["status"], strict=True))
    assert "crashed" in status["crashed-run"]  # silent without run_end: never "running" forever
    assert "completed" in status["base-run"]
    base = df[df["run"] == "base-run"].iloc[0]
    assert base["progress"] == pytest.approx(1.0)
    assert base["tokens"] == f"{BASE_STEPS * 1024 / 1e3:.3g}K"  # compact, as text: "—" where a run has none
    assert base["ladder"] == "tiny / d32"

    at.text_input(key="runs_q").input("fork").run()
    assert not at.exception
    assert list(at.dataframe[0].value["run"]) == ["fork-run"]
    assert at.query_params["q"] == ["fork"] or at.query_params["q"] == "fork"  # the filter is a link

    at.text_input(key="runs_q").input("").run()
    at.multiselect(key="runs_status").select("crashed").run()
    assert list(at.dataframe[0].value["run"]) == ["crashed-run"]

    at.multiselect(key="runs_status").unselect("crashed").run()
    at.multiselect(key="runs_tags").select("fork").run()
    assert list(at.dataframe[0].value["run"]) == ["fork-run"]


def test_live_page_curves_markers_forecast(store):
    at = page("live", run="base-run")
    assert not at.exception
    assert at.selectbox(key="pick_run").value == "base-run"
    assert len(specs(at)) == 1  # a first view sends the loss chart alone, without its controls...
    assert any("Loading the chart controls and health charts" in c.value for c in at.caption)
    assert not [s for s in at.slider if s.key == "live_smoothing"]
    at.run()  # ...and the rerun after the browser's first paint (here: the next run) draws the rest
    assert not at.exception
    assert at.slider(key="live_smoothing").value == 0.6  # smoothing on by default (issue 37 item 7)
    charts = specs(at)
    assert len(charts) == 7  # loss + six health charts
    loss = charts[0]
    line = next(t for t in loss["data"] if t.get("name") == "train/loss")  # smoothed
    faint = next(t for t in loss["data"] if t.get("name") == "train/loss (raw)")
    assert np.nanmax(arr(faint["y"])) > 6.0  # the step-77 spike is there
    assert "step 77" not in json.dumps(traces(loss, "failure"))
    fail = traces(loss, "failure")[0]
    assert fail["x"] == [90] and "nan_loss" in fail["text"][0]
    # the raw line faintly behind the smoothed one; axis titles with units
    names = [t.get("name") for t in loss["data"]]
    assert names.index("train/loss (raw)") < names.index("train/loss")
    assert loss["layout"]["xaxis"]["title"]["text"] == "step"
    assert loss["layout"]["yaxis"]["title"]["text"] == "loss (nats / token)"
    # findings: one marker per episode (the z-score warning and the loss spike of step 77 are one), by severity
    (crit,) = traces(loss, "finding: critical")
    assert crit["x"] == [77, 90] and "2 findings, worst critical" in crit["text"][0]
    assert "6 sigma" in crit["text"][0] and "loss_spike" in crit["text"][0]
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
    at.slider(key="live_smoothing").set_value(0.0).run()
    assert not at.exception
    raw = next(t for t in specs(at)[0]["data"] if t.get("name") == "train/loss")
    assert not np.allclose(arr(raw["y"]), arr(line["y"]), equal_nan=True)
    assert not traces(specs(at)[0], "(raw)")  # no faint copy of an unsmoothed line
    at.slider(key="live_smoothing").set_value(0.9).run()

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


def linked_lines(fig: dict) -> list:
    return [s["x0"] for s in fig["layout"].get("shapes", []) if s.get("name") == "linked step"]


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_live_page_centers_and_marks_the_step_of_an_alert_link(store):
    """An alert links to `/live?run=R&step=S`: the charts open on a window around S, with S marked."""
    at = page("live", run="base-run", step="60")
    at.run()  # the rerun after the first paint: the health charts too
    assert not at.exception
    charts = specs(at)
    assert len(charts) == 7
    lo, hi = at.slider(key="live_window_base-run").value  # a window the user can widen again
    assert lo < 60 < hi and (lo, hi) != (0, BASE_STEPS - 1) and hi - lo < BASE_STEPS / 2
    assert 60 - lo == pytest.approx(hi - 60, abs=1)  # centred
    x0, x1 = charts[0]["layout"]["xaxis"]["range"]  # the window, padded so that nothing at its ends is cut
    assert x0 <= lo and hi <= x1 and x1 - x0 < 1.1 * (hi - lo)
    line = next(t for t in charts[0]["data"] if t.get("name") == "train/loss")
    assert list(arr(line["x"])) == list(range(lo, hi + 1))  # the window's steps, at full resolution
    assert all(linked_lines(c) == [60] for c in charts)
    at.selectbox(key="pick_run").set_value("fork-run").run()  # the link's step was base-run's
    assert not at.exception and "step" not in at.query_params
    assert not linked_lines(specs(at)[0])
    # not a step of this run, or not a step at all: ignored (the whole run, nothing marked)
    for bad in ("120", "99999999999999999999999", "-3", "6e1", "60.0", "abc", " 60", ""):
        at = page("live", run="base-run", step=bad)
        assert not at.exception, bad
        loss = specs(at)[0]
        x0, x1 = loss["layout"]["xaxis"]["range"]  # the whole run (padded)
        assert x0 <= 0 and BASE_STEPS - 1 <= x1 < 1.1 * BASE_STEPS, bad
        assert not linked_lines(loss), bad


def test_live_banner_says_a_silent_run_is_in_a_budgeted_phase_not_stale():
    from observatory.dashboard.pages.live import banner

    now = 1e9
    row = {"status": "running", "last_event_t": now - 240, "last_step": 500}
    saving = {**row, "phase": "checkpoint", "phase_t": now - 240, "phase_budget_s": 600.0}
    level, text = banner(saving, now)
    assert level == "info" and "In checkpoint" in text and "for 4 min" in text and "allowed 10 min" in text
    assert banner({**saving, "phase_budget_s": None}, now)[1].endswith(
        "allowed 30 min before it counts as a hang)."
    )
    assert banner({**row, "phase": "train", "phase_t": now - 240}, now)[0] == "warning"  # a training silence
    assert banner({**saving, "status": "crashed"}, now)[0] == "error"
    assert banner({**saving, "phase_t": now - 700}, now)[0] == "warning"  # past its budget


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
    # the y axis says what it is, with its unit; smoothing is on as on the Live page
    assert overlay["layout"]["yaxis"]["title"]["text"] == "loss (nats / token)"
    assert at.slider(key="compare_smoothing").value == 0.6
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


@pytest.mark.subprocess
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


# every type DuckDB has: test_all_types() (its minimum, maximum and NULL rows), and what it leaves out
EVERY_TYPE = {
    "test_all_types": "SELECT * FROM test_all_types()",
    "no rows": "SELECT * FROM test_all_types() LIMIT 0",
    "odd scalars": "SELECT '12:00:00+05'::TIMETZ tz, INTERVAL 14 MONTH i, 1::UHUGEINT << 127 uh, "
    "'\\xAA\\x00'::BLOB b, '101'::BIT bit, 'nan'::DOUBLE n, 1::VARIANT v, '{\"a\":1}'::JSON j, "
    "'3fa85f64-5717-4562-b3fc-2c963f66afa6'::UUID id",
    "nested": "SELECT [1,2,3]::INTEGER[3] arr, MAP {[1]: 2} m, {'a': [INTERVAL 1 DAY]} s, [NULL] nl, [[]] el",
    "union of members": "SELECT union_value(a := 1)::UNION(a INT, b VARCHAR) u "
    "UNION ALL SELECT union_value(b := 'x')",
    "a column of mixed types": "SELECT 1::VARIANT v UNION ALL SELECT 'x'::VARIANT UNION ALL SELECT [1]::VARIANT",
    "repeated names": "SELECT 1 a, 'x' a, 2.5 a",
}


@pytest.mark.subprocess
@pytest.mark.parametrize("label", EVERY_TYPE)
def test_sql_console_shows_every_duckdb_type(store, label):
    """HUGEINT, TIMETZ, INTERVAL, UNION, ... used to crash the page's table (Arrow has no form for
    some, polars none for others). Each column is shown, as text where nothing better exists."""
    at = run_sql(page("sql"), EVERY_TYPE[label])
    assert not at.exception and not at.error, [str(e.value)[:300] for e in at.exception or at.error]
    res = user_sql.run_user_sql(None, EVERY_TYPE[label])
    df = at.dataframe[-1].value
    assert df.shape == (len(res.rows), len(res.columns))
    assert at.get("download_button")
    if label == "test_all_types":
        row = dict(zip(df.columns, df.iloc[0], strict=True))
        assert row["hugeint"] == "-170141183460469231731687303715884105728"  # not rounded to a float
        assert row["uuid"] == "00000000-0000-0000-0000-000000000000" and row["union"] == "Frank"
        assert row["blob"] == "thisisalongblob\\x00withnullbytes"  # as DuckDB writes a BLOB
        assert row["int"] == -2147483648  # plain types keep their type
    if label == "repeated names":
        assert list(df.columns) == ["a", "a (2)", "a (3)"] and list(df.iloc[0]) == [1, "x", 2.5]


@pytest.mark.subprocess
def test_sql_results_of_all_sessions_together_stay_under_their_bound(store, monkeypatch):
    """Each session's last SQL result used to live in its own state: many visitors (or one with many
    tabs) grew the server by up to `sql_max_result_mb` each. They are kept together now, oldest let go
    first, under `sql_results_mb`; a session whose result went is told so."""
    from observatory.dashboard.pages import sql as sql_page

    monkeypatch.setenv("OBSERVATORY_SQL_RESULTS_MB", "1")
    big = "SELECT repeat('x', 100) || i AS s, i FROM range(8000) t(i)"  # ~0.9 MB as a frame
    first = run_sql(page("sql"), big)
    assert not first.exception and first.dataframe[-1].value.shape == (8000, 2)
    sessions = [run_sql(page("sql"), big.replace("'x'", f"'{n}'")) for n in range(3)]
    first.run()
    assert not first.exception and any("let go" in i.value for i in first.info)
    assert sql_page.RESULTS.size() <= 1 << 20  # the newest only: each is ~0.9 MB
    assert sessions[-1].run().dataframe[-1].value.shape == (8000, 2)  # the newest is still shown


@pytest.mark.subprocess
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


def test_runs_page_groups_a_ladder(store):
    """'Group by ladder': a ladder's runs together, with a line per rung and rung/seed columns."""
    at = page("runs")
    at.toggle(key="runs_by_ladder").set_value(True).run()
    assert not at.exception
    assert at.query_params["by"] in ("ladder", ["ladder"])  # the grouped view is a link too
    assert [s.value for s in at.subheader] == ["Ladder tiny", "Not in a ladder"]
    rungs, runs, rest = (d.value for d in at.dataframe)
    assert list(rungs["rung"]) == ["d32"] and list(rungs["runs"]) == [1]
    assert list(runs["run"]) == ["base-run"] and list(runs["rung"]) == ["d32"]
    assert sorted(rest["run"]) == ["crashed-run", "fork-run"]


def test_ladder_groups_order_rungs_and_seeds():
    def row(run, loss):
        return {"run": run, "last_loss": loss, "ladder": "lad / x"}

    shown = [row("lad-a", 2.0), row("lad-a-s1", 2.2), row("lad-b", 1.5), row("lad-t", 1.2)]
    lruns = {
        "lad": [
            {"run": "lad-b", "rung": "b", "ladder": {"seed": 0}, "target": False},
            {"run": "lad-t", "rung": "t", "ladder": {"seed": 0, "target": True}, "target": True},
            {"run": "lad-a-s1", "rung": "a", "ladder": {"seed": 1}, "target": False},
            {"run": "lad-a", "rung": "a", "ladder": {"seed": 0}, "target": False},
            {"run": "lad-gone", "rung": "a", "ladder": {"seed": 2}, "target": False},  # filtered out
        ]
    }
    (g,) = runs_page.ladder_groups(shown, lruns)
    assert [r["run"] for r in g["runs"]] == ["lad-b", "lad-a", "lad-a-s1", "lad-t"]
    assert [(x["rung"], x["seeds"]) for x in g["rungs"]] == [("b", 1), ("a", 2), ("t (target)", 1)]
    a = g["rungs"][1]
    assert a["mean"] == pytest.approx(2.1) and a["spread"] == pytest.approx(0.1414 / 2.1, rel=1e-3)


def test_sql_schema_list_has_no_emoji(store):
    """The schema list's labels are plain names with Material icons (no emoji: boxes without an emoji font)."""
    at = page("sql")
    assert not at.exception
    labels = [e.label for e in at.expander]
    assert "runs" in labels and "metrics" in labels
    assert all(label.isascii() for label in labels), labels
    assert {e.proto.icon for e in at.expander} == {":material/table_chart:", ":material/visibility:"}


def test_live_page_finds_the_previous_run_of_the_same_recipe():
    """A demo run is drawn against the newest earlier run with its name and planned steps."""
    from observatory.dashboard.pages import live

    def row(run, name, steps, start):
        return {"run": run, "name": name, "steps": steps, "start_time": start}

    rows = [
        row("demo-3", "tiny", 30000, 300.0),
        row("demo-2", "tiny", 30000, 200.0),
        row("demo-short", "tiny", 20, 250.0),  # another length: not the same recipe
        row("demo-1", "tiny", 30000, 100.0),
        row("lad-a", "lad-a", 200, 50.0),  # a name that is only the id
        row("lad-a-s1", "lad-a-s1", 200, 60.0),
    ]
    assert live.previous_run(rows, "demo-3") == "demo-2"
    assert live.previous_run(rows, "demo-1") is None
    assert live.previous_run(rows, "lad-a-s1") is None
    assert live.previous_run(rows, "nope") is None


def test_live_page_draws_the_previous_run_of_the_same_recipe(tmp_path, monkeypatch):
    import time

    import observatory
    from observatory.pipeline import ingest

    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    for rid, n in (("demo-a", 100), ("demo-b", 40)):
        with observatory.init(
            run_id=rid, name="tiny", config={"steps": 100}, runs_dir=runs, install_signal_handlers=False
        ) as r:
            for s in range(n):
                r.log({"train/loss": 3 - s * 0.01}, step=s)
        time.sleep(0.05)
    ingest(runs, db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = page("live", run="demo-b")
    assert not at.exception
    loss = specs(at)[0]
    (prev,) = traces(loss, "previous run")
    assert prev["name"] == "previous run demo-a (same name and steps)"  # the legend says what it is
    # drawn over the run's own line, dashed: seen where the two curves coincide (issue 37 item 6)
    names = [t.get("name") for t in loss["data"]]
    assert names.index(prev["name"]) > names.index("train/loss") and prev["line"]["dash"] == "dash"
    # smoothed as the run's own line is (the default 0.6): the same losses draw the same curve
    own = next(t for t in loss["data"] if t.get("name") == "train/loss")
    assert np.allclose(arr(prev["y"]), arr(own["y"])) and not np.allclose(
        arr(prev["y"]), 3 - np.arange(40) * 0.01
    )


def _memory_limit(con) -> str:
    return con.execute("SELECT current_setting('memory_limit')").fetchone()[0]


def test_page_queries_run_under_the_dashboard_memory_limit(empty_store, monkeypatch):
    """The dashboard's store connections carry `dashboard_memory_limit_mb`, so a large store cannot grow it past that."""
    from observatory.dashboard import cache

    monkeypatch.setenv("OBSERVATORY_CACHE_TTL_S", "0")
    for mb, shown in (("256", "256.0 MiB"), ("2048", "2.0 GiB")):
        monkeypatch.setenv("OBSERVATORY_DASHBOARD_MEMORY_LIMIT_MB", mb)
        assert cache.query(_memory_limit) == shown
    monkeypatch.setenv("OBSERVATORY_DASHBOARD_MEMORY_LIMIT_MB", "16")
    with pytest.raises(ValueError, match="dashboard_memory_limit_mb must be at least 64"):
        cache.query(_memory_limit)


def test_runs_page_with_a_run_of_a_group_and_a_ladder(tmp_path, monkeypatch):
    """One run_start with both `group` and `ladder` (the group filter and the by-ladder toggle were both keyed
    `runs_group`: StreamlitDuplicateElementKey for every visitor); both widgets shown and used, no exception."""
    runs = tmp_path / "runs"
    run = observatory.init(
        run_id="both",
        config={},
        group="g",
        ladder={"name": "L", "rung": "s"},
        runs_dir=runs,
        install_signal_handlers=False,
    )
    run.log({"train/loss": 1.0}, step=1)
    run.finish()
    ingest(runs, tmp_path / "s.duckdb", emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(tmp_path / "s.duckdb"))
    at = page("runs")
    assert not at.exception
    at.multiselect(key="runs_group").select("g").run()
    at.toggle(key="runs_by_ladder").set_value(True).run()
    assert not at.exception
    assert [s.value for s in at.subheader] == ["Ladder L"]


def test_window_keeps_a_step_0_decision_and_the_range_both_ends():
    """Issue 37 item 6: a decision at step 0 of a run logged from step 1 is in the first window (not in a
    zoomed one), and the chart's range shows it and the last step whole."""
    import polars as pl

    from observatory.dashboard.charts import window_markers, x_range

    marks = pl.DataFrame(
        {"kind": ["decision", "checkpoint", "anomaly"], "step": [0, 50, 120], "data": ["{}"] * 3}
    )
    whole = window_markers({"window": (1, 120), "extent": (1, 120)}, marks)
    assert whole["step"].to_list() == [0, 50, 120]
    zoomed = window_markers({"window": (40, 120), "extent": (1, 120)}, marks)
    assert zoomed["step"].to_list() == [50, 120]
    lo, hi = x_range(1, 120, whole)
    assert lo < 0 and hi > 120
    assert x_range(40, 120, zoomed)[0] < 40 < 50


def _finding(obs, metric: str, step: int, severity: str = "warn", detector: str = "throughput_drop") -> None:
    window = [step, step]
    data = {"detector": detector, "metric": metric, "severity": severity, "message": "m", "window": window}
    obs.event("anomaly", data, step=step)


def test_live_page_draws_each_finding_on_its_metric_chart_one_marker_an_episode(tmp_path, monkeypatch):
    """Issue 37 item 5 (the chart side): throughput findings on the throughput chart, not the loss's; three
    consecutive ones are one marker with their count and a band; on a W&B-style run, a finding on `acc`
    is drawn on the `acc` panel and the decision stays on the loss's."""
    from dashboard_fixtures import write_run

    from observatory.events import OBSERVATORY_HOST

    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    write_run(runs, "moe-run", range(BASE_STEPS))
    with observatory.init(run_id="wb-run", runs_dir=runs, install_signal_handlers=False) as r:
        for s in range(60):
            r.log({"loss": 3 - s * 0.01, "acc": 0.1 + s * 0.01}, step=s)
    findings = {
        "moe-run": [
            ("throughput/tokens_per_s", 40, "warn"),
            ("throughput/tokens_per_s", 41, "warn"),
            ("throughput/tokens_per_s", 42, "warn"),
            ("grad/norm/total", 60, "critical"),
            ("router/layer_1/z_loss", 30, "info"),
        ],
        "wb-run": [("acc", 20, "warn")],
    }
    for run, items in findings.items():
        obs = observatory.init(
            run_id=run, runs_dir=runs, host=OBSERVATORY_HOST, write_start=False, install_signal_handlers=False
        )
        for metric, step, sev in items:
            _finding(obs, metric, step, sev)
        obs.event("decision", {"id": "D-1", "title": "go", "status": "accepted"}, step=10)
        obs.close()
    ingest(runs, db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))

    at = page("live", run="moe-run")
    at.run()  # the health charts come after the first paint
    assert not at.exception
    charts = specs(at)
    assert len(charts) == 7
    loss = charts[0]
    drawn = json.dumps(traces(loss, "finding"))
    assert "throughput" not in drawn and "grad/norm" not in drawn and "z_loss" not in drawn
    assert traces(loss, "decision")  # markers other than findings stay on the loss chart

    def chart(title: str) -> dict:
        return next(c for c in charts if title in json.dumps(c["layout"].get("title", "")))

    (tp,) = traces(chart("Throughput"), "finding: warning")
    assert tp["x"] == [40] and tp["customdata"] == ["×3"] and "3 findings" in tp["text"][0]
    band = [s for s in chart("Throughput")["layout"]["shapes"] if s.get("type") == "rect"]
    assert [(b["x0"], b["x1"]) for b in band] == [(40, 42)]
    (gn,) = traces(chart("Grad norm"), "finding: critical")
    assert gn["x"] == [60] and gn["customdata"] == [""]
    (zl,) = traces(chart("Z-losses"), "finding: info")
    assert zl["x"] == [30]

    at = page("live", run="wb-run")
    assert not at.exception
    wb = specs(at)
    assert not traces(wb[0], "finding") and traces(wb[0], "decision")
    (acc,) = [c for c in wb if traces(c, "finding")]
    assert traces(acc, "acc") and traces(acc, "finding: warning")[0]["x"] == [20]


@pytest.mark.parametrize("lo,hi", [(0.012, 5.2), (1e-5, 3e-3), (0.0011, 0.0024), (1e-9, 1e3), (5e-5, 2e-4)])
def test_log_ticks_are_written_out_and_cover_the_values(lo, hi):
    """Issue 37 item 7: a log axis's labels are plain numbers ("0.003", "1e-05"), one per tick, increasing,
    covering the values (plotly labels a log axis's minor ticks by their first digit: "5, 2, 10, 5, 2, 1")."""
    from observatory.dashboard.charts import log_ticks

    t = log_ticks(lo, hi)
    vals, labels = t["tickvals"], t["ticktext"]
    assert t["tickmode"] == "array" and 3 <= len(vals) <= 12
    assert [float(x) for x in labels] == pytest.approx(vals) and vals == sorted(set(vals))
    assert vals[0] <= lo * 1.0001 and vals[-1] >= hi / 1.0001


def test_a_constant_logged_with_float_noise_is_drawn_around_its_value():
    """A constant LR (3e-4, its last bits differing step to step) gets an axis around 3e-4, not one zoomed
    into the noise with ticks "2.9999999999999999556e-4"; a varying series keeps plotly's own range."""
    import polars as pl

    from observatory.dashboard.charts import series_figure

    lr = [3e-4, float(np.nextafter(3e-4, 1)), float(np.nextafter(3e-4, 0))] * 10
    df = pl.DataFrame({"step": list(range(30)), "min": lr, "max": lr, "last": lr})
    fig = series_figure(df, "opt/lr", 0.0, y_title="learning rate")
    assert fig["layout"]["yaxis"]["range"] == pytest.approx([2.85e-4, 3.15e-4])
    # exactly constant, smoothed (the smoothing's own rounding is the noise)
    exact = df.with_columns(pl.lit(3e-4).alias(c) for c in ("min", "max", "last"))
    assert series_figure(exact, "opt/lr", 0.6)["layout"]["yaxis"]["range"] == pytest.approx(
        [2.85e-4, 3.15e-4]
    )
    df = df.with_columns(pl.col("last") * pl.Series(np.linspace(1, 2, 30)))
    varying = df.with_columns(min=pl.col("last"), max=pl.col("last"))
    assert "range" not in series_figure(varying, "opt/lr", 0.0)["layout"]["yaxis"]
