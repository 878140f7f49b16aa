"""What every dashboard page shares: cached store queries, the run picker, deep links, charts.

Queries: `query(fn, *args)` / `query_all((fn, *args), ...)` run `observatory.queries`
functions on ONE fresh read-only connection per batch (`observatory.store.connect`,
which waits out a busy store) and cache each result for `cache_ttl_s` seconds
across ALL sessions, one fill at a time, so a hundred viewers of a live run cost
one round of queries every couple of seconds. If the store stays busy past the
retry budget, the page shows the last good result (or a calm "store busy" note);
a lock error never reaches the page.

Deep links: the chosen run lives in the URL (`?run=ID`, `?runs=a,b` on Compare),
so a link pastes into an issue and opens the same view.

Charts: `series_figure` draws a downsampled series as a min-max band with the
last value per bucket as the line (a spike stays visible at any zoom), with
event markers carrying their text on hover.
"""

from __future__ import annotations

import html
import importlib
import json
import math
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import streamlit as st

from observatory import settings
from observatory.events import describe

__all__ = [
    "StoreBusy",
    "db_path",
    "query",
    "query_all",
    "lineage_module",
    "runs_table",
    "pick_run",
    "step_window",
    "requested_window",
    "smooth",
    "series_figure",
    "scatter",
    "add_markers",
    "marker_text",
    "show_chart",
    "ago",
    "STATUS_ICON",
]

STATUS_ICON = {
    "running": "🟢",
    "completed": "✅",
    "failed": "❌",
    "crashed": "💥",
    "preempted": "⏸️",
    "killed": "🛑",
}
MARKER_STYLE = {  # kind -> (symbol, colour)
    "failure": ("x", "#d62728"),
    "anomaly": ("triangle-up", "#ff7f0e"),
    "checkpoint": ("diamond", "#7f7f7f"),
    "config_diff": ("square", "#9467bd"),
    "decision": ("star", "#2ca02c"),
    "note": ("circle-open", "#17becf"),
    "run_end": ("line-ns", "#000000"),
}


class StoreBusy(RuntimeError):
    """The store stayed locked past the retry budget and no earlier result exists."""


def db_path() -> str:
    return str(settings.get("db"))


# key -> (monotonic time it goes stale, value). Shared by every session of this server process;
# stale entries stay as the last good answer for when the store is busy.
_CACHE: dict[str, tuple[float, Any]] = {}
_CACHE_LOCK = threading.Lock()
# One fill at a time per process: concurrent viewers that miss together wait for the first
# one's connection and then find its results cached (N viewers, one query).
_FILL_LOCK = threading.Lock()
_KEEP_S = 600.0  # how long a stale entry may serve as the "last good" answer


def _key(fn: Callable, args: tuple, kwargs: dict) -> str:
    name = f"{fn.__module__}:{fn.__qualname__}"
    return f"{db_path()}|{name}|{json.dumps([list(args), kwargs], sort_keys=True, default=_jsonable)}"


def _lookup(keys: list[str], now: float) -> dict[int, Any]:
    with _CACHE_LOCK:
        return {i: _CACHE[k][1] for i, k in enumerate(keys) if k in _CACHE and _CACHE[k][0] > now}


def query_all(*calls) -> list[Any]:
    """Several queries as one unit of work: cache hits are free, all misses share ONE connection.

    Each call is a tuple `(fn, arg1, arg2, ...)`; fn(con, *args) must be a module-level
    function and the args JSON-serialisable (they form the cache key). Results are cached for `cache_ttl_s` across all sessions. Opening the store
    costs more than most of these queries, hence the batching.
    """
    import duckdb

    from observatory import store

    parsed = [(c[0], tuple(c[1:])) for c in calls]
    keys = [_key(fn, args, {}) for fn, args in parsed]
    out = _lookup(keys, time.monotonic())
    if len(out) < len(keys):
        with _FILL_LOCK:
            out.update(_lookup(keys, time.monotonic()))  # filled while we waited?
            missing = [i for i in range(len(keys)) if i not in out]
            if missing:
                try:
                    with store.connect(db_path()) as con:
                        for i in missing:
                            fn, args = parsed[i]
                            out[i] = fn(con, *args)
                            _put(keys[i], out[i])
                except (duckdb.IOException, store.StoreBusy) as e:  # busy past the retry budget
                    if isinstance(e, duckdb.IOException) and "lock" not in str(e).lower():
                        raise
                    with _CACHE_LOCK:
                        stale = {i: _CACHE[keys[i]][1] for i in missing if keys[i] in _CACHE}
                    if len(stale) < len(missing):
                        raise StoreBusy(
                            "the store is being written right now; this view refreshes by itself"
                        ) from None
                    out.update(stale)
    return [out[i] for i in range(len(keys))]


