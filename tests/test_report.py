"""Post-mortem reports for a completed, a failed (NaN loss) and a crashed run, from a real store.

The fixture runs are written by the real writer (`observatory.init`) and loaded by
the real ingest into a DuckDB file; `make_store` is shared with the browser test.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

import observatory
from observatory import decisions as dec
from observatory import report
from observatory.cli import main
from observatory.events import OBSERVATORY_HOST
from observatory.pipeline import ingest
from observatory.report.figures import figures

STEPS = 120
NAN_AT = 70  # the failed run's loss is NaN from here
WARN_AT = 66  # ... and its grad norm climbs from here (the precursor)
FORK_AT = 50  # the crashed run resumes `done` from this step


def _metrics(step: int, blowup: int | None = None) -> dict[str, float]:
    loss = 2.0 + 6.0 * (step + 10) ** -0.5 + (1.5 if step == 60 else 0.0)
    grad = 1.0 + 0.002 * step
    if blowup is not None and step >= blowup - 4:
        grad *= 4.0 ** (step - blowup + 5)  # grows for a few steps before the loss goes
    if blowup is not None and step >= blowup:
        loss = math.nan
    return {
        "train/loss": loss,
        "grad/norm/total": grad,
        "opt/lr": 3e-4,
        "data/tokens": float((step + 1) * 4096),
        "moe/drop_fraction": 0.05 + 0.0005 * step,
    }


def _experts(run, step: int) -> None:
    run.log_expert_load(step, 0, [300, 100, 100, 0], [40, 0, 0, 0])  # expert 0 hot, expert 3 dead
    run.log_expert_load(step, 1, [125, 125, 125, 125], [1, 2, 3, 4])


def _finding(runs, run_id: str, kind: str, data: dict, step: int) -> None:
    """Write as the observatory does: host 1000 of the run's folder, no run_start/run_end."""
    w = observatory.init(
        run_id=run_id, runs_dir=runs, host=OBSERVATORY_HOST, write_start=False, install_signal_handlers=False
    )
    w.event(kind, data, step=step)
    w.close()


