"""The ladder against the store: load rungs, pre-register a target's forecast, watch the target.

- `load_ladder(con, name)`: a ladder's rungs as `observatory.ladder.rungs.Rung`s (eval
  loss at every 5% of each rung's schedule) and its targets.
- `forecast_event_data` / `write_forecast`: the `forecast` event, written by host 1000
  into the target's run folder before its run_start (pre-registered).
- `check_target(db, runs_dir, run)`: the target's evals against that band; K
  consecutive evals outside write one `anomaly` (detector `ladder_deviation`) per
  excursion, idempotently. `check_targets(db, runs_dir, runs)` does it for many runs,
  and `after_ingest(db, runs_dir, runs)` is the ingester's analysis around it (`observatory.pipeline`).
- `forecast_band(db, run)`: the band as a DataFrame, for the Live run page.

Both events are written through `observatory.findings`, so what the observatory said
and when is part of the run's record. All SQL is in `observatory.queries.ladder`.
This module does not import the fit (nor scipy with it): ingest loads it for its hook.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from observatory import findings, settings
from observatory.ladder.rungs import DETECTOR, EVAL_METRIC, METHOD, Forecast, Rung, as_run_id, fit_version
from observatory.queries import ladder as q
from observatory.store import using

if TYPE_CHECKING:  # for annotations only: importing the fit at run time would load scipy
    from observatory.ladder.fit import LadderFit

__all__ = [
    "load_ladder",
    "rejected_runs_warnings",
    "target_spec",
    "curve_by_fraction",
    "forecast_event_data",
    "write_forecast",
    "run_started",
    "band_at_steps",
    "deviations",
    "check_target",
    "check_targets",
    "after_ingest",
    "forecast_band",
]


# --------------------------------------------------------- reading the store


def _snap(step: int, steps: int) -> float | None:
    """The schedule fraction (a multiple of 5%) an eval at `step` of `steps` stands for, if any."""
    if not steps or step is None or step <= 0:
        return None
    fr = step / steps
    g = round(round(fr / 0.05) * 0.05, 2)
    return g if 0 < g <= 1 and abs(fr - g) <= max(0.01, 1.0 / steps) else None


def curve_by_fraction(points: Iterable[dict], steps: int) -> dict[float, float]:
    """Eval points ({step, loss}) as fraction -> loss, keeping the eval nearest each 5% mark."""
    best: dict[float, tuple[float, float]] = {}
    for p in points:
        g = _snap(p["step"], steps)
        if g is None or p["loss"] is None:
            continue
        dist = abs(p["step"] / steps - g)
        if g not in best or dist <= best[g][0]:
            best[g] = (dist, float(p["loss"]))
    return {g: v for g, (_, v) in sorted(best.items())}


def _pick_dataset(points: list[dict], dataset: str | None) -> str | None:
    if dataset is not None:
        return dataset
    names = [p["dataset"] for p in points if p.get("dataset")]
    return max(set(names), key=lambda n: (names.count(n), n)) if names else None


def _steps_of(info: dict, points: list[dict]) -> int | None:
    lad = info.get("ladder") or {}
    for v in (lad.get("steps"), info.get("final_step")):
        if isinstance(v, int) and v > 0:
            return v
    steps = [p["step"] for p in points if p.get("step")]
    return max(steps) if steps else None


MAX_FLOPS = 1e40  # training compute a rung may claim (today's largest runs: ~1e26)
MAX_COUNT = 1 << 53  # tokens, parameters, steps and seeds beyond this (2^70 from a log) are not shown


def _count(v) -> int | None:
    """A ladder's count as a page and a table can hold it: an int in [0, 2^53], else None (not shown)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_COUNT else None


def out_of_range(lad: dict) -> str | None:
    """Why a rung's ladder.flops is left out of its ladder (beyond `MAX_FLOPS`), or None."""
    flops = lad.get("flops")
    if isinstance(flops, (int, float)) and not isinstance(flops, bool) and not float(flops) <= MAX_FLOPS:
        return f"ladder.flops {float(flops):.3g} is beyond {MAX_FLOPS:.0e} FLOPs"
    return None


