"""Host telemetry for heartbeats: what this process and its machine look like now, as a flat map of numbers.

Names (docs/events.md's heartbeat row): `system/cpu_percent` (this process, since the last sample),
`system/rss_bytes`, `system/mem_available_bytes`, `system/mem_used_percent`, and for the machine since the
`Sampler`'s first sample `system/net_sent_bytes`, `system/net_recv_bytes`, `system/disk_read_bytes`,
`system/disk_write_bytes`, and `system/disk_used_percent` of the filesystem holding the run's log
(psutil); per local accelerator `i`,
`accel/<i>/hbm_used_bytes` and `accel/<i>/hbm_limit_bytes` from jax's `memory_stats()` when jax is
already imported (never imported here); on NVIDIA GPUs, `accel/<i>/util`, `accel/<i>/power_w`,
`accel/<i>/temp_c`, `accel/<i>/ecc_errors` (and HBM, when jax gave none) from nvidia-ml-py when it is
installed. A name a platform cannot measure is left out. Each source that fails once is not asked again.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

__all__ = ["Sampler", "Heartbeat"]


class Sampler:
    """One writer's telemetry: its process handle (CPU since its last sample), the machine's byte counters
    at its first sample, NVML once initialised, and the sources that failed (not asked again). Each
    `Writer` holds its own, so a process that logs several runs starts each one's counters at its start."""

    def __init__(self) -> None:
        self._off: set[str] = set()
        self._proc: Any = None
        self._nvml: Any = None
        self._io0: dict[str, float] = {}

    def sample(self, disk_path: str | None = None) -> dict[str, float]:
        """The telemetry this platform can give now; `disk_path`: a path on the filesystem whose use to report."""
        out: dict[str, float] = {}
        for name, fn in (
            ("psutil", self._psutil),
            ("io", lambda o: self._io(o, disk_path)),
            ("jax", _jax),
            ("nvml", self._nvidia),
        ):
            if name in self._off:
                continue
            try:
                fn(out)
            except Exception:  # not installed, no driver, no device: this source says nothing from now on
                self._off.add(name)
        return out

    def _psutil(self, out: dict[str, float]) -> None:
        import psutil

        if self._proc is None:
            self._proc = psutil.Process()
            self._proc.cpu_percent(None)  # the first call starts the interval
        out["system/cpu_percent"] = float(self._proc.cpu_percent(None))
        out["system/rss_bytes"] = float(self._proc.memory_info().rss)
        mem = psutil.virtual_memory()
        out["system/mem_available_bytes"] = float(mem.available)
        out["system/mem_used_percent"] = float(mem.percent)

    def _io(self, out: dict[str, float], disk_path: str | None) -> None:
        import psutil

        now: dict[str, float] = {}
        net = psutil.net_io_counters()
        if net is not None:
            now["system/net_sent_bytes"], now["system/net_recv_bytes"] = (
                float(net.bytes_sent),
                float(net.bytes_recv),
            )
        disk = psutil.disk_io_counters()
        if disk is not None:  # None in some containers
            now["system/disk_read_bytes"], now["system/disk_write_bytes"] = (
                float(disk.read_bytes),
                float(disk.write_bytes),
            )
        for name, v in now.items():
            out[name] = max(0.0, v - self._io0.setdefault(name, v))
        out["system/disk_used_percent"] = float(psutil.disk_usage(disk_path or "/").percent)

    def _nvidia(self, out: dict[str, float]) -> None:
        if self._nvml is None:
            import pynvml  # nvidia-ml-py

            pynvml.nvmlInit()
            self._nvml = pynvml
        _nvml(self._nvml, out)


def _jax(out: dict[str, float]) -> None:
    jax = sys.modules.get("jax")
    if jax is None:
        return
    for i, d in enumerate(jax.local_devices()):
        stats = d.memory_stats() or {}
        if "bytes_in_use" in stats:
            out[f"accel/{i}/hbm_used_bytes"] = float(stats["bytes_in_use"])
        if "bytes_limit" in stats:
            out[f"accel/{i}/hbm_limit_bytes"] = float(stats["bytes_limit"])


def _nvml(nv: Any, out: dict[str, float]) -> None:
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        out[f"accel/{i}/util"] = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
        out[f"accel/{i}/power_w"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
        out[f"accel/{i}/temp_c"] = float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        if f"accel/{i}/hbm_used_bytes" not in out:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            out[f"accel/{i}/hbm_used_bytes"], out[f"accel/{i}/hbm_limit_bytes"] = (
                float(mem.used),
                float(mem.total),
            )
        try:
            out[f"accel/{i}/ecc_errors"] = float(
                nv.nvmlDeviceGetTotalEccErrors(h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
            )
        except nv.NVMLError:
            pass  # no ECC on this board


class Heartbeat(threading.Thread):
    """Every `every_s` until `stop` is set: `beat()` (the writer's `heartbeat` event). A daemon: it never keeps a
    process alive, and a process frozen whole (SIGSTOP, a dead machine) stops beating with it."""

    def __init__(self, beat, every_s: float, stop: threading.Event, name: str):
        super().__init__(name=name, daemon=True)
        self._beat, self._every, self._stop_event = beat, every_s, stop

    def run(self) -> None:
        while not self._stop_event.wait(self._every):
            try:
                self._beat()
            except Exception:  # a finished run, a full queue: the next beat tries again
                pass
