"""Ladder: a scaling ladder's rungs, its fit, its backtest, and the target against its forecast.

The ladder is chosen in the URL (`?ladder=NAME`). Four figures:

1. the rungs' eval curves against compute spent so far (log-log), with the target;
2. the fit: final eval loss against compute, the law and its band out to the target;
3. the backtest: the largest rung's curve against the band forecast from the others;
4. the target's curve over its PRE-REGISTERED band, read from the `forecast` event
   (not refit), with `ladder_deviation` anomalies marked.

The fit (seconds) is made once per ladder and data version and stored beside the store
(`ladder.stored`), so viewers, refreshes and a restarted dashboard reuse it until a rung's evals
change; then the older stored fit is drawn at once with "refitting…" beside it, and the page is
drawn again when the new one is ready.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import plotly.colors
import plotly.graph_objects as go
import streamlit as st

from observatory import settings
from observatory.dashboard.cache import query, query_all
from observatory.dashboard.charts import add_markers
from observatory.events import OBSERVATORY_HOST
from observatory.ladder import stored
from observatory.ladder.backtest import backtest
from observatory.ladder.fit import fit_ladder
from observatory.ladder.rungs import Rung, average_seeds, fit_version
from observatory.ladder.watch import left_out, load_ladder
from observatory.markup import md_escape, plot_text
from observatory.queries import ladder as ql

BAND = "rgba(31, 119, 180, 0.18)"


def ladder_data(con, name: str) -> dict:
    """Module-level query for the page cache: rungs and targets of one ladder as plain dicts."""
    rungs, targets, ds = load_ladder(con, name)
    return {
        "rungs": [{**r.__dict__, "curve": {str(k): v for k, v in r.curve.items()}} for r in rungs],
        "targets": [
            {
                "run": t["run"],
                "ladder": t["ladder"],
                "steps": t["steps"],
                "status": t["status"],
                "curve": {str(k): v for k, v in t["curve"].items()},
            }
            for t in targets
        ],
        "dataset": ds,
        "left_out": left_out(con, name),
    }


def _rungs(data: dict) -> list[Rung]:
    return [Rung(**{**r, "curve": {float(k): v for k, v in r["curve"].items()}}) for r in data["rungs"]]


@st.cache_data(max_entries=16, show_spinner="Fitting the ladder…")
def _fit(name: str, version: str, _rungs: list[Rung]):
    """(fit, backtest or None) of the ladder at its data version: this process's, else the one stored beside
    the store (`ladder.stored`), else fitted now and stored (the `_rungs` argument is not hashed)."""
    db = settings.get("db")
    hit = stored.load(db, name, version)
    if hit is not None:
        return hit
    fit = fit_ladder(_rungs, name=name)
    bt = backtest(_rungs, name=name) if len({r.rung for r in _rungs}) >= 4 else None
    stored.save(db, name, version, (fit, bt))
    return fit, bt


def _fit_now_or_stale(name: str, version: str, rungs: list[Rung]) -> tuple[Any, bool]:
    """(fit and backtest, stale): this version's fit when made (here or stored), else the ladder's newest
    stored fit of an older version, to show at once while this one is made (stale True)."""
    db = settings.get("db")
    if stored.load(db, name, version) is None:
        old = stored.latest(db, name)
        if old is not None:
            return old, True
    return _fit(name, version, rungs), False


def _rung_curve(r: Rung, hover: str, **style) -> go.Scatter:
    """A rung's loss over the compute it has spent, `hover` naming it in the tooltip."""
    fr = sorted(r.curve)
    return go.Scatter(
        x=[f * r.flops for f in fr],
        y=[r.curve[f] for f in fr],
        hovertemplate="C=%{x:.3g}: %{y:.4f}<extra>" + hover + "</extra>",
        **style,
    )


