"""The writer: on disk within a second, finish flushes, drops counted, signals, programmer errors, secrets."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import observatory
from observatory.events import validate_event
from observatory.pipeline import ingest
from observatory.store import connect


def read_events(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_init_log_finish_round_trip(runs_dir):
    run = observatory.init(
        name="my run",
        config={"lr": 3e-4, "model": {"d": 64}},
        runs_dir=runs_dir,
        tags=["a"],
        ladder={"name": "lad", "rung": "d64"},
        install_signal_handlers=False,
    )
    run.log({"train/loss": 2.5, "n": np.float32(1.5), "i": np.int64(3)}, step=np.int64(1))
    run.log_expert_load(1, 0, np.array([3, 4]), [0, 1])
    run.event("eval", {"dataset": "val", "loss": float("nan")}, step=1)
    run.finish()
    allev = read_events(run.path)
    assert [e["seq"] for e in allev] == list(range(8))
    for e in allev:
        validate_event(e, run_folder=run.id, host=0)
    # init says the process is in "init"; its first logged step, "train"
    assert [(e["data"], e["step"]) for e in allev if e["kind"] == "phase"] == [
        ({"phase": "init", "attempt": 0}, None),
        ({"phase": "train", "attempt": 0}, 1),
        ({"phase": "shutdown", "attempt": 0}, 1),  # finish says it, before run_end
    ]
    evs = [e for e in allev if e["kind"] != "phase"]
    assert [e["kind"] for e in evs] == ["run_start", "metrics", "expert_load", "eval", "run_end"]
    assert evs[0]["data"]["name"] == "my run" and evs[0]["data"]["tags"] == ["a"]
    assert evs[1]["data"] == {"train/loss": 2.5, "n": 1.5, "i": 3.0}
    assert evs[3]["data"]["loss"] == "nan"  # JSON has no NaN: the contract's string form
    assert evs[4]["data"] == {"status": "completed", "final_step": 1}
    assert run.id.startswith("my-run-")


def test_events_are_on_disk_within_a_second_without_finish(runs_dir):
    run = observatory.init(run_id="live", runs_dir=runs_dir, install_signal_handlers=False)
    t0 = time.monotonic()
    run.log({"x": 1.0}, step=0)
    while len(read_events(run.path)) < 2:
        assert time.monotonic() - t0 < 1.0, "event not on disk within 1 s"
        time.sleep(0.01)
    run.finish()


def test_secrets_are_redacted(runs_dir):
    cfg = {
        "wandb": {"api_key": "sk-123", "project": "p"},
        "db_password": "hunter2",
        "hf_token": "tok-9",
        "list": [{"secret": "s3cr3t", "ok": 1}],
        "accessToken": "at-1",
        "credentials_file": "/creds",
        "tokenizer": "bpe",
        "max_tokens": 4096,
        "author": "me",
    }
    run = observatory.init(run_id="r", config=cfg, runs_dir=runs_dir, install_signal_handlers=False)
    run.finish()
    text = run.path.read_text()
    for secret in ("sk-123", "hunter2", "tok-9", "s3cr3t", "at-1", "/creds"):
        assert secret not in text
    got = read_events(run.path)[0]["data"]["config"]
    assert got["wandb"] == {"api_key": "<redacted>", "project": "p"}
    assert got["list"] == [{"secret": "<redacted>", "ok": 1}]
    assert (got["tokenizer"], got["max_tokens"], got["author"]) == ("bpe", 4096, "me")  # not secrets


@pytest.mark.parametrize(
    "call, exc, words",
    [
        (lambda r: r.log({"loss": "high"}, step=1), TypeError, "metric 'loss' must be a number"),
        (lambda r: r.log({3: 1.0}, step=1), TypeError, "metric names must be non-empty strings"),
        (lambda r: r.log({"loss": 1.0}, step=-1), ValueError, "step must be >= 0"),
        (lambda r: r.log({"loss": 1.0}, step=1.5), TypeError, "step must be an int"),
        (lambda r: r.log({"loss": True}, step=1), TypeError, "is a bool"),
        (lambda r: r.log([1.0], step=1), TypeError, "metrics must be a dict"),
        (lambda r: r.log_expert_load(1, 0, [1, 2], [0]), ValueError, "2 routed counts but 1 dropped"),
        (lambda r: r.log_expert_load(1, 0, [1.5], [0]), TypeError, "routed counts must be integers"),
        (lambda r: r.log_expert_load(1, 0, [1], [-1]), ValueError, "dropped counts must be >= 0"),
        (lambda r: r.log_expert_load(1, -2, [1], [0]), ValueError, "layer must be an int >= 0"),
        (lambda r: r.event("eval", {"loss": 1.0}), ValueError, "eval requires dataset"),
        (lambda r: r.event("", {}), TypeError, "kind must be a non-empty string"),
        (lambda r: r.finish("exploded"), ValueError, "status must be one of"),
    ],
)
def test_programmer_errors_raise_at_the_call(runs_dir, call, exc, words):
    run = observatory.init(run_id="r", runs_dir=runs_dir, install_signal_handlers=False)
    with pytest.raises(exc, match=words):
        call(run)
    run.finish()
    with pytest.raises(RuntimeError, match="is finished"):
        run.log({"x": 1.0}, step=2)


def test_bad_run_id_and_host():
    with pytest.raises(ValueError, match="run id"):
        observatory.init(run_id="has space", runs_dir="/tmp")
    with pytest.raises(ValueError, match="host"):
        observatory.init(run_id="ok", runs_dir="/tmp", host=-1)


class _BlockingSink:
    """A mirror that blocks the writer thread until released (so the queue fills up)."""

    def __init__(self):
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, events):
        self.entered.set()
        self.release.wait(30)

    def close(self):
        pass


def test_full_queue_drops_count_and_reports(runs_dir):
    sink = _BlockingSink()
    run = observatory.init(
        run_id="q", runs_dir=runs_dir, sinks=[sink], queue_size=5, install_signal_handlers=False
    )
    assert sink.entered.wait(10)  # the writer thread is now blocked in the sink, run_start written
    t0 = time.perf_counter()
    for step in range(50):
        run.log({"x": float(step)}, step=step)
    assert time.perf_counter() - t0 < 0.5, "a full queue must not block the caller"
    assert run.dropped_events == 46  # the queue's 5 places: the first step's "train" phase and 4 steps
    sink.release.set()
    run.flush()
    run.log({"x": 99.0}, step=99)
    run.finish()
    evs = read_events(run.path)
    metrics = [e for e in evs if e["kind"] == "metrics"]
    assert [m["step"] for m in metrics] == [0, 1, 2, 3, 99]
    assert metrics[-1]["data"]["writer/dropped_events"] == 46.0
    assert "writer/dropped_events" not in metrics[0]["data"]


def test_context_manager_exception_writes_failure_then_failed(runs_dir):
    with pytest.raises(ZeroDivisionError):
        with observatory.init(run_id="boom", runs_dir=runs_dir, install_signal_handlers=False) as run:
            run.log({"x": 1.0}, step=4)
            1 / 0  # noqa: B018
    evs = read_events(run.path)
    assert [e["kind"] for e in evs][-2:] == ["failure", "run_end"]
    assert evs[-2]["data"]["type"] == "exception" and "ZeroDivisionError" in evs[-2]["data"]["message"]
    assert evs[-1]["data"] == {"status": "failed", "final_step": 4}


def test_resume_continues_seq_after_a_torn_line(runs_dir):
    run = observatory.init(run_id="res", runs_dir=runs_dir, install_signal_handlers=False)
    run.log({"x": 1.0}, step=1)
    run.finish("preempted")
    with open(run.path, "ab") as f:
        f.write(b'{"v":1,"ru')  # a later writer died mid-line
    run2 = observatory.init(run_id="res", runs_dir=runs_dir, install_signal_handlers=False)
    run2.log({"x": 2.0}, step=2)
    run2.finish()
    lines = run.path.read_text().splitlines()
    assert (
        lines[6] == '{"v":1,"ru'
    )  # after run_start, three phases (init, train, shutdown), a step and run_end
    seqs = [json.loads(x)["seq"] for x in lines if x.startswith('{"v":1,"run"')]
    assert seqs == list(range(len(seqs)))


CHILD = textwrap.dedent(
    """
    import sys, time, observatory
    runs_dir, mode = sys.argv[1], sys.argv[2]
    run = observatory.init(run_id="child", runs_dir=runs_dir, flush_interval=0.1)
    print("ready", flush=True)
    step = 0
    with run:
        while True:
            run.log({"train/loss": 1.0 / (step + 1)}, step=step)
            if step % 4 == 0:
                run.log_expert_load(step, 0, [step, 1], [0, 0])
            print(step, time.time(), flush=True)
            step += 1
            time.sleep(0.002)
    """
)


def _rest(proc) -> str:
    """The child's remaining stdout. (communicate(timeout=...) would skip what readline() buffered.)"""
    out = proc.stdout.read()
    proc.wait(timeout=30)
    return out


