"""Plotly figures for a post-mortem report, built only from a `Report`'s data (so they are deterministic).

Each function returns a `go.Figure` or None when the run has nothing to draw.
Non-finite values are gaps in the lines and get their own red markers, because
the NaN is usually the point of the post-mortem.
"""

from __future__ import annotations

import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from observatory.markup import plot_text
from observatory.report.collect import Report

__all__ = ["figures", "MARKS"]

# timeline kind -> (marker colour, symbol): what the overview marks on the loss curve
MARKS = {
    "failure": ("#d62728", "x"),
    "anomaly": ("#ff7f0e", "triangle-up"),
    "decision": ("#1f77b4", "diamond"),
    "config_diff": ("#9467bd", "square"),
    "checkpoint": ("#7f7f7f", "circle-open"),
}
MAX_MARKERS = 2000
MAX_CURVE = 4000
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=50, b=40), font=dict(size=12))


def _xy(points):
    """Steps and values with non-finite values as None (plotly draws a gap)."""
    xs = [s for s, _ in points]
    ys = [v if v is not None and math.isfinite(v) else None for _, v in points]
    return xs, ys


def _thin(points, n: int = MAX_CURVE):
    """At most ~n points: each bucket keeps its lowest and highest finite point (spikes survive)."""
    if len(points) <= n:
        return points
    width = math.ceil(len(points) / (n // 2))
    out = []
    for i in range(0, len(points), width):
        fin = [p for p in points[i : i + width] if p[1] is not None and math.isfinite(p[1])]
        if fin:
            lo, hi = min(fin, key=lambda p: p[1]), max(fin, key=lambda p: p[1])
            out += sorted({lo, hi})
    return out


def _finite(points):
    return [v for _, v in points if v is not None and math.isfinite(v)]


def overview(rep: Report) -> go.Figure | None:
    names = [n for n in rep.series if rep.series.get(n)]  # the loss first (`collect.overview_names`)
    if not names:
        return None
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.04,
        subplot_titles=[plot_text(n) for n in names],
    )
    for i, name in enumerate(names, start=1):
        xs, ys = _xy(rep.series[name])
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines", name=plot_text(name), line=dict(width=1.5)), row=i, col=1
        )
        bad = [s for s, v in rep.series[name] if v is None or not math.isfinite(v)]
        if name == rep.loss_name:  # a downsampled series leaves NaNs out; the report lists them all
            bad = sorted(set(bad) | set(rep.nonfinite[:MAX_MARKERS]))
        if bad:
            fin = _finite(rep.series[name])
            y0 = max(fin) if fin else 0.0
            fig.add_trace(
                go.Scatter(
                    x=bad,
                    y=[y0] * len(bad),
                    mode="markers",
                    name=plot_text(f"{name} non-finite"),
                    marker=dict(color="#d62728", symbol="x", size=9),
                    hovertext=[plot_text(f"{name} is NaN/inf at step {s}") for s in bad],
                ),
                row=i,
                col=1,
            )
    loss = rep.series.get(names[0]) or []
    fin = _finite(loss)
    top = max(fin) if fin else 1.0
    for kind, (color, symbol) in MARKS.items():
        items = [e for e in rep.timeline if e["kind"] == kind and e["step"] is not None]
        if not items:
            continue
        fig.add_trace(
            go.Scatter(
                x=[e["step"] for e in items],
                y=[top] * len(items),
                mode="markers",
                name=kind,
                marker=dict(color=color, symbol=symbol, size=10),
                hovertext=[plot_text(e["text"][:200]) for e in items],
                hoverinfo="text+x",
            ),
            row=1,
            col=1,
        )
    for e in rep.timeline:
        if e["kind"] == "failure" and e["step"] is not None:
            fig.add_vline(x=e["step"], line=dict(color="#d62728", dash="dot", width=1))
    fig.update_layout(height=220 * len(names) + 80, title="Metrics and events over steps", **LAYOUT)
    fig.update_xaxes(
        title_text="step", row=len(names), col=1
    )  # the rows share it: titled once, at the bottom
    for i, name in enumerate(names, start=1):
        fig.update_yaxes(title_text=plot_text(name.rsplit("/", 1)[-1]), row=i, col=1)
    return fig