def rung_curves_figure(rungs: list[Rung], targets: list[dict]) -> go.Figure:
    """Each rung's curve (the mean of its seeds, bold) with its seeds' curves (thin, one legend
    entry per rung: a ladder of 4 rungs x 24 seeds is 4 entries, not 96)."""
    fig = go.Figure()
    palette = plotly.colors.qualitative.Plotly
    for i, m in enumerate(average_seeds(rungs)):
        color = palette[i % len(palette)]
        seeds = [r for r in rungs if r.rung == m.rung] if m.n_seeds > 1 else []
        for r in seeds:
            fig.add_trace(
                _rung_curve(
                    r,
                    r.run,
                    mode="lines",
                    legendgroup=plot_text(m.rung),
                    showlegend=False,
                    opacity=0.35,
                    line={"width": 1, "color": color},
                    name=plot_text(f"{m.rung} seed {r.seed}"),  # a rung's name is a log's text
                )
            )
        label = plot_text(m.rung if m.n_seeds == 1 else f"{m.rung} (mean of {m.n_seeds} seeds)")
        fig.add_trace(
            _rung_curve(
                m,
                label,
                mode="lines+markers",
                legendgroup=plot_text(m.rung),
                name=label,
                line={"width": 3, "color": color},
            )
        )
    for t in targets:
        flops = t["ladder"].get("flops")
        if not flops or not t["curve"]:
            continue
        fr = sorted(float(k) for k in t["curve"])
        fig.add_trace(
            go.Scatter(
                x=[f * flops for f in fr],
                y=[t["curve"][str(f)] for f in fr],
                mode="lines+markers",
                name=f"target {t['run']}",
                line={"dash": "dot", "width": 3},
            )
        )
    fig.update_layout(
        xaxis={"type": "log", "title": "compute spent so far (FLOPs)"},
        yaxis={"type": "log", "title": "eval loss"},
        height=420,
        margin={"t": 30},
    )
    return fig


def _point(flops: float, y: float, name: str, marker: dict, **kw) -> go.Scatter:
    """One target's marker at its compute: its forecast or its actual final loss."""
    return go.Scatter(x=[flops], y=[y], mode="markers", name=name, marker=marker, **kw)


def fit_figure(fit, targets: list[dict]) -> go.Figure:
    cs = [r.flops for r in fit.rungs]
    t_flops = [float(t["ladder"]["flops"]) for t in targets if t["ladder"].get("flops")]
    grid = np.geomspace(min(cs) / 1.5, max(cs + t_flops) * 1.5, 80)
    v, lo, hi = fit.predict(1.0, grid)
    band = (
        [
            go.Scatter(
                x=np.r_[grid, grid[::-1]],
                y=np.r_[hi, lo[::-1]],
                fill="toself",
                fillcolor=BAND,
                line={"width": 0},
                name=f"{fit.config.level:.0%} band",
                hoverinfo="skip",
            )
        ]
        if fit.has_band
        else []
    )
    fig = go.Figure(
        [
            *band,
            go.Scatter(x=grid, y=v, mode="lines", name="fit L(C) = E + A·C^-α", line={"color": "#1f77b4"}),
            go.Scatter(
                x=cs,
                y=[r.final_loss for r in fit.rungs],
                mode="markers",
                name="rungs (final eval)",
                marker={"size": 10, "color": "#333"},
                text=[plot_text(r.rung) for r in fit.rungs],
                hovertemplate="%{text}: C=%{x:.3g}, loss %{y:.4f}<extra></extra>",
            ),
        ]
    )
    for t in targets:
        flops = t["ladder"].get("flops")
        if not flops:
            continue
        fv, flo, fhi = (a[0] for a in fit.predict(1.0, [flops]))
        err = {"type": "data", "symmetric": False, "array": [fhi - fv], "arrayminus": [fv - flo]}
        forecast = {"symbol": "diamond", "size": 11, "color": "#ff7f0e"}
        fig.add_trace(
            _point(flops, fv, f"forecast {t['run']}", forecast, error_y=err if fit.has_band else None)
        )
        final = t["curve"].get("1.0")
        if final is not None:
            actual = {"symbol": "star", "size": 13, "color": "#d62728"}
            fig.add_trace(_point(flops, final, f"actual {t['run']}", actual))
    fin = fit.final
    fig.update_layout(
        xaxis={"type": "log", "title": "training compute C (FLOPs)"},
        yaxis={"type": "log", "title": "final eval loss"},
        height=420,
        margin={"t": 30},
        title=f"E = {fin.E:.3f}, A = {fin.a_abs:.3g}, α = {fin.alpha:.3f}",
    )
    return fig


