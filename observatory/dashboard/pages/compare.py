"""Compare: runs overlaid on one metric (x = step, tokens or FLOPs), a config diff, and lineage.

The chosen runs live in the URL (`?runs=a,b&metric=train/loss&x=tokens`).
Lineage comes from `observatory.lineage` (forks and resumes from run_start's
`parent`); the stitched curve is downsampled per segment in SQL like any other.
"""

from __future__ import annotations

import json
from typing import Any

import plotly.graph_objects as go
import polars as pl
import streamlit as st

from observatory.dashboard.cache import query, query_all
from observatory.dashboard.charts import series_figure
from observatory.dashboard.pages.live import SMOOTHING, axis_title
from observatory.dashboard.runs_table import runs_table
from observatory.dashboard.widgets import requested_window, show_chart, step_window
from observatory.events import RUN_ID_RE
from observatory.lineage import Lineage
from observatory.markup import md_escape, plot_text
from observatory.queries import dashboard as qd
from observatory.queries import lineage as ql
from observatory.redact import redacted_note

X_AXES = {"step": "step", "tokens": "tokens", "FLOPs": "flops"}


def flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    """A nested config as {dotted.key: leaf value} (lists are leaves)."""
    if isinstance(config, dict):
        out: dict[str, Any] = {}
        for k, v in config.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): config}


def config_diff(a: dict, b: dict) -> list[dict[str, str]]:
    """Rows {key, a, b} for every dotted key whose value differs (a missing key shows as '—')."""
    fa, fb = flatten(a or {}), flatten(b or {})
    rows = []
    for k in sorted(set(fa) | set(fb)):
        va, vb = fa.get(k, _MISSING), fb.get(k, _MISSING)
        if va != vb:
            rows.append({"key": k, "a": _show(va), "b": _show(vb)})
    return rows


_MISSING = object()


def _show(v: Any) -> str:
    return "—" if v is _MISSING else json.dumps(v) if not isinstance(v, str) else v


def _overlay(runs: list[str], metric: str, x: str, smoothing: float) -> None:
    view = query(qd.runs_view, runs, metric, *requested_window("compare_window"), 1000)
    if view["extent"] is None:
        st.info(f"None of these runs logged {md_escape(metric)}.")
        return
    step_window(*view["extent"], key="compare_window", used=view["window"])
    df = view["data"]
    col = X_AXES[x]
    if col != "step":
        missing = df.filter(df[col].is_null())["run"].unique().to_list()
        if missing:
            st.warning(
                f"No {x} for {', '.join(missing)} (needs `data/tokens`"
                + (" and model.flops_per_token in run_start" if col == "flops" else "")
                + "); those points are left out."
            )
        df = df.filter(df[col].is_not_null())
    fig = series_figure(
        df, plot_text(metric), smoothing, x=col, group="run", height=420, y_title=axis_title(metric)
    )
    fig["layout"]["xaxis"]["title"] = {"text": plot_text(x)}
    show_chart(fig, key="compare_overlay", window_key="compare_window" if col == "step" else None)


def _lineage(run: str, metric: str) -> None:
    info = query(lineage_view, run, metric)
    if info is None:
        st.info(f"Run {md_escape(repr(run))} is not in the store.")
        return
    st.plotly_chart(
        lineage_graph(info["tree"], run), key="compare_lineage_graph", config={"displaylogo": False}
    )
    fig = go.Figure()
    pieces = info["pieces"]
    for i, (r, d) in enumerate(pieces):
        fig.add_trace(
            go.Scatter(
                x=d["step"].to_list(),
                y=d["last"].to_list(),
                mode="lines",
                name=r,
                hovertemplate="%{x}: %{y:.4g}<extra>" + r + "</extra>",
            )
        )
        if i + 1 < len(pieces) and d.height:
            fig.add_vline(x=d["step"].max(), line={"dash": "dot", "color": "#999"})
    fig.update_layout(
        title={"text": plot_text(f"Stitched {metric}: root → {run}"), "font": {"size": 14}},
        xaxis={"title": {"text": "step"}},
        yaxis={"title": {"text": axis_title(metric)}},
        height=320,
        margin={"l": 50, "r": 10, "t": 36, "b": 40},
    )
    st.plotly_chart(fig, key="compare_lineage_curve", config={"displaylogo": False})


