"""Detector thresholds: one field per `anomaly_*` setting, its default that setting's.

The settings table (`observatory.settings.SETTINGS`) holds each threshold's name,
default and help; `Thresholds` takes its defaults from there, so the two cannot
drift apart, and `Thresholds.from_settings()` reads the current values (environment
overrides included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from observatory import settings

__all__ = ["Thresholds", "PREFIX", "widest"]

PREFIX = "anomaly_"  # Thresholds.<field> is the setting anomaly_<field>


def _default(field: str):
    return settings.SETTINGS[PREFIX + field].default


@dataclass(frozen=True)
class Thresholds:
    """Detector thresholds; each field's help is its setting's (`observatory settings`)."""

    window: int = _default("window")
    min_history: int = _default("min_history")
    loss_z: float = _default("loss_z")
    loss_min_rise: float = _default("loss_min_rise")
    loss_dip: float = _default("loss_dip")
    grad_z: float = _default("grad_z")
    grad_min_ratio: float = _default("grad_min_ratio")
    grad_single_ratio: float = _default("grad_single_ratio")
    grad_growth: float = _default("grad_growth")
    growth_steps: int = _default("growth_steps")
    recovery_steps: int = _default("recovery_steps")
    recovery_tol: float = _default("recovery_tol")
    drop_jump: float = _default("drop_jump")
    drop_z: float = _default("drop_z")
    hot_ratio: float = _default("hot_ratio")
    expert_steps: int = _default("expert_steps")
    throughput_drop: float = _default("throughput_drop")
    throughput_steps: int = _default("throughput_steps")
    throughput_sustain: int = _default("throughput_sustain")
    stall_s: float = _default("stall_s")
    trend_steps: int = _default("trend_steps")
    trend_loss_rise: float = _default("trend_loss_rise")
    trend_ratio: float = _default("trend_ratio")
    drop_max: float = _default("drop_max")
    entropy_fall: float = _default("entropy_fall")
    entropy_floor: float = _default("entropy_floor")
    throughput_loss: float = _default("throughput_loss")
    crash_steps: int = _default("crash_steps")

    def __post_init__(self):
        for name in (
            "window",
            "min_history",
            "growth_steps",
            "recovery_steps",
            "expert_steps",
            "throughput_steps",
            "throughput_sustain",
            "trend_steps",
            "crash_steps",
        ):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"Thresholds.{name} must be an int >= 1, got {v!r} (setting anomaly_{name})")
        if self.min_history > self.window:
            raise ValueError(
                f"Thresholds.min_history ({self.min_history}) must be <= window ({self.window}); "
                "lower anomaly_min_history or raise anomaly_window"
            )
        for name in (
            "loss_z",
            "grad_z",
            "drop_z",
            "loss_min_rise",
            "recovery_tol",
            "drop_jump",
            "stall_s",
            "trend_loss_rise",
            "drop_max",
            "entropy_fall",
        ):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"Thresholds.{name} must be > 0, got {v!r} (setting anomaly_{name})")
        for name in ("grad_min_ratio", "grad_single_ratio", "grad_growth", "hot_ratio", "trend_ratio"):
            if not getattr(self, name) > 1:
                raise ValueError(
                    f"Thresholds.{name} must be > 1, got {getattr(self, name)!r} (setting anomaly_{name})"
                )
        if not 0 < self.loss_dip < 1:
            raise ValueError(
                f"Thresholds.loss_dip must be in (0, 1), got {self.loss_dip!r} (setting anomaly_loss_dip)"
            )
        if not 0 < self.throughput_drop < 1:
            raise ValueError(f"Thresholds.throughput_drop must be in (0, 1), got {self.throughput_drop!r}")
        if not 0 < self.throughput_loss < 1:
            raise ValueError(f"Thresholds.throughput_loss must be in (0, 1), got {self.throughput_loss!r}")
        if not self.entropy_floor >= 0:
            raise ValueError(f"Thresholds.entropy_floor must be >= 0, got {self.entropy_floor!r}")

    @classmethod
    def from_settings(cls) -> Thresholds:
        """The thresholds as the `anomaly_*` settings are now (their environment variables included)."""
        return cls(**{f.name: settings.get(PREFIX + f.name) for f in fields(cls)})

    def with_overrides(self, over: Mapping[str, Any], where: str) -> Thresholds:
        """These thresholds with some fields set (a rules file's `thresholds` entry, a run's config
        `alerts.thresholds`); an unknown name or a bad value is a ValueError naming `where` and the field."""
        names = [f.name for f in fields(self)]
        vals: dict[str, Any] = {}
        for k, v in over.items():
            if k not in names:
                raise ValueError(f"{where}: unknown threshold {k!r} (one of {', '.join(names)})")
            if isinstance(v, bool) or not isinstance(v, int | float):
                raise ValueError(f"{where}.{k}: {v!r} is not a number")
            if isinstance(getattr(self, k), int):
                if not float(v).is_integer():
                    raise ValueError(f"{where}.{k}: {v!r} is not a whole number of steps")
                v = int(v)
            vals[k] = v if isinstance(getattr(self, k), int) else float(v)
        try:
            return replace(self, **vals)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None

    @property
    def lookback(self) -> int:
        """Logged steps an incremental scan re-reads before the last step it scanned.

        Enough for every trailing window, a spike's recovery check and the longest
        episode a detector needs before it reports (a throughput dip is kept from
        `window + throughput_sustain` rows on, and may wait `throughput_sustain` more).
        """
        return max(
            2 * self.window + self.growth_steps + self.recovery_steps + 2 * self.expert_steps + 16,
            self.window + 2 * self.throughput_sustain + self.throughput_steps + 16,
        )


# the fields that set how far back a scan reads (`Thresholds.lookback` and the experts' window)
_WINDOWS = (
    "window",
    "growth_steps",
    "recovery_steps",
    "expert_steps",
    "throughput_sustain",
    "throughput_steps",
)


def widest(th: Thresholds, others: Iterable[Thresholds]) -> Thresholds:
    """`th` with each window as long as the longest of `others`': one read of several runs, each with its own
    thresholds, reaches back far enough for every one of them."""
    others = list(others)
    if not others:
        return th
    return replace(th, **{f: max(getattr(t, f) for t in [th, *others]) for f in _WINDOWS})
