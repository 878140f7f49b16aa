"""Live run: the curves of one run, refreshed by themselves every 2 s while it runs.

The status line (status, last step, last loss, banners) and the live panel are
fragments, each with its own timer: the status line every 0.5 s from the cached run
table, so a new step's number shows about a second after the follower commits it;
the panel every 2 s (`st.fragment(run_every=2)`), so a refresh re-runs a handful of
cached queries, not the page. Loss comes first (with eval
points, the ladder forecast band and event markers), then the MoE and optimiser
health charts (on a first view of a run, once the browser has drawn the loss
chart: `dashboard.after_paint`), where per-layer router stats and drop fractions
(`router/layer_<i>/…`, `moe/layer_<i>/drop_fraction`) are one band across layers
with the worst layer named, however many layers the model has. A run that has
gone silent without `run_end` gets a banner. The loss chart also draws, thin and grey,
the newest earlier run with the same name and planned steps (the same recipe: e.g. the
previous `make demo` run), so a live run is seen against where the last one went.
A run that logged none of the loss names below (a W&B script's `loss`, `acc`) gets one panel per
metric, grouped by prefix, as W&B draws them (`dashboard.auto_panels`).
Below the panel, an expander holds the run's details: project, group, source,
summary, histograms and artifacts (`dashboard.run_details`).
"""

from __future__ import annotations

import json
import re
import time

import numpy as np
import polars as pl
import streamlit as st

from observatory import settings
from observatory.dashboard.after_paint import after_first_paint
from observatory.dashboard.auto_panels import render_auto
from observatory.dashboard.cache import derive, query, query_all
from observatory.dashboard.charts import (
    EPISODE_GAP,
    add_markers,
    band,
    layer_band,
    route_markers,
    scatter,
    series_figure,
    smooth,
    window_markers,
    x_range,
)
from observatory.dashboard.live_chart import live_chart
from observatory.dashboard.run_details import render_details
from observatory.dashboard.runs_table import PAGE, ago, is_running, run_row, runs_calls, runs_table
from observatory.dashboard.widgets import pick_run, requested_window, step_window
from observatory.events import RUN_ID_RE
from observatory.markup import md_escape, plot_text
from observatory.queries import dashboard as qd
from observatory.redact import redacted_note
from observatory.store.schema import PHASE_BUDGETED

REFRESH_S = 2  # the charts' refresh
# the status line's own refresh (last step, status, banners): one cached batch and a line of text, so a
# new step's number is on screen about a second after the follower commits it, between chart refreshes
STATUS_S = 0.5
# a linked step (`?step=`, an alert's link) opens a window of this share of the run either side of it
LINKED_SHARE = 0.05
LINKED_MIN = 10  # ... and at least this many steps either side
LINKED_COLOR = "#d62728"
LOSS = ("train/loss", "train/ce_loss")
# (title, metric names drawn together, log y, the y axis's title with its unit)
HEALTH = (
    ("Z-losses", ("train/z_loss", "router/z_loss"), True, "z-loss (log scale)"),
    ("Load-balancing loss", ("router/lb_loss",), False, "aux. loss"),
    ("Grad norm", ("grad/norm/total",), True, "global L2 norm (log scale)"),
    ("Learning rate", ("opt/lr",), False, "learning rate"),
    ("Throughput (tokens/s)", ("throughput/tokens_per_s",), False, "tokens / s"),
    ("Drop fraction", ("moe/drop_fraction",), False, "share of routed tokens dropped"),
)
LOSS_AXIS = "loss (nats / token)"
EVAL_COLORS = ("#111111", "#2ca02c", "#9467bd", "#8c564b")  # eval datasets: dark, unlike the train line
HEALTH_NAMES = [n for _, names, _, _ in HEALTH for n in names if n not in LOSS]


