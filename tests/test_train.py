"""The training loop end to end on the real stdlib corpus: events, resume, fork, faults, failures.

One tiny model shape is shared by every run here, so the jitted step compiles once per process
(and the persistent compilation cache makes the CLI subprocesses cheap too).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from observatory.interop.simulate import STEP_SCALARS
from trainer.config import load_config
from trainer.data import load_corpus
from trainer.faults import InjectedCrash
from trainer.runtime import enable_compile_cache
from trainer.step import lr_schedule
from trainer.train import train, train_with_status

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "trainer" / "configs" / "tiny.yaml"
QUIET = ["telemetry.progress=false", "telemetry.peak_flops=1e10"]  # no bar, no probe in tests
BIN = Path(sys.executable).parent

enable_compile_cache()

pytestmark = pytest.mark.slow


def events(runs: Path, run: str, host: int = 0) -> list[dict]:
    return [json.loads(line) for line in (runs / run / f"events.{host}.jsonl").read_text().splitlines()]


def of(evs, kind):
    return [e for e in evs if e["kind"] == kind]


def losses(evs) -> dict[int, float]:
    """step -> train/loss of the LAST metrics event at that step (a rollback re-logs steps)."""
    out = {}
    for e in of(evs, "metrics"):
        if "train/loss" in e["data"]:
            out[e["step"]] = float(e["data"]["train/loss"])  # "nan" -> nan
    return out


def cfg(*overrides):
    return load_config(TINY, [*QUIET, *overrides])


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """One real 60-step run with checkpoints at 20, 40 and 60, reused by most tests below."""
    runs = tmp_path_factory.mktemp("runs")
    c = cfg("steps=60", "checkpoint.every=20", "checkpoint.keep=5", "eval.every=30", "tags=[base]")
    run_id = train(c, runs, run_id="base")
    return runs, run_id, events(runs, run_id)


def test_base_run_writes_the_full_event_stream(base):
    runs, run_id, evs = base
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    start = evs[0]
    assert start["kind"] == "run_start"
    d = start["data"]
    assert d["config"]["steps"] == 60 and d["tags"] == ["base"]
    assert (
        d["data"]["name"].endswith("-stdlib")
        and len(d["data"]["fingerprint"]) == 16
        and d["data"]["tokens"] > 1e6
    )
    assert d["model"]["params_active"] < d["model"]["params_total"] and d["model"]["flops_per_token"] > 0
    assert d["mesh"] == {"data": 1, "expert": 1, "processes": 1, "devices": d["mesh"]["devices"]}
    assert set(d["code"]) == {"commit", "dirty"}

    metrics = of(evs, "metrics")
    assert [m["step"] for m in metrics] == list(range(1, 61))
    m = metrics[30]["data"]
    for name in (
        *STEP_SCALARS,  # the simulator's names are the trainer's
        "grad/norm/total",
        "grad/norm/layers",
        "grad/norm/embed",
        "grad/norm/lm_head",
        "opt/update_norm",
        "opt/param_norm",
        "opt/lr",
        "throughput/tokens_per_s",
        "throughput/mfu",
        "data/tokens",
    ):
        assert name in m, name
    for layer in (0, 1):  # tiny: 2 layers, both MoE
        for name in ("z_loss", "lb_loss", "entropy"):
            assert f"router/layer_{layer}/{name}" in m
        assert f"moe/layer_{layer}/drop_fraction" in m
    assert m["data/tokens"] == 31 * 16 * 64
    assert m["throughput/mfu"] == pytest.approx(
        m["throughput/tokens_per_s"] * start["data"]["model"]["flops_per_token"] / 1e10
    )
    assert m["opt/lr"] == pytest.approx(float(lr_schedule(load_config(TINY, ["steps=60"]))[31]), rel=1e-5)
    # global norm is the root of the sum of squares of the per-module norms
    mods = [v for k, v in m.items() if k.startswith("grad/norm/") and k != "grad/norm/total"]
    assert math.sqrt(sum(v * v for v in mods)) == pytest.approx(m["grad/norm/total"], rel=1e-4)

    loads = of(evs, "expert_load")
    assert len(loads) == 60 * 2 and {e["data"]["layer"] for e in loads} == {0, 1}
    one = loads[0]["data"]
    assert len(one["routed"]) == 4 and sum(one["routed"]) == 16 * 64 * 2  # B*T tokens x top_k
    # measured drops agree with the drop-fraction metric of the same step
    step30 = [e["data"] for e in loads if e["step"] == 31]
    frac = sum(sum(x["dropped"]) for x in step30) / sum(sum(x["routed"]) for x in step30)
    assert frac == pytest.approx(m["moe/drop_fraction"], abs=1e-6)

    evals = of(evs, "eval")
    assert [e["step"] for e in evals] == [30, 60]
    assert evals[-1]["data"]["bpb"] == pytest.approx(evals[-1]["data"]["loss"] / math.log(2))
    ckpts = of(evs, "checkpoint")
    assert [e["step"] for e in ckpts] == [20, 40, 60]
    assert all(Path(e["data"]["path"]).is_dir() and e["data"]["bytes"] > 10_000 for e in ckpts)
    assert evs[-1]["kind"] == "run_end" and evs[-1]["data"] == {"status": "completed", "final_step": 60}
    # the process's phases, in order: a long eval or a synchronous save is a phase, not a stall
    phases = [(e["data"]["phase"], e["step"]) for e in of(evs, "phase")]
    assert phases[:3] == [("init", None), ("compile", None), ("train", 1)]
    assert ("eval", 30) in phases and ("checkpoint", 20) in phases and phases[-1][0] == "shutdown"
    assert {e["data"]["attempt"] for e in of(evs, "phase")} == {0}


def test_loss_falls_below_the_corpus_unigram_entropy(base):
    _, _, evs = base
    h = load_corpus(None).unigram_entropy()  # ~3.25 nats/byte for CPython's stdlib
    ls = losses(evs)
    assert ls[1] > h + 1.5  # starts near ln(256) = 5.55
    last = [ls[s] for s in range(51, 61)]
    assert sum(last) / len(last) < h
    assert of(evs, "eval")[-1]["data"]["loss"] < h


def test_fork_replays_the_same_curve_and_records_an_empty_diff(base):
    runs, run_id, evs = base
    fork = train(cfg("steps=60", "checkpoint.every=0", "eval.every=0"), runs, fork=f"{run_id}@40")
    fe = events(runs, fork)
    assert fe[0]["kind"] == "run_start" and fe[0]["data"]["parent"] == {"run": "base", "step": 40}
    diff = of(fe, "config_diff")[0]
    assert diff["data"]["against"] == {"run": "base", "step": 40}
    # only what this fork's overrides changed
    assert diff["data"]["changes"] == {
        "checkpoint.every": [20, 0],
        "checkpoint.keep": [5, 2],
        "eval.every": [30, 0],
        "tags": [["base"], []],
    }
    a, b = losses(evs), losses(fe)
    assert sorted(b) == list(range(41, 61))
    # same weights, optimizer state and batches: the fork continues the parent's curve exactly
    for s in range(41, 61):
        assert b[s] == pytest.approx(a[s], rel=1e-5, abs=1e-5), s


def test_fork_with_changes_lists_every_changed_key(base):
    runs, run_id, _ = base
    c = cfg("optimizer.lr=0.005", "steps=45", "schedule.kind=wsd")
    fork = train(c, runs, fork=f"{run_id}@40", tags=["lr-sweep"])
    fe = events(runs, fork)
    changes = of(fe, "config_diff")[0]["data"]["changes"]
    assert changes["optimizer.lr"] == [0.01, 0.005]
    assert changes["steps"] == [60, 45] and changes["schedule.kind"] == ["cosine", "wsd"]
    assert fe[0]["data"]["tags"] == ["lr-sweep"]
    assert [m["step"] for m in of(fe, "metrics")] == list(range(41, 46))


def test_resume_continues_the_same_run_and_sequence(base, tmp_path):
    runs, run_id, evs = base
    import shutil

    # resume a copy so the other tests keep the original
    shutil.copytree(runs / run_id, tmp_path / run_id)
    run2, status = train_with_status(
        cfg("steps=70", "checkpoint.every=20", "checkpoint.keep=5", "eval.every=30", "tags=[base]"),
        tmp_path,
        resume=run_id,
    )
    assert (run2, status) == (run_id, "completed")
    allev = events(tmp_path, run_id)
    assert [e["seq"] for e in allev] == list(range(len(allev)))  # the writer continued the file's seq
    assert len(of(allev, "run_start")) == 1
    diff = of(allev, "config_diff")[0]["data"]
    assert diff == {"against": {"run": run_id, "step": 60}, "changes": {"steps": [60, 70]}}
    steps = [m["step"] for m in of(allev, "metrics")]
    assert steps == list(range(1, 71))  # continuous, no gap, no restart from 1
    ls = losses(allev)
    assert abs(ls[61] - ls[60]) < 0.5 and ls[61] < 3.5  # picked up the trained weights
    assert of(allev, "run_end")[-1]["data"] == {"status": "completed", "final_step": 70}
    resumed = [e for e in of(allev, "phase") if e["seq"] > evs[-1]["seq"]]
    assert resumed[0]["data"] == {"phase": "init", "attempt": 1}  # the restart has an identity
    assert {e["data"]["attempt"] for e in resumed} == {1}
    # the store: running while the resumed process writes (the log cut before its last run_end; the
    # first session's run_end and no second run_start before it), completed at step 70 after
    from observatory import store
    from observatory.pipeline import ingest

    log = tmp_path / run_id / "events.0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    assert json.loads(lines[-1])["kind"] == "run_end"
    live = tmp_path / "live"
    (live / run_id).mkdir(parents=True)
    (live / run_id / "events.0.jsonl").write_bytes(b"".join(lines[:-1]))
    db = tmp_path / "store.duckdb"
    ingest(live, db, hooks=False, emit=None)
    with store.connect(db) as con:
        assert con.execute("SELECT status, final_step, last_step FROM runs").fetchall() == [
            ("running", None, 70)
        ]
    (live / run_id / "events.0.jsonl").write_bytes(b"".join(lines))
    ingest(live, db, hooks=False, emit=None)
    with store.connect(db) as con:
        assert con.execute("SELECT status, final_step FROM runs").fetchall() == [("completed", 70)]


def completed_run_events(tmp_path, *overrides: str) -> list[dict]:
    """The events of a run of the tiny config with `overrides`, which must have completed."""
    run_id, status = train_with_status(cfg(*overrides), tmp_path)
    assert status == "completed"
    return events(tmp_path, run_id)


def test_injected_faults_produce_their_events(tmp_path):
    evs = completed_run_events(
        tmp_path,
        "steps=8",
        "inject=lr_spike@3:x10",
        "inject=bad_batch@4",
        "inject=nan@6",
        "failure.on_nan=skip_batch",
        "eval.every=0",
        "checkpoint.at_exit=false",
    )
    notes = [e["data"]["text"] for e in of(evs, "note")]
    assert notes == ["fault injected: lr_spike@3:x10", "fault injected: bad_batch@4", "fault injected: nan@6"]
    m = {e["step"]: e["data"] for e in of(evs, "metrics")}
    lrs = lr_schedule(load_config(TINY, ["steps=8"]))
    assert m[3]["opt/lr"] == pytest.approx(10 * lrs[3], rel=1e-5)
    assert m[2]["opt/lr"] == pytest.approx(lrs[2], rel=1e-5)
    # bad batch: every token is the same byte, so in layer 0 every token picks the same top_k experts
    l0 = [e["data"] for e in of(evs, "expert_load") if e["step"] == 4 and e["data"]["layer"] == 0][0]
    assert sorted(l0["routed"]) == [0, 0, 16 * 64, 16 * 64]
    assert sum(l0["dropped"]) > 0  # capacity is 1.25x the balanced load: most of them are cut
    # NaN: reported as such, the update skipped, training went on
    assert m[6]["train/loss"] == "nan"
    assert m[6]["opt/update_norm"] == 0.0
    fail = of(evs, "failure")
    assert len(fail) == 1 and fail[0]["step"] == 6
    assert fail[0]["data"]["type"] == "nan_loss" and fail[0]["data"]["action"] == "skip_batch"
    assert all(isinstance(m[s]["train/loss"], float) for s in (7, 8))


def test_nan_rollback_restores_the_checkpoint_with_a_smaller_lr(tmp_path):
    evs = completed_run_events(
        tmp_path,
        "steps=10",
        "checkpoint.every=4",
        "inject=nan@6",
        "failure.on_nan=rollback",
        "failure.rollback_lr_scale=0.5",
        "eval.every=0",
    )
    fail = of(evs, "failure")
    assert [(f["step"], f["data"]["action"]) for f in fail] == [(6, "rollback")]
    assert "rolled back to step 4" in " ".join(e["data"]["text"] for e in of(evs, "note"))
    steps = [e["step"] for e in of(evs, "metrics")]
    # 1..6 (6 is NaN; 7, in flight when the NaN was seen, is discarded), then 5..10 again from step 4
    assert steps[:6] == [1, 2, 3, 4, 5, 6] and steps[6:] == [5, 6, 7, 8, 9, 10]
    lrs = lr_schedule(load_config(TINY, ["steps=10"]))
    last = {e["step"]: e["data"] for e in of(evs, "metrics")}
    assert last[8]["opt/lr"] == pytest.approx(0.5 * lrs[8], rel=1e-5)
    assert evs[-1]["data"] == {"status": "completed", "final_step": 10}


def test_nan_halt_checkpoints_and_ends_failed(tmp_path):
    run_id, status = train_with_status(
        cfg("steps=10", "inject=nan@3", "failure.on_nan=halt", "eval.every=0"), tmp_path
    )
    assert status == "failed"
    evs = events(tmp_path, run_id)
    fail = of(evs, "failure")
    assert [(f["step"], f["data"]["type"], f["data"]["action"]) for f in fail] == [(3, "nan_loss", "halt")]
    assert max(e["step"] for e in of(evs, "metrics")) <= 4  # stopped right away
    assert of(evs, "checkpoint")  # the clean weights are kept for a post-mortem
    assert evs[-1]["kind"] == "run_end" and evs[-1]["data"]["status"] == "failed"


def test_exception_writes_failure_with_traceback_and_run_end_failed(tmp_path):
    with pytest.raises(InjectedCrash):
        train(cfg("steps=10", "inject=crash@3", "eval.every=0"), tmp_path, run_id="crashy")
    evs = events(tmp_path, "crashy")
    fail = of(evs, "failure")[0]["data"]
    assert fail["type"] == "exception" and fail["action"] == "halt"
    assert "InjectedCrash" in fail["message"] and "Traceback" in fail["traceback"]
    assert evs[-1]["data"] == {"status": "failed", "final_step": 2}  # step 2 ran; its values were logged
    assert not of(evs, "checkpoint")


def test_a_resume_replays_the_lost_steps_and_the_store_shows_the_newest(tmp_path):
    """Attempt 0 takes a 30x LR spike at step 45 and crashes before step 51 (its last checkpoint: 40);
    `--resume` trains 41..50 again, healthy, then on to 60. The chart, the rollups, the detectors' series
    and the report show attempt 1's values at 41..50, one per step; a rebuild marks the same rows."""
    from observatory.pipeline import ingest, rebuild
    from observatory.queries import anomalies as qa
    from observatory.queries import dashboard as qd
    from observatory.store import connect

    base = ("steps=60", "checkpoint.every=20", "checkpoint.keep=5", "eval.every=0")
    with pytest.raises(InjectedCrash):
        train(cfg(*base, "inject=lr_spike@45:x30", "inject=crash@51"), tmp_path, run_id="replayed")
    first = losses(events(tmp_path, "replayed"))
    train(cfg(*base), tmp_path, resume="replayed")
    evs = events(tmp_path, "replayed")
    assert [e["step"] for e in of(evs, "metrics")].count(45) == 2
    newest = losses(evs)  # the last logged value of each step: attempt 1's
    assert any(abs(newest[s] - first[s]) > 1e-3 for s in range(46, 51))  # the replay is not attempt 0's
    db = tmp_path / "store.duckdb"
    ingest(tmp_path, db, emit=None)
    with connect(db) as con:
        d = qd.downsample(con, "replayed", ["train/loss"], 1, 60, 1000)
        assert d["n"].to_list() == [1] * 60
        assert d["last"].to_list() == pytest.approx([newest[s] for s in range(1, 61)])
        coarse = qd.downsample(con, "replayed", ["train/loss"], 1, 60, 4)  # the 8-step rollup
        assert coarse["n"].sum() == 60
        assert float((coarse["mean"] * coarse["n"].cast(float)).sum()) == pytest.approx(
            sum(newest[s] for s in range(1, 61)), rel=1e-9
        )
        _, series = qa.metric_arrays(con, "replayed", None, ["train/loss"])
        assert list(series["train/loss"][1]) == pytest.approx([newest[s] for s in range(1, 61)])
        marks = con.execute("SELECT DISTINCT step FROM metrics WHERE replaced ORDER BY step").fetchall()
        assert [s for (s,) in marks] == list(range(41, 51))
    again = tmp_path / "again.duckdb"
    rebuild(tmp_path, again, emit=None)
    q = "SELECT step, name, value, replaced FROM metrics ORDER BY ALL"
    with connect(db) as a, connect(again) as b:
        assert a.execute(q).fetchall() == b.execute(q).fetchall()


