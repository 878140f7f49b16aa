"""The Observatory dashboard: `streamlit run app.py` (or `observatory dashboard`).

A router only: pages live in `observatory.dashboard.pages`, each a module with
`render()` over `observatory` queries. Public by design: nothing here writes,
Markdown renders with raw HTML off, the store is opened read-only per query.
Settings come from the environment (OBSERVATORY_DB, OBSERVATORY_CACHE_TTL_S, ...).
"""

from __future__ import annotations

import importlib

import streamlit as st

from observatory.dashboard.pages import PAGES

st.set_page_config(page_title="Observatory", page_icon="🔭", layout="wide")


def _page(module: str, title: str):
    """A page callable that imports its module on use, so one broken page cannot take the others down."""

    def run() -> None:
        from observatory.dashboard.common import StoreBusy

        try:
            mod = importlib.import_module(f"observatory.dashboard.pages.{module}")
        except ImportError as e:
            st.title(title)
            st.info(f"This page is not available in this installation ({e.name or e}).")
            return
        try:
            mod.render()
        except StoreBusy as e:
            st.info(f"⏳ {e}")

    run.__name__ = f"page_{module}"
    return run


# One flat top bar (eight pages fit; sections would hide them in drop-downs). Top, not the
# sidebar: the sidebar's page list delayed the Live page's first chart by ~0.3 s (bench_dashboard.py).
pages = [
    st.Page(_page(module, title), title=title, url_path=url, icon=icon, default=module == "runs")
    for _section, module, title, url, icon in PAGES
]
st.navigation(pages, position="top").run()
