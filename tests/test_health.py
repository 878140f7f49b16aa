"""The Health page under AppTest, over a store the real ingester built from heartbeats of many hosts."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from conftest import event, write_lines
from streamlit.testing.v1 import AppTest

from observatory.pipeline import ingest
from observatory.queries import health as qh
from observatory.store import using

HOSTS = 12


@pytest.fixture
def store(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    now = time.time()
    t0 = now - 600
    for h in range(HOSTS):
        evs = [event("pod", "run_start", {"config": {}}, 0, step=0, t=t0, host=h)] if h == 0 else []
        last = 30 if h == 7 else 60  # host 7 froze halfway
        for k in range(last):
            t = t0 + 10 * k
            # host 3 is slow: each of its steps takes twice as long; host 5's RSS creeps up
            step = k // 2 if h == 3 else k
            evs.append(
                event(
                    "pod",
                    "heartbeat",
                    {
                        "phase": "train",
                        "step": step,
                        "system/cpu_percent": 40.0 + h,
                        "system/rss_bytes": 1e9 * (1 + (k / 10 if h == 5 else 0)),
                    },
                    k + 1,
                    step=step,
                    t=t,
                    host=h,
                )
            )
            if h == 0:
                evs.append(event("pod", "metrics", {"train/loss": 3.0}, 1000 + k, step=k, t=t, host=0))
        for e in evs:
            e["t"] = float(e["t"]) - (e["seq"] * 0.01)  # exact times (conftest's event adds seq * 0.01)
        write_lines(runs / "pod" / f"events.{h}.jsonl", sorted(evs, key=lambda e: e["seq"]))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(tmp_path / "none.yaml"))
    ingest(runs, db, emit=None)
    return db


def test_the_health_view_reads_every_host_and_its_own_step_time(store):
    with using(store) as con:
        view = qh.health_view(con, "pod", qh.STEP_TIME, 20)
        rss = qh.health_view(con, "pod", "system/rss_bytes", 20)["matrix"]["z"]
        one = qh.host_series(con, "pod", 5)
    assert view["hosts"]["host"] == list(range(HOSTS)) and view["names"][0] == qh.STEP_TIME
    assert {"system/cpu_percent", "system/rss_bytes"} <= set(view["names"])
    z = view["matrix"]["z"]
    assert z.shape == (HOSTS, 20)
    per_host = np.nanmedian(z, axis=1)
    assert per_host[3] == pytest.approx(2 * np.nanmedian(per_host[[0, 1, 2, 4]]), rel=0.05)  # the slow host
    assert np.isnan(z[7, -5:]).all() and not np.isnan(z[6, -5:]).any()  # the frozen host's row ends
    assert rss[5, -1] > 5 * rss[5, 0] and rss[4, -1] == pytest.approx(rss[4, 0])
    assert set(one) == {"system/cpu_percent", "system/rss_bytes"} and len(one["system/rss_bytes"]["t"]) == 60


def test_the_health_page_draws_the_hosts_and_one_host(store):
    at = AppTest.from_string(
        "from observatory.dashboard.pages import health\nhealth.render()\n", default_timeout=60
    )
    at.query_params["run"] = "pod"
    at.query_params["host"] = "7"
    at.run()
    assert not at.exception, at.exception
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    heat = next(s for s in specs if s["data"][0]["type"] == "heatmap")
    assert heat["data"][0]["y"] == [str(h) for h in range(HOSTS)]
    assert any(s["layout"]["title"]["text"] == "Host 7: telemetry over time" for s in specs)
    df = at.dataframe[0].value
    assert int(df["host"].iloc[0]) == 7  # the silent host first
    assert any("Goodput" in m.value for m in at.markdown)
    at.selectbox(key="health_name").set_value("system/rss_bytes").run()
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert any(s["layout"]["title"]["text"] == "system/rss_bytes, every host" for s in specs)
