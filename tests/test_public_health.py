"""The Health page's doors (issue 55): many telemetry names, hostile names, a hostile `?host=`, alert text.

A host that sends 5,000 telemetry names (the red team sent 90k) costs a bounded view: the measure picker
lists `MAX_NAMES_LISTED`, one host's chart draws `MAX_NAMES_DRAWN`, each with a note saying how many there
are. A name with HTML is plotly text, not markup; `?host=²` is ignored with a note, not a ValueError.
"""

from __future__ import annotations

import json
import time

import pytest
from conftest import event, write_lines
from streamlit.testing.v1 import AppTest

from observatory.pipeline import ingest
from observatory.queries import health as qh
from observatory.store import using

N_NAMES = 5000
HOSTILE = "<a href='https://evil.example'>x</a><img src='https://evil.example/i.png'>"


@pytest.fixture
def store(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    t0 = time.time() - 100
    evs = [event("pod", "run_start", {"config": {}}, 0, step=0, t=t0)]
    for k in range(3):
        data = {"phase": "train", "step": k, "system/cpu_percent": 40.0, f"x/{HOSTILE}": 1.0}
        data.update({f"junk/{i:05d}": float(i) for i in range(N_NAMES)})
        evs.append(event("pod", "heartbeat", data, k + 1, step=k, t=t0 + 10 * k))
    write_lines(runs / "pod" / "events.0.jsonl", evs)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    ingest(runs, db, emit=None)
    return db


def test_many_telemetry_names_are_listed_and_drawn_bounded(store):
    """Fails before the fix: every one of the 5,002 names was listed and drawn."""
    with using(store) as con:
        view = qh.health_view(con, "pod", qh.STEP_TIME, 20)
        one = qh.host_series(con, "pod", 0)
        total = qh.host_names_total(con, "pod", 0)
    assert len(view["names"]) == qh.MAX_NAMES_LISTED + 1 and view["names_total"] == N_NAMES + 2
    assert view["names"][1] == "system/cpu_percent"  # the summary names first
    assert len(one) == qh.MAX_NAMES_DRAWN and "system/cpu_percent" in one and total == N_NAMES + 2


@pytest.mark.slow  # (several seconds: an ingest with its analyses, a page under AppTest)
def test_the_page_says_what_it_left_out_escapes_names_and_ignores_a_bad_host(store):
    at = AppTest.from_string(
        "from observatory.dashboard.pages import health\nhealth.render()\n", default_timeout=60
    )
    at.query_params["run"] = "pod"
    at.query_params["host"] = "²"  # a digit to str.isdigit, not to int()
    at.run()
    assert not at.exception, at.exception
    captions = " ".join(c.value for c in at.caption)
    assert "ignored" in captions and f"of {N_NAMES + 2:,} telemetry names are listed" in captions
    assert f"sent {N_NAMES + 2:,} telemetry names; the first {qh.MAX_NAMES_DRAWN} are drawn" in captions
    for c in at.get("plotly_chart"):
        spec = c.proto.spec
        assert "<a href" not in spec and "<img" not in spec, spec[:300]


def test_health_alert_boxes_render_no_markdown_from_a_log():
    """Fails before the fix: an alert's message (a metric name) was rendered as Markdown: an image fetched."""
    from observatory.markup import md_escape

    msg = "loss_spike on ![x](https://evil.example/i.png) [reset](https://evil.example) <b>x</b>"
    at = AppTest.from_string(
        "import streamlit as st\nfrom observatory.dashboard.pages.health import _alert_box\n"
        f"_alert_box({{'rule': 'findings', 'severity': 'critical', 'message': {msg!r}}})\n",
        default_timeout=30,
    )
    at.run()
    assert not at.exception, at.exception
    (box,) = at.error
    assert box.value == md_escape(f"findings: {msg}")
    assert json.dumps(box.value).count("](") == 0
