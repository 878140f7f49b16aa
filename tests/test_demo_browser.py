"""`make demo`'s sequence in a temp dir, seen in a real headless chromium.

`python -m observatory.demo` seeds the sample ladder, ingests it and starts the trainer,
the follower and the dashboard; the Decisions page must list the sample's decision
history, and a finished demo run must be followed by the next one.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest
from browser_fixtures import LOAD_MS, chromium, free_port, start_demo, wait_healthy
from polling import wait_until

pytestmark = [pytest.mark.browser, pytest.mark.slow]

TITLES = (
    "Learning rate 0.009*24/d (1/width) instead of 0.009*(24/d)^0.25",
    "12 seeds per rung instead of 4",
    "FIT_VERSION 4: widen the band by the forward error, not the largest leave-one-out error",
    "First target ladder-cpu-d72 (3.9x the largest rung's compute) against its pre-registered forecast",
    "24 seeds per rung and a second target (seed 1), forecast from all 96 rung runs",
)


def test_demo_shows_the_sample_decisions_and_keeps_training(tmp_path):
    runs, port = tmp_path / "runs", free_port()
    proc, log = start_demo(tmp_path, port, OBSERVATORY_CACHE_TTL_S="1")
    try:
        wait_healthy(proc, port, log, 240, "the demo")
        with chromium() as b:
            page = b.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(LOAD_MS)
            page.goto(f"http://127.0.0.1:{port}/decisions")
            page.get_by_role("heading", name="Decisions").first.wait_for()
            assert page.get_by_text("No decisions yet").count() == 0
            grid = page.locator('[data-testid="stDataFrame"]').first
            grid.wait_for()
            # the grid draws on a canvas; its cells are also in an accessible table
            for title in TITLES:
                grid.get_by_text(title, exact=True).first.wait_for(state="attached")
            assert page.locator('[data-testid="stException"]').count() == 0
        # a 20-step demo run ends soon; the demo then starts the next one
        wait_until(
            lambda: len(list(runs.glob("demo-*/events.0.jsonl"))) >= 2,
            300,
            every=2,
            what=lambda: "a second demo run: " + log.read_text()[-3000:],
        )
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]
