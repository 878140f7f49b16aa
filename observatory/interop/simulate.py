"""`observatory simulate`: synthetic runs shaped like the reference run, as real event logs.

The simulator writes what our trainer would write for a run of a given shape (EVENTS.md,
version 1): `run_start` with config, mesh and model, ~60 scalars per step, `expert_load`
for every MoE layer, evals every 5% of the schedule, checkpoints, failures and run ends,
one file per host. It exists so that the observatory can be exercised at the reference
run's scale (48 layers x 384 experts) without a cluster.

Like the importers (see `observatory.interop`), it does not go through `observatory.init`:
the live writer stamps `t` with the clock and drops events when its queue is full, and a
simulation must give the same bytes for the same seed. Each event is the writer's envelope
(`v, run, kind, step, t, host, seq, data`, compact JSON), `t` comes from a fixed start time
plus simulated step times, `seq` counts from 0 in each file. Rare events go through
`events.validate_event`; the bulk kinds (`metrics`, `expert_load`) are checked on their first
line in each file and then written from numpy arrays in bulk, byte for byte as `json.dumps`
writes them. Files are written aside and put in place at the end (same bytes again: a no-op).

Presets (`PRESETS`, `simulate(preset=...)`):

- `535b`: d_model 6144, 48 MoE layers x 384 routed experts (width 3072) top-8 + 2 shared,
  seq 4096, 4096 sequences per step, mesh data 11 x expert 64. Its schedule is `steps`
  long: the loss follows the ladder law `L(C) = E + A*C^-alpha` towards the run's total
  compute. Incidents: a loss spike whose grad norm leads by 3 steps (BLOOM's shape), a NaN
  loss with `failure` (action rollback) and a rollback to the last checkpoint, a preemption
  (`run_end` preempted) and its resume in the same run, a fork (`<run>-fork`, `parent` and
  `config_diff`: LR halved), and one hot expert in one layer whose share grows from 1x to
  7x the mean over the run.
- `tiny`: the same story at 4 layers x 16 experts top-2, for quick tests.
- `ladder`: the four rungs of the reference ladder (d768 .. d2048), each a clean run of
  `steps` steps with `ladder` info (`name, rung, seed, params_*, tokens, flops, steps`) and
  eval losses on the law, so `observatory ladder fit <name>` fits them. A rung's `steps` steps
  carry its whole token budget (its batch is tokens / steps); its `expert_load` counts are one
  real step's routing (256 x 4096 tokens), so that they stay in the store's integer range.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from observatory.events import RUN_ID_RE
from observatory.interop.eventlog import EventFile, put_path

__all__ = [
    "PRESETS",
    "Shape",
    "SimResult",
    "simulate",
    "SIM_VERSION",
    "LAW",
    "law",
    "metric_names",
    "eval_steps",
]

SIM_VERSION = "1"  # the simulator's model of a run: a change of what it writes bumps this
T0 = 1785715200.0  # 2026-08-03T00:00:00Z: every simulated clock starts here
LAW = (1.55, 100.9, 0.0943)  # (E, A, alpha): L(C) = E + A * C^-alpha through 2.606 at 1e21 and 2.234 at 1e23
EVAL_DATASET = "paloma/c4_en"
BYTES_PER_TOKEN = 4.3  # for bits per byte


@dataclass(frozen=True)
class Shape:
    """A model and its run's recipe; the numbers go into `run_start` and drive the simulation."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    n_routed: int
    d_expert: int
    top_k: int
    n_shared: int
    seq_len: int
    batch: int  # sequences per step
    vocab: int
    params_total: float
    params_active: float
    compute: float  # total training FLOPs of the schedule (drives the loss)
    mesh: tuple[int, int, int]  # (data, expert, devices)
    lr: float
    metric_layers: tuple[int, ...]  # layers whose router stats are also logged as scalars
    hot_layer: int | None  # layer with the drifting hot expert (None: no hot expert)
    steps: int  # default schedule length
    expert_load_every: int  # default
    peak_flops: float = 2.45e15  # per device, bf16 dense
    mfu: float = 0.23
    capacity_factor: float = 1.25
    load_batch: int = 0  # sequences whose routing a step's expert_load counts; 0: the whole batch

    @property
    def tokens_per_step(self) -> int:
        return self.batch * self.seq_len

    @property
    def load_tokens(self) -> int:
        return (self.load_batch or self.batch) * self.seq_len

    @property
    def flops_per_token(self) -> float:
        return 6 * self.params_active + 12 * self.n_layers * self.seq_len * self.d_model


