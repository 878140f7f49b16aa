"""Instability early warning: the detectors run over the store as events are ingested.

Each finding becomes an `anomaly` event (EVENTS.md) written by the observatory
itself as host 1000 into the run's folder (`observatory.findings`); the next ingest
pass stores it. So what the observatory said, and when, is as the run itself. The
detectors (pure functions over numpy series) live in `observatory.detect.detectors`,
their thresholds (the `anomaly_*` settings) in `observatory.detect.thresholds`.

    after_ingest(db, runs_dir, runs, progress=p)   # the ingester's analysis, after each committed batch
    detect(db, runs_dir, runs=None)    # `observatory detect`: new findings, written

Incremental and idempotent: a flag at a step depends only on a bounded trailing
window, so `scan_run` re-reads `Thresholds.lookback` logged steps before the last
step it scanned (the hot / dead expert detectors: `2 * expert_steps + 2` logged
expert steps, `observatory.detect.expert_scan`). Where each scan stopped is kept per
run and detector group in the store's `detector_state` (and in the ingester's `Progress`, and as
`scanned_through` in every finding written), so a new process also reads only what
is new. It ignores episodes that began before its windows were whole (an earlier
scan saw their start: `detect_frame(truncated=True)`) and dedupes by (detector,
metric, window start) against anomaly events in the store and in events.1000.jsonl.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
import numpy as np

if TYPE_CHECKING:  # annotations only: polars loads lazily (start-up time of `observatory ingest`)
    import polars as pl

from observatory import findings
from observatory.detect import screen
from observatory.detect.detectors import (
    DROP,
    GRAD,
    LOSS,
    SPIKE_GAP,
    THROUGHPUT,
    UPDATE,
    Finding,
    dead_experts,
    drop_jumps,
    finding_rows,
    grad_growth,
    grad_spikes,
    hot_experts,
    incomplete_recovery,
    loss_dips,
    loss_spikes,
    nonfinite,
    stalled,
    throughput_drops,
    unfollowed,
    update_spikes,
)
from observatory.detect.expert_scan import expert_findings
from observatory.detect.screen import SHORT
from observatory.detect.thresholds import Thresholds, widest
from observatory.detect.trend import SlowReads
from observatory.events import OBSERVATORY_HOST
from observatory.queries.anomalies import (
    SeriesRows,
    anomaly_events,
    anomaly_events_many,
    cut_steps,
    detector_states,
    expert_layer_stats_many,
    metric_arrays_many,
    nonfinite_arrays_many,
    register_wanted,
    run_activity,
    run_ids,
    silent_runs,
    stored_last_steps,
    unregister_wanted,
)
from observatory.store import StoreBusy, using, write_connection

__all__ = [
    "SERIES",
    "Progress",
    "save_state",
    "unsaved_state",
    "detect_frame",
    "detect_series",
    "after_ingest",
    "FreshFrom",
    "Scan",
    "detect",
    "scan_run",
    "write_findings",
    "existing_findings",
    "finding_rows",
]

SERIES = (LOSS, GRAD, UPDATE, DROP, THROUGHPUT)  # the metrics the series detectors read


# -------------------------------------------------------------- one run, all


def _keep(found: list[Finding], sub_steps: np.ndarray, dep: int, truncated: bool) -> list[Finding]:
    """Drop episodes that began before this frame's trailing windows were whole (an earlier scan had them)."""
    if not truncated:
        return found
    if len(sub_steps) <= dep:
        return []
    limit = int(sub_steps[dep])
    return [f for f in found if f.window[0] > limit]


