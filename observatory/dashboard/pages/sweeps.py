"""Sweeps: many runs at once, picked by a selection (`?sel=`), grouped, tabled, plotted and iso-FLOP-fitted.

Every choice lives in the URL (`?sel=project = moe and finished&metric=eval:eval&by=config.model.width`),
so a view pasted into an issue opens the same for everyone. The selection is parsed
(`observatory.queries.selection`) and runs in SQL as bound parameters; each view is one query over the
selected runs (`observatory.queries.sweeps`, `observatory.ladder.sweep`), and each has a CLI twin
(`observatory sweep ...`, `observatory isoflop`). Read-only: `observatory sweep compare --record` saves
a comparison as a decision.
"""

from __future__ import annotations

import streamlit as st

from observatory.dashboard.cache import query, query_all
from observatory.dashboard.sweeps_charts import (
    curves_figure,
    envelope_figure,
    isoflop_figure,
    parcoords_figure,
    pivot_markdown,
    scatter_figure,
)
from observatory.dashboard.widgets import show_chart
from observatory.ladder.sweep import compare_view, isoflop_view, pivot
from observatory.markup import md_escape
from observatory.queries.selection import MAX_TEXT, SelectionError, parse_selection
from observatory.queries.sweeps import (
    count_selected,
    final_values,
    group_curves,
    metric_choices,
    selected_roots,
    sweep_keys,
)

MAX_GROUPS = 12  # curves drawn at once; the page says when more groups match
MAX_VIEW_RUNS = 10_000  # selected runs a view draws; more: the page asks for a narrower selection
MAX_PARAM = 256  # characters of any other URL parameter
MAX_COLS, MAX_ROWS = 40, 200  # of the pivot table
X_AXES = {"step": "step", "tokens": "tokens", "FLOPs": "flops", "wall time (s)": "time"}
VIEWS = ("Curves", "Table", "Scatter", "Parallel coordinates", "Iso-FLOP", "Variant vs baseline")
EXAMPLE = "project = sweeps and config.optimizer.lr > 1e-3 and finished"


def _param(name: str) -> str | None:
    v = st.query_params.get(name)
    return v if v is not None and len(v) <= MAX_PARAM else None


def _sync(name: str, value) -> None:
    v = "" if value is None else str(value)
    if st.query_params.get(name, "") != v:
        if v:
            st.query_params[name] = v
        elif name in st.query_params:
            del st.query_params[name]


def _select(col, label: str, options: list, param: str, default=None, key: str = "", fmt=None):
    """A selectbox whose choice is the URL's `param` (when it is one of the options)."""
    want = _param(param)
    index = options.index(want) if want in options else (options.index(default) if default in options else 0)
    kw = {"format_func": fmt} if fmt else {}
    choice = col.selectbox(label, options, index=index, key=key or f"sweeps_{param}", **kw)
    _sync(param, choice)
    return choice


def _multi(col, label: str, options: list, param: str, max_n: int, default=(), key: str = "") -> list:
    want = [k for k in (_param(param) or "").split(",") if k in options][:max_n] or list(default)
    chosen = col.multiselect(label, options, default=want, max_selections=max_n, key=key or f"sweeps_{param}")
    _sync(param, ",".join(chosen))
    return chosen


def _selection(label: str, param: str, key: str, placeholder: str = EXAMPLE) -> str | None:
    """A selection text box tied to the URL; None (with the parse error shown) when it does not parse."""
    raw = st.query_params.get(param, "")
    text = st.text_input(
        label,
        value=raw[:MAX_TEXT],
        max_chars=MAX_TEXT,
        key=key,
        placeholder=placeholder,
        help="Clauses joined by `and`: project, group, tag, status, name, run, ladder, rung, started, "
        "ended, finished, or config.<key> (=, !=, <, <=, >, >=, ~, in (a, b)). See docs/ladder.md.",
    )
    _sync(param, text.strip())
    try:
        parse_selection(text)
    except SelectionError as e:
        st.error(md_escape(f"{label}: {e}"))
        return None
    return text.strip()


def _curves(sel: str, metric: str, keys: list[str], metrics: list[str]) -> None:
    if metric.startswith("eval:"):  # one value per run: the curves take a logged metric
        series = [m for m in metrics if not m.startswith("eval:")]
        if not series:
            st.info("The selected runs logged no metric curves (only evals).")
            return
        metric = _select(st, "Curve metric", series, "cmetric", default="train/loss")
    c1, c2, c3 = st.columns([2, 2, 1])
    by = _multi(c1, "Group by (up to two keys)", keys, "by", 2)
    x = _select(c2, "x axis", list(X_AXES), "x")
    spread = _select(c3, "Band", ["min–max", "± 1 sd"], "band")
    c1, c2, c3 = st.columns([2, 1, 1])
    smoothing = c1.slider("Smoothing", 0.0, 0.99, 0.0, 0.01, key="sweeps_smoothing")
    log_x = c2.checkbox("log x", key="sweeps_logx")
    log_y = c3.checkbox("log y", key="sweeps_logy")
    view = query(group_curves, sel, metric, by, X_AXES[x], MAX_GROUPS, 200)
    if view["data"] is None or view["data"].height == 0:
        st.info(md_escape(f"None of the selected runs logged {metric} as a curve (an eval: is one value)."))
        return
    note = f"{view['runs']} run(s) in {view['matched_groups']} group(s)"
    if view["matched_groups"] > len(view["groups"]):
        note += f"; showing the {len(view['groups'])} largest (narrow the selection to see the others)"
    st.caption(md_escape(note))
    show_chart(curves_figure(view, metric, smoothing, spread, log_x, log_y), key="sweeps_curves")


