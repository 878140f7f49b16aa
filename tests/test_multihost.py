"""Two processes on localhost train together through jax.distributed (gloo on CPU).

One layer and no eval only to keep compiles short on a shared 2-core machine (process 1 cannot
reuse the persistent compilation cache, which only process 0 writes). Each process has one
CPU device; the mesh is data=1 x expert=2, so the MoE all_to_all crosses the
process boundary. Process 0 writes run_start and the global metrics; each process writes its own
host-local events (its throughput, its run_end) to events.<host>.jsonl.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_train_together(tmp_path):
    port = _free_port()
    env = dict(os.environ, XLA_FLAGS="")  # one device per process, whatever the caller set
    procs = [
        subprocess.Popen(
            [
                str(BIN / "trainer"),
                "train",
                "--config",
                "trainer/configs/tiny.yaml",
                "--runs-dir",
                str(tmp_path),
                "--run-id",
                "mh",
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                "2",
                "--process-id",
                str(i),
                "steps=4",
                "mesh.expert=2",
                "model.n_layers=1",
                "eval.every=0",
                "checkpoint.every=2",
                "telemetry.progress=false",
                "telemetry.peak_flops=1e10",
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=500))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-4000:]

    run = tmp_path / "mh"
    ev0 = [json.loads(x) for x in (run / "events.0.jsonl").read_text().splitlines()]
    ev1 = [json.loads(x) for x in (run / "events.1.jsonl").read_text().splitlines()]
    assert ev0[0]["kind"] == "run_start"
    assert ev0[0]["data"]["mesh"] == {"data": 1, "expert": 2, "processes": 2, "devices": 2}
    assert not [e for e in ev1 if e["kind"] == "run_start"]  # only process 0 starts the run
    m0 = [e for e in ev0 if e["kind"] == "metrics"]
    assert [e["step"] for e in m0] == [1, 2, 3, 4]
    assert all("train/loss" in e["data"] and "moe/drop_fraction" in e["data"] for e in m0)
    assert m0[-1]["data"]["train/loss"] < m0[0]["data"]["train/loss"]
    # global expert counts: all B*T tokens x top_k assignments, across both processes' halves
    loads = [e for e in ev0 if e["kind"] == "expert_load" and e["step"] == 1]
    assert len(loads) == 1 and all(sum(e["data"]["routed"]) == 16 * 64 * 2 for e in loads)
    # host 1: host-local throughput only, never the global metrics
    m1 = [e for e in ev1 if e["kind"] == "metrics"]
    assert m1 and all(
        set(e["data"]) <= {"throughput/tokens_per_s", "throughput/step_time_s", "throughput/mfu"} for e in m1
    )
    assert all(e["host"] == 1 for e in ev1)
    for evs in (ev0, ev1):
        assert evs[-1]["kind"] == "run_end" and evs[-1]["data"] == {"status": "completed", "final_step": 4}
    assert [e["step"] for e in ev0 if e["kind"] == "checkpoint"] == [2, 4]  # both processes saved together
    assert (run / "checkpoints" / "4").is_dir()
