"""The Live page names a crash loop (issue 56), in a real browser (Debian chromium through Playwright)."""

from __future__ import annotations

import pytest
from browser_fixtures import assert_no_exception, dashboard, open_page

from observatory.interop.simulate_slow import simulate_slow
from observatory.pipeline import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]


def test_the_live_page_says_crash_loop_with_the_attempt_count(tmp_path, browser):
    runs, db = tmp_path / "runs", tmp_path / "store.duckdb"
    run, _ = simulate_slow("crash_loop", runs)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)
    with dashboard(db, tmp_path / "server.log") as url:
        page = open_page(browser, f"{url}/live?run={run}")
        try:
            alert = page.locator('[data-testid="stAlert"]', has_text="crash loop")
            alert.first.wait_for()
            assert "crash loop: 2 attempts failed at step 60 with InjectedCrash" in alert.first.inner_text()
            assert_no_exception(page, "live")
        finally:
            page.close()