def _cli(*args, env=None, **kw):
    e = dict(os.environ, **(env or {}))
    return subprocess.Popen(
        [str(BIN / "trainer"), *args],
        cwd=ROOT,
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


def test_sigterm_checkpoints_and_ends_preempted(tmp_path):
    p = _cli(
        "train",
        "--config",
        str(TINY),
        "--runs-dir",
        str(tmp_path),
        "--run-id",
        "pre",
        "steps=100000",
        "eval.every=0",
        *QUIET,
        env={"OBSERVATORY_HEARTBEAT_S": "0.5"},
    )
    path = tmp_path / "pre" / "events.0.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and p.poll() is None:
        text = path.read_text() if path.exists() else ""
        if text.count('"kind":"metrics"') >= 3 and text.count('"perf/step_time_s"') >= 2:
            break
        time.sleep(0.5)
    assert p.poll() is None, p.communicate()[1][-3000:]
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 0, err[-3000:]
    evs = events(tmp_path, "pre")
    end = evs[-1]
    assert end["kind"] == "run_end" and end["data"]["status"] == "preempted"
    ck = of(evs, "checkpoint")
    assert ck and ck[-1]["step"] == end["data"]["final_step"] >= 3
    assert (tmp_path / "pre" / "checkpoints" / str(end["data"]["final_step"])).is_dir()
    # SIGTERM: the phase shutdown, then the final save and run_end; the heartbeat thread did not keep it alive
    last_phase = of(evs, "phase")[-1]
    assert last_phase["data"] == {"phase": "shutdown", "attempt": 0} and last_phase["seq"] < ck[-1]["seq"]
    beats = [e["data"] for e in of(evs, "heartbeat")]
    timed = [b for b in beats if "perf/step_time_s" in b]
    assert timed and all(b["phase"] == "train" and 0 < b["perf/step_time_s"] < 60 for b in timed)
    assert {"system/rss_bytes", "system/cpu_percent"} <= set(beats[-1])


def test_new_user_trains_tiny_then_ingests_and_lists_it(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    env = {"OBSERVATORY_RUNS": str(runs), "OBSERVATORY_DB": str(db)}
    p = _cli("train", "--config", "trainer/configs/tiny.yaml", env=env)
    out, err = p.communicate(timeout=500)
    assert p.returncode == 0, err[-3000:]
    assert "step" in err and "loss=" in err  # the progress bar
    (run_id,) = [d.name for d in runs.iterdir()]
    assert run_id.startswith("tiny-")
    obs = str(BIN / "observatory")
    r = subprocess.run(
        [obs, "ingest"], env=dict(os.environ, **env), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [obs, "runs"], env=dict(os.environ, **env), capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert run_id in r.stdout and "completed" in r.stdout


def test_wandb_offline_mirror_gets_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_id = train(
        cfg(
            "steps=3",
            "eval.every=0",
            "checkpoint.at_exit=false",
            "wandb.mode=offline",
            "wandb.project=obs-test",
        ),
        tmp_path,
    )
    offline = list((tmp_path / run_id / "wandb").glob("offline-run-*"))
    assert len(offline) == 1 and run_id in offline[0].name
    assert any(offline[0].rglob("*.wandb"))  # W&B's own record of what the mirror sent


def test_cli_errors_and_ladder_dispatch(capsys):
    from trainer.cli import main

    assert main(["train", "--config", str(TINY), "optimizer.lrr=1"]) == 2
    assert "unknown config key 'optimizer.lrr'; did you mean optimizer.lr" in capsys.readouterr().err
    assert main(["train", "steps=3"]) == 2
    assert "--config PATH is required" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["ladder", "--help"])  # handed to trainer.ladder:main untouched
    assert e.value.code == 0 and "usage: trainer ladder" in capsys.readouterr().out


def test_cli_resume_and_fork_take_the_checkpoint_config(base):
    from trainer.cli import resolve_config

    runs, run_id, evs = base
    c = resolve_config(None, ["steps=70"], runs_dir=runs, resume=run_id)  # latest checkpoint: step 60
    stored = evs[0]["data"]["config"]
    assert c.steps == 70 and c.to_dict() == {**stored, "steps": 70}
    f = resolve_config(None, ["optimizer.lr=0.002"], runs_dir=runs, fork=f"{run_id}@20")
    assert f.optimizer.lr == 0.002 and f.checkpoint.every == 20 and f.tags == ("base",)
    with pytest.raises(ValueError, match="no checkpoint at step 7"):
        resolve_config(None, [], runs_dir=runs, fork=f"{run_id}@7")


def test_ladder_runs_get_a_readable_name_besides_their_id():
    """run_start's `name` says what a ladder run's id encodes (`observatory runs` shows it when it differs)."""
    from trainer.ladder import load_ladder_spec, plan
    from trainer.train import run_name

    rungs, target = plan(load_ladder_spec("trainer/configs/ladder_cpu.yaml"), target_seed=1)
    first = rungs[0]
    assert first.cfg.name == first.run_id == "ladder-cpu-d24"
    assert run_name(first.cfg.name, first.ladder) == "ladder-cpu d24 seed 0"
    assert run_name(target.cfg.name, target.ladder) == "ladder-cpu d72 target seed 1"
    assert run_name("tiny", None) == "tiny"