# Each preset: its model (the fields of `Shape` from `name` to `lr`, in their order), then its run's recipe
# (the layers whose router stats are also scalars, the hot expert's layer, the default schedule's steps and
# expert_load interval) and what differs from `Shape`'s defaults.
#  name      d_model layers heads routed d_expert top_k shared seq_len batch vocab total active compute mesh lr
_MODELS = (
    ("535b", 6144, 48, 48, 384, 3072, 8, 2, 4096, 4096, 128_256, 535e9, 23e9, 2.7e24, (11, 64, 704), 2.2e-4),
    ("tiny", 64, 4, 4, 16, 64, 2, 1, 256, 32, 256, 2.2e6, 0.9e6, 1e21, (2, 4, 8), 3e-3),
    # the rungs' recipe; each rung sets its width, depth, sizes and batch (`_ladder`)
    ("ladder", 768, 8, 6, 384, 384, 8, 2, 4096, 64, 128_256, 1.6e9, 61e6, 5.5e19, (8, 8, 64), 3e-3),
)
#  name: (metric_layers, hot_layer, steps, expert_load_every, {other field: value})
_RECIPES = {
    "535b": (tuple(range(0, 48, 5)), 20, 500, 10, {}),
    "tiny": ((0, 1, 2, 3), 2, 200, 1, {"peak_flops": 1e11}),
    "ladder": ((0, 4), None, 200, 5, {"load_batch": 256}),
}
PRESETS: dict[str, Shape] = {
    name: Shape(name, *model, *_RECIPES[name][:4], **_RECIPES[name][4]) for name, *model in _MODELS
}
# the reference ladder (CONTEXT.md): rung, d_model, MoE layers, total, active, tokens, FLOPs
LADDER_RUNGS = (
    ("d768", 768, 8, 1.6e9, 61e6, 48e9, 5.5e19),
    ("d1024", 1024, 12, 4.0e9, 162e6, 128e9, 2.7e20),
    ("d1536", 1536, 16, 11.5e9, 481e6, 381e9, 1.8e21),
    ("d2048", 2048, 20, 27.7e9, 1.2e9, 926e9, 9.2e21),
)
TOKENS_PER_PARAM = 791

# incidents, as fractions of the schedule
SPIKE_AT, NAN_AT, PREEMPT_AT, FORK_AT = 0.32, 0.46, 0.62, 0.70
# BLOOM 176B: grad norm 0.24 -> 0.95 -> 2.39 -> 15.9 -> 145 -> 960 while the loss rose 2.2 -> 5.1, 3 steps later
GRAD_SPIKE = {-3: 5.0, -2: 12.0, -1: 60.0, 0: 500.0, 1: 3000.0, 2: 300.0, 3: 30.0, 4: 6.0, 5: 2.5, 6: 1.5}
UPDATE_SPIKE = {-2: 1.8, -1: 2.5, 0: 3.0, 1: 3.0, 2: 2.0, 3: 1.4}
LOSS_SPIKE = {0: 1.12, 1: 1.5, 2: 1.95, 3: 2.3}  # then back to 1 with time constant `tau` (Incidents.spike)
GRAD_SHARES = {
    "embed": 0.3,
    "layers": 0.9,
    "final_norm": 0.02,
    "lm_head": 0.3,
}  # of grad/norm/total, in quadrature
EVAL_S, CKPT_S, ROLLBACK_S, PREEMPT_GAP_S, RESUME_S, FORK_DELAY_S = 90.0, 20.0, 300.0, 1800.0, 600.0, 3600.0


