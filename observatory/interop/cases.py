"""The simulators' case names, with no import of their own: `observatory simulate` offers them as choices
without loading numpy at every command's start-up."""

from __future__ import annotations

__all__ = ["FAULTS", "HEALTHY", "SLOW_CASES"]

FAULTS = ("healthy", "frozen", "straggler", "hang", "preempt", "mfu_drop", "hbm_creep")  # simulate_ops
HEALTHY = ("healthy_cosine", "healthy_wsd", "healthy_data_order")
SLOW_CASES = (  # simulate_slow
    *HEALTHY,
    "slow_divergence",
    "slow_divergence_grad",
    "moe_drift",
    "throughput_70",
    "throughput_55",
    "throughput_decay",
    "crash_loop",
)