def _put(key: str, value: Any) -> None:
    now = time.monotonic()
    with _CACHE_LOCK:
        _CACHE[key] = (now + float(settings.get("cache_ttl_s")), value)
        if len(_CACHE) > 4096:
            for k in [k for k, (t, _) in _CACHE.items() if t < now - _KEEP_S]:
                del _CACHE[k]


def query(fn: Callable, *args) -> Any:
    """`fn(con, *args)` on a read-only connection, cached for cache_ttl_s across sessions."""
    return query_all((fn, *args))[0]


def _jsonable(o: Any) -> Any:
    if isinstance(o, (set, frozenset, tuple)):
        return sorted(o) if isinstance(o, (set, frozenset)) else list(o)
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"query argument {o!r} is not JSON-serialisable")


def lineage_module():
    """The decisions engineer's `observatory.lineage` when present, else None."""
    try:
        return importlib.import_module("observatory.lineage")
    except ImportError:
        return None


# ------------------------------------------------------------------- runs


def runs_table() -> list[dict[str, Any]]:
    """Every run as a dict: run, name, status (crashed when stale), last_step, steps, progress,
    last_loss, tokens, ladder, tags, start_time, last_event_t, parent; newest first."""

    rows, extras = query_all(*runs_calls())
    extras = {r["run"]: r for r in extras.to_dicts()}
    out = []
    for r in rows:
        x = extras.get(r["run"], {})
        steps = x.get("planned_steps") or r.get("final_step")
        last = r.get("last_step") if r.get("last_step") is not None else x.get("last_metric_step")
        done = r.get("status") == "completed"
        progress = 1.0 if done else (min(1.0, (last + 1) / steps) if steps and last is not None else None)
        ladder = " / ".join(str(v) for v in (r.get("ladder_name"), r.get("ladder_rung")) if v)
        out.append(
            {
                "run": r["run"],
                "name": r.get("name") or r["run"],
                "status": r.get("status") or "unknown",
                "last_step": last,
                "steps": steps,
                "progress": progress,
                "last_loss": x.get("last_loss"),
                "tokens": x.get("tokens"),
                "ladder": ladder or None,
                "tags": list(r.get("tags") or []),
                "start_time": r.get("start_time"),
                "last_event_t": r.get("last_event_t") or x.get("last_metric_t"),
                "parent": r.get("parent_run"),
            }
        )
    out.sort(key=lambda r: -(r["start_time"] or r["last_event_t"] or 0))
    return out


def runs_calls() -> tuple[tuple, ...]:
    from observatory.queries import dashboard as qd

    return ((_runs_with_status,), (qd.runs_extras,))


def _runs_with_status(con) -> list[dict[str, Any]]:
    """The runs as the public should see them (a silent run without run_end is `crashed`).

    One definition of `crashed` for the CLI and the dashboard: `queries.core.list_runs`;
    this module-level wrapper exists so that `query_all` can cache it by name.
    """
    from observatory.queries import core

    return core.list_runs(con)


def pick_run(
    runs: list[dict[str, Any]], label: str = "Run", key: str = "run", prefer_running: bool = True
) -> str | None:
    """A run selectbox bound to the `?run=` query parameter (deep link in, deep link out)."""
    if not runs:
        st.info("No runs in the store yet. Start one with `trainer train` and `observatory ingest --follow`.")
        return None
    ids = [r["run"] for r in runs]
    wanted = st.query_params.get(key)
    if wanted not in ids:
        running = [r["run"] for r in runs if r["status"] == "running"] if prefer_running else []
        wanted = (running or ids)[0]
    status = {r["run"]: r["status"] for r in runs}
    choice = st.selectbox(
        label,
        ids,
        index=ids.index(wanted),
        key=f"pick_{key}",
        format_func=lambda r: f"{r}  ·  {status[r]}",
    )
    if st.query_params.get(key) != choice:
        st.query_params[key] = choice
    return choice


def requested_window(key: str) -> tuple[int | None, int | None]:
    """The step window to query for a chart group, from the widget state, BEFORE querying.

    (None, None) is "everything"; hi None is "to the newest step" (a window that
    reached the end keeps following a live run). A box selection on a chart
    (see `show_chart`) wins. The query returns the window it used, and
    `step_window` then shows exactly that.
    """
    box = st.session_state.get(f"{key}_box")
    if box is not None:
        return int(box[0]), int(math.ceil(box[1]))
    cur = st.session_state.get(key)
    if cur is None:
        return None, None
    prev_hi = st.session_state.get(f"{key}_hi")
    if prev_hi is not None and cur[1] >= prev_hi:
        return int(cur[0]), None
    return int(cur[0]), int(cur[1])


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
    st.session_state[f"{key}_hi"] = last
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


