"""Instability early warning: the detectors run over the store as events are ingested.

Each finding becomes an `anomaly` event (EVENTS.md) written by the observatory
itself as host 1000 into the run's folder (`observatory.findings`); the next ingest
pass stores it. So what the observatory said, and when, is as the run itself. The
detectors (pure functions over numpy series) live in `observatory.detect.detectors`,
their thresholds (the `anomaly_*` settings) in `observatory.detect.thresholds`.

    after_ingest(db, runs_dir, runs)   # ingest's hook, after each committed batch
    detect(db, runs_dir, runs=None)    # `observatory detect`: new findings, written

Incremental and idempotent: a flag at a step depends only on a bounded trailing
window, so `scan_run` re-reads `Thresholds.lookback` logged steps before the last
step it scanned (the hot / dead expert detectors: `2 * expert_steps + 2` logged
expert steps, `observatory.detect.expert_scan`). Where each scan stopped is kept per
run and detector group in the store's `detector_state` (and per process, and as
`scanned_through` in every finding written), so a new process also reads only what
is new. It ignores episodes that began before its windows were whole (an earlier
scan saw their start: `detect_frame(truncated=True)`) and dedupes by (detector,
metric, window start) against anomaly events in the store and in events.1000.jsonl.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable
from contextlib import nullcontext
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import numpy as np

if TYPE_CHECKING:  # annotations only: polars loads lazily (start-up time of `observatory ingest`)
    import polars as pl

from observatory import findings
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
    grad_growth,
    grad_spikes,
    hot_experts,
    incomplete_recovery,
    loss_dips,
    loss_spikes,
    nonfinite,
    stalled,
    throughput_drops,
    update_spikes,
)
from observatory.detect.expert_scan import expert_findings
from observatory.detect.thresholds import Thresholds
from observatory.events import OBSERVATORY_HOST
from observatory.queries.anomalies import (
    anomaly_events,
    cut_step,
    detector_state,
    expert_cut_step,
    metric_arrays,
    nonfinite_arrays,
    run_activity,
    run_ids,
    silent_runs,
)
from observatory.store import StoreBusy, using, write_connection

__all__ = [
    "SERIES",
    "save_state",
    "unsaved_state",
    "detect_frame",
    "detect_series",
    "after_ingest",
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
    if (s := series.get(LOSS)) is not None:
        st, x = s
        spikes = loss_spikes(st, x, th)
        out += _keep(spikes, st, spike_dep, truncated)
        out += _keep(incomplete_recovery(st, x, spikes, th), st, spike_dep, truncated)
        out += _keep(loss_dips(st, x, th), st, spike_dep, truncated)
    if (s := series.get(GRAD)) is not None:
        st, g = s
        out += _keep(grad_spikes(st, g, th), st, spike_dep, truncated)
        out += _keep(grad_growth(st, g, th), st, 2 * th.window + th.growth_steps + 1, truncated)
    if (s := series.get(UPDATE)) is not None:
        out += _keep(update_spikes(s[0], s[1], th), s[0], spike_dep, truncated)
    drop, drop_truncated = series.get(DROP), truncated
    if drop is None and load_drop is not None and len(load_drop[0]):
        drop, drop_truncated = (load_drop[0], load_drop[1]), load_drop[2]
    if drop is not None:
        out += _keep(drop_jumps(drop[0], drop[1], th), drop[0], spike_dep, drop_truncated)
    if (s := series.get(THROUGHPUT)) is not None:
        out += _keep(throughput_drops(s[0], s[1], th), s[0], th.window, truncated)
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
    pending = [{**ev["data"], "host": ev.get("host")} for ev in findings.pending(runs_dir, run, "anomaly")]
    seen = anomaly_events(con, run) + pending
    keys = {k for d in seen if (k := _key_of(d)) is not None}
    scanned = [
        int(d["scanned_through"])
        for d in seen
        if d.get("host") == OBSERVATORY_HOST and isinstance(d.get("scanned_through"), int)
    ]
    return keys, (max(scanned) if scanned else None)


# (runs dir, run) -> {"series": last metrics step scanned, "experts": last expert_load step scanned}
# by this process; the store's `detector_state` (and the findings' `scanned_through`) is the fallback
_STATE: dict[tuple[str, str], dict[str, int]] = {}


def _through(con, state_key: tuple[str, str], run: str, stored_through: int | None) -> dict[str, int]:
    """Where the last scan of a run stopped, per detector group: this process's, else the store's."""
    mine = _STATE.get(state_key)
    if mine is not None:
        return dict(mine)
    kept = detector_state(con, run)
    if stored_through is not None:
        kept["series"] = max(kept.get("series", stored_through), stored_through)
    return kept


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
    keys, stored_through = existing_findings(con, runs_dir, run)
    state_key = (str(Path(runs_dir).resolve()), run)
    was = {} if full else _through(con, state_key, run, stored_through)
    through = was.get("series")
    since = cut_step(con, run, through, th.lookback) if through is not None else None
    steps, series = metric_arrays(con, run, since, list(SERIES))
    bad = nonfinite_arrays(con, run, since)
    has_drop = DROP in series
    through_x = was.get("experts")
    lookback_x = 2 * th.expert_steps + 2 if has_drop else th.lookback
    since_x = expert_cut_step(con, run, through_x, lookback_x) if through_x is not None else None
    experts, drop, last_x = expert_findings(con, run, since_x, th)
    found = detect_series(series, steps, th, truncated=since is not None, bad=bad,
                          load_drop=(drop[0], drop[1], since_x is not None))  # fmt: skip
    found = sorted(found + experts, key=lambda f: (f.step, f.detector, f.metric))
    if activity is not None:
        found += stalled(activity["last_step"], activity["last_t"], activity["ended"], th, now)
    new, fresh = [], set()
    for f in found:
        if f.key not in keys and f.key not in fresh:
            fresh.add(f.key)
            new.append(replace(f, run=run))
    last = int(steps[-1]) if len(steps) else through
    now_state = dict(was)
    if last is not None:
        now_state["series"] = max(last, through if through is not None else last)
    if last_x is not None:
        now_state["experts"] = max(last_x, through_x if through_x is not None else last_x)
    _PENDING[state_key] = now_state
    return new, last


# state_key -> the state a scan reached, made current (`_STATE`, the store) once its findings are written
_PENDING: dict[tuple[str, str], dict[str, int]] = {}


# store file -> {(run, detector group): through}: state reached on a read-only connection (ingest's
# after-commit hooks read the store beside the dashboard's readers), written by that store's next write
# transaction (`save_state`: ingest's next batch, or the write at the end of an `ingest` call)
_UNSAVED: dict[str, dict[tuple[str, str], int]] = {}


def _store_key(path) -> str:
    return str(Path(path).resolve())


def _commit_state(db, runs_dir: Path, runs: list[str]) -> None:
    """The scanned runs' state: into this process's `_STATE` and the store's `detector_state`.

    On a read-only store connection the rows wait in `_UNSAVED` for the store's next write."""
    rows = []
    for run in runs:
        key = (str(Path(runs_dir).resolve()), run)
        st = _PENDING.pop(key, None)
        if st is None:
            continue
        _STATE[key] = st
        rows += [(run, group, through) for group, through in st.items()]
    if not rows:
        return
    if hasattr(db, "execute") and getattr(db, "read_only", True):
        if getattr(db, "path", None) is not None:  # a store connection: its next write saves them
            _UNSAVED.setdefault(_store_key(db.path), {}).update({(r, g): t for r, g, t in rows})
        return  # else (a bare DuckDB connection): the process's state has to do
    try:
        with nullcontext(db) if hasattr(db, "execute") else write_connection(db) as con:
            _upsert_state(con, rows)
    except (StoreBusy, duckdb.Error) as e:  # a cache: the next scan re-reads a little more, never misses
        print(f"observatory anomalies: detector state not saved ({type(e).__name__}: {e})", file=sys.stderr)


