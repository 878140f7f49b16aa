"""Plotly figures as plain dicts: downsampled series as min-max bands, and event markers.

`series_figure` draws a downsampled series as a min-max band with the last value
per bucket as the line (a spike stays visible at any zoom); `layer_band` sums up
one metric of every MoE layer as a band across layers with their mean and the
worst layer on hover; `layer_heatmap` and `expert_heatmap` are the Experts page's
layer x step and expert x step heatmaps, sized to their row count (48 layers,
384 experts) with thinned tick labels; `add_markers` adds event markers carrying
their text (`observatory.events.describe`) on hover.
Figures are dicts, not plotly objects: `widgets.show_chart` wraps each once,
without validating it again.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl

from observatory.events import describe
from observatory.markup import plot_text

__all__ = [
    "smooth",
    "scatter",
    "band",
    "series_figure",
    "layer_band",
    "layer_heatmap",
    "expert_heatmap",
    "marker_text",
    "add_markers",
    "route_markers",
    "log_ticks",
    "x_range",
    "finding_episodes",
    "SEVERITY_STYLE",
    "window_markers",
]

MARKER_STYLE = {  # kind -> (symbol, colour)
    "failure": ("x", "#d62728"),
    "anomaly": ("triangle-up", "#ff7f0e"),
    "checkpoint": ("diamond", "#7f7f7f"),
    "config_diff": ("square", "#9467bd"),
    "decision": ("star", "#2ca02c"),
    "note": ("circle-open", "#17becf"),
    "run_end": ("line-ns", "#000000"),
    "alert": ("bowtie", "#e377c2"),  # an alert opened or resolved (`observatory alerts`)
}


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
    """A plotly scatter trace as a plain dict (None values left out).

    Figures are built as dicts, not trace by trace with graph_objects, whose per-property
    validation costs seconds on a page of charts."""
    return {"type": "scatter", **{k: v for k, v in kw.items() if v is not None}}


def band(x, lo, hi, fillcolor: str, name: str, legendgroup: str, showlegend: bool = False) -> list[dict]:
    """A filled band from lo to hi as two traces: an invisible upper edge, then the lower edge filled up to it."""
    return [
        scatter(
            x=x,
            y=hi,
            mode="lines",
            line={"width": 0},
            showlegend=False,
            hoverinfo="skip",
            legendgroup=legendgroup,
        ),
        scatter(
            x=x,
            y=lo,
            mode="lines",
            line={"width": 0},
            fill="tonexty",
            fillcolor=fillcolor,
            name=name,
            showlegend=showlegend,
            hoverinfo="skip",
            legendgroup=legendgroup,
        ),
    ]


def series_figure(
    df,
    title: str,
    smoothing: float = 0.0,
    x: str = "step",
    group: str | None = None,
    height: int = 300,
    log_y: bool = False,
    y_title: str | None = None,
    extra=None,
) -> dict[str, Any]:
    """Downsampled series (columns x, min, max, last[, group]) as band + line per group; a figure dict.

    The band spans each bucket's min..max, so a spike survives downsampling; the
    line is the (optionally smoothed) last value per bucket, the raw line faintly
    behind it; NaN/inf buckets get a red x at the top of the band. Axis titles: `x`
    and `y_title`; a log y axis gets 1-2-5 ticks written out (`log_ticks`) over the
    values of `df` and of `extra` (a frame with min and max drawn on the same axis).
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
        # numpy arrays travel as base64 typed arrays (NaN = gap): plotly's JSON encoder is
        # an order of magnitude slower on lists of floats
        xs = d[x].cast(pl.Float64).to_numpy()
        label = plot_text(g if g is not None else title)
        wide = "n" in d.columns and d["n"].max() > 1
        lo_v = d["min"].cast(pl.Float64).to_numpy()
        hi_v = d["max"].cast(pl.Float64).to_numpy()
        if wide:
            data.extend(band(xs, lo_v, hi_v, _rgba(color, 0.18), f"{label} min-max", label))
        last = d["last"].cast(pl.Float64).to_numpy()
        y = smooth(last, smoothing) if smoothing > 0 else last
        if smoothing > 0:  # the raw line faintly behind the smoothed one, like TensorBoard
            data.append(
                scatter(
                    x=xs,
                    y=np.where(np.isfinite(last), last, np.nan),
                    mode="lines",
                    name=f"{label} (raw)",
                    line={"color": _rgba(color, 0.3), "width": 1},
                    showlegend=False,
                    hoverinfo="skip",
                    legendgroup=label,
                )
            )
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
        "xaxis": {"title": {"text": x, "standoff": 4}, "automargin": True},
        # the margin grows to hold the tick labels and the title side by side; small values as "3e-04",
        # not plotly's SI prefixes ("300µ")
        "yaxis": {
            "automargin": True,
            "exponentformat": "e",
            **({"title": {"text": y_title}} if y_title else {}),
        },
        "shapes": [],
    }
    vals = [df["min"], df["max"]] + ([extra["min"], extra["max"]] if extra is not None else [])
    v = np.concatenate([c.cast(pl.Float64).drop_nulls().to_numpy() for c in vals])
    v = v[np.isfinite(v)]
    if log_y:
        v = v[v > 0]
        layout["yaxis"].update(
            {"type": "log", **(log_ticks(float(v.min()), float(v.max())) if v.size else {})}
        )
    elif v.size and v.max() - v.min() <= 1e-9 * np.abs(v).max():
        # a constant (an LR of 3e-4, maybe with float noise): plotly would zoom into the noise of the
        # smoothed line and label it "2.9999999999999999556e-4"; the axis is drawn around the value instead
        c = float(np.median(v))
        layout["yaxis"]["range"] = [c - 0.05 * abs(c), c + 0.05 * abs(c)]
    return {"data": data, "layout": layout}