# ----------------------------------------------------------------- charts


def smooth(values: Iterable[float], weight: float) -> np.ndarray:
    """TensorBoard's debiased exponential moving average; NaN/inf points are kept as they are."""
    v = np.asarray(list(values), dtype=float)
    if weight <= 0 or v.size == 0:
        return v
    out = np.empty_like(v)
    acc, n = 0.0, 0
    for i, x in enumerate(v):
        if not math.isfinite(x):
            out[i] = x
            continue
        acc = acc * weight + (1 - weight) * x
        n += 1
        out[i] = acc / (1 - weight**n)
    return out


def scatter(**kw) -> dict[str, Any]:
    """A plotly scatter trace as a plain dict (figures are built as dicts and validated once, by
    st.plotly_chart: building them trace by trace with graph_objects took seconds per page)."""
    return {"type": "scatter", **{k: v for k, v in kw.items() if v is not None}}


def series_figure(
    df,
    title: str,
    smoothing: float = 0.0,
    x: str = "step",
    group: str | None = None,
    height: int = 300,
    log_y: bool = False,
) -> dict[str, Any]:
    """Downsampled series (columns x, min, max, last[, group]) as band + line per group; a figure dict.

    The band spans each bucket's min..max, so a spike survives downsampling; the
    line is the (optionally smoothed) last value per bucket; NaN/inf buckets get a
    red x at the top of the band.
    """
    data: list[dict[str, Any]] = []
    groups = (
        [(None, df)]
        if group is None
        else [(g, df.filter(df[group] == g)) for g in df[group].unique(maintain_order=True)]
    )
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    for i, (g, d) in enumerate(groups):
        if d.height == 0:
            continue
        color = palette[i % len(palette)]
        # numpy arrays travel as base64 typed arrays (NaN = gap): plotly's JSON encoder takes
        # ~10x longer on lists of floats, and that was most of a refresh
        xs = d[x].cast(pl.Float64).to_numpy()
        label = str(g) if g is not None else title
        wide = "n" in d.columns and d["n"].max() > 1
        lo_v = d["min"].cast(pl.Float64).to_numpy()
        hi_v = d["max"].cast(pl.Float64).to_numpy()
        if wide:
            data.append(
                scatter(
                    x=xs,
                    y=hi_v,
                    mode="lines",
                    line={"width": 0},
                    showlegend=False,
                    hoverinfo="skip",
                    legendgroup=label,
                )
            )
            data.append(
                scatter(
                    x=xs,
                    y=lo_v,
                    mode="lines",
                    line={"width": 0},
                    fill="tonexty",
                    fillcolor=_rgba(color, 0.18),
                    name=f"{label} min-max",
                    showlegend=False,
                    hoverinfo="skip",
                    legendgroup=label,
                )
            )
        last = d["last"].cast(pl.Float64).to_numpy()
        y = smooth(last, smoothing) if smoothing > 0 else last
        data.append(
            scatter(
                x=xs,
                y=np.where(np.isfinite(y), y, np.nan),
                mode="lines",
                name=label,
                line={"color": color, "width": 1.6},
                legendgroup=label,
                customdata=np.stack([lo_v, hi_v], axis=-1) if wide else None,
                hovertemplate=(
                    "%{x}: %{y:.5g} (min %{customdata[0]:.5g}, max %{customdata[1]:.5g})"
                    if wide
                    else "%{x}: %{y:.5g}"
                )
                + f"<extra>{label}</extra>",
            )
        )
        if smoothing > 0:  # the raw line faintly behind the smoothed one, like TensorBoard
            data.append(
                scatter(
                    x=xs,
                    y=np.where(np.isfinite(last), last, np.nan),
                    mode="lines",
                    line={"color": _rgba(color, 0.3), "width": 1},
                    showlegend=False,
                    hoverinfo="skip",
                    legendgroup=label,
                )
            )
        if "n_nonfinite" in d.columns:
            bad = d.filter(d["n_nonfinite"] > 0)
            if bad.height:
                top = (
                    float(np.nanmax(np.where(np.isfinite(last), last, np.nan)))
                    if np.isfinite(last).any()
                    else 0.0
                )
                data.append(
                    scatter(
                        x=bad[x].to_list(),
                        y=[top] * bad.height,
                        mode="markers",
                        name="NaN/inf",
                        marker={"symbol": "x", "color": "#d62728", "size": 10},
                        hovertemplate="%{x}: NaN or inf logged<extra></extra>",
                    )
                )
    layout = {
        "title": {"text": title, "font": {"size": 14}},
        "height": height,
        "margin": {"l": 40, "r": 10, "t": 36, "b": 30},
        "hovermode": "x unified" if group is None else "closest",
        "dragmode": "select",
        "legend": {"orientation": "h", "y": -0.2},
        "xaxis": {},
        "yaxis": {"type": "log"} if log_y else {},
        "shapes": [],
    }
    return {"data": data, "layout": layout}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def marker_text(kind: str, data: Any) -> str:
    """One line of hover text for an event marker: plotly hover renders a subset of HTML, so escaped."""
    return html.escape(f"{kind.replace('_', ' ')}: {describe(kind, data)}", quote=False)