def make_store(root: Path) -> tuple[Path, Path]:
    """Three runs in <root>/runs ingested into <root>/obs.duckdb: `done`, `nan` (failed), `crash`."""
    runs, db = root / "runs", root / "obs.duckdb"
    ladder = {"name": "lad", "rung": "d64"}
    cfg = {"model": {"d_model": 64, "experts": 4}, "optim": {"lr": 3e-4, "z_loss": 0.0}, "steps": STEPS}
    with observatory.init(
        run_id="done", runs_dir=runs, config=cfg, ladder=ladder, install_signal_handlers=False
    ) as r:
        r.event(
            "forecast",
            {
                "metric": "train/loss",
                "target_step": STEPS - 1,
                "value": 2.5,
                "low": 2.4,
                "high": 2.6,
                "method": "ladder",
                "source": {"ladder": "lad", "fit": 1},
            },
        )
        for s in range(STEPS):
            r.log(_metrics(s), step=s)
            if s % 10 == 0:
                _experts(r, s)
        r.event("eval", {"dataset": "val", "loss": 2.6}, step=100)
        r.event("checkpoint", {"path": "/ckpt/done/100", "bytes": 12_000_000}, step=100)
    _finding(
        runs,
        "done",
        "anomaly",
        {
            "detector": "loss_spike",
            "metric": "train/loss",
            "severity": "warn",
            "message": "robust z 9.1 over 128 steps",
            "window": [60, 60],
        },
        60,
    )
    with observatory.init(
        run_id="nan",
        runs_dir=runs,
        config=cfg,
        ladder={"name": "lad", "rung": "d64-hot"},
        install_signal_handlers=False,
    ) as r:
        for s in range(NAN_AT + 1):
            r.log(_metrics(s, blowup=NAN_AT), step=s)
            if s % 10 == 0:
                _experts(r, s)
        r.event(
            "failure", {"type": "nan_loss", "message": "train/loss is nan", "action": "halt"}, step=NAN_AT
        )
        r.finish("failed", NAN_AT)
    _finding(
        runs,
        "nan",
        "anomaly",
        {
            "detector": "grad_norm_spike",
            "metric": "grad/norm/total",
            "severity": "critical",
            "message": "grad norm x16 in 2 steps",
            "window": [WARN_AT, WARN_AT + 1],
        },
        WARN_AT + 1,
    )
    crash = observatory.init(
        run_id="crash",
        runs_dir=runs,
        config={**cfg, "optim": {"lr": 1e-4, "z_loss": 1e-4}},
        parent={"run": "done", "step": FORK_AT},
        install_signal_handlers=False,
    )
    crash.event(
        "config_diff",
        {
            "against": {"run": "done", "step": FORK_AT},
            "changes": {"optim.lr": [3e-4, 1e-4], "optim.z_loss": [0.0, 1e-4]},
        },
        FORK_AT,
    )
    for s in range(FORK_AT + 1, 90):
        crash.log(_metrics(s), step=s)
    crash.close()  # the process "dies": no run_end
    time.sleep(0.6)
    dec.new(
        runs,
        db,
        id="zloss-after-spike",
        title="Resume with z-loss and a lower LR",
        kind="intervention",
        runs=[{"run": "crash", "step": FORK_AT}],
        action="z_loss=1e-4, lr 3e-4 -> 1e-4",
        forecast={"metric": "train/loss", "value": 2.45},
        author="ana",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OBSERVATORY_STALE_AFTER_S", "0.5")  # the crashed run's writer went silent
        time.sleep(0.6)
        ingest(runs, db, hooks=False, emit=None)
        dec.after_ingest(db, runs, None)
        ingest(runs, db, hooks=False, emit=None)
    return runs, db


def shared_store(tmp_path_factory) -> tuple[Path, Path]:
    """`make_store` once per test session (the browser test uses the same runs)."""
    root = tmp_path_factory.getbasetemp() / "report-store"
    if not (root / "obs.duckdb").exists():
        root.mkdir(exist_ok=True)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("OBSERVATORY_STALE_AFTER_S", "0.5")
            make_store(root)
    return root / "runs", root / "obs.duckdb"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return shared_store(tmp_path_factory)


@pytest.fixture
def env(store, monkeypatch):
    runs, db = store
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    # the crashed run's writer went silent a moment ago; its decisions (host 1000) came later
    monkeypatch.setenv("OBSERVATORY_STALE_AFTER_S", "0.5")
    return runs, db


def test_completed_run_report(env, tmp_path):
    _, db = env
    res = CliRunner().invoke(main, ["report", "done", "--out", str(tmp_path), "--db", str(db), "--no-ingest"])
    assert res.exit_code == 0, res.output
    path = Path(res.output.strip())
    assert path == tmp_path / "done.html"
    html = path.read_text(encoding="utf-8")
    for sec in ("summary", "timeline", "windows", "experts", "decisions", "lineage", "config", "ladder"):
        assert f'<section id="{sec}">' in html
    assert "status-completed" in html and "Post-mortem: done" in html
    # offline: plotly.js is inline, no script or stylesheet comes from elsewhere (the browser test
    # also checks that opening the file makes no network request)
    assert not re.search(r"<script[^>]+src=", html) and not re.search(r"<link[^>]+href=", html)
    assert len(html) > 3_000_000  # plotly.js itself
    rep = report.build(db, "done")
    names = list(figures(rep))
    assert names[:2] == ["overview", "forecast"] and {"experts", "drops", "window-1"} <= set(names)
    assert html.count('data-figure="') == len(names)
    # the forecast comparison, the ladder, the expert summary and the child in the lineage
    fc = rep.forecasts[0]
    assert fc["verdict"] == "inside band" and fc["actual_step"] == STEPS - 1
    assert {x["run"] for x in rep.ladder} == {"done", "nan"}
    layer0 = rep.expert_layers[0]
    assert layer0["dead"] == 1 and layer0["hottest"] == 0 and layer0["max_over_mean"] == pytest.approx(2.4)
    assert layer0["drop_fraction"] == pytest.approx(0.08)
    assert [r["run"] for r in rep.lineage.children] == ["crash"]
    assert any(e["kind"] == "checkpoint" and e["step"] == 100 for e in rep.timeline)


def test_failed_run_report_explains_the_nan(env):
    _, db = env
    rep = report.build(db, "nan")
    story = " ".join(rep.story)
    assert rep.status == "failed"
    assert f"train/loss first became non-finite at step {NAN_AT}" in story
    assert f"Failure at step {NAN_AT}: nan_loss: train/loss is nan; action: halt" in story
    lead = NAN_AT - (WARN_AT + 1)
    assert f"the first warning came at step {WARN_AT + 1}, {lead} steps before the failure" in story
    assert dict(rep.summary)["first non-finite loss"] == f"step {NAN_AT}"
    kinds = [w["kind"] for w in rep.windows]
    assert sorted(kinds) == ["anomaly", "failure"]
    fail_win = next(w for w in rep.windows if w["kind"] == "failure")
    loss = dict(fail_win["series"]["train/loss"])
    assert math.isnan(loss[NAN_AT]) and fail_win["lo"] <= WARN_AT
    html = report.render_html(rep)
    assert "status-failed" in html and "non-finite" in html


def test_crashed_run_report(env):
    _, db = env
    rep = report.build(db, "crash")
    assert rep.status == "crashed"
    assert (
        rep.story[0].startswith("crash crashed: no run_end was written") and "after step 89" in rep.story[0]
    )
    assert f"It started from done at step {FORK_AT}." in rep.story
    assert [r["run"] for r in rep.lineage.chain] == ["done", "crash"]
    assert "lineage" in figures(rep)
    ids = {d.id for d in rep.decisions}
    assert "zloss-after-spike" in ids and any(i.startswith("auto-crash-") for i in ids)
    diff_keys = {k for e in rep.config_diffs for k in e["data"]["changes"]}
    assert diff_keys == {"optim.lr", "optim.z_loss"}
    assert any(f["source_text"].startswith("decision zloss-after-spike") for f in rep.forecasts)


def test_same_store_same_report(env, tmp_path):
    _, db = env
    a = report.write(db, "nan", tmp_path / "a", "html").read_bytes()
    b = report.write(db, "nan", tmp_path / "b", "html").read_bytes()
    assert a == b


def test_pseudo_run_and_unknown_run(env, tmp_path):
    runs, db = env
    dec.new(runs, db, id="policy-1", title="Always pre-register a forecast", kind="policy", ingest=ingest)
    rep = report.build(db, "decisions")
    assert rep.status == "records" and "policy-1" in {d.id for d in rep.decisions}
    res = CliRunner().invoke(
        main, ["report", "ghost", "--out", str(tmp_path), "--db", str(db), "--no-ingest"]
    )
    assert res.exit_code != 0 and "no run 'ghost'" in res.output


@pytest.mark.slow
def test_markdown_report_with_png_figures(env, tmp_path):
    _, db = env
    path = report.write(db, "nan", tmp_path, "md")
    md = path.read_text(encoding="utf-8")
    pngs = re.findall(r"!\[[^\]]*\]\((nan_figures/[^)]+\.png)\)", md)
    assert "overview" in " ".join(pngs) and len(pngs) == len(figures(report.build(db, "nan")))
    for rel in pngs:
        data = (tmp_path / rel).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    assert f"first became non-finite at step {NAN_AT}" in md and "| step | time | kind | what |" in md


@pytest.mark.slow
def test_pdf_report(env, tmp_path):
    _, db = env
    res = CliRunner().invoke(
        main, ["report", "crash", "--out", str(tmp_path), "--format", "pdf", "--db", str(db)]
    )
    assert res.exit_code == 0, res.output
    data = (tmp_path / "crash.pdf").read_bytes()
    assert data.startswith(b"%PDF-") and len(data) > 20_000


@pytest.mark.slow
def test_one_command_after_a_run_that_went_wrong(tmp_path):
    """A new user's path: the trainer died on a NaN; nothing ingested yet; one command explains it."""
    runs, db, out = tmp_path / "runs", tmp_path / "obs.duckdb", tmp_path / "out"
    with pytest.raises(FloatingPointError):
        with observatory.init(
            run_id="oops", runs_dir=runs, config={"lr": 1.0}, install_signal_handlers=False
        ) as r:
            for s in range(40):
                loss = 3.0 - 0.01 * s if s < 33 else math.nan
                r.log({"train/loss": loss, "grad/norm/total": 1.0 if s < 30 else 10.0 ** (s - 29)}, step=s)
                if math.isnan(loss):
                    raise FloatingPointError(f"loss is nan at step {s}")
    res = CliRunner().invoke(
        main, ["report", "oops", "--runs-dir", str(runs), "--db", str(db), "--out", str(out)]
    )
    assert res.exit_code == 0, res.output
    html = (out / "oops.html").read_text(encoding="utf-8")
    assert "status-failed" in html
    assert "train/loss first became non-finite at step 33" in html
    assert "Failure at step 33: exception: FloatingPointError: loss is nan at step 33; action: halt." in html


@pytest.mark.slow
def test_reports_page_renders(env):
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(
        "from observatory.dashboard.pages import reports\nreports.render()\n", default_timeout=120
    )
    at.query_params["run"] = "nan"
    at.run()
    assert not at.exception
    (frame,) = at.get("iframe")  # the story once, in the report (not also in Markdown above it)
    assert f"first became non-finite at step {NAN_AT}" in frame.proto.srcdoc
    assert not any("first became non-finite" in m.value for m in at.markdown)


def test_info_findings_are_not_the_headlines_warning(tmp_path):
    """A healthy run on a busy machine: its info findings (throughput dips) are counted, not announced as
    'the first warning'."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    with observatory.init(run_id="busy", runs_dir=runs, install_signal_handlers=False) as r:
        for s in range(STEPS):
            r.log({"train/loss": 2.0 + 6.0 * (s + 10) ** -0.5}, step=s)
    for step in (20, 40, 60):
        data = {"detector": "throughput_drop", "metric": "throughput/tokens_per_s", "severity": "info"}
        _finding(runs, "busy", "anomaly", {**data, "message": "a dip", "window": [step, step + 5]}, step)
    ingest(runs, db, emit=None)
    story = " ".join(report.build(db, "busy").story)
    assert "warning came" not in story and "anomalies" not in story, story
    assert "No warning" in story and "3 info findings (worth knowing, not warnings" in story
