"""Alerts: rules over a real store, one message per episode, real channels on 127.0.0.1 (an HTTP webhook
receiver, aiosmtpd for mail), the Prometheus text format, and the follower's clock."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import event, write_lines
from dashboard_fixtures import chart_specs, page
from polling import wait_until

from observatory import findings
from observatory.alerts import rules
from observatory.cli import main as cli
from observatory.pipeline import ingest


class Hook(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.fixture
def webhook():
    Hook.got = []
    srv = HTTPServer(("127.0.0.1", 0), Hook)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv.server_port, Hook.got
    srv.shutdown()


@pytest.fixture
def rules_file(tmp_path, monkeypatch, webhook):
    p = tmp_path / "alerts.yaml"
    p.write_text(f"channels:\n  - url: json://127.0.0.1:{webhook[0]}/hook\n    name: ops-hook\n")
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(p))
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "300")
    return p


def run_log(runs_dir, run, *, steps, t_last, host=0, config=None, start_t=None, extra=(), end=False):
    """A run whose last metrics step is at `t_last` (Unix seconds), then `extra` events, then maybe a run_end."""
    t0 = start_t if start_t is not None else t_last - 60
    evs = [event(run, "run_start", {"config": config or {}}, 0, step=0, t=t0, host=host)]
    for i, s in enumerate(steps):
        evs.append(
            event(
                run, "metrics", {"train/loss": 3.0}, i + 1, step=s, t=t_last - (len(steps) - 1 - i), host=host
            )
        )
    seq = len(evs)
    for kind, data, step, t in extra:
        evs.append(event(run, kind, data, seq, step=step, t=t, host=host))
        seq += 1
    if end:
        evs.append(
            event(run, "run_end", {"status": "completed"}, seq, step=steps[-1], t=t_last + 1, host=host)
        )
    write_lines(runs_dir / run / f"events.{host}.jsonl", evs)


def stored_alerts(db):
    import duckdb

    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute("SELECT run, data FROM events WHERE kind = 'alert' ORDER BY run, seq").fetchall()
    return [{"run": r, **json.loads(d)} for r, d in rows]


def test_a_stalled_run_opens_once_resolves_once_and_the_webhook_gets_both(
    runs_dir, db_path, rules_file, webhook
):
    now = time.time()
    run_log(runs_dir, "silent", steps=[1, 2, 3], t_last=now - 1000)
    run_log(runs_dir, "healthy", steps=[1, 2, 3], t_last=now)
    run_log(runs_dir, "finished", steps=[1, 2, 3], t_last=now - 1000, end=True)
    ingest(runs_dir, db_path, emit=None)
    ingest(runs_dir, db_path, emit=None)  # a second pass: the episode is open, nothing is sent again
    got = webhook[1]
    assert len(got) == 1 and "silent" in got[0]["title"] and "stalled" in got[0]["title"]
    assert "step 3" in got[0]["message"] and "/live?run=silent&step=3" in got[0]["message"]
    (a,) = stored_alerts(db_path)
    assert (a["run"], a["rule"], a["state"], a["severity"], a["channels"]) == (
        "silent",
        "stalled",
        "open",
        "critical",
        ["ops-hook"],
    )
    # the run moves on: one resolved message, stored
    write_lines(
        runs_dir / "silent" / "events.0.jsonl", [event("silent", "metrics", {"train/loss": 2.9}, 10, step=4)]
    )
    ingest(runs_dir, db_path, emit=None)
    assert len(got) == 2 and got[1]["title"].startswith("[RESOLVED]")
    assert [x["state"] for x in stored_alerts(db_path)] == ["open", "resolved"]


def test_a_long_checkpoint_or_compile_is_not_a_stall_but_a_hang_past_its_budget_is(
    runs_dir, db_path, rules_file
):
    now = time.time()
    ph = lambda p, t, **k: ("phase", {"phase": p, "attempt": 0, **k}, None, t)  # noqa: E731
    run_log(
        runs_dir, "ckpt", steps=[1, 2], t_last=now - 420, extra=[ph("checkpoint", now - 400, budget_s=600)]
    )
    run_log(
        runs_dir, "compiling", steps=[], t_last=now - 360, extra=[ph("compile", now - 360)]
    )  # phase_budget_s
    run_log(runs_dir, "hung", steps=[], t_last=now - 2000, extra=[ph("compile", now - 2000, budget_s=900)])
    ingest(runs_dir, db_path, emit=None)
    (a,) = stored_alerts(db_path)
    assert a["run"] == "hung" and a["rule"] == "stalled" and a["attempt"] == 0
    assert "still in compile" in a["message"] and "before its first step" in a["message"]


def test_a_frozen_host_is_named_though_its_sibling_goes_on(runs_dir, db_path, rules_file, webhook):
    now = time.time()
    run_log(runs_dir, "multi", steps=[1, 2, 3], t_last=now, host=0)
    run_log(runs_dir, "multi", steps=[1, 2], t_last=now - 900, host=1)
    ingest(runs_dir, db_path, emit=None)
    (a,) = stored_alerts(db_path)
    assert (a["rule"], a["host"]) == ("frozen_host", 1) and "host 1 silent" in a["message"]
    assert "host 1" in webhook[1][0]["title"]


def test_metric_rule_per_run_config_disable_and_silence(runs_dir, db_path, rules_file, webhook):
    rules_file.write_text(
        rules_file.read_text() + "rules:\n  - name: loss-high\n    metric: train/loss\n"
        "    above: 2.5\n    for_steps: 3\n    severity: warn\n"
    )
    now = time.time()
    run_log(runs_dir, "hot", steps=[1, 2, 3], t_last=now)
    run_log(runs_dir, "hot-off", steps=[1, 2, 3], t_last=now, config={"alerts": {"enabled": False}})
    run_log(runs_dir, "hot-cli", steps=[1, 2, 3], t_last=now)
    run_log(runs_dir, "hot-quiet", steps=[1, 2, 3], t_last=now)
    r = CliRunner()
    assert r.invoke(cli, ["alerts", "disable", "--run", "hot-cli", "--rule", "loss-high"]).exit_code == 0
    assert r.invoke(cli, ["alerts", "silence", "--run", "hot-q*", "--for", "2h"]).exit_code == 0
    ingest(runs_dir, db_path, emit=None)
    got = {(a["run"], a["rule"], tuple(a["channels"])) for a in stored_alerts(db_path)}
    assert got == {
        ("hot", "loss-high", ("ops-hook",)),
        ("hot-quiet", "loss-high", ()),
    }  # silenced: stored, not sent
    assert [m["title"] for m in webhook[1]] == ["[WARN] hot: loss-high"]
    out = r.invoke(cli, ["alerts", "list", "--db", str(db_path)])
    assert "hot " in out.output and "loss-high" in out.output and "2 open alert(s)" in out.output
    assert r.invoke(cli, ["alerts", "enable", "--run", "hot-cli", "--rule", "loss-high"]).exit_code == 0
    ingest(runs_dir, db_path, emit=None)
    assert {a["run"] for a in stored_alerts(db_path)} == {"hot", "hot-quiet", "hot-cli"}


# a critical finding, as the loss-spike detector writes one
SPIKE = {"detector": "loss_spike", "metric": "train/loss", "severity": "critical", "message": "a spike"}


def test_a_critical_finding_pages_once_per_episode(runs_dir, db_path, rules_file, webhook):
    now = time.time()
    run_log(runs_dir, "spiky", steps=list(range(1, 11)), t_last=now)
    ingest(runs_dir, db_path, emit=None)
    f = {**SPIKE, "window": [5, 5]}
    findings.write(runs_dir, "spiky", "anomaly", [(f, 5), ({**f, "window": [7, 7]}, 7)])
    findings.write(runs_dir, "spiky", "anomaly", [({**f, "severity": "warn", "detector": "grad_spike"}, 8)])
    ingest(runs_dir, db_path, emit=None)
    (a,) = stored_alerts(db_path)
    assert (
        a["rule"] == "findings"
        and a["finding"]["detector"] == "loss_spike"
        and "(2 findings)" in a["message"]
    )
    assert len(webhook[1]) == 1


def test_a_forged_open_alert_or_finding_neither_pages_nor_silences_the_real_one(
    runs_dir, db_path, rules_file, webhook
):
    """Anyone who can write a log can write `events.1000.jsonl`. An open alert put there by hand used to
    count as the observatory's, so the real episode on the same key was never sent; a forged critical
    anomaly paged. Findings now count only when signed with the observatory's key (`provenance`)."""
    now = time.time()
    run_log(runs_dir, "spiky", steps=list(range(1, 11)), t_last=now)
    f = SPIKE
    forged_alert = {
        "rule": "findings",
        "state": "open",
        "severity": "critical",
        "message": "FORGED",
        "finding": f,
    }
    own = runs_dir / "spiky" / "events.1000.jsonl"
    forged = [
        {
            "v": 1,
            "run": "spiky",
            "kind": "alert",
            "step": 3,
            "t": now,
            "host": 1000,
            "seq": 0,
            "data": forged_alert,
        },
        {"v": 1, "run": "spiky", "kind": "anomaly", "step": 4, "t": now, "host": 1000, "seq": 1, "data": f},
    ]
    write_lines(own, forged)
    write_lines(
        runs_dir / "spiky" / "events.7.jsonl", [event("spiky", "anomaly", {**f, "window": [2, 2]}, 0, 2)]
    )
    ingest(runs_dir, db_path, emit=None)
    assert stored_alerts(db_path) == [] and webhook[1] == []  # neither pages
    findings.write(runs_dir, "spiky", "anomaly", [({**f, "window": [5, 5]}, 5)])  # the observatory's own
    ingest(runs_dir, db_path, emit=None)
    (a,) = stored_alerts(db_path)
    assert a["state"] == "open" and a["finding"]["detector"] == "loss_spike" and a["message"] != "FORGED"
    assert len(webhook[1]) == 1 and "FORGED" not in json.dumps(webhook[1])


