"""Sweeps from the store: the iso-FLOP fit of a selection, a variant against a baseline, a pivot table.

The CLI (`observatory isoflop`, `observatory sweep ...`) and the Sweeps page call these and show the
same dicts (JSON-ready: no NaN, a missing number is None with a message saying why).

A cell's budget, tokens and params come from its run_start (docs/ladder.md): budget = `ladder.budget`,
else `ladder.flops`; tokens = `ladder.tokens`, else `data.tokens`; params = `ladder.params_active`,
else `model.params_active` (optional). Its loss is the selection's metric (`eval:<dataset>` or a
metric name) at the run's newest attempt.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from observatory.ladder.isoflop import Cell, compute_multiplier, fit_envelope, fit_isoflop
from observatory.queries.sweeps import final_values

__all__ = ["cells_from_rows", "isoflop_view", "compare_view", "pivot", "record_comparison"]


def cells_from_rows(rows: Sequence[dict]) -> tuple[list[Cell], list[dict]]:
    """The rows of `final_values` as cells, and the rows left out, each with its reason."""
    cells, skipped = [], []
    for r in rows:
        missing = [k for k in ("budget", "tokens", "value") if not _positive(r.get(k))]
        if missing:
            skipped.append({"run": r["run"], "reason": f"no positive {', '.join(missing)}"})
            continue
        params = r["params"] if _positive(r.get("params")) else None
        cells.append(Cell(r["run"], float(r["budget"]), float(r["tokens"]), float(r["value"]), params))
    return cells, skipped


def _positive(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _inputs(rows: Sequence[dict]) -> dict:
    """What a number was computed from: run ids, their attempts and code versions."""
    return {
        "runs": [r["run"] for r in rows],
        "attempts": {r["run"]: r["attempts"] for r in rows if len(r.get("attempts") or ()) > 1},
        "code": sorted({r["commit"] for r in rows if r.get("commit")}),
    }


def isoflop_view(
    con,
    selection: str,
    metric: str,
    budget: float | None = None,
    noise: float | None = None,
    level: float = 0.9,
    n_boot: int = 1000,
    best: bool = False,
) -> dict[str, Any]:
    """The iso-FLOP fit of the selected runs: {selection, metric, cells, skipped, fit, inputs, selected}."""
    got = final_values(con, selection, metric, best=best)
    cells, skipped = cells_from_rows(got["rows"])
    out: dict[str, Any] = {
        "selection": selection,
        "metric": metric,
        "selected": got["selected"],
        "without_metric": got["missing"],
        "cells": [c.__dict__ for c in cells],
        "skipped": skipped,
        "inputs": _inputs(got["rows"]),
        "fit": None,
        "message": "",
    }
    if not cells:
        out["message"] = (
            f"no cells: {got['selected']} run(s) selected, {len(got['rows'])} with {metric}, none with a "
            "budget and tokens (ladder.budget or ladder.flops, ladder.tokens or data.tokens)"
        )
        return out
    out["fit"] = fit_isoflop(cells, level=level, n_boot=n_boot, noise=noise, budget=budget).as_dict()
    return out


def _envelope_dict(env, level: float) -> dict:
    xs = np.geomspace(min(p[0] for p in env.points), max(p[0] for p in env.points), 40)
    band = env.band(xs, level)
    return {
        "points": [{"flops": c, "loss": v, "sd": sd} for c, v, sd in env.points],
        "coef": [float(v) for v in env.coef],  # log L as a polynomial in log C, numpy's order
        "curve": [
            {
                "flops": float(x),
                "loss": float(env.loss(x)),
                "lo": None if band is None else float(band[0][i]),
                "hi": None if band is None else float(band[1][i]),
            }
            for i, x in enumerate(xs)
        ],
    }


def compare_view(
    con, baseline: str, variant: str, metric: str, best: bool = False, level: float = 0.9, n_boot: int = 1000
) -> dict[str, Any]:
    """A variant's envelope against a baseline's and its effective compute multiplier at the baseline's
    best loss: {baseline, variant, multiplier, text, inputs}; `message` when it cannot be computed."""
    out: dict[str, Any] = {"metric": metric, "level": level, "multiplier": None, "text": "", "message": ""}
    envs = {}
    for side, sel in (("baseline", baseline), ("variant", variant)):
        got = final_values(con, sel, metric, best=best)
        cells, skipped = cells_from_rows(got["rows"])
        out[side] = {"selection": sel, "skipped": skipped, "inputs": _inputs(got["rows"]), "envelope": None}
        try:
            envs[side] = fit_envelope(cells, n_boot=n_boot, level=level)
        except ValueError as e:
            out["message"] += f"{side}: {e}. "
            continue
        out[side]["envelope"] = _envelope_dict(envs[side], level)
    if len(envs) == 2:
        m = compute_multiplier(envs["baseline"], envs["variant"], level)
        if not math.isfinite(m.value):
            out["message"] += (
                f"the variant's envelope does not reach the baseline's loss ({m.loss:.4g}) between 1/100 of its "
                "smallest budget and 100x its largest. "
            )
        else:
            out["multiplier"] = {k: v for k, v in m.__dict__.items()}
            out["text"] = m.text()
        if out["multiplier"] is not None and m.lo is None:
            out["message"] += (
                "no interval: the envelopes' points have no noise to draw from (give more cells). "
            )
    out["message"] = out["message"].strip()
    return out


def pivot(rows: Sequence[dict], row_key: str, col_key: str) -> dict[str, Any]:
    """Final values pivoted by two keys (values of `rows[i]["keys"]`): {rows, cols, cells[r][c]}; each cell
    is the runs there (run, value) so a page can link each one; labels sorted numerically when they are."""

    def label(v) -> str:  # 1e17 and 100000000000000000 (JSON's text of it) are one label: 1e+17
        try:
            return f"{float(v):.6g}"
        except (TypeError, ValueError):
            return str(v)

    def order(vals):
        def k(v):
            try:
                return (0, float(v), "")
            except (TypeError, ValueError):
                return (1, 0.0, str(v))

        return sorted(vals, key=k)

    r_labels = order({label(r["keys"].get(row_key)) for r in rows})
    c_labels = order({label(r["keys"].get(col_key)) for r in rows})
    cells: dict[str, dict[str, list]] = {a: {b: [] for b in c_labels} for a in r_labels}
    for r in rows:
        cells[label(r["keys"].get(row_key))][label(r["keys"].get(col_key))].append(
            {"run": r["run"], "value": r["value"]}
        )
    return {"row_key": row_key, "col_key": col_key, "rows": r_labels, "cols": c_labels, "cells": cells}


def record_comparison(runs_dir, db, view: dict, title: str, ingest=None, author: str = ""):
    """Save a `compare_view` result as a decision record (kind experiment, status succeeded) whose
    evidence holds the multiplier and its inputs (selections, run ids, attempts, code versions)."""
    from observatory.decisions import store as decisions

    if view.get("multiplier") is None:
        raise ValueError(f"nothing to record: {view.get('message') or 'no multiplier'}")
    runs = [*view["baseline"]["inputs"]["runs"], *view["variant"]["inputs"]["runs"]]
    evidence = {
        "kind": "compute_multiplier",
        "metric": view["metric"],
        "text": view["text"],
        **{k: view["multiplier"][k] for k in ("value", "lo", "hi", "level", "loss", "flops")},
        **{
            side: {"selection": view[side]["selection"], **view[side]["inputs"]}
            for side in ("baseline", "variant")
        },
    }
    return decisions.new(
        runs_dir,
        db,
        ingest=ingest,
        title=title,
        kind="experiment",
        status="succeeded",
        outcome=f"The variant {view['text']}.",
        runs=tuple({"run": r} for r in dict.fromkeys(runs)),
        evidence=(evidence,),
        author=author,
    )
