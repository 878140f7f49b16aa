"""The Live page in a real browser (Debian chromium through Playwright): it settles, and its charts can be read.

- A running run with no new data: once drawn, nothing in the chart area changes for 20 s (a
  MutationObserver counts every change: nodes, attributes such as Streamlit's `data-stale`, text).
- A growing run: the charts are redrawn with the new steps, and between redraws no chart goes
  missing or undrawn, and none is faded.
- What the loss chart promises (`recipe-b`, the second run of a recipe whose loss equals the first's):
  the previous run's line seen over the run's own, named in the legend; a decision at step 0 and a
  finding at the last step drawn whole inside the chart.
- Charts people can read: axis titles with units, a log axis's ticks written out, the raw curve faint
  behind the smoothed one, eval points over the train curve; at a phone's width (390 px) a chart
  on the first screen and plotly's toolbar clear of every chart's title.
"""

from __future__ import annotations

import time

import pytest
from browser_fixtures import LOAD_MS, ROOT, assert_no_exception, dashboard, open_page
from dashboard_fixtures import BASE_STEPS, growing_run, make_store, write_run

import observatory
from observatory.events import OBSERVATORY_HOST
from observatory.pipeline import ingest

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
    for run in ("recipe-a", "recipe-b"):
        _write_recipe(runs_dir, run)
        time.sleep(0.05)  # recipe-b starts after recipe-a: recipe-a is its previous run
    ingest(runs_dir, db, emit=None)
    return runs_dir, db


LAST = 120


def _write_recipe(runs_dir, run: str) -> None:
    """A run of the recipe `recipe` (the same name and planned steps): steps 1..LAST, the same loss each time,
    a grad norm over two decades, evals every 40 steps; `recipe-b` also gets a decision at step 0 and a
    finding at its last step, as the observatory writes them."""
    with observatory.init(
        run_id=run, name="recipe", config={"steps": 200}, runs_dir=runs_dir, install_signal_handlers=False
    ) as r:
        for s in range(1, LAST + 1):
            noise = 0.05 * ((s * 7919) % 13 - 6) / 6
            r.log({"train/loss": 2 + 3 / s**0.5 + noise, "grad/norm/total": 5.0 * 0.96**s + 0.01}, step=s)
            # per-layer z-losses: a chart with a long title ("Z-losses · worst: layer 1 (...)")
            r.log({f"router/layer_{i}/z_loss": 0.001 * (i + 1) + 1e-5 * s for i in range(2)}, step=s)
            if s % 40 == 0:
                r.event("eval", {"dataset": "val", "loss": 2.05 + 3 / s**0.5}, step=s)
    if run == "recipe-b":
        obs = observatory.init(
            run_id=run,
            runs_dir=runs_dir,
            host=OBSERVATORY_HOST,
            write_start=False,
            install_signal_handlers=False,
        )
        obs.event("decision", {"id": "D-1", "title": "start from the recipe", "status": "accepted"}, step=0)
        obs.event(
            "anomaly",
            {
                "detector": "loss_spike",
                "metric": "train/loss",
                "severity": "warn",
                "message": "at the end",
                "window": [LAST, LAST],
            },
            step=LAST,
        )
        obs.close()


@pytest.fixture(scope="module")
def server(live_store, tmp_path_factory):
    with dashboard(live_store[1], tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url


def _all_charts(page, n: int = N_CHARTS) -> None:
    page.wait_for_function(
        f"() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length > 0 && "
        f"document.querySelectorAll('.js-plotly-plot').length >= {n}",
        timeout=LOAD_MS,
    )


def test_live_page_settles_on_a_run_with_no_new_data(server, browser):
    page = open_page(browser, f"{server}/live?run=quiet-run")
    try:
        _all_charts(page)
        page.get_by_text("Last step").first.wait_for()
        assert page.get_by_text("running").count()  # shown as a running run
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


# the loss chart's traces as plotly drew them: name, index, whether its line is dashed, and its marker points'
# boxes against the plot area and the chart's own box
LOSS_JS = """() => {
  const gd = document.querySelector('.js-plotly-plot');
  const svg = gd.querySelector('.main-svg').getBoundingClientRect();
  const area = gd.querySelector('.nsewdrag').getBoundingClientRect();
  const traces = [...gd.querySelectorAll('.scatterlayer .trace')];
  const box = (r) => ({left: r.left, right: r.right, top: r.top, bottom: r.bottom});
  return {
    range: gd._fullLayout.xaxis.range,
    svg: box(svg), area: box(area),
    legend: [...gd.querySelectorAll('.legendtext')].map(e => e.textContent),
    traces: gd._fullData.map((t, i) => {
      const el = traces[i];
      const line = el && el.querySelector('.js-line');
      return {
        name: t.name, index: i, x: Array.from(t.x || []),
        dash: line ? getComputedStyle(line).strokeDasharray : null,
        points: el ? [...el.querySelectorAll('.points path')].map(p => box(p.getBoundingClientRect())) : [],
      };
    }),
  };
}"""


def _loss_chart(page) -> dict:
    _all_charts(page, 2)  # recipe-b logs the loss and the grad norm
    page.wait_for_function("() => document.querySelector('.js-plotly-plot .legendtext')", timeout=LOAD_MS)
    return page.evaluate(LOSS_JS)


def _inside(p: dict, r: dict, tol: float = 0.5) -> bool:
    return (
        p["left"] >= r["left"] - tol
        and p["right"] <= r["right"] + tol
        and p["top"] >= r["top"] - tol
        and (p["bottom"] <= r["bottom"] + tol)
    )


def test_live_loss_chart_shows_the_previous_run_step_0_and_the_last_step(server, browser):
    page = open_page(browser, f"{server}/live?run=recipe-b")
    try:
        c = _loss_chart(page)
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "live-recipe.png"), full_page=True)
        assert_no_exception(page, "live recipe")
    finally:
        page.close()
    by = {t["name"]: t for t in c["traces"]}
    prev = next(t for n, t in by.items() if n and n.startswith("previous run recipe-a"))
    own = by["train/loss"]
    # the previous run: named in the legend for what it is, dashed, drawn over the run's own (equal) line
    assert any("previous run recipe-a" in x and "same name and steps" in x for x in c["legend"]), c["legend"]
    assert prev["index"] > own["index"] and prev["dash"] not in (None, "", "none"), prev
    # the decision at step 0 (the first logged step is 1): inside the range, its star drawn inside the chart
    dec = next(t for n, t in by.items() if n == "decision")
    assert dec["x"] == [0] and c["range"][0] < 0 < c["range"][1]
    assert dec["points"] and _inside(dec["points"][0], c["svg"]), (dec, c["svg"])
    # the finding at the last step: its marker whole, inside the plot area
    (fnd,) = [t for n, t in by.items() if n and n.startswith("finding")]
    assert fnd["x"] == [LAST] and c["range"][1] > LAST
    assert fnd["points"] and _inside(fnd["points"][0], c["area"]), (fnd, c["area"])


