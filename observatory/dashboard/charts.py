"""Plotly figures as plain dicts: downsampled series as min-max bands, and event markers.

`series_figure` draws a downsampled series as a min-max band with the last value
per bucket as the line (a spike stays visible at any zoom); `add_markers` adds
event markers carrying their text (`observatory.events.describe`) on hover.
Figures are dicts, not plotly objects: `widgets.show_chart` wraps each once,
without validating it again.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import polars as pl

from observatory.events import describe

__all__ = ["smooth", "scatter", "band", "series_figure", "marker_text", "add_markers"]

MARKER_STYLE = {  # kind -> (symbol, colour)
    "failure": ("x", "#d62728"),
    "anomaly": ("triangle-up", "#ff7f0e"),
    "checkpoint": ("diamond", "#7f7f7f"),
    "config_diff": ("square", "#9467bd"),
    "decision": ("star", "#2ca02c"),
    "note": ("circle-open", "#17becf"),
    "run_end": ("line-ns", "#000000"),
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
        # numpy arrays travel as base64 typed arrays (NaN = gap): plotly's JSON encoder is
        # an order of magnitude slower on lists of floats
        xs = d[x].cast(pl.Float64).to_numpy()
        label = str(g) if g is not None else title
        wide = "n" in d.columns and d["n"].max() > 1
        lo_v = d["min"].cast(pl.Float64).to_numpy()
        hi_v = d["max"].cast(pl.Float64).to_numpy()
        if wide:
            data.extend(band(xs, lo_v, hi_v, _rgba(color, 0.18), f"{label} min-max", label))
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