def left_out(con, name: str) -> list[str]:
    """The ladder's runs that `load_ladder` leaves out for a value beyond what a page can show, each with why."""
    return [
        f"run {r['run']}: {why}; left out of the ladder"
        for r in q.ladder_runs(con, name)
        if (why := out_of_range(r["ladder"] or {})) is not None
    ]


def load_ladder(con, name: str, dataset: str | None = None) -> tuple[list[Rung], list[dict], str | None]:
    """A ladder's rung runs (as `Rung`s, one per run: a rung trained with several seeds gives one per
    seed, with `seed` from ladder.seed; the fit averages them), its targets (run info + observed
    curve) and the eval dataset used.

    Raises ValueError naming the ladder when it has no runs or a rung lacks `flops`.
    """
    runs = q.ladder_runs(con, name)
    if not runs:
        known = ", ".join(d["name"] for d in q.ladders(con)) or "none"
        hint = " ".join(rejected_runs_warnings(con, name)) or "did you run ingest?"
        raise ValueError(f"no ladder named {name!r} in the store (ladders: {known}); {hint}")
    evals = q.eval_points(con, [r["run"] for r in runs])
    ds = _pick_dataset(evals, dataset)
    by_run: dict[str, list[dict]] = {}
    for p in evals:
        if ds is None or p["dataset"] == ds:
            by_run.setdefault(p["run"], []).append(p)
    rungs, targets = [], []
    for r in runs:
        lad = r["ladder"]
        pts = by_run.get(r["run"], [])
        steps = _steps_of(r, pts)
        curve = curve_by_fraction(pts, steps) if steps else {}
        if r["target"]:
            targets.append({**r, "steps": steps, "curve": curve, "evals": pts})
            continue
        flops = lad.get("flops")
        if not isinstance(flops, (int, float)) or not flops > 0:
            raise ValueError(
                f"ladder {name!r}: run {r['run']} (rung {r['rung']!r}) has no ladder.flops in run_start"
            )
        if (
            out_of_range(lad) is not None
        ):  # 1e308 from a log: left out (`left_out` says why), not a broken page
            continue
        rungs.append(
            Rung(
                run=r["run"],
                rung=str(lad.get("rung", r["rung"])),
                flops=float(flops),
                curve=curve,
                params_active=_count(lad.get("params_active")),
                params_total=_count(lad.get("params_total")),
                tokens=_count(lad.get("tokens")),
                steps=steps if _count(steps) else None,
                seed=_count(lad.get("seed")),
            )
        )
    lacking = [r.run for r in rungs if 1.0 not in r.curve]
    if lacking:  # say why, from what the store has of them (a query or two, for these runs only)
        datasets, losses = q.eval_datasets(con, lacking), q.loss_metrics(con, lacking)
        rungs = [
            r
            if 1.0 in r.curve
            else replace(
                r, problem=_why_no_final(r, by_run.get(r.run, []), ds, datasets.get(r.run), losses.get(r.run))
            )
            for r in rungs
        ]
    return rungs, targets, ds


def _why_no_final(
    r: Rung, pts: list[dict], ds: str | None, datasets: list[str] | None, losses: list[str] | None
) -> str:
    """Why a rung has no eval at 100% of its schedule, in words that say what to log instead."""
    fix = f"log an `eval` event (data {{dataset, loss}}) at the run's last step ({r.steps or 'ladder.steps'})"
    if not pts:
        if datasets:
            return (
                f"its evals are in dataset(s) {', '.join(datasets)}, not {ds!r} (choose one with --dataset)"
            )
        if losses:
            return (
                f"it logs its loss as a metric ({', '.join(losses[:4])} in `metrics` events), not as an `eval` "
                f"event; the ladder reads eval events: {fix}"
            )
        return f"it has no eval events; {fix}"
    if not r.steps or all(not p["step"] for p in pts):
        return (
            f"its only eval is at step 0, before any training (an eval at step s stands for s/steps of the "
            f"schedule); {fix}"
        )
    last = max(p["step"] for p in pts)
    return f"no eval at its last step {r.steps} (its last eval is at step {last}, {100 * last / r.steps:.0f}%); {fix}"


