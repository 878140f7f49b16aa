"""What a visitor's browser gets from a real server started as `observatory dashboard` starts it.

No absolute server path (the checkout, the package, the store, the home directory), no
installation id and no Python version in any websocket frame, HTML page or asset a
browser loads over the pages; `/_stcore/metrics` is not served (issue 36). The server is
`tests/browser_fixtures.dashboard` (through `observatory.dashboard.serve`).
"""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from pathlib import Path

import pytest
from browser_fixtures import ROOT, dashboard, open_page, wait_idle
from dashboard_fixtures import make_store

import observatory

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAGES = [
    "runs",
    "live?run=base-run",
    "experts?run=base-run",
    "compare?runs=base-run,fork-run",
    "sql",
    "health",
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    runs_dir, db = make_store(tmp_path_factory.mktemp("public"))
    with dashboard(db, tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url, db


def _secrets(db: Path) -> list[str]:
    """What must not reach a browser: server paths, and the ids the server would send."""
    paths = {str(ROOT), str(Path(observatory.__file__).parent), str(db), str(db.parent), sys.prefix}
    paths |= {os.path.expanduser("~"), os.path.realpath(str(ROOT))}
    from streamlit.runtime.metrics_util import Installation  # the same ids as the server's, on this machine

    paths |= {Installation.instance().installation_id, Installation.instance().installation_id_v3}
    return sorted(p for p in paths if len(p) > 4)


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
    secrets = _secrets(db)
    frames: list[bytes] = []
    bodies: list[tuple[str, bytes]] = []
    for path in PAGES:
        page = open_page(browser, f"{url}/{path}")
        page.on("response", lambda r: bodies.append((r.url, _body(r))))
        try:
            page.on("websocket", lambda ws: ws.on("framereceived", lambda p: frames.append(_bytes(p))))
            page.reload()
            page.wait_for_selector('[data-testid="stApp"]')
            wait_idle(page)
            if path == "sql":
                page.locator("textarea").first.fill("SELECT 1 AS one")
                page.get_by_role("button", name="Run", exact=True).click()
                page.get_by_text(re.compile(r"rows? in")).first.wait_for()
        finally:
            page.close()
    assert len(frames) > len(PAGES) and any(b"new_session" in f or b"app.py" in f for f in frames)
    assert any(b"app.py" in f for f in frames)  # the script is named, by its name only
    leaks = [(s, f[:200]) for f in frames for s in secrets if s.encode() in f]
    assert leaks == [], leaks[:3]
    leaks = [(s, u) for u, b in bodies for s in secrets if s.encode() in b]
    assert leaks == [], leaks[:3]
    assert bodies, "the HTML and assets were read"


def _bytes(p) -> bytes:
    return p if isinstance(p, bytes) else str(p).encode()


def _body(r) -> bytes:
    try:
        return r.body()
    except Exception:  # a redirect or a streamed response has none
        return b""