def _spawn(tmp_path, runs_dir, mode="loop"):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(runs_dir), mode], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_sigint_write_run_end_killed(tmp_path, runs_dir, db_path, sig):
    proc = _spawn(tmp_path, runs_dir)
    time.sleep(0.5)
    proc.send_signal(sig)
    out = _rest(proc)
    evs = read_events(runs_dir / "child" / "events.0.jsonl")
    assert evs[-1]["kind"] == "run_end" and evs[-1]["data"]["status"] == "killed"
    assert evs[-2]["kind"] == "failure" and evs[-2]["data"]["type"] == "signal"
    assert signal.Signals(sig).name in evs[-2]["data"]["message"]
    assert evs[-3]["kind"] == "phase" and evs[-3]["data"]["phase"] == "shutdown"  # then the failure, run_end
    printed = {int(line.split()[0]) for line in out.strip().splitlines()}
    stored = {e["step"] for e in evs if e["kind"] == "metrics"}
    assert printed <= stored, "a logged step was lost"  # (the signal may land between log and print: +1)
    assert stored <= printed | {max(printed) + 1}
    ingest(runs_dir, db_path, hooks=False, emit=None)
    with connect(db_path) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("killed",)]


@pytest.mark.slow
def test_sigkill_loses_at_most_the_last_second_and_never_corrupts(tmp_path, runs_dir, db_path):
    rng = random.Random(os.getpid())
    for _ in range(2):
        proc = _spawn(tmp_path, runs_dir)
        time.sleep(rng.uniform(0.3, 1.5))
        proc.kill()
        t_kill = time.time()
        out = _rest(proc)
        logged = {int(s): float(t) for s, t in (line.split() for line in out.strip().splitlines())}
        rep = ingest(runs_dir, db_path, hooks=False, emit=None)
        with connect(db_path) as con:
            got = {r[0] for r in con.execute("SELECT step FROM metrics WHERE run = 'child'").fetchall()}
            n_rejected = con.execute(
                "SELECT count(*) FROM rejected_events WHERE reason NOT LIKE 'truncated%'"
            ).fetchall()
        must_have = {s for s, t in logged.items() if t < t_kill - 1.0}
        assert must_have <= got, f"lost {sorted(must_have - got)[:5]}... of {len(logged)} logged"
        assert n_rejected == [(0,)] and rep.rejected == rep.truncated


