"""The page tour of docs/dashboard.md: every page over a demo-like store (the committed samples, a healthy
8-host run with heartbeats), in a real browser at 1,400 px and at 390 px. Each page opens without an
exception; every chart on it has data and a title on each of its axes. The screenshots land in
`OBSERVATORY_TOUR_DIR` (docs/tour to update the docs' tour) or the test's temp dir.

    OBSERVATORY_TOUR_DIR=docs/tour .venv/bin/python -m pytest tests/test_tour_browser.py
"""

from __future__ import annotations

import io
import os
import time
from pathlib import Path

import pytest
from browser_fixtures import LOAD_MS, assert_no_exception, dashboard, wait_idle

from observatory.demo import SWEEPS_QUERY, seed_samples
from observatory.interop.simulate_ops import simulate_ops
from observatory.pipeline import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

# (file name, path, charts at least)
TOUR = (
    ("runs", "", 0),
    ("live", "live?run=demo-sample", 7),
    ("experts", "experts?run=demo-sample", 4),
    ("health", "health?run=ops-healthy", 2),
    ("compare", "compare?runs=ladder-cpu-d72,ladder-cpu-d72-s1", 1),
    # the samples' iso-FLOP grid (data/samples/sweep-isoflop*), as `make demo` links it, on its Iso-FLOP view
    ("sweeps", f"sweeps?{SWEEPS_QUERY}&view=Iso-FLOP", 1),
    ("decisions", "decisions", 0),
    ("ladder", "ladder?ladder=ladder-cpu", 3),
    ("reports", "reports?run=demo-sample", 3),
    ("sql", "sql", 0),
)
WIDTHS = ((1400, 900), (390, 844))
FULL_PAGE = {"sweeps"}  # pages shot whole
TALL_JS = """() => Math.max(0, ...Array.from(document.querySelectorAll(
  '[data-testid="stMain"], [data-testid="stAppViewContainer"], [data-testid="stMainBlockContainer"]'))
  .map(e => e.scrollHeight))"""

# every plotly chart of the page (and of its frames): its title, its axes without a title, its points
CHARTS_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const L = gd._fullLayout || {};
  const axes = Object.keys(L).filter(k => /^[xy]axis\\d*$/.test(k) && L[k] && L[k].visible !== false);
  // the traces as drawn (plotly decodes the typed arrays a figure is sent as): their point counts
  const size = t => t.visible === false ? 0 : (t._length || ['x', 'y', 'z'].reduce((n, k) => Math.max(n, (t[k] && t[k].length) || 0), 0));
  return {
    title: (((gd.layout || {}).title || {}).text || (gd.layout || {}).title || '').toString().slice(0, 80),
    // the figure's own axis titles (the drawn layout's are plotly's "Click to enter ..." placeholders)
    // an axis shared with a titled one (`matches`: stacked rows with one step axis) counts as titled
    untitled: axes.filter(k => {
      const titled = a => {
        const t = ((gd.layout || {})[a] || {}).title;
        return !!((typeof t === 'string' ? t : (t || {}).text) || '').trim();
      };
      const m = ((gd.layout || {})[k] || {}).matches;
      return !titled(k) && !(m && titled(m[0] + 'axis' + m.slice(1)));
    }),
    points: (gd._fullData || []).reduce((n, t) => n + size(t), 0),
  };
})"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tour")
    runs, db = tmp / "runs", tmp / "obs.duckdb"
    seed_samples(runs)
    simulate_ops("healthy", runs, hosts=8, steps=3000, run_id="ops-healthy", end_t=time.time())
    ingest(runs, db, emit=None)
    with dashboard(db, tmp / "streamlit.log") as url:
        yield url


def _charts(page) -> list[dict]:
    return [c for f in page.frames for c in f.evaluate(CHARTS_JS)]


def _save(png: bytes, path: Path) -> None:
    """A small PNG: the screenshot in a 64-colour palette (the tour stays well under 2 MB)."""
    from PIL import Image

    img = Image.open(io.BytesIO(png)).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT)
    img.save(path, optimize=True)


@pytest.mark.parametrize(("name", "path", "least"), TOUR, ids=[t[0] for t in TOUR])
def test_the_tour(server, browser, tmp_path, name, path, least):
    out = Path(os.environ.get("OBSERVATORY_TOUR_DIR") or tmp_path)
    out.mkdir(parents=True, exist_ok=True)
    for width, height in WIDTHS:
        page = browser.new_page(viewport={"width": width, "height": height})
        page.set_default_timeout(LOAD_MS)
        try:
            page.goto(f"{server}/{path}")
            page.wait_for_selector('[data-testid="stApp"]')
            page.locator("h1").first.wait_for()  # the page has run (not the blank app before its script)
            wait_idle(page)
            deadline = time.time() + LOAD_MS / 1000
            while len(_charts(page)) < least and time.time() < deadline:
                time.sleep(0.5)
            time.sleep(1.5)  # the charts' own drawing after the script ends
            assert_no_exception(page, f"{name} at {width} px")
            charts = _charts(page)
            assert len(charts) >= least, (name, width, charts)
            for c in charts:
                assert c["points"] > 0, f"{name} at {width} px: an empty chart {c['title']!r}"
                assert not c["untitled"], (
                    f"{name} at {width} px: {c['title']!r} has axes {c['untitled']} untitled"
                )
            if name in FULL_PAGE:  # its chart sits below the first screen: a viewport as tall as the page
                # (the app scrolls inside its main block, so a full-page screenshot is the viewport)
                tall = page.evaluate(TALL_JS)
                page.set_viewport_size({"width": width, "height": min(max(tall, height), 3000)})
                time.sleep(1.5)  # the charts' own drawing at the new size
            _save(page.screenshot(), out / f"{name}-{width}.png")
        finally:
            page.close()
