"""The Sweeps page's figures and table, as plain plotly dicts and Markdown (no Streamlit here).

Every label comes from a log writer (group values, config keys, run names): `plot_text` makes it inert
in a figure, `md_escape` in Markdown. Run ids match RUN_ID_RE, so a link to one needs no escaping.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from observatory.dashboard.charts import band, scatter, smooth
from observatory.markup import md_escape, plot_text

__all__ = [
    "COLORS",
    "curves_figure",
    "scatter_figure",
    "parcoords_figure",
    "isoflop_figure",
    "envelope_figure",
    "pivot_markdown",
]

COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
_MARGIN = {"l": 50, "r": 10, "t": 36, "b": 40}


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    return f"rgba({int(h[0:2], 16)}, {int(h[2:4], 16)}, {int(h[4:6], 16)}, {alpha})"


def _axis(title: str, log: bool) -> dict:
    return {"title": {"text": plot_text(title)}, "type": "log" if log else "linear"}


def curves_figure(
    view: dict[str, Any],
    metric: str,
    smoothing: float = 0.0,
    spread: str = "min–max",
    log_x: bool = False,
    log_y: bool = False,
) -> dict[str, Any]:
    """Each group's mean curve with its band (min–max, or ± 1 sd), n in the legend."""
    data = view["data"]
    traces: list[dict] = []
    for i, g in enumerate(view["groups"]):
        d = data.filter(data["group"] == g["group"]) if data is not None else None
        if d is None or d.height == 0:
            continue
        color = COLORS[i % len(COLORS)]
        x = d["x"].to_list()
        mean = smooth(d["mean"].to_list(), smoothing)
        if spread == "± 1 sd":
            sd = np.nan_to_num(np.asarray(d["sd"].to_list(), dtype=float))
            lo, hi = mean - sd, mean + sd
        else:
            lo, hi = smooth(d["min"].to_list(), smoothing), smooth(d["max"].to_list(), smoothing)
        name = plot_text(f"{g['group']} (n={g['n']})")
        traces += band(x, list(lo), list(hi), _rgba(color, 0.18), name, f"g{i}")
        traces.append(
            scatter(
                x=x,
                y=list(mean),
                mode="lines",
                name=name,
                legendgroup=f"g{i}",
                line={"color": color, "width": 2},
                customdata=d["n"].to_list(),
                hovertemplate="%{x:.4g}: %{y:.4g} (n=%{customdata})<extra>" + name + "</extra>",
            )
        )
    return _figure(traces, 420, _axis(view["x"], log_x), _axis(metric, log_y), legend=True)


def _figure(traces: list, height: int, xaxis: dict, yaxis: dict, legend: bool = False) -> dict:
    """A figure of the page's charts: their margins, and the legend under the plot when asked."""
    layout = {"height": height, "margin": _MARGIN, "xaxis": xaxis, "yaxis": yaxis}
    if legend:
        layout["legend"] = {"orientation": "h", "y": -0.2}
    return {"data": traces, "layout": layout}


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def _x(v: Any) -> float | str:
    n = _num(v)
    return n if n is not None else plot_text(v)