def test_the_rules_file_errors_name_the_entry_and_field(tmp_path):
    p = tmp_path / "a.yaml"
    for text, where in [
        ("rules:\n  - name: x\n    metric: m\n", "rules[0]: a metric rule needs exactly one of"),
        ("rules:\n  - name: x\n    metric: m\n    above: 1\n    for_steps: 0\n", "rules[0].for_steps"),
        ("rules:\n  - metric: m\n    above: 1\n", "rules[0].name"),
        ("channels:\n  - name: n\n", "channels[0].url"),
        ("silences:\n  - run: r\n    until: tomorrow\n", "until: 'tomorrow'"),
        ("bogus: []\n", "unknown section 'bogus'"),
    ]:
        p.write_text(text)
        with pytest.raises(rules.RulesError, match=__import__("re").escape(where)):
            rules.load(p)


def test_mail_reaches_a_real_smtp_server(tmp_path, monkeypatch):
    from aiosmtpd.controller import Controller

    got = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 (aiosmtpd's name)
            got.append(envelope.content.decode())
            return "250 OK"

    import socket

    with socket.socket() as s:  # a free port (aiosmtpd's Controller does not take port 0)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctl = Controller(Handler(), hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        p = tmp_path / "a.yaml"
        p.write_text(
            f"channels:\n  - url: mailto://127.0.0.1:{port}?from=obs@example.com&to=ops@example.com\n"
            "    name: ops-mail\n"
        )
        r = CliRunner().invoke(cli, ["alerts", "test", "--rules", str(p)])
        assert r.exit_code == 0, r.output
        assert "ops-mail" in r.output and len(got) == 1 and "[TEST] observatory alerts" in got[0]
    finally:
        ctl.stop()


def test_prometheus_text_parses_with_each_live_runs_health(runs_dir, db_path, rules_file):
    from urllib.request import urlopen

    from prometheus_client.parser import text_string_to_metric_families

    from observatory.alerts import prometheus

    now = time.time()
    run_log(runs_dir, "live", steps=[1, 2, 3], t_last=now)
    run_log(runs_dir, "silent", steps=[1, 2], t_last=now - 1000)
    ingest(runs_dir, db_path, emit=None)
    srv = prometheus.serve(db_path, "127.0.0.1", 0)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        text = urlopen(f"http://127.0.0.1:{srv.server_port}/metrics", timeout=10).read().decode()
    finally:
        srv.shutdown()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    val = {
        (f, s.labels.get("run"), s.labels.get("severity")): s.value
        for f, fam in fams.items()
        for s in fam.samples
    }
    assert (
        val[("observatory_run_step", "live", None)] == 3
        and val[("observatory_run_loss", "live", None)] == 3.0
    )
    assert val[("observatory_run_seconds_since_progress", "silent", None)] > 900
    assert val[("observatory_run_open_alerts", "silent", "critical")] == 1
    assert val[("observatory_run_open_alerts", "live", "critical")] == 0


@pytest.mark.slow
def test_the_follower_alerts_a_silent_run_on_its_own_clock(
    runs_dir, db_path, rules_file, webhook, monkeypatch
):
    """No other event arrives: the follower's clock alone finds the run silent (issue: it fired only after
    another run wrote)."""
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "2")
    run_log(runs_dir, "quiet", steps=[1, 2, 3], t_last=time.time())
    stop = threading.Event()
    th = threading.Thread(
        target=ingest, args=(runs_dir, db_path), kwargs={"follow": True, "stop_event": stop, "emit": None}
    )
    t0 = time.monotonic()
    th.start()
    try:
        wait_until(lambda: webhook[1], 30 - (time.monotonic() - t0), what="an alert at the webhook")
    finally:
        stop.set()
        th.join(30)
    assert webhook[1] and "quiet" in webhook[1][0]["title"], "no alert within 30 s"
    assert time.monotonic() - t0 < 2 + 5 + 5  # the stall threshold plus the clock's period, and slack