def log_ticks(lo: float, hi: float) -> dict[str, Any]:
    """Ticks for a log axis over [lo, hi] (> 0), each written out ("0.002", "5e-05", "300"): 1-2-5 in
    each decade over at most two decades, 1-3 over up to five, every decade (or every k-th) beyond; under
    half a decade, evenly spaced round values. (Plotly's own labels the minor ticks of a log axis by
    their first digit alone: "5, 2, 10, 5, 2, 1".)"""
    if hi <= lo or math.log10(hi / lo) < 0.5:
        rough = (hi - lo) / 4 if hi > lo else abs(lo) / 4 or 1.0
        mag = 10.0 ** math.floor(math.log10(rough))
        step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= rough)
        vals = [k * step for k in range(math.floor(lo / step), math.ceil(hi / step) + 1) if k * step > 0]
    else:
        a, b = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
        span = b - a
        mants = (1, 2, 5) if span <= 2 else (1, 3) if span <= 5 else (1,)
        every = max(1, math.ceil(span / 10))
        vals = [m * 10.0**e for e in range(a, b + 1) if (e - a) % every == 0 for m in mants]
        # at most one tick below lo and one above hi: the ones the axis's range shows
        vals = [v for v in vals if v >= max([x for x in vals if x <= lo], default=0)]
        vals = [v for v in vals if v <= min([x for x in vals if x >= hi], default=math.inf)]
    return {"tickmode": "array", "tickvals": vals, "ticktext": [f"{round(v, 12):g}" for v in vals]}


def x_range(lo: int, hi: int, markers=None, pad: float = 0.015) -> list[float]:
    """A chart's step range: the window [lo, hi], reaching back to its markers before lo (a decision at
    step 0 of a run that logs from step 1), padded a little so that nothing at either end is cut."""
    first = lo
    if markers is not None and markers.height:
        steps = markers["step"].drop_nulls()
        if steps.len():
            first = min(lo, int(steps.min()))
    span = max(hi - first, 1)
    return [first - pad * span, hi + pad * span]


