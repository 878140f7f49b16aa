"""Text for a report's cells: times in UTC, numbers to six significant digits, configs as dotted keys."""

from __future__ import annotations

import datetime as _dt
from typing import Any

from observatory.events import fmt_value

__all__ = ["fmt_time", "fmt_value", "flatten"]


def fmt_time(t: float | None) -> str:
    """Unix seconds as `YYYY-MM-DD HH:MM:SS UTC`; "-" for None."""
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def flatten(cfg: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """A nested config as sorted (dotted.key, leaf value) pairs."""
    if isinstance(cfg, dict):
        out = []
        for k in sorted(cfg):
            out += flatten(cfg[k], f"{prefix}.{k}" if prefix else str(k))
        return out
    return [(prefix, cfg)]
