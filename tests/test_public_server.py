"""What a visitor's browser gets from a real server started as `observatory dashboard` starts it.

No absolute server path (the checkout, the package, the store, the home directory), no
installation id and no Python version in any websocket frame, HTML page or asset a
browser loads over the pages; `/_stcore/metrics` is not served (issue 36). The server is
`tests/browser_fixtures.dashboard` (through `observatory.dashboard.serve`).
"""

from __future__ import annotations

import urllib.request

import pytest
from browser_fixtures import PUBLIC_PAGES, dashboard, page_traffic, server_secrets
from dashboard_fixtures import make_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = PUBLIC_PAGES


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runs_dir, db = make_store(tmp_path_factory.mktemp("public"))
    with dashboard(db, tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url, db


def test_the_metrics_endpoint_is_not_served(served):
    """Streamlit serves its session and cache figures at /_stcore/metrics (OpenMetrics text) to anyone.
    Now that path is like any unknown one: the app's own page (Streamlit's fallback), no figures."""
    url, _ = served
    for path in ("/_stcore/metrics", "/_stcore/metrics?families=session_state,cache_memory_bytes"):
        with urllib.request.urlopen(url + path, timeout=10) as r:
            body = r.read()
            assert "openmetrics" not in r.headers.get("content-type", ""), path
        assert b"# TYPE" not in body and b"session_events" not in body, path
    with urllib.request.urlopen(url + "/_stcore/health", timeout=10) as r:  # the health check still answers
        assert r.status == 200


def test_no_server_path_or_installation_id_reaches_the_browser(served, browser):
    url, db = served
    secrets = server_secrets(db)
    frames, bodies = page_traffic(browser, url, PAGES)
    assert len(frames) > len(PAGES) and any(b"new_session" in f or b"app.py" in f for f in frames)
    assert any(b"app.py" in f for f in frames)  # the script is named, by its name only
    leaks = [(s, f[:200]) for f in frames for s in secrets if s.encode() in f]
    assert leaks == [], leaks[:3]
    leaks = [(s, u) for u, b in bodies for s in secrets if s.encode() in b]
    assert leaks == [], leaks[:3]
    assert bodies, "the HTML and assets were read"
