"""The Live page of a run without our trainer's names: one panel per metric, grouped by prefix, like W&B.

A W&B script logs what it likes (`loss`, `acc`, `val/loss`). When a run logged none of the
Live page's known loss names (`train/loss`, ...), `choose_panels` lays its metrics out as
W&B's automatic panels do: the run's loss (`observatory.queries.core.loss_name`, the rule the
Runs table and the report use) first and wide, then a section per prefix (`val/loss` is in
`val`; a name without `/` in "Charts"), one half-width chart per metric, at most `MAX_PANELS`.
"""

from __future__ import annotations

import glob
import html
from collections.abc import Callable

import streamlit as st

from observatory.dashboard.cache import derive, query_all
from observatory.dashboard.charts import (
    EPISODE_GAP,
    add_markers,
    route_markers,
    series_figure,
    window_markers,
    x_range,
)
from observatory.dashboard.live_chart import live_chart
from observatory.dashboard.widgets import requested_window
from observatory.markup import md_escape
from observatory.queries import dashboard as qd
from observatory.queries.core import loss_name

__all__ = ["choose_panels", "render_auto", "MAX_PANELS", "UNGROUPED"]

MAX_PANELS = 60  # a page of charts; the rest are named, and drawn on Compare
UNGROUPED = "Charts"  # W&B's section of names without a prefix


def choose_panels(names) -> tuple[str | None, list[tuple[str, list[str]]], list[str]]:
    """(the loss, [(section, names)] in order, the names left out past MAX_PANELS) for a run's metric names."""
    loss = loss_name(names)
    groups: dict[str, list[str]] = {}
    for n in sorted(set(names)):
        if n != loss:
            groups.setdefault(n.split("/", 1)[0] if "/" in n else UNGROUPED, []).append(n)
    order = sorted(groups, key=lambda g: (g != UNGROUPED, g))
    room = MAX_PANELS - (loss is not None)
    out, left = [], []
    for g in order:
        kept, rest = groups[g][: max(room, 0)], groups[g][max(room, 0) :]
        room -= len(kept)
        left += rest
        if kept:
            out.append((g, kept))
    return loss, out, left


def panel_markers(view: dict, all_marks, names) -> dict:
    """The window's markers by panel: each finding on its own metric's panel, every other marker (and a
    finding of a metric with no panel) on the loss's."""
    loss, groups, _ = choose_panels(names)
    panels = [n for n in [loss] + [n for _, ns in groups for n in ns] if n is not None]
    return route_markers(window_markers(view, all_marks), {n: (glob.escape(n),) for n in panels}, loss or "")


def metric_figure(
    view: dict, name: str, smoothing: float, height: int, marks: dict | None = None, lines: bool = False
) -> dict:
    """One metric of `view` (a `live_view`) over its window, with its markers (`panel_markers`); `lines`:
    dotted lines at failures, config changes and decisions (the wide loss chart)."""
    data = view["data"]
    d = data.filter(data["name"] == name)
    fig = series_figure(d, html.escape(name), smoothing, height=height, y_title=html.escape(name))
    lo, hi = view["window"]
    mine = (marks or {}).get(name)
    top = d["max"].drop_nulls()
    add_markers(
        fig,
        mine,
        y_at=float(top.max()) if top.len() else None,
        lines=lines,
        gap=EPISODE_GAP * (hi - lo),
    )
    fig["layout"]["xaxis"]["range"] = x_range(lo, hi, mine)
    return fig


def render_auto(
    run: str,
    names: list[str],
    all_marks,
    smoothing: float,
    live: bool,
    controls: Callable[[int, int, str, tuple[int, int]], None],
) -> bool:
    """Draw the run's metrics as W&B's automatic panels; False when there is nothing to draw.

    `controls(first, last, window_key, window)`: the Live page's smoothing and step window, drawn under the loss.
    """
    loss, groups, left = choose_panels(names)
    shown = [n for _, ns in groups for n in ns]
    wkey = f"live_window_{run}"
    call = (qd.live_view, run, [loss] if loss else [], shown, *requested_window(wkey), 1000, 300)
    view = query_all(call, keep_fresh=live)[0]
    if view["extent"] is None:
        return False
    marks = derive(panel_markers, view, all_marks, names)
    if loss is not None:
        live_chart(
            derive(metric_figure, view, loss, smoothing, 420, marks, True),
            key=f"live_auto_loss_{run}",
            window_key=wkey,
        )
    controls(*view["extent"], wkey, view["window"])
    for section, members in groups:
        st.subheader(md_escape(section), divider="gray")
        cols = st.columns(2)
        for i, name in enumerate(members):
            with cols[i % 2]:
                live_chart(
                    derive(metric_figure, view, name, smoothing, 260, marks),
                    key=f"live_auto_{name}_{run}",
                    window_key=wkey,
                )
    if left:
        st.caption(
            f"{len(left)} more metrics (the first {MAX_PANELS} are drawn): pick them on the Compare page."
        )
    return True
