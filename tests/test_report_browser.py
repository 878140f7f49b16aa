"""The HTML reports opened in headless Debian chromium: no console errors, every figure drawn, offline.

Playwright drives /usr/bin/chromium (the `browser` fixture of tests/conftest.py).
Every request that is not the report file itself is blocked and recorded, so a
report that needed the network would show up as a failure, not as a slow page.
"""

from __future__ import annotations

import pytest

from observatory import report
from observatory.report.figures import figures

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    from test_report import shared_store  # the same three runs as tests/test_report.py

    _, db = shared_store(tmp_path_factory)
    root = tmp_path_factory.mktemp("report_browser")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OBSERVATORY_STALE_AFTER_S", "0.5")
        for run in ("done", "nan", "crash"):
            rep = report.build(db, run)
            out[run] = (report.write(db, run, root / "out", "html"), rep.status, len(figures(rep)))
    return out


@pytest.mark.parametrize("run", ["done", "nan", "crash"])
def test_report_opens_offline_with_all_figures(reports, browser, run):
    path, status, n_figs = reports[run]
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(120_000)  # two shared cores: a 5 MB page can take a while to load
    errors, external = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def route(r):
        if r.request.url.startswith("file://"):
            r.continue_()
        else:
            external.append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.goto(path.resolve().as_uri(), wait_until="load")
    # plotly draws each figure into .js-plotly-plot > .main-svg once its data is laid out
    page.wait_for_function(
        "n => document.querySelectorAll('.figure .js-plotly-plot .main-svg').length >= n",
        arg=n_figs,
        timeout=60_000,
    )
    assert page.locator(".figure").count() == n_figs
    assert page.locator(".figure .js-plotly-plot").count() == n_figs
    # the overview draws one trace per metric panel plus the event markers
    traces = page.evaluate("document.getElementById('fig-overview').data.length")
    assert traces >= 5
    assert page.locator(f".status-{status}").first.is_visible()
    assert page.locator("#summary .story li").count() >= 1
    assert page.locator("#timeline tbody tr").count() >= 3
    if run == "nan":
        assert page.locator("#timeline tr.k-failure").count() == 1
        assert "non-finite at step 70" in page.locator("#summary").inner_text()
    assert errors == [], errors
    assert external == [], external
    page.close()
