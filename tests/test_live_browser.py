"""The Live page in a real browser (Debian chromium through Playwright): it settles, and its charts can be read.

- A running run with no new data: once drawn, nothing in the chart area changes for 20 s (a
  MutationObserver counts every change: nodes, attributes such as Streamlit's `data-stale`, text).
- A growing run: the charts are redrawn with the new steps, and between redraws no chart goes
  missing or undrawn, and none is faded.
"""

from __future__ import annotations

import time

import pytest
from browser_fixtures import LOAD_MS, ROOT, assert_no_exception, dashboard, open_page
from dashboard_fixtures import BASE_STEPS, growing_run, make_store, write_run

from observatory.ingest import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

ARTIFACTS = ROOT / "artifacts" / "browser"
N_CHARTS = 7  # the loss and six health charts

# Every DOM change of a chart: inside its subtree, on its element container (Streamlit marks a container
# stale with an attribute while a rerun has not re-sent it), or a chart added or removed.
OBSERVE_JS = """() => {
  window.__changes = [];
  const CHART = '[data-testid="stPlotlyChart"], .obs-chart';
  const holds = (n) => n.nodeType === 1 && (n.matches(CHART) || !!n.querySelector(CHART));
  const counts = (r) => {
    const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    if (el && el.closest(CHART)) return true;  // inside a chart
    if (r.type === 'attributes') return el.matches('[data-testid="stElementContainer"]') && holds(el);  // its box
    return [...r.addedNodes, ...r.removedNodes].some(holds);  // a chart added or removed
  };
  new MutationObserver((records) => {
    for (const r of records) if (counts(r)) window.__changes.push(r.type + ' ' + (r.attributeName || ''));
  }).observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true});
}"""

# Samples, every animation frame: the number of charts drawn and visible, whether one is faded
SAMPLE_JS = """() => {
  const o = window.__samples = {min: 1e9, max: 0, n: 0, faded: 0, log: []};
  let prev = '';
  function tick() {
    const charts = [...document.querySelectorAll('[data-testid="stPlotlyChart"], .obs-chart')];
    let drawn = 0;
    for (const c of charts) {
      const plot = c.querySelector('.js-plotly-plot');
      if (plot && plot.querySelector('.scatterlayer .trace') && getComputedStyle(plot).visibility !== 'hidden') drawn++;
      const box = c.closest('[data-testid="stElementContainer"]');
      if (box && parseFloat(getComputedStyle(box).opacity) < 0.99) o.faded++;
    }
    const key = charts.length + '/' + drawn;
    if (key !== prev) { o.log.push([Math.round(performance.now()), key]); prev = key; }
    o.min = Math.min(o.min, drawn); o.max = Math.max(o.max, drawn); o.n++;
    requestAnimationFrame(tick);
  }
  requestAnimationFrame(tick);
}"""

LAST_X_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  let m = -Infinity;
  for (const t of gd._fullData) if (t.visible === true && t.x) for (const v of t.x) if (v > m) m = v;
  return m;
}"""


@pytest.fixture(scope="module")
def live_store(tmp_path_factory):
    """The fixture store, plus `quiet-run`: running (no run_end, its events just written), then nothing new."""
    runs_dir, db = make_store(tmp_path_factory.mktemp("live"))
    write_run(runs_dir, "quiet-run", range(BASE_STEPS), finish=False)
    ingest(runs_dir, db, emit=None)
    return runs_dir, db


@pytest.fixture(scope="module")
def server(live_store, tmp_path_factory):
    with dashboard(live_store[1], tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url


def _all_charts(page) -> None:
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length > 0 && "
        f"document.querySelectorAll('.js-plotly-plot').length >= {N_CHARTS}",
        timeout=LOAD_MS,
    )


def test_live_page_settles_on_a_run_with_no_new_data(server, browser):
    page = open_page(browser, f"{server}/live?run=quiet-run")
    try:
        _all_charts(page)
        page.get_by_text("Live: the charts are redrawn").first.wait_for()  # shown as a running run
        time.sleep(5)  # the first view's second pass (controls, health charts) is in
        page.evaluate(OBSERVE_JS)
        time.sleep(20)
        changes = page.evaluate("() => window.__changes")
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "live-quiet.png"), full_page=True)
        assert_no_exception(page, "live quiet")
        assert changes == [], f"{len(changes)} DOM changes in the chart area in 20 s: {changes[:10]}"
        assert page.locator(".js-plotly-plot").count() >= N_CHARTS
    finally:
        page.close()


def test_live_page_redraws_a_growing_run_without_losing_a_chart(server, browser, live_store):
    with growing_run(*live_store, "grow-run"):
        page = open_page(browser, f"{server}/live?run=grow-run")
        try:
            _all_charts(page)
            time.sleep(5)
            first = page.evaluate(LAST_X_JS)
            page.evaluate(SAMPLE_JS)
            time.sleep(20)
            s = page.evaluate("() => window.__samples")
            last = page.evaluate(LAST_X_JS)
            assert_no_exception(page, "live growing")
        finally:
            page.close()
    assert last > first, f"the loss chart was not redrawn with the new steps ({first} -> {last})"
    assert s["n"] > 100, s  # sampled all along
    assert s["min"] >= N_CHARTS, f"a chart went missing or undrawn between redraws: {s}"
    assert s["faded"] == 0, f"charts were faded in {s['faded']} samples of {s['n']}"