def rejected_runs_warnings(con, name: str) -> list[str]:
    """A line per run folder of ladder `name` that ingest rejected for its run id (none of it is stored)."""
    return [
        f"run folder {x['folder']!r} names ladder {name!r} but ingest rejected its lines for their run id "
        f"{x['run']!r} ({x['reason']}): rename the folder and the events' `run`, e.g. "
        f"{as_run_id(str(x['run']))!r}, and ingest again"
        for x in q.rejected_ladder_runs(con, name)
    ]


def _number(x) -> float | None:
    """A number, or a string YAML left unparsed (PyYAML reads 1.5e12 as a string: no exponent sign)."""
    if isinstance(x, bool):
        return None
    try:
        return float(x) if isinstance(x, (int, float, str)) else None
    except ValueError:
        return None


def target_spec(con, target: str) -> dict:
    """What a forecast needs about a target: {run, flops, steps, curve}, from a stored run or a file.

    A file (YAML or JSON) gives `flops` and `steps` at its top level or under `target`
    or `ladder` (what `trainer ladder --plan` prints for a target).
    """
    p = Path(target)
    if p.is_file():
        import yaml  # lazy: ~15 ms of `observatory ingest`'s start-up, for a target file only

        try:
            doc = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as e:
            raise ValueError(f"{p}: not valid YAML/JSON: {e}") from None
        for d in (
            doc,
            doc.get("target") if isinstance(doc, dict) else None,
            doc.get("ladder") if isinstance(doc, dict) else None,
        ):
            flops = _number(d.get("flops")) if isinstance(d, dict) else None
            if flops is not None:
                steps = _number(d.get("steps"))
                return {
                    "run": d.get("run"),
                    "flops": flops,
                    "steps": None if steps is None else int(steps),
                    "curve": {},
                }
        raise ValueError(
            f"{p}: no `flops` (and `steps`) at the top level or under `target:`; "
            "`trainer ladder --config CONFIG --plan` prints them"
        )
    info = q.run_ladder(con, target)
    if info is None:
        raise ValueError(f"--target {target!r} is neither a file nor a run in the store")
    lad = info["ladder"]
    if not isinstance(lad.get("flops"), (int, float)):
        raise ValueError(f"run {target} has no ladder.flops in its run_start; cannot place it on the ladder")
    evals = q.eval_points(con, [target])
    steps = _steps_of(info, evals)
    return {
        "run": target,
        "flops": float(lad["flops"]),
        "steps": steps,
        "start_time": info["start_time"],
        "curve": curve_by_fraction(evals, steps) if steps else {},
        "evals": evals,
    }


# ------------------------------------------------------- forecasts as events


def forecast_event_data(
    fit: LadderFit, forecast: Forecast, dataset: str | None, *, pre_registered: bool = True
) -> dict:
    """The `forecast` event payload (EVENTS.md): final value and band, every curve point, the source."""
    fin = forecast.final
    return {
        "metric": EVAL_METRIC,
        "dataset": dataset,
        "target_step": fin.step,
        "value": fin.value,
        "low": fin.low,
        "high": fin.high,
        "level": fit.config.level,
        "points": [
            {"step": p.step, "fraction": p.fraction, "value": p.value, "low": p.low, "high": p.high}
            for p in forecast.points
        ],
        "flops": forecast.flops,
        "method": METHOD,
        "fit": fit.final.as_dict(),
        "pre_registered": pre_registered,
        "source": {
            "ladder": fit.name,
            "fit_version": fit_version(fit.rungs),
            "rungs": [x for r in fit.rungs for x in (r.runs or (r.run,))],
            "fix_e": fit.config.fix_e,
            "noise": fit.noise,
            "noise_source": fit.noise_source,
            "band": fit.config.loo,
            "held_out": fit.held_out,
            "e_range": None if fit.config.e_range is None else list(fit.config.e_range),
        },
    }


