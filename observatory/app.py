"""The Observatory dashboard: `streamlit run app.py` (or `observatory dashboard`).

A router only: pages live in `observatory.dashboard.pages`, each a module with
`render()` over `observatory` queries. Public by design: nothing here writes,
Markdown renders with raw HTML off, the store is opened read-only per query.
Settings come from the environment (OBSERVATORY_DB, OBSERVATORY_CACHE_TTL_S, ...).
The first script run of a server process starts the SQL console's worker pool warming.
"""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from observatory import provenance
from observatory.dashboard.cache import StoreBusy
from observatory.dashboard.pages import PAGES, compare, decisions, experts, health, live, reports, runs, sql
from observatory.queries import user_sql

st.set_page_config(
    page_title="Observatory",
    page_icon="🔭",
    layout="wide",
    # the lab's public keys: a reader of the logs or of an export checks the findings' signatures with them
    menu_items={"About": "Observatory: a training-log observatory.\n\n" + provenance.published()},
)
# the SQL console's first worker starts with the server's first script run, on a thread of its own
# (once per process; reruns find it started), so no visitor's first query waits for DuckDB to load
user_sql.warm_up_in_background()


def _ladder() -> None:
    # lazy for start-up time: the Ladder page's fit imports scipy, which no other page needs
    from observatory.dashboard.pages import ladder

    ladder.render()


def _sweeps() -> None:
    # lazy like the Ladder page: only this page loads the iso-FLOP fit's modules
    from observatory.dashboard.pages import sweeps

    sweeps.render()


RENDER: dict[str, Callable[[], None]] = {
    "runs": runs.render,
    "live": live.render,
    "experts": experts.render,
    "health": health.render,
    "compare": compare.render,
    "sweeps": _sweeps,
    "decisions": decisions.render,
    "ladder": _ladder,
    "reports": reports.render,
    "sql": sql.render,
}


def _page(module: str) -> Callable[[], None]:
    """The page callable: the module's `render()`, with a busy store shown as a calm note."""

    def run() -> None:
        try:
            RENDER[module]()
        except StoreBusy as e:
            st.info(f"⏳ {e}")

    run.__name__ = f"page_{module}"
    return run


# One flat top bar: ten pages fit, and sections would hide them in drop-downs. Top, not the
# sidebar: the sidebar's page list delays the Live page's first chart.
pages = [
    st.Page(_page(module), title=title, url_path=url, icon=icon, default=module == "runs")
    for module, title, url, icon in PAGES
]
st.navigation(pages, position="top").run()