def axis_title(metric: str) -> str:
    """A metric's y axis title with its unit, as the Live page writes it (any other name: itself, escaped)."""
    if metric in settings.LOSS_NAMES:
        return LOSS_AXIS
    for _, names, _log_y, y_title in HEALTH:
        if metric in names:
            return y_title
    return plot_text(metric)


# per-layer metrics drawn as one band across layers (min-max, the layers' mean, the worst layer named)
# in the health chart of the same title: 48 layers make two legend entries, not 48
LAYER_FAMILIES = {
    "Z-losses": "router/layer_*/z_loss",
    "Load-balancing loss": "router/layer_*/lb_loss",
    "Drop fraction": "moe/layer_*/drop_fraction",
}
ALL_NAMES = tuple(dict.fromkeys(LOSS + tuple(HEALTH_NAMES)))
# where a finding is drawn: the chart of its metric (fnmatch patterns: each health chart's metrics, their
# per-layer families, and the nearest chart for metrics this page does not draw); the rest on the loss chart
FINDING_CHARTS = {
    "loss": (),
    "Z-losses": ("train/z_loss", "router/z_loss", "router/layer_*/z_loss"),
    "Load-balancing loss": ("router/lb_loss", "router/layer_*/lb_loss"),
    "Grad norm": ("grad/*", "opt/update_norm", "opt/param_norm"),
    "Learning rate": ("opt/lr",),
    "Throughput (tokens/s)": ("throughput/*", "sys/*"),
    "Drop fraction": ("moe/*drop_fraction", "expert_load/*"),
}
# a running run silent for this long gets a warning (it is `crashed` after settings.stale_after_s)
QUIET_S = 30.0


def forecast_traces(forecasts: list[dict], metric_names=LOSS) -> list[dict]:
    """The ladder forecast band (low..high) and centre line from forecast events' points.

    Uses points [{step, value, low, high}] when present, else one error-bar point at
    target_step. Only forecasts of a drawn metric (or of eval loss) are returned.
    """
    out = []
    for i, f in enumerate(forecasts):
        metric = str(f.get("metric", ""))
        if metric and metric not in metric_names and "loss" not in metric:
            continue
        src = f.get("source") or {}
        label = plot_text(f"forecast {metric}") + plot_text(
            f" ({src.get('ladder') or src.get('name')})"
            if isinstance(src, dict) and (src.get("ladder") or src.get("name"))
            else ""
        )
        pts = [p for p in (f.get("points") or []) if isinstance(p, dict) and p.get("step") is not None]
        if pts:
            pts.sort(key=lambda p: p["step"])
            xs = [p["step"] for p in pts]
            hi = [p.get("high", p.get("value")) for p in pts]
            lo = [p.get("low", p.get("value")) for p in pts]
            out.extend(band(xs, lo, hi, "rgba(148,103,189,0.18)", label, f"fc{i}", showlegend=True))
            out.append(
                scatter(
                    x=xs,
                    y=[p.get("value") for p in pts],
                    mode="lines",
                    name=label,
                    line={"color": "#9467bd", "dash": "dash", "width": 1.2},
                    legendgroup=f"fc{i}",
                    showlegend=False,
                    hovertemplate="%{x}: forecast %{y:.4g}<extra></extra>",
                )
            )
        elif f.get("target_step") is not None and f.get("value") is not None:
            v = float(f["value"])
            err_hi = float(f.get("high", v)) - v
            err_lo = v - float(f.get("low", v))
            out.append(
                scatter(
                    x=[f["target_step"]],
                    y=[v],
                    mode="markers",
                    name=label,
                    marker={"symbol": "diamond-open", "size": 12, "color": "#9467bd"},
                    error_y={"type": "data", "symmetric": False, "array": [err_hi], "arrayminus": [err_lo]},
                    hovertemplate="forecast at step %{x}: %{y:.4g}<extra></extra>",
                )
            )
    return out