def run_started(runs_dir, run: str) -> bool:
    """Whether the run's own logs (any host but the observatory's) already hold events."""
    d = Path(runs_dir) / run
    return any(
        f.stat().st_size > 0 for f in d.glob("events.*.jsonl*") if not f.name.startswith("events.1000.")
    )


def write_forecast(runs_dir, run: str, data: dict) -> Path:
    """Append the `forecast` event to the run's observatory-host file; return that file's path.

    Written before the target's run_start it is pre-registered: its `t` precedes the
    run's. `data["pre_registered"]` is set from whether the run had started.
    """
    data = {**data, "pre_registered": not run_started(runs_dir, run)}
    findings.write(runs_dir, run, "forecast", [(data, None)])
    return findings.path(runs_dir, run)


# ---------------------------------------------------- watching a target run


def band_at_steps(points: Sequence[dict], steps: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(value, low, high) linearly interpolated in step from forecast points; NaN outside their span."""
    pts = sorted((p for p in points if p.get("step") is not None), key=lambda p: p["step"])
    s = np.asarray(steps, dtype=float)
    if not pts:
        nan = np.full(s.shape, np.nan)
        return nan, nan, nan
    xp = np.array([p["step"] for p in pts], dtype=float)
    inside = (s >= xp[0]) & (s <= xp[-1])
    out = []
    for key in ("value", "low", "high"):
        v = np.interp(s, xp, np.array([p[key] for p in pts], dtype=float))
        out.append(np.where(inside, v, np.nan))
    return tuple(out)


def deviations(points: Sequence[dict], evals: Sequence[dict], k: int) -> list[dict]:
    """Excursions of an eval curve out of the band lasting >= k consecutive evals.

    Returns one dict per excursion: window [first_step, last_step], the evals in it
    and how far outside the band the worst one was (relative to the band edge).
    """
    evals = sorted((e for e in evals if e.get("loss") is not None), key=lambda e: e["step"])
    val, low, high = band_at_steps(points, [e["step"] for e in evals])
    out, cur = [], []
    for e, lo, hi in zip(evals, low, high, strict=True):
        if np.isnan(lo):
            continue  # no band here (before the first forecast point)
        loss = e["loss"]
        if not (lo <= loss <= hi):  # NaN loss counts as outside
            cur.append({"step": e["step"], "loss": loss, "low": float(lo), "high": float(hi)})
            continue
        if len(cur) >= k:
            out.append(cur)
        cur = []
    if len(cur) >= k:
        out.append(cur)
    result = []
    for ex in out:
        worst = max(
            (
                abs(x["loss"] - (x["high"] if x["loss"] > x["high"] else x["low"])) / x["high"]
                if math.isfinite(x["loss"])
                else math.inf
            )
            for x in ex
        )
        result.append(
            {
                "window": [ex[0]["step"], ex[-1]["step"]],
                "evals": ex,
                "worst_rel": worst,
                "above": all(not math.isfinite(x["loss"]) or x["loss"] > x["high"] for x in ex),
            }
        )
    return result


def _latest_forecast(forecasts: list[dict], start_time: float | None) -> dict | None:
    """The forecast a run is judged against: the newest one made before it started, else the newest."""
    if not forecasts:
        return None
    before = [f for f in forecasts if start_time is not None and f["t"] < start_time]
    return (before or forecasts)[-1]


def _pending_windows(runs_dir, run: str) -> set[int]:
    """First steps of ladder_deviation anomalies already in the run's host-1000 file (maybe not ingested)."""
    seen: set[int] = set()
    for ev in findings.pending(runs_dir, run, "anomaly"):
        d = ev["data"]
        if d.get("detector") == DETECTOR:
            try:
                seen.add(int(d["window"][0]))
            except (KeyError, TypeError, ValueError, IndexError):
                continue
    return seen


def check_target(db, runs_dir, run: str, *, k: int | None = None, write: bool = True) -> list[dict]:
    """Compare a target run's evals with its pre-registered band; write an anomaly per new excursion.

    An excursion is >= k consecutive evals outside the band (k: setting
    `ladder_deviation_evals`, default 3). Idempotent: an excursion already reported
    (same first step, in the store or in events.1000.jsonl) is not written again.
    `db` is a store path or an open connection. Returns the anomaly payloads written.
    """
    k = int(k if k is not None else settings.get("ladder_deviation_evals"))
    with using(db) as con:
        fc = _latest_forecast(q.forecast_events(con, run), (q.run_ladder(con, run) or {}).get("start_time"))
        if fc is None or not fc.get("points"):
            return []
        evals = [e for e in q.eval_points(con, [run]) if fc.get("dataset") in (None, e["dataset"])]
        seen = {
            int(a["window"][0])
            for a in q.deviation_anomalies(con, run, DETECTOR)
            if isinstance(a.get("window"), list) and a["window"]
        }
    seen |= _pending_windows(runs_dir, run)
    new = []
    for ex in deviations(fc["points"], evals, k):
        if ex["window"][0] in seen:
            continue
        first, last = ex["evals"][0], ex["evals"][-1]
        side = "above" if ex["above"] else "outside"
        new.append(
            {
                "detector": DETECTOR,
                "metric": EVAL_METRIC,
                "severity": "critical" if ex["worst_rel"] > 0.05 else "warn",
                "message": (
                    f"eval loss {side} the ladder forecast band for {len(ex['evals'])} consecutive evals "
                    f"(steps {first['step']}-{last['step']}): {last['loss']:.4f} vs band "
                    f"[{last['low']:.4f}, {last['high']:.4f}] at step {last['step']}"
                ),
                "window": ex["window"],
                "evals": ex["evals"],
                "forecast": {
                    "t": fc["t"],
                    "ladder": (fc.get("source") or {}).get("ladder"),
                    "fit_version": (fc.get("source") or {}).get("fit_version"),
                },
            }
        )
    if write:
        findings.write(runs_dir, run, "anomaly", [(a, a["window"][1]) for a in new])
    return new


def check_targets(db, runs_dir, runs: Iterable[str] | None = None, **kw) -> list[dict]:
    """`check_target` for every run (of `runs`, or all) that has a forecast event. Never raises per run."""
    with using(db) as con:
        have = {f["run"] for f in q.forecast_events(con)}
    wanted = have if runs is None else have & set(runs)
    out = []
    for run in sorted(wanted):
        try:
            out += [{"run": run, **a} for a in check_target(db, runs_dir, run, **kw)]
        except Exception as e:  # one bad run must not stop the others (or ingest)
            print(f"observatory ladder: check_target({run}) failed: {type(e).__name__}: {e}", file=sys.stderr)
    return out


def after_ingest(db, runs_dir, runs: set[str] | None) -> set[str]:
    """The ingester's analysis, after each committed batch: the touched targets against their forecast band.

    `runs`: the runs the batch touched (None: every run with a forecast). Returns the
    runs whose folders got new `ladder_deviation` anomalies. Never raises: a failure is
    reported on stderr and ingest goes on.
    """
    try:
        return {a["run"] for a in check_targets(db, runs_dir, runs)}
    except Exception as e:
        print(f"observatory anomalies: ladder check failed: {type(e).__name__}: {e}", file=sys.stderr)
        return set()


def forecast_band(db, run: str):
    """The band a run is judged against, as a pandas DataFrame (step, fraction, value, low, high), or None."""
    import pandas as pd  # lazy for start-up time: ingest loads this module for its hook

    with using(db) as con:
        fc = _latest_forecast(q.forecast_events(con, run), (q.run_ladder(con, run) or {}).get("start_time"))
    if fc is None or not fc.get("points"):
        return None
    return pd.DataFrame(fc["points"], columns=["step", "fraction", "value", "low", "high"])