# the losses and routing scalars every step logs, as the trainer names them (before the per-layer ones)
STEP_SCALARS = (
    "train/loss",
    "train/ce_loss",
    "train/z_loss",
    "router/z_loss",
    "router/lb_loss",
    "router/entropy",
    "moe/drop_fraction",
)


def metric_names(shape: Shape) -> list[str]:
    """Every scalar name a step of `shape` logs (throughput is left out on the step after an eval,
    a checkpoint or a (re)start, as the trainer does: that step's wall time is not training)."""
    per_layer = [
        n
        for i in shape.metric_layers
        for n in (
            f"router/layer_{i}/z_loss",
            f"router/layer_{i}/lb_loss",
            f"router/layer_{i}/entropy",
            f"moe/layer_{i}/drop_fraction",
        )
    ]
    return [
        *STEP_SCALARS,
        *per_layer,
        "grad/norm/total",
        *(f"grad/norm/{m}" for m in GRAD_SHARES),
        "opt/update_norm",
        "opt/param_norm",
        "opt/lr",
        "throughput/tokens_per_s",
        "throughput/step_time_s",
        "throughput/mfu",
        "data/tokens",
    ]


@dataclass
class SimResult:
    """What `simulate` wrote: per file (path, state, bytes), and totals."""

    preset: str
    runs: list[str] = field(default_factory=list)
    files: list[tuple[Path, str, int]] = field(default_factory=list)
    events: int = 0
    metric_values: int = 0
    expert_rows: int = 0
    seconds: float = 0.0

    @property
    def bytes(self) -> int:
        return sum(b for _, _, b in self.files)

    @property
    def conflicts(self) -> list[Path]:
        return [p for p, s, _ in self.files if s == "conflict"]

    def summary(self) -> str:
        states: dict[str, int] = {}
        for _, s, _ in self.files:
            states[s] = states.get(s, 0) + 1
        what = ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
        return (
            f"{len(self.runs)} run(s), {len(self.files)} file(s) ({what}): {self.events} events, "
            f"{self.metric_values} metric values, {self.expert_rows} expert-load rows, "
            f"{self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s"
        )


# ------------------------------------------------------------------ the model of a run


def law(compute: float) -> float:
    e, a, alpha = LAW
    return e + a * compute ** (-alpha)


