"""Runs: every run with its status, progress, last loss, tokens, ladder and tags; search and filters.

Filters live in the URL (`?q=...&status=running&project=mnist&group=sweep-1`) so a filtered
view is a link. The project and group filters appear once some run has a project or a group
(wandb's `init(project=, group=)`).
A run's name links to its Live page (`live?run=ID`).
"""

from __future__ import annotations

import time

import polars as pl
import streamlit as st

from observatory.dashboard.runs_table import ago, runs_table

STATUSES = ("running", "completed", "failed", "crashed", "preempted", "killed")


def filter_runs(
    runs: list[dict], text: str = "", statuses=(), ladders=(), tags=(), projects=(), groups=()
) -> list[dict]:
    """Runs matching a free-text search (run id, name, tags, ladder, project, group) and the chosen facets."""
    text = text.strip().lower()
    out = []
    for r in runs:
        words = [r["run"], r["name"] or "", r["ladder"] or "", r.get("project") or "", r.get("group") or ""]
        hay = " ".join([*words, *r["tags"]]).lower()
        if text and not all(w in hay for w in text.split()):
            continue
        if statuses and r["status"] not in statuses:
            continue
        if ladders and (r["ladder"] or "").split(" / ")[0] not in ladders:
            continue
        if tags and not set(tags) & set(r["tags"]):
            continue
        if projects and r.get("project") not in projects:
            continue
        if groups and r.get("group") not in groups:
            continue
        out.append(r)
    return out


def render() -> None:
    st.title("Runs")
    runs = runs_table()
    if not runs:
        st.info("No runs in the store yet. Start one with `trainer train` and `observatory ingest --follow`.")
        return
    counts = {s: sum(r["status"] == s for r in runs) for s in STATUSES}
    st.caption(" · ".join(f"{n} {s}" for s, n in counts.items() if n))

    qp = st.query_params
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    text = c1.text_input(
        "Search", value=qp.get("q", ""), placeholder="run id, name, tag, ladder", key="runs_q"
    )
    statuses = c2.multiselect(
        "Status",
        STATUSES,
        default=[s for s in qp.get_all("status") if s in STATUSES],
        key="runs_status",
    )
    ladder_names = sorted({r["ladder"].split(" / ")[0] for r in runs if r["ladder"]})
    ladders = c3.multiselect("Ladder", ladder_names, key="runs_ladder")
    all_tags = sorted({t for r in runs for t in r["tags"]})
    tags = c4.multiselect("Tags", all_tags, key="runs_tags")
    if text != qp.get("q", ""):
        if text:
            qp["q"] = text
        else:
            del qp["q"]
    if statuses != qp.get_all("status"):
        qp["status"] = statuses
    projects, groups = _lab_filters(runs)

    shown = filter_runs(runs, text, statuses, ladders, tags, projects, groups)
    st.write(f"{len(shown)} of {len(runs)} runs")
    if not shown:
        st.info("No run matches these filters.")
        return
    now = time.time()
    df = pl.DataFrame(
        {
            "run": [f"live?run={r['run']}" for r in shown],
            "status": [r["status"] for r in shown],
            "progress": [r["progress"] for r in shown],
            "step": [r["last_step"] for r in shown],
            "last loss": [r["last_loss"] for r in shown],
            "tokens": [r["tokens"] for r in shown],
            "ladder": [r["ladder"] or "" for r in shown],
            "tags": [", ".join(r["tags"]) for r in shown],
            **{
                label: [r[label] or "" for r in shown]
                for label in ("project", "group")
                if any(r[label] for r in runs)
            },
            "parent": [r["parent"] or "" for r in shown],
            "last event": [ago(r["last_event_t"], now) for r in shown],
        },
        schema_overrides={
            "progress": pl.Float64,
            "step": pl.Int64,
            "last loss": pl.Float64,
            "tokens": pl.Float64,
        },
    )
    st.dataframe(
        df,
        hide_index=True,
        width="stretch",
        column_config={
            "run": st.column_config.LinkColumn(
                "run", display_text=r"live\?run=(.*)", help="open the Live page"
            ),
            "progress": st.column_config.ProgressColumn(
                "progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "last loss": st.column_config.NumberColumn(format="%.4f"),
            "tokens": st.column_config.NumberColumn(format="compact"),
        },
        key="runs_table",
    )


def _lab_filters(runs: list[dict]) -> tuple[list[str], list[str]]:
    """The Project and Group multiselects, synced with `?project=` and `?group=`; each shown when some run has one."""
    qp = st.query_params
    facets = {label: sorted({r[label] for r in runs if r[label]}) for label in ("project", "group")}
    facets = {label: values for label, values in facets.items() if values}
    chosen: dict[str, list[str]] = {"project": [], "group": []}
    for col, (label, values) in zip(st.columns(4)[: len(facets)], facets.items(), strict=False):
        chosen[label] = col.multiselect(
            label.capitalize(),
            values,
            default=[v for v in qp.get_all(label) if v in values],
            key=f"runs_{label}",
        )
        if chosen[label] != qp.get_all(label):
            qp[label] = chosen[label]
    return chosen["project"], chosen["group"]
