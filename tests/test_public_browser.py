"""Text from logs stays inert in a real browser, and secrets stay hidden there too.

A run whose name, tags, notes, config values, failure messages and decision texts are
script payloads (`PAYLOADS`: `<script>`, `onerror=`, `javascript:` and `data:` links and
images, SVG payloads, entities that decode into tags, Streamlit's own Markdown syntax).
Each page that shows them (Runs, Live with notes and failures as markers, Compare's config
diff, Decisions, Reports) and the HTML report open in Debian chromium with a dialog
listener: no dialog fires, no payload becomes a script element, an event-handler attribute
or a javascript:/data: link. The foreign run of `public_secrets` is in the same store: its
needles appear in no page.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from browser_fixtures import LOAD_MS, dashboard, wait_idle
from conftest import event
from public_secrets import RUN as SECRET_RUN
from public_secrets import leaks, write_foreign_run

from observatory import report
from observatory.pipeline import ingest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

PAYLOADS = [
    "<script>alert('p1')</script>",
    "<img src=x onerror=alert('p2')>",
    "[click me](javascript:alert('p3'))",
    "<a href=\"javascript:alert('p4')\">link</a>",
    "![svg](data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoJ3A1Jyk+PC9zdmc+)",
    "[html](data:text/html,<script>alert('p6')</script>)",
    "<svg onload=alert('p7')><script>alert('p8')</script></svg>",
    "&lt;img src=x onerror=alert('p9')&gt; &#60;script&#62;alert('p10')&#60;/script&#62;",
    "<iframe src=\"javascript:alert('p11')\"></iframe>",
    ":red[<b onmouseover=alert('p12')>hover</b>] $\\href{javascript:alert('p13')}{x}$",
    "<details open ontoggle=alert('p14')>",
    "[x](&#106;avascript:alert('p15')) [y](JaVaScRiPt:alert('p16'))",
]
XSS, XSS2, DEC = "xss-run", "xss-run-2", "xss-decision"
T0 = 1.7e9


def _write(runs: Path, run: str, config: dict, extra: list[tuple[str, dict, int]]) -> None:
    lines, seq = [], 0

    def put(kind, data, step=None):
        nonlocal seq
        lines.append(json.dumps(event(run, kind, data, seq, step, t=T0)))
        seq += 1

    put(
        "run_start",
        {"config": config, "name": " ".join(PAYLOADS[:4]), "tags": PAYLOADS[4:8], "notes": PAYLOADS[8]},
    )
    for step in range(30):
        put("metrics", {"train/loss": 3.0 - 0.05 * step, "grad/norm/total": 1.0}, step)
        if step in {s for _, _, s in extra}:
            for kind, data, s in extra:
                if s == step:
                    put(kind, data, step)
    put("run_end", {"status": "failed", "final_step": 29}, 29)
    (runs / run).mkdir(parents=True, exist_ok=True)
    (runs / run / "events.0.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def xss_store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("xss")
    runs, db = tmp / "runs", tmp / "store.duckdb"
    events = [("note", {"text": p}, 3 + i) for i, p in enumerate(PAYLOADS)]
    events += [("failure", {"type": "exception", "message": p, "traceback": p}, 20) for p in PAYLOADS[:3]]
    events.append(
        (
            "decision",
            {
                "id": DEC,
                "title": PAYLOADS[0] + PAYLOADS[2],
                "kind": "intervention",
                "status": "running",
                "hypothesis": "\n\n".join(PAYLOADS),
                "runs": [{"run": XSS, "step": 10}],
            },
            10,
        )
    )
    _write(runs, XSS, {f"k{i}": p for i, p in enumerate(PAYLOADS)} | {"lr": 1e-3}, events)
    _write(runs, XSS2, {f"k{i}": p[::-1] for i, p in enumerate(PAYLOADS)} | {"lr": 2e-3}, [])
    write_foreign_run(runs)
    ingest(runs, db, emit=None)
    return runs, db


@pytest.fixture(scope="module")
def server(xss_store, tmp_path_factory):
    with dashboard(xss_store[1], tmp_path_factory.mktemp("log") / "streamlit.log") as url:
        yield url


# what a payload would leave behind if it were live: a script with our alert in it, an element with
# an inline event handler, a javascript:/vbscript:/data: URL in a link, image, frame or form
INJECTED_JS = """() => {
  const bad = [];
  // a payload's own script element (plotly's figure JSON quotes the payloads, escaped as \\u003c: data)
  for (const s of document.querySelectorAll('script')) if (/^\\s*alert\\('p/.test(s.textContent || '')) bad.push('script');
  const walk = (root) => {
    for (const el of root.querySelectorAll('*')) {
      for (const a of el.attributes) {
        const v = (a.value || '').trim().toLowerCase();
        if (a.name.startsWith('on') && v.includes('alert')) bad.push(el.tagName + '[' + a.name + ']');
        const url = v.replace(/\\s/g, '');
        if (!['href', 'src', 'xlink:href', 'action', 'formaction', 'data'].includes(a.name)) continue;
        // javascript:/vbscript: anywhere; data: in a link or frame, or carrying one of our payloads
        // (the favicon Streamlit makes of the page icon is a data: SVG of its own)
        if (/^(javascript|vbscript):/.test(url) ||
            (url.startsWith('data:') && (['A', 'IFRAME', 'OBJECT', 'EMBED', 'FORM'].includes(el.tagName) ||
                                          url.includes('alert') || url.includes('phn2zybvbmxvywq9'))))
          bad.push(el.tagName + '[' + a.name + '=' + v.slice(0, 30) + ']');
      }
      if (el.tagName === 'IFRAME') { try { if (el.contentDocument) walk(el.contentDocument); } catch (e) {} }
    }
  };
  walk(document);
  return bad;
}"""


def _check(page, dialogs: list, scripts_before: int, what: str) -> None:
    # hover over every chart, so plotly draws the markers' hover labels (notes, failures)
    for chart in page.locator(".js-plotly-plot").all()[:6]:
        box = chart.bounding_box()
        if box:
            for f in (0.2, 0.4, 0.6, 0.8):
                page.mouse.move(box["x"] + box["width"] * f, box["y"] + box["height"] * 0.5)
                time.sleep(0.05)
    time.sleep(1.0)
    assert dialogs == [], f"{what}: a payload ran: {dialogs}"
    assert page.evaluate(INJECTED_JS) == [], what
    inline = page.evaluate("() => [...document.querySelectorAll('script:not([src])')].length")
    assert inline <= scripts_before, f"{what}: inline scripts {scripts_before} -> {inline}"
    assert leaks(page.content()) == [], f"{what}: a secret is on the page"


@pytest.mark.parametrize(
    "path, wait_text",
    [
        ("runs", "runs"),
        (f"live?run={XSS}", "Last step"),
        (f"compare?runs={XSS},{XSS2}", "Config diff"),
        (f"decisions?decision={DEC}", "Hypothesis"),
        (f"reports?run={XSS}", "Post-mortem"),
        (f"live?run={SECRET_RUN}", "were redacted"),
        (f"compare?runs={SECRET_RUN},{XSS}", "Config diff"),
    ],
)
def test_payloads_stay_text_on_every_page(server, browser, path, wait_text):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.set_default_timeout(LOAD_MS)
        page.goto(f"{server}/{path}")
        page.wait_for_selector('[data-testid="stApp"]')
        before = page.evaluate("() => [...document.querySelectorAll('script:not([src])')].length")
        wait_idle(page)
        page.get_by_text(wait_text).first.wait_for()
        if "compare" in path:
            page.get_by_role("tab", name="Config diff").click()
            page.get_by_text("keys differ").first.wait_for()
        wait_idle(page)
        _check(page, dialogs, before, path)
    finally:
        page.close()


def test_html_report_stays_inert(xss_store, browser, tmp_path):
    _, db = xss_store
    path = report.write(db, XSS, tmp_path, "html")
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    try:
        page.goto(path.as_uri())
        page.wait_for_selector(".js-plotly-plot")
        before = page.evaluate("() => [...document.querySelectorAll('script:not([src])')].length")
        text = page.inner_text("body")
        assert "<script>alert('p1')</script>" in text  # shown, as text
        _check(page, dialogs, before, "html report")
    finally:
        page.close()
