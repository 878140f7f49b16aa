"""Experts: where the router sends tokens, per layer, and where capacity cuts them.

First the drop fraction of every layer over the step window (layer x step
heatmap: 48 rows for the reference run, the open layer outlined); the layer
picker (its labels give each layer's drop fraction and findings) or `?layer=`
opens a layer: its experts x steps heatmaps of load share and of
dropped / routed, experts by id (0 on top) with the hot and dead
experts marked; the busiest experts of the window, and the hot/dead-expert
detectors' findings with their thresholds; then drop fraction and hot-expert
ratio over time for every layer. All read ingest-time rollups, so a 10^9-row
store answers in milliseconds.
"""

from __future__ import annotations

import math
import re

import numpy as np
import polars as pl
import streamlit as st

from observatory.dashboard.cache import derive, query_all
from observatory.dashboard.charts import expert_heatmap, layer_band, layer_heatmap, scatter
from observatory.dashboard.runs_table import is_running, run_row, runs_calls
from observatory.dashboard.widgets import pick_run, requested_window, show_chart, step_window
from observatory.detect.thresholds import Thresholds
from observatory.events import RUN_ID_RE
from observatory.queries import experts as qe

LAYER_KEY = "experts_layer"
MANY_LAYERS = 8  # more layers than this: the per-layer charts draw a band across layers, not a line each


WORST_COLOR = "#d62728"  # the worst layer's line: red and bold, whatever the palette gives the others
Y_TITLES = {"drop_fraction": "dropped / routed", "hot_max": "busiest expert / mean load"}


def _axes(column: str) -> dict:
    return {"xaxis": {"title": {"text": "step"}}, "yaxis": {"title": {"text": Y_TITLES.get(column, column)}}}


def worst_layer(df: pl.DataFrame, column: str) -> int | None:
    """The layer with the highest mean `column` over the window (None when it has no values)."""
    means = (
        df.filter(pl.col(column).is_not_null()).group_by("layer").agg(pl.col(column).cast(pl.Float64).mean())
    )
    return int(means.sort([column, "layer"], descending=[True, False])["layer"][0]) if means.height else None


def layer_lines(df: pl.DataFrame, column: str, title: str, layers: list[int]) -> dict:
    """One line per layer of `column` over step buckets: the worst layer (highest mean) bold red, the chosen
    layers bold, the others faint; the title names the worst."""
    worst = worst_layer(df, column)
    data = []
    for layer in df["layer"].unique(maintain_order=True).to_list():
        d = df.filter(df["layer"] == layer)
        bold = layer in layers or layer == worst
        line: dict = {"width": 2.5 if layer == worst else 2 if bold else 0.8}
        if layer == worst:
            line["color"] = WORST_COLOR
        data.append(
            scatter(
                x=d["step"].to_list(),
                y=d[column].to_list(),
                mode="lines",
                name=f"layer {layer}" + (" (worst)" if layer == worst else ""),
                line=line,
                opacity=1.0 if bold else 0.35,
                hovertemplate="step %{x}: %{y:.4g}<extra>layer " + str(layer) + "</extra>",
            )
        )
    return {"data": data, "layout": _layers_layout(title, worst, column)}


def _layers_layout(title: str, worst: int | None, column: str) -> dict:
    """The layout of a chart of `column` over the layers, its title naming the worst layer."""
    return {
        "title": {
            "text": title + (f" · worst: layer {worst}" if worst is not None else ""),
            "font": {"size": 14},
        },
        "height": 300,
        "margin": {"l": 50, "r": 10, "t": 36, "b": 40},
        "dragmode": "select",
        **_axes(column),
    }


