"""Instability detectors: pure functions over a run's metric series -> `Finding`s.

`observatory.detect.scan` runs them over the store as events are ingested and writes
each finding as an `anomaly` event; this module knows nothing of stores or files.

Detectors (all thresholds are settings, `anomaly_*`, see `observatory.detect.thresholds`):

- `loss_spike`: train/loss above its recent level (median of the previous
  `anomaly_min_history` steps) by `anomaly_loss_z` robust sigmas of its noise
  (IQR of step-to-step changes over the previous `anomaly_window` steps, which a
  falling loss does not inflate; OLMo-core flags mean + 6 sigma of the previous
  128) and by `anomaly_loss_min_rise`.
- `loss_dip`: the loss falls to under half its recent level in a step: no model
  learns that fast, a batch unlike the others (a bad batch of one repeated byte) does.
- `grad_spike`: the same on log grad/norm/total, plus a minimum ratio and a
  confirmation (two such steps in a row, or one `anomaly_grad_single_ratio` times
  the level). In BLOOM 176B's logs the grad norm led the loss spike by ~3 steps:
  this is the early warning. Graded by what the loss did (`unfollowed`): a one-step
  spike the loss did not follow is info.
- `update_spike`: the same rule on opt/update_norm: the update that wrecks the
  weights is logged one step before the loss it wrecks.
- `grad_growth`: the rolling median grad norm climbs `anomaly_grad_growth` times
  above its lowest level in the window before (the 535B run's grad norm grew past 4).
- `incomplete_recovery`: loss still above its pre-spike level `anomaly_recovery_steps`
  after a spike.
- `drop_jump`: moe/drop_fraction (or dropped/routed from expert_load) jumps.
- `hot_expert` / `dead_expert`: max/mean routed load over a ratio, or zero load,
  for `anomaly_expert_steps` consecutive logged steps.
- `nonfinite`: NaN or inf in any metric.
- `throughput_drop`: tokens/s below a fraction of its trailing median for a while;
  info (a busy machine) unless it lasts `anomaly_throughput_sustain` logged steps.
- `stalled_run`: no events for `anomaly_stall_s` and no run_end.

Detectors are pure functions of numpy arrays (steps, values) -> `Finding`s, so
they are tested on synthetic series and on real runs alike. A flag at a step
depends only on a bounded trailing window, which is what makes the incremental
scan (`observatory.detect.scan`) exact.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from observatory import settings
from observatory.detect.rolling import level_noise as _level_noise
from observatory.detect.rolling import rolling, shift
from observatory.detect.rolling import trailing as _trailing
from observatory.detect.thresholds import Thresholds
from observatory.store.schema import PHASE_BUDGETED

__all__ = [
    "Finding",
    "unfollowed",
    "loss_spikes",
    "loss_dips",
    "grad_spikes",
    "update_spikes",
    "grad_growth",
    "incomplete_recovery",
    "drop_jumps",
    "hot_experts",
    "hot_from_ratio",
    "dead_experts",
    "dead_from_zeros",
    "nonfinite",
    "throughput_drops",
    "stalled",
    "LOSS",
    "GRAD",
    "UPDATE",
    "DROP",
    "THROUGHPUT",
    "SPIKE_GAP",
    "finding_rows",
]

LOSS = "train/loss"
GRAD = "grad/norm/total"
UPDATE = "opt/update_norm"
DROP = "moe/drop_fraction"
THROUGHPUT = "throughput/tokens_per_s"
SPIKE_GAP = 2  # flagged steps this close (in logged steps) belong to one episode


@dataclass(frozen=True)
class Finding:
    """One detector finding; `data()` is the `anomaly` event's payload."""

    detector: str
    metric: str
    severity: str  # info | warn | critical
    message: str
    window: tuple[int, int]  # [first_step, last_step] seen when it was found
    step: int  # the step at which the detector could first raise it (live)
    value: float | None = None
    extra: dict = field(default_factory=dict, compare=False)
    run: str = ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.detector, self.metric, int(self.window[0]))

    def data(self, scanned_through: int | None = None) -> dict[str, Any]:
        d: dict[str, Any] = {
            "detector": self.detector,
            "metric": self.metric,
            "severity": self.severity,
            "message": self.message,
            "window": [int(self.window[0]), int(self.window[1])],
        }
        if self.value is not None and math.isfinite(self.value):
            d["value"] = float(self.value)
        d.update(self.extra)
        if scanned_through is not None:
            d["scanned_through"] = int(scanned_through)
        return d