def band_text(fit) -> str:
    """Which noise the band used and where it came from, and how its held-out term was measured."""
    src = {"given": "given (--noise)", "default": "the default: no seeds to measure it from"}
    held = {
        "measured": "the largest rung's error predicted from the smaller ones",
        "proxy": "NOT measured (as many free parameters as rungs): the E = 0 law's error stands in",
        "none": "none: no band",
    }[fit.held_out]
    e = (
        ""
        if not fit.e_fits
        else f"; E across [{fit.config.e_range[0]:g}, {fit.config.e_range[1]:g}], the band "
        f"the envelope of {len(fit.e_fits) + 1} fits"
    )
    return (
        f"Run-to-run noise {100 * fit.noise:.2f}% per run (1σ; {src.get(fit.noise_source, fit.noise_source)}); "
        f"held-out error: {held}{e}."
    )


def registration_text(fc: dict) -> str:
    """Who wrote a target's forecast and when, against the target's start: what a reader checks (the line's
    `sig` against the signer's public key, its `t` against the run's first event)."""

    def when(t) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if isinstance(t, (int, float)) else "?"

    kid = fc.get("signed_by")
    who = (
        f"Signed by key {kid}"
        if fc.get("host") == OBSERVATORY_HOST and isinstance(kid, str)
        else f"Written by the run's own writer (host {fc.get('host')}), not signed by the observatory"
    )
    t, started = fc.get("t"), fc.get("started")
    if not isinstance(started, (int, float)):
        return f"{who}, registered at {when(t)}; the target has not started."
    order = "before" if isinstance(t, (int, float)) and t < started else "NOT before"
    return f"{who}, registered at {when(t)}, {order} the target's first step at {when(started)}."


def unregistered_text(fit, t: dict) -> str:
    """A target without a forecast event (an imported one, with its actual loss): the fit's forecast against it."""
    flops, final = t["ladder"].get("flops"), t["curve"].get("1.0")
    if not flops or final is None:
        return f"{t['run']}: no forecast event (not pre-registered)."
    v, lo, hi = (float(a[0]) for a in fit.predict(1.0, [flops]))
    if not fit.has_band:
        return (
            f"{t['run']}: not pre-registered; the fit above forecasts {v:.4f} (no band), actual {final:.4f}."
        )
    inside = "inside" if lo <= final <= hi else "OUTSIDE"
    return (
        f"{t['run']}: not pre-registered; the fit above forecasts {v:.4f} [{lo:.4f}, {hi:.4f}], "
        f"actual {final:.4f} ({100 * (v / final - 1):+.2f}%): {inside} the band."
    )


def rung_table(rungs: list[Rung], fit) -> list[dict]:
    """The rungs table: a column no rung has (an imported ladder's params and tokens) is left out, a
    missing value is "—", never "None"."""
    rows = [
        {
            "rung": r.rung,
            "run": r.run,
            "seed": r.seed,
            "active params": r.params_active,
            "total params": r.params_total,
            "tokens": r.tokens,
            "FLOPs": f"{r.flops:.3g}",
            "final eval loss": r.final_loss,
            "fit": float(fit.final(r.flops)[()]),
        }
        for r in rungs
    ]
    keep = [k for k in rows[0] if any(row[k] is not None for row in rows)] if rows else []
    return [{k: "—" if row[k] is None else row[k] for k in keep} for row in rows]


def backtest_text(bt) -> str:
    """The backtest of a ladder of final losses: the largest rung's final loss forecast from the others."""
    band = (
        ""
        if bt.held_out_basis == "none"
        else f" [{bt.final_low:.4f}, {bt.final_high:.4f}]"
        + (": inside the band" if bt.final_low <= bt.final_obs <= bt.final_high else ": OUTSIDE the band")
    )
    return (
        f"The largest rung, {bt.held_out} (C = {bt.flops:.3g} FLOPs), forecast from the smaller rungs: "
        f"final eval loss {bt.final_pred:.4f}{band}; observed {bt.final_obs:.4f} ({bt.final_error_pct:+.2f}%)."
    )


def _asked_flops(raw: str) -> float | None:
    """The compute a forecast is asked for (the box, or `?flops=` from the link `observatory ladder forecast
    --flops` prints), or None when it is not a number > 0."""
    try:
        c = float(raw) if raw.strip() else None
    except ValueError:
        return None
    return c if c is not None and c > 0 and np.isfinite(c) else None