def add_markers(fig: dict[str, Any], markers, y_at: float | None = None, lines: bool = True) -> None:
    """Event markers at their steps: one trace per kind (toggle in the legend), text on hover.

    markers: frame with kind, step, data. They sit at `y_at` (data units) so that
    hovering works; failures, config changes and decisions also get a dotted line.
    """
    if markers is None or markers.height == 0:
        return
    m = markers.filter(markers["step"].is_not_null())
    for kind in m["kind"].unique(maintain_order=True).to_list():
        d = m.filter(m["kind"] == kind)
        symbol, color = MARKER_STYLE.get(kind, ("circle", "#333333"))
        steps = d["step"].to_list()
        fig["data"].append(
            scatter(
                x=steps,
                y=[y_at] * len(steps),
                mode="markers",
                name=kind.replace("_", " "),
                marker={"symbol": symbol, "color": color, "size": 11, "line": {"width": 1}},
                text=[marker_text(kind, x) for x in d["data"].to_list()],
                hovertemplate="step %{x}<br>%{text}<extra></extra>",
            )
        )
        if lines and kind in ("failure", "config_diff", "decision"):
            fig["layout"].setdefault("shapes", []).extend(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "paper",
                    "x0": s,
                    "x1": s,
                    "y0": 0,
                    "y1": 1,
                    "line": {"color": color, "width": 1, "dash": "dot"},
                }
                for s in steps
            )


def show_chart(fig, key: str, window_key: str | None = None) -> None:
    """Render a figure (dict or plotly Figure); a box selection on it zooms `window_key`'s step window.

    A dict is wrapped without plotly's property validation (`_validate=False`): our
    figures are built by this module's tested helpers, and validating ~10^4 points
    per chart again on every 2 s refresh cost more than the queries.
    """
    if isinstance(fig, dict):
        import plotly.graph_objects as go

        fig = go.Figure(data=fig["data"], layout=fig["layout"], _validate=False)
    if window_key is None:
        st.plotly_chart(fig, key=key, config={"displaylogo": False})
        return
    ev = st.plotly_chart(fig, key=key, on_select="rerun", selection_mode="box", config={"displaylogo": False})
    try:
        boxes = ev["selection"]["box"] if ev else []
    except (KeyError, TypeError):
        boxes = []
    if boxes:
        xs = boxes[0].get("x") or []
        box = (min(xs), max(xs)) if len(xs) == 2 and all(isinstance(v, (int, float)) for v in xs) else None
        # the selection persists across reruns: zoom once per new box
        if box is not None and st.session_state.get(f"{key}_applied") != box:
            st.session_state[f"{key}_applied"] = box
            st.session_state[f"{window_key}_box"] = box
            st.rerun()


_after_paint = None


def after_first_paint(key: str) -> bool:
    """False until the browser has drawn a plotly chart on this page; then (about 1 s later) True.

    A zero-height component (`after_paint.js`, Streamlit's iframe-free v2 components): its
    state turning True reruns the script (or the fragment it sits in), so a page can send
    its first chart alone and the rest once that chart is on screen. Without a browser
    (AppTest) it stays False; the page's next run draws everything anyway.
    """
    global _after_paint
    if _after_paint is None:
        import streamlit.components.v2 as components

        js = (Path(__file__).parent / "after_paint.js").read_text()
        _after_paint = components.component("observatory_after_paint", js=js)
    res = _after_paint(key=key, default={"painted": False}, height=0, on_painted_change=lambda: None)
    return bool(getattr(res, "painted", False))


def ago(t: float | None, now: float | None = None) -> str:
    """'12 s ago', '3 min ago', '2.1 h ago', '4 d ago' (or 'never')."""
    if t is None:
        return "never"
    dt = max(0.0, (now or time.time()) - t)
    if dt < 90:
        return f"{dt:.0f} s ago"
    if dt < 5400:
        return f"{dt / 60:.0f} min ago"
    if dt < 172800:
        return f"{dt / 3600:.1f} h ago"
    return f"{dt / 86400:.0f} d ago"