def lineage_view(con, run: str, metric: str) -> dict[str, Any] | None:
    """Tree and stitched curve of `run` in one unit of work (chain from observatory.lineage).

    The curve is each chain member's `metric` from just after its parent's cut to
    its own cut (the step its child forked at), downsampled in SQL per segment.
    """
    if ql.run_row(con, run) is None:
        return None
    chain = ql.ancestors(con, run)
    if not chain or chain[-1]["run"] != run:
        chain = [ql.run_row(con, run)]
    tree = ql.subtree(con, chain[0]["run"])
    segments = Lineage(run, metric, tuple(chain), tuple(tree)).segments
    pieces, start = [], None
    for r, cut in segments:
        ext = qd.metric_extent(con, [r], [metric])
        if ext is not None:
            lo = ext[0] if start is None else max(ext[0], start + 1)
            hi = ext[1] if cut is None else min(ext[1], cut)
            if hi >= lo:
                pieces.append((r, qd.downsample(con, r, [metric], lo, hi, 1000)))
        start = cut
    return {"tree": [dict(t) for t in tree], "pieces": pieces}


def lineage_graph(tree: list[dict], current: str) -> go.Figure:
    """The fork/resume tree as a left-to-right graph: x = depth, one row per run, edges labelled by step."""
    rows = sorted(tree, key=lambda r: (r.get("depth", 0), r["run"]))
    y = {r["run"]: i for i, r in enumerate(rows)}
    fig = go.Figure()
    for r in rows:
        p = r.get("parent_run")
        if p in y:
            fig.add_trace(
                go.Scatter(
                    x=[r.get("depth", 0) - 1, r.get("depth", 0)],
                    y=[y[p], y[r["run"]]],
                    mode="lines+text",
                    line={"color": "#aaa"},
                    text=["", f"@{r.get('parent_step')}"],
                    textposition="top left",
                    hoverinfo="skip",
                    showlegend=False,
                )
            )
    fig.add_trace(
        go.Scatter(
            x=[r.get("depth", 0) for r in rows],
            y=[y[r["run"]] for r in rows],
            mode="markers+text",
            text=[r["run"] for r in rows],
            textposition="middle right",
            marker={
                "size": [16 if r["run"] == current else 11 for r in rows],
                "color": ["#d62728" if r["run"] == current else "#1f77b4" for r in rows],
            },
            hovertext=[f"{r['run']} ({r.get('status') or '?'})" for r in rows],
            hoverinfo="text",
            showlegend=False,
        )
    )
    depth = max((r.get("depth", 0) for r in rows), default=0)
    fig.update_layout(
        title={"text": "Lineage (forks and resumes)", "font": {"size": 14}},
        height=max(160, 60 + 40 * len(rows)),
        margin={"l": 10, "r": 10, "t": 36, "b": 10},
        xaxis={"visible": False, "range": [-0.3, depth + 1.5]},
        yaxis={"visible": False, "autorange": "reversed"},
    )
    return fig


def _pair(ss, chosen: list[str]) -> None:
    """The config diff's runs A and B before their widgets: each one of `chosen`, and B not A while two are
    chosen. B kept a run of an earlier choice (the only run, when runs are picked one at a time), so a
    second pick left it equal to A."""
    if ss.get("compare_a") not in chosen:
        ss["compare_a"] = chosen[0]
    if ss.get("compare_b") not in chosen or (
        ss["compare_b"] == ss["compare_a"] and len(chosen) > 1 and ss.get("_compare_chosen") != chosen
    ):
        ss["compare_b"] = next((r for r in chosen if r != ss["compare_a"]), chosen[0])
    ss["_compare_chosen"] = list(chosen)


def _metric_param(name: str | None) -> str | None:
    """`?metric=` if it can be a metric name (at most 256 characters): a longer one is never queried."""
    return name if name is not None and 0 < len(name) <= 256 else None


