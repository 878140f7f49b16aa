"""The W&B mirror sink: real wandb in offline mode, read back with our own importer."""

from __future__ import annotations

import math
import time

import pytest

pytest.importorskip("wandb")

import observatory  # noqa: E402
from observatory.interop.wandb_import import convert_wandb_file, find_wandb_files  # noqa: E402
from observatory.interop.wandb_mirror import WandbMirror  # noqa: E402


def _read_back(folder, timeout_s: float = 60.0):
    """Our import of the mirror's W&B file, once W&B's core has written all of it.

    `wandb.finish()` returns before wandb-core's writer has flushed the transaction log, so
    poll until the file holds the run's exit record.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        wandb_file = max(find_wandb_files([folder]), key=lambda f: f.stat().st_mtime)  # newest session
        log, res = convert_wandb_file(wandb_file)
        if (res.error is None and res.status != "crashed") or time.monotonic() > deadline:
            return log, res
        time.sleep(0.2)


@pytest.fixture(autouse=True)
def offline_wandb(tmp_path, monkeypatch):
    # never reach the network, keep wandb's files in the test's folder
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-default"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)


@pytest.mark.slow  # real wandb.init + finish
def test_mirrored_run_reads_back_with_the_same_values_steps_and_config(tmp_path):
    mirror = WandbMirror(project="obs-mirror", mode="offline", run_id="mirror-1", dir=tmp_path / "wb")
    config = {"lr": 1e-3, "model": {"experts": 8}, "hf_token": "secret"}
    run = observatory.init(
        run_id="mirror-1",
        config=config,
        runs_dir=tmp_path / "runs",
        sinks=[mirror],
        install_signal_handlers=False,
    )
    logged = {}
    worst = 0.0
    for step in range(0, 120, 3):
        values = {"train/loss": 4.0 / (1 + step), "moe/drop_fraction": (step % 5) / 10}
        if step == 30:
            values["train/loss"] = float("nan")
        t0 = time.perf_counter()
        run.log(values, step=step)
        worst = max(worst, time.perf_counter() - t0)
        logged[step] = values
    run.event("eval", {"dataset": "val", "loss": 2.5}, step=117)
    run.finish()
    assert worst < 0.05, f"a log call waited {worst:.3f}s"  # the step never waits for W&B
    assert mirror.error is None and mirror.dropped == 0

    log, res = _read_back(tmp_path / "wb")
    assert res.run == "wandb-mirror-1" and res.status == "completed" and not res.problems
    got = {ev["step"]: ev["data"] for ev in log.events if ev["kind"] == "metrics"}
    expected = {s: dict(v) for s, v in logged.items()}
    expected[117]["eval/val/loss"] = 2.5
    assert got.keys() == expected.keys()
    for step, values in expected.items():
        assert got[step].keys() == values.keys()
        for name, x in values.items():
            y = got[step][name]
            assert (math.isnan(x) and y == "nan") or y == x, (step, name, x, y)
    start = log.events[0]["data"]
    assert start["config"] == {"lr": 1e-3, "model": {"experts": 8}, "hf_token": "<redacted>"}
    assert start["wandb"]["project"] == "obs-mirror"
    assert log.events[-1]["data"]["summary"]["final_step"] == 117


@pytest.mark.slow  # real wandb.init + finish
def test_init_is_lazy_and_write_returns_at_once(tmp_path):
    mirror = WandbMirror(project="obs-mirror", run_id="lazy-1", config={"a": 1}, dir=tmp_path / "wb")
    assert mirror.wandb_run is None and not (tmp_path / "wb").exists()  # constructing starts nothing
    ev = {
        "v": 1,
        "run": "lazy-1",
        "kind": "metrics",
        "step": 0,
        "t": 0.0,
        "host": 0,
        "seq": 0,
        "data": {"x": 1.0},
    }
    t0 = time.perf_counter()
    mirror.write([ev])
    assert time.perf_counter() - t0 < 0.05  # wandb.init (about a second) happens on the mirror's thread
    mirror.close()
    assert mirror.error is None and mirror.sent == 1
    log, res = _read_back(tmp_path / "wb")
    assert res.status == "completed" and log.events[0]["data"]["config"] == {"a": 1}
    assert [ev["data"] for ev in log.events if ev["kind"] == "metrics"] == [{"x": 1.0}]


def test_a_failing_mirror_never_hurts_the_run(tmp_path, capsys):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where W&B wants its folder")
    mirror = WandbMirror(project="obs-mirror", run_id="broken-1", dir=blocker)
    run = observatory.init(
        run_id="broken-1", runs_dir=tmp_path / "runs", sinks=[mirror], install_signal_handlers=False
    )
    for step in range(20):
        run.log({"train/loss": 1.0}, step=step)
    run.finish()
    assert mirror.error is not None
    assert "mirroring to W&B stopped" in capsys.readouterr().err
    lines = (tmp_path / "runs" / "broken-1" / "events.0.jsonl").read_text().splitlines()
    assert (
        len(lines) == 25
    )  # run_start, the phases init, train and shutdown, 20 metrics, run_end: our own log is complete


def test_mirror_rejects_bad_arguments():
    with pytest.raises(ValueError, match="disabled"):
        WandbMirror(project="p", mode="disabled")
    with pytest.raises(ValueError, match="project"):
        WandbMirror(project="", mode="offline")


def test_closing_a_mirror_that_never_got_events_starts_no_wandb_run(tmp_path):
    mirror = WandbMirror(project="p", dir=tmp_path / "wb")
    mirror.close()
    assert mirror.wandb_run is None and not (tmp_path / "wb").exists()


@pytest.mark.slow  # two real wandb sessions
def test_resumed_training_run_mirrors_to_one_wandb_run(tmp_path):
    from observatory.interop.wandb_import import import_wandb

    for session, steps in enumerate((range(0, 5), range(5, 10))):
        mirror = WandbMirror(project="obs-mirror", run_id="resumed-1", dir=tmp_path / "wb")
        run = observatory.init(
            run_id="resumed-1", runs_dir=tmp_path / "runs", sinks=[mirror], install_signal_handlers=False
        )
        for step in steps:
            run.log({"train/loss": float(step)}, step=step)
        run.finish("killed" if session == 0 else "completed")
        _read_back(tmp_path / "wb")  # (the newest session's file; waits for W&B's writer)
    results = import_wandb([tmp_path / "wb"], tmp_path / "imported", ingest=False)
    assert [r.run for r in results] == ["wandb-resumed-1", "wandb-resumed-1"] and results[
        0
    ].status == "completed"
    lines = (tmp_path / "imported" / "wandb-resumed-1" / "events.0.jsonl").read_text().splitlines()
    import json

    got = [json.loads(x) for x in lines]
    assert [e["step"] for e in got if e["kind"] == "metrics"] == list(range(10))
    assert [e["kind"] for e in got].count("run_end") == 1