def _values(sel: str, metric: str, keys: list[str], best: bool) -> dict:
    return query(final_values, sel, metric, keys, best)


def _table(sel: str, metric: str, keys: list[str], best: bool) -> None:
    if len(keys) < 2:
        st.info("The selected runs' configs have fewer than two keys to pivot by.")
        return
    c1, c2 = st.columns(2)
    rows_key = _select(c1, "Rows", keys, "rows", key="sweeps_rows")
    cols_key = _select(c2, "Columns", keys, "cols", default=keys[1], key="sweeps_cols")
    got = _values(sel, metric, [rows_key, cols_key], best)
    if not got["rows"]:
        st.info(md_escape(f"None of the selected runs logged {metric}."))
        return
    pv = pivot(got["rows"], rows_key, cols_key)
    if len(pv["cols"]) > MAX_COLS or len(pv["rows"]) > MAX_ROWS:
        st.caption(
            f"Showing the first {MAX_ROWS} rows and {MAX_COLS} columns of {len(pv['rows'])} × {len(pv['cols'])}."
        )
        pv = {**pv, "rows": pv["rows"][:MAX_ROWS], "cols": pv["cols"][:MAX_COLS]}
    st.caption(
        md_escape(
            f"{'Best' if best else 'Final'} {metric} of {len(got['rows'])} run(s); each value links to its run."
        )
    )
    st.markdown(pivot_markdown(pv))


def _scatter(sel: str, metric: str, keys: list[str], best: bool) -> None:
    if not keys:
        st.info("The selected runs have no config keys.")
        return
    c1, c2, c3 = st.columns([2, 2, 1])
    key = _select(c1, "x: config key", keys, "key", key="sweeps_key")
    color = _select(c2, "Colour by", ["(none)", *keys], "color", key="sweeps_color")
    log_x = c3.checkbox("log x", key="sweeps_scatter_logx")
    color = None if color == "(none)" else color
    got = _values(sel, metric, [k for k in (key, color) if k], best)
    if not got["rows"]:
        st.info(md_escape(f"None of the selected runs logged {metric}."))
        return
    show_chart(scatter_figure(got["rows"], key, color, metric, log_x), key="sweeps_scatter")


def _parallel(sel: str, metric: str, keys: list[str], best: bool) -> None:
    chosen = _multi(st, "Config keys", keys, "pkeys", 8, default=keys[:3], key="sweeps_pkeys")
    if not chosen:
        st.info("Pick one or more config keys.")
        return
    got = _values(sel, metric, chosen, best)
    if not got["rows"]:
        st.info(md_escape(f"None of the selected runs logged {metric}."))
        return
    show_chart(parcoords_figure(got["rows"], chosen, metric), key="sweeps_parcoords")


def _fmt(x) -> str:
    return "—" if x is None else f"{x:.4g}"


