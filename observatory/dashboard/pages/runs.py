"""Runs: the runs with their status, progress, last loss, tokens, ladder and tags; search, filters, pages.

Search, filters and paging run in the store (`core.search_runs`, `count_runs`, `run_facets`): a page
shows `PAGE` runs however many the lab has (10^5). They live in the URL
(`?q=...&status=running&project=mnist&group=sweep-1&page=2`) so a filtered view is a link. The project and group filters appear once some run has a project or a group
(wandb's `init(project=, group=)`). A run's name links to its Live page (`live?run=ID`).
"Group by ladder" (`?by=ladder`) shows each ladder's runs together: a line per rung (seeds,
mean and spread of the last loss) and the runs with their rung and seed.
"""

from __future__ import annotations

import re
import statistics
import time
from urllib.parse import quote

import polars as pl
import streamlit as st

from observatory.dashboard.cache import query, query_all
from observatory.dashboard.runs_table import PAGE, ago, runs_table
from observatory.ladder.watch import MAX_COUNT
from observatory.markup import md_escape
from observatory.queries import core
from observatory.queries import ladder as ql

STATUSES = ("running", "completed", "failed", "crashed", "preempted", "killed")


def render() -> None:
    st.title("Runs")
    facets = query(core.run_facets)
    if not facets["total"]:
        st.info("No runs in the store yet. Start one with `trainer train` and `observatory ingest --follow`.")
        return
    st.caption(" · ".join(f"{n:,} {s}" for s, n in sorted(facets["status"].items(), key=lambda x: -x[1])))

    qp = st.query_params
    c1, c2, c3, c4 = st.columns([3, 2, 2, 2])
    text = c1.text_input(
        "Search",
        value=qp.get("q", ""),
        placeholder="run id or prefix, name, tag, ladder, project, group",
        key="runs_q",
    )
    statuses = c2.multiselect(
        "Status",
        STATUSES,
        default=[s for s in qp.get_all("status") if s in STATUSES],
        key="runs_status",
    )
    ladders = c3.multiselect("Ladder", facets["ladders"], key="runs_ladder")
    tags = c4.multiselect("Tags", facets["tags"], key="runs_tags")
    if text != qp.get("q", ""):
        if text:
            qp["q"] = text
        else:
            del qp["q"]
    if statuses != qp.get_all("status"):
        qp["status"] = statuses
    projects, groups = _lab_filters(facets)
    search = {
        "search": text.strip() or None,
        "status": statuses or None,
        "projects": projects,
        "groups": groups,
        "ladders": ladders,
        "tags": tags,
    }
    if len(text.split()) > core.SEARCH_WORDS or any(len(w) > core.SEARCH_WORD_CHARS for w in text.split()):
        st.caption(
            f"Searched the first {core.SEARCH_WORDS} words, each up to {core.SEARCH_WORD_CHARS} characters."
        )
    total = query(core.count_runs, search["search"], statuses or None, projects, groups, ladders, tags)
    pages = max(1, -(-total // PAGE))
    page = _page(pages)
    shown = runs_table(**search, limit=PAGE, offset=(page - 1) * PAGE)
    grouped = bool(facets["ladders"]) and st.toggle(
        "Group by ladder",
        value=qp.get("by") == "ladder",
        key="runs_by_ladder",
        help="each ladder's runs together, with their rung and seed",
    )
    if grouped != (qp.get("by") == "ladder"):
        if grouped:
            qp["by"] = "ladder"
        else:
            del qp["by"]
    first = (page - 1) * PAGE
    st.write(
        f"{first + 1:,}–{first + len(shown):,} of {total:,} runs"
        if shown
        else f"0 of {facets['total']:,} runs"
    )
    if not shown:
        st.info("No run matches these filters.")
        return
    if grouped:
        _by_ladder(shown)
    else:
        _table(shown, key="runs_table")
    _pager(page, pages)


def _page(pages: int) -> int:
    """The page shown (`?page=N`, 1-based), a bad or out-of-range value taken as the nearest page."""
    raw = st.query_params.get("page", "1")
    page = int(raw) if re.fullmatch(r"[0-9]{1,9}", raw) else 1  # "²" is a digit to str.isdigit, not to int()
    return min(max(page, 1), pages)


def _pager(page: int, pages: int) -> None:
    """Previous / next buttons under the table (the page lives in `?page=`)."""
    if pages <= 1:
        return
    c1, c2, c3 = st.columns([1, 2, 1])
    if c1.button("← Previous", disabled=page <= 1, key="runs_prev"):
        st.query_params["page"] = str(page - 1)
        st.rerun()
    c2.caption(f"page {page:,} of {pages:,}")
    if c3.button("Next →", disabled=page >= pages, key="runs_next"):
        st.query_params["page"] = str(page + 1)
        st.rerun()


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
            rows.append(
                {
                    **r,
                    "rung": lr["rung"] or "",
                    "seed": seed if isinstance(seed, int) and 0 <= seed <= MAX_COUNT else None,  # not 2^70
                    "target": lr["target"],
                }
            )
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
            rungs.append(
                {
                    "rung": rung + (" (target)" if rr[0]["target"] else ""),
                    "runs": len(rr),
                    "seeds": len({r["seed"] for r in rr}),
                    "mean": mean,
                    "spread": spread,
                }
            )
        out.append({"name": name, "rungs": rungs, "runs": rows})
    return out


def _by_ladder(shown: list[dict]) -> None:
    names = sorted({r["ladder"].split(" / ")[0] for r in shown if r["ladder"]})
    lruns = query_all(*((ql.ladder_runs, n) for n in names))
    groups = ladder_groups(shown, dict(zip(names, lruns, strict=True)))
    for i, g in enumerate(
        groups
    ):  # keys by position: a ladder's name is log text (`x_rungs` named another's table)
        st.subheader(f"Ladder {md_escape(g['name'])}")
        st.caption(
            f"{len(g['runs'])} runs · [open the Ladder page](ladder?ladder={quote(g['name'], safe='')})"
        )
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
            key=f"runs_ladder_rungs_{i}",
        )
        _table(g["runs"], key=f"runs_ladder_table_{i}", ladder_cols=True)
    rest = [r for r in shown if not r["ladder"]]
    if rest:
        st.subheader("Not in a ladder")
        _table(rest, key="runs_table")


def _table(shown: list[dict], key: str, ladder_cols: bool = False) -> None:
    now = time.time()
    extra = {"rung": [r["rung"] for r in shown], "seed": [r["seed"] for r in shown]} if ladder_cols else {}
    df = pl.DataFrame(
        {
            "run": [r["run"] for r in shown],
            "status": [r["status"] for r in shown],
            **extra,
            "progress": [r["progress"] for r in shown],
            "step": [r["last_step"] for r in shown],
            "last loss": [r["last_loss"] for r in shown],
            "tokens": [None if r["tokens"] is None else _compact(r["tokens"]) for r in shown],
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
            "tokens": pl.String,
            **({"seed": pl.Int64} if ladder_cols else {}),
        },
    )
    # a column no shown run has (a W&B script logs no tokens, no progress) is left out, not a column of "None"
    df = df.select([c for c in df.columns if c == "run" or df[c].null_count() < df.height])
    if "tokens" in df.columns:  # a run without them among runs with them: "—", not "None"
        df = df.with_columns(pl.col("tokens").fill_null("—"))
    picked = st.dataframe(
        df,
        hide_index=True,
        width="stretch",
        column_config={
            "run": st.column_config.TextColumn("run", help="click a run to open its Live page"),
            "progress": st.column_config.ProgressColumn(
                "progress", min_value=0.0, max_value=1.0, format="percent"
            ),
            "last loss": st.column_config.NumberColumn(format="%.4f"),
            "tokens": st.column_config.TextColumn(
                "tokens", help="tokens seen (K, M, B, T: thousands to trillions)"
            ),
        },
        key=key,
        on_select="rerun",
        selection_mode="single-cell",
    )
    cells = (picked.selection.get("cells") or []) if picked is not None else []
    if cells:  # a click on a run: its Live page, in this tab (a link column would open a new one)
        open_live(shown[cells[0][0]]["run"])


def _compact(n: float) -> str:
    """1.2K, 3.4M, 5.6B, 7.8T (a count too long to read whole)."""
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3g}{unit}"
    return f"{n:.0f}"


def open_live(run: str) -> None:
    """Switch this tab to the Live page of `run` (`/live?run=RUN`)."""
    st.switch_page(st.Page(_live_stub, url_path="live"), query_params={"run": run})


def _live_stub() -> None:
    """Stands for the Live page in `open_live`: Streamlit finds a page by its url path."""


def _lab_filters(facets: dict) -> tuple[list[str], list[str]]:
    """The Project and Group multiselects, synced with `?project=` and `?group=`; each shown when some run has one
    (their choices: the most used, `core.run_facets`)."""
    qp = st.query_params
    offered = {label: facets[f"{label}s"] for label in ("project", "group") if facets[f"{label}s"]}
    chosen: dict[str, list[str]] = {"project": [], "group": []}
    for col, (label, values) in zip(st.columns(4)[: len(offered)], offered.items(), strict=False):
        chosen[label] = col.multiselect(
            label.capitalize(),
            values,
            default=[v for v in qp.get_all(label) if v in values],
            key=f"runs_{label}",
        )
        if chosen[label] != qp.get_all(label):
            qp[label] = chosen[label]
    return chosen["project"], chosen["group"]
