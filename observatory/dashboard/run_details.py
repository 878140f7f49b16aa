"""A run's details under its Live page: where it came from, its summary, histograms and artifacts.

One expander, drawn after the live panel (the loss chart does not wait for it): the run's
project, group, source and notes; its summary (`run_summary`: latest metric values overridden
by `summary` events, as wandb's `run.summary` and Levanter's `log_summary` write them); the
latest step of a chosen histogram; and its `artifact` events.
"""

from __future__ import annotations

import json

import streamlit as st

from observatory.dashboard.cache import query, query_all
from observatory.dashboard.runs_table import ago
from observatory.dashboard.widgets import show_chart
from observatory.markup import md_escape, plot_text
from observatory.queries import details as qdet

__all__ = ["render_details", "details_calls"]


def details_calls(run: str) -> tuple[tuple, ...]:
    """The expander's queries, batched on one connection."""
    return (
        (qdet.run_info, run),
        (qdet.run_summary, run),
        (qdet.histogram_names, run),
        (qdet.artifacts, run),
    )


def _value(v) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return v if isinstance(v, str) else json.dumps(v)


def render_details(run: str) -> None:
    info, summary, hist_names, arts = query_all(*details_calls(run))
    if info is None:
        return
    n_logged = sum(r["origin"] == "summary" for r in summary)
    with st.expander(
        f"Run details: summary ({len(summary)} keys), {len(hist_names)} histograms, {len(arts)} artifacts"
    ):
        source = info["source"] or {}
        facts = [
            f"**{label}** {md_escape(value)}"  # someone else's text: shown literally
            for label, value in (
                ("Project", info["project"]),
                ("Group", info["group"]),
                ("Source", " ".join(str(source[k]) for k in ("trainer", "version") if source.get(k))),
                ("Tags", ", ".join(info["tags"])),
            )
            if value
        ]
        if facts:
            st.markdown(" · ".join(facts))
        if info["notes"]:
            st.caption(md_escape(info["notes"]))
        st.markdown(f"**Summary**: {n_logged} set by summary events, the rest the metrics' latest values")
        if summary:
            st.dataframe(
                {
                    "key": [r["key"] for r in summary],
                    "value": [_value(r["value"]) for r in summary],
                    "from": [r["origin"] for r in summary],
                },
                hide_index=True,
                width="stretch",
                key=f"details_summary_{run}",
            )
        if hist_names:
            _histogram(run, hist_names)
        if arts:
            st.markdown("**Artifacts**")
            st.dataframe(
                {
                    "name": [a["name"] for a in arts],
                    "type": [a["type"] for a in arts],
                    "path": [a["path"] for a in arts],
                    "bytes": [a["bytes"] for a in arts],
                    "step": [a["step"] for a in arts],
                    "logged": [ago(a["t"]) for a in arts],
                },
                hide_index=True,
                width="stretch",
                key=f"details_artifacts_{run}",
            )


def _histogram(run: str, names: list[tuple[str, int]]) -> None:
    """A selectbox of the run's histograms and a bar chart of the chosen one's latest step."""
    name = st.selectbox(
        "Histogram",
        [n for n, _ in names],
        format_func=lambda n: f"{n} ({dict(names)[n]} steps)",
        key=f"details_hist_{run}",
    )
    rows = query(qdet.histograms, run, name)
    if not rows:
        return
    h = rows[-1]
    lim = h["bucket_limits"]
    fig = {
        "data": [
            {
                "type": "bar",
                "x": [(a + b) / 2 for a, b in zip(lim[:-1], lim[1:], strict=True)],
                "width": [b - a for a, b in zip(lim[:-1], lim[1:], strict=True)],
                "y": h["bucket_counts"],
                "name": plot_text(name),
            }
        ],
        "layout": {
            "title": {"text": plot_text(f"{name} at step {h['step']}")},
            "height": 260,
            "xaxis": {"title": {"text": "value"}},
            "yaxis": {"title": {"text": "count"}},
            "margin": {"t": 40, "b": 40, "l": 50, "r": 10},
        },
    }
    show_chart(fig, key=f"details_hist_chart_{run}")