def render() -> None:
    st.title("Compare")
    qp = st.query_params
    # the runs the link names that the store has, then a search (server-side: a lab has 10^5 runs) to add more
    linked = [r for r in (qp.get("runs") or "").split(",") if RUN_ID_RE.fullmatch(r)][:20]
    linked = [r["run"] for r in runs_table(runs=linked, limit=20)] if linked else []
    c1, c2 = st.columns([1, 3])
    text = c1.text_input("Find runs", key="compare_q", placeholder="id, prefix, name, tag, project")
    found = [r["run"] for r in runs_table(search=text.strip() or None)]
    if not found and not linked:
        st.info(f"No run matches {md_escape(repr(text))}." if text.strip() else "No runs in the store yet.")
        return
    ids = list(dict.fromkeys([*linked, *st.session_state.get("compare_runs", []), *found]))
    chosen = c2.multiselect("Runs", ids, default=linked or found[:2], key="compare_runs")
    if ",".join(chosen) != qp.get("runs", ""):
        qp["runs"] = ",".join(chosen)
    if not chosen:
        st.info("Pick one or more runs.")
        return

    # the three tabs' data on one connection, with the widgets' current (or default) choices;
    # a choice that differs later is simply another (cached) query
    ss = st.session_state
    _pair(ss, chosen)
    calls = [
        (qd.metric_names_for, chosen),
        (
            qd.runs_view,
            chosen,
            ss.get("compare_metric") or _metric_param(qp.get("metric")) or "train/loss",
            *requested_window("compare_window"),
            1000,
        ),
        (
            qd.run_configs,
            [ss.get("compare_a") or chosen[0], ss.get("compare_b") or chosen[min(1, len(chosen) - 1)]],
        ),
        (lineage_view, ss.get("compare_lineage_run") or chosen[0], "train/loss"),
    ]
    query_all(*calls)

    tab_overlay, tab_diff, tab_lineage = st.tabs(["Overlay", "Config diff", "Lineage"])
    with tab_overlay:
        names = query(qd.metric_names_for, chosen)
        if not names:
            st.info("These runs logged no metrics yet.")
        else:
            default = (
                qp.get("metric")
                if qp.get("metric") in names
                else ("train/loss" if "train/loss" in names else names[0])
            )
            c1, c2, c3 = st.columns([3, 2, 2])
            metric = c1.selectbox("Metric", names, index=names.index(default), key="compare_metric")
            x = c2.radio(
                "x axis",
                list(X_AXES),
                horizontal=True,
                key="compare_x",
                index=list(X_AXES).index(qp.get("x")) if qp.get("x") in X_AXES else 0,
            )
            smoothing = c3.slider(
                "Smoothing", 0.0, 0.99, SMOOTHING, 0.01, key="compare_smoothing"
            )  # as Live's
            if qp.get("metric") != metric:
                qp["metric"] = metric
            if qp.get("x", "step") != x:
                qp["x"] = x
            _overlay(chosen, metric, x, smoothing)
    with tab_diff:
        c1, c2 = st.columns(2)
        a = c1.selectbox("Run A", chosen, key="compare_a")
        b = c2.selectbox("Run B", chosen, key="compare_b")
        configs = query(qd.run_configs, [a, b])
        rows = config_diff(configs.get(a, {}), configs.get(b, {}))
        if a == b:
            st.info("Pick two different runs.")
        elif not rows:
            st.success("Same config (every key equal).")
        else:
            hidden = {r["run"]: r["redactions"] for r in runs_table(runs=[a, b])}
            notes = [f"{r}: {redacted_note(hidden[r])}" for r in (a, b) if hidden.get(r)]
            st.caption(f"{len(rows)} keys differ." + "".join(f" {md_escape(n)}." for n in notes))
            st.dataframe(pl.DataFrame(rows).rename({"a": a, "b": b}), hide_index=True, key="compare_diff")
    with tab_lineage:
        target = st.selectbox("Run", chosen, key="compare_lineage_run")
        _lineage(target, "train/loss")