def previous_run(rows: list[dict], run: str) -> str | None:
    """The newest run started before `run` with its name and planned steps (runs_table rows), or None."""
    me = next((r for r in rows if r["run"] == run), None)
    if me is None or not me["steps"] or me["start_time"] is None:
        return None
    earlier = [
        r
        for r in rows
        if r["run"] != run
        and r["name"] == me["name"]
        and r["name"] != r["run"]  # a name that is only the id says nothing about the recipe
        and r["steps"] == me["steps"]
        and r["start_time"] is not None
        and r["start_time"] < me["start_time"]
    ]
    return max(earlier, key=lambda r: r["start_time"])["run"] if earlier else None


def previous_trace(prev: str, d, smoothing: float = 0.0) -> dict:
    """The previous run's loss (bucket means, smoothed as this run's line is) as a grey dashed line, drawn
    over this run's: where the two coincide its dashes still show. Its legend entry says what it is."""
    return scatter(
        x=d["step"].to_list(),
        y=smooth(d["mean"].cast(pl.Float64).to_numpy(), smoothing),
        mode="lines",
        name=f"previous run {prev} (same name and steps)",
        line={"color": "rgba(90,90,90,0.85)", "width": 2, "dash": "dash"},
        hovertemplate="%{x}: %{y:.4g}<extra>previous run " + prev + "</extra>",
    )


def banner(row: dict, now: float) -> tuple[str, str] | None:
    """The banner over a run's charts as (level: error, warning or info; Markdown text), or None."""
    status = row["status"]
    last = row["last_event_t"]
    silent = now - last if last else None
    if status == "crashed":
        return "error", (
            f"**Crashed**: no `run_end` and no event for {ago(last, now).replace(' ago', '')} "
            f"(a run silent for more than {settings.get('stale_after_s'):.0f} s is shown as crashed, "
            "unless it is in an init, compile, eval or checkpoint phase within its budget)."
        )
    if status in ("failed", "killed"):
        return "error", f"**{status.capitalize()}** at step {row['last_step']}."
    if status == "preempted":
        return "warning", f"**Preempted** at step {row['last_step']}; it may be resumed."
    if status == "running" and silent is not None and silent > QUIET_S:
        phase, since = row.get("phase"), row.get("phase_t")
        budget = row.get("phase_budget_s") or settings.get("phase_budget_s")
        if phase in PHASE_BUDGETED and since is not None and now - since <= budget:  # as `crashed_sql` allows
            return "info", (
                f"**In {md_escape(phase)}** for {ago(since, now).replace(' ago', '')} "
                f"(allowed {budget / 60:.0f} min before it counts as a hang)."
            )
        return "warning", f"**Stale**: running, but no event for {ago(last, now).replace(' ago', '')}."
    return None


def crash_loop_note(marks) -> str | None:
    """The newest crash-loop finding's message ("crash loop: 2 attempts failed at step 60 with InjectedCrash")
    among a run's markers (`qd.markers`), or None."""
    if marks is None or not marks.height:
        return None
    found = None
    for kind, data in zip(marks["kind"].to_list(), marks["data"].to_list(), strict=True):
        if kind == "anomaly" and data and '"crash_loop"' in data:
            d = json.loads(data)
            if d.get("detector") == "crash_loop" and isinstance(d.get("message"), str):
                found = d["message"][:300]
    return found


def _banner(row: dict, now: float) -> None:
    shown = banner(row, now)
    if shown is not None:
        getattr(st, shown[0])(shown[1])


def panel_calls(run: str) -> list[tuple]:
    """The live panel's queries (one batch, one connection): series in the window, markers, evals, forecasts."""
    return [
        # the loss at 1,000 buckets, the half-width health charts at 300 (each point costs the browser)
        (
            qd.live_view,
            run,
            list(LOSS),
            HEALTH_NAMES,
            *requested_window(f"live_window_{run}"),
            1000,
            300,
            list(LAYER_FAMILIES.values()),
            True,
        ),
        (qd.markers, run),
        (qd.evals, run),
        (qd.forecasts, run),
        (qd.metric_names_for, [run]),
    ]


