"""An alert episode has hysteresis: a busy machine's MFU whose median hovers at the `mfu_drop` limit is one
episode, opened once and resolved once when the MFU is back, not an alert that opens and resolves again
and again (the demo run's 14 markers)."""

from __future__ import annotations

import json
import time

import duckdb
import pytest
from conftest import event, write_lines
from dashboard_fixtures import chart_specs, page

from observatory.pipeline import ingest


def _states(db) -> list[tuple[str, str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT data FROM events WHERE kind = 'alert' ORDER BY t, seq").fetchall()
    return [(json.loads(d)["rule"], json.loads(d)["state"]) for (d,) in rows]


@pytest.mark.slow  # 34 ingest passes (20 s)
def test_an_mfu_hovering_at_the_limit_is_one_episode(runs_dir, db_path, monkeypatch, tmp_path):
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(tmp_path / "none.yaml"))  # the default rules
    log = runs_dir / "busy" / "events.0.jsonl"
    t = time.time() - 60
    write_lines(log, [event("busy", "run_start", {"config": {}}, 0, step=0, t=t)])
    # 2,000 steps at its level, then the median of 200 steps goes 78%, 85%, 78%, 85%, ... of it (a busy
    # machine: below the 80% limit, back above it, below again), ingested every 100 steps
    level = [0.4] * 2000 + ([0.312] * 200 + [0.34] * 200) * 2 + [0.4] * 400
    for lo in range(0, len(level), 100):
        chunk = range(lo, min(lo + 100, len(level)))
        evs = [
            event("busy", "metrics", {"train/loss": 3.0, "throughput/mfu": level[s]}, s + 1, step=s + 1, t=t)
            for s in chunk
        ]
        write_lines(log, evs)
        ingest(runs_dir, db_path, emit=None)
    mfu = [s for r, s in _states(db_path) if r == "mfu_drop"]
    assert mfu == ["open", "resolved"], mfu
    # on the Live page an info alert is small, open and grey, not in the alarm colours of a warning
    monkeypatch.setenv("OBSERVATORY_DB", str(db_path))
    at = page("live", run="busy")
    assert not at.exception, at.exception
    traces = [
        t for spec in chart_specs(at) for t in spec["data"] if str(t.get("name", "")).startswith("alert")
    ]
    assert traces and {t["name"] for t in traces} == {"alert: info"}
    assert all(t["marker"]["color"] == "#8c8c8c" and t["marker"]["symbol"].endswith("-open") for t in traces)
