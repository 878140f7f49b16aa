"""The lab's runs in the store: project/group/notes/source columns, summaries, histograms, artifacts.

Runs are written by `import observatory as wandb` (the wandb-compatible API) and loaded by the
real ingest; the checks go through the store's columns and views, `observatory runs`, and the
Runs and Live pages under AppTest.
"""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner
from dashboard_fixtures import page
from streamlit.testing.v1 import AppTest

import observatory as wandb
from observatory.cli import main
from observatory.pipeline import ingest
from observatory.queries import details
from observatory.queries.core import list_runs
from observatory.queries.user_sql import run_user_sql
from observatory.store import connect

# (id, project, group)
RUNS = (
    ("mnist-a1", "mnist", "sweep-a"),
    ("mnist-a2", "mnist", "sweep-a"),
    ("mnist-b1", "mnist", "sweep-b"),
    ("cifar-1", "cifar", None),
    ("plain", None, None),
)


def _write(runs_dir):
    for rid, project, group in RUNS:
        run = wandb.init(
            project=project,
            group=group,
            id=rid,
            name=f"name of {rid}",
            notes=f"notes on {rid}",
            dir=runs_dir,
            config={"lr": 1e-3},
        )
        for step in range(5):
            run.log({"loss": 5.0 - step, "acc": 0.1 * step})
        if rid == "mnist-a1":
            run.summary["best_acc"] = 0.95  # set, never logged: a summary event
            run.summary["loss"] = 0.5  # set, then a later log replaces it: finish's summary says so
            run.log({"loss": 0.25})
            run.summary.update({"eval": {"ppl": 12.5}, "note": "good"})
            hist = {"name": "grad/hist", "bucket_limits": [0.0, 1.0, 2.0, 4.0]}
            run.event(
                "histogram", {**hist, "bucket_counts": [3, 5, 1], "min": 0.1, "max": 3.9, "count": 9}, step=2
            )
            run.event("histogram", {**hist, "bucket_counts": [1, 7, 2], "count": 10}, step=4)
            run.event("artifact", {"name": "config", "type": "config", "path": "/tmp/cfg.yaml", "bytes": 123})
        run.finish()


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lab")
    runs_dir, db = tmp / "runs", tmp / "store.duckdb"
    _write(runs_dir)
    ingest(runs_dir, db)
    old = os.environ.get("OBSERVATORY_DB")
    os.environ["OBSERVATORY_DB"] = str(db)
    yield db
    if old is None:
        os.environ.pop("OBSERVATORY_DB", None)
    else:
        os.environ["OBSERVATORY_DB"] = old


@pytest.mark.subprocess
def test_run_start_fields_are_columns(store):
    res = run_user_sql(
        store, "SELECT run, name, project, run_group, notes, source->>'$.trainer' FROM runs ORDER BY run"
    )
    assert res.rows == [
        (rid, f"name of {rid}", project, group, f"notes on {rid}", "wandb-api")
        for rid, project, group in sorted(RUNS)
    ]
    res = run_user_sql(store, "SELECT project, count(*) FROM runs GROUP BY ALL ORDER BY ALL")
    assert res.rows == [("cifar", 1), ("mnist", 3), (None, 1)]


def test_list_runs_and_cli_filter_by_project_and_group(store):
    with connect(store) as con:
        assert {r["run"] for r in list_runs(con, projects=["mnist"])} == {"mnist-a1", "mnist-a2", "mnist-b1"}
        assert {r["run"] for r in list_runs(con, projects=["mnist"], groups=["sweep-b"])} == {"mnist-b1"}
        assert {r["run"] for r in list_runs(con, projects=["mnist", "cifar"])} == {
            "mnist-a1",
            "mnist-a2",
            "mnist-b1",
            "cifar-1",
        }
        assert len(list_runs(con)) == len(RUNS)
    cli = CliRunner()
    res = cli.invoke(
        main, ["runs", "--db", str(store), "--project", "mnist", "--group", "sweep-a", "--format", "json"]
    )
    assert res.exit_code == 0, res.output
    rows = json.loads(res.output)
    assert sorted(r["run"] for r in rows) == ["mnist-a1", "mnist-a2"]
    assert {r["run_group"] for r in rows} == {"sweep-a"}
    res = cli.invoke(main, ["runs", "--db", str(store), "--project", "cifar"])
    assert res.exit_code == 0, res.output
    assert "cifar-1" in res.output and "mnist" not in res.output


@pytest.mark.subprocess
def test_summary_folds_metrics_and_summary_events(store):
    with connect(store) as con:
        s = {r["key"]: r for r in details.run_summary(con, "mnist-a1")}
        plain = {r["key"]: r for r in details.run_summary(con, "mnist-a2")}
    assert s["best_acc"]["value"] == 0.95 and s["best_acc"]["origin"] == "summary"
    assert s["eval/ppl"]["value"] == 12.5 and s["note"]["value"] == "good"
    # set to 0.5, then logged 0.25: the later value wins, as in wandb
    assert s["loss"]["value"] == 0.25
    assert s["acc"] == {**s["acc"], "value": pytest.approx(0.4), "origin": "metric"}
    assert {k: r["value"] for k, r in plain.items()} == {"loss": 1.0, "acc": pytest.approx(0.4)}
    assert {r["origin"] for r in plain.values()} == {"metric"}
    res = run_user_sql(store, "SELECT value FROM run_summary WHERE run = 'mnist-a1' AND key = 'best_acc'")
    assert json.loads(res.rows[0][0]) == 0.95