SMOOTH_KEY = "live_smoothing"
SMOOTHING = 0.6  # on by default (TensorBoard's default weight): the raw curve is drawn faintly behind


def _smoothing() -> float:
    """The smoothing slider's value, read before the chart it applies to (the slider sits below it).

    A shadow key keeps the value over runs that do not draw the slider (a run's first view).
    """
    return float(st.session_state.get(SMOOTH_KEY, st.session_state.get(f"_{SMOOTH_KEY}", SMOOTHING)))


def _controls(first: int, last: int, wkey: str, window: tuple[int, int]) -> None:
    """Under the loss chart: smoothing, the step window and its reset."""
    c1, c2 = st.columns([1, 4])
    with c1:
        st.session_state[SMOOTH_KEY] = _smoothing()
        value = st.slider(
            "Smoothing",
            0.0,
            0.99,
            step=0.01,
            key=SMOOTH_KEY,
            help="exponential moving average of the plotted line (the band stays raw)",
        )
        st.session_state[f"_{SMOOTH_KEY}"] = value
    with c2:
        step_window(first, last, key=wkey, used=window)


def _status(run: str, live: bool = False) -> None:
    """The banner (crashed, failed, preempted, stale) and the status line: its own fragment, refreshed
    every `STATUS_S` while the run is live, from the cached run table (kept fresh by the cache's keeper).
    It is also the panel's watch: when the panel's data has changed since it was drawn (`panel_version`),
    and the last redraw is at least `REFRESH_S` and its own duration ago, the page reruns once and the
    panel is redrawn; with nothing new, the charts are left as they are. When a live run ends, the whole
    page reruns once, as a finished run's page without timers."""
    row = run_row(run, keep_fresh=live)
    if row is None:
        st.warning(f"Run {md_escape(repr(run))} is not in the store.")
        return
    if live and row["status"] != "running":
        st.rerun()  # it has ended (or gone silent): the page is redrawn as a finished run's, and stops polling
    if live and _redraw_due(run):
        st.rerun()
    now = time.time()
    _banner(row, now)
    st.markdown(status_line(row, now))


def _panel_batch(run: str, live: bool) -> list:
    """The live panel's cached batch on one connection: the run's row, its series, markers, evals, forecasts
    and metric names; a live run's is kept fresh in the background while viewers watch it."""
    return query_all(*runs_calls(runs=[run], limit=1), *panel_calls(run), keep_fresh=live)


def panel_version(rows, view, marks, evals, fcs, names) -> tuple:
    """What the panel's charts show, in a few values: it changes when the run has new data for them
    (a new step or event, a new finding, eval or forecast, a new metric), and only then."""
    row = rows[0] if rows else {}
    return (
        row.get("status"),
        row.get("last_step"),
        row.get("last_event_t"),
        view["extent"],
        marks.height,
        evals.height,
        len(fcs),
        len(names),
    )


def _redraw_due(run: str) -> bool:
    """Whether the panel should be redrawn now: new data since its last draw, and the last draw ended at
    least `REFRESH_S` and its own duration ago (a page slower to draw than the data comes is redrawn
    as fast as it draws, never faster)."""
    key = f"live_drawn_v_{run}"
    drawn = st.session_state.get(key)
    if drawn is None:
        return False  # not drawn yet: the panel is on its way
    version, at, took = drawn
    now = time.monotonic()
    if now - at < max(REFRESH_S, took) or derive(panel_version, *_panel_batch(run, True)) == version:
        return False
    # the page's rerun runs this line again before it reaches the panel: not due again until it has drawn
    st.session_state[key] = (version, now, took)
    return True