def window_markers(view: dict, markers):
    """The markers in a `live_view`'s step window; a window from the run's first logged step also keeps
    those before it (a decision recorded at step 0 of a run whose first logged step is 1)."""
    lo, hi = view["window"]
    first = view["extent"][0] if view.get("extent") else lo
    lo = min(0, lo) if lo <= first else lo
    return markers.filter(markers["step"].is_null() | markers["step"].is_between(lo, hi))


def layer_band(bands, label: str = "layers", color: str = "#8c564b") -> list[dict[str, Any]]:
    """One metric of every layer as a band across layers (min-max) and their mean; the worst layer on hover.

    bands: frame of `queries.dashboard.layer_bands` for one family (step, min, max,
    mean, worst_layer, n_layers). Two legend entries, however many layers.
    """
    if bands is None or bands.height == 0:
        return []
    xs = bands["step"].cast(pl.Float64).to_numpy()
    lo = bands["min"].cast(pl.Float64).to_numpy()
    hi = bands["max"].cast(pl.Float64).to_numpy()
    n = int(bands["n_layers"].max())
    out = band(xs, lo, hi, _rgba(color, 0.2), f"{n} {label}, min-max", f"layers {label}", True)
    out.append(
        scatter(
            x=xs,
            y=bands["mean"].cast(pl.Float64).to_numpy(),
            mode="lines",
            name=f"{n} {label}, mean",
            line={"color": color, "width": 1.2, "dash": "dot"},
            legendgroup=f"layers {label}",
            customdata=np.stack([lo, hi, bands["worst_layer"].cast(pl.Float64).to_numpy()], axis=-1),
            hovertemplate="%{x}: layer mean %{y:.4g}, min %{customdata[0]:.4g}, "
            "max %{customdata[1]:.4g} (layer %{customdata[2]})" + f"<extra>{label}</extra>",
        )
    )
    return out


def _logged(mask: np.ndarray, steps: np.ndarray, *mats: np.ndarray) -> tuple[np.ndarray, ...]:
    """Only the columns some row has data in (runs log expert_load every K steps; empty columns would
    draw as blank stripes, and plotly stretches the remaining cells over the gaps instead)."""
    if mask.any() and not mask.all():
        return (steps[mask], *(m[:, mask] for m in mats))
    return (steps, *mats)