def test_later_summary_event_overrides_key_by_key(tmp_path):
    runs_dir, db = tmp_path / "runs", tmp_path / "s.duckdb"
    run = wandb.init(run_id="r", runs_dir=runs_dir)
    run.log({"loss": 2.0}, step=0)
    run.event("summary", {"a": 1, "loss": 9.0})
    run.event("summary", {"a": 2, "b": "x"})
    run.finish()
    ingest(runs_dir, db)
    with connect(db) as con:
        got = {r["key"]: (r["value"], r["origin"]) for r in details.run_summary(con, "r")}
    assert got == {"a": (2, "summary"), "b": ("x", "summary"), "loss": (9.0, "summary")}


@pytest.mark.subprocess
def test_histograms_and_artifacts_are_queryable(store):
    res = run_user_sql(
        store,
        "SELECT step, bucket_counts, count FROM histograms WHERE run = 'mnist-a1' AND name = 'grad/hist' ORDER BY step",
    )
    assert res.rows == [(2, [3, 5, 1], 9.0), (4, [1, 7, 2], 10.0)]
    with connect(store) as con:
        assert details.histogram_names(con, "mnist-a1") == [("grad/hist", 2)]
        assert details.histograms(con, "mnist-a1", "grad/hist")[-1]["bucket_limits"] == [0.0, 1.0, 2.0, 4.0]
        arts = details.artifacts(con, "mnist-a1")
        assert [(a["name"], a["type"], a["path"], a["bytes"]) for a in arts] == [
            ("config", "config", "/tmp/cfg.yaml", 123)
        ]
        assert details.run_info(con, "cifar-1")["project"] == "cifar"


def _listed(v) -> list[str]:
    """A query parameter as AppTest holds it: one value as a str, several as a list."""
    return [v] if isinstance(v, str) else list(v)


def _shown(at: AppTest) -> list[str]:
    return sorted(at.dataframe[0].value["run"])


def test_runs_page_filters_by_project_and_group(store):
    at = page("runs")
    assert not at.exception
    assert _shown(at) == sorted(r for r, _, _ in RUNS)
    assert at.multiselect(key="runs_project").options == ["cifar", "mnist"]
    at.multiselect(key="runs_project").select("mnist").run()
    assert _shown(at) == ["mnist-a1", "mnist-a2", "mnist-b1"]
    assert _listed(at.query_params["project"]) == ["mnist"]  # the filter is a link
    at.multiselect(key="runs_group").select("sweep-b").run()
    assert _shown(at) == ["mnist-b1"]
    assert _listed(at.query_params["group"]) == ["sweep-b"]
    assert "sweep-b" in list(at.dataframe[0].value["group"])

    linked = page("runs", project="cifar")  # a link opens the filtered view
    assert not linked.exception
    assert _shown(linked) == ["cifar-1"]
    assert linked.multiselect(key="runs_project").value == ["cifar"]

    at = page("runs")
    at.text_input(key="runs_q").input("sweep-a").run()  # the search sees groups too
    assert _shown(at) == ["mnist-a1", "mnist-a2"]


def test_live_page_shows_summary_histogram_and_artifacts(store):
    at = page("live", run="mnist-a1")
    assert not at.exception
    exp = [e for e in at.expander if "Run details" in e.label]
    assert exp and "1 histograms" in exp[0].label and "1 artifacts" in exp[0].label
    summary = next(f.value for f in at.dataframe if "key" in f.value.columns)
    got = dict(zip(summary["key"], summary["value"], strict=True))
    assert got["best_acc"] == "0.95" and got["eval/ppl"] == "12.5" and got["loss"] == "0.25"
    arts = next(f.value for f in at.dataframe if "path" in f.value.columns)
    assert list(arts["path"]) == ["/tmp/cfg.yaml"]
    assert any("Project** mnist" in m.value and "Group** sweep-a" in m.value for m in at.markdown)
    assert at.selectbox(key="details_hist_mnist-a1").value == "grad/hist"


@pytest.mark.subprocess
def test_a_small_ingest_and_query_do_not_import_pandas(tmp_path):
    """The fixed cost of reading a run back: ingest + a query never load pandas (~0.5-1.3 s of import)."""
    import subprocess
    import sys

    runs_dir, db = tmp_path / "runs", tmp_path / "s.duckdb"
    run = wandb.init(project="p", id="small", dir=runs_dir)
    for _ in range(20):
        run.log({"train/loss": 2.0, "grad/norm/total": 1.0})
    run.event("note", {"text": "hello"})
    run.finish()
    code = (
        "import sys; from observatory.pipeline import ingest; from observatory.store import connect\n"
        "from observatory.queries.core import metric_series\n"
        f"ingest({str(runs_dir)!r}, {str(db)!r}, emit=None)\n"
        f"con = connect({str(db)!r}); n = len(metric_series(con, 'small', 'train/loss')['step']); con.close()\n"
        "print(n, 'pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    assert out.stdout.split() == ["20", "False"], out.stderr
