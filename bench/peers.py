"""What the peer-tool benches share: the scalars a step logs, and the version of each tool they ran."""

from __future__ import annotations

from importlib import metadata

# a training step's scalars, as each tool is handed them (bench_log.py, bench_e2e.py)
NAMES = [
    "train/loss",
    "train/ce_loss",
    "train/z_loss",
    "router/lb_loss",
    "router/entropy",
    "grad/norm/total",
    "opt/lr",
    "throughput/tokens_per_s",
    "throughput/mfu",
    "data/tokens",
]


def version(tool: str) -> str:
    """The installed version of a bench's tool ("observatory…" rows are ours), or "missing"."""
    try:
        return metadata.version("observatory" if tool.startswith("observatory") else tool)
    except metadata.PackageNotFoundError:
        return "missing"
