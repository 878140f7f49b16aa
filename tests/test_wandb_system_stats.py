"""`observatory import wandb` keeps a W&B run's system metrics: a real offline run's `stats` records become
`heartbeat` events under our telemetry names, stored as host telemetry beside the run's steps."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from wandb_fixtures import run_wandb_offline

pytest.importorskip("wandb")

from observatory.interop.wandb_import import convert_wandb_file, find_wandb_files, import_wandb  # noqa: E402
from observatory.interop.wandb_reader import WandbLogReader  # noqa: E402
from observatory.interop.wandb_stats import Environment, stats_heartbeat  # noqa: E402
from observatory.store import connect  # noqa: E402

# A real W&B offline run that samples the machine every 0.2 s (W&B's default is 15 s).
MAKE_RUN = r"""
import sys, time, wandb
run = wandb.init(mode="offline", dir=sys.argv[1], project="obs-test", id="sys1",
                 settings=wandb.Settings(x_stats_sampling_interval=0.2))
for s in range(30):
    run.log({"train/loss": 1.0 / (s + 1)}, step=s)
    time.sleep(0.1)
run.finish()
"""


@pytest.fixture(scope="module")
def wandb_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("wandb-stats")
    run_wandb_offline(MAKE_RUN, out)
    (path,) = find_wandb_files([out])
    return path


def _raw_stats(path):
    """What W&B itself recorded: (time, {key: value}, the highest step logged before it) of each stats record,
    in the file's order, and the CPU count."""
    from wandb.proto import wandb_internal_pb2 as pb

    stats, cpus, top = [], None, None
    for _, payload in WandbLogReader(path):
        rec = pb.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "stats":
            t = rec.stats.timestamp.seconds + rec.stats.timestamp.nanos / 1e9
            stats.append((t, {i.key: json.loads(i.value_json) for i in rec.stats.item}, top))
        elif kind == "history":
            step = rec.history.step.num  # W&B's row number: the step given to log here
            top = step if top is None else max(top, step)
        elif kind == "environment" and rec.environment.cpu_count_logical:
            cpus = rec.environment.cpu_count_logical
    return stats, cpus


@pytest.mark.subprocess
def test_a_real_offline_runs_system_stats_become_heartbeats_under_our_names(wandb_file):
    stats, cpus = _raw_stats(wandb_file)
    assert len(stats) >= 5 and cpus
    log, res = convert_wandb_file(wandb_file)
    beats = [e for e in log.events if e["kind"] == "heartbeat"]
    assert len(beats) == res.heartbeats == len(stats)  # one heartbeat per stats record, none dropped
    assert f"{len(beats)} heartbeats" in res.summary_line()
    for (t, raw, step), ev in zip(stats, beats, strict=True):
        d = ev["data"]
        assert ev["t"] == pytest.approx(t)
        assert d["system/rss_bytes"] == pytest.approx(raw["proc.memory.rssMB"] * 2**20)
        assert d["system/mem_available_bytes"] == pytest.approx(raw["proc.memory.availableMB"] * 2**20)
        assert d["system/mem_used_percent"] == pytest.approx(raw["memory_percent"])
        assert d["system/net_sent_bytes"] == raw["network.sent"]
        assert d["system/net_recv_bytes"] == raw["network.recv"]
        assert d["system/disk_used_percent"] == pytest.approx(raw["disk./.usagePercent"])
        reads = [v for k, v in raw.items() if k.startswith("disk.") and k.endswith(".in")]
        if reads:
            assert d["system/disk_read_bytes"] == pytest.approx(sum(reads) * 2**20)
        if "cpu" in raw:  # W&B's process CPU is over all CPUs; ours is 100 per CPU
            assert d["system/cpu_percent"] == pytest.approx(raw["cpu"] * cpus)
        assert ev["step"] == step == d.get("step")  # the step the run had logged by then
    assert any(e["step"] is not None for e in beats)
    assert res.skipped["unmapped system stat"] > 0  # threads, per-device extras: counted, not silently lost


@pytest.mark.subprocess
def test_imported_heartbeats_are_stored_as_host_telemetry(wandb_file, tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    (res,) = import_wandb([wandb_file], runs, db)
    assert res.error is None and res.heartbeats > 0
    with connect(db) as con:
        n = con.execute("SELECT count(*) FROM heartbeats WHERE run = 'wandb-sys1'").fetchone()[0]
        names = {
            r[0]
            for r in con.execute(
                "SELECT DISTINCT name FROM host_telemetry WHERE run = 'wandb-sys1'"
            ).fetchall()
        }
        steps = con.execute("SELECT count(*) FROM metrics WHERE run = 'wandb-sys1'").fetchone()[0]
    assert n == res.heartbeats and steps == 30
    assert {"system/rss_bytes", "system/mem_available_bytes", "system/disk_used_percent"} <= names
    assert not [x for x in names if "." in x or x.startswith(("proc", "memory", "network", "disk/"))]


def test_gpu_stats_map_to_accel_names_with_the_environments_memory():
    """The GPU keys W&B's system monitor writes on an NVIDIA machine, in W&B's own protobuf message (this
    machine has no GPU to record a real one)."""
    from wandb.proto import wandb_internal_pb2 as pb

    rec = pb.StatsRecord()
    rec.timestamp.seconds = 1_800_000_000
    for key, value in {
        "gpu.0.gpu": 97.0,
        "gpu.0.memoryAllocatedBytes": 60e9,
        "gpu.0.memoryAllocated": 75.0,
        "gpu.0.temp": 71.0,
        "gpu.0.powerWatts": 650.5,
        "gpu.0.unCorrectedMemoryErrors": 2,
        "gpu.0.smClock": 1980,
        "gpu.1.gpu": 12.0,
        "gpu.1.memoryAllocatedBytes": 8e9,
        "gpu.1.memoryAllocated": 10.0,
        "gpu.process.0.gpu": 97.0,
        "cpu": 12.5,
        "disk.nvme0n1.in": 3.0,
        "disk.nvme1n1.in": 1.0,
        "tpu": 5.0,
    }.items():
        rec.item.add(key=key, value_json=json.dumps(value))
    rec.item.add(key="gpu.0.memoryClock", value_json="not json")
    env_rec = pb.EnvironmentRecord(cpu_count=8, cpu_count_logical=16)
    env_rec.gpu_nvidia.add(name="H100", memory_total=int(80e9))
    env = Environment()
    env.update(env_rec)
    skipped: Counter = Counter()
    t, d = stats_heartbeat(rec, env, skipped)
    assert t == 1_800_000_000
    assert d["accel/0/util"] == 97.0 and d["accel/1/util"] == 12.0
    assert d["accel/0/hbm_used_bytes"] == 60e9 and d["accel/0/hbm_limit_bytes"] == 80e9  # the environment's
    assert d["accel/1/hbm_limit_bytes"] == 80e9  # gpu 1 not in the environment: 8 GB is 10%
    assert d["accel/0/temp_c"] == 71.0 and d["accel/0/power_w"] == 650.5 and d["accel/0/ecc_errors"] == 2.0
    assert d["system/cpu_percent"] == 12.5 * 16
    assert d["system/disk_read_bytes"] == 4.0 * 2**20
    assert not [k for k in d if "process" in k or "Clock" in k or k == "tpu"]
    assert skipped == Counter({"unmapped system stat": 3, "unreadable system stat": 1})
    no_env = Environment()  # no CPU count known: the process CPU is left out, not guessed
    assert "system/cpu_percent" not in stats_heartbeat(rec, no_env, Counter())[1]
