"""The writer's phases and heartbeats: a real writer thread, real psutil telemetry, read back from the log."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

import pytest
from polling import holds_for, wait_until

import observatory
from observatory import telemetry


def lines(runs, run):
    return [json.loads(x) for x in (runs / run / "events.0.jsonl").read_text().splitlines()]


def beats_in(runs, run):
    """The heartbeats on disk now, while the writer may be midway through a line (the last piece, left out)."""
    done = (runs / run / "events.0.jsonl").read_text().split("\n")[:-1]
    return [e for e in map(json.loads, done) if e["kind"] == "heartbeat"]


def test_heartbeats_carry_step_phase_and_host_telemetry_and_stop_at_finish(tmp_path):
    t0 = time.monotonic()
    r = observatory.init(run_id="hb", runs_dir=tmp_path, heartbeat_s=0.2, install_signal_handlers=False)
    r.phase("train")
    r.log({"train/loss": 3.0}, step=5)
    wait_until(lambda: len(beats_in(tmp_path, "hb")) >= 2, what="two heartbeats on disk")
    r.finish()
    elapsed = time.monotonic() - t0
    n = len(lines(tmp_path, "hb"))
    holds_for(lambda: len(lines(tmp_path, "hb")) == n, 0.6, what="no beat after finish (3 intervals)")
    evs = lines(tmp_path, "hb")
    beats = [e for e in evs if e["kind"] == "heartbeat"]
    assert 2 <= len(beats) <= elapsed / 0.2 + 1  # one every 0.2 s at most, however long the wait took
    d = beats[-1]["data"]
    assert d["phase"] == "train" and d["step"] == 5 and beats[-1]["step"] == 5
    assert d["system/rss_bytes"] > 1e6 and d["system/mem_available_bytes"] > 1e6 and "system/cpu_percent" in d
    assert [e["seq"] for e in evs] == list(range(len(evs)))  # the beats' thread keeps seq order


def test_phase_checks_its_arguments_and_a_resume_is_the_next_attempt(tmp_path):
    r = observatory.init(run_id="ph", runs_dir=tmp_path, heartbeat_s=0, install_signal_handlers=False)
    with pytest.raises(ValueError, match="phase: must be one of"):
        r.phase("warmup")
    with pytest.raises(ValueError, match="budget_s"):
        r.phase("eval", budget_s=-1)
    r.phase("checkpoint", budget_s=600)  # observatory.init said "init"
    r.close()  # killed: no run_end
    again = observatory.init(
        run_id="ph", runs_dir=tmp_path, heartbeat_s=0, write_start=False, install_signal_handlers=False
    )
    again.finish()
    phases = [e["data"] for e in lines(tmp_path, "ph") if e["kind"] == "phase"]
    assert phases == [
        {"phase": "init", "attempt": 0},
        {"phase": "checkpoint", "attempt": 0, "budget_s": 600.0},
        {"phase": "init", "attempt": 1},
        {"phase": "shutdown", "attempt": 1},  # finish() says it before run_end
    ]
    assert lines(tmp_path, "ph")[-1]["kind"] == "run_end"
    assert not [e for e in lines(tmp_path, "ph") if e["kind"] == "heartbeat"]  # heartbeat_s=0: off


def test_telemetry_leaves_out_what_the_platform_cannot_measure(tmp_path):
    sampler = telemetry.Sampler()
    s = sampler.sample(str(tmp_path))
    assert {
        "system/cpu_percent",
        "system/rss_bytes",
        "system/mem_available_bytes",
        "system/mem_used_percent",
        "system/disk_used_percent",
        "system/net_sent_bytes",
        "system/net_recv_bytes",
    } <= set(s)
    assert all(isinstance(v, float) for v in s.values())
    assert 0 < s["system/disk_used_percent"] <= 100 and 0 < s["system/mem_used_percent"] <= 100
    (tmp_path / "blob").write_bytes(os.urandom(1 << 20))
    os.sync()
    later = sampler.sample(str(tmp_path))
    for name in ("system/net_sent_bytes", "system/disk_write_bytes"):  # since the sampler's first sample
        if name in later:
            assert 0 <= s[name] <= later[name]
    if "jax" not in sys.modules:  # never imported for telemetry
        assert not [n for n in s if n.startswith("accel/")]


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_each_heartbeat_says_the_hosts_own_step_time_without_the_evals_seconds(tmp_path):
    r = observatory.init(run_id="st", runs_dir=tmp_path, heartbeat_s=0.25, install_signal_handlers=False)
    step = 0

    def train(seconds: float, every: float) -> None:
        nonlocal step
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            step += 1
            time.sleep(every)
            r.log({"train/loss": 1.0}, step=step)

    train(1.0, 0.02)
    r.phase("eval", budget_s=60)
    time.sleep(1.0)  # an eval: no step, and its second is not a step's
    r.phase("train")
    train(1.0, 0.05)
    r.finish()
    beats = [e for e in lines(tmp_path, "st") if e["kind"] == "heartbeat"]
    timed = [
        (e["data"]["phase"], e["data"]["perf/step_time_s"]) for e in beats if "perf/step_time_s" in e["data"]
    ]
    assert not [e for e in beats if e["data"].get("phase") == "eval" and "perf/step_time_s" in e["data"]]
    fast = sorted(v for p, v in timed[:2])
    slow = sorted(v for p, v in timed[-2:])
    assert len(timed) >= 5, timed
    assert all(0.015 < v < 0.2 for _, v in timed), timed  # never the eval's second spread over a few steps
    assert fast[0] < slow[-1] and 0.04 < slow[-1] < 0.2, timed  # it follows the step's own pace


def test_a_resume_finds_its_attempt_behind_megabytes_of_steps(tmp_path):
    def start():
        return observatory.init(
            run_id="big", runs_dir=tmp_path, heartbeat_s=0, write_start=False, install_signal_handlers=False
        )

    start().close()  # attempt 0, killed
    r = start()  # attempt 1: says init, then logs 2 MiB of steps and is killed
    for s in range(12_000):
        r.log({f"m{i}": float(s) for i in range(8)}, step=s)
    r.close()
    assert (tmp_path / "big" / "events.0.jsonl").stat().st_size > 2 << 20
    again = start()
    assert again.attempt == 2
    again.close()


def test_trackio_auto_log_gpu_turns_heartbeats_on_at_its_interval(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_HEARTBEAT_S", "0")  # off by setting; auto_log_gpu asks for them
    no_gpu = not any(n.startswith("accel/") for n in telemetry.Sampler().sample())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = observatory.wandb_api.init(
            project="p", runs_dir=tmp_path, run_id="gpu", auto_log_gpu=True, gpu_log_interval=0.2
        )
    assert any("auto_log_gpu=True" in str(w.message) for w in caught) == no_gpu
    run.log({"loss": 1.0})
    wait_until(lambda: len(beats_in(tmp_path, "gpu")) >= 2, what="two heartbeats on disk")
    run.finish()
    beats = [e for e in lines(tmp_path, "gpu") if e["kind"] == "heartbeat"]
    assert len(beats) >= 2 and "system/rss_bytes" in beats[-1]["data"]
    with pytest.raises(ValueError, match="gpu_log_interval"):
        observatory.wandb_api.init(project="p", runs_dir=tmp_path, auto_log_gpu=True, gpu_log_interval=0)


def test_a_wandb_resume_is_the_next_attempt_and_ends_with_shutdown(tmp_path):
    for _ in range(3):
        run = observatory.wandb_api.init(project="p", id="again", dir=tmp_path, resume="allow", heartbeat_s=0)
        run.log({"loss": 1.0})
        run.finish()
    phases = [
        (e["data"]["phase"], e["data"]["attempt"]) for e in lines(tmp_path, "again") if e["kind"] == "phase"
    ]
    assert phases == [(p, a) for a in range(3) for p in ("init", "train", "shutdown")]