def layer_summary(df: pl.DataFrame, column: str, title: str, layer: int) -> dict:
    """`column` of every layer: a line each for a few layers; for many, a band across layers and the chosen one.

    The band's hover names the worst layer of each bucket; the title names the
    layer with the highest mean over the window.
    """
    if df["layer"].n_unique() <= MANY_LAYERS:
        return layer_lines(df, column, title, [layer])
    d = df.filter(pl.col(column).is_not_null()).with_columns(pl.col(column).cast(pl.Float64))
    per = (
        d.group_by("step_lo")
        .agg(
            pl.col("step").max(),
            pl.col(column).min().alias("min"),
            pl.col(column).max().alias("max"),
            pl.col(column).mean().alias("mean"),
            pl.col("layer").sort_by(column).last().cast(pl.Int64).alias("worst_layer"),
            pl.col("layer").n_unique().alias("n_layers"),
        )
        .sort("step")
    )
    w = worst_layer(d, column)
    mine = d.filter(pl.col("layer") == layer)
    lines = [(layer, "#1f77b4", 2)] + ([(w, WORST_COLOR, 2.5)] if w is not None and w != layer else [])
    fig = {
        "data": [
            *layer_band(per, "layers"),
            *(
                scatter(
                    x=one["step"].to_numpy(),
                    y=one[column].to_numpy(),
                    mode="lines",
                    name=f"layer {k}" + (" (worst)" if k == w else ""),
                    line={"color": color, "width": width},
                    hovertemplate="step %{x}: %{y:.4g}<extra>layer " + str(k) + "</extra>",
                )
                for k, color, width in lines
                for one in [mine if k == layer else d.filter(pl.col("layer") == k)]
            ),
        ],
        "layout": {**_layers_layout(title, w, column), "legend": {"orientation": "h", "y": -0.3}},
    }
    return fig


def _marked(findings: pl.DataFrame) -> dict[int, str]:
    """Expert id -> y tick text for one layer's findings: hot in red, dead in grey (hot wins)."""
    out: dict[int, str] = {}
    for det, e in findings.select("detector", "expert").iter_rows():
        if e is None:
            continue
        if det == "hot_expert":
            out[int(e)] = f'<span style="color:#d62728"><b>{e} hot</b></span>'
        else:
            out.setdefault(int(e), f'<span style="color:#555555">{e} dead</span>')
    return out


def _view_call(run: str) -> tuple:
    """The page's one data query for `run`: layer from the widget or ?layer=, window from the slider."""
    qp_layer = st.query_params.get("layer")
    layer = st.session_state.get(LAYER_KEY)
    if layer is None and qp_layer is not None:
        if re.fullmatch(
            r"[0-9]{1,6}", qp_layer
        ):  # "²" is a digit to str.isdigit; 5,000 digits overflow int()
            layer = int(qp_layer)
        else:
            st.caption("Ignored `?layer=`: not a layer number.")
    return (qe.experts_view, run, layer, *requested_window(f"experts_window_{run}"), 400, 500)


def _resolution(width: int) -> str:
    return "every step" if width == 1 else f"{width} steps per column"


def _layer_format(ov: dict, findings: pl.DataFrame):
    """Layer picker labels: the layer's mean drop fraction over the window and its findings."""
    with np.errstate(all="ignore"):
        mean = {int(x): float(np.nanmean(r)) for x, r in zip(ov["layers"], ov["drop_frac"], strict=True)}
    counts = {}
    for layer, det, n in findings.group_by("layer", "detector").len().iter_rows():
        counts.setdefault(layer, []).append(f"{n} {det.split('_')[0]}")

    def fmt(layer: int) -> str:
        drop = mean.get(int(layer), math.nan)
        text = f"layer {layer}" + (f" · {drop:.1%} dropped" if math.isfinite(drop) else "")
        return text + (f" · {', '.join(sorted(counts[layer]))}" if layer in counts else "")

    return fmt


def _findings_table(findings: pl.DataFrame, layer: int) -> None:
    th = Thresholds.from_settings()
    st.subheader("Hot and dead experts")
    st.caption(
        f"Findings of the detectors (`anomaly` events): **hot**: the busiest expert takes more than "
        f"{th.hot_ratio:g}× the mean load; **dead**: an expert gets no tokens; each for "
        f"{th.expert_steps} logged steps in a row (settings `anomaly_hot_ratio`, `anomaly_expert_steps`)."
    )
    mine = findings.filter(pl.col("layer") == layer)
    if mine.height == 0:
        st.caption(f"None in layer {layer} in this window.")
    else:
        st.dataframe(
            mine.select(
                pl.col("detector").str.replace("_expert", "").alias("finding"),
                "expert",
                "first_step",
                "last_step",
                pl.when(pl.col("detector") == "hot_expert").then(pl.col("value")).alias("load_over_mean"),
            ),
            hide_index=True,
            column_config={
                "first_step": st.column_config.NumberColumn("from step", format="%d"),
                "last_step": st.column_config.NumberColumn("to step", format="%d"),
                "load_over_mean": st.column_config.NumberColumn("load / mean", format="%.1f×"),
            },
            key="experts_findings",
        )
    others = (
        findings.filter(pl.col("layer") != layer)
        .group_by("layer", "detector")
        .len()
        .sort("layer", "detector")
    )
    if others.height:
        per = {}
        for lay, det, n in others.iter_rows():
            per.setdefault(lay, []).append(f"{n} {det.split('_')[0]}")
        shown = list(per.items())[:12]
        more = f" and {len(per) - len(shown)} more layers" if len(per) > len(shown) else ""
        st.caption("Other layers: " + "; ".join(f"layer {k}: {', '.join(v)}" for k, v in shown) + more + ".")