def _isoflop(sel: str, metric: str, best: bool) -> None:
    raw = _param("budget")
    try:
        budget = float(raw) if raw else None
    except ValueError:
        budget = None
    text = st.text_input("Recommend for a budget (FLOPs)", value=raw or "", key="sweeps_budget", max_chars=32)
    try:
        budget = float(text) if text.strip() else None
    except ValueError:
        st.error("The budget must be a number of FLOPs, e.g. 1e21.")
    if budget is not None and not budget > 0:
        budget = None
    _sync("budget", "" if budget is None else text.strip())
    view = query(isoflop_view, sel, metric, budget, None, 0.9, 1000, best)
    if view["fit"] is None:
        st.info(md_escape(view["message"]))
        return
    fit = view["fit"]
    pct = round(100 * fit["level"])
    st.caption(
        md_escape(
            f"{len(view['cells'])} cell(s); {pct}% intervals; noise {_fmt(fit['noise'])} ({fit['noise_from']})"
        )
    )
    for s in view["skipped"][:20]:
        st.caption(md_escape(f"left out {s['run']}: {s['reason']}"))
    show_chart(isoflop_figure(view), key="sweeps_isoflop")
    rows = [
        {
            "budget": f"{b['budget']:.3g}",
            "cells": b["n"],
            "tokens D*": f"{_fmt(b['tokens'])} [{_fmt(b['tokens_lo'])}, {_fmt(b['tokens_hi'])}]",
            "params N*": f"{_fmt(b['params'])} [{_fmt(b['params_lo'])}, {_fmt(b['params_hi'])}]"
            + (f" ({b['params_from']})" if b["params_from"] else ""),
            "loss": f"{_fmt(b['loss'])} [{_fmt(b['loss_lo'])}, {_fmt(b['loss_hi'])}]",
            "status": b["status"] + (f": {b['message']}" if b["message"] else ""),
        }
        for b in fit["budgets"]
    ]
    st.dataframe(rows, hide_index=True, key="sweeps_isoflop_table")
    fr = fit["frontier"]
    if fr:
        st.markdown(
            md_escape(
                f"Frontier over {fr['budgets']} budgets: N* ∝ C^{fr['a_n']:.3f} [{_fmt(fr['a_n_lo'])}, "
                f"{_fmt(fr['a_n_hi'])}], D* ∝ C^{fr['a_d']:.3f} [{_fmt(fr['a_d_lo'])}, {_fmt(fr['a_d_hi'])}]"
            )
        )
    rec = fit["recommendation"]
    if rec:
        st.success(
            md_escape(
                f"At C = {rec['budget']:.3g}: params {_fmt(rec['params'])} [{_fmt(rec['params_lo'])}, "
                f"{_fmt(rec['params_hi'])}], tokens {_fmt(rec['tokens'])} [{_fmt(rec['tokens_lo'])}, "
                f"{_fmt(rec['tokens_hi'])}]" + (f" ({rec['note']})" if rec.get("note") else "")
            )
        )
    for n in fit["notes"]:
        st.caption(md_escape(n))


def _variant(sel: str, metric: str, best: bool) -> None:
    st.caption("The selection above is the baseline; name the variant's runs here.")
    var = _selection("Variant selection", "var", "sweeps_var", placeholder="ladder = my-variant-grid")
    if not var:
        return
    var_roots = query(selected_roots, var, MAX_VIEW_RUNS + 1)
    if len(var_roots) > MAX_VIEW_RUNS:
        st.info(f"The variant selection has more than {MAX_VIEW_RUNS:,} runs; narrow it.")
        return
    view = query(compare_view, sel, var_roots, metric, best)
    if view["multiplier"] is None:
        st.info(md_escape(view["message"] or "No multiplier."))
        return
    st.success(md_escape(f"The variant {view['text']} ({metric} {_fmt(view['multiplier']['loss'])})."))
    if view["message"]:
        st.caption(md_escape(view["message"]))
    show_chart(envelope_figure(view), key="sweeps_envelope")
    st.caption(
        "To keep this number with its inputs (run ids, attempts, code versions): "
        "`observatory sweep compare BASELINE VARIANT --metric M --record TITLE`."
    )


def render() -> None:
    st.title("Sweeps")
    sel = _selection("Selection", "sel", "sweeps_sel")
    if sel is None:
        return
    roots = query(selected_roots, sel, MAX_VIEW_RUNS + 1)  # the selection runs once; the views read these
    if not roots:
        st.info("No run matches this selection." if sel else "No runs in the store yet.")
        return
    if len(roots) > MAX_VIEW_RUNS:
        st.info(
            f"{query(count_selected, sel):,} runs selected; the views draw at most {MAX_VIEW_RUNS:,} "
            "(narrow the selection: a project, a group, a tag or a config value)."
        )
        return
    n = len(roots)
    sel = roots  # from here on the views read the resolved runs
    metrics, keys = query_all((metric_choices, sel), (sweep_keys, sel))  # one connection for both
    if not metrics:
        st.info(md_escape(f"The {n} selected run(s) logged no metrics or evals yet."))
        return
    c1, c2 = st.columns([3, 1])
    default = next((m for m in metrics if m.startswith("eval:")), "train/loss")
    metric = _select(c1, "Metric", metrics, "metric", default=default)
    best = _select(c2, "Value", ["final", "best"], "value") == "best"
    st.caption(md_escape(f"{n} run(s) selected (restarts folded into their run)."))
    # one view at a time (a radio, not tabs: tabs would run every view's queries on each visit)
    want = _param("view")
    view = st.radio(
        "View",
        VIEWS,
        index=VIEWS.index(want) if want in VIEWS else 0,
        horizontal=True,
        key="sweeps_view_pick",
    )
    _sync("view", view)
    if view == "Curves":
        _curves(sel, metric, keys, metrics)
    elif view == "Table":
        _table(sel, metric, keys, best)
    elif view == "Scatter":
        _scatter(sel, metric, keys, best)
    elif view == "Parallel coordinates":
        _parallel(sel, metric, keys, best)
    elif view == "Iso-FLOP":
        _isoflop(sel, metric, best)
    else:
        _variant(sel, metric, best)
