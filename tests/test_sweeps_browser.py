"""The Sweeps page in a real browser (Debian chromium through Playwright) at a phone's width (390 px) and a
desktop's (1,400 px): every view draws from a pasted URL, no exception, nothing wider than the screen."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from browser_fixtures import LOAD_MS, ROOT, assert_no_exception, dashboard
from sweep_fixtures import make_sweep_store

from observatory.demo import isoflop_view

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "artifacts" / "browser"
QUERY = isoflop_view("isoflop-sim", "isoflop-var")  # sweep_fixtures' grids
# view -> what shows when it is drawn (a CSS selector, or a text)
VIEWS = {
    "Curves": ".js-plotly-plot",
    "Table": "a[href*='live?run=isoflop-sim-1e17-n0']",
    "Scatter": ".js-plotly-plot",
    "Parallel coordinates": ".js-plotly-plot .parcoords, .js-plotly-plot .parcoords-lines",
    "Iso-FLOP": "[data-testid='stDataFrame']",
    "Variant vs baseline": "text=reaches the baseline's loss with 0.7",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sweeps-browser")
    _, db = make_sweep_store(tmp)
    with dashboard(db, tmp / "streamlit.log") as url:
        yield url


@pytest.mark.parametrize("width", [390, 1400])
def test_every_view_at_phone_and_desktop_width(server, browser, width):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    mobile = width < 600
    page = browser.new_page(viewport={"width": width, "height": 900}, is_mobile=mobile, has_touch=mobile)
    page.set_default_timeout(LOAD_MS)
    try:
        page.goto(f"{server}/sweeps?{urlencode(QUERY)}")
        page.wait_for_selector(".js-plotly-plot")
        for view, shows in VIEWS.items():
            page.locator("[data-testid='stRadio'] label", has_text=view).first.click()
            page.locator(shows).first.wait_for(state="visible")
            page.wait_for_function(
                "v => new URLSearchParams(location.search).get('view') === v", arg=view, timeout=LOAD_MS
            )
            assert_no_exception(page, f"{view} at {width} px")
            wide = page.evaluate("() => document.documentElement.scrollWidth")
            assert wide <= width + 1, f"{view} at {width} px: the page is {wide} px wide"
            page.screenshot(path=str(ARTIFACTS / f"sweeps-{width}-{view.split()[0].lower()}.png"))
    finally:
        page.close()
