"""In chromium, over `hostile_store` (every free-text field of every event kind planted): no page of the
dashboard (every one of its registry: `test_hostile_pages.BROWSER_PAGES`, checked against it there) and no
HTML report makes the visitor's browser send a request to a foreign host, no planted formatting renders
(no live link or image from log text) and no page shows an exception box.

A planted part that renders leaves an element whose own text begins with its marker (`**BOLDMK`
is a <strong> holding "BOLDMK…", `:red[REDMK…]` a coloured span, `<b>HTMLMK` a <b>, `# HEADMK` a
heading, `[LINKMK](…)` a link), an image or link to the foreign host, or a Material icon named
`rocket_launch`. Escaped, each is part of a longer run of text that begins with the field's name.
"""

from __future__ import annotations

import re
import time
from urllib.parse import urlparse

import pytest
from browser_fixtures import LOAD_MS, dashboard, wait_idle
from hostile_store import FOREIGN, HOSTILE, HOSTILE2, write_hostile_runs
from test_hostile_pages import BROWSER_PAGES

from observatory import report
from observatory.pipeline import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

RENDERED_JS = """(foreign) => {
  const bad = [];
  const marks = ['BOLDMK', 'REDMK', 'LINKMK', 'IMGMK', 'HTMLMK', 'HEADMK'];
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      const own = (el.textContent || '').trim();
      if (marks.some(m => own.startsWith(m))) bad.push(el.tagName + ': ' + own.slice(0, 40));
      for (const a of ['src', 'href', 'srcset', 'xlink:href', 'poster', 'data']) {
        const v = el.getAttribute(a);  // our own links may carry the text in their query: the host decides
        let host = '';
        try { host = v ? new URL(v.split(' ')[0], location.href).hostname : ''; } catch (e) {}
        if (host === foreign) bad.push(el.tagName + '[' + a + '=' + v.slice(0, 60) + ']');
      }
      if ((el.getAttribute('alt') || '').includes('IMGMK')) bad.push('img alt');
      if (el.getAttribute('data-testid') === 'stIconMaterial' && own === 'rocket_launch') bad.push('icon');
      const bg = getComputedStyle(el).backgroundImage || '';
      if (bg.includes(foreign)) bad.push(el.tagName + ' background');
      if (el.tagName === 'IFRAME') { try { if (el.contentDocument) walk(el.contentDocument); } catch (e) {} }
    }
  };
  walk(document);
  return bad;
}"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile_browser")
    write_hostile_runs(tmp / "runs")
    ingest(tmp / "runs", tmp / "store.duckdb", emit=None)
    with dashboard(tmp / "store.duckdb", tmp / "streamlit.log") as url:
        yield url, tmp / "store.duckdb"


# what the SQL page is asked: the planted fields of every kind, as its result grid shows them
SQL = "SELECT run, kind, data FROM events WHERE run LIKE 'hostile%' ORDER BY kind LIMIT 200"


def _ask_sql(page) -> None:
    page.get_by_label("Query").fill(SQL)
    page.get_by_role("button", name="Run").click()
    page.get_by_text(re.compile(r"^[1-9][\d,]* rows in \d+ ms")).wait_for()  # a result, not an error
    wait_idle(page)


@pytest.mark.parametrize(
    ("name", "query"), BROWSER_PAGES, ids=[f"{n}?{'&'.join(q)}" for n, q in BROWSER_PAGES]
)
def test_no_foreign_request_and_no_planted_formatting(server, browser, name, query):
    server, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    hosts: list[str] = []
    page.on(
        "request", lambda r: r.url.startswith(("blob:", "data:")) or hosts.append(urlparse(r.url).hostname)
    )
    try:
        page.set_default_timeout(LOAD_MS)
        qs = "&".join(f"{k}={v}" for k, v in query.items())
        page.goto(f"{server}/{name}{'?' + qs if qs else ''}")
        page.wait_for_selector('[data-testid="stApp"]')
        wait_idle(page)
        if name == "sql":
            _ask_sql(page)
        time.sleep(1.5)  # charts and images load after the script ends
        for chart in page.locator(".js-plotly-plot").all()[:6]:  # hover labels: notes, failures, anomalies
            box = chart.bounding_box()
            for f in (0.2, 0.35, 0.5, 0.65, 0.8) if box else ():
                page.mouse.move(box["x"] + box["width"] * f, box["y"] + box["height"] * 0.5)
                time.sleep(0.05)
        for tab in page.get_by_role("tab").all():
            tab.click()
            time.sleep(0.3)
        time.sleep(0.5)
        assert page.locator('[data-testid="stException"]').count() == 0, name
        assert page.evaluate(RENDERED_JS, FOREIGN) == [], f"{name}: planted formatting rendered"
        assert set(hosts) <= {"127.0.0.1", "localhost"}, f"{name}: requests to {set(hosts)}"
    finally:
        page.close()


@pytest.mark.parametrize("run", [HOSTILE, HOSTILE2])
def test_the_html_report_sends_nothing_and_renders_no_planted_formatting(server, browser, tmp_path, run):
    path = report.write(server[1], run, tmp_path, "html")
    assert "HTMLMK" in path.read_text()  # the planted text is in the report (escaped)
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    foreign: list[str] = []

    def route(r):
        if r.request.url.startswith(("file://", "data:", "blob:")):
            r.continue_()
        else:
            foreign.append(r.request.url)
            r.abort()

    try:
        page.set_default_timeout(LOAD_MS)
        page.route("**/*", route)
        page.goto(path.resolve().as_uri(), wait_until="load")
        page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length > 0")
        time.sleep(1.0)
        assert page.evaluate(RENDERED_JS, FOREIGN) == [], f"{run}: planted formatting rendered in the report"
        assert foreign == [], f"{run}: the report asked for {foreign}"
    finally:
        page.close()