class Model:
    """What stays fixed over a run and its forks: experts' preferences, the layers' skew, the hot expert."""

    def __init__(self, shape: Shape, rng: np.random.Generator):
        L, E = shape.n_layers, shape.n_routed
        self.shape = shape
        self.pref = np.clip(rng.standard_normal((L, E)), -3.0, 3.0)
        self.sigma0 = rng.uniform(0.25, 0.36, L)  # load skew: 3-7% of assignments dropped at cf 1.25
        self.hot = int(rng.integers(E)) if shape.hot_layer is not None else None
        if self.hot is not None:
            self.pref[shape.hot_layer, self.hot] = 0.0  # starts as an average expert
        self.entropy0 = math.log(E) * rng.uniform(0.84, 0.9, L)
        self.rz0 = rng.uniform(0.8, 1.6, L)
        self.assignments = shape.load_tokens * shape.top_k  # per layer per step
        self.capacity = math.ceil(shape.capacity_factor * self.assignments / E)
        grid = np.linspace(0.0, 1.0, 101)
        stats = [self.layer_stats(*self.loads(f)) for f in grid]  # noise-free, between logged steps
        self.grid = grid
        self.grid_drop = np.array([s[0] for s in stats])
        self.grid_lb = np.array([s[1] for s in stats])

    def hot_mult(self, f: float) -> float:
        return 1.0 + 6.0 * f if self.hot is not None else 1.0

    def loads(self, f: float, rng: np.random.Generator | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(routed, dropped), layers x experts, at schedule fraction f; per-step noise if `rng`."""
        lg = (self.sigma0 * (1.0 - 0.2 * f))[:, None] * self.pref
        if rng is not None:
            lg = lg + 0.05 * rng.standard_normal(lg.shape)
        if self.hot is not None:
            lg[self.shape.hot_layer, self.hot] += math.log(self.hot_mult(f))
        x = np.exp(lg - lg.max(axis=1, keepdims=True))
        x /= x.sum(axis=1, keepdims=True)
        routed = np.floor(x * self.assignments).astype(np.int64)
        rows = np.arange(routed.shape[0])
        routed[rows, routed.argmax(axis=1)] += self.assignments - routed.sum(
            axis=1
        )  # every assignment counted
        dropped = np.maximum(routed - self.capacity, 0)
        return routed, dropped

    def layer_stats(self, routed: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per layer: drop fraction, and the Switch load-balancing loss (1.0 at perfect balance)."""
        tot = routed.sum(axis=1)
        share = routed / tot[:, None]
        return dropped.sum(axis=1) / tot, routed.shape[1] * (share**2).sum(axis=1)

    def expected(self, f: float) -> tuple[np.ndarray, np.ndarray]:
        i = min(int(f * 100), 99)
        w = f * 100 - i
        return (
            self.grid_drop[i] * (1 - w) + self.grid_drop[i + 1] * w,
            self.grid_lb[i] * (1 - w) + self.grid_lb[i + 1] * w,
        )


@dataclass
class Incidents:
    """Per-step effects: multipliers on loss, grad norm and update norm; steps whose loss is NaN."""

    loss: dict[int, float] = field(default_factory=dict)
    grad: dict[int, float] = field(default_factory=dict)
    update: dict[int, float] = field(default_factory=dict)
    nan: set[int] = field(default_factory=set)

    @classmethod
    def spike(cls, at: int, tau: float) -> Incidents:
        inc = cls(
            grad={at + k: v for k, v in GRAD_SPIKE.items()},
            update={at + k: v for k, v in UPDATE_SPIKE.items()},
        )
        inc.loss = {at + k: v for k, v in LOSS_SPIKE.items()}
        k = 4
        while (m := 1.0 + 1.3 * math.exp(-(k - 3) / tau)) > 1.002:
            inc.loss[at + k] = m
            k += 1
        return inc


# ------------------------------------------------------------------ one run, step by step


def eval_steps(steps: int) -> list[int]:
    """Every 5% of the schedule (the last is `steps`)."""
    return sorted({round(k * steps / 20) for k in range(1, 21)})


class RunSim:
    """One run's event files and clock; `steps(a, b)` writes steps a..b as the trainer would."""

    def __init__(
        self,
        shape: Shape,
        model: Model,
        run: str,
        steps: int,
        every: int,
        hosts: int,
        runs_dir: Path,
        rng: np.random.Generator,
        t0: float,
        lr: float | None = None,
        lr_scale: float = 1.0,
    ):
        self.shape, self.model, self.run, self.n, self.every, self.rng = shape, model, run, steps, every, rng
        self.files = [EventFile(runs_dir, run, h) for h in range(hosts)]
        self.t = t0
        self.lr_base = shape.lr if lr is None else lr
        self.lr_scale = lr_scale
        self.warmup = max(1, round(0.01 * steps))
        self.evals = set(eval_steps(steps))
        self.inc = Incidents()
        self.restart = True  # the first step after a (re)start has no throughput (its wall time is start-up)
        self.step_t: dict[int, float] = {}
        self.tps = shape.mfu * shape.peak_flops * shape.mesh[2] / shape.flops_per_token
        self.rung_noise = 1.0 + 0.003 * float(rng.standard_normal())  # the run's own offset (its seed)

    # events
    def event(self, kind: str, data: dict, step: int | None, hosts: str = "0", dt: float = 0.0) -> None:
        self.t += dt
        for f in self.files if hosts == "all" else self.files[:1]:
            f.event(kind, data, step, self.t + 0.001 * f.host)

    def note(self, text: str, step: int) -> None:
        self.event("note", {"text": text, "author": "trainer"}, step)

    def end(self, status: str, final_step: int) -> None:
        self.event("run_end", {"status": status, "final_step": final_step}, None, hosts="all", dt=1.0)

    def checkpoint(self, step: int) -> None:
        path = f"gs://observatory-sim/{self.run}/checkpoints/step_{step:07d}"
        self.event("checkpoint", {"path": path, "bytes": int(self.shape.params_total * 12)}, step, dt=CKPT_S)

    # the curves
    def lr(self, s: int) -> float:
        if s <= self.warmup:
            frac = s / self.warmup
        else:
            p = (s - self.warmup) / max(1, self.n - self.warmup)
            frac = 0.1 + 0.45 * (1 + math.cos(math.pi * min(p, 1.0)))
        return self.lr_base * self.lr_scale * frac

    def eval_loss(self, s: int) -> float:
        f = s / self.n
        return (
            (law(f * self.shape.compute) + 0.01)
            * self.rung_noise
            * (1 + 0.001 * float(self.rng.standard_normal()))
        )

    def steps(self, first: int, last: int) -> None:
        for s in range(first, last + 1):
            self._step(s)

    def _step(self, s: int) -> None:
        sh, m, inc = self.shape, self.model, self.inc
        f = s / self.n
        nz = self.rng.standard_normal(8 + 3 * sh.n_layers)
        tps = self.tps * math.exp(0.01 * nz[0])
        dt = sh.tokens_per_step / tps
        self.t += dt
        t = self.t
        self.step_t[s] = t
        if self.every and s % self.every == 0:
            routed, dropped = m.loads(f, self.rng)
            drop, lb = m.layer_stats(routed, dropped)
            self.files[0].expert_loads(s, t, routed, dropped)
        else:
            drop, lb = m.expected(f)
            drop = drop * (1 + 0.02 * nz[8 : 8 + sh.n_layers])
            lb = lb + 0.002 * nz[8 + sh.n_layers : 8 + 2 * sh.n_layers]
        lm = inc.loss.get(s, 1.0)
        trans = math.exp(-s / max(1.0, 0.01 * self.n))
        base = law(f * sh.compute) * self.rung_noise
        ce = (base + (math.log(sh.vocab) - base) * trans) * (1 + 0.004 * nz[1]) * lm
        z = (6.0 + 24.0 * math.exp(-f / 0.05)) * (1 + 0.02 * nz[2]) * lm * lm
        rz = (
            m.rz0
            * (0.6 + 0.4 * math.exp(-f / 0.1))
            * (1 + 0.02 * nz[8 + 2 * sh.n_layers :])
            * (1 + 0.5 * (lm - 1))
        )
        ent = m.entropy0 * (1 - 0.1 * f) + 0.003 * nz[8 : 8 + sh.n_layers]
        if m.hot is not None:
            ent[sh.hot_layer] -= 0.02 * (m.hot_mult(f) - 1)
        loss = ce + 1e-4 * z + 1e-3 * float(rz.mean()) + 1e-2 * float(lb.mean())
        grad = 0.25 * (1 + 0.6 * f) * (1 + 4 * trans) * math.exp(0.08 * nz[3]) * inc.grad.get(s, 1.0)
        lr = self.lr(s)
        update = lr * math.sqrt(sh.params_total) * 0.25 * math.exp(0.03 * nz[4]) * inc.update.get(s, 1.0)
        if s in inc.nan:
            loss = ce = z = grad = math.nan
            update = 0.0  # the update was not applied
        v: dict[str, float] = {
            "train/loss": loss,
            "train/ce_loss": ce,
            "train/z_loss": z,
            "router/z_loss": float(rz.mean()),
            "router/lb_loss": float(lb.mean()),
            "router/entropy": float(ent.mean()),
            "moe/drop_fraction": float(drop.mean()),
        }
        for i in sh.metric_layers:
            v[f"router/layer_{i}/z_loss"] = float(rz[i])
            v[f"router/layer_{i}/lb_loss"] = float(lb[i])
            v[f"router/layer_{i}/entropy"] = float(ent[i])
            v[f"moe/layer_{i}/drop_fraction"] = float(drop[i])
        v["grad/norm/total"] = grad
        for name, share in GRAD_SHARES.items():
            v[f"grad/norm/{name}"] = grad * share / math.sqrt(sum(x * x for x in GRAD_SHARES.values()))
        v["opt/update_norm"] = update
        v["opt/param_norm"] = 0.02 * math.sqrt(sh.params_total) * (1 + 0.3 * f)
        v["opt/lr"] = lr
        local: dict[str, float] = {}
        if not self.restart:
            mfu = sh.flops_per_token * tps / (sh.peak_flops * sh.mesh[2])
            v["throughput/tokens_per_s"] = tps
            v["throughput/step_time_s"] = dt
            v["throughput/mfu"] = mfu
            local = {"throughput/tokens_per_s": tps, "throughput/step_time_s": dt, "throughput/mfu": mfu}
        self.restart = False
        v["data/tokens"] = float(s * sh.tokens_per_step)
        self.files[0].metrics(s, t, v)
        for fh in self.files[1:]:
            if local:
                jit = math.exp(0.003 * float(self.rng.standard_normal()))
                host_local = {
                    **local,
                    "throughput/tokens_per_s": local["throughput/tokens_per_s"] / len(self.files) * jit,
                }
                fh.metrics(s, t + 0.001 * fh.host, host_local)
        if s in self.evals:
            loss = self.eval_loss(s) * inc.loss.get(s, 1.0)
            self.event(
                "eval",
                {"dataset": EVAL_DATASET, "loss": loss, "bpb": loss / math.log(2) / BYTES_PER_TOKEN},
                s,
                dt=EVAL_S,
            )
            self.checkpoint(s)
            self.restart = True  # the next step's wall time includes the eval and the checkpoint


def _start_data(sim: RunSim, preset: str, seed: int, **extra: Any) -> dict:
    sh = sim.shape
    config = {
        "name": sim.run,
        "steps": sim.n,
        "seed": seed,
        "model": {
            "vocab": sh.vocab,
            "d_model": sh.d_model,
            "n_layers": sh.n_layers,
            "n_heads": sh.n_heads,
            "head_dim": sh.d_model // sh.n_heads,
            "seq_len": sh.seq_len,
            "qk_norm": True,
            "moe_every": 1,
            "n_shared": sh.n_shared,
            "n_routed": sh.n_routed,
            "top_k": sh.top_k,
            "d_expert": sh.d_expert,
            "capacity_factor": sh.capacity_factor,
            "router_z_coef": 1e-3,
            "lb_coef": 1e-2,
            "logit_z_coef": 1e-4,
            "gating": "softmax_topk",
            "dtype": "bfloat16",
        },
        "optimizer": {
            "lr": sim.lr_base,
            "weight_decay": 0.1,
            "b1": 0.9,
            "b2": 0.95,
            "eps": 1e-8,
            "grad_clip": 1.0,
        },
        "schedule": {"kind": "cosine", "warmup_steps": sim.warmup, "min_lr_ratio": 0.1},
        "data": {"seq_len": sh.seq_len, "batch_size": sh.batch, "seed": seed},
        "mesh": {"data": sh.mesh[0], "expert": sh.mesh[1]},
        "checkpoint": {"every": max(1, round(sim.n / 20))},
        "eval": {"every": max(1, round(sim.n / 20))},
        "telemetry": {"expert_load_every": sim.every},
        "failure": {"on_nan": "rollback", "rollback_lr_scale": 0.5},
        "simulate": {"preset": preset, "seed": seed, "version": SIM_VERSION},
    }
    return {
        "config": config,
        "name": sim.run,
        "data": {
            "name": "simulated",
            "fingerprint": f"sim-{preset}-{seed}",
            "tokens": sim.n * sh.tokens_per_step,
        },
        "mesh": {
            "data": sh.mesh[0],
            "expert": sh.mesh[1],
            "processes": len(sim.files),
            "devices": sh.mesh[2],
        },
        "model": {
            "params_total": int(sh.params_total),
            "params_active": int(sh.params_active),
            "flops_per_token": float(sh.flops_per_token),
        },
        "tags": ["simulated", preset],
        "source": {"trainer": "observatory-simulate", "version": SIM_VERSION},
        **extra,
    }


# ------------------------------------------------------------------ the presets' stories


def _scenario(
    shape: Shape,
    run_id: str,
    steps: int,
    every: int,
    hosts: int,
    runs_dir: Path,
    seed: int,
    sims: list[RunSim],
) -> None:
    """The reference run's story: spike with a grad-norm precursor, NaN and rollback, preemption and
    resume, a fork with a config diff, a hot expert drifting."""
    model_ss, main_ss, fork_ss = np.random.SeedSequence([seed, 535]).spawn(3)
    model = Model(shape, np.random.default_rng(model_ss))
    main = RunSim(shape, model, run_id, steps, every, hosts, runs_dir, np.random.default_rng(main_ss), T0)
    sims.append(main)
    ev = eval_steps(steps)
    spike, nan = round(SPIKE_AT * steps), round(NAN_AT * steps)
    back = max(e for e in ev if e < nan)  # the last checkpoint before the NaN
    pre = round(PREEMPT_AT * steps)
    pre += pre in ev
    fork_at = ev[13]  # the 70% checkpoint
    main.inc = Incidents.spike(spike, tau=max(2.0, min(6.0, steps / 60)))
    main.inc.nan = {nan}
    main.event("run_start", _start_data(main, shape.name, seed), None)
    main.steps(1, nan)
    msg = f"non-finite loss nan at step {nan}; the update was not applied; rolling back to the last checkpoint with LR x0.5"
    main.event("failure", {"type": "nan_loss", "message": msg, "action": "rollback"}, nan, hosts="all")
    main.lr_scale *= 0.5
    main.t += ROLLBACK_S
    main.note(f"rolled back to step {back}; LR scale now {main.lr_scale:g}", back)
    main.restart = True
    main.steps(back + 1, pre)
    main.checkpoint(pre)  # SIGTERM: checkpoint, then end the run preempted
    main.end("preempted", pre)
    main.t += PREEMPT_GAP_S + RESUME_S
    main.note(f"resumed from checkpoint at step {pre}", pre)
    main.restart = True
    main.steps(pre + 1, steps)
    main.end("completed", steps)

    fork_id = f"{run_id}-fork"
    fork = RunSim(
        shape,
        model,
        fork_id,
        steps,
        every,
        hosts,
        runs_dir,
        np.random.default_rng(fork_ss),
        main.step_t[fork_at] + FORK_DELAY_S,
        lr=shape.lr / 2,
        lr_scale=main.lr_scale,
    )
    sims.append(fork)
    parent = {"run": run_id, "step": fork_at}
    fork.event("run_start", _start_data(fork, shape.name, seed, parent=parent), None)
    fork.event(
        "config_diff", {"against": parent, "changes": {"optimizer.lr": [shape.lr, shape.lr / 2]}}, fork_at
    )
    last = min(steps, fork_at + max(steps // 10, 20))
    fork.steps(fork_at + 1, last)
    fork.end("completed", last)


def _ladder(
    name: str, steps: int, every: int, hosts: int, runs_dir: Path, seed: int, sims: list[RunSim]
) -> None:
    """The four rungs, clean runs on the law, one after another."""
    recipe = PRESETS["ladder"]
    for i, (rung, d, layers, total, active, tokens, flops) in enumerate(LADDER_RUNGS):
        batch = max(1, round(tokens / (steps * recipe.seq_len)))  # the rung's tokens in `steps` steps
        exact = steps * batch * recipe.seq_len
        shape = Shape(
            **{
                **recipe.__dict__,
                "name": rung,
                "d_model": d,
                "n_layers": layers,
                "n_heads": d // 128,
                "d_expert": d // 2,
                "batch": batch,
                "params_total": total,
                "params_active": active,
                "compute": flops * exact / tokens,
                "metric_layers": (0, layers // 2),
            }
        )
        model_ss, run_ss = np.random.SeedSequence([seed, 791, i]).spawn(2)
        sim = RunSim(
            shape,
            Model(shape, np.random.default_rng(model_ss)),
            f"{name}-{rung}",
            steps,
            every,
            hosts,
            runs_dir,
            np.random.default_rng(run_ss),
            T0 + i * 86400.0,
        )
        sims.append(sim)
        info = {
            "name": name,
            "rung": rung,
            "seed": 0,
            "params_active": int(active),
            "params_total": int(total),
            "tokens": exact,
            "flops": shape.compute,
            "steps": steps,
            "tokens_per_param": TOKENS_PER_PARAM,
        }
        sim.event("run_start", _start_data(sim, "ladder", seed, ladder=info), None)
        sim.steps(1, steps)
        sim.end("completed", steps)


def simulate(
    preset: str,
    runs_dir: str | os.PathLike,
    steps: int | None = None,
    run_id: str | None = None,
    seed: int = 0,
    expert_load_every: int | None = None,
    hosts: int = 1,
    replace: bool = False,
) -> SimResult:
    """Write a preset's runs into `runs_dir`; the same arguments give the same bytes.

    `run_id` names the main run (default `sim-<preset>`; the fork is `<run_id>-fork`; for
    `ladder` it is the ladder's name and the rungs are `<run_id>-<rung>`). A file that is
    already there with other content is left alone (`conflict`) unless `replace`.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    shape = PRESETS[preset]
    steps = shape.steps if steps is None else steps
    every = shape.expert_load_every if expert_load_every is None else expert_load_every
    least = 20 if preset == "ladder" else 60
    if steps < least:
        raise ValueError(
            f"--steps must be >= {least} for preset {preset} (evals every 5%, room for its incidents)"
        )
    if every < 0 or hosts < 1:
        raise ValueError("expert_load_every must be >= 0 and hosts >= 1")
    run_id = run_id or f"sim-{preset}"
    longest = f"{run_id}-d1024" if preset == "ladder" else f"{run_id}-fork"
    if not RUN_ID_RE.match(run_id) or not RUN_ID_RE.match(longest) or run_id in (".", ".."):
        raise ValueError(f"run id {run_id!r} must match [A-Za-z0-9._-]{{1,122}} (suffixes are added)")
    runs_dir = Path(runs_dir)
    res = SimResult(preset)
    t0 = time.perf_counter()
    sims: list[RunSim] = []
    try:
        if preset == "ladder":
            _ladder(run_id, steps, every, hosts, runs_dir, seed, sims)
        else:
            _scenario(shape, run_id, steps, every, hosts, runs_dir, seed, sims)
        for sim in sims:
            res.runs.append(sim.run)
            for f in sim.files:
                f.close()
                res.files.append((f.path, put_path(f.tmp, f.path, replace), f.bytes))
                res.events += f.seq
                res.metric_values += f.metric_values
                res.expert_rows += f.expert_rows
    finally:
        for sim in sims:
            for f in sim.files:
                f.close()
                f.tmp.unlink(missing_ok=True)
    res.seconds = time.perf_counter() - t0
    return res