def unsaved_state(db) -> bool:
    """Whether scans on read-only connections to the store `db` reached state its file does not hold yet."""
    return bool(_UNSAVED.get(_store_key(db)))


def save_state(con) -> int:
    """Write the state that scans on read-only connections reached into `con`'s store: `con` is a write
    connection (inside the caller's transaction, which commits it). Returns the rows written."""
    rows = _UNSAVED.pop(_store_key(con.path), None)
    if rows:
        _upsert_state(con, [(run, group, through) for (run, group), through in rows.items()])
    return len(rows or ())


def _upsert_state(con, rows: list[tuple[str, str, int | None]]) -> None:
    """`detector_state` rows (run, detector, through), in one statement: `executemany` ran one per row."""
    if rows:
        run, det, through = (list(c) for c in zip(*rows, strict=True))
        con.execute("INSERT OR REPLACE INTO detector_state SELECT unnest($r), unnest($d), unnest($t::BIGINT[])",
                    {"r": run, "d": det, "t": through})  # fmt: skip


def write_findings(runs_dir: Path, run: str, found: list[Finding], scanned_through: int | None) -> None:
    """Append findings as `anomaly` events to the run's observatory-host file (never a run_end)."""
    findings.write(runs_dir, run, "anomaly", [(f.data(scanned_through), f.step) for f in found])


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
) -> list[Finding]:
    """Run every detector over stored runs (all when `runs` is None); write and return the new findings.

    `full` rescans each run from its first step instead of continuing from the
    last scanned step (the result is the same; it is slower). `stall` also checks
    whether the runs have gone silent without a run_end.
    """
    th = thresholds or Thresholds.from_settings()
    runs_dir = Path(runs_dir)
    results: list[tuple[str, list[Finding], int | None]] = []
    with using(db) as con:
        wanted = run_ids(con) if runs is None else list(dict.fromkeys(runs))
        act = {a["run"]: a for a in run_activity(con, wanted)} if stall and wanted else {}
        for run in wanted:
            try:
                new, last = scan_run(con, runs_dir, run, th, full=full, activity=act.get(run), now=now)
            except Exception as e:  # one bad run must not stop the others
                print(
                    f"observatory anomalies: run {run}: detectors failed: {type(e).__name__}: {e}",
                    file=sys.stderr,
                )
                continue
            results.append((run, new, last))
    out, done = [], []
    for run, new, last in results:
        if write and new:
            if not (runs_dir / run).is_dir():
                print(
                    f"observatory anomalies: run {run} has no folder in {runs_dir}; findings not written",
                    file=sys.stderr,
                )
                continue
            write_findings(runs_dir, run, new, last)
        done.append(run)
        out += new
    if write:
        _commit_state(db, runs_dir, done)  # after the findings are in their files: a crash re-finds, never loses
    for run in wanted:
        _PENDING.pop((str(runs_dir.resolve()), run), None)
    return out


