"""`make demo` seeds the runs dir with the committed sample ladder; it must ingest cleanly."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

import observatory
from observatory import decisions as dec
from observatory import demo
from observatory.dashboard.pages import live
from observatory.dashboard.runs_table import runs_table
from observatory.pipeline import ingest
from observatory.queries import dashboard as qd
from observatory.queries.core import list_runs
from observatory.store import connect
from trainer.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_samples_seed_and_ingest_without_rejections(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    n = demo.seed_samples(runs)
    assert n >= 5, "data/samples should hold a ladder of 4 rungs and a target"
    assert demo.seed_samples(runs) == 0  # seeding twice copies nothing
    rep = ingest(runs, db, hooks=False)
    assert rep.rejected == 0
    with connect(db) as con:
        ladders = con.execute(
            "SELECT count(*) FILTER (WHERE ladder_name IS NOT NULL), count(*) FROM runs"
        ).fetchall()[0]
        forecasts = con.execute("SELECT count(*) FROM events WHERE kind = 'forecast'").fetchall()[0][0]
        statuses = {r["status"] for r in list_runs(con)}
    assert ladders[0] == ladders[1] - 1 == n - 1  # every sample run is a ladder run but the previous demo run
    assert forecasts >= 1, "the target's pre-registered forecast is part of the sample"
    assert statuses == {"completed", "preempted"}  # the previous demo run was stopped with Ctrl-C


def test_a_first_demo_run_is_drawn_against_the_samples_previous_demo_run(tmp_path, monkeypatch):
    """On a fresh clone the Live page has a previous demo run to show the live one against."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    demo.seed_samples(runs)
    # the demo's live run as demo.py starts it: tiny.yaml (named "tiny"), DEFAULT_STEPS steps
    cfg = load_config(
        ROOT / "trainer" / "configs" / "tiny.yaml", [f"steps={demo.DEFAULT_STEPS}", *demo.LONG_RUN]
    )
    with observatory.writer.init(
        run_id="demo-new", runs_dir=runs, name=cfg.name, config=cfg.to_dict()
    ) as run:
        run.log({"train/loss": 5.0}, step=0)
    ingest(runs, db, hooks=False)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    rows = runs_table()
    assert live.previous_run(rows, "demo-new") == "demo-sample"
    assert next(r for r in rows if r["run"] == "demo-sample")["last_step"] >= 2000


def test_samples_carry_the_ladders_decision_history(tmp_path):
    """The sample ladder's decisions (data/samples/decisions.sh) reach the store with their dates."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    demo.seed_samples(runs)
    # a runs dir seeded before the samples had decision records gets them on the next seeding
    (runs / "ladder-cpu-d48" / "events.1000.jsonl.gz").unlink()
    assert demo.seed_samples(runs) == 1
    ingest(runs, db, hooks=False)
    with connect(db) as con:
        ds = {d.id: d for d in dec.list_decisions(con)}
        run_ids = {r["run"] for r in list_runs(con)}
        marks = qd.markers(con, "ladder-cpu-d72")
    assert set(ds) == {
        "lr-one-over-width",
        "seeds-4-to-12",
        "fit-version-4-forward-band",
        "first-target-d72",
        "seeds-24-second-target",
    }
    first, second = ds["first-target-d72"], ds["seeds-24-second-target"]
    assert first.status == "failed" and second.status == "succeeded"
    assert first.forecast.value == pytest.approx(1.9067) and second.forecast.value == pytest.approx(1.8903)
    assert first.created == datetime(2026, 11, 29, 14, 2, 3, tzinfo=UTC).timestamp()
    assert second.updated == datetime(2026, 11, 29, 14, 34, 47, tzinfo=UTC).timestamp()
    assert ds["seeds-4-to-12"].config_diff == {"seeds": [4, 12]}
    assert ds["lr-one-over-width"].config_diff["rungs.d48.optimizer.lr"] == [0.00755, 0.0045]
    for d in ds.values():
        assert d.hypothesis and d.outcome and d.follow_up and d.runs, d.id
        assert {link.run for link in d.runs} <= run_ids, d.id
    # the Live page's markers for the first target include its decision at step 0
    steps = marks.filter(marks["kind"] == "decision")["step"].to_list()
    assert 0 in steps


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_ladder_page_marks_the_samples_decisions(tmp_path, monkeypatch):
    """The sample ladder's decision history shows on the Ladder page's target charts, at their steps."""
    from streamlit.testing.v1 import AppTest

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    demo.seed_samples(runs)
    ingest(runs, db, hooks=False)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = AppTest.from_string(
        "from observatory.dashboard.pages import ladder\nladder.render()\n", default_timeout=180
    ).run()
    assert not at.exception, at.exception
    charts = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    targets = [c for c in charts if "against its" in c["layout"].get("title", {}).get("text", "")]
    assert len(targets) == 2
    for c in targets:
        marks = [t for t in c["data"] if t.get("name") == "decision"]
        assert marks and len(marks[0]["x"]) == 5, c["layout"]["title"]["text"]
        assert any("first-target-d72" in s for s in marks[0]["text"])


@pytest.mark.slow
def test_demo_prints_a_few_lines_and_the_url_last(tmp_path):
    """`make demo` once printed the 99-row run table before its URL; now a few lines, the URL the last."""
    import os
    import signal
    import time

    from browser_fixtures import free_port, start_demo
    from polling import wait_until

    port = free_port()
    proc, log = start_demo(tmp_path, port)
    try:
        wait_until(lambda: "Dashboard:" in log.read_text() or proc.poll() is not None, 300, every=1)
        time.sleep(3)  # whatever the children print at their start would come now
        lines = [line for line in log.read_text().splitlines() if line.strip()]
        assert (
            lines
            and lines[-1].strip()
            == f"Dashboard:  http://localhost:{port}/live?run=" + lines[-1].split("=")[-1]
        )
        assert len(lines) <= 8, "\n".join(lines)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