def asked_text(fit, flops: float) -> str:
    """The forecast at `flops` FLOPs, as `observatory ladder forecast --flops` prints it."""
    v, lo, hi = (float(a[0]) for a in fit.predict(1.0, [flops]))
    band = f" [{lo:.4f}, {hi:.4f}] ({fit.config.level:.0%} band)" if fit.has_band else " (no band)"
    return f"Forecast at C = {flops:.4g} FLOPs: final eval loss {v:.4f}{band}."


def band_figure(
    points: list[dict], observed: list[tuple[int, float]], title: str, marks: list[dict] = ()
) -> go.Figure:
    pts = sorted((p for p in points if p.get("step") is not None), key=lambda p: p["step"])
    x = [p["step"] for p in pts]
    fig = go.Figure(
        [
            go.Scatter(
                x=x + x[::-1],
                y=[p["high"] for p in pts] + [p["low"] for p in pts][::-1],
                fill="toself",
                fillcolor=BAND,
                line={"width": 0},
                name="forecast band",
                hoverinfo="skip",
            ),
            go.Scatter(
                x=x, y=[p["value"] for p in pts], mode="lines", name="forecast", line={"dash": "dash"}
            ),
        ]
    )
    if observed:
        fig.add_trace(
            go.Scatter(
                x=[s for s, _ in observed],
                y=[v for _, v in observed],
                mode="lines+markers",
                name="observed eval loss",
                line={"color": "#d62728"},
            )
        )
    for a in marks:
        w = a.get("window") or [a.get("step")]
        fig.add_vrect(
            x0=w[0],
            x1=w[-1],
            fillcolor="rgba(255,127,14,0.15)",
            line_width=0,
            annotation_text="ladder deviation",
            annotation_position="top left",
        )
    fig.update_layout(
        xaxis={"title": "step"}, yaxis={"title": "eval loss"}, height=380, margin={"t": 40}, title=title
    )
    return fig


def render() -> None:
    stale = _render()
    if stale is not None:  # the page is drawn with the older fit: make this version's, then draw it
        name, version, rungs = stale
        try:
            _fit(name, version, rungs)
        except ValueError:
            pass  # the rerun says why
        st.rerun()