def window(rep: Report, w: dict) -> go.Figure:
    """Loss (left axis) and grad norm (right axis, log when it spans decades) around one finding."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    names = sorted(w["series"], key=lambda n: (n != rep.loss_name, n))
    for j, name in enumerate(names):
        pts = w["series"][name]
        xs, ys = _xy(pts)
        fig.add_trace(
            go.Scatter(x=xs, y=ys, mode="lines+markers", name=plot_text(name), marker=dict(size=4)),
            secondary_y=j > 0,
        )
        bad = [s for s, v in pts if v is None or not math.isfinite(v)]
        if bad:
            fin = _finite(pts)
            fig.add_trace(
                go.Scatter(
                    x=bad,
                    y=[max(fin) if fin else 0.0] * len(bad),
                    mode="markers",
                    name=plot_text(f"{name} NaN/inf"),
                    marker=dict(color="#d62728", symbol="x", size=10),
                ),
                secondary_y=j > 0,
            )
        fin = [v for v in _finite(pts) if v > 0]
        if j > 0 and fin and max(fin) / min(fin) > 100:
            fig.update_yaxes(type="log", tickformat=".3g", secondary_y=True)
        fig.update_yaxes(title_text=plot_text(name), secondary_y=j > 0)
    fig.add_vrect(x0=w["first"] - 0.5, x1=w["last"] + 0.5, fillcolor="#ff7f0e", opacity=0.15, line_width=0)
    fig.add_vline(
        x=w["step"], line=dict(color="#d62728" if w["kind"] == "failure" else "#ff7f0e", dash="dot")
    )
    # a failure's message or a finding's text: plotly draws `<a href>` in a title as a live link
    fig.update_layout(height=300, title=plot_text(w["title"][:120]), **LAYOUT)
    fig.update_xaxes(title_text="step", range=[w["lo"] - 0.5, w["hi"] + 0.5])
    return fig


def slow(rep: Report, w: dict) -> go.Figure:
    """One slow-change finding: its metric's 64-step means over the whole run, the earlier level it is held
    against, where the change began (grey) and where it was found (orange, red when critical)."""
    fig = go.Figure()
    xs, ys = _xy(_thin(w["series"]))
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=plot_text(w["metric"])))
    if w.get("baseline") is not None:
        fig.add_hline(y=w["baseline"], line=dict(color="#7f7f7f", dash="dash"))
    fig.add_vrect(x0=w["since"], x1=w["step"], fillcolor="#ff7f0e", opacity=0.12, line_width=0)
    fig.add_vline(x=w["since"], line=dict(color="#7f7f7f", dash="dot"))
    fig.add_vline(x=w["step"], line=dict(color="#d62728" if w["severity"] == "critical" else "#ff7f0e"))
    fig.update_layout(height=280, title=plot_text(w["title"][:120]), showlegend=False, **LAYOUT)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=plot_text(w["metric"]))
    return fig


def experts(rep: Report) -> go.Figure | None:
    layers, experts_, z = rep.expert_matrix
    if not layers:
        return None
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=[f"e{e}" for e in experts_],
            y=[f"layer {layer}" for layer in layers],
            colorscale="Viridis",
            colorbar=dict(title="share"),
            hovertemplate="%{y} %{x}: %{z:.3f} of routed<extra></extra>",
        )
    )
    even = 1.0 / max(1, len(experts_))
    fig.update_layout(
        height=140 + 40 * len(layers),
        title=f"Expert load: share of each layer's routed assignments (even = {even:.3f})",
        xaxis_title="expert",
        yaxis_title="layer",
        **LAYOUT,
    )
    return fig


def drops(rep: Report) -> go.Figure | None:
    pts = rep.drops or rep.series.get("moe/drop_fraction") or []
    if not pts:
        return None
    xs, ys = _xy(pts)
    fig = go.Figure(go.Scatter(x=xs, y=ys, mode="lines", name="drop fraction"))
    fig.update_layout(height=280, title="Token drop fraction (dropped / routed, all layers)", **LAYOUT)
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(tickformat=".1%", rangemode="tozero", title_text="dropped / routed")
    return fig


def lineage(rep: Report) -> go.Figure | None:
    li = rep.lineage
    if li is None or len(li.chain) < 2 or not li.curve:
        return None
    fig = go.Figure()
    for run, _cut in li.segments:
        pts = _thin([(s, v) for r, s, v in li.curve if r == run])
        if pts:
            xs, ys = _xy(pts)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=run))
    for r in li.chain[1:]:
        if r["parent_step"] is not None:
            fig.add_vline(x=r["parent_step"], line=dict(color="#555", dash="dash", width=1))
    fig.update_layout(
        height=320, title=plot_text(f"Stitched {li.metric} along the lineage {li.root} -> {li.run}"), **LAYOUT
    )
    fig.update_xaxes(title_text="step")
    fig.update_yaxes(title_text=plot_text(li.metric))
    return fig


def forecast(rep: Report) -> go.Figure | None:
    if not rep.forecasts:
        return None
    fig = go.Figure()
    for metric in sorted({f["metric"] for f in rep.forecasts}):
        pts = rep.forecast_actuals.get(metric) or []
        if pts:
            xs, ys = _xy(_thin(pts))
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name=plot_text(f"{metric} (actual)")))
        fs = [f for f in rep.forecasts if f["metric"] == metric and f.get("step") is not None]
        if fs:
            fig.add_trace(
                go.Scatter(
                    x=[f["step"] for f in fs],
                    y=[f["value"] for f in fs],
                    mode="markers",
                    name=plot_text(f"{metric} (forecast)"),
                    marker=dict(symbol="star", size=13, color="#2ca02c"),
                    error_y=dict(
                        type="data",
                        symmetric=False,
                        array=[(f["high"] - f["value"]) if f.get("high") is not None else 0 for f in fs],
                        arrayminus=[(f["value"] - f["low"]) if f.get("low") is not None else 0 for f in fs],
                    ),
                    hovertext=[plot_text(f.get("source_text", "")) for f in fs],
                )
            )
        for f in fs:  # the headline: where the run ended up against the band
            if f.get("actual") is not None and f.get("actual_step") is not None:
                fig.add_annotation(
                    x=f["actual_step"],
                    y=f["actual"],
                    text=f"actual {f['actual']:.4g}: {f['verdict']}",
                    showarrow=True,
                    arrowhead=2,
                    ax=-60,
                    ay=-40,
                    font=dict(color="#2ca02c" if f["verdict"] == "inside band" else "#d62728"),
                )
    if not fig.data:
        return None
    xs = [x for t in fig.data for x in (t.x or ()) if x is not None]
    verdicts = sorted(
        {f["verdict"] for f in rep.forecasts if f.get("low") is not None and f.get("actual") is not None}
    )
    title = "Forecast against what happened" + (f": {', '.join(verdicts)}" if verdicts else "")
    fig.update_layout(height=320, title=title, **LAYOUT)
    # from step 0 (a lone forecast point must not get an axis of its own width, 199 to 201)
    fig.update_xaxes(title_text="step", range=[0, max(xs) * 1.04 + 1] if xs else None)
    fig.update_yaxes(title_text=plot_text(", ".join(sorted({f["metric"] for f in rep.forecasts}))))
    return fig


def figures(rep: Report) -> dict[str, go.Figure]:
    """name -> figure, in report order; names are stable (they become div ids and PNG file names)."""
    out: dict[str, go.Figure] = {}
    for name, fn in (("overview", overview), ("forecast", forecast)):
        f = fn(rep)
        if f is not None:
            out[name] = f
    for i, w in enumerate(rep.windows):
        out[f"window-{i + 1}"] = window(rep, w)
    for i, w in enumerate(rep.slow):
        out[f"slow-{i + 1}"] = slow(rep, w)
    for name, fn in (("experts", experts), ("drops", drops), ("lineage", lineage)):
        f = fn(rep)
        if f is not None:
            out[name] = f
    return out