def _panel(run: str, live: bool = False, at: int | None = None) -> None:
    t0 = time.monotonic()
    batch = _panel_batch(run, live)
    view, all_marks, evals, fcs, names = batch[1:]
    me = run_row(run, keep_fresh=live)  # from the batch above
    version = derive(panel_version, *batch)
    try:
        _draw(run, live, me, view, all_marks, evals, fcs, names, at)
    finally:  # what was drawn, when, and how long it took: the status line's watch redraws from there
        st.session_state[f"live_drawn_v_{run}"] = (version, time.monotonic(), time.monotonic() - t0)


def _draw(run: str, live: bool, me, view, all_marks, evals, fcs, names, at: int | None = None) -> None:
    if me is None:
        return  # the status line above says so
    if (loop := crash_loop_note(all_marks)) is not None:
        st.error(f"**{md_escape(loop)}**")
    wkey = f"live_window_{run}"
    if not set(LOSS) & set(names):  # none of our loss names (a W&B script's `loss`, `acc`): W&B's panels
        if not render_auto(run, names, all_marks, _smoothing(), live, _controls):
            st.info("No metrics logged yet for this run.")
        return
    if view["extent"] is None:
        st.info("No metrics logged yet for this run.")
        return
    lo, hi = view["window"]
    smoothing = _smoothing()
    # the figures are pure functions of the shared cached results: built once for all viewers
    loss_name = derive(_loss_name, view)
    if loss_name is not None:
        prev = previous_run(runs_table(name=me["name"], limit=PAGE), run)  # the runs of its name
        pd_ = query(qd.downsample, prev, [loss_name], lo, hi, 1000) if prev is not None else None
        fig = derive(loss_figure, view, all_marks, evals, fcs, prev, pd_, smoothing, at)
        live_chart(fig, key=f"live_loss_{run}", window_key=wkey)
    else:
        st.info("No `train/loss` logged in this window.")

    drawn = f"live_drawn_{run}"
    if loss_name is not None and not st.session_state.get(drawn):
        # First view of this run: the browser draws the loss chart alone; once it is on screen
        # the component's value reruns this panel, which then adds the controls under the chart
        # and the six health charts. The loss chart waits neither for the other six charts nor
        # for the sliders' widget code; waiting for the paint, not a timer, holds on a slow
        # first paint too.
        st.session_state[drawn] = True
        st.caption("Loading the chart controls and health charts…")
        after_first_paint(f"live_painted_{run}")
        return
    _controls(*view["extent"], wkey, (lo, hi))
    cols = st.columns(2)
    for i, (title, fig) in enumerate(derive(health_figures, view, all_marks, smoothing, at)):
        with cols[i % 2]:
            if fig is None:
                st.caption(f"{title}: not logged")
            else:
                live_chart(fig, key=f"live_{i}_{run}", window_key=wkey)


def _loss_name(view: dict) -> str | None:
    data = view["data"]
    return next((n for n in LOSS if data.filter(data["name"] == n).height), None)


def _routed(view: dict, all_marks) -> dict:
    """The window's markers by chart: findings on their metric's chart (FINDING_CHARTS), the rest on the loss's."""
    return route_markers(window_markers(view, all_marks), FINDING_CHARTS, "loss")


def linked_step(raw, last_step) -> int | None:
    """The step an alert's link asks for (`?step=`): a plain integer in [0, the run's last step]; else None
    (ignored: not a number, a sign, a fraction, an exponent, or a step the run never reached)."""
    if not isinstance(raw, str) or last_step is None or not re.fullmatch(r"[0-9]{1,18}", raw):
        return None
    step = int(raw)
    return step if step <= int(last_step) else None


def linked_window(step: int, last_step: int) -> tuple[int, int]:
    """The window a linked step opens on: `LINKED_SHARE` of the run (at least `LINKED_MIN` steps) either side."""
    half = max(LINKED_MIN, round(LINKED_SHARE * last_step))
    return max(0, step - half), step + half


