"""The Runs page at many runs, in a real browser (Debian chromium through Playwright): the table pages
through the runs server-side and the search box finds runs by id prefix, name, tag or project, and the
run picker of the Live page finds a run the same way."""

from __future__ import annotations

import json

import pytest
from browser_fixtures import LOAD_MS, assert_no_exception, dashboard, page_at, wait_idle

from observatory.pipeline import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

N = 130  # three pages of 50


def _write(runs, i: int) -> None:
    run = f"sweep-{i:04d}"
    d = runs / run
    d.mkdir(parents=True)
    lines = [
        {
            "v": 1,
            "run": run,
            "kind": "run_start",
            "step": 0,
            "t": 1.76e9 + i,
            "host": 0,
            "seq": 0,
            "data": {"config": {"lr": 1e-3}, "project": "alpha" if i % 2 else "beta", "tags": [f"t{i % 3}"]},
        }
    ]
    lines += [
        {
            "v": 1,
            "run": run,
            "kind": "metrics",
            "step": s,
            "t": 1.76e9 + i + s,
            "host": 0,
            "seq": s,
            "data": {"train/loss": 3.0 - s / 10},
        }
        for s in range(1, 6)
    ]
    lines.append(
        {
            "v": 1,
            "run": run,
            "kind": "run_end",
            "step": 5,
            "t": 1.76e9 + i + 6,
            "host": 0,
            "seq": 6,
            "data": {"status": "completed", "final_step": 5},
        }
    )
    (d / "events.0.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("many-runs")
    for i in range(N):
        _write(tmp / "runs", i)
    ingest(tmp / "runs", tmp / "s.duckdb", emit=None)
    with dashboard(tmp / "s.duckdb", tmp / "streamlit.log") as url:
        yield url


def _grid(page, has: str) -> str:
    """The table's text (its accessible table: the grid itself is a canvas) once it shows `has`."""
    page.wait_for_function(
        "t => (document.querySelector('[data-testid=\"stDataFrame\"]') || {}).textContent?.includes(t)",
        arg=has,
        timeout=LOAD_MS,
    )
    return page.locator('[data-testid="stDataFrame"]').first.text_content()


def test_the_runs_table_pages_and_searches_on_the_server(server, browser):
    with page_at(browser, f"{server}/") as page:  # the Runs page is the app's first page
        page.get_by_role("heading", name="Runs").first.wait_for()
        page.get_by_text(f"1–50 of {N} runs").wait_for(timeout=LOAD_MS)
        page.get_by_text("page 1 of 3").wait_for()
        assert "sweep-0079" not in _grid(page, "sweep-0129")  # newest first, 50 of them
        page.get_by_role("button", name="Next →").click()
        page.get_by_text(f"51–100 of {N} runs").wait_for(timeout=LOAD_MS)
        assert "page=2" in page.evaluate("() => location.search")
        assert "sweep-0129" not in _grid(page, "sweep-0079")
        # a prefix: ten runs, one page, no pager
        box = page.get_by_role("textbox", name="Search")
        box.fill("sweep-011")
        box.press("Enter")
        page.get_by_text("1–10 of 10 runs").wait_for(timeout=LOAD_MS)
        text = _grid(page, "sweep-0119")
        assert "sweep-0129" not in text and "sweep-0109" not in text
        assert page.get_by_role("button", name="Next →").count() == 0
        # words search the name, tags and project too: every odd run is in project alpha; t0 is every third
        box.fill("alpha t0")
        box.press("Enter")
        want = sum(1 for i in range(N) if i % 2 and i % 3 == 0)
        page.get_by_text(f"1–{want} of {want} runs").wait_for(timeout=LOAD_MS)
        assert_no_exception(page, "runs")


def test_the_live_page_picker_finds_a_run_by_search(server, browser):
    with page_at(browser, f"{server}/live") as page:
        page.get_by_role("heading", name="Live run").first.wait_for()
        box = page.get_by_role("textbox", name="Find a run")
        box.fill("sweep-0007")
        box.press("Enter")
        page.wait_for_function("() => location.search.includes('run=sweep-0007')", timeout=LOAD_MS)
        wait_idle(page)
        assert_no_exception(page, "live")


def test_a_click_on_a_run_opens_its_live_page_in_the_same_tab(server, browser):
    """A W&B user clicks their run in the table: its Live page opens here, not in a new tab."""
    with page_at(browser, f"{server}/") as page:
        _grid(page, "sweep-0129")
        box = page.locator('[data-testid="stDataFrame"]').first.bounding_box()
        # the grid is a canvas: the first row's run cell sits under the header row (35 px rows)
        page.mouse.click(box["x"] + 40, box["y"] + 35 + 17)
        page.wait_for_url("**/live?run=sweep-0129", timeout=LOAD_MS)
        page.get_by_role("heading", name="Live run").first.wait_for(timeout=LOAD_MS)
        page.locator(".js-plotly-plot").first.wait_for(timeout=LOAD_MS)  # its loss chart
        assert len(page.context.pages) == 1  # no new tab
        assert_no_exception(page, "live")