def scatter_figure(rows: list[dict], key: str, color_key: str | None, metric: str, log_x=False) -> dict:
    """The metric against one config key, one trace per value of `color_key` (at most 8, the rest grey)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(str(r["keys"].get(color_key)) if color_key else "runs", []).append(r)
    traces = []
    for i, (label, rs) in enumerate(sorted(groups.items(), key=lambda kv: -len(kv[1]))):
        color = COLORS[i] if i < len(COLORS) else "#bbbbbb"
        traces.append(
            scatter(
                x=[_x(r["keys"].get(key)) for r in rs],  # a category (text) is a tick label: inert
                y=[r["value"] for r in rs],
                mode="markers",
                name=plot_text(f"{color_key}={label}" if color_key else label),
                marker={"color": color, "size": 8},
                text=[r["run"] for r in rs],
                hovertemplate="%{text}: %{y:.4g}<extra></extra>",
            )
        )
    return _figure(traces, 400, _axis(key, log_x), _axis(metric, False))


def parcoords_figure(rows: list[dict], keys: list[str], metric: str) -> dict:
    """Parallel coordinates over the keys (numbers as they are, text as its rank) ending in the metric."""
    dims = []
    for k in keys:
        vals = [r["keys"].get(k) for r in rows]
        nums = [_num(v) for v in vals]
        if all(n is not None for n in nums):
            dims.append({"label": plot_text(k), "values": nums})
        else:
            labels = sorted({str(v) for v in vals})
            dims.append(
                {
                    "label": plot_text(k),
                    "values": [labels.index(str(v)) for v in vals],
                    "tickvals": list(range(len(labels))),
                    "ticktext": [plot_text(x[:24]) for x in labels],
                }
            )
    values = [r["value"] for r in rows]
    dims.append({"label": plot_text(metric), "values": values})
    return {
        "data": [
            {
                "type": "parcoords",
                "line": {"color": values, "colorscale": "Viridis", "showscale": True},
                "dimensions": dims,
            }
        ],
        "layout": {"height": 420, "margin": {"l": 60, "r": 60, "t": 50, "b": 30}},
    }


def isoflop_figure(view: dict[str, Any]) -> dict:
    """Each budget's cells against tokens, its fitted U, and the vertex with its interval (log x)."""
    fit = view["fit"]
    traces = []
    for i, b in enumerate(fit["budgets"]):
        color = COLORS[i % len(COLORS)]
        cells = [c for c in view["cells"] if c["budget"] == b["budget"]]
        name = f"C={b['budget']:.0e}"
        traces.append(
            scatter(
                x=[c["tokens"] for c in cells],
                y=[c["loss"] for c in cells],
                mode="markers",
                name=name,
                legendgroup=name,
                marker={"color": color, "size": 8},
                text=[c["run"] for c in cells],
                hovertemplate="%{text}: D=%{x:.3g}, %{y:.4g}<extra></extra>",
            )
        )
        if b["coef"] and cells:
            lx = np.linspace(
                math.log(min(c["tokens"] for c in cells)), math.log(max(c["tokens"] for c in cells)), 60
            )
            traces.append(
                scatter(
                    x=list(np.exp(lx)),
                    y=list(np.polyval(b["coef"], lx)),
                    mode="lines",
                    line={"color": color, "dash": "dot" if b["status"] != "ok" else "solid"},
                    legendgroup=name,
                    showlegend=False,
                    hoverinfo="skip",
                )
            )
        if b["tokens"] is not None:
            err = (
                {
                    "type": "data",
                    "symmetric": False,
                    "array": [b["tokens_hi"] - b["tokens"]],
                    "arrayminus": [b["tokens"] - b["tokens_lo"]],
                }
                if b["tokens_lo"] is not None
                else None
            )
            traces.append(
                scatter(
                    x=[b["tokens"]],
                    y=[b["loss"]],
                    mode="markers",
                    marker={
                        "symbol": "star",
                        "size": 14,
                        "color": color,
                        "line": {"width": 1, "color": "#000"},
                    },
                    error_x=err,
                    legendgroup=name,
                    showlegend=False,
                    hovertemplate=f"{name}: D*=%{{x:.3g}}, L*=%{{y:.4g}}<extra></extra>",
                )
            )
    return _figure(traces, 420, _axis("tokens", True), _axis(view["metric"], False), legend=True)


def envelope_figure(view: dict[str, Any]) -> dict:
    """The baseline's and the variant's loss-vs-compute envelopes with their bands, and their points."""
    traces = []
    for i, side in enumerate(("baseline", "variant")):
        env = view[side]["envelope"]
        if env is None:
            continue
        color = COLORS[i]
        xs = [p["flops"] for p in env["curve"]]
        if env["curve"][0]["lo"] is not None:
            traces += band(
                xs,
                [p["lo"] for p in env["curve"]],
                [p["hi"] for p in env["curve"]],
                _rgba(color, 0.18),
                side,
                side,
            )
        traces.append(
            scatter(
                x=xs,
                y=[p["loss"] for p in env["curve"]],
                mode="lines",
                name=side,
                legendgroup=side,
                line={"color": color},
            )
        )
        traces.append(
            scatter(
                x=[p["flops"] for p in env["points"]],
                y=[p["loss"] for p in env["points"]],
                mode="markers",
                marker={"color": color, "size": 9},
                legendgroup=side,
                showlegend=False,
                hovertemplate="C=%{x:.3g}: %{y:.4g}<extra>" + side + "</extra>",
            )
        )
    return _figure(traces, 400, _axis("compute (FLOPs)", True), _axis(view["metric"], True), legend=True)


def pivot_markdown(pv: dict[str, Any], link: str = "live?run=", per_cell: int = 3) -> str:
    """The pivot as a Markdown table: each cell its runs' values, each linking to its run's page."""
    head = f"| {md_escape(pv['row_key'])} \\\\ {md_escape(pv['col_key'])} | " + " | ".join(
        md_escape(c) for c in pv["cols"]
    )
    lines = [head + " |", "|---" * (len(pv["cols"]) + 1) + "|"]
    for r in pv["rows"]:
        cells = []
        for c in pv["cols"]:
            runs = pv["cells"][r][c]
            shown = [
                f"[{x['value']:.4g}]({link}{x['run']})" for x in runs[:per_cell] if x["value"] is not None
            ]
            more = f" +{len(runs) - per_cell}" if len(runs) > per_cell else ""
            cells.append(" ".join(shown) + more or "—")
        lines.append(f"| {md_escape(r)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
