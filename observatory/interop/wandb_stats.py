"""A W&B run's system-stats records as our `heartbeat` events, under our telemetry names.

W&B samples the machine every `x_stats_sampling_interval` seconds (15 by default) into `stats`
records: a timestamp and `key -> value_json` items. Each record becomes one `heartbeat` at its time,
at the highest step the run logged before it, with the items we have a name for (docs/events.md's
heartbeat row):

| W&B key | ours |
|---|---|
| `cpu` (the process's CPU % over all CPUs) | `system/cpu_percent` (100 = one CPU: × the environment's CPU count; left out without it) |
| `proc.memory.rssMB` | `system/rss_bytes` (MiB × 2^20) |
| `proc.memory.availableMB` | `system/mem_available_bytes` |
| `memory_percent` (`memory` in older files) | `system/mem_used_percent` |
| `network.sent`, `network.recv` | `system/net_sent_bytes`, `system/net_recv_bytes` |
| `disk.<device>.in`, `disk.<device>.out` (`disk.in`, `disk.out`), MiB | `system/disk_read_bytes`, `system/disk_write_bytes` (summed over devices) |
| `disk.<path>.usagePercent` (`disk`) | `system/disk_used_percent` (the path `/`, else the first) |
| `gpu.<i>.gpu` | `accel/<i>/util` |
| `gpu.<i>.memoryAllocatedBytes` | `accel/<i>/hbm_used_bytes`; `accel/<i>/hbm_limit_bytes` from the environment's GPU memory, else from `memoryAllocated` % |
| `gpu.<i>.temp`, `gpu.<i>.powerWatts` | `accel/<i>/temp_c`, `accel/<i>/power_w` |
| `gpu.<i>.unCorrectedMemoryErrors` | `accel/<i>/ecc_errors` |

Other keys (per-core CPU, threads, clocks, `gpu.process.<i>.*` duplicates, TPU, Trainium, IPU) are
counted as skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter

__all__ = ["Environment", "stats_heartbeat"]

MIB = float(1 << 20)
_GPU = re.compile(r"^gpu\.(\d+)\.(\w+)$")
_DISK_IO = re.compile(r"^disk\.(?:[^.]+\.)?(in|out)$")
_DISK_USE = re.compile(r"^disk\.(.+)\.usagePercent$")
_SIMPLE = {
    "proc.memory.rssMB": ("system/rss_bytes", MIB),
    "proc.memory.availableMB": ("system/mem_available_bytes", MIB),
    "memory_percent": ("system/mem_used_percent", 1.0),
    "memory": ("system/mem_used_percent", 1.0),
    "network.sent": ("system/net_sent_bytes", 1.0),
    "network.recv": ("system/net_recv_bytes", 1.0),
}
_GPU_NAMES = {
    "gpu": "util",
    "memoryAllocatedBytes": "hbm_used_bytes",
    "temp": "temp_c",
    "powerWatts": "power_w",
    "unCorrectedMemoryErrors": "ecc_errors",
    "uncorrectedMemoryErrors": "ecc_errors",
}


class Environment:
    """What a W&B `environment` record says that the stats need: CPU count and each GPU's memory."""

    def __init__(self) -> None:
        self.cpus: int | None = None
        self.gpu_bytes: dict[int, float] = {}

    def update(self, env) -> None:
        cpus = env.cpu_count_logical or env.cpu_count
        if cpus:
            self.cpus = int(cpus)
        for i, gpu in enumerate(env.gpu_nvidia):
            if gpu.memory_total:
                self.gpu_bytes[i] = float(gpu.memory_total)


def stats_heartbeat(stats, env: Environment, skipped: Counter) -> tuple[float, dict[str, float]]:
    """One `stats` record -> (its Unix time, the heartbeat's telemetry). Unreadable values are skipped."""
    t = stats.timestamp.seconds + stats.timestamp.nanos / 1e9
    out: dict[str, float] = {}
    disk_use: dict[str, float] = {}
    gpu_pct: dict[int, float] = {}
    unmapped = 0
    for item in stats.item:
        try:
            v = json.loads(item.value_json)
        except ValueError:
            skipped["unreadable system stat"] += 1
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            unmapped += 1
            continue
        key, v = item.key, float(v)
        if key in _SIMPLE:
            name, scale = _SIMPLE[key]
            out[name] = v * scale
        elif key == "cpu":
            if env.cpus:
                out["system/cpu_percent"] = v * env.cpus
            else:
                unmapped += 1
        elif m := _DISK_IO.match(key):
            name = "system/disk_read_bytes" if m.group(1) == "in" else "system/disk_write_bytes"
            out[name] = out.get(name, 0.0) + v * MIB
        elif m := _DISK_USE.match(key):
            disk_use[m.group(1)] = v
        elif key == "disk":
            disk_use.setdefault("/", v)
        elif (m := _GPU.match(key)) and m.group(2) in _GPU_NAMES:
            out[f"accel/{m.group(1)}/{_GPU_NAMES[m.group(2)]}"] = v
        elif m and m.group(2) == "memoryAllocated":
            gpu_pct[int(m.group(1))] = v
        else:
            unmapped += 1
    if disk_use:
        out["system/disk_used_percent"] = disk_use.get("/", next(iter(disk_use.values())))
    for name in [n for n in out if n.endswith("/hbm_used_bytes")]:
        i = int(name.split("/")[1])
        limit = env.gpu_bytes.get(i)
        if limit is None and gpu_pct.get(i, 0.0) > 0:
            limit = out[name] / (gpu_pct[i] / 100.0)
        if limit:
            out[f"accel/{i}/hbm_limit_bytes"] = float(round(limit))
    if unmapped:
        skipped["unmapped system stat"] += unmapped
    return t, out
