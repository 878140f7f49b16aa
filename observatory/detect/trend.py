"""Slow changes: trends over thousands of steps, against the run's own earlier behaviour.

The series detectors (`observatory.detect.detectors`) look at a trailing window of ~128 logged steps: a loss
that climbs 0.25 nats over 4,000 steps, a drop fraction that creeps from 3% to 12%, or a host that runs at
70% from mid-run never stands out there. These detectors read a run's whole history, coarsely: the mean of
each metric over buckets of 64 steps (the store's `metrics_r64` rollup; `bucket_means` for arrays), and the
eval loss at each eval. At each point:

- the level is the rolling median over a window of 1/8 of the steps so far (at least `anomaly_trend_steps`,
  at most 16x that; a power of two of points, so that the rule at a point depends on the points up to it
  only: a live run's scan finds what a scan of the finished run finds);
- the change is the level against its best earlier level (the lowest loss, grad norm or drop fraction, the
  highest tokens/s or MFU since the end of warmup; the highest router entropy since its level settled: a
  router specialises early in training, its entropy falling fast, then levels off), or against an absolute
  limit;
- a finding needs the change past its threshold for half a window in a row. It is a warn, raised where that
  happens; a second, critical finding follows where the change reaches 3x its threshold (the square of a
  ratio) after 3 windows (never for throughput: a slow machine is no emergency of the model). A throughput
  loss's episode lasts until its level is back half-way (`throughput_loss`): the live `mfu_drop` alert rule
  calls the same function, so a running run is alerted on what `detect` finds of it once it has finished.

The learning-rate schedule: the points before the end of warmup (`opt/lr` still climbing to its peak) are
not compared (the loss and grad norm move fast there); a loss that stops falling in a decay does not rise
above its best level, and so is no finding; while the LR is decayed below half its peak the grad norm's
ratio threshold is raised by sqrt(peak / lr), at most 1.5x (a grad norm that grows as the LR decays is usual).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from types import MappingProxyType

import duckdb
import numpy as np

from observatory.detect.detectors import DROP, GRAD, LOSS, THROUGHPUT, Finding
from observatory.detect.rolling import rolling
from observatory.detect.thresholds import Thresholds

__all__ = [
    "EVAL",
    "ENTROPY",
    "LR",
    "MFU",
    "TREND_METRICS",
    "TREND_RES",
    "bucket_means",
    "trends",
    "throughput_loss",
    "min_span",
    "crash_loops",
]

EVAL = "eval/loss"  # the eval events' loss, the datasets' mean at a step
ENTROPY = "router/entropy"
LR = "opt/lr"
MFU = "throughput/mfu"
TREND_METRICS = (LOSS, GRAD, DROP, ENTROPY, THROUGHPUT, MFU, LR)  # read from the rollup (EVAL from events)
TREND_RES = 64  # steps per point: the `metrics_r64` rollup
CRITICAL_AFTER = 3  # windows a change must last, at 3x its threshold, to be critical


def bucket_means(steps, values, res: int = TREND_RES) -> tuple[np.ndarray, np.ndarray]:
    """(last step, mean of finite values) of each `res`-step bucket (step // res) of a series, as the rollup
    `metrics_r64` gives them; the last bucket, which may still fill, is left out."""
    steps = np.asarray(steps, np.int64)
    x = np.asarray(values, float)
    ok = np.isfinite(x)
    steps, x = steps[ok], x[ok]
    if not steps.size:
        return np.empty(0, np.int64), np.empty(0)
    b = steps // res
    keys, first = np.unique(b, return_index=True)
    sums = np.add.reduceat(x, first)
    counts = np.diff(np.append(first, x.size))
    last = steps[np.append(first[1:], x.size) - 1]
    keep = keys < steps[-1] // res
    return last[keep], (sums / counts)[keep]


def _spacing(steps: np.ndarray) -> float:
    """Steps between a series' points: the median of its first 8 gaps (a later change of the eval interval
    does not move the windows of points already scanned)."""
    return float(np.median(np.diff(steps[:9]))) if steps.size > 1 else float(TREND_RES)


def _windows(steps: np.ndarray, th: Thresholds) -> np.ndarray:
    """Points in each point's window: 1/8 of its step, within [trend_steps, 16 trend_steps], over the series'
    spacing (`_spacing`), rounded to a power of two (>= 2)."""
    spacing = _spacing(steps)
    w = np.clip(steps / 8.0, th.trend_steps, 16 * th.trend_steps) / max(spacing, 1.0)
    return (2 ** np.round(np.log2(np.maximum(w, 2.0)))).astype(np.int64)


def _level(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Each point's rolling median over its own window (`_windows`)."""
    out = np.full(x.size, np.nan)
    for size in np.unique(w).tolist():
        (med,) = rolling(x, int(size), max(1, int(size) // 2), (0.5,))
        at = w == size
        out[at] = med[at]
    return out


def warmup_end(lr: tuple[np.ndarray, np.ndarray] | None, steps: np.ndarray, th: Thresholds) -> int:
    """The step from which a series is compared: the first point where `opt/lr` is within 5% of its peak so far
    and no longer climbing (no LR: after the first `trend_steps` steps)."""
    if lr is None or len(lr[0]) < 2:
        return int(th.trend_steps)
    ls, lv = lr
    peak = np.fmax.accumulate(np.where(np.isfinite(lv), lv, -np.inf))
    climbing = np.append(lv[1:] > lv[:-1] * 1.001, True)
    at = np.flatnonzero((lv >= 0.95 * peak) & ~climbing)
    return int(ls[at[0]]) if at.size else int(ls[-1]) + 1


def _lr_at(lr: tuple[np.ndarray, np.ndarray] | None, steps: np.ndarray) -> np.ndarray | None:
    """(peak so far / LR) at each of `steps` (the nearest earlier LR point); None without an LR."""
    if lr is None or not len(lr[0]):
        return None
    ls, lv = lr
    peak = np.fmax.accumulate(np.where(np.isfinite(lv) & (lv > 0), lv, -np.inf))
    i = np.clip(np.searchsorted(ls, steps, side="right") - 1, 0, len(ls) - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = peak[i] / lv[i]
    return np.where(np.isfinite(r) & (r > 0), r, 1.0)


def _fmt(v: float) -> str:
    return f"{v:.4g}"


def _episodes(flag: np.ndarray, need: np.ndarray) -> list[tuple[int, int]]:
    """(first point of a streak of flagged points, the point where the streak has lasted `need` points)."""
    out = []
    start, said = -1, False
    for i in np.flatnonzero(flag).tolist():
        if i == 0 or not flag[i - 1]:
            start, said = i, False
        if not said and i - start + 1 >= int(need[i]):
            out.append((start, i))
            said = True
    return out


class _Trend:
    """One rule's arrays over a series' points: the level, its best earlier level, the change, the threshold."""

    def __init__(self, steps, x, th: Thresholds, kind: str, thr, since_step: int, settle: bool = False):
        n = x.size
        self.steps, self.kind = steps, kind
        self.w = _windows(steps, th)
        self.span = self.w * _spacing(steps)
        lvl = _level(x, self.w)
        lvl[steps < since_step] = np.nan
        self.thr = thr = np.broadcast_to(np.asarray(thr, float), (n,))
        if settle:  # compared from the first point whose level moved less than thr / 4 over its window
            back = np.maximum(np.arange(n) - self.w, 0)
            with np.errstate(invalid="ignore"):
                still = np.flatnonzero(np.abs(lvl - lvl[back]) <= thr / 4)
            lvl[: still[0] if still.size else n] = np.nan
        ok = np.isfinite(lvl)
        if kind in ("above", "below"):
            ref = thr
            change = lvl - thr if kind == "above" else thr - lvl
            flag = ok & (change > 0)
            calm = ~flag
        else:
            low = kind in ("rise", "grow")
            filled = np.where(ok, lvl, np.inf if low else -np.inf)
            ref = np.minimum.accumulate(filled) if low else np.maximum.accumulate(filled)
            with np.errstate(divide="ignore", invalid="ignore"):
                if kind in ("rise", "fall"):
                    change = lvl - ref if kind == "rise" else ref - lvl
                    calm = change <= thr / 4
                elif kind == "grow":
                    change = lvl / np.maximum(ref, 1e-12)
                    calm = change <= thr**0.25
                else:  # shrink: the fraction of the best level it is down to
                    change = lvl / ref
                    calm = change >= 1 - (1 - thr) / 4
            flag = ok & np.isfinite(ref) & ((change <= thr) if kind == "shrink" else (change >= thr))
        self.lvl, self.ref, self.change, self.flag = lvl, ref, change, flag
        # the last point, at or before each, where the change was within a quarter of the threshold: its start
        self.calm_at = np.maximum.accumulate(np.where(ok & calm, np.arange(n), 0))

    def finding(self, i0: int, i: int, severity: str, detector: str, metric: str, what: str, hint: str):
        steps, kind = self.steps, self.kind
        since = int(steps[self.calm_at[i0]]) if kind not in ("above", "below") else int(steps[i0])
        now, was = float(self.lvl[i]), float(self.ref[i])
        size = {
            "rise": f"rose {_fmt(now - was)} ({_fmt(was)} → {_fmt(now)})",
            "fall": f"fell {_fmt(was - now)} ({_fmt(was)} → {_fmt(now)})",
            "grow": f"grew {now / was:.2g}x ({_fmt(was)} → {_fmt(now)})",
            "shrink": f"is {100 * (1 - now / was):.0f}% below its earlier level ({_fmt(was)} → {_fmt(now)})",
            "above": f"is {_fmt(now)}, above its limit {_fmt(was)}",
            "below": f"is {_fmt(now)}, below its floor {_fmt(was)}",
        }[kind]
        first = int(steps[i0])
        msg = (
            f"{what or metric} {size} since step {since}: past its threshold from step {first}, for"
            f" {int(steps[i]) - first} steps (level: the median of the last {int(self.span[i])} steps)"
        )
        if hint:
            msg += f"; {hint}"
        return Finding(
            detector,
            metric,
            severity,
            msg,
            (since if severity == "warn" else int(steps[i]), int(steps[i])),
            int(steps[i]),
            now,
            {
                "since_step": since,
                "first_step": first,
                "baseline": was,
                "change": float(self.change[i]),
                "threshold": float(self.thr[i]),
                "trend": True,
            },
        )


def _rule(
    steps: np.ndarray,
    x: np.ndarray,
    th: Thresholds,
    *,
    detector: str,
    metric: str,
    kind: str,  # rise | grow | fall | shrink | above | below
    thr: float | np.ndarray,
    since_step: int,
    critical: bool = True,
    what: str = "",
    hint: str = "",
    settle: bool = False,
) -> list[Finding]:
    """One trend rule over a series of points (see the module's doc); `thr` a number or one per point. A
    change must last half a window to warn; critical at 3x the threshold (its square for a ratio) after
    `CRITICAL_AFTER` windows."""
    if x.size < 4:
        return []
    t = _Trend(steps, x, th, kind, thr, since_step, settle)
    out: list[Finding] = []
    for i0, i in _episodes(t.flag, np.maximum(t.w // 2, 2)):
        out.append(t.finding(i0, i, "warn", detector, metric, what, hint))
        if not critical or kind == "shrink":
            continue
        big = t.thr * 3 if kind in ("rise", "fall") else t.thr**2
        end = i0 + int(np.argmin(t.flag[i0:])) if not t.flag[i0:].all() else x.size
        late = np.arange(i0, end)
        late = late[(late - i0 + 1 >= CRITICAL_AFTER * t.w[late]) & (t.change[late] >= big[late])]
        if late.size:
            out.append(t.finding(i0, int(late[0]), "critical", detector, metric, what, hint))
    return out


def _held(flag: np.ndarray, need: np.ndarray, clear: np.ndarray) -> list[tuple[int, int, int | None]]:
    """Episodes with hysteresis: (first point of a streak of flagged points, the point where it has lasted
    `need` points: opened, the first point after that which is `clear`: closed, or None while it lasts). A
    level hovering at the threshold is one episode."""
    out: list[tuple[int, int, int | None]] = []
    start, opened = -1, -1
    for i in range(flag.size):
        if opened >= 0:
            if clear[i]:
                out.append((start, opened, i))
                start, opened = -1, -1
        elif not flag[i]:
            start = -1
        else:
            start = i if start < 0 else start
            if i - start + 1 >= int(need[i]):
                opened = i
    if opened >= 0:
        out.append((start, opened, None))
    return out


def throughput_loss(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]], th: Thresholds, hint: str = ""
) -> list[tuple[Finding, int | None]]:
    """A sustained throughput loss, one definition for the `throughput_loss` detector (a finished or a live
    run's scan) and the live `mfu_drop` alert rule: the smoothed tokens/s (MFU when the run logs no tokens/s)
    at or below `throughput_loss` (0.8) x its highest level after the first `trend_steps` steps, for half a
    window in a row (`_rule`'s window). Its episode lasts until the level is back half-way, at (1 +
    `throughput_loss`) / 2 (0.9) of that best level: a busy machine's throughput hovering at 80% is one
    episode. Each episode's warn finding (raised where it opens; `hint` ends its message) with the step it
    closed at, or None while it lasts."""
    metric = THROUGHPUT if THROUGHPUT in series else MFU
    if (s := series.get(metric)) is None or len(s[0]) < 4:
        return []
    st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
    thr = th.throughput_loss
    t = _Trend(st, x, th, "shrink", thr, int(th.trend_steps))
    with np.errstate(invalid="ignore"):
        clear = np.isfinite(t.lvl) & (t.change >= (1 + thr) / 2)
    return [
        (
            t.finding(i0, i, "warn", "throughput_loss", metric, metric, hint),
            None if end is None else int(st[end]),
        )
        for i0, i, end in _held(t.flag, np.maximum(t.w // 2, 2), clear)
    ]


def min_span(ths) -> int:
    """The fewest steps a series must span for the trend detectors to read it: 4 windows of the smallest
    `trend_steps` of `ths` (Thresholds)."""
    return 4 * min(t.trend_steps for t in ths)


def _noise(x: np.ndarray) -> np.ndarray:
    """Each point's robust sigma of its noise, from the second differences of the 64 points up to it (IQR /
    1.349 / sqrt 6): a trend (the loss falling fast early on) hardly moves them; 0 before 8 of them."""
    d2 = np.concatenate([[np.nan, np.nan], np.diff(x, 2)]) if x.size > 2 else np.full(x.size, np.nan)
    q25, q75 = rolling(d2, 64, 8, (0.25, 0.75))
    return np.nan_to_num((q75 - q25) / (1.349 * math.sqrt(6)))


def _before(a: np.ndarray, steps: np.ndarray, th: Thresholds) -> np.ndarray:
    """`a` at each point a window earlier (`_windows`): the noise from before a change, not of it."""
    return a[np.maximum(np.arange(a.size) - _windows(steps, th), 0)] if a.size else a


def trends(
    series: Mapping[str, tuple[np.ndarray, np.ndarray]],
    th: Thresholds,
    baseline: tuple[str, Mapping[str, float]] | None = None,
) -> list[Finding]:
    """Every trend detector over one run's points: metric -> (steps, values), `bucket_means` of the train
    metrics (`TREND_METRICS`) and the eval loss (`EVAL`) at each eval, whichever the run has. `baseline`:
    (the run its config names as its baseline, that run's median of each throughput metric)."""
    lr = series.get(LR)
    out: list[Finding] = []
    for metric in (LOSS, EVAL):
        if (s := series.get(metric)) is None:
            continue
        st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
        start = warmup_end(lr, st, th)
        out += _rule(
            st,
            x,
            th,
            detector="loss_trend",
            metric=metric,
            kind="rise",
            thr=np.maximum(th.trend_loss_rise, 4 * _before(_noise(x), st, th)),
            since_step=start,
            hint=f"a rules-file rule `{{metric: {metric}, rise: {th.trend_loss_rise:g}}}` alerts on such a climb live",
        )
    if (s := series.get(GRAD)) is not None:
        st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
        decay = _lr_at(lr, st)
        thr = th.trend_ratio * (np.ones(st.size) if decay is None else np.clip(np.sqrt(decay), 1.0, 1.5))
        if decay is not None:
            thr = np.where(decay > 2.0, thr, th.trend_ratio)
        out += _rule(
            st,
            x,
            th,
            detector="grad_trend",
            metric=GRAD,
            kind="grow",
            thr=thr,
            since_step=warmup_end(lr, st, th),
            what="the grad norm",
            hint="`grad_growth` sees a growth within its window only",
        )
    if (s := series.get(DROP)) is not None:
        st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
        start = warmup_end(lr, st, th)
        # from a near-zero level a ratio means nothing: at least 1 point of drop fraction
        out += _rule(
            st,
            np.maximum(x, 0.01),
            th,
            detector="drop_trend",
            metric=DROP,
            kind="grow",
            thr=th.trend_ratio,
            since_step=start,
            what="the drop fraction",
            hint=f"a limit of {th.drop_max:g} (`anomaly_drop_max`) fires when it is crossed",
        )
        out += _rule(
            st,
            x,
            th,
            detector="drop_limit",
            metric=DROP,
            kind="above",
            thr=th.drop_max,
            since_step=max(start, 2 * th.trend_steps),  # an untrained router drops more at first
            critical=False,
            what="the drop fraction",
        )
    if (s := series.get(ENTROPY)) is not None:
        st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
        out += _rule(
            st,
            x,
            th,
            detector="entropy_trend",
            metric=ENTROPY,
            kind="fall",
            thr=th.entropy_fall,
            since_step=warmup_end(lr, st, th),
            settle=True,
            what="router entropy",
            hint="a floor (`anomaly_entropy_floor`, per project in the rules file) fires when it is crossed",
        )
        if th.entropy_floor > 0:
            out += _rule(
                st,
                x,
                th,
                detector="entropy_floor",
                metric=ENTROPY,
                kind="below",
                thr=th.entropy_floor,
                since_step=max(warmup_end(lr, st, th), 2 * th.trend_steps),
                critical=False,
                what="router entropy",
            )
    live = f"live, the `mfu_drop` alert rule raises it too, and resolves it at {(1 + th.throughput_loss) / 2:g} of the best level"
    out += [f for f, _ in throughput_loss(series, th, live)]
    metric = THROUGHPUT if THROUGHPUT in series else MFU  # MFU is tokens/s times a constant
    if (s := series.get(metric)) is not None and baseline is not None and metric in baseline[1]:
        st, x = np.asarray(s[0], np.int64), np.asarray(s[1], float)
        level = baseline[1][metric]
        out += _rule(
            st,
            x,
            th,
            detector="throughput_baseline",
            metric=metric,
            kind="below",
            thr=th.throughput_loss * level,
            since_step=int(th.trend_steps),
            critical=False,
            what=metric,
            hint=f"{th.throughput_loss:g} x the median {_fmt(level)} of its baseline run {baseline[0]}",
        )
    return out


def crash_loops(failures: list[dict], th: Thresholds) -> list[Finding]:
    """One critical finding per streak of consecutive failures of one run (`failures`: its `failure` events,
    in time order: step, host, type, message, action) that end an attempt, with the same error (type and exception class) at steps at most
    `crash_steps` apart: the run is restarted into the same crash."""
    out: list[Finding] = []
    streak: list[dict] = []
    # the failures that end an attempt (not a rollback's), of one host: each host of a job says the same
    ended = [f for f in failures if f.get("action") not in ("rollback", "skip_batch", "skip")]
    hosts = [f.get("host") for f in ended if f.get("host") is not None]
    if hosts:
        ended = [f for f in ended if f.get("host") == min(hosts)]

    def same(a: dict, b: dict) -> bool:
        return (
            _error(a) == _error(b)
            and a.get("step") is not None
            and b.get("step") is not None
            and abs(int(a["step"]) - int(b["step"])) <= th.crash_steps
        )

    def close() -> None:
        if len(streak) >= 2:
            f0, fl = streak[0], streak[-1]
            err = _error(fl)
            out.append(
                Finding(
                    "crash_loop",
                    "",
                    "critical",
                    f"crash loop: {len(streak)} attempts failed at step {int(fl['step'])} with {err}",
                    (int(f0["step"]), int(fl["step"])),
                    int(fl["step"]),
                    float(len(streak)),
                    {"attempts": len(streak), "error": err},
                )
            )

    for f in ended:
        if streak and not same(streak[-1], f):
            close()
            streak = []
        streak.append(f)
    close()
    return out


def _error(f: dict) -> str:
    """A failure's error: the exception's class when the message starts with one (`Name: text`), else its
    type."""
    msg = str(f.get("message") or "")
    head = msg.split(":", 1)[0].strip()
    if head and head.isidentifier() and ":" in msg:
        return head[:80]
    return str(f.get("type") or "failure")[:80]


class SlowReads:
    """What a scan's slow-change detectors read of its runs, set-wise (`read`): the long runs' points, every
    run's failures, their baseline runs' throughput; `findings(run, th)` runs the detectors over one run's
    (numpy only). `due`: the runs whose points were read (their scan state's `trends` moves on)."""

    def __init__(self, points: Mapping, failures: Mapping, baselines: Mapping | None = None, due=()):
        self.points, self.failures = points, failures
        self.baselines, self.due = baselines or MappingProxyType({}), frozenset(due)

    @classmethod
    def read(
        cls, con, runs: list[str], th: Thresholds, per_run: Mapping[str, Thresholds], reads=()
    ) -> SlowReads:
        """The reads of a scan of `runs`; each of `reads` (the scan's `_RunScan`s) gets them as its `slow`. A
        run's points are read when its scan reaches a 64-step bucket (`TREND_RES`) the last read of them did
        not (its state's `trends`; whole buckets only: nothing new without one), or with no `reads`."""
        from observatory.queries.trends import baseline_levels, failures_of, trend_points

        due = list(runs) if not reads else [r.run for r in reads if _due(r.rows.last_step(r.i), r.was)]
        span = min_span([th, *per_run.values()])
        try:
            points = trend_points(con, due, list(TREND_METRICS), EVAL, span)
            out = cls(
                points, failures_of(con, runs), baseline_levels(con, list(points), [THROUGHPUT, MFU]), due
            )
        except duckdb.Error as e:  # the other detectors go on without them
            print(
                f"observatory anomalies: slow-change reads failed: {type(e).__name__}: {e}", file=sys.stderr
            )
            out = cls({}, {})
        for r in reads:
            r.slow = out
        return out

    def findings(self, run: str, th: Thresholds) -> list[Finding]:
        out = trends(self.points[run], th, self.baselines.get(run)) if run in self.points else []
        if run in self.failures:
            out += crash_loops(self.failures[run], th)
        return out


def _due(last: int | None, was: Mapping[str, int]) -> bool:
    """Whether a run's trends are due (`SlowReads.read`): `last` the last step of its scan, `was` its state."""
    t = was.get("trends")
    return t is None or (last is not None and last // TREND_RES != t // TREND_RES)
