"""Helpers for the real-browser tests: a `streamlit run` server, Debian chromium, pages that open.

Used by tests/test_browser.py, tests/test_public_browser.py, tests/test_demo_browser.py,
bench/bench_live_follow.py and, through the `browser` fixture of tests/conftest.py,
tests/test_report_browser.py. Playwright drives /usr/bin/chromium (it cannot download its
own browser here).
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from observatory import report
from observatory.commands.dashboard import streamlit_argv

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = list(report.CHROMIUM_ARGS)
LOAD_MS = 90_000  # two shared CPU cores: a cold page can take a while


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_demo(tmp_path: Path, port: int, **env: str) -> tuple[subprocess.Popen, Path]:
    """`python -m observatory.demo` (what `make demo` runs) in a session of its own, its runs dir and store
    under `tmp_path`, 20 steps a demo run: (the process, its log)."""
    env = dict(
        os.environ,
        OBSERVATORY_RUNS=str(tmp_path / "runs"),
        OBSERVATORY_DB=str(tmp_path / "obs.duckdb"),
        OBSERVATORY_PORT=str(port),
        OBSERVATORY_DEMO_STEPS="20",
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **env,
    )
    log = tmp_path / "demo.log"
    cmd = [sys.executable, "-m", "observatory.demo"]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    return proc, log


def start_server(app: Path, db: Path, port: int, log: Path) -> subprocess.Popen:
    """`streamlit run` on localhost:port as `observatory dashboard` starts it (`streamlit_argv`: hardened,
    headless, the repo's .streamlit/config.toml), ready when healthy."""
    env = dict(os.environ, OBSERVATORY_DB=str(db), OBSERVATORY_CACHE_TTL_S="1")
    proc = subprocess.Popen(
        streamlit_argv(app, port, "127.0.0.1"),
        cwd=app.parent,
        env=env,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_healthy(proc, port, log, 90, "streamlit")
    except RuntimeError:
        proc.kill()
        raise
    return proc


def wait_healthy(proc: subprocess.Popen, port: int, log: Path, seconds: float, what: str) -> None:
    """Until the Streamlit server on localhost:port answers its health check; raise with the log's tail."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited: {log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"{what} did not become healthy in {seconds:.0f} s: {log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def dashboard(db: Path, log: Path) -> Iterator[str]:
    """The dashboard (the repo's app.py) over `db` on a free port: its URL, the server stopped after."""
    port = free_port()
    proc = start_server(ROOT / "app.py", db, port, log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)


@contextmanager
def chromium() -> Iterator:
    """Headless Debian chromium driven by Playwright; tests/conftest.py's `browser` fixture is one per module."""
    from playwright.sync_api import sync_playwright  # lazy: collecting the browser tests needs no playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str, height: int = 1000):
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.set_default_timeout(LOAD_MS)
    page.goto(url)
    page.wait_for_selector('[data-testid="stApp"]')
    return page


@contextmanager
def page_at(browser, url: str, height: int = 1000) -> Iterator:
    """`open_page`, closed when the block ends (passed or not)."""
    page = open_page(browser, url, height)
    try:
        yield page
    finally:
        page.close()


def wait_idle(page) -> None:
    """Until Streamlit reports the script finished (the status widget goes away)."""
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=LOAD_MS
    )


def assert_no_exception(page, name: str) -> None:
    """No Streamlit exception box and no traceback on the page; a failure shows the exception's text."""
    exceptions = page.locator('[data-testid="stException"]')
    if exceptions.count():
        raise AssertionError(f"{name}: exception on the page: {exceptions.first.inner_text()[:3000]}")
    assert "Traceback" not in page.inner_text("body"), name


def last_step(page) -> int | None:
    """The 'Last step' figure of the Live page's status line."""
    box = page.locator('[data-testid="stMarkdown"]', has_text="Last step")
    if box.count() == 0:
        return None
    m = re.search(r"Last step\s+([\d,]+)", box.first.inner_text())
    return int(m.group(1).replace(",", "")) if m else None


def server_secrets(db: Path) -> list[str]:
    """What must not reach a browser from a dashboard over `db`: server paths (the checkout, the package, the
    store, the home folder, the Python prefix) and the installation ids the server would send."""
    import observatory

    paths = {str(ROOT), str(Path(observatory.__file__).parent), str(db), str(db.parent), sys.prefix}
    paths |= {os.path.expanduser("~"), os.path.realpath(str(ROOT))}
    from streamlit.runtime.metrics_util import Installation  # the same ids as the server's, on this machine

    paths |= {Installation.instance().installation_id, Installation.instance().installation_id_v3}
    return sorted(p for p in paths if len(p) > 4)


# the pages a visitor opens, as deep links (over tests/dashboard_fixtures.make_store's runs)
PUBLIC_PAGES = [
    "runs",
    "live?run=base-run",
    "experts?run=base-run",
    "compare?runs=base-run,fork-run",
    "sql",
    "health",
]


def page_traffic(browser, url: str, pages: list[str]) -> tuple[list[bytes], list[tuple[str, bytes]]]:
    """Every websocket frame and every HTTP body (url, body) a browser gets opening each of `pages` (paths
    under `url`; on the SQL page, running one query)."""
    frames: list[bytes] = []
    bodies: list[tuple[str, bytes]] = []

    def body(r) -> bytes:
        try:
            return r.body()
        except Exception:  # a redirect or a streamed response has none
            return b""

    for path in pages:
        page = open_page(browser, f"{url}/{path}")
        page.on("response", lambda r: bodies.append((r.url, body(r))))
        try:
            page.on(
                "websocket",
                lambda ws: ws.on(
                    "framereceived", lambda p: frames.append(p if isinstance(p, bytes) else str(p).encode())
                ),
            )
            page.reload()
            page.wait_for_selector('[data-testid="stApp"]')
            wait_idle(page)
            if path == "sql":
                page.locator("textarea").first.fill("SELECT 1 AS one")
                page.get_by_role("button", name="Run", exact=True).click()
                page.get_by_text(re.compile(r"rows? in")).first.wait_for()
        finally:
            page.close()
    return frames, bodies
