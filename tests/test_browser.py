"""The dashboard in a real browser: Debian chromium driven by Playwright against `streamlit run app.py`.

Opens every page and sees its charts (screenshots kept under artifacts/browser/,
gitignored), then follows a live run while a writer appends and the ingester
follows: the Live page's "Last step" must advance by itself.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from browser_fixtures import LOAD_MS, ROOT, assert_no_exception, dashboard, last_step, open_page, wait_idle
from dashboard_fixtures import growing_run, make_store
from scale_fixtures import HOT_EXPERT, HOT_LAYER, RUN, make_scale_store

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "artifacts" / "browser"


@pytest.fixture(scope="module")
def live_store(tmp_path_factory):
    """The fixture store (three finished runs), shared by the server and every test here."""
    return make_store(tmp_path_factory.mktemp("browser"))


@pytest.fixture
def live_run(live_store):
    """`live-run`, which a writer thread appends to (4 steps/s) while `ingest --follow` runs, for one test:
    (its id, the event that stops the writer, which then ends the run)."""
    with growing_run(*live_store, "live-run") as stop_ev:
        yield "live-run", stop_ev


@pytest.fixture(scope="module")
def server(live_store, tmp_path_factory):
    with dashboard(live_store[1], tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url


@pytest.mark.parametrize(
    "path, title, min_charts, last",
    [
        ("runs", "Runs", 0, None),
        ("live?run=base-run", "Live run", 7, None),
        ("experts?run=base-run", "Experts", 4, None),
        ("compare?runs=base-run,fork-run", "Compare", 1, None),
        # the fixture's D-7 has a status no record allows (a foreign log): named on the page, the rest shown
        ("decisions", "Decisions", 0, "Download as Markdown"),
        ("ladder", None, 0, None),
        ("reports", "Reports", 0, "Download the report"),
        ("sql", "SQL", 0, None),
    ],
)
def test_every_page_opens(server, browser, path, title, min_charts, last):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = open_page(browser, f"{server}/{path}")
    try:
        if title:
            page.get_by_role("heading", name=title).first.wait_for()
        if min_charts:
            page.wait_for_function(
                f"() => document.querySelectorAll('.js-plotly-plot').length >= {min_charts}", timeout=LOAD_MS
            )
        if last:  # the page's last element: the script ran to its end (an exception would stop it first)
            page.get_by_text(last).first.wait_for()
        wait_idle(page)
        if path == "decisions":
            assert "D-7" in page.inner_text("body") and "not valid" in page.inner_text("body")
        if path == "runs":
            page.locator('[data-testid="stDataFrame"]').first.wait_for()
        page.screenshot(path=str(ARTIFACTS / f"{path.split('?')[0]}.png"), full_page=True)
        assert_no_exception(page, path)
        assert "sk-secret-value" not in page.content()  # secrets never shown (redacted at the writer)
        # the plotly charts really drew (SVG traces, not empty frames)
        if min_charts:
            assert (
                page.locator(".js-plotly-plot .scatterlayer .trace, .js-plotly-plot .heatmaplayer").count()
                > 0
            )
    finally:
        page.close()


def test_an_alert_link_opens_the_live_page_on_its_step(server, browser):
    """`/live?run=R&step=S` (an alert's link): every chart opens on a window around S, S marked and labelled."""
    page = open_page(browser, f"{server}/live?run=base-run&step=60")
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('.js-plotly-plot').length >= 7", timeout=LOAD_MS
        )
        wait_idle(page)
        ranges = page.evaluate(
            "() => [...document.querySelectorAll('.js-plotly-plot')].map(p => p.layout.xaxis.range)"
        )
        assert len(ranges) >= 7 and all(r[0] < 60 < r[1] and r[1] - r[0] < 60 for r in ranges), ranges
        assert page.locator(".js-plotly-plot .annotation-text", has_text="step 60").count() >= 7
        assert_no_exception(page, "live?step=60")
    finally:
        page.close()


@pytest.fixture(scope="module")
def scale_server(tmp_path_factory):
    """A server over a run of the reference shape: 48 layers x 384 experts."""
    _, db = make_scale_store(tmp_path_factory.mktemp("scale"))
    with dashboard(db, tmp_path_factory.mktemp("log") / "streamlit-scale.log") as url:
        yield url