def _ticks(labels: list[str], marked: dict[int, str], plot_px: int, px_per_label: int = 13) -> dict[str, Any]:
    """Category-axis ticks thinned to one per `px_per_label` pixels; rows in `marked` always labelled.

    marked: row index -> tick text (HTML allowed). Marked rows closer than one
    label apart share the first one's label ("300 dead +2"); other labels that
    close to a marked one are left out, so no two labels overlap.
    """
    k = max(1, math.ceil(len(labels) / max(1, plot_px // px_per_label)))
    kept: dict[int, list[int]] = {}
    for i in sorted(marked):
        last = max(kept) if kept else None
        if last is not None and i - kept[last][-1] < k:
            kept[last].append(i)
        else:
            kept[i] = [i]
    text = {i: marked[i] + (f" +{len(rows) - 1}" if len(rows) > 1 else "") for i, rows in kept.items()}
    near = {j for rows in kept.values() for j in range(rows[0] - k + 1, rows[-1] + k)}
    rows = sorted({*(i for i in range(0, len(labels), k) if i not in near), *kept})
    return {
        "tickmode": "array",
        "tickvals": [labels[i] for i in rows],
        "ticktext": [text.get(i, labels[i]) for i in rows],
    }


def _rows_layout(title: str, height: int, rows: str, ticks: dict, left: int, bottom: int) -> dict[str, Any]:
    """A heatmap's layout: `rows` (layers, experts) down as categories from the top, steps across."""
    return {
        "title": {"text": title, "font": {"size": 14}},
        "height": height,
        "margin": {"l": left, "r": 10, "t": 36, "b": bottom},
        "dragmode": "select",
        "yaxis": {"title": {"text": rows}, "type": "category", "autorange": "reversed", **ticks},
        "xaxis": {"title": {"text": "step"}},
    }


def layer_heatmap(ov: dict[str, Any], selected: int | None, title: str) -> dict[str, Any]:
    """Drop fraction of every layer over the step buckets: layers down, steps across; a figure dict.

    ov: `queries.experts.layer_matrix`. The selected layer's row is outlined. Hover:
    layer, step, drop fraction, and the busiest expert's load over the mean.
    """
    layers = [str(x) for x in ov["layers"]]
    steps, z, hot = _logged(
        np.isfinite(ov["drop_frac"]).any(axis=0), ov["steps"], ov["drop_frac"], ov["hot_max"]
    )
    peak = float(np.nanmax(z)) if np.isfinite(z).any() else 0.0
    height = int(min(800, max(260, 9 * len(layers) + 110)))
    layout = _rows_layout(title, height, "layer", _ticks(layers, {}, height - 66, 14), left=50, bottom=40)
    layout["shapes"] = []
    if selected is not None and str(selected) in layers:
        k = layers.index(str(selected))
        layout["shapes"].append(
            {
                "type": "rect",
                "xref": "paper",
                "x0": 0,
                "x1": 1,
                "yref": "y",
                "y0": k - 0.5,
                "y1": k + 0.5,
                "line": {"color": "#1f77b4", "width": 2},
            }
        )
    trace = {
        "type": "heatmap",
        "z": z.astype(np.float32),
        "x": steps,
        "y": layers,
        "customdata": hot.astype(np.float32),
        "colorscale": "Reds",
        "zmin": 0,
        "zmax": max(peak, 0.01),
        "colorbar": {"title": {"text": "dropped"}, "tickformat": ".1%"},
        "hovertemplate": "layer %{y} · step %{x}<br>dropped %{z:.2%}"
        "<br>busiest expert %{customdata:.1f}× mean (worst step)<extra></extra>",
    }
    return {"data": [trace], "layout": layout}


def expert_heatmap(
    hm: dict[str, Any], which: str, order: np.ndarray, marked: dict[int, str], title: str
) -> dict[str, Any]:
    """One layer's experts x step buckets, rows in `order` (the page: by id); a figure dict.

    hm: `queries.experts.heatmap`; which: "share" (load share of the layer's
    assignments) or "drop_frac" (dropped / routed). marked: expert id -> tick text
    (the hot and dead experts), always labelled; other labels are thinned to fit.
    Hover: expert, step, load share and drop fraction of the cell. The share's
    colour scale tops out at the 99.5th percentile, so one hot expert does not
    flatten the rest (its cells are the darkest; hover gives the value).
    """
    other = "drop_frac" if which == "share" else "share"
    ids = hm["experts"][order] if len(order) else hm["experts"]
    z, w = hm[which][order], hm[other][order]
    steps, z, w = _logged(np.isfinite(hm["routed"]).any(axis=0), hm["steps"], z, w)
    labels = [str(e) for e in ids]
    finite = z[np.isfinite(z)]
    top = float(np.percentile(finite, 99.5) if which == "share" else finite.max()) if finite.size else 0.0
    height = int(min(1300, max(360, 2.2 * len(labels) + 130)))
    rows = {int(e): i for i, e in enumerate(ids)}
    ticks = _ticks(labels, {rows[e]: t for e, t in marked.items() if e in rows}, height - 66)
    share_first = which == "share"
    return {
        "data": [
            {
                "type": "heatmap",
                "z": z.astype(np.float32),
                "x": steps,
                "y": labels,
                "customdata": w.astype(np.float32),
                "colorscale": "Viridis" if share_first else "Reds",
                "zmin": 0,
                "zmax": max(top, 0.01),  # an all-zero matrix (no drops) reads as zero, not as mid-scale
                "colorbar": {"title": {"text": "share" if share_first else "dropped"}, "tickformat": ".1%"},
                "hovertemplate": "expert %{y} · step %{x}<br>"
                + (
                    "load share %{z:.2%}<br>dropped %{customdata:.1%}"
                    if share_first
                    else "dropped %{z:.1%}<br>load share %{customdata:.2%}"
                )
                + "<extra></extra>",
            }
        ],
        "layout": _rows_layout(title, height, "expert", ticks, left=70, bottom=30),
    }


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def marker_text(kind: str, data: Any) -> str:
    """One line of hover text for an event marker: plotly hover renders a subset of HTML, so escaped."""
    return plot_text(f"{kind.replace('_', ' ')}: {describe(kind, data)}")


# a finding's severity -> (symbol, colour, size, legend entry): what an operator must act on stands out,
# what is only worth knowing is small and open
SEVERITY_STYLE = {
    "critical": ("triangle-up", "#d62728", 14, "finding: critical"),
    "warn": ("triangle-up", "#ff7f0e", 11, "finding: warning"),
    "info": ("triangle-up-open", "#8c8c8c", 8, "finding: info"),
}
SEVERITY_RANK = {"info": 0, "warn": 1, "critical": 2}
EPISODE_GAP = (
    0.01  # findings on one chart closer than this share of its step span are one episode, one marker
)
EPISODE_LINES = 6  # an episode's hover lists at most this many findings


def route_markers(markers, charts: dict[str, tuple[str, ...]], home: str) -> dict[str, Any]:
    """Each chart's markers: a finding (an `anomaly`) on the chart whose metric names (fnmatch patterns) match
    its `metric`; every other marker, and a finding of a metric no chart draws, on the `home` chart."""
    import fnmatch

    if markers is None or markers.height == 0:
        return {title: markers for title in charts}
    metric = markers["data"].str.json_path_match("$.metric")
    chart_of = []
    for kind, m in zip(markers["kind"].to_list(), metric.to_list(), strict=True):
        hit = (
            next((t for t, pats in charts.items() if any(fnmatch.fnmatchcase(m, p) for p in pats)), None)
            if kind == "anomaly" and m
            else None
        )
        chart_of.append(hit or home)
    where = pl.Series(chart_of, dtype=pl.String)
    return {title: markers.filter(where == title) for title in charts}


def finding_episodes(steps: list[int], datas: list[Any], gap: float) -> list[dict[str, Any]]:
    """Findings (`anomaly` events: their steps and data) collapsed into episodes: sorted by window, a finding
    whose window starts within `gap` steps of the episode's end joins it. Each episode: step (its first
    finding's), start and end (its windows' span), severity (its worst), n, and hover text listing them."""
    rows = []
    for s, d in zip(steps, datas, strict=True):
        d = _json(d)
        w = d.get("window") if isinstance(d.get("window"), list) and len(d["window"]) == 2 else [s, s]
        try:
            a, b = float(w[0]), float(w[1])
        except (TypeError, ValueError):
            a = b = float(s)
        rows.append((a, b, int(s), d))
    rows.sort(key=lambda r: (r[0], r[2]))
    out: list[dict[str, Any]] = []
    for a, b, s, d in rows:
        sev = d.get("severity") if d.get("severity") in SEVERITY_RANK else "warn"
        if out and a <= out[-1]["end"] + gap:
            e = out[-1]
            e["end"] = max(e["end"], b)
            e["step"] = min(e["step"], s)
            e["items"].append((sev, d))
            if SEVERITY_RANK[sev] > SEVERITY_RANK[e["severity"]]:
                e["severity"] = sev
        else:
            out.append({"step": s, "start": a, "end": b, "severity": sev, "items": [(sev, d)]})
    for e in out:
        items = sorted(e["items"], key=lambda x: -SEVERITY_RANK[x[0]])
        head = f"{len(items)} findings, worst {e['severity']}" if len(items) > 1 else e["severity"]
        lines = [marker_text("anomaly", d) for _, d in items[:EPISODE_LINES]]
        more = [f"... and {len(items) - EPISODE_LINES} more"] if len(items) > EPISODE_LINES else []
        e["n"] = len(items)
        e["text"] = "<br>".join([plot_text(head), *lines, *more])
    return out


def _json(d: Any) -> dict:
    if isinstance(d, str):
        try:
            d = json.loads(d)
        except ValueError:
            return {}
    return d if isinstance(d, dict) else {}


def _finding_traces(fig: dict[str, Any], d, y_at: float | None, gap: float) -> None:
    """A run's findings on one chart: one marker per episode, one trace (legend entry) per severity; an
    episode of several findings carries their count over its marker and, when it spans steps, a faint band."""
    eps = finding_episodes(d["step"].to_list(), d["data"].to_list(), gap)
    for e in eps:
        if e["n"] > 1 and e["end"] > e["start"]:
            fig["layout"].setdefault("shapes", []).append(
                {
                    "type": "rect",
                    "xref": "x",
                    "yref": "paper",
                    "x0": e["start"],
                    "x1": e["end"],
                    "y0": 0,
                    "y1": 1,
                    "fillcolor": _rgba(SEVERITY_STYLE[e["severity"]][1], 0.1),
                    "line": {"width": 0},
                    "layer": "below",
                }
            )
    for sev in ("info", "warn", "critical"):
        mine = [e for e in eps if e["severity"] == sev]
        if not mine:
            continue
        symbol, color, size, name = SEVERITY_STYLE[sev]
        fig["data"].append(
            scatter(
                x=[e["step"] for e in mine],
                y=[y_at] * len(mine),
                mode="markers+text",
                name=name,
                marker={"symbol": symbol, "color": color, "size": size, "line": {"width": 1, "color": color}},
                text=[e["text"] for e in mine],
                customdata=[f"×{e['n']}" if e["n"] > 1 else "" for e in mine],  # the count, over the marker
                texttemplate="%{customdata}",
                textposition="top center",
                textfont={"color": color, "size": 11},
                hovertemplate="step %{x}<br>%{text}<extra></extra>",
                cliponaxis=False,  # a finding at the chart's first or last step is drawn whole
            )
        )


def _marker_trace(fig: dict, d, name: str, y_at, symbol: str, color: str, size: int) -> None:
    """One legend entry of markers (frame `d`: kind, step, data) at `y_at`, text on hover; none when empty."""
    if d.height == 0:
        return
    fig["data"].append(
        scatter(
            x=d["step"].to_list(),
            y=[y_at] * d.height,
            mode="markers",
            name=name,
            marker={"symbol": symbol, "color": color, "size": size, "line": {"width": 1}},
            text=[marker_text(k, x) for k, x in zip(d["kind"].to_list(), d["data"].to_list(), strict=True)],
            hovertemplate="step %{x}<br>%{text}<extra></extra>",
            cliponaxis=False,
        )
    )


def add_markers(
    fig: dict[str, Any], markers, y_at: float | None = None, lines: bool = True, gap: float = 0.0
) -> None:
    """Event markers at their steps: one trace per kind (toggle in the legend), text on hover.

    markers: frame with kind, step, data. They sit at `y_at` (data units) so that
    hovering works; failures, config changes and decisions also get a dotted line.
    Findings (`anomaly`) are drawn by episode (`finding_episodes`, `gap` steps apart at most),
    styled by severity. Markers are not clipped at the plot's edges.
    """
    if markers is None or markers.height == 0:
        return
    m = markers.filter(markers["step"].is_not_null())
    for kind in m["kind"].unique(maintain_order=True).to_list():
        d = m.filter(m["kind"] == kind)
        if kind == "anomaly":
            _finding_traces(fig, d, y_at, gap)
            continue
        symbol, color = MARKER_STYLE.get(kind, ("circle", "#333333"))
        if kind == "alert":  # an info alert is worth knowing, not an alarm: small, open and grey
            info = d["data"].str.json_path_match("$.severity").fill_null("") == "info"
            _marker_trace(fig, d.filter(info), "alert: info", y_at, "bowtie-open", "#8c8c8c", 7)
            d = d.filter(~info)
        _marker_trace(fig, d, kind.replace("_", " "), y_at, symbol, color, 11)
        steps = d["step"].to_list()
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