_last_stall_check = 0.0


def after_ingest(
    db, runs_dir, runs: Iterable[str] | None, *, thresholds: Thresholds | None = None
) -> set[str]:
    """Ingest's hook, called after each committed batch: detect over the runs it touched.

    `runs`: the runs the batch touched (None: every stored run). Cheap on every pass:
    each run continues from the last step this process scanned (re-reading only
    `Thresholds.lookback` logged steps). Runs that went silent without run_end are
    checked at most every few seconds. Returns the runs whose folders got new
    findings. Never raises: a detector failure is reported on stderr and ingest goes on.
    """
    global _last_stall_check
    wanted = None if runs is None else list(dict.fromkeys(runs))
    try:
        th = thresholds or Thresholds.from_settings()
        stall_due = time.monotonic() - _last_stall_check > min(10.0, th.stall_s / 4)
        if stall_due:
            _last_stall_check = time.monotonic()
            if wanted is not None:
                with using(db) as con:
                    wanted += [r for r in silent_runs(con, time.time() - th.stall_s) if r not in wanted]
        if wanted == []:
            return set()
        return {f.run for f in detect(db, runs_dir, wanted, thresholds=th, stall=stall_due)}
    except Exception as e:
        print(f"observatory anomalies: after_ingest failed: {type(e).__name__}: {e}", file=sys.stderr)
        return set()


def finding_rows(found: Iterable[Finding]) -> list[dict[str, Any]]:
    """Findings as flat dicts (for --json and tables)."""
    rows = []
    for f in found:
        d = asdict(f)
        d["window"] = list(f.window)
        d.update(d.pop("extra"))
        rows.append(d)
    return rows