# ----------------------------------------------------------------- helpers


def _episodes(flags: np.ndarray, gap: int = 0) -> list[tuple[int, int]]:
    """Index ranges [i0, i1] of True runs, merging runs separated by <= gap False rows."""
    idx = np.flatnonzero(flags)
    if idx.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(idx) > gap + 1)
    starts = np.concatenate(([idx[0]], idx[breaks + 1]))
    ends = np.concatenate((idx[breaks], [idx[-1]]))
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def _peak(
    detector: str,
    metric: str,
    severity: str,
    message: str,
    steps,
    x,
    i0: int,
    i1: int,
    ip: int,
    base: float,
    raised_at: int | None = None,
    **extra: Any,
) -> Finding:
    """A finding over the episode steps[i0..i1] that peaks at ip, against a baseline level."""
    return Finding(
        detector,
        metric,
        severity,
        message,
        (int(steps[i0]), int(steps[i1])),
        int(steps[i0 if raised_at is None else raised_at]),
        float(x[ip]),
        {"peak_step": int(steps[ip]), "baseline": float(base), **extra},
    )


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _gt(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a > b elementwise, False where either is NaN."""
    with np.errstate(invalid="ignore"):
        return a > b


# --------------------------------------------------------------- detectors
#
# Every detector takes `steps` (N,) int and its series (N,) float and returns
# Findings. Its flags at a row depend only on a bounded trailing window, so a scan
# of a truncated frame drops the episodes that began before its windows were whole
# (`observatory.detect.scan.detect_frame`).


def _spikes(
    detector: str,
    metric: str,
    steps,
    x,
    z_thr: float,
    min_rise: float,
    th: Thresholds,
    log: bool,
    single: float | None = None,
    memo: dict | None = None,
) -> list[Finding]:
    """Episodes of values above their recent level by `z_thr` robust sigmas and by `min_rise`.

    log: work on log(x) (grad norms are multiplicative), `min_rise` is then a ratio.
    single: an episode is confirmed by one step this far above (a ratio, or a
    fraction), else by two flagged steps in a row; None: one flagged step is enough.
    The finding's `step` is the step that confirmed it.
    """
    x = np.asarray(x, dtype=float)
    flags, strong, med, z = spike_flags(x, z_thr, min_rise, th, log, single, memo=memo)
    out = []
    for i0, i1 in _episodes(flags, SPIKE_GAP):
        conf = next(
            (j for j in range(i0, i1 + 1) if strong[j] or (j > i0 and flags[j] and flags[j - 1])), None
        )
        if conf is None:
            continue  # one moderate step on its own: tiny noisy runs do that
        seg = x[i0 : i1 + 1]
        ip = i0 + int(np.nanargmax(seg))
        base = math.exp(med[i0]) if log else med[i0]
        ratio = x[ip] / base if base else math.inf
        zp = float(np.nanmax(z[i0 : i1 + 1]))
        critical = zp > 2 * z_thr or ratio > (10 if log else 1.5)
        what = "grad norm" if log else metric
        out.append(
            _peak(
                detector,
                metric,
                "critical" if critical else "warn",
                f"{what} spiked to {_fmt(x[ip])} at step {steps[ip]} ({ratio:.2f}x its recent level "
                f"{_fmt(base)}, {zp:.1f} robust sigma)",
                steps,
                x,
                i0,
                i1,
                ip,
                base,
                raised_at=conf,
                z=round(zp, 2),
            )
        )
    return out


def spike_flags(
    x: np.ndarray,
    z_thr: float,
    min_rise: float,
    th: Thresholds,
    log: bool,
    single: float | None = None,
    starts: np.ndarray | None = None,
    memo: dict | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`_spikes`' rule, row by row: (flags, strong, level, z). `starts`: `x` is several series one after
    another (`observatory.detect.rolling.rolling`), each flagged as alone (`observatory.detect.screen`).
    `memo`: the caller's, to share the level and noise of the same values (`rolling.level_noise`)."""
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(x > 0, np.log(x), np.nan)
    else:
        y = x
    med, sig = _level_noise(y, th.window, th.min_history, starts, memo)
    med = np.where(np.isfinite(sig), med, np.nan)  # no noise estimate yet: not enough history
    # a floor on sigma: a perfectly smooth series must not turn 0.1% into 6 sigma
    floor = 0.01 if log else 0.002 * np.abs(med) + 1e-12
    sig = np.maximum(np.nan_to_num(sig, nan=0.0), floor)
    with np.errstate(invalid="ignore"):
        z = (y - med) / sig
        rise = (y - med) if log else (y - med) / np.abs(med)
    need = math.log(min_rise) if log else min_rise
    flags = _gt(z, np.full_like(z, z_thr)) & _gt(rise, np.full_like(z, need)) & np.isfinite(y)
    if single is None:
        strong = flags
    else:
        strong = flags & _gt(rise, np.full_like(z, math.log(single) if log else single))
    return flags, strong, med, z


def loss_spikes(steps, loss, th: Thresholds, metric: str = LOSS, memo: dict | None = None) -> list[Finding]:
    """Loss above its recent level by `loss_z` robust sigmas and by `loss_min_rise`.

    A new episode that starts before the loss came back to within `recovery_tol` of
    the previous one's baseline is the same instability (a divergence climbs in
    steps): it extends that finding instead of raising another.
    """
    steps = np.asarray(steps)
    x = np.asarray(loss, dtype=float)
    out: list[Finding] = []
    for f in _spikes("loss_spike", metric, steps, x, th.loss_z, th.loss_min_rise, th, log=False, memo=memo):
        if out:
            prev = out[-1]
            between = x[(steps > prev.window[1]) & (steps < f.window[0])]
            between = between[np.isfinite(between)]
            if not (between <= prev.extra["baseline"] * (1 + th.recovery_tol)).any():
                higher = f.value is not None and prev.value is not None and f.value > prev.value
                top = f if higher else prev
                out[-1] = replace(
                    prev,
                    window=(prev.window[0], f.window[1]),
                    value=top.value,
                    message=f"{prev.message.split('; not recovered')[0]}; not recovered, highest {_fmt(top.value)} at step "
                    f"{top.extra['peak_step']} by step {f.window[1]}",
                    extra={**prev.extra, "max_step": top.extra["peak_step"]},
                )
                continue
        out.append(f)
    return out


def loss_dips(steps, loss, th: Thresholds, metric: str = LOSS, memo: dict | None = None) -> list[Finding]:
    """Loss below its recent level by `loss_z` robust sigmas and by the fraction `loss_dip`.

    Learning never halves the loss from one step to the next; a batch does that when
    it is unlike the others (one repeated token, duplicated documents): a data fault.
    """
    steps = np.asarray(steps)
    x = np.asarray(loss, dtype=float)
    flags, med = dip_flags(x, th, memo=memo)
    out = []
    for i0, i1 in _episodes(flags, 0):
        ip = i0 + int(np.nanargmin(x[i0 : i1 + 1]))
        said = (
            f"{metric} fell to {_fmt(x[ip])} at step {steps[ip]}, {100 * x[ip] / med[i0]:.0f}% of its recent "
            f"level {_fmt(med[i0])}: a batch unlike the others (repeated or duplicated data?)"
        )
        out.append(_peak("loss_dip", metric, "warn", said, steps, x, i0, i1, ip, med[i0]))
    return out


def dip_flags(
    x: np.ndarray, th: Thresholds, starts: np.ndarray | None = None, memo: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`loss_dips`' rule, row by row: (flags, level); `starts`, `memo` as in `spike_flags`."""
    med, sig = _level_noise(x, th.window, th.min_history, starts, memo)
    med = np.where(np.isfinite(sig), med, np.nan)
    sig = np.maximum(np.nan_to_num(sig, nan=0.0), 0.002 * np.abs(np.nan_to_num(med)) + 1e-12)
    with np.errstate(invalid="ignore"):
        z = (med - x) / sig
        flags = _gt(z, np.full_like(x, th.loss_z)) & _gt(med * (1 - th.loss_dip), x) & np.isfinite(x)
    return flags, med


def grad_spikes(steps, grad, th: Thresholds, metric: str = GRAD) -> list[Finding]:
    """Log grad norm above its recent level by `grad_z` robust sigmas and `grad_min_ratio` times,
    confirmed by a second such step in a row or by one step `grad_single_ratio` times the level."""
    return _spikes(
        "grad_spike",
        metric,
        np.asarray(steps),
        grad,
        th.grad_z,
        th.grad_min_ratio,
        th,
        log=True,
        single=th.grad_single_ratio,
    )


def update_spikes(steps, update, th: Thresholds, metric: str = UPDATE) -> list[Finding]:
    """The grad-norm spike rule on the optimizer update's norm.

    An update is logged at the step that applies it, so a bad update shows here one
    step before the loss it wrecks (Marin 32B: update-norm spikes preceded loss spikes).
    Adam's updates are normalised, so in a healthy run this series is smooth.
    """
    fs = _spikes(
        "update_spike",
        metric,
        np.asarray(steps),
        update,
        th.grad_z,
        th.grad_min_ratio,
        th,
        log=True,
        single=th.grad_single_ratio,
    )
    return [replace(f, message=f.message.replace("grad norm", "update norm", 1)) for f in fs]


def grad_growth(steps, grad, th: Thresholds, metric: str = GRAD) -> list[Finding]:
    """Rolling median grad norm (`growth_steps`) over its lowest level in the `window` before."""
    steps = np.asarray(steps)
    flags, ratio, level_np, base_np = growth_flags(np.asarray(grad, dtype=float), th)
    k = th.growth_steps
    out = []
    # sustained: the level itself must stay up `growth_steps` (a spike's decay does not);
    # one episode however it wobbles around the threshold within a window
    for i0, i1 in _episodes(flags, th.window):
        run = next((j for j in range(i0, i1 - k + 2) if flags[j : j + k].all()), None)
        if run is None:
            continue
        i0 = run
        ip = i0 + int(np.nanargmax(ratio[i0 : i1 + 1]))
        out.append(
            Finding(
                "grad_growth",
                metric,
                "warn",
                f"grad norm has been growing: median {_fmt(level_np[ip])} over the last {k} steps at step "
                f"{steps[ip]}, {ratio[ip]:.2f}x its lowest level {_fmt(base_np[ip])} before",
                (int(steps[i0]), int(steps[i1])),
                int(steps[i0 + k - 1]),
                float(level_np[ip]),
                {"ratio": round(float(ratio[ip]), 3), "baseline": float(base_np[ip])},
            )
        )
    return out


def growth_flags(
    grad: np.ndarray, th: Thresholds, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`grad_growth`'s rule, row by row: (flags, ratio, level, lowest level before); `starts` as in
    `spike_flags`."""
    g = np.where(np.isfinite(grad) & (grad > 0), grad, np.nan)
    k = th.growth_steps
    (level_np,) = rolling(g, k, max(1, k // 2), (0.5,), starts)
    (base_np,) = rolling(shift(level_np, k, starts), th.window, th.min_history, (0.0,), starts)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = level_np / base_np
    return _gt(ratio, np.full_like(ratio, th.grad_growth)), ratio, level_np, base_np


def incomplete_recovery(
    steps, loss, spikes: list[Finding], th: Thresholds, metric: str = LOSS
) -> list[Finding]:
    """Loss still above its pre-spike level by `recovery_tol` `recovery_steps` after a spike's peak.

    A spike whose check step has not been logged yet is left for a later scan.
    """
    steps = np.asarray(steps)
    x = np.asarray(loss, dtype=float)
    out = []
    for sp in spikes:
        if sp.detector != "loss_spike":
            continue
        due = sp.extra["peak_step"] + th.recovery_steps
        j = int(np.searchsorted(steps, due))
        if j >= len(steps):
            continue
        pre = sp.extra["baseline"]
        lo = int(np.searchsorted(steps, due - max(1, th.recovery_steps // 8)))
        post = x[lo : j + 1]
        post = post[np.isfinite(post)]
        if post.size == 0:
            continue
        level = float(np.median(post))
        if level > pre * (1 + th.recovery_tol):
            out.append(
                Finding(
                    "incomplete_recovery",
                    metric,
                    "critical" if level > pre * (1 + 5 * th.recovery_tol) else "warn",
                    f"{metric} is {_fmt(level)} {steps[j] - sp.extra['peak_step']} steps after the spike at step "
                    f"{sp.extra['peak_step']}, still {100 * (level / pre - 1):.1f}% above its pre-spike level "
                    f"{_fmt(pre)}",
                    (sp.window[0], int(steps[j])),
                    int(steps[j]),
                    level,
                    {"spike_step": sp.extra["peak_step"], "baseline": pre},
                )
            )
    return out


def drop_jumps(steps, drop, th: Thresholds, metric: str = DROP) -> list[Finding]:
    """Drop fraction above its recent level by `drop_jump` (absolute) and `drop_z` robust sigmas.

    Both: early in training the drop fraction swings by 0.1 and more from step to
    step as the router settles, so a fixed jump alone would cry wolf.
    """
    steps = np.asarray(steps)
    x = np.asarray(drop, dtype=float)
    flags, med, z = drop_flags(x, th)
    out = []
    for i0, i1 in _episodes(flags, SPIKE_GAP):
        ip = i0 + int(np.nanargmax(x[i0 : i1 + 1]))
        severity = "critical" if x[ip] - med[i0] > 3 * th.drop_jump else "warn"
        said = (
            f"drop fraction jumped to {x[ip]:.3f} at step {steps[ip]} from a recent level of {med[i0]:.3f} "
            f"({float(np.nanmax(z[i0 : i1 + 1])):.1f} robust sigma)"
        )
        out.append(_peak("drop_jump", metric, severity, said, steps, x, i0, i1, ip, med[i0]))
    return out


def drop_flags(
    x: np.ndarray, th: Thresholds, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`drop_jumps`' rule, row by row: (flags, level, z); `starts` as in `spike_flags`."""
    med, sig = _level_noise(x, th.window, th.min_history, starts)
    med = np.where(np.isfinite(sig), med, np.nan)
    sig = np.maximum(np.nan_to_num(sig, nan=0.0), 1e-3)
    with np.errstate(invalid="ignore"):
        z = (x - med) / sig
    return _gt(x - med, np.full_like(x, th.drop_jump)) & _gt(z, np.full_like(x, th.drop_z)), med, z


def _streaks(steps, flags: np.ndarray, n: int) -> list[tuple[int, int]]:
    return [(i0, i1) for i0, i1 in _episodes(flags, 0) if i1 - i0 + 1 >= n]


def hot_experts(steps, layer: int, routed: np.ndarray, th: Thresholds) -> list[Finding]:
    """Max/mean routed load of one layer over `hot_ratio` for `expert_steps` logged steps. routed: (T, E)."""
    routed, mean = np.asarray(routed, dtype=float), np.asarray(routed, dtype=float).mean(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(mean > 0, routed.max(axis=1) / mean, np.nan)
    return hot_from_ratio(
        steps, layer, ratio, lambda i0, i1: np.bincount(routed[i0 : i1 + 1].argmax(axis=1)).argmax(), th
    )


def hot_from_ratio(steps, layer: int, ratio: np.ndarray, hottest, th: Thresholds) -> list[Finding]:
    """`hot_experts` from the layer's max/mean ratio per logged step (T,), NaN where nothing was routed.

    hottest(i0, i1): the expert most often the busiest over rows i0..i1 (asked only for an episode).
    """
    steps = np.asarray(steps)
    ratio = np.asarray(ratio, dtype=float)
    flags = _gt(ratio, np.full_like(ratio, th.hot_ratio))
    out = []
    for i0, i1 in _streaks(steps, flags, th.expert_steps):
        top = int(hottest(i0, i1))
        peak = float(np.nanmax(ratio[i0 : i1 + 1]))
        said = (
            f"layer {layer}: expert {top} takes {peak:.1f}x the mean load "
            f"(max/mean above {th.hot_ratio}) for {i1 - i0 + 1} logged steps from step {steps[i0]}"
        )
        metric = f"expert_load/layer_{layer}"
        out.append(_expert_finding("hot_expert", metric, said, steps, i0, i1, th, peak, layer, top))
    return out


def _expert_finding(
    detector: str,
    metric: str,
    message: str,
    steps,
    i0: int,
    i1: int,
    th: Thresholds,
    value: float,
    layer,
    expert,
) -> Finding:
    """A warning about one expert over the logged steps steps[i0..i1], raised once it lasted `expert_steps`."""
    return Finding(
        detector,
        metric,
        "warn",
        message,
        (int(steps[i0]), int(steps[i1])),
        int(steps[i0 + th.expert_steps - 1]),
        value,
        {"layer": int(layer), "expert": int(expert)},
    )


def dead_experts(steps, layer: int, routed: np.ndarray, th: Thresholds) -> list[Finding]:
    """Experts of one layer routed nothing for `expert_steps` logged steps. routed: (T, E)."""
    routed = np.asarray(routed)
    if routed.size == 0 or routed.sum() == 0:
        return []  # nothing routed at all in this layer: no expert is singled out
    rows, experts = np.nonzero(routed == 0)
    return dead_from_zeros(steps, layer, rows, experts, th)


def dead_from_zeros(
    steps, layer: int, rows: np.ndarray, experts: np.ndarray, th: Thresholds
) -> list[Finding]:
    """`dead_experts` from the (row, expert) cells of a layer that routed nothing (rows index `steps`).

    The caller checks that the layer routed something at all. One finding per streak of `expert_steps`+ steps.
    """
    steps, rows, experts = np.asarray(steps), np.asarray(rows, np.int64), np.asarray(experts, np.int64)
    if rows.size < th.expert_steps:
        return []
    order = np.lexsort((rows, experts))
    rows, experts = rows[order], experts[order]
    # a streak breaks where the expert changes or a logged step is skipped
    brk = np.flatnonzero((np.diff(experts) != 0) | (np.diff(rows) != 1)) + 1
    starts = np.concatenate(([0], brk))
    ends = np.concatenate((brk, [rows.size])) - 1
    out = []
    for a, b in zip(starts.tolist(), ends.tolist(), strict=True):
        if b - a + 1 < th.expert_steps:
            continue
        e, i0, i1 = int(experts[a]), int(rows[a]), int(rows[b])
        said = f"layer {layer}: expert {e} received no tokens for {i1 - i0 + 1} logged steps from step {steps[i0]}"
        metric = f"expert_load/layer_{layer}/expert_{e}"
        out.append(_expert_finding("dead_expert", metric, said, steps, i0, i1, th, 0.0, layer, e))
    return out


def nonfinite(steps, columns: dict[str, np.ndarray]) -> list[Finding]:
    """NaN or inf in any metric. One finding per episode, named after the loss if it is among them.

    columns: name -> (N,) values; the caller fills steps where a metric was not logged with 0.
    """
    steps = np.asarray(steps)
    if not columns:
        return []
    names = sorted(columns)
    bad = np.stack([~np.isfinite(np.asarray(columns[n], dtype=float)) for n in names])  # (M, N)
    flags = bad.any(axis=0)
    out = []
    for i0, i1 in _episodes(flags, 0):
        which = [n for k, n in enumerate(names) if bad[k, i0]]
        which = [m for m in (LOSS, GRAD) if m in which] + [m for m in which if m not in (LOSS, GRAD)]
        metric = which[0]
        vals = ", ".join(f"{n}={columns[n][i0]}" for n in which[:4]) + (
            f" (+{len(which) - 4} more)" if len(which) > 4 else ""
        )
        out.append(
            Finding(
                "nonfinite",
                metric,
                "critical",
                f"non-finite values from step {steps[i0]}: {vals}",
                (int(steps[i0]), int(steps[i1])),
                int(steps[i0]),
                None,
                {"metrics": which},
            )
        )
    return out


def throughput_drops(steps, tps, th: Thresholds, metric: str = THROUGHPUT) -> list[Finding]:
    """tokens/s below `throughput_drop` x its trailing median for `throughput_steps` logged steps in a row.

    The episode lasts until the median of the last `throughput_steps` values is back above halfway from that
    fraction to the trailing median from before it began (held, so a noisy slow spell is one episode). A
    machine shared with other jobs makes dips of a few seconds: one over within `throughput_sustain` logged
    steps is `info` (stored and drawn, never alerted), reported when it is over; one that lasts that long is
    a `warn`, raised at that step (then the trailing median has adapted and the detector starts afresh). A
    dip still going on at the last step, and shorter than that, waits for a later scan.
    """
    steps = np.asarray(steps)
    x = np.asarray(tps, dtype=float)
    flags, med = throughput_flags(x, th)
    k, need = th.throughput_steps, th.throughput_sustain
    (level,) = rolling(x, k, k, (0.5,))
    out: list[Finding] = []
    after = 0  # the row after the previous episode: a streak inside it is that episode
    for i0, _ in _streaks(steps, flags, k):
        if i0 < after:
            continue
        low, back_at = th.throughput_drop * med[i0], (1 + th.throughput_drop) / 2 * med[i0]
        horizon = min(i0 + need, x.size)
        with np.errstate(invalid="ignore"):
            back = np.flatnonzero(~(level[i0 + k - 1 : horizon] < back_at))
        sustained = not back.size and horizon == i0 + need
        if not back.size and not sustained:
            break  # still low, not yet for `need` steps, to the last step: a later scan tells
        end = i0 + k - 1 + int(back[0]) if back.size else horizon  # the row it was over, or sustained
        after = end
        with np.errstate(invalid="ignore"):
            i1 = i0 + int(np.flatnonzero(x[i0:end] < low)[-1])
        lvl = float(np.median(x[i0 : i1 + 1]))
        out.append(
            Finding(
                "throughput_drop",
                metric,
                "warn" if sustained else "info",
                f"throughput fell to {_fmt(lvl)} tokens/s ({100 * lvl / med[i0]:.0f}% of the trailing median "
                f"{_fmt(med[i0])}) "
                + (
                    f"for {need} logged steps from step {steps[i0]}, still low at step {steps[end - 1]}"
                    if sustained
                    else f"for {i1 - i0 + 1} logged steps from step {steps[i0]}; over within {need} logged "
                    "steps, as when the machine is busy with other jobs"
                ),
                (int(steps[i0]), int(steps[i1])),
                int(steps[end - 1] if sustained else steps[min(end, x.size - 1)]),
                lvl,
                {"baseline": float(med[i0])},
            )
        )
    return out


def throughput_flags(
    x: np.ndarray, th: Thresholds, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`throughput_drops`' rule, row by row: (below its fraction of the trailing median, that median); an
    episode needs `throughput_steps` such rows in a row. `starts` as in `spike_flags`."""
    med, _ = _trailing(x, th.window, th.min_history, starts)
    with np.errstate(invalid="ignore"):
        return _gt(th.throughput_drop * med, x) & np.isfinite(x), med


def stalled(
    last_step: int | None,
    last_t: float | None,
    ended: bool,
    th: Thresholds,
    now: float | None = None,
    phase: dict | None = None,
):
    """A run with no run_end whose writers have been silent for `stall_s`; longer (the phase's `budget_s`, else
    the setting `phase_budget_s`) when its newest event is a process entering init, compile, eval or checkpoint:
    a long first compile or a synchronous save is not a stall (`phase`: {phase, phase_t, budget_s})."""
    now = time.time() if now is None else now
    allowed = th.stall_s
    if phase and phase.get("phase") in PHASE_BUDGETED and phase.get("phase_t") == last_t:
        budget = phase.get("budget_s")
        allowed = max(allowed, budget if budget is not None else settings.get("phase_budget_s"))
    if ended or last_t is None or now - last_t < allowed:
        return []
    s = int(last_step or 0)
    return [
        Finding(
            "stalled_run",
            "events",
            "warn",
            f"no events for {(now - last_t) / 60:.1f} min after step {s} and no run_end: the run is stalled or crashed",
            (s, s),
            s,
            float(now - last_t),
            {"silent_s": round(now - last_t, 1)},
        )
    ]


FOLLOW_STEPS = 16  # a loss spike this close to a grad spike is its consequence


def unfollowed(grad: list[Finding], loss: list[Finding], last_step: int | None = None) -> list[Finding]:
    """Grad spikes, graded by what the loss did within FOLLOW_STEPS of them (`loss`: its spikes and dips).

    Followed by a loss spike or dip: as found (critical when large). Not followed, over several steps (a climb, as
    BLOOM's): a warning. Not followed, one step: info, the run absorbed it (a tiny run with clipping has
    one-step spikes of 10-90x that the clip takes and the loss never sees). The verdict on a one-step spike
    waits until the series reaches FOLLOW_STEPS past it (`last_step`, the last logged step; None: whole).
    """
    near = [f.step for f in loss]
    out = []
    for f in grad:
        if any(abs(s - f.step) <= FOLLOW_STEPS for s in near):
            out.append(f)
        elif f.window[0] < f.window[1]:
            out.append(replace(f, severity="warn", message=f"{f.message}; the loss did not follow"))
        elif last_step is None or last_step >= f.window[1] + FOLLOW_STEPS:
            out.append(replace(f, severity="info", message=f"{f.message}; one step, the loss did not follow"))
    return out


def finding_rows(found) -> list[dict[str, Any]]:
    """Findings as flat dicts (for --json and tables)."""
    rows = []
    for f in found:
        d = asdict(f)
        d["window"] = list(f.window)
        d.update(d.pop("extra"))
        rows.append(d)
    return rows
