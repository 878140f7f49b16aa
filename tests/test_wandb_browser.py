"""A W&B user's first run, as the README tells it, seen in a real headless chromium.

The W&B tutorial loop (`import observatory as wandb`, `init(project=, config=)`, `log` of `loss`
and `acc`, a summary, `finish()`) runs from a folder outside the repository, with HOME in a temp
dir and no OBSERVATORY_RUNS, so it writes to the per-user default runs dir; `observatory ingest`,
run from yet another folder, loads it into the default store. The Live page must draw its `loss`
and `acc` charts, and so must its report on the Reports page (in a frame as tall as the report).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from browser_fixtures import CHROMIUM, CHROMIUM_ARGS, assert_no_exception, dashboard, open_page, wait_idle
from wandb_fixtures import run_as_user

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TUTORIAL = """
import math
import random

import observatory as wandb

wandb.init(project="my-first-project", config={"learning_rate": 0.02, "epochs": 10})
offset = random.random() / 5
for epoch in range(2, 40):
    acc = 1 - 2 ** -epoch - random.random() / epoch - offset
    loss = 2 ** -epoch + random.random() / epoch + offset
    wandb.log({"acc": acc, "loss": loss})
wandb.run.summary["best_acc"] = acc
wandb.finish()
"""


def _titles(scope) -> set[str]:
    """The chart and subplot titles drawn in a page or frame (plotly's, and the Live page's charts' own
    title lines, `dashboard.live_chart`)."""
    return {
        t.strip()
        for t in scope.locator(
            ".js-plotly-plot .gtitle, .js-plotly-plot .annotation-text, .obs-chart-title"
        ).all_text_contents()
    }


def test_wandb_tutorial_from_any_folder_is_drawn_on_live_and_in_its_report(tmp_path):
    home, script_dir, elsewhere = tmp_path / "home", tmp_path / "my-project", tmp_path / "elsewhere"
    script_dir.mkdir()
    elsewhere.mkdir()
    (script_dir / "train.py").write_text(TUTORIAL)
    out = run_as_user([sys.executable, "train.py"], script_dir, home)
    # what init said to run next (the venv's observatory by its absolute path when it is not on PATH)
    assert re.search(r"see it: (\S*observatory) ingest && \1 dashboard", out.stderr), out.stderr
    assert not (script_dir / "data").exists()
    (log,) = (home / ".local/share/observatory/runs").glob("*/events.0.jsonl")
    run = log.parent.name
    cli = Path(sys.executable).parent / "observatory"
    run_as_user([str(cli), "ingest", "-q"], elsewhere, home)
    db = home / ".local/share/observatory/observatory.duckdb"

    from playwright.sync_api import sync_playwright

    with dashboard(db, tmp_path / "streamlit.log") as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = open_page(browser, f"{url}/live?run={run}")
            page.locator(".js-plotly-plot").nth(1).wait_for()
            wait_idle(page)
            assert_no_exception(page, "live")
            assert page.get_by_text("No metrics logged yet").count() == 0
            assert {"loss", "acc"} <= _titles(page), _titles(page)
            assert "Last loss** —" not in page.inner_text("body")

            page = open_page(browser, f"{url}/reports?run={run}", height=900)
            frame_el = page.locator("iframe").first
            frame_el.wait_for()
            frame = page.frame_locator("iframe").first
            frame.locator(".js-plotly-plot").first.wait_for()
            wait_idle(page)
            assert_no_exception(page, "reports")
            assert {"loss", "acc"} <= _titles(frame), _titles(frame)
            # the frame is as tall as the report: the page scrolls, not a box inside it
            inner = frame.locator("body").evaluate("b => b.ownerDocument.documentElement.scrollHeight")
            assert frame_el.evaluate("f => f.getBoundingClientRect().height") >= inner - 5
            # the report's summary once on the page (inside the report), not also above it
            assert page.locator('[data-testid="stMarkdown"]', has_text="completed at step").count() == 0
        finally:
            browser.close()