def _focus(run: str, last_step) -> int | None:
    """Honour `?step=` once per link: zoom the charts' window around it (as a box selection would: the
    user can widen it again), and return it to be marked while it is in the window."""
    step = linked_step(st.query_params.get("step"), last_step)
    if step is None:
        return None
    seen = f"live_linked_{run}"
    if st.session_state.get(seen) != step:
        st.session_state[seen] = step
        st.session_state[f"live_window_{run}_box"] = linked_window(step, int(last_step))
    return step


def mark_linked(fig: dict, step: int | None, window: tuple[int, int]) -> None:
    """A vertical line at the linked step (an alert's), when it is in the window."""
    if step is None or not window[0] <= step <= window[1]:
        return
    fig["layout"].setdefault("shapes", []).append(
        {
            "type": "line",
            "name": "linked step",
            "xref": "x",
            "yref": "paper",
            "x0": step,
            "x1": step,
            "y0": 0,
            "y1": 1,
            "line": {"color": LINKED_COLOR, "width": 2, "dash": "dash"},
        }
    )
    fig["layout"].setdefault("annotations", []).append(
        {
            "x": step,
            "xref": "x",
            "y": 1,
            "yref": "paper",
            "text": f"step {step}",
            "showarrow": False,
            "yanchor": "bottom",
            "font": {"color": LINKED_COLOR},
        }
    )


def loss_figure(
    view: dict, all_marks, evals, fcs, prev: str | None, prev_data, smoothing: float, at: int | None = None
) -> dict:
    """The loss chart: the run's loss in the window, the previous run, eval points, forecasts, markers,
    and the linked step `at` (an alert's link)."""
    lo, hi = view["window"]
    data = view["data"]
    loss_name = _loss_name(view)
    d = data.filter(data["name"] == loss_name)
    fig = series_figure(d, loss_name, smoothing, height=420, y_title=LOSS_AXIS)
    if prev_data is not None and prev_data.height:  # over the run's own line: seen where the two coincide
        fig["data"].append(previous_trace(prev, prev_data, smoothing))
    if evals.height:  # over the noisy train curve: large points, outlined
        ev = evals.filter((evals["step"] >= lo) & (evals["step"] <= hi))
        for i, ds in enumerate(ev["dataset"].unique(maintain_order=True).to_list()):
            e = ev.filter(ev["dataset"] == ds)
            color = EVAL_COLORS[i % len(EVAL_COLORS)]
            fig["data"].append(
                scatter(
                    x=e["step"].to_list(),
                    y=e["loss"].to_list(),
                    mode="lines+markers",
                    name=plot_text(f"eval {ds}"),
                    line={"color": color, "width": 1.5},
                    marker={"color": color, "size": 9, "line": {"color": "white", "width": 1.5}},
                    cliponaxis=False,
                    hovertemplate="%{x}: eval %{y:.4g}<extra>"
                    + plot_text(ds).replace("%", "%%")
                    + "</extra>",
                )
            )
    fig["data"].extend(forecast_traces(fcs))
    finite = d["max"].drop_nulls()
    marks = _routed(view, all_marks)["loss"]
    add_markers(fig, marks, y_at=float(finite.max()) if finite.len() else None, gap=EPISODE_GAP * (hi - lo))
    mark_linked(fig, at, (lo, hi))
    fig["layout"]["xaxis"]["range"] = x_range(lo, hi, marks)
    return fig


def status_line(row: dict, now: float) -> str:
    """One Markdown line of the run's status, last step, last loss and time since its last event.

    A line, not four `st.metric` cards, whose widget code would delay the first chart.
    """
    step = "—" if row["last_step"] is None else f"{row['last_step']:,}"
    loss = "—" if row["last_loss"] is None else f"{row['last_loss']:.4f}"
    color = {"running": "green", "completed": "blue", "preempted": "orange"}.get(row["status"], "red")
    return (
        f"**Status** :{color}-badge[{row['status']}] · **Last step** {step} · "
        f"**Last loss** {loss} · **Since last event** {ago(row['last_event_t'], now)}"
        + (f" · {redacted_note(row['redactions'])}" if row.get("redactions") else "")
    )


