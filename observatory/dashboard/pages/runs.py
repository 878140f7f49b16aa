"""Runs: every run with its status, progress, last loss, tokens, ladder and tags; search and filters.

Filters live in the URL (`?q=...&status=running&project=mnist&group=sweep-1`) so a filtered
view is a link. The project and group filters appear once some run has a project or a group
(wandb's `init(project=, group=)`). A run's name links to its Live page (`live?run=ID`).
"Group by ladder" (`?by=ladder`) shows each ladder's runs together: a line per rung (seeds,
mean and spread of the last loss) and the runs with their rung and seed.
"""

from __future__ import annotations

import statistics
import time

import polars as pl
import streamlit as st

from observatory.dashboard.cache import query_all
from observatory.dashboard.runs_table import ago, runs_table
from observatory.queries import ladder as ql

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
    grouped = bool(ladder_names) and st.toggle(
        "Group by ladder", value=qp.get("by") == "ladder", key="runs_group",
        help="each ladder's runs together, with their rung and seed",
    )  # fmt: skip
    if grouped != (qp.get("by") == "ladder"):
        if grouped:
            qp["by"] = "ladder"
        else:
            del qp["by"]
    st.write(f"{len(shown)} of {len(runs)} runs")
    if not shown:
        st.info("No run matches these filters.")
        return
    if grouped:
        _by_ladder(shown)
        return
    _table(shown, key="runs_table")


def ladder_groups(shown: list[dict], ladder_runs: dict[str, list[dict]]) -> list[dict]:
    """Per ladder among `shown`: {name, rungs: [{rung, seeds, runs, mean, spread}], runs: [row + rung, seed, target]}.

    `ladder_runs` is `queries.ladder.ladder_runs` per ladder name. Rungs are in the order of
    their first run, targets last; a rung's spread is the relative standard deviation of
    its seeds' last loss (None with fewer than two).
    """
    by_run = {r["run"]: r for r in shown}
    out = []
    for name, lruns in ladder_runs.items():
        rows = []
        for lr in lruns:
            r = by_run.get(lr["run"])
            if r is None:
                continue
            seed = lr["ladder"].get("seed")
            rows.append({**r, "rung": lr["rung"] or "", "seed": seed if isinstance(seed, int) else None,
                         "target": lr["target"]})  # fmt: skip
        if not rows:
            continue
        order = list(dict.fromkeys(r["rung"] for r in sorted(rows, key=lambda r: r["target"])))
        rows.sort(key=lambda r: (r["target"], order.index(r["rung"]), r["seed"] or 0, r["run"]))
        rungs = []
        for rung in order:
            rr = [r for r in rows if r["rung"] == rung]
            losses = [r["last_loss"] for r in rr if r["last_loss"] is not None]
            mean = statistics.fmean(losses) if losses else None
            spread = statistics.stdev(losses) / mean if len(losses) > 1 and mean else None
            rungs.append({"rung": rung + (" (target)" if rr[0]["target"] else ""), "runs": len(rr),
                          "seeds": len({r["seed"] for r in rr}), "mean": mean, "spread": spread})  # fmt: skip
        out.append({"name": name, "rungs": rungs, "runs": rows})
    return out


def _by_ladder(shown: list[dict]) -> None:
    names = sorted({r["ladder"].split(" / ")[0] for r in shown if r["ladder"]})
    lruns = query_all(*((ql.ladder_runs, n) for n in names))
    groups = ladder_groups(shown, dict(zip(names, lruns, strict=True)))
    for g in groups:
        st.subheader(f"Ladder {g['name']}")
        st.caption(f"{len(g['runs'])} runs · [open the Ladder page](ladder?ladder={g['name']})")
        st.dataframe(
            pl.DataFrame(
                {
                    "rung": [x["rung"] for x in g["rungs"]],
                    "runs": [x["runs"] for x in g["rungs"]],
                    "seeds": [x["seeds"] for x in g["rungs"]],
                    "mean last loss": [x["mean"] for x in g["rungs"]],
                    "seed spread": [x["spread"] for x in g["rungs"]],
                },
                schema_overrides={"mean last loss": pl.Float64, "seed spread": pl.Float64},
            ),
            hide_index=True,
            column_config={
                "mean last loss": st.column_config.NumberColumn(format="%.4f"),
                "seed spread": st.column_config.NumberColumn(format="percent", help="1 sigma of the seeds"),
            },
            key=f"runs_ladder_{g['name']}_rungs",
        )
        _table(g["runs"], key=f"runs_ladder_{g['name']}", ladder_cols=True)
    rest = [r for r in shown if not r["ladder"]]
    if rest:
        st.subheader("Not in a ladder")
        _table(rest, key="runs_table")


def _table(shown: list[dict], key: str, ladder_cols: bool = False) -> None:
    now = time.time()
    extra = {"rung": [r["rung"] for r in shown], "seed": [r["seed"] for r in shown]} if ladder_cols else {}
    df = pl.DataFrame(
        {
            "run": [f"live?run={r['run']}" for r in shown],
            "status": [r["status"] for r in shown],
            **extra,
            "progress": [r["progress"] for r in shown],
            "step": [r["last_step"] for r in shown],
            "last loss": [r["last_loss"] for r in shown],
            "tokens": [r["tokens"] for r in shown],
            "ladder": [r["ladder"] or "" for r in shown],
            "tags": [", ".join(r["tags"]) for r in shown],
            **{
                label: [r[label] or "" for r in shown]
                for label in ("project", "group")
                if any(r[label] for r in shown)
            },
            "parent": [r["parent"] or "" for r in shown],
            "last event": [ago(r["last_event_t"], now) for r in shown],
        },
        schema_overrides={
            "progress": pl.Float64,
            "step": pl.Int64,
            "last loss": pl.Float64,
            "tokens": pl.Float64,
            **({"seed": pl.Int64} if ladder_cols else {}),
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
        key=key,
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
