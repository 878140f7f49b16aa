"""Experts: where the router sends tokens, per layer, and where capacity cuts them.

For one layer and step window: heatmaps of expert x step of load share and of
the fraction of each expert's assignments that were dropped; the hot experts
(max/mean load); and, for every layer, drop fraction and hot-expert ratio over
time. All read ingest-time rollups, so a 10^8-row store answers in milliseconds.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import polars as pl
import streamlit as st

from observatory.dashboard.cache import query, query_all
from observatory.dashboard.charts import scatter
from observatory.dashboard.runs_table import runs_calls, runs_table
from observatory.dashboard.widgets import pick_run, requested_window, show_chart, step_window
from observatory.queries import experts as qe


def heatmap_figure(hm: dict, which: str, title: str) -> go.Figure:
    """A plotly heatmap of an (E, B) matrix from `queries.experts.heatmap` (x = bucket first step)."""
    z, steps = hm[which], hm["steps"]
    # buckets with no expert_load at all (runs log it every `expert_load_every` steps) would
    # draw as blank stripes; plotly stretches the remaining cells over the gaps instead
    logged = np.isfinite(hm["routed"]).any(axis=0) if z.size else np.zeros(0, bool)
    if logged.any() and not logged.all():
        z, steps = z[:, logged], steps[logged]
    peak = float(np.nanmax(z)) if np.isfinite(z).any() else 0.0
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=steps,
            y=hm["experts"],
            colorscale="Viridis" if which == "share" else "Reds",
            zmin=0,
            zmax=max(peak, 0.01),  # an all-zero matrix (no drops) reads as zero, not as mid-scale
            colorbar={"title": {"text": "share" if which == "share" else "dropped"}, "tickformat": ".1%"},
            hovertemplate="step %{x}<br>expert %{y}<br>%{z:.2%}<extra></extra>",
        )
    )
    fig.update_layout(
        title={"text": title, "font": {"size": 14}},
        height=360,
        margin={"l": 40, "r": 10, "t": 36, "b": 30},
        dragmode="select",
    )
    fig.update_yaxes(title="expert", dtick=max(1, len(hm["experts"]) // 16))  # whole experts only
    return fig


def layer_lines(df: pl.DataFrame, column: str, title: str, layers: list[int]) -> dict:
    """One line per layer of `column` over step buckets (the chosen layers bold, others faint)."""
    data = []
    for layer in df["layer"].unique(maintain_order=True).to_list():
        d = df.filter(df["layer"] == layer)
        bold = layer in layers
        data.append(
            scatter(
                x=d["step"].to_list(),
                y=d[column].to_list(),
                mode="lines",
                name=f"layer {layer}",
                line={"width": 2 if bold else 0.8},
                opacity=1.0 if bold else 0.35,
                hovertemplate="step %{x}: %{y:.4g}<extra>layer " + str(layer) + "</extra>",
            )
        )
    layout = {
        "title": {"text": title, "font": {"size": 14}},
        "height": 300,
        "margin": {"l": 40, "r": 10, "t": 36, "b": 30},
        "dragmode": "select",
    }
    return {"data": data, "layout": layout}


def _view_call(run: str) -> tuple:
    """The page's one data query for `run`: layer from the widget or ?layer=, window from the slider."""
    qp_layer = st.query_params.get("layer")
    layer = st.session_state.get("experts_layer")
    if layer is None and qp_layer and qp_layer.isdigit():
        layer = int(qp_layer)
    return (qe.experts_view, run, layer, *requested_window(f"experts_window_{run}"), 400, 500)


def render() -> None:
    st.title("Experts")
    wanted = st.query_params.get("run")
    if wanted:  # a deep link: the run list and this run's view on one connection
        query_all(*runs_calls(), _view_call(wanted))
    runs = runs_table()
    run = pick_run(runs)
    if run is None:
        return
    wkey = f"experts_window_{run}"
    view = query(*_view_call(run))
    if view is None:
        st.info("This run logged no `expert_load` events.")
        return
    ext, layers = view["extent"], view["extent"]["layers"]
    c1, c2 = st.columns([1, 4])
    with c1:
        st.session_state["experts_layer"] = view["layer"]
        layer = st.selectbox("Layer", layers, key="experts_layer")
        if st.query_params.get("layer") != str(layer):
            st.query_params["layer"] = str(layer)
    with c2:
        step_window(ext["first_step"], ext["last_step"], key=wkey, used=view["window"])
    st.caption(
        f"{len(layers)} layers × {ext['experts']} experts, steps {ext['first_step']:,}–{ext['last_step']:,}"
    )
    hm, series = view["heatmap"], view["series"]
    res = "every step" if hm["width"] == 1 else f"{hm['width']} steps per column"
    left, right = st.columns(2)
    with left:
        show_chart(
            heatmap_figure(hm, "share", f"Layer {layer}: load share ({res})"),
            key=f"experts_share_{run}",
            window_key=wkey,
        )
    with right:
        show_chart(
            heatmap_figure(hm, "drop_frac", f"Layer {layer}: dropped / routed ({res})"),
            key=f"experts_drop_{run}",
            window_key=wkey,
        )

    st.subheader("Hot experts")
    hot = qe.hot_experts(hm, top=10)
    st.dataframe(
        hot,
        hide_index=True,
        column_config={
            "share": st.column_config.NumberColumn("load share", format="percent"),
            "max_over_mean": st.column_config.NumberColumn("load / mean", format="%.2f×"),
            "peak_over_mean": st.column_config.NumberColumn("peak / mean", format="%.2f×"),
            "drop_fraction": st.column_config.NumberColumn("dropped", format="percent"),
        },
        key="experts_hot",
    )

    a, b = st.columns(2)
    with a:
        show_chart(
            layer_lines(series, "drop_fraction", "Drop fraction per layer", [int(layer)]),
            key=f"experts_layers_drop_{run}",
            window_key=wkey,
        )
    with b:
        show_chart(
            layer_lines(
                series, "hot_max", "Hot expert: max / mean load per layer (worst step)", [int(layer)]
            ),
            key=f"experts_layers_hot_{run}",
            window_key=wkey,
        )