SHARED_CHILD = textwrap.dedent(
    """
    import sys, time, pathlib, observatory
    runs_dir, tag, go = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
    run = observatory.init(run_id="shared", runs_dir=runs_dir, host=1000, write_start=False,
                           install_signal_handlers=False, flush_interval=0.01)
    print("ready", flush=True)
    while not go.exists():
        time.sleep(0.002)
    for i in range(500):
        run.event("note", {"text": f"{tag} {i}"}, step=i)
        if i % 7 == 0:
            time.sleep(0.001)  # many small batches, so the two writers interleave
    run.close()
    """
)


@pytest.mark.subprocess
def test_two_processes_share_the_observatory_file(tmp_path, runs_dir, db_path):
    """`decide new` while the detectors write: distinct increasing seqs, whole lines, nothing rejected."""
    from conftest import event, write_lines

    path = runs_dir / "shared" / "events.1000.jsonl"
    write_lines(path, [event("shared", "note", {"text": "earlier"}, 7, host=1000)])
    script, go = tmp_path / "shared_child.py", tmp_path / "go"
    script.write_text(SHARED_CHILD)
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(runs_dir), tag, str(go)], stdout=subprocess.PIPE, text=True
        )
        for tag in ("a", "b")
    ]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"  # both numbered from the same tail (seq 8) by now
    go.touch()
    for p in procs:
        assert p.wait(timeout=120) == 0
    evs = read_events(path)
    seqs = [e["seq"] for e in evs]
    assert seqs == list(range(7, 1008)), "seqs must be distinct and increasing in file order"
    for tag in ("a", "b"):
        assert [e["step"] for e in evs if e["data"]["text"].startswith(tag + " ")] == list(range(500))
    rep = ingest(runs_dir, db_path, hooks=False, emit=None)
    assert rep.events == 1001 and rep.rejected == 0 and rep.duplicates == 0
    with connect(db_path) as con:
        assert con.execute("SELECT count(DISTINCT seq) FROM events WHERE host = 1000").fetchall() == [(1001,)]


def test_huge_finite_values_are_logged(runs_dir):
    """Values near the float limit are finite: each is written as it is (a sum of them would overflow)."""
    with observatory.writer.init(run_id="big", runs_dir=runs_dir) as run:
        run.log({"a": 1e308, "b": 1e308, "c": float("nan")}, step=1)
    line = [json.loads(x) for x in (runs_dir / "big" / "events.0.jsonl").read_text().splitlines()][1]
    assert line["data"] == {"a": 1e308, "b": 1e308, "c": "nan"}
