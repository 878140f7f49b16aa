"""Widgets shared by the pages: a page's opening, the run picker bound to the URL, the step window,
and charts that zoom it.

Deep links: the chosen run lives in the URL (`?run=ID`, `?runs=a,b` on Compare),
so a link pastes into an issue and opens the same view.

Zoom: each chart group has a step window under key `K` in the session state. A
page reads it with `requested_window(K)` BEFORE querying, draws the slider with
`step_window(..., key=K)`, and `show_chart(..., window_key=K)` turns a box
selection on a chart into the next window (`K_box`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import streamlit as st
from _plotly_utils.utils import is_homogeneous_array, is_skipped_key, to_typed_array_spec  # plotly's own

from observatory.dashboard.cache import StoreBusy, derive, query
from observatory.dashboard.runs_table import PAGE, run_row, runs_table
from observatory.events import RUN_ID_RE
from observatory.markup import md_escape

__all__ = [
    "page_opening",
    "pick_run",
    "requested_window",
    "step_window",
    "show_chart",
    "apply_box",
    "wire_figure",
]


def page_opening(title: str, caption: str, fn: Callable, *args) -> Any | None:
    """A page's title and caption, then `query(fn, *args)`: the page's first answer.

    None, after a note saying so, when the store is busy.
    """
    st.title(title)
    st.caption(caption)
    try:
        return query(fn, *args)
    except StoreBusy as e:
        st.info(md_escape(e))
        return None


def pick_run(label: str = "Run", key: str = "run", prefer_running: bool = True) -> str | None:
    """A run picker bound to the `?run=` query parameter (deep link in, deep link out): a search box (the
    server-side run search, `core.search_runs`: id, prefix, name, tag, project, group) and a selectbox of
    at most `PAGE` matching runs, newest first (running ones first with `prefer_running`); a deep-linked
    run is among them when the store has it. Never a list of every run: a lab has 10^5."""
    wanted = st.query_params.get(key)
    if wanted is not None and not RUN_ID_RE.fullmatch(wanted):
        st.caption(f"Ignored `?{key}=`: not a run id (letters, digits, `.`, `_`, `-`; at most 128).")
        wanted = None
    c1, c2 = st.columns([1, 2])
    text = c1.text_input(
        f"Find a {label.lower()}", key=f"pick_{key}_q", placeholder="id, prefix, name, tag, project"
    )
    rows = runs_table(
        search=text.strip() or None, status=["running"] if prefer_running and not text else None
    )
    if prefer_running and not text:  # running runs first, then the newest others
        rows += [r for r in runs_table() if r["status"] != "running"]
        rows = rows[:PAGE]
    if (
        wanted and not text.strip() and wanted not in {r["run"] for r in rows}
    ):  # the link's run, unless searching
        row = run_row(wanted)
        rows = ([row] if row is not None else []) + rows
    if not rows:
        st.info(
            f"No run matches {md_escape(repr(text))}."
            if text.strip()
            else "No runs in the store yet. Start one with `trainer train` and `observatory ingest --follow`."
        )
        return None
    ids = [r["run"] for r in rows]
    status = {r["run"]: r["status"] for r in rows}
    choice = c2.selectbox(
        label,
        ids,
        index=ids.index(wanted) if wanted in ids else 0,
        key=f"pick_{key}",
        format_func=lambda r: f"{r}  ·  {status[r]}",
    )
    if choice is not None and st.query_params.get(key) != choice:
        st.query_params[key] = choice
    return choice


def requested_window(key: str) -> tuple[int | None, int | None]:
    """The step window to query for a chart group, from the widget state, BEFORE querying.

    (None, None) is "everything"; hi None is "to the newest step" (a window that
    reached the end keeps following a live run), lo None "from the first step". A
    box selection on a chart (see `show_chart`) wins. The query returns the window
    it used, and `step_window` then shows exactly that. A window at both ends is
    (None, None) on a first view and on every refresh, so all the viewers of the
    whole run ask the same query and share one cached answer.
    """
    box = st.session_state.get(f"{key}_box")
    if box is not None:
        return int(box[0]), int(math.ceil(box[1]))
    cur = st.session_state.get(key)
    if cur is None:
        return None, None
    prev_lo, prev_hi = st.session_state.get(f"{key}_lo"), st.session_state.get(f"{key}_hi")
    lo = None if prev_lo is not None and cur[0] <= prev_lo else int(cur[0])
    return lo, None if prev_hi is not None and cur[1] >= prev_hi else int(cur[1])


def step_window(first: int, last: int, key: str, used: tuple[int, int] | None = None) -> tuple[int, int]:
    """The step slider over [first, last], showing the window `used` by the query (default: all).

    Dragging it, or box-selecting on a chart, re-queries that window; a window
    narrower than the chart's bucket count comes back at full resolution.
    """
    st.session_state.pop(f"{key}_box", None)
    lo, hi = used if used is not None else (first, last)
    lo, hi = max(first, lo), min(last, hi)
    if hi < lo:
        lo, hi = first, last
    st.session_state[f"{key}_lo"], st.session_state[f"{key}_hi"] = first, last
    if last <= first:
        return first, last
    st.session_state[key] = (lo, hi)
    c1, c2 = st.columns([6, 1])
    with c1:
        window = st.slider("Steps", first, last, key=key, help="Drag here, or box-select on a chart, to zoom")
    with c2:
        st.button(
            "Reset zoom", key=f"{key}_reset", on_click=lambda: st.session_state.update({key: (first, last)})
        )
    return int(window[0]), int(window[1])


def show_chart(fig, key: str, window_key: str | None = None) -> None:
    """Render a figure (dict or plotly Figure); a box selection on it zooms `window_key`'s step window.

    A dict is put in plotly's wire form (`wire_figure`: every array base64-encoded, as
    `to_dict()` gives it) once for all sessions (`cache.derive`), and each session hands
    that to `st.plotly_chart` as it is: twenty viewers of a refreshing chart cost one
    conversion, not twenty (plotly's copy of every trace and its encoding of every array are
    most of a Live refresh's CPU). Our figures are built by the tested helpers in
    `dashboard.charts`, so plotly's property validation is skipped. The dict is left as it
    is, so one figure can serve many sessions at once.
    """
    if isinstance(fig, dict):
        fig = _Wired(derive(wire_figure, fig))
    if window_key is None:
        st.plotly_chart(fig, key=key, config={"displaylogo": False})
        return
    ev = st.plotly_chart(fig, key=key, on_select="rerun", selection_mode="box", config={"displaylogo": False})
    try:
        boxes = ev["selection"]["box"] if ev else []
    except (KeyError, TypeError):
        boxes = []
    if boxes:
        apply_box(key, window_key, boxes[0].get("x") or [])


def apply_box(key: str, window_key: str, xs, nonce=None) -> None:
    """A box selected on chart `key` (its x range `xs`) as `window_key`'s next step window: rerun once per
    new box (a selection persists across reruns; `nonce` tells two selections of one range apart)."""
    box = (min(xs), max(xs)) if len(xs) == 2 and all(isinstance(v, (int, float)) for v in xs) else None
    if box is not None and st.session_state.get(f"{key}_applied") != (box, nonce):
        st.session_state[f"{key}_applied"] = (box, nonce)
        st.session_state[f"{window_key}_box"] = box
        st.rerun()


def wire_figure(fig: dict) -> dict:
    """A figure dict as plotly's `Figure.to_dict()` gives it, without building the Figure.

    The same wire form: every homogeneous numpy array (outside the keys plotly skips) becomes a
    base64 typed array, by plotly's own `to_typed_array_spec`, and a layout without a template
    gets plotly's default one, as `Figure.__init__` adds it. The figure is not validated, and new
    containers are built, so `fig` is left as it is. Building the Figure (its validators, the
    template's objects, the deep copies in `to_dict`) cost 3-5x this (tests/test_dashboard_wire.py
    checks the two agree).
    """
    layout = _wired(fig.get("layout") or {})
    if "template" not in layout:
        layout["template"] = _default_template()  # shared by every figure: nothing writes to a wire dict
    return {"data": [_wired(t) for t in fig.get("data") or ()], "layout": layout}


def _wired(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {
            k: v if is_skipped_key(k) else to_typed_array_spec(v) if is_homogeneous_array(v) else _wired(v)
            for k, v in obj.items()
        }
    if isinstance(obj, (list, tuple)):
        return [_wired(v) for v in obj]
    return obj


def _default_template() -> dict:
    """The template `go.Figure()` puts in a layout that has none (plotly's current default), in wire form."""
    return _template(str(pio.templates.default))


@functools.lru_cache(maxsize=8)
def _template(name: str) -> dict:
    """Plotly's template `name` (the current default) in wire form, made once a name."""
    return go.Figure().to_dict()["layout"].get("template", {})


class _Wired(go.Figure):
    """A figure already in wire form (`wire_figure`): `st.plotly_chart` takes its `to_dict()` as it is.

    `st.plotly_chart` only asks a Figure for `to_dict()`, so this one skips plotly's
    `Figure.__init__` (its validators and template cost more than the chart's JSON). The wire
    dict is shared by every session showing the figure; nothing writes to it.
    """

    def __init__(self, wired: dict):  # noqa: D107 -- no Figure.__init__: see the class doc
        object.__setattr__(self, "_wired", wired)

    def to_dict(self) -> dict:
        return self._wired