def test_a_frozen_host_among_heartbeating_siblings_and_its_telemetry_stored(runs_dir, db_path, rules_file):
    """Host 1 froze (no heartbeat) while host 0 heartbeats with no new step: the frozen host is named; the
    heartbeats land in `heartbeats` and `host_telemetry`, secrets in telemetry names hidden."""
    import duckdb

    now = time.time()
    beat = lambda h, t, **tm: ("heartbeat", {"phase": "train", "step": 3, **tm}, 3, t)  # noqa: E731
    beats = {
        0: [beat(0, now - 60 * k, **{"system/cpu_percent": 50.0 + k}) for k in (10, 5, 0)],
        1: [beat(1, now - 800, **{"system/rss_bytes": 1e9, "api_key=sk-abcdefghijklmnopqrstuvwx": 1.0})],
    }
    for host, extra in beats.items():
        run_log(runs_dir, "pod", steps=[1, 2, 3], t_last=now - 900, host=host, extra=extra)
    ingest(runs_dir, db_path, emit=None)
    got = {(a["rule"], a.get("host")) for a in stored_alerts(db_path)}
    assert ("frozen_host", 1) in got and ("frozen_host", 0) not in got
    stall = next(a for a in stored_alerts(db_path) if a["rule"] == "stalled")
    assert "still send heartbeats: a hang" in stall["message"]
    with duckdb.connect(str(db_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM heartbeats WHERE run = 'pod'").fetchone() == (4,)
        assert con.execute("SELECT count(*) FROM events WHERE kind = 'heartbeat'").fetchone() == (0,)
        names = {r[0] for r in con.execute("SELECT DISTINCT name FROM host_telemetry").fetchall()}
        assert "system/cpu_percent" in names and not any("sk-abcdefghij" in n for n in names)


def test_a_straggler_and_memory_creep_are_named_and_a_healthy_pod_pages_nobody(runs_dir, db_path, rules_file):
    now = time.time()
    for h in range(4):  # host 2 takes 1.6x as long per step; host 3's accelerator fills toward its limit
        beats = []
        for k in range(20):
            t = now - 300 + 15 * k
            used = 40e9 + (k * 1.5e9 if h == 3 else 0)
            beats.append(
                (
                    "heartbeat",
                    {
                        "phase": "train",
                        "step": int(k * 10 / (1.6 if h == 2 else 1)),
                        "accel/0/hbm_used_bytes": used,
                        "accel/0/hbm_limit_bytes": 80e9,
                    },
                    None,
                    t,
                )
            )
        run_log(runs_dir, "pod", steps=[1, 2, 3], t_last=now, host=h, extra=beats)
        run_log(
            runs_dir,
            "calm",
            steps=[1, 2, 3],
            t_last=now,
            host=h,
            extra=[
                (kind, {**d, "accel/0/hbm_used_bytes": 40e9, "step": k * 10}, s, t)
                for k, (kind, d, s, t) in enumerate(beats)
            ],
        )
    ingest(runs_dir, db_path, emit=None)
    got = {(a["run"], a["rule"], a.get("host")) for a in stored_alerts(db_path)}
    assert got == {("pod", "straggler", 2), ("pod", "memory_creep", 3)}


def _series_run(runs_dir, run, values: dict[str, list[float]], now: float, end: bool = False):
    n = len(next(iter(values.values())))
    evs = [event(run, "run_start", {"config": {}}, 0, step=0, t=now - n - 5)]
    evs += [
        event(run, "metrics", {k: v[i] for k, v in values.items()}, i + 1, step=i + 1, t=now - n + i)
        for i in range(n)
    ]
    if end:
        evs.append(event(run, "run_end", {"status": "completed"}, n + 1, step=n, t=now))
    write_lines(runs_dir / run / "events.0.jsonl", evs)


def test_regression_and_drift_rules_catch_what_a_128_step_window_misses(runs_dir, db_path, rules_file):
    """A run 30% slower than its baseline from the start; one decaying slowly to 55%; router entropy sliding
    5.95 -> 5.50 and drop fraction 3% -> 12% over 4k steps: each fires (the decay the default `mfu_drop`
    too; the run slow from the start not: its own earlier level is as slow). A healthy run on a busy machine
    (one step in five at half speed) fires nothing."""
    import numpy as np

    rules_file.write_text(
        rules_file.read_text()
        + """rules:
  - {name: slower-than-base, metric: throughput/tokens_per_s, ratio_below: 0.8, for_steps: 200, baseline_run: base}
  - {name: slower-than-before, metric: throughput/tokens_per_s, ratio_below: 0.8, for_steps: 200, over_steps: 3500}
  - {name: entropy-drift, metric: router/entropy, fall: 0.3, for_steps: 200, over_steps: 3000, severity: warn}
  - {name: drop-high, metric: moe/drop_fraction, above: 0.07, for_steps: 50, severity: warn}
"""
    )
    now, n = time.time(), 4000
    rng = np.random.default_rng(0)
    flat = 1000 + rng.normal(0, 20, n)
    busy = np.where(rng.random(n) < 0.2, flat / 2, flat)
    ramp = np.linspace(0, 1, n)
    healthy = {
        "throughput/tokens_per_s": list(busy),
        "router/entropy": list(5.95 + rng.normal(0, 0.01, n)),
        "moe/drop_fraction": list(0.03 + rng.normal(0, 0.002, n)),
    }
    _series_run(
        runs_dir, "base", {"throughput/tokens_per_s": list(flat)}, now - 10_000, end=True
    )  # the baseline
    _series_run(runs_dir, "busy", healthy, now)
    _series_run(runs_dir, "slow", {**healthy, "throughput/tokens_per_s": list(0.7 * flat)}, now)
    _series_run(
        runs_dir, "decay", {**healthy, "throughput/tokens_per_s": list(flat * (1 - 0.45 * ramp))}, now
    )
    _series_run(
        runs_dir,
        "drift",
        {
            **healthy,
            "router/entropy": list(5.95 - 0.45 * ramp),
            "moe/drop_fraction": list(0.03 + 0.09 * ramp),
        },
        now,
    )
    ingest(runs_dir, db_path, emit=None)
    got = {(a["run"], a["rule"]) for a in stored_alerts(db_path)}
    assert got == {
        ("slow", "slower-than-base"),
        ("decay", "slower-than-base"),
        ("decay", "slower-than-before"),
        ("decay", "mfu_drop"),  # the default: the `throughput_loss` detector's definition, on tokens/s
        ("drift", "entropy-drift"),
        ("drift", "drop-high"),
    }


def test_the_live_page_marks_the_alerts_of_its_run(runs_dir, db_path, rules_file, monkeypatch):

    now = time.time()
    run_log(runs_dir, "silent", steps=list(range(1, 40)), t_last=now - 1000)
    ingest(runs_dir, db_path, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db_path))
    at = page("live", run="silent")
    assert not at.exception, at.exception
    specs = chart_specs(at)
    marks = [t for s in specs for t in s["data"] if t.get("name") == "alert"]
    assert marks and "stalled open: no new step" in marks[0]["text"][0]


def test_back_to_training_after_an_eval_starts_the_stall_clock_again(runs_dir, db_path, rules_file):
    now = time.time()
    ph = lambda p, t: ("phase", {"phase": p, "attempt": 0}, None, t)  # noqa: E731
    # a 14-minute eval ended 2 minutes ago; no step logged since: not a stall yet
    run_log(
        runs_dir,
        "evaled",
        steps=[1, 2],
        t_last=now - 960,
        extra=[ph("eval", now - 960), ph("train", now - 120)],
    )
    ingest(runs_dir, db_path, emit=None)
    assert stored_alerts(db_path) == []


def test_a_phase_without_a_budget_gets_the_default_not_an_earlier_phases(runs_dir, db_path, rules_file):
    """The newest phase's budget is its own: a checkpoint that names none is allowed `phase_budget_s`
    (30 min), not the 60 s of the compile before it."""
    now = time.time()
    ph = lambda p, t, **k: ("phase", {"phase": p, "attempt": 0, **k}, None, t)  # noqa: E731
    run_log(
        runs_dir,
        "saving",
        steps=[1, 2],
        t_last=now - 420,
        start_t=now - 900,
        extra=[ph("compile", now - 800, budget_s=60), ph("checkpoint", now - 400)],
    )
    ingest(runs_dir, db_path, emit=None)
    assert stored_alerts(db_path) == []


def test_the_alerts_hold_no_sql_and_share_the_detectors_activity_query():
    """The alerts' SQL lives in `observatory.queries` (one module per area); the stall rule's progress and
    phase come from the detectors' `run_activity`, not a copy of it."""
    import inspect
    import re

    import observatory.alerts as pkg
    from observatory.alerts import conditions

    for path in Path(pkg.__file__).parent.glob("*.py"):
        assert not re.search(r"\b(SELECT|FROM \w+ WHERE)\b", path.read_text()), path
    assert "run_activity" in inspect.getsource(conditions._stalled)