def _render() -> tuple[str, str, list[Rung]] | None:
    """Draw the page; (name, version, rungs) when it drew an older stored fit (`_fit_now_or_stale`)."""
    st.title("Scaling ladder")
    names = [d["name"] for d in query(ql.ladders)]
    if not names:
        st.info(
            "No ladder in the store yet. Train one with "
            "`trainer ladder --config trainer/configs/ladder_cpu.yaml --target`, then `observatory ingest`."
        )
        return
    qp = st.query_params
    default = qp.get("ladder") if qp.get("ladder") in names else names[0]
    name = st.selectbox("Ladder", names, index=names.index(default), key="ladder_name")
    if qp.get("ladder") != name:
        qp["ladder"] = name
    try:
        data = query(ladder_data, name)
    except ValueError as e:
        st.error(md_escape(e))
        return
    for note in data["left_out"]:
        st.warning(md_escape(note))
    rungs = _rungs(data)
    version = fit_version(rungs)
    try:
        (fit, bt), stale = _fit_now_or_stale(name, version, rungs)
    except ValueError as e:
        st.warning(f"Cannot fit this ladder yet: {md_escape(e)}")
        st.plotly_chart(rung_curves_figure(rungs, data["targets"]), key="ladder_rungs")
        return
    targets = data["targets"]
    fin = fit.final
    if stale:
        st.caption("⏳ refitting… (the rungs changed since this fit: it is shown until the new one is ready)")
    cols = st.columns(4)
    cols[0].metric(
        "Rungs",
        len(fit.rungs),
        help=f"{len(rungs)} runs (a rung's seeds are averaged); eval dataset {data['dataset']}",
    )
    cols[1].metric("α (final loss)", f"{fin.alpha:.3f}", help=f"E = {fin.E:.3f}, A = {fin.a_abs:.3g}")
    if bt is not None:
        cols[2].metric(
            "Backtest final-loss error",
            f"{bt.final_error_pct:+.2f}%",
            help=f"{bt.held_out} forecast from the smaller rungs",
        )
        cols[3].metric(
            "Backtest points in band",
            "no band" if bt.held_out_basis == "none" else f"{bt.coverage:.0%}",
            help="; ".join(bt.warnings) or None,
        )

    st.subheader("Rungs")
    st.plotly_chart(rung_curves_figure(rungs, targets), key="ladder_rungs", config={"displaylogo": False})
    st.dataframe(rung_table(rungs, fit), hide_index=True)

    st.subheader("Fit")
    for w in fit.warnings:
        st.warning(md_escape(w))
    st.caption(
        "Huber on log residuals (δ = 1e-3), L-BFGS-B; E shared across schedule fractions. Band: bootstrap "
        "over whole rungs and noise refits, widened by the forward error (the largest rung predicted from the "
        "smaller ones) and the run-to-run noise."
    )
    st.caption(md_escape(band_text(fit)))
    st.plotly_chart(fit_figure(fit, targets), key="ladder_fit", config={"displaylogo": False})

    raw = st.text_input(
        "Forecast the final eval loss at compute C (FLOPs)",
        value=st.query_params.get("flops", ""),
        placeholder="e.g. 5.76e23",
        key="ladder_flops",
    )
    if raw != st.query_params.get("flops", ""):
        st.query_params["flops"] = raw
    asked = _asked_flops(raw)
    if asked is not None:
        st.markdown(md_escape(asked_text(fit, asked)))
    elif raw.strip():
        st.warning(f"{md_escape(raw[:40])} is not a compute in FLOPs (a number > 0, e.g. 5.76e23).")

    if bt is not None:
        st.subheader("Backtest")
        for w in bt.warnings:
            st.warning(md_escape(f"Backtest fit ({len(fit.rungs) - 1} rungs): {w}"))
        obs = [(p["step"], p["observed"]) for p in bt.points if p["observed"] is not None]
        if len({p["step"] for p in bt.points if p.get("step") is not None}) < 2:
            # final losses alone (an imported ladder): one point is no curve; say the forecast and the result
            st.markdown(md_escape(backtest_text(bt)))
        else:
            st.plotly_chart(
                band_figure(
                    bt.points,
                    obs,
                    f"{bt.held_out} forecast from the smaller rungs: final "
                    f"{bt.final_pred:.4f} vs {bt.final_obs:.4f} ({bt.final_error_pct:+.2f}%), "
                    f"{bt.coverage:.0%} of points in band",
                ),
                key="ladder_backtest",
                config={"displaylogo": False},
            )

    st.subheader("Targets")
    if not targets:
        st.info(
            "No target run yet: `trainer ladder --config ... --target` pre-registers a forecast and trains one."
        )
    for t in targets:
        forecasts, evals, devs, decided = query_all(
            (ql.forecast_events, t["run"]),
            (ql.eval_points, [t["run"]]),
            (ql.deviation_anomalies, t["run"]),
            (ql.decision_markers, name),
        )
        if not forecasts:
            st.info(md_escape(unregistered_text(fit, t)))
            continue
        fc = forecasts[-1]
        obs = [(e["step"], e["loss"]) for e in evals if e["dataset"] in (None, fc.get("dataset"))]
        pre = "pre-registered" if fc.get("pre_registered") else "NOT pre-registered"
        fig = band_figure(
            fc.get("points") or [],
            obs,
            f"{t['run']} against its {pre} forecast "
            f"({fc.get('value', float('nan')):.4f} [{fc.get('low', 0):.4f}, "
            f"{fc.get('high', 0):.4f}])",
            devs,
        ).to_dict()
        # the ladder's decisions (recipe changes, forecasts, outcomes) at their steps, as on the Live page
        add_markers(fig, decided, y_at=max((v for _, v in obs), default=fc.get("high")))
        st.plotly_chart(fig, key=f"ladder_target_{t['run']}", config={"displaylogo": False})
        st.caption(md_escape(registration_text(fc)))
        final = t["curve"].get("1.0")
        if final is not None:
            inside = fc["low"] <= final <= fc["high"]
            st.write(
                f"Final eval loss {final:.4f}: {'inside' if inside else '**outside**'} the forecast band."
                + (f" {len(devs)} deviation anomaly(ies)." if devs else "")
            )
    return (name, version, rungs) if stale else None