def test_experts_page_at_384_experts(scale_server, browser, tmp_path):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # a tall window: Streamlit scrolls inside the page, so a full-page screenshot is one window high
    page = open_page(browser, f"{scale_server}/experts?run={RUN}&layer={HOT_LAYER}", height=3000)
    try:
        page.get_by_role("heading", name="Experts").first.wait_for()
        page.wait_for_function(
            "() => document.querySelectorAll('.js-plotly-plot .heatmaplayer image').length >= 3",
            timeout=LOAD_MS,
        )
        wait_idle(page)
        shot = tmp_path / "experts-384.png"
        page.screenshot(path=str(shot), full_page=True)
        (ARTIFACTS / "experts-384.png").write_bytes(shot.read_bytes())
        assert_no_exception(page, "experts 384")
        ticks = page.eval_on_selector_all(".js-plotly-plot .ytick text", "els => els.map(e => e.textContent)")
        assert f"{HOT_EXPERT} hot" in ticks and any(" dead" in t for t in ticks)
        assert len(ticks) < 250  # 48 layer rows + 2 x 384 expert rows, thinned
        # hovering the top row of the load-share heatmap names expert 0 (rows by id), its step, share and drop
        box = page.locator(".js-plotly-plot").nth(1).locator(".nsewdrag").first.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + 1)
        page.wait_for_function("() => document.querySelectorAll('.hoverlayer text').length > 0")
        hover = " ".join(page.eval_on_selector_all(".hoverlayer text", "els => els.map(e => e.textContent)"))
        assert "expert 0 " in hover and "step" in hover and "load share" in hover and "dropped" in hover
    finally:
        page.close()


def test_sql_console_in_browser(server, browser):
    page = open_page(browser, f"{server}/sql")
    try:
        page.get_by_role("heading", name="SQL").first.wait_for()
        editor = page.locator("textarea").first
        editor.fill("ATTACH '/tmp/x.duckdb' AS x")
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text(re.compile("Refused")).first.wait_for()
        editor.fill("SELECT run, status FROM runs ORDER BY run")
        page.get_by_role("button", name="Run", exact=True).click()
        page.get_by_text(re.compile(r"\d+ rows in")).first.wait_for()
        page.screenshot(path=str(ARTIFACTS / "sql-result.png"), full_page=True)
        assert_no_exception(page, "sql")
        with page.expect_download() as dl:  # the CSV is made when asked for
            page.get_by_role("button", name="Download CSV").click()
        csv = Path(dl.value.path()).read_text()
        assert csv.splitlines()[0] == "run,status" and "base-run" in csv
    finally:
        page.close()


def test_sql_console_shows_every_duckdb_type_in_browser(server, browser):
    """The browser's table draws every column of test_all_types() (HUGEINT, TIMETZ, INTERVAL, UNION,
    MAP, BLOB, ...) and a few more, with no exception on the page or in its scripts."""
    page = open_page(browser, f"{server}/sql")
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.get_by_role("heading", name="SQL").first.wait_for()
        for sql, rows in [
            ("SELECT * FROM test_all_types()", 3),
            ("SELECT '12:00:00+05'::TIMETZ tz, INTERVAL 14 MONTH i, 1::UHUGEINT << 127 uh, 1::VARIANT v", 1),
        ]:
            page.locator("textarea").first.fill(sql)
            page.get_by_role("button", name="Run", exact=True).click()
            page.get_by_text(re.compile(rf"^{rows} rows? in")).first.wait_for()
            page.locator('[data-testid="stDataFrame"]').last.wait_for()
            wait_idle(page)
            assert_no_exception(page, "sql")
            assert not page.locator('[data-testid="stAlertContainer"]').count(), page.inner_text("body")[
                :2000
            ]
        assert not errors, errors
    finally:
        page.close()


def test_live_page_follows_a_running_run(server, browser, live_run):
    live_run, end_run = live_run
    page = open_page(browser, f"{server}/live?run={live_run}")
    try:
        page.wait_for_function(
            "() => document.querySelectorAll('.js-plotly-plot').length >= 1", timeout=LOAD_MS
        )
        page.get_by_text("Live: the charts are redrawn").first.wait_for()
        first = None
        deadline = time.time() + 60
        while first is None and time.time() < deadline:
            first = last_step(page)
            time.sleep(0.5)
        assert first is not None
        seen = first
        deadline = time.time() + 45
        while seen <= first + 3 and time.time() < deadline:  # no reload, no click: the fragment refreshes
            time.sleep(1.0)
            seen = last_step(page) or seen
        page.screenshot(path=str(ARTIFACTS / "live-follow.png"), full_page=True)
        assert seen > first + 3, f"last step stayed at {first} -> {seen}"
        assert_no_exception(page, "live follow")
        # the run ends (`run_end`, which the follower ingests): the page turns into a finished run's by itself
        end_run.set()
        page.get_by_text("Not running: shown as of its last event.").first.wait_for(timeout=60_000)
        assert page.get_by_text("Live: the charts are redrawn").count() == 0
        page.get_by_text("completed").first.wait_for()
        assert "lock" not in page.inner_text("body").lower()  # no lock error ever reaches the page
    finally:
        page.close()
