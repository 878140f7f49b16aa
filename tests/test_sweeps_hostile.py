"""The Sweeps page over the hostile store (tests/hostile_store.py: every free-text field planted with
Markdown, HTML, Streamlit directives and foreign URLs), and every Sweeps query parameter with the values
a visitor can send: each view renders the planted text inert, and no parameter crashes the page."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest
from test_hostile_pages import BAD_VALUES, hostile_db, inert, markdown_texts, monkeypatch_module  # noqa: F401
from test_sweeps_page import page

from observatory.dashboard.pages.sweeps import VIEWS

PARAMS = [
    "sel",
    "var",
    "metric",
    "cmetric",
    "value",
    "view",
    "by",
    "x",
    "band",
    "rows",
    "cols",
    "key",
    "color",
    "pkeys",
    "budget",
]


def run(query: dict) -> AppTest:
    return page(**query)


@pytest.mark.parametrize("view", VIEWS)
def test_every_view_over_every_field_planted(hostile_db, view):  # noqa: F811
    keys = {
        "by": "config.model.note",
        "rows": "config.model.note",
        "cols": "config.lr",
        "key": "config.model.note",
    }
    at = run(
        {
            "view": view,
            "metric": "train/loss",
            "var": "project = p",
            "color": "config.model.note",
            **keys,
            "pkeys": "config.model.note,config.lr",
        }
    )
    assert not at.exception, [e.value for e in at.exception]
    texts = markdown_texts(at)
    assert texts
    rendered = {t[:80]: inert(t) for t in texts if inert(t)}
    assert rendered == {}, f"{view}: planted formatting renders"
    specs = " ".join(c.proto.spec for c in at.get("plotly_chart"))
    assert "<b>HTMLMK" not in specs and "<img src=http" not in specs
    if view in ("Curves", "Scatter"):
        assert "&lt;b&gt;HTMLMKrunstartconfigmodelnote" in specs  # the planted label is there, escaped
    if view == "Parallel coordinates":
        assert "run_start.config.model.n" in specs  # a tick label: its first 24 characters
    if view == "Table":
        assert any("HTMLMKrunstartconfigmodelnote" in t for t in texts)


@pytest.mark.slow
@pytest.mark.parametrize("key", PARAMS)
def test_every_sweeps_parameter_with_hostile_values(hostile_db, key):  # noqa: F811
    for value in BAD_VALUES:
        at = run(
            {key: value, **({} if key == "view" else {"view": "Iso-FLOP" if key == "budget" else "Curves"})}
        )
        assert not at.exception, (key, value[:40], [e.value for e in at.exception])
