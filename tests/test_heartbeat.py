"""The writer's phases and heartbeats: a real writer thread, real psutil telemetry, read back from the log."""

from __future__ import annotations

import json
import time

import pytest

import observatory
from observatory import telemetry


def lines(runs, run):
    return [json.loads(x) for x in (runs / run / "events.0.jsonl").read_text().splitlines()]


def test_heartbeats_carry_step_phase_and_host_telemetry_and_stop_at_finish(tmp_path):
    r = observatory.init(run_id="hb", runs_dir=tmp_path, heartbeat_s=0.2, install_signal_handlers=False)
    r.phase("train")
    r.log({"train/loss": 3.0}, step=5)
    time.sleep(0.9)
    r.finish()
    n = len(lines(tmp_path, "hb"))
    time.sleep(0.5)
    evs = lines(tmp_path, "hb")
    assert len(evs) == n  # no beat after finish
    beats = [e for e in evs if e["kind"] == "heartbeat"]
    assert 2 <= len(beats) <= 6
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
    ]
    assert not [e for e in lines(tmp_path, "ph") if e["kind"] == "heartbeat"]  # heartbeat_s=0: off


def test_telemetry_leaves_out_what_the_platform_cannot_measure():
    s = telemetry.sample()
    assert {"system/cpu_percent", "system/rss_bytes", "system/mem_available_bytes"} <= set(s)
    assert all(isinstance(v, float) for v in s.values())
