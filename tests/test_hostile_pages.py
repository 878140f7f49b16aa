"""Every page over a store holding every optional field of every event kind, each free-text field planted.

`hostile_store` plants Markdown, HTML, Streamlit directives, foreign image and link URLs and
a ladder name that ends like another ladder's widget key into every free-text field that
`observatory.events.KINDS` declares. Under AppTest each page (and each of its views a query
parameter opens) runs without an exception (a duplicate widget key is one), and every text
it hands Streamlit as Markdown (markdown, captions, headers, alerts, labels) is inert: it
renders as no bold, link, image, HTML, heading, colour or icon. tests/test_hostile_browser.py
checks the same pages in chromium.
"""

from __future__ import annotations

import re

import pytest
from hostile_store import DECISION, FORGED, HOSTILE, HOSTILE2, MARKS, write_hostile_runs
from markdown_it import MarkdownIt
from streamlit.testing.v1 import AppTest

from observatory.pipeline import ingest

PAGES = [
    ("runs", {}),
    ("runs", {"by": "ladder"}),
    ("runs", {"group": "g", "project": "p"}),
    ("live", {"run": HOSTILE}),
    ("experts", {"run": HOSTILE}),
    ("compare", {"runs": f"{HOSTILE},{HOSTILE2}"}),
    ("decisions", {"decision": DECISION}),
    ("decisions", {}),
    ("reports", {"run": HOSTILE}),
    ("ladder", {}),
    ("health", {"run": HOSTILE}),
]
# what tests/test_hostile_browser.py opens in chromium: these, and the pages AppTest cannot drive as a visitor
# does (Sweeps' views draw through plotly; SQL shows a query's result only once Run is clicked)
SWEEP_VARS = {"metric": "train/loss", "var": "project = p", "color": "config.model.note"}
BROWSER_PAGES = PAGES + [
    ("sweeps", {"view": "Curves", **SWEEP_VARS}),
    ("sweeps", {"view": "Table", "key": "config.model.note", **SWEEP_VARS}),
    ("sql", {}),
]
# what plotly would draw as markup from a planted part (its titles, names and hover text take `<b>`,
# `<a href>` and `<img>`): an escaped part is `&lt;b&gt;` in the figure's JSON
_PLOTLY_MARKUP = re.compile(r"(?:<|\\u003c)(?:b(?:>|\\u003e)HTMLMK|img src=|a href=)", re.IGNORECASE)
_MD = MarkdownIt("commonmark")
# what a planted part becomes when Markdown or Streamlit renders it
_RENDERED = re.compile(r"<(?:strong|em|h\d|b)>[^<]*MK|<a href=\"(?:https?:)?//evil\.invalid|<img\b")
# Streamlit's directives, and the bare URLs GitHub-flavoured Markdown links whether escaped or not
_DIRECTIVE = re.compile(
    r"(?<!\\):(red|material)(?!\\)[\[/]|(?<!\\)\[LINKMK|(?<!\\)\[IMGMK|(?i:https?|www)\\?[:.]"
)


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory, monkeypatch_module):
    tmp = tmp_path_factory.mktemp("hostile")
    write_hostile_runs(tmp / "runs")
    ingest(tmp / "runs", tmp / "store.duckdb", emit=None)
    monkeypatch_module.setenv("OBSERVATORY_DB", str(tmp / "store.duckdb"))
    return tmp / "store.duckdb"


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def markdown_texts(at: AppTest) -> list[str]:
    """Every string the page hands Streamlit to render as Markdown."""
    out = []
    for kind in (
        "markdown",
        "caption",
        "subheader",
        "header",
        "title",
        "info",
        "warning",
        "error",
        "success",
    ):
        out += [str(e.value) for e in at.get(kind)]
    for kind in (
        "expander",
        "tab",
        "metric",
        "toggle",
        "checkbox",
        "button",
        "selectbox",
        "multiselect",
        "text_input",
        "radio",
        "slider",
    ):
        for e in at.get(kind):
            out += [str(getattr(e, a)) for a in ("label", "help") if getattr(e, a, None)]
    return out


def inert(md: str) -> list[str]:
    """What of the planted formatting in `md` would render; [] when none."""
    if "MK" not in md and "rocket_launch" not in md:
        return []
    found = []
    html = _MD.render(md)
    found += [m.group(0) for m in _RENDERED.finditer(html)]
    found += [md[m.start() : m.start() + 40] for m in _DIRECTIVE.finditer(md)]
    return found


