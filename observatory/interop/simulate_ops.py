"""`observatory simulate --fault F`: a many-host job's logs with phases and heartbeats, playing one operator fault.

The run ends at `end_t` (default: now), still running (no `run_end`), so the alert rules judge it as a live
run: every process writes `phase` events and a `heartbeat` every `HEARTBEAT_S` of simulated time, host 0
logs the steps. Each heartbeat carries the host's own seconds per step since its previous beat
(`perf/step_time_s`, as the writer computes it; none in a window without a step). Faults:

- `healthy`: irregular step times, an eval every 500 steps (2-4 min, with a budget) and a checkpoint every
  1,000 (1-5 min, with a budget): nothing to alert;
- `frozen`: one host (`hosts * 2 // 3`) stops writing 20 minutes before the end; its siblings go on;
- `straggler`: host 7 takes 1.5x as long per step by its own heartbeats (their `step` and
  `perf/step_time_s`);
- `hang`: init and a compile that never ends (budget 10 min, 30 min ago); heartbeats go on, no step;
- `preempt`: attempt 0 dies after step 60% (its last checkpoint at 50%), comes back 10 minutes later as
  attempt 1 from that checkpoint and trains the lost steps again;
- `mfu_drop`: `throughput/mfu` falls to 70% of its level for the last 30% of the steps;
- `hbm_creep`: host 3's accelerator memory climbs toward its limit over the last 10 minutes.

A `summary` event holds the ground truth: `sim/fault`, the host concerned (`sim/host`), and the seconds
the simulator spent in each goodput category (`sim/productive_s`, `sim/redone_s`, `sim/down_s`,
`sim/init_s`, `sim/compile_s`, `sim/eval_s`, `sim/checkpoint_s`) and `sim/goodput`, by the definitions of
`observatory.store.goodput` (the first step after a compile is the compile's).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from observatory.interop.cases import FAULTS

__all__ = ["FAULTS", "simulate_ops", "HEARTBEAT_S"]

HEARTBEAT_S = 30.0
STEP_S = 2.0  # mean seconds per step


class _Job:
    def __init__(self, runs_dir: Path, run: str, hosts: int):
        d = Path(runs_dir) / run
        d.mkdir(parents=True, exist_ok=True)
        self.run, self.hosts = run, hosts
        self.files = [open(d / f"events.{h}.jsonl", "w") for h in range(hosts)]  # noqa: SIM115 (closed in close)
        self.seq = [0] * hosts
        self.truth = dict.fromkeys(
            ("productive", "redone", "down", "init", "compile", "eval", "checkpoint"), 0.0
        )

    def ev(self, h: int, kind: str, data: dict, step: int | None, t: float) -> None:
        line = {
            "v": 1,
            "run": self.run,
            "kind": kind,
            "step": step,
            "t": round(t, 3),
            "host": h,
            "seq": self.seq[h],
            "data": data,
        }
        self.seq[h] += 1
        self.files[h].write(json.dumps(line, separators=(",", ":")) + "\n")

    def phase(
        self,
        name: str,
        attempt: int,
        t: float,
        step: int | None = None,
        budget: float | None = None,
        skip: frozenset = frozenset(),
    ) -> None:
        data = {"phase": name, "attempt": attempt, **({"budget_s": budget} if budget else {})}
        for h in range(self.hosts):
            if h not in skip:
                self.ev(h, "phase", data, step, t + 0.001 * h)

    def close(self) -> None:
        for f in self.files:
            f.close()


def simulate_ops(
    fault: str,
    runs_dir,
    *,
    hosts: int = 8,
    steps: int = 3000,
    seed: int = 0,
    run_id: str | None = None,
    end_t: float | None = None,
) -> tuple[str, dict]:
    """Write the fault's run; returns (run id, its ground truth)."""
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {', '.join(FAULTS)}, got {fault!r}")
    if hosts < (8 if fault == "straggler" else 4 if fault in ("frozen", "hbm_creep") else 1):
        raise ValueError(f"--fault {fault} needs more hosts (8 for a straggler, 4 for frozen or hbm_creep)")
    rng = np.random.default_rng(seed)
    run = run_id or f"ops-{fault}"
    end_t = time.time() if end_t is None else end_t
    dts = STEP_S * rng.lognormal(0, 0.15 if fault == "healthy" else 0.05, steps + 1)
    evals = (
        {s: float(rng.uniform(120, 240)) for s in range(500, steps + 1, 500)} if fault == "healthy" else {}
    )
    ckpts = (
        {s: float(rng.uniform(60, 300)) for s in range(1000, steps + 1, 1000)} if fault == "healthy" else {}
    )
    special = {"frozen": hosts * 2 // 3, "straggler": 7, "hbm_creep": 3}.get(fault)
    die, back = (int(0.6 * steps), int(0.5 * steps)) if fault == "preempt" else (None, None)
    down_s = 600.0
    # the schedule's length, so that it ends at end_t
    total = 30.0 + 90.0 + sum(dts[1:]) + sum(evals.values()) + sum(ckpts.values())
    if fault == "preempt":
        total += down_s + 30.0 + 90.0 + sum(dts[back + 1 : die + 1])
    if fault == "hang":
        total = 1800.0
    t = end_t - total
    job = _Job(runs_dir, run, hosts)
    job.ev(
        0,
        "run_start",
        {"config": {"sim": {"fault": fault, "hosts": hosts}}, "name": run, "mesh": {"processes": hosts}},
        0,
        t,
    )
    beat_next = [t + HEARTBEAT_S] * hosts
    state = {"step": 0, "phase": "init", "attempt": 0}
    # (own step, t) where each host's step-time window starts (the writer's `perf/step_time_s`: a phase restarts it)
    anchor: list[tuple[int, float] | None] = [None] * hosts

    def beats(until: float) -> None:  # every host's heartbeats up to `until`
        for h in range(hosts):
            while beat_next[h] <= until:
                bt = beat_next[h]
                beat_next[h] += HEARTBEAT_S
                if fault == "frozen" and h == special and bt > end_t - 1200:
                    continue
                own = int(state["step"] / 1.5) if (fault == "straggler" and h == special) else state["step"]
                used = 40e9 + (
                    max(0.0, bt - (end_t - 600)) / 600 * 38e9 if h == special and fault == "hbm_creep" else 0
                )
                data = {
                    "phase": state["phase"],
                    "step": own,
                    "system/cpu_percent": 60.0 + h % 7,
                    "system/rss_bytes": 8e9,
                    "accel/0/hbm_used_bytes": used,
                    "accel/0/hbm_limit_bytes": 80e9,
                }
                a = anchor[h]
                if a is not None and own > a[0]:
                    data["perf/step_time_s"] = round((bt - a[1]) / (own - a[0]), 4)
                if a is None or own > a[0]:
                    anchor[h] = (own, bt)
                job.ev(h, "heartbeat", data, own, bt)

    def enter(name: str, at: float, attempt: int, budget: float | None = None) -> None:
        beats(at)
        state["phase"], state["attempt"] = name, attempt
        for h in range(hosts):
            own = int(state["step"] / 1.5) if (fault == "straggler" and h == special) else state["step"]
            anchor[h] = (own, at) if state["step"] else None
        job.phase(
            name,
            attempt,
            at,
            state["step"] or None,
            budget,
            frozenset({special}) if fault == "frozen" and at > end_t - 1200 else frozenset(),
        )

    def start(attempt: int) -> None:
        nonlocal t
        enter("init", t, attempt)
        t += 30.0
        job.truth["init"] += 30.0
        enter("compile", t, attempt, budget=600.0)
        if fault == "hang":
            beats(end_t)
            job.truth["compile"] += end_t - t
            t = end_t
            return
        t += 90.0
        job.truth["compile"] += 90.0

    def train(first: int, last: int, attempt: int, reached: int) -> None:
        nonlocal t
        for s in range(first, last + 1):
            t += dts[s]
            beats(t)
            state["step"] = s
            if s == first:  # the first step after a compile is the compile's
                job.truth["compile"] += dts[s]
                enter("train", t - 1e-3, attempt)
            else:
                job.truth["redone" if s <= reached else "productive"] += dts[s]
            mfu = 0.4 * (0.7 if fault == "mfu_drop" and s > 0.7 * steps else 1.0)
            job.ev(
                0,
                "metrics",
                {
                    "train/loss": 3.0 * s**-0.05,
                    "throughput/mfu": mfu,
                    "throughput/tokens_per_s": 1e6 * mfu / 0.4,
                },
                s,
                t,
            )
            for kind, table, budget in (("eval", evals, 600.0), ("checkpoint", ckpts, 900.0)):
                if s in table:
                    enter(kind, t + 1e-3, attempt, budget)
                    t += table[s]
                    job.truth[kind] += table[s]
                    enter("train", t, attempt)

    start(0)
    if fault == "preempt":
        train(1, die, 0, 0)
        t += down_s  # the process dies after `die`: no event until the restart
        job.truth["down"] += down_s
        beat_next[:] = [t + HEARTBEAT_S] * hosts
        state["step"] = back
        start(1)
        train(back + 1, steps, 1, die)
    elif fault != "hang":
        train(1, steps, 0, 0)
    beats(end_t)
    total_s = sum(job.truth.values())
    truth = {
        "sim/fault": fault,
        **{f"sim/{k}_s": round(v, 3) for k, v in job.truth.items()},
        "sim/goodput": job.truth["productive"] / total_s if total_s else 0.0,
    }
    if special is not None:
        truth["sim/host"] = special
    job.ev(0, "summary", truth, state["step"] or None, end_t)
    job.close()
    return run, truth
