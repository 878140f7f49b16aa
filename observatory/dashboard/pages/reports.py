"""Reports: the post-mortem of one run, as `observatory report RUN` writes it, rendered in place.

The report is the same self-contained HTML file the CLI writes (interactive plotly
figures, plotly.js inline), shown in a frame as tall as the report (the page scrolls, not
the frame; the report's summary is in it, once), with a download button. The chosen
run lives in the URL (`?run=ID`).
"""

from __future__ import annotations

import streamlit as st

from observatory import report
from observatory.dashboard.cache import StoreBusy, query
from observatory.dashboard.widgets import pick_run
from observatory.markup import md_escape
from observatory.report import render_html


def _report(con, run: str) -> dict:
    """The report's story and HTML (cacheable): built once per run per cache period."""
    rep = report.build(con, run)
    return {"status": rep.status, "story": rep.story, "html": render_html(rep)}


def render() -> None:
    st.title("Reports")
    st.caption(
        "A post-mortem of one run: what happened and when, with figures. "
        "The same report from the command line: `observatory report RUN --format html|md|pdf`."
    )
    run = pick_run(prefer_running=False)
    if run is None:
        return
    try:
        with st.spinner("Building the report…"):
            rep = query(_report, run)
    except StoreBusy as e:
        st.info(md_escape(e))
        return
    except ValueError as e:
        st.warning(md_escape(e))
        return
    st.download_button(
        "Download the report (HTML, works offline)",
        rep["html"],
        file_name=f"{run}.html",
        mime="text/html",
        key="report_download",
    )
    st.iframe(rep["html"], height="content")