def _series(frame: pl.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """(steps, values) of one metric at the steps where it was logged; None if never."""
    import polars as pl  # lazy for start-up time: ingest's scan (`scan_run`) reads numpy arrays, not frames

    if name not in frame.columns:
        return None
    sub = frame.select("step", pl.col(name).cast(pl.Float64)).filter(pl.col(name).is_not_null())
    if sub.height == 0:
        return None
    return sub["step"].to_numpy(), sub[name].to_numpy()


def detect_frame(
    frame: pl.DataFrame,
    load: pl.DataFrame | None,
    th: Thresholds,
    truncated: bool = False,
    bad: pl.DataFrame | None = None,
    load_drop: tuple[np.ndarray, np.ndarray, bool] | None = None,
) -> list[Finding]:
    """Every series detector over one run's frames (`detect_series` over their arrays).

    frame: wide metrics (`step` + one column per metric, null where not logged);
    load: long expert load (step, layer, expert, routed, dropped) or None; the hot and
    dead expert detectors run on it (the store's scan uses `expert_findings` instead);
    bad: long (step, name, value) of every non-finite metric value; None: look for
    them in `frame` (then only its columns are checked).
    truncated: the frame starts after the run's first step (incremental scan).
    load_drop: (steps, dropped / routed, truncated): the drop fraction from expert load,
    used when `frame` has no drop fraction metric (else it comes from `load`).
    """
    import polars as pl  # lazy for start-up time: ingest's scan (`scan_run`) reads numpy arrays, not frames

    series = {name: s for name in SERIES if (s := _series(frame, name)) is not None}
    steps = frame["step"].to_numpy() if frame.height else np.empty(0, np.int64)
    out: list[Finding] = []
    no_load_drop = load_drop is None or not len(load_drop[0])
    if DROP not in series and no_load_drop and load is not None and load.height:
        per = load.group_by("step").agg(pl.col("dropped").sum(), pl.col("routed").sum()).sort("step")
        per = per.filter(pl.col("routed") > 0)
        if per.height:
            load_drop = (per["step"].to_numpy(), (per["dropped"] / per["routed"]).to_numpy(), truncated)
    if bad is None:
        metric_cols = [c for c in frame.columns if c != "step"]
        if metric_cols and frame.height:
            cols = {c: frame[c].cast(pl.Float64).fill_null(0.0).to_numpy() for c in metric_cols}
            out += _keep(nonfinite(steps, cols), steps, 0, truncated)
        bad_arrays = None
    else:
        bad_arrays = {c: bad[c].to_numpy() for c in ("step", "name", "value")} if bad.height else None
    out += detect_series(series, steps, th, truncated, bad_arrays, load_drop)
    if load is not None and load.height:
        for (layer,), part in load.sort("step", "expert").group_by("layer", maintain_order=True):
            wide = part.pivot(on="expert", index="step", values="routed").sort("step").fill_null(0)
            wide_steps = wide["step"].to_numpy()
            routed = wide.drop("step").to_numpy()  # (T, E)
            out += _keep(hot_experts(wide_steps, int(layer), routed, th), wide_steps, 0, truncated)
            out += _keep(dead_experts(wide_steps, int(layer), routed, th), wide_steps, 0, truncated)
    return sorted(out, key=lambda f: (f.step, f.detector, f.metric))


def detect_series(
    series: dict[str, tuple[np.ndarray, np.ndarray]],
    steps: np.ndarray,
    th: Thresholds,
    truncated: bool = False,
    bad: dict[str, np.ndarray] | None = None,
    load_drop: tuple[np.ndarray, np.ndarray, bool] | None = None,
) -> list[Finding]:
    """Every series detector over numpy arrays, unsorted.

    series: metric name -> (steps, values) where it was logged (`queries.anomalies.metric_arrays`);
    steps: every logged step of the frame, sorted; bad: step, name, value (sorted by step) of every
    non-finite value, or None when there are none; load_drop as in `detect_frame`.
    """
    out: list[Finding] = []
    spike_dep = th.window + SPIKE_GAP
    spikes: list[Finding] = []
    dips: list[Finding] = []
    if (s := series.get(LOSS)) is not None:
        st, x = s
        memo: dict = {}  # the loss's level and noise, computed once for its spikes and dips
        spikes = loss_spikes(st, x, th, memo=memo)
        out += _keep(spikes, st, spike_dep, truncated)
        out += _keep(incomplete_recovery(st, x, spikes, th), st, spike_dep, truncated)
        dips = loss_dips(st, x, th, memo=memo)
        out += _keep(dips, st, spike_dep, truncated)
    if (s := series.get(GRAD)) is not None:
        st, g = s
        graded = unfollowed(grad_spikes(st, g, th), spikes + dips, int(st[-1]))
        out += _keep(graded, st, spike_dep, truncated)
        out += _keep(grad_growth(st, g, th), st, 2 * th.window + th.growth_steps + 1, truncated)
    if (s := series.get(UPDATE)) is not None:
        out += _keep(update_spikes(s[0], s[1], th), s[0], spike_dep, truncated)
    drop, drop_truncated = series.get(DROP), truncated
    if drop is None and load_drop is not None and len(load_drop[0]):
        drop, drop_truncated = (load_drop[0], load_drop[1]), load_drop[2]
    if drop is not None:
        out += _keep(drop_jumps(drop[0], drop[1], th), drop[0], spike_dep, drop_truncated)
    if (s := series.get(THROUGHPUT)) is not None:
        out += _keep(throughput_drops(s[0], s[1], th), s[0], th.window + th.throughput_sustain, truncated)
    if bad is not None and len(bad["step"]):
        # the logged steps (for which non-finite steps are consecutive), 0 where a value was fine
        all_steps = np.union1d(steps, bad["step"]).astype(np.int64)
        names, first = np.unique(bad["name"], return_index=True)
        cols = {}
        for name in names[np.argsort(first, kind="stable")]:  # in order of first appearance
            at = bad["name"] == name
            col = np.zeros(all_steps.size)
            col[np.searchsorted(all_steps, bad["step"][at])] = bad["value"][at]
            cols[str(name)] = col
        out += _keep(nonfinite(all_steps, cols), all_steps, 0, truncated)
    return out


# ------------------------------------------------------------ over the store


def _key_of(d: dict) -> tuple[str, str, int] | None:
    w = d.get("window")
    if not isinstance(w, list) or not w or not isinstance(d.get("detector"), str):
        return None
    try:
        return (d["detector"], d.get("metric") or "", int(w[0]))
    except (TypeError, ValueError):
        return None


def existing_findings(con, runs_dir: Path, run: str) -> tuple[set[tuple[str, str, int]], int | None]:
    """Keys of findings already made for a run (store and host-1000 file) and the furthest step scanned."""
    return _finding_keys(anomaly_events(con, run), findings.pending(runs_dir, run, "anomaly"))


def _finding_keys(stored: list[dict], pending: list[dict]) -> tuple[set[tuple[str, str, int]], int | None]:
    """`existing_findings` from the run's stored anomaly events (`anomaly_events`) and those in its host-1000
    file (`findings.pending`)."""
    seen = stored + [{**ev["data"], "host": ev.get("host")} for ev in pending]
    keys = {k for d in seen if (k := _key_of(d)) is not None}
    scanned = [
        int(d["scanned_through"])
        for d in seen
        if d.get("host") == OBSERVATORY_HOST and isinstance(d.get("scanned_through"), int)
    ]
    return keys, (max(scanned) if scanned else None)


SCREEN_FROM = 2  # runs in a scan from which their series are screened (`screen.loud`) first


# (read connection, runs, the settings' thresholds, problems already said) -> {run: its own thresholds}
ThresholdsOf = Callable[
    [duckdb.DuckDBPyConnection, list[str], Thresholds, set[tuple[str, str]]], dict[str, Thresholds]
]


class Progress:
    """The detectors' progress in one ingester (`pipeline.Ingester` owns one); a one-off `detect`: a new one."""

    def __init__(self, thresholds_of: ThresholdsOf | None = None) -> None:
        # the runs with thresholds of their own (`alerts.rules.thresholds_of`, from the rules file and their
        # config); None: every run on the settings' (detect sits below alerts: the caller hands it in)
        self.thresholds_of = thresholds_of
        # (runs dir, run) -> {"series": last metrics step scanned, "experts": last expert_load step scanned}
        self.state: dict[tuple[str, str], dict[str, int]] = {}
        # store file -> {(run, detector group): through}: reached on a read-only connection (the ingester's
        # analyses read beside the dashboard's readers), written by that store's next write transaction
        self.unsaved: dict[str, dict[tuple[str, str], int]] = {}
        self.said: set[tuple[str, str]] = set()  # (run, problem) with its thresholds already said
        self.last_stall_check = 0.0  # set when a scan that looked for silent runs is written


def _through(
    kept: dict[str, int], state_key: tuple[str, str], stored_through: int | None, progress: Progress
) -> dict[str, int]:
    """Where the last scan of a run stopped, per detector group: this ingester's, else the store's (`kept`,
    its `detector_state`, and the furthest `scanned_through` of its findings)."""
    mine = progress.state.get(state_key)
    if mine is not None:
        return dict(mine)
    kept = dict(kept)
    if stored_through is not None:
        kept["series"] = max(kept.get("series", stored_through), stored_through)
    return kept


class _RunScan:
    """One run's scan, in two halves: what it reads from the store (`_read_run`: every query, and the hot
    and dead expert detectors, whose drill-down reads as it goes) and the series detectors over those
    arrays (`finish`: numpy only, no store, so it may run while the ingest transaction that the reads
    were made in commits)."""

    slow: SlowReads | None = None  # the slow-change detectors' reads of its scan (`SlowReads.read`)

    def __init__(
        self, run, state_key, keys, was, through, since, rows, i, bad, since_x, experts, drop, last_x
    ):
        self.run, self.state_key, self.keys, self.was = run, state_key, keys, was
        self.through, self.since, self.bad = through, since, bad
        self.rows, self.i = rows, i  # its metric rows: `rows.of(i)`, made when the detectors need them
        self.since_x, self.experts, self.drop, self.last_x = since_x, experts, drop, last_x

    def arrays(self) -> tuple[np.ndarray, dict[str, tuple[np.ndarray, np.ndarray]]]:
        """(every step it has a row at; {metric: (steps, values)}): what `detect_series` reads."""
        return self.rows.of(self.i)

    def screenable(self, longest: np.ndarray) -> bool:
        """Whether the screen (`screen.loud`) may decide that this run's series detectors find nothing: short
        series (`longest`: `rows.longest()`), no non-finite value and no drop fraction from expert_load
        (whose detectors it does not run)."""
        return (
            (self.bad is None or not len(self.bad["step"]))
            and not len(self.drop[0])
            and int(longest[self.i]) <= SHORT
        )

    def finish(
        self, th: Thresholds, activity: dict | None, now: float | None, quiet: bool = False
    ) -> tuple[list[Finding], int | None, dict]:
        """(new findings, deduped; the last step scanned; the state the scan reached, the slow-change
        detectors' (`self.slow`) included). quiet: the screen (`screen.loud`) found no row any series
        detector would flag: they are not run."""
        steps, series = (None, None) if quiet else self.arrays()
        found = (
            []
            if quiet
            else detect_series(
                series,
                steps,
                th,
                truncated=self.since is not None,
                bad=self.bad,
                load_drop=(self.drop[0], self.drop[1], self.since_x is not None),
            )
        )
        found = sorted(
            found + self.experts + (self.slow.findings(self.run, th) if self.slow else []),
            key=lambda f: (f.step, f.detector, f.metric),
        )
        if activity is not None:
            found += stalled(activity["last_step"], activity["last_t"], activity["ended"], th, now, activity)
        new, fresh = [], set()
        for f in found:
            if f.key not in self.keys and f.key not in fresh:
                fresh.add(f.key)
                new.append(replace(f, run=self.run))
        through, through_x = self.through, self.was.get("experts")
        last_step = self.rows.last_step(self.i) if quiet else (int(steps[-1]) if len(steps) else None)
        last = through if last_step is None else last_step
        now_state = dict(self.was)
        if last is not None:
            now_state["series"] = max(last, through if through is not None else last)
        if self.last_x is not None:
            now_state["experts"] = max(self.last_x, through_x if through_x is not None else self.last_x)
        if self.slow and self.run in self.slow.due and last is not None:
            now_state["trends"] = last
        return new, last, now_state


@dataclass(frozen=True)
class FreshFrom:
    """Where an ingest batch began: the rows of `runs` (runs the store had no row of before it) are all in
    `metrics` from rowid `metrics` on and in `expert_load` from rowid `experts` on, so their detectors read
    from there (skipping the row groups before) in one query for all of them."""

    metrics: int
    experts: int
    runs: frozenset[str]


def _read_runs(
    con,
    runs_dir: Path,
    runs: list[str],
    th: Thresholds,
    full: bool,
    fresh_from: FreshFrom | None = None,
    per_run: dict[str, Thresholds] | None = None,
    progress: Progress | None = None,
) -> list[_RunScan]:
    """The first half of `scan_run`, for several runs: every store read, one query per kind for them all
    (`per_run`: a run's own thresholds, where it has some; the reads reach back as far as the widest)."""
    if not runs:
        return []
    per_run = per_run or {}
    progress = progress or Progress()
    own = th
    th = widest(th, per_run.values())
    stored = anomaly_events_many(con, runs)
    states = {} if full else detector_states(con, runs)
    where = str(Path(runs_dir).resolve())  # this ingester's scans of the runs dir (`Progress.state`'s keys)
    keys, was = [], []
    in_files = findings.pending_many(runs_dir, runs, "anomaly")
    for run in runs:
        k, stored_through = _finding_keys(stored.get(run, []), in_files[run])
        keys.append(k)
        was.append({} if full else _through(states.get(run, {}), (where, run), stored_through, progress))
    fresh = [
        fresh_from is not None and run in fresh_from.runs and not w for run, w in zip(runs, was, strict=True)
    ]
    through = [w.get("series") for w in was]
    # where a cut is looked for: no later than the run's last stored step. A rebuild of a store from logs
    # whose findings were scanned through the run's end finds no step near that end in its first batches:
    # each batch read the whole run again (quadratic in the run's length: a 3.5M-step run, 3x its catch-up)
    last = stored_last_steps(con, runs)

    def capped(at: list[int | None]) -> list[int | None]:
        return [
            t if t is None or last.get(run) is None else min(t, last[run])
            for run, t in zip(runs, at, strict=True)
        ]

    through_c = capped(through)
    at = [i for i, t in enumerate(through) if t is not None]
    cuts = cut_steps(con, [runs[i] for i in at], [through_c[i] for i in at], th.lookback)
    since: list[int | None] = [None] * len(runs)
    for i, c in zip(at, cuts, strict=True):
        since[i] = c
    register_wanted(con, runs, since, fresh)
    try:
        rows = metric_arrays_many(con, since, fresh, fresh_from and fresh_from.metrics, list(SERIES))
        bad = nonfinite_arrays_many(con, since, fresh, fresh_from and fresh_from.metrics)
    finally:
        unregister_wanted(con)
    through_x = [w.get("experts") for w in was]
    lookback_x = [2 * th.expert_steps + 2 if d else th.lookback for d in rows.with_values(DROP).tolist()]
    since_x: list[int | None] = [None] * len(runs)
    through_xc = capped(through_x)
    for lb in set(lookback_x):
        at = [i for i, t in enumerate(through_x) if t is not None and lookback_x[i] == lb]
        for i, c in zip(
            at,
            cut_steps(con, [runs[i] for i in at], [through_xc[i] for i in at], lb, "expert_run_step"),
            strict=True,
        ):
            since_x[i] = c
    register_wanted(con, runs, since_x, fresh)
    try:
        stats = expert_layer_stats_many(con, since_x, fresh, fresh_from and fresh_from.experts)
    finally:
        unregister_wanted(con)
    out = []
    for i, run in enumerate(runs):
        experts, drop, last_x = expert_findings(con, run, since_x[i], per_run.get(run, own), stats[i])
        out.append(
            _RunScan(
                run,
                (where, run),
                keys[i],
                was[i],
                through[i],
                since[i],
                rows,
                i,
                bad[i],
                since_x[i],
                experts,
                drop,
                last_x,
            )
        )
    return out


def scan_run(
    con,
    runs_dir: Path,
    run: str,
    th: Thresholds,
    *,
    full: bool = False,
    activity: dict | None = None,
    now: float | None = None,
) -> tuple[list[Finding], int | None]:
    """New findings for one run (deduped) and the last step scanned. Writes nothing.

    Incremental unless `full`: the metric series are re-read from `Thresholds.lookback`
    logged steps before the last step scanned, the expert load from `2 * expert_steps + 2`
    logged expert steps before (or `lookback` of them when the drop fraction comes from
    the load). Either way the result equals a scan from the run's first step.
    """
    new, last, _ = _read_runs(con, runs_dir, [run], th, full)[0].finish(th, activity, now)
    return new, last


def _store_key(path) -> str:
    return str(Path(path).resolve())


def _commit_state(db, done: list[tuple[tuple[str, str], str, dict[str, int]]], progress: Progress) -> None:
    """The state the scans of `done` ((state key, run, state) each) reached: into `progress` and the store's
    `detector_state` (on a read-only store connection the rows wait in `progress.unsaved` for the store's
    next write)."""
    rows = []
    for key, run, st in done:
        progress.state[key] = st
        rows += [(run, group, through) for group, through in st.items()]
    if not rows:
        return
    if hasattr(db, "execute") and getattr(db, "read_only", True):
        path = getattr(db, "path", None)
        if path is not None:  # a store: its next write saves them
            progress.unsaved.setdefault(_store_key(path), {}).update({(r, g): t for r, g, t in rows})
        return  # else (a bare DuckDB connection): the process's state has to do
    try:
        with nullcontext(db) if hasattr(db, "execute") else write_connection(db) as con:
            _upsert_state(con, rows)
    except (StoreBusy, duckdb.Error) as e:  # a cache: the next scan re-reads a little more, never misses
        print(f"observatory anomalies: detector state not saved ({type(e).__name__}: {e})", file=sys.stderr)


def unsaved_state(db, progress: Progress) -> bool:
    """Whether scans on read-only connections to the store `db` reached state its file does not hold yet."""
    return bool(progress.unsaved.get(_store_key(db)))


def save_state(con, progress: Progress) -> int:
    """Write the state that scans on read-only connections reached into `con`'s store: `con` is a write
    connection (inside the caller's transaction, which commits it). Returns the rows written."""
    rows = progress.unsaved.pop(_store_key(con.path), None)
    if rows:
        _upsert_state(con, [(run, group, through) for (run, group), through in rows.items()])
    return len(rows or ())


def _upsert_state(con, rows: list[tuple[str, str, int | None]]) -> None:
    """`detector_state` rows (run, detector, through), in one statement: `executemany` ran one per row."""
    if rows:
        run, det, through = (list(c) for c in zip(*rows, strict=True))
        con.execute(
            "INSERT OR REPLACE INTO detector_state SELECT unnest($r), unnest($d), unnest($t::BIGINT[])",
            {"r": run, "d": det, "t": through},
        )


def write_findings(runs_dir: Path, run: str, found: list[Finding], scanned_through: int | None) -> None:
    """Append findings as `anomaly` events to the run's observatory-host file (never a run_end)."""
    findings.write(runs_dir, run, "anomaly", [(f.data(scanned_through), f.step) for f in found])


class Scan:
    """The detectors' pass over some runs: `read` (every store read, set-wise), `compute` (the series
    detectors, numpy only), `write` (the new findings into the runs' folders, the state reached kept)."""

    def __init__(
        self,
        runs_dir: Path,
        th: Thresholds,
        reads: list[_RunScan],
        activity: dict,
        now: float | None,
        per_run: dict[str, Thresholds] | None = None,
        progress: Progress | None = None,
    ):
        self.runs_dir, self.th, self.reads, self.activity, self.now = runs_dir, th, reads, activity, now
        self.progress = progress or Progress()
        self.per_run = per_run or {}  # runs with thresholds of their own (`Progress.thresholds_of`)
        self.results: list[tuple[_RunScan, list[Finding], int | None, dict]] = []
        # whether the scan checked for stalled runs: `progress.last_stall_check` is set when it is written
        self.stall_checked = False

    @classmethod
    def read(
        cls,
        con,
        runs_dir: Path,
        runs: Iterable[str] | None,
        th: Thresholds,
        *,
        full: bool = False,
        stall: bool = True,
        now: float | None = None,
        strict: bool = False,
        fresh_from: FreshFrom | None = None,
        progress: Progress | None = None,
    ) -> Scan:
        """Every store read of a scan of `runs` (None: every stored run), one query per kind for all of them
        (`fresh_from`: where the ingest batch that began some of them began). A run whose reads fail is said
        and left out, unless `strict`."""
        progress = progress or Progress()
        wanted = run_ids(con) if runs is None else list(dict.fromkeys(runs))
        act = {a["run"]: a for a in run_activity(con, wanted)} if stall and wanted else {}
        per_run = (
            {} if progress.thresholds_of is None else progress.thresholds_of(con, wanted, th, progress.said)
        )
        try:
            reads = _read_runs(con, runs_dir, wanted, th, full, fresh_from, per_run, progress)
        except Exception as e:  # then run by run: one bad run must not stop the others
            if strict:
                raise
            reads = []
            for run in wanted:
                try:
                    reads += _read_runs(con, runs_dir, [run], th, full, per_run=per_run, progress=progress)
                except Exception as e1:
                    _say_failed(run, e1)
            if not reads and wanted:
                _say_failed(", ".join(wanted[:3]) + ("..." if len(wanted) > 3 else ""), e)
        SlowReads.read(con, wanted, th, per_run, reads)  # each read's `slow`
        return cls(runs_dir, th, reads, act, now, per_run, progress)

    def compute(self) -> None:
        """The series detectors over what was read, run by run (a run that fails is said and left out);
        when there are many, only over the runs whose rows some rule flags (`screen.loud`)."""
        self.results = []
        quiet: set[str] = set()
        if len(self.reads) >= SCREEN_FROM:
            try:
                quiet = self._quiet()
            except Exception as e:  # then every run's detectors, as without the screen
                print(f"observatory anomalies: screen failed: {type(e).__name__}: {e}", file=sys.stderr)
        for r in self.reads:
            try:
                th = self.per_run.get(r.run, self.th)
                self.results.append((r, *r.finish(th, self.activity.get(r.run), self.now, r.run in quiet)))
            except Exception as e:
                _say_failed(r.run, e)

    def _quiet(self) -> set[str]:
        """The screenable runs (`_RunScan.screenable`) no series rule flags a row of (`screen.loud`): each
        read's rows and thresholds at once, its values of a metric laid end to end, never split by run."""
        groups: dict[tuple[int, Thresholds], tuple[SeriesRows, np.ndarray, dict[int, str]]] = {}
        longest: dict[int, np.ndarray] = {}
        for r in self.reads:
            rows = r.rows
            if id(rows) not in longest:
                longest[id(rows)] = rows.longest()
            if r.screenable(longest[id(rows)]):
                th = self.per_run.get(r.run, self.th)
                _, members, names = groups.setdefault((id(rows), th), (rows, np.zeros(rows.n, bool), {}))
                members[r.i] = True
                names[r.i] = r.run
        quiet: set[str] = set()
        for (_, th), (rows, members, names) in groups.items():
            loud = screen.loud(th, lambda metric, rows=rows, members=members: rows.values(metric, members))
            quiet.update(run for i, run in names.items() if i not in loud)
        return quiet

    def write(self, db=None) -> list[Finding]:
        """The new findings, written into their runs' folders and their scans' state kept (`_commit_state`
        into `db`); with `db` None, nothing written."""
        if self.stall_checked:
            self.progress.last_stall_check = time.monotonic()
        out, done = [], []
        for r, new, last, state in self.results:
            if db is not None and new:
                if not (self.runs_dir / r.run).is_dir():
                    print(
                        f"observatory anomalies: run {r.run} has no folder in {self.runs_dir}; findings not written",
                        file=sys.stderr,
                    )
                    continue
                write_findings(self.runs_dir, r.run, new, last)
            done.append((r.state_key, r.run, state))
            out += new
        if db is not None:  # after the findings are in their files: a crash re-finds, never loses
            _commit_state(db, done, self.progress)
        return out


def _say_failed(run: str, e: Exception) -> None:
    print(f"observatory anomalies: run {run}: detectors failed: {type(e).__name__}: {e}", file=sys.stderr)


def detect(
    db,
    runs_dir,
    runs: Iterable[str] | None = None,
    *,
    thresholds: Thresholds | None = None,
    full: bool = False,
    stall: bool = True,
    write: bool = True,
    now: float | None = None,
    progress: Progress | None = None,
) -> list[Finding]:
    """Run every detector over stored runs (all when `runs` is None); write and return the new findings.

    `full` rescans each run from its first step instead of continuing from the
    last scanned step (the result is the same; it is slower). `stall` also checks
    whether the runs have gone silent without a run_end. `progress`: where earlier scans stopped."""
    th = thresholds or Thresholds.from_settings()
    with using(db) as con:
        scan = Scan.read(con, Path(runs_dir), runs, th, full=full, stall=stall, now=now, progress=progress)
    scan.compute()
    return scan.write(db if write else None)


def _wanted(
    con, runs: Iterable[str] | None, th: Thresholds, progress: Progress
) -> tuple[list[str] | None, bool]:
    """The runs an ingest batch's scan looks at (None: every stored run): those it touched, and every few
    seconds (whether it is due, the second value) the runs that went silent without run_end."""
    stall_due = time.monotonic() - progress.last_stall_check > min(10.0, th.stall_s / 4)
    if runs is None:
        return None, stall_due
    wanted = list(dict.fromkeys(runs))
    if stall_due:
        wanted += [r for r in silent_runs(con, time.time() - th.stall_s) if r not in wanted]
    return wanted, stall_due


def after_ingest(
    db,
    runs_dir,
    runs: Iterable[str] | None,
    *,
    thresholds: Thresholds | None = None,
    fresh_from: FreshFrom | None = None,
    progress: Progress | None = None,
) -> set[str]:
    """The ingester's analysis, called after each committed batch: detect over the runs it touched.

    `runs`: the runs the batch touched (None: every stored run). Cheap on every pass:
    each run continues from the last step this process scanned (re-reading only
    `Thresholds.lookback` logged steps). Runs that went silent without run_end are
    checked at most every few seconds. Returns the runs whose folders got new
    findings. Never raises: a detector failure is reported on stderr and ingest goes on.
    """
    try:
        with using(db) as con:
            scan = _ingest_scan(
                con,
                runs_dir,
                runs,
                thresholds or Thresholds.from_settings(),
                strict=False,
                fresh_from=fresh_from,
                progress=progress or Progress(),
            )
        if scan is None:
            return set()
        scan.compute()
        return {f.run for f in scan.write(db)}
    except Exception as e:
        print(f"observatory anomalies: after_ingest failed: {type(e).__name__}: {e}", file=sys.stderr)
        return set()


def _ingest_scan(
    con,
    runs_dir,
    runs: Iterable[str] | None,
    th: Thresholds,
    strict: bool,
    fresh_from: FreshFrom | None = None,
    progress: Progress | None = None,
) -> Scan | None:
    """The reads of an ingest batch's scan (`after_ingest`): the runs `_wanted` gives, the stall check when
    it is due (`progress.last_stall_check` is set when the scan is written); None: no run to look at."""
    progress = progress or Progress()
    wanted, stall_due = _wanted(con, runs, th, progress)
    if wanted == []:
        return None
    scan = Scan.read(
        con,
        Path(runs_dir),
        wanted,
        th,
        stall=stall_due,
        strict=strict,
        fresh_from=fresh_from,
        progress=progress,
    )
    scan.stall_checked = stall_due
    return scan