@pytest.mark.parametrize(("name", "query"), PAGES, ids=[f"{n}?{'&'.join(q)}" for n, q in PAGES])
def test_every_page_over_every_field_planted(hostile_db, name, query):
    at = AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=120
    )
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    texts = markdown_texts(at)
    assert texts, name
    rendered = {t[:80]: inert(t) for t in texts if inert(t)}
    assert rendered == {}, f"{name}: planted formatting renders"
    # findings in a trainer's log, or put into the observatory's own file by hand (unsigned, or signed
    # with another key), are rejected lines: no page shows them as its word
    specs = [c.proto.spec for c in at.get("plotly_chart")]
    assert not [m.group(0) for sp in specs for m in _PLOTLY_MARKUP.finditer(sp)], f"{name}: plotly markup"
    shown = texts + specs + [d.value.to_csv() for d in at.dataframe]
    assert not [t[:200] for t in shown if FORGED in t], f"{name}: a forged finding is shown"


def test_the_browser_sweep_opens_every_page_of_the_dashboard():
    """A page added to the dashboard's registry and left out of the sweep fails here."""
    from observatory.dashboard.pages import PAGES as REGISTRY

    assert {url for _, _, url, _ in REGISTRY} == {name for name, _ in BROWSER_PAGES}


def test_forged_findings_are_rejected_lines_with_their_reason(hostile_db):
    import duckdb

    with duckdb.connect(str(hostile_db), read_only=True) as con:
        assert con.execute(
            "SELECT count(*) FROM events WHERE data::VARCHAR LIKE '%FORGEDMK%'"
        ).fetchone() == (0,)
        reasons = con.execute("SELECT reason FROM rejected_events WHERE raw LIKE '%FORGEDMK%'").fetchall()
        signed = con.execute("SELECT count(*) FROM events WHERE kind = 'anomaly' AND host = 1000").fetchone()
    assert len(reasons) == 2 * (2 + 3 + 3 + 3)  # 2 runs x (anomaly and alert in the trainer's log, 3 kinds
    # unsigned in the observatory's file, 3 signed with HMAC of another key, 3 by an untrusted Ed25519 key)
    assert {
        r
        for (r,) in reasons
        if "only its own file" in r or "not signed" in r or "signature" in r or "not trusted" in r
    } == {r for (r,) in reasons}
    assert sum("not trusted" in r for (r,) in reasons) == 2 * 3
    assert signed[0] >= 2  # the observatory's own, signed, are stored (and shown, escaped, above)


def test_the_markers_are_caught_when_not_escaped():
    """The check above sees each planted part when it is not escaped (so a pass means escaped, not unseen)."""
    for part in MARKS.values():
        assert inert("x " + part.format(w="t")), part
    from observatory.markup import md_escape

    assert inert(md_escape(" ".join(m.format(w="t") for m in MARKS.values()))) == []


# every query parameter a page reads, with values a visitor can send: each is used or ignored, never a crash
PARAMS = {
    "runs": ["q", "status", "project", "group", "ladder", "tags", "by", "page"],
    "live": ["run"],
    "experts": ["run", "layer"],
    "compare": ["runs", "metric", "x"],
    "decisions": ["decision"],
    "reports": ["run"],
    "ladder": ["ladder"],
}
BAD_VALUES = [
    "²",
    "9" * 5000,
    "-1",
    "1e9",
    "nan",
    "",
    " ",
    "x" * 100_000,
    "../../etc/passwd",
    "a\x00b",
    "🙂",
    "hostile,hostile-2," + "y" * 300,
    "%00",
    "<img src=http://evil.invalid/p.png>",
    "0x10",
]


@pytest.mark.slow  # ~10-50 s a page: every parameter, each hostile value, a page run each
@pytest.mark.parametrize("name", list(PARAMS))
def test_every_query_parameter_with_hostile_values(hostile_db, name):
    for key in PARAMS[name]:
        for value in BAD_VALUES:
            at = AppTest.from_string(
                f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=120
            )
            at.query_params[key] = value
            if name == "experts" and key == "layer":
                at.query_params["run"] = HOSTILE
            at.run()
            assert not at.exception, (name, key, value[:40], [e.value for e in at.exception])