def overview_figure(view: dict) -> dict:
    """The layer x step heatmap of drop fraction, the open layer outlined."""
    ov = view["overview"]
    return layer_heatmap(ov, view["layer"], f"Drop fraction, every layer ({_resolution(ov['width'])})")


def layer_figures(view: dict, layer: int) -> dict:
    """The open layer's heatmaps, its busiest experts and the per-layer summaries, from the cached view.

    A pure function of the shared answer: built once for all viewers (`cache.derive`).
    """
    hm, series, findings = view["heatmap"], view["series"], view["findings"]
    order = np.argsort(hm["experts"], kind="stable")  # rows by expert id; the busiest are in the table
    marked = _marked(findings.filter(pl.col("layer") == layer))
    res = _resolution(hm["width"])
    return {
        "share": expert_heatmap(hm, "share", order, marked, f"Layer {layer}: load share ({res})"),
        "drop": expert_heatmap(hm, "drop_frac", order, marked, f"Layer {layer}: dropped / routed ({res})"),
        "hot": qe.hot_experts(hm, top=10).to_arrow(),  # Arrow: st.dataframe sends it as it is
        "layers_drop": layer_summary(series, "drop_fraction", "Drop fraction per layer", layer),
        "layers_hot": layer_summary(
            series, "hot_max", "Hot expert: max / mean load per layer (worst step)", layer
        ),
    }


def render() -> None:
    st.title("Experts")
    wanted = st.query_params.get("run")
    if wanted and RUN_ID_RE.fullmatch(
        wanted
    ):  # a deep link: the run list and this run's view on one connection
        query_all(*runs_calls(runs=[wanted], limit=1), _view_call(wanted))
    run = pick_run()
    if run is None:
        return
    wkey = f"experts_window_{run}"
    # a running run's view is kept fresh in the background while viewers keep asking for it (as the
    # Live panel's is: the keeper refills both on one connection after each commit), so a viewer
    # arriving after a commit finds it filled rather than waits for the store
    live = is_running(run_row(run))
    view = query_all(_view_call(run), keep_fresh=live)[0]
    if view is None:
        st.info("This run logged no `expert_load` events.")
        return
    ext, layers = view["extent"], view["extent"]["layers"]
    ov, findings = view["overview"], view["findings"]
    st.caption(
        f"{len(layers)} layers × {ext['experts']} experts, steps {ext['first_step']:,}–{ext['last_step']:,}"
    )
    show_chart(derive(overview_figure, view), key=f"experts_overview_{run}", window_key=wkey)
    c1, c2 = st.columns([1, 3])
    with c1:
        st.session_state[LAYER_KEY] = view["layer"]
        layer = st.selectbox("Layer", layers, key=LAYER_KEY, format_func=_layer_format(ov, findings))
        if st.query_params.get("layer") != str(layer):
            st.query_params["layer"] = str(layer)
    with c2:
        step_window(ext["first_step"], ext["last_step"], key=wkey, used=view["window"])

    figs = derive(layer_figures, view, int(layer))
    left, right = st.columns(2)
    with left:
        show_chart(figs["share"], key=f"experts_share_{run}", window_key=wkey)
    with right:
        show_chart(figs["drop"], key=f"experts_drop_{run}", window_key=wkey)

    busy, flagged = st.columns(2)
    with busy:
        st.subheader("Busiest experts")
        st.caption(f"Layer {layer}, this window: load over the mean expert's.")
        st.dataframe(
            figs["hot"],
            hide_index=True,
            column_config={
                "share": st.column_config.NumberColumn("load share", format="percent"),
                "max_over_mean": st.column_config.NumberColumn("load / mean", format="%.2f×"),
                "peak_over_mean": st.column_config.NumberColumn("peak / mean", format="%.2f×"),
                "drop_fraction": st.column_config.NumberColumn("dropped", format="percent"),
            },
            key="experts_hot",
        )
    with flagged:
        _findings_table(findings, int(layer))

    a, b = st.columns(2)
    with a:
        show_chart(figs["layers_drop"], key=f"experts_layers_drop_{run}", window_key=wkey)
    with b:
        show_chart(figs["layers_hot"], key=f"experts_layers_hot_{run}", window_key=wkey)