def health_figures(
    view: dict, all_marks, smoothing: float, at: int | None = None
) -> list[tuple[str, dict | None]]:
    """The six MoE and optimiser health charts as (title, figure or None when not logged);
    per-layer metrics as a band across layers; each with its own findings, failures and config changes;
    the linked step `at` marked."""
    lo, hi = view["window"]
    data, bands, drop = view["data"], view["bands"], view["drop"]
    routed = _routed(view, all_marks)
    out: list[tuple[str, dict | None]] = []
    for title, names, log_y, y_title in HEALTH:
        d = data.filter(data["name"].is_in(list(names)))
        if d.height == 0 and "moe/drop_fraction" in names and drop is not None and drop.height:
            d = drop  # no drop fraction metric: the one computed from the expert loads (rollup)
        fam = LAYER_FAMILIES.get(title)
        layers = bands["data"].filter(bands["data"]["family"] == fam) if bands and fam else None
        if d.height == 0 and (layers is None or layers.height == 0):
            out.append((title, None))
            continue
        group = "name" if "name" in d.columns and d["name"].n_unique() > 1 else None
        positive = d["min"].drop_nulls()
        if layers is not None and layers.height:
            positive = pl.concat([positive, layers["min"].drop_nulls()])
        fig = series_figure(
            d,
            title,
            smoothing,
            group=group,
            height=260,
            log_y=log_y and positive.len() > 0 and float(positive.min()) > 0,
            y_title=y_title,
            extra=layers,
        )
        top = d["max"].drop_nulls()
        if layers is not None and layers.height:
            fig["data"][:0] = layer_band(layers, "layers")  # behind the run-level line
            worst = bands["worst"].get(fam)
            if worst:
                fig["layout"]["title"]["text"] = (
                    f"{title} · worst: layer {worst['layer']} ({worst['mean']:.3g})"
                )
            top = pl.concat([top.cast(pl.Float64), layers["max"].drop_nulls()])
        # its own findings, and the run's failures and config changes
        marks = pl.concat(
            [routed[title], routed["loss"].filter(routed["loss"]["kind"].is_in(["failure", "config_diff"]))]
        )
        add_markers(  # small charts: no lines
            fig,
            marks,
            y_at=float(np.nanmax(top.to_numpy())) if top.len() else None,
            lines=False,
            gap=EPISODE_GAP * (hi - lo),
        )
        mark_linked(fig, at, (lo, hi))
        fig["layout"]["xaxis"]["range"] = x_range(lo, hi, marks)
        out.append((title, fig))
    return out


def render() -> None:
    st.title("Live run")
    wanted = st.query_params.get("run")
    if (
        wanted and RUN_ID_RE.fullmatch(wanted)
    ):  # a deep link (a bad one is never queried: pick_run notes it): fetch the run list and the panel's data on one connection
        query_all(*runs_calls(runs=[wanted], limit=1), *panel_calls(wanted))
    with st.columns([3, 1])[0]:  # a run picker three quarters wide
        run = pick_run()
    if run is None:
        return
    row = run_row(run)
    live = is_running(row)
    at = None
    if run == wanted:
        at = _focus(run, row and row["last_step"])
    elif "step" in st.query_params:  # the link's step was another run's
        del st.query_params["step"]
    st.caption(
        f"Live: the charts are redrawn when the run has new data, at most every {REFRESH_S} s; "
        f"the status line every {STATUS_S:g} s."
        if live
        else "Not running: shown as of its last event."
    )
    # the status line refreshes itself and watches for new data; the panel is redrawn only when there is some
    st.fragment(run_every=STATUS_S if live else None)(_status)(run, live)
    with st.container(key="live_panel"):
        st.fragment(_panel)(run, live, at)
    render_details(run)
