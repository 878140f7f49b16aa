"""The Health page under AppTest, over a store the real ingester built from heartbeats of many hosts."""

from __future__ import annotations

import base64
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
    assert any(s["layout"]["title"]["text"] == "Host 7: telemetry in GB" for s in specs)
    df = at.dataframe[0].value
    assert int(df["host"].iloc[0]) == 7  # the silent host first
    assert any("Goodput" in m.value for m in at.markdown)
    at.selectbox(key="health_name").set_value("system/rss_bytes").run()
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    assert any(s["layout"]["title"]["text"] == "system/rss_bytes (GB), every host" for s in specs)


def _array(v) -> np.ndarray:
    """A figure's array as the browser gets it: a list, or plotly's typed array (dtype and base64 bytes)."""
    if isinstance(v, dict):
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
    return np.asarray(v)


def _beats(runs, run, hosts, minutes, every_s=30.0, step_s=1.0, start=None):
    """`hosts` processes that beat every `every_s` for `minutes`, one step each `step_s`, with telemetry."""
    t0 = (start if start is not None else time.time() - minutes * 60) - 0.5
    n = int(minutes * 60 / every_s) + 1
    for h in range(hosts):
        evs = [event(run, "run_start", {"config": {}}, 0, step=0, t=t0, host=h)] if h == 0 else []
        for k in range(n):
            t = t0 + every_s * k + 0.1 * h
            step = int(every_s * k / step_s)
            data = {
                "phase": "train",
                "step": step,
                "system/cpu_percent": 90.0,
                "system/rss_bytes": 924995584.0,
            }
            evs.append(event(run, "heartbeat", data, k + 1, step=step, t=t, host=h))
        write_lines(runs / run / f"events.{h}.jsonl", evs)


@pytest.mark.parametrize(("hosts", "minutes"), [(1, 8.5), (8, 100)])
def test_the_step_time_heatmap_is_filled_across_the_whole_run(tmp_path, monkeypatch, hosts, minutes):
    """The demo's 8.5-minute run and 8 hosts over 100 minutes, heartbeats every 30 s: the page's default
    batch (200 columns asked) draws every host in (nearly) every column, over the run's whole span."""
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    _beats(runs, "r", hosts, minutes)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    ingest(runs, db, emit=None)
    with using(db) as con:
        m = qh.health_view(con, "r", qh.STEP_TIME)["matrix"]
    assert np.isfinite(m["z"]).mean() > 0.9, np.isfinite(m["z"]).mean()
    assert np.nanmedian(m["z"]) == pytest.approx(1.0, rel=0.05)  # one step a second
    at = AppTest.from_string(
        "from observatory.dashboard.pages import health\nhealth.render()\n", default_timeout=60
    )
    at.query_params["run"] = "r"
    at.run()
    assert not at.exception, at.exception
    heat = next(
        json.loads(c.proto.spec)
        for c in at.get("plotly_chart")
        if json.loads(c.proto.spec)["data"][0]["type"] == "heatmap"
    )
    x = _array(heat["data"][0]["x"])
    lo, hi = heat["layout"]["xaxis"]["range"]
    assert lo == 0 and hi == pytest.approx(minutes, abs=0.6) and 0 < min(x) and max(x) < hi
    assert heat["layout"]["title"]["text"] == "seconds per step (s), every host"


def test_the_hosts_table_has_human_units_and_a_running_host_is_not_silent(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    _beats(runs, "r", 2, 10, start=time.time() - 10 * 60 + 29)  # the newest beat 29 s ago
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    ingest(runs, db, emit=None)
    at = AppTest.from_string(
        "from observatory.dashboard.pages import health\nhealth.render()\n", default_timeout=60
    )
    at.query_params["run"] = "r"
    at.run()
    assert not at.exception, at.exception
    df = at.dataframe[0].value
    assert list(df["silent for"]) == ["—", "—"]
    assert list(df["rss (GB)"]) == [0.92, 0.92] and list(df["cpu_percent (%)"]) == [90.0, 90.0]
    specs = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    host = [s for s in specs if s["layout"]["title"]["text"].startswith("Host 0:")]
    # no chart mixes bytes and percentages on one axis: one chart per unit, its axis titled with it
    assert sorted(s["layout"]["yaxis"]["title"]["text"] for s in host) == ["%", "GB"]
    for s in host:
        assert {d["name"].endswith("_bytes") for d in s["data"]} == {
            s["layout"]["yaxis"]["title"]["text"] == "GB"
        }
