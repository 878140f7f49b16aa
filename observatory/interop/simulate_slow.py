"""Slow failures and the healthy runs they must be told from: a run's event log per case, with its truth.

`simulate_slow(case, runs_dir, steps=10_000)` writes one run (host 0's log) of a small MoE recipe: a loss on a
power law, the LR schedule's warmup and decay (`opt/lr`; the loss falls further as the LR anneals), evals,
grad norm, `moe/drop_fraction`, `router/entropy`, tokens/s and MFU, each with its noise, and dips of a busy
machine (a few steps at a third of the speed). Its `steps` scale every case (the numbers below are at 10,000):

- `healthy_cosine`: warmup 500, cosine decay; evals every 250 steps, every 100 from 60% (an eval-interval bump);
- `healthy_wsd`: warmup, a stable LR, a linear decay over the last 20% (the loss drops there);
- `healthy_data_order`: cosine; the data order changes at 40% and 70% (the loss bumps 0.08, gone in ~300 steps);
- `slow_divergence`: the loss falls to 40%, then climbs 0.25 nats over 40% (4,000 steps), the eval loss too;
  the grad norm flat; `slow_divergence_grad`: the same, the grad norm growing 4x;
- `moe_drift`: from 20%, over 60% (6,000 steps), the drop fraction creeps 3% -> 12% and router entropy falls
  5.95 -> 5.50;
- `throughput_70`, `throughput_55`: tokens/s and MFU at 70% (55%) of their level from 50% for 30% (3,000
  steps); `throughput_decay`: from 50% they decay to 55% at the end;
- `crash_loop`: a crash (`InjectedCrash`) at step 60 of 100, a resume from the step-50 checkpoint, the same
  crash at step 60 again.

The truth (`sim/case`, `sim/change_step`: where the change starts, `sim/expect`: the detector that should
find it, none for a healthy run) is in the run's `summary` event and returned.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from observatory.interop.cases import HEALTHY, SLOW_CASES
from observatory.interop.eventlog import EventFile

__all__ = ["SLOW_CASES", "HEALTHY", "simulate_slow"]

EXPECT = {
    "slow_divergence": "loss_trend",
    "slow_divergence_grad": "loss_trend",
    "moe_drift": "drop_trend",
    "throughput_70": "throughput_loss",
    "throughput_55": "throughput_loss",
    "throughput_decay": "throughput_loss",
    "crash_loop": "crash_loop",
}
T0 = 1785715200.0  # the simulated clock's start (as `observatory.interop.simulate`)
PEAK_LR = 3e-4
TPS = 12_000.0  # tokens/s at full speed
MFU = 0.41


def _lr(case: str, s: np.ndarray, n: int) -> np.ndarray:
    warm = max(1, n // 20)
    up = np.minimum(1.0, (s + 1) / warm)
    if case == "healthy_wsd":
        d0 = int(0.8 * n)
        down = np.where(s < d0, 1.0, np.maximum(0.0, 1 - (s - d0) / max(1, n - d0)))
    else:
        down = 0.5 * (1 + np.cos(np.pi * np.clip((s - warm) / max(1, n - warm), 0, 1)))
    return PEAK_LR * np.where(s < warm, up, 0.1 + 0.9 * down)


def _ramp(s: np.ndarray, start: float, length: float) -> np.ndarray:
    """0 before `start`, rising linearly to 1 over `length` steps, then 1."""
    return np.clip((s - start) / max(length, 1.0), 0.0, 1.0)


def _series(case: str, n: int, rng) -> tuple[dict[str, np.ndarray], int | None]:
    s = np.arange(n, dtype=float)
    lr = _lr(case, s, n)
    anneal = 1 - lr / PEAK_LR  # the loss falls further as the LR anneals
    loss = 2.2 + 4.0 * (1 + s / (0.02 * n)) ** -0.5 - 0.12 * anneal * (s > n // 20)
    grad = 0.45 * (1 + s / (0.01 * n)) ** -0.3 * (1 + 0.3 * anneal * (s > n // 20))
    drop = np.full(n, 0.03)
    ent = np.full(n, 5.95)
    speed = np.ones(n)
    change: int | None = None
    if case == "healthy_data_order":
        for at in (int(0.4 * n), int(0.7 * n)):
            loss += 0.08 * np.exp(-np.maximum(s - at, 0) / (0.01 * n)) * (s >= at)
    if case.startswith("slow_divergence"):
        change = int(0.4 * n)
        # the loss stops falling at `change` and climbs 0.25 nats over 40% of the steps
        loss = np.where(s < change, loss, loss[change] + 0.25 * _ramp(s, change, 0.4 * n))
        if case == "slow_divergence_grad":
            grad *= 1 + 3 * _ramp(s, change, 0.4 * n)
    if case == "moe_drift":
        change = int(0.2 * n)
        r = _ramp(s, change, 0.6 * n)
        drop, ent = 0.03 + 0.09 * r, 5.95 - 0.45 * r
    if case in ("throughput_70", "throughput_55"):
        change = n // 2
        low = 0.7 if case == "throughput_70" else 0.55
        speed = np.where((s >= change) & (s < change + 0.3 * n), low, 1.0)
    if case == "throughput_decay":
        change = n // 2
        speed = 1 - 0.45 * _ramp(s, change, n - change)
    busy = rng.random(n) < 0.02  # a machine shared with other jobs: a step now and then at a third
    speed = speed * np.where(busy, 0.35, 1.0) * rng.lognormal(0, 0.03, n)
    out = {
        "train/loss": loss + rng.normal(0, 0.04, n),
        "grad/norm/total": grad * rng.lognormal(0, 0.15, n),
        "opt/lr": lr,
        "moe/drop_fraction": np.clip(drop + rng.normal(0, 0.004, n), 0, 1),
        "router/entropy": ent + rng.normal(0, 0.005, n),
        "throughput/tokens_per_s": TPS * speed,
        "throughput/mfu": MFU * speed,
        "_eval": loss + 0.05,
    }
    return out, change


def _eval_steps(case: str, n: int) -> list[int]:
    every = max(1, n // 40)
    if case != "healthy_cosine":
        return list(range(every, n, every))
    bump = int(0.6 * n)
    return list(range(every, bump, every)) + list(range(bump, n, max(1, n // 100)))


def simulate_slow(
    case: str,
    runs_dir,
    *,
    steps: int = 10_000,
    seed: int = 0,
    run_id: str | None = None,
    speed: float = 1.0,
    baseline_run: str | None = None,
):
    """Write the case's run into `runs_dir`; returns (run id, truth). `speed`: its tokens/s and MFU are this
    fraction of the recipe's throughout; `baseline_run`: its config names that run as its baseline."""
    if case not in SLOW_CASES:
        raise ValueError(f"case must be one of {', '.join(SLOW_CASES)}, got {case!r}")
    rng = np.random.default_rng(seed)
    run = run_id or f"slow-{case.replace('_', '-')}"
    n = 100 if case == "crash_loop" else int(steps)
    f = EventFile(Path(runs_dir), run, 0)
    config = {
        "sim": {"case": case},
        "steps": n,
        "optimizer": {"lr": PEAK_LR, "warmup_steps": max(1, n // 20)},
    }
    if baseline_run is not None:
        config["baseline_run"] = baseline_run
    f.event("run_start", {"config": config, "name": run, "project": "slow-sim"}, 0, T0)
    series, change = _series(case, n, rng)
    for k in ("throughput/tokens_per_s", "throughput/mfu"):
        series[k] = series[k] * speed
    evals = set(_eval_steps(case, n))
    t = T0 + 60.0
    names = [k for k in series if not k.startswith("_")]
    truth = {"sim/case": case, "sim/change_step": change, "sim/expect": EXPECT.get(case), "sim/steps": n}
    if case == "crash_loop":
        change = 60
        truth["sim/change_step"] = change
        for attempt, first in ((0, 0), (1, 51)):
            f.event("phase", {"phase": "train", "attempt": attempt}, first, t)
            for step in range(first, 60):
                t += 0.5
                f.metrics(step, t, {k: float(series[k][step]) for k in names})
            msg = "InjectedCrash: injected crash before step 60"
            f.event("failure", {"type": "exception", "message": msg, "action": "halt"}, 60, t)
            f.event("run_end", {"status": "failed", "final_step": 60}, 60, t + 0.1)
            t += 120.0
    else:
        cols = {k: series[k].tolist() for k in names}
        dt = 1.0 / np.asarray(series["throughput/tokens_per_s"]) * TPS * 0.5
        for step in range(n):
            t += float(dt[step])
            f.metrics(step, t, {k: cols[k][step] for k in names})
            if step in evals:
                f.event("eval", {"dataset": "val", "loss": float(series["_eval"][step])}, step, t)
        f.event("run_end", {"status": "completed", "final_step": n - 1}, n - 1, t + 1)
    f.event(
        "summary", {k: v for k, v in truth.items() if v is not None and not isinstance(v, str)}, None, t + 2
    )
    f.close()
    f.tmp.replace(f.path)
    return run, truth


def lead_time(truth: dict, found: list[dict]) -> int | None:
    """Steps from the start of the change to the first warn or critical finding of the expected detector (a
    MoE drift's: of the drop fraction's or router entropy's)."""
    want, at = truth.get("sim/expect"), truth.get("sim/change_step")
    want = {"drop_trend", "drop_limit", "entropy_trend"} if want == "drop_trend" else {want}
    steps = [int(d["step"]) for d in found if d.get("detector") in want and d.get("severity") != "info"]
    if want is None or at is None or not steps:
        return None
    return min(steps) - int(at)
