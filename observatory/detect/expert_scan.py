"""The hot and dead expert detectors over the store, from per (step, layer) summaries.

At the reference run's shape a logged step is 48 layers x 384 experts; fetching every
routed count and pivoting it per layer (what `detect_frame` does with a `load` frame)
costs more than ingesting the rows. Here one aggregate over few groups
(`queries.anomalies.expert_layer_stats`) gives each (step, layer) its routed sum and
max, and one filter scan gives the cells that routed nothing; the detectors
(`detectors.hot_from_ratio`, `detectors.dead_from_zeros`) run on those numpy arrays.
Nothing per value reaches Python.

That shortcut holds where a (step, layer) came from one event with the layer's full
expert list (`rows == max_expert + 1 == n_experts`): then its max row is the busiest
expert and its zero rows are the idle experts. The other cells (a rollback re-logged a
step, two hosts logged one layer, a shorter list) are few: their raw rows are summed
per expert in numpy (`np.bincount`), as the pivot of `detect_frame` would (a missing
expert counts 0). The findings equal `hot_experts` / `dead_experts` on that pivot.
"""

from __future__ import annotations

import numpy as np

from observatory.detect.detectors import Finding, dead_from_zeros, hot_from_ratio
from observatory.detect.thresholds import Thresholds
from observatory.queries.anomalies import (
    distinct,
    expert_busiest,
    expert_layer_stats,
    expert_rows_at,
    expert_zero_cells,
)

__all__ = ["expert_findings"]


def _keep(found: list[Finding], steps: np.ndarray, truncated: bool) -> list[Finding]:
    """Drop streaks that began at the frame's first row: an earlier scan saw their start."""
    if not truncated or not len(steps):
        return found
    return [f for f in found if f.window[0] > int(steps[0])]


def expert_findings(
    con, run: str, since: int | None, th: Thresholds, st: dict[str, np.ndarray] | None = None
) -> tuple[list[Finding], tuple[np.ndarray, np.ndarray], int | None]:
    """(hot / dead expert findings, the drop fraction per step (steps, dropped / routed), last step)
    over one run's expert load from `since` (None: from its first step; else an incremental frame).
    `st`: its `expert_layer_stats`, when the caller read them for many runs at once."""
    if st is None:
        st = expert_layer_stats(con, run, since)
    empty = (np.empty(0, np.int64), np.empty(0))
    if not len(st["step"]):
        return [], empty, None
    truncated = since is not None
    step, layer = st["step"], st["layer"]
    # drop fraction per step, summed over layers (rows are sorted by step)
    u, first = np.unique(step, return_index=True)
    routed_step = np.add.reduceat(st["routed"], first).astype(float)
    dropped_step = np.add.reduceat(st["dropped"], first).astype(float)
    ok = routed_step > 0
    drop = (u[ok], dropped_step[ok] / routed_step[ok])
    # experts per layer: the pivot's columns, 0 .. the largest index logged in the frame
    layers, inv = np.unique(layer, return_inverse=True)
    n_exp = np.zeros(len(layers), np.int64)
    np.maximum.at(n_exp, inv, st["max_expert"] + 1)
    e_of = n_exp[inv]  # (C,) per (step, layer) cell
    good = (st["rows"] == e_of) & (st["max_expert"] == e_of - 1)  # one event with the full list
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(st["routed"] > 0, st["routed_max"] / (st["routed"] / e_of), np.nan)
    zero_cell = np.empty(0, np.int64)  # (Z,) cell index of each idle (cell, expert)
    zero_expert = np.empty(0, np.int64)
    if int(st["zeros"][good].sum()):
        z = expert_zero_cells(con, run, since)
        cell = _cell_of(step, layer, z["step"], z["layer"])
        keep = good[cell]
        zero_cell, zero_expert = cell[keep], z["expert"][keep]
    bad = np.flatnonzero(~good)
    if bad.size:  # sum these cells' rows per expert, densely (few: re-logged steps, short lists)
        raw = expert_rows_at(con, run, distinct(step[bad]))
        cell = _cell_of(step, layer, raw["step"], raw["layer"])
        pos = np.full(len(step), -1, np.int64)
        pos[bad] = np.arange(bad.size)
        mine = pos[cell] >= 0
        width = int(n_exp.max())
        sums = np.bincount(
            pos[cell[mine]] * width + raw["expert"][mine],
            weights=raw["routed"][mine],
            minlength=bad.size * width,
        ).reshape(bad.size, width)
        cols = np.arange(width)[None, :] < e_of[bad][:, None]
        busiest = np.where(cols, sums, -1).max(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio[bad] = np.where(st["routed"][bad] > 0, busiest / (st["routed"][bad] / e_of[bad]), np.nan)
        bz, be = np.nonzero((sums == 0) & cols)
        zero_cell, zero_expert = np.concatenate((zero_cell, bad[bz])), np.concatenate((zero_expert, be))
    out: list[Finding] = []
    by_layer = np.argsort(inv, kind="stable")  # cells of each layer, in step order
    bounds = np.searchsorted(inv[by_layer], np.arange(len(layers) + 1))
    row_in_layer = np.empty(len(step), np.int64)  # each cell's row among its layer's logged steps
    row_in_layer[by_layer] = np.arange(len(step)) - bounds[inv[by_layer]]
    z_layer = inv[zero_cell]
    for k, lay in enumerate(layers.tolist()):
        idx = by_layer[bounds[k] : bounds[k + 1]]
        steps_l = step[idx]

        def hottest(i0: int, i1: int, lay=lay, steps_l=steps_l) -> int:
            b = expert_busiest(con, run, lay, int(steps_l[i0]), int(steps_l[i1]))
            return int(np.bincount(b["expert"]).argmax())

        found = hot_from_ratio(steps_l, lay, ratio[idx], hottest, th)
        mine = z_layer == k
        if int(st["routed"][idx].sum()) > 0 and int(mine.sum()) >= th.expert_steps:
            found += dead_from_zeros(steps_l, lay, row_in_layer[zero_cell[mine]], zero_expert[mine], th)
        out += _keep(found, steps_l, truncated)
    return out, drop, int(u[-1])


def _cell_of(step: np.ndarray, layer: np.ndarray, at_step: np.ndarray, at_layer: np.ndarray) -> np.ndarray:
    """Index into the (step, layer)-sorted cells of each (at_step, at_layer), all present."""
    key = step * 65536 + layer
    return np.searchsorted(key, at_step * 65536 + at_layer)