READ_JS = """() => [...document.querySelectorAll('.obs-chart, [data-testid="stPlotlyChart"]')].map(ch => {
  const gd = ch.querySelector('.js-plotly-plot');
  const title = ch.querySelector('.obs-chart-title') || gd.querySelector('.gtitle');
  const mb = gd.querySelector('.modebar');
  const box = (e) => { if (!e) return null; const r = e.getBoundingClientRect(); return {left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
  return {
    title: title ? title.textContent : '', titleBox: box(title), modebar: box(mb),
    plotTop: box(gd).top,
    xtitle: (gd.querySelector('.xtitle') || {}).textContent || '',
    ytitle: (gd.querySelector('.ytitle') || {}).textContent || '',
    ylog: gd._fullLayout.yaxis.type === 'log',
    yticks: [...gd.querySelectorAll('.ytick text')].map(t => [t.getBoundingClientRect().top, t.textContent]),
    traces: gd._fullData.map(t => ({name: t.name, opacity: t.line && t.line.color, size: t.marker && t.marker.size,
                                     mode: t.mode})),
  };
})"""


def _overlap(a: dict | None, b: dict | None) -> bool:
    if not a or not b:
        return False
    return (
        a["left"] < b["right"]
        and b["left"] < a["right"]
        and a["top"] < b["bottom"]
        and b["top"] < a["bottom"]
    )


def test_live_charts_can_be_read(server, browser):
    page = open_page(browser, f"{server}/live?run=recipe-b")
    try:
        _all_charts(page, 2)
        time.sleep(3)
        charts = page.evaluate(READ_JS)
    finally:
        page.close()
    loss = charts[0]
    assert loss["xtitle"] == "step" and "nats" in loss["ytitle"], loss
    grad = next(c for c in charts if c["title"].startswith("Grad norm"))
    assert grad["ylog"] and "norm" in grad["ytitle"]
    # a log axis's ticks written out: every label a number, increasing up the axis (not "5, 2, 10, 5, 2, 1")
    ticks = [float(t) for _, t in sorted(grad["yticks"], reverse=True)]
    assert len(ticks) >= 3 and ticks == sorted(set(ticks)), grad["yticks"]
    # smoothing on by default, the raw curve faint behind it; eval points after (over) the train lines
    names = [t["name"] for t in loss["traces"]]
    assert names.index("train/loss (raw)") < names.index("train/loss") < names.index("eval val")
    ev = loss["traces"][names.index("eval val")]
    assert "markers" in ev["mode"] and ev["size"] >= 8


def test_live_page_at_a_phone_width(server, browser):
    page = browser.new_page(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    page.set_default_timeout(LOAD_MS)
    try:
        page.goto(f"{server}/live?run=recipe-b")
        _all_charts(page, 2)
        time.sleep(3)
        top = page.evaluate("() => document.querySelector('.js-plotly-plot').getBoundingClientRect().top")
        page.screenshot(path=str(ARTIFACTS / "live-phone.png"))
        for i in range(page.locator(".js-plotly-plot").count()):  # each toolbar shows on hover
            page.locator(".js-plotly-plot").nth(i).hover(position={"x": 60, "y": 60})
        charts = page.evaluate(READ_JS)
        assert_no_exception(page, "live phone")
    finally:
        page.close()
    assert top < 844 / 2, f"the first chart starts {top:.0f} px down a 844 px screen"
    covered = [c["title"] for c in charts if _overlap(c["titleBox"], c["modebar"])]
    assert not covered, f"plotly's toolbar covers the titles of {covered}"
