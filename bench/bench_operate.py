"""Operate the hero run: how fast and how truly alerts reach a person, with `observatory ingest --follow` alone.

Everything runs for real, in real time, on this machine: a follower (`observatory ingest --follow`, a
child process), a webhook receiver on 127.0.0.1 (the channel: apprise's json://), and writer threads
appending event lines as a many-host job's processes would. Thresholds are scaled down so the bench takes
about two minutes (`anomaly_stall_s` 10 s; the defaults are 300 s): each figure is also given as a
multiple of its threshold. Scenarios, side by side in one run:

- a frozen host: one of `--hosts` (200) heartbeating processes stops; its siblings go on. Target: an
  alert naming that host within 2x the stall threshold of its last heartbeat.
- a hang before the first step: a run enters `compile` with an 8 s budget and never logs a step (its
  process heartbeats on). Target: alerted once the budget is exceeded.
- a critical finding: a live run logs a NaN loss. Target: the webhook has it within 5 s of the line.
- a straggler (one host 1.6x slower per step), HBM creep toward the limit, an MFU drop to 70% (a user
  rule: ratio_below 0.8 of its own past), a slow loss divergence (a user rule: rise 0.2): each alerted,
  naming the host or the metric.
- a healthy pod (20 hosts, irregular step times, an eval and a checkpoint phase with budgets longer than
  the stall threshold): target 0 alerts; and a simulated healthy run of 8 hosts x 100k steps with evals and
  checkpoints (`observatory simulate --fault healthy`, then `observatory ingest`): target 0 alerts.

    .venv/bin/python bench/bench_operate.py                 # about 2 minutes
    .venv/bin/python bench/bench_operate.py --hosts 50      # a smaller pod
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from procs import start_follower

STALL_S = 10.0
GOT: list[tuple[float, dict]] = []  # (arrival time, apprise's JSON body)


class Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        GOT.append((time.time(), body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *a):
        pass


class Writer:
    """One process's event log: appends whole lines, as the writer does."""

    def __init__(self, runs: Path, run: str, host: int):
        self.run, self.host, self.seq = run, host, 0
        p = runs / run / f"events.{host}.jsonl"
        p.parent.mkdir(parents=True, exist_ok=True)
        self.f = open(p, "a")  # noqa: SIM115 (kept open for the bench's life)

    def ev(self, kind: str, data: dict, step: int | None = None) -> float:
        t = time.time()
        line = {
            "v": 1,
            "run": self.run,
            "kind": kind,
            "step": step,
            "t": t,
            "host": self.host,
            "seq": self.seq,
            "data": data,
        }
        self.seq += 1
        self.f.write(json.dumps(line) + "\n")
        self.f.flush()
        return t


def pod(
    runs: Path,
    run: str,
    hosts: int,
    stop: threading.Event,
    marks: dict,
    *,
    frozen: int | None = None,
    slow: int | None = None,
    creep: int | None = None,
    phases: bool = False,
    rng=None,
) -> None:
    """A many-host job: host 0 logs steps; every host heartbeats each second with its own step."""
    rng = rng or random.Random(0)
    ws = [Writer(runs, run, h) for h in range(hosts)]
    ws[0].ev("run_start", {"config": {}, "mesh": {"processes": hosts}}, 0)
    for w in ws:
        w.ev("phase", {"phase": "train", "attempt": 0})
    step, t0, k = 0, time.time(), 0
    while not stop.is_set():
        k += 1
        step += 1
        ws[0].ev(
            "metrics", {"train/loss": 3.0 - 0.001 * step + rng.gauss(0, 0.01), "throughput/mfu": 0.4}, step
        )
        if phases and k in (15, 40):  # an eval, then a checkpoint, each longer than the stall threshold
            kind = "eval" if k == 15 else "checkpoint"
            for w in ws:
                w.ev("phase", {"phase": kind, "attempt": 0, "budget_s": 3 * STALL_S})
            stop.wait(1.5 * STALL_S)
            for w in ws:
                w.ev("phase", {"phase": "train", "attempt": 0})
        for h, w in enumerate(ws):
            if h == frozen and time.time() - t0 > 5:
                continue
            own = int(step / 1.6) if h == slow else step
            tm = {
                "system/cpu_percent": 50.0,
                "accel/0/hbm_limit_bytes": 80e9,
                "accel/0/hbm_used_bytes": 40e9 + (1.5e9 * k if h == creep else 0),
            }
            t = w.ev("heartbeat", {"phase": "train", "step": own, **tm}, own)
            if h == frozen:
                marks["last_beat"] = t
        stop.wait(max(0.05, 1.0 + rng.uniform(-0.3, 0.3) if phases else 1.0))
    ws[0].ev("run_end", {"status": "completed", "final_step": step}, step)


def single(runs: Path, run: str, stop: threading.Event, marks: dict, what: str) -> None:
    """One process: a hang before step 0, a NaN loss, an MFU drop or a slow loss divergence."""
    w = Writer(runs, run, 0)
    w.ev("run_start", {"config": {}}, 0)
    if what == "hang":
        t = w.ev("phase", {"phase": "compile", "attempt": 0, "budget_s": 8.0})
        marks["hang_due"] = t + 8.0
        while not stop.wait(1.0):
            w.ev("heartbeat", {"phase": "compile", "step": 0, "system/cpu_percent": 100.0}, 0)
        w.ev("run_end", {"status": "killed"}, 0)
        return
    step = 0
    while not stop.is_set():
        step += 1
        loss = 3.0 + (0.004 * max(0, step - 40) if what == "diverge" else 0.0) + random.gauss(0, 0.005)
        mfu = 0.4 * (0.7 if what == "mfu" and step > 60 else 1.0)
        if what == "nan" and step == 40:
            marks["nan_at"] = w.ev("metrics", {"train/loss": "nan", "throughput/mfu": mfu}, step)
        else:
            w.ev("metrics", {"train/loss": loss, "throughput/mfu": mfu}, step)
        stop.wait(0.25)
    w.ev("run_end", {"status": "completed", "final_step": step}, step)


def _healthy_100k(tmp: Path, env: dict) -> int:
    """Alerts on `observatory simulate --fault healthy` at 100k steps, through `observatory ingest` (its hooks)."""
    runs, db = tmp / "healthy-runs", tmp / "healthy.duckdb"
    obs = [sys.executable, "-m", "observatory.cli"]
    subprocess.run(
        [
            *obs,
            "simulate",
            "--preset",
            "535b",
            "--fault",
            "healthy",
            "--steps",
            "100000",
            "--hosts",
            "8",
            "--runs-dir",
            str(runs),
        ],
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [*obs, "ingest", "-q", "--runs-dir", str(runs), "--db", str(db)],
        env=env,
        check=True,
        capture_output=True,
    )
    out = subprocess.run(
        [*obs, "alerts", "list", "--db", str(db), "--runs-dir", str(runs), "--json"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return len([line for line in out.splitlines() if line.strip()])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=200)
    ap.add_argument("--seconds", type=float, default=75.0, help="how long the writers write")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-operate-"))
    runs, db = tmp / "runs", tmp / "store.duckdb"
    runs.mkdir()
    srv = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    rules = tmp / "alerts.yaml"
    rules.write_text(f"""channels:
  - {{url: "json://127.0.0.1:{srv.server_port}/hook", name: bench, min_severity: info}}
rules:
  - {{name: mfu-drop, metric: throughput/mfu, ratio_below: 0.8, for_steps: 20, over_steps: 100}}
  - {{name: loss-divergence, metric: train/loss, rise: 0.2, for_steps: 20, over_steps: 100, severity: warn}}
""")
    env = {
        **os.environ,
        "OBSERVATORY_ANOMALY_STALL_S": str(STALL_S),
        "OBSERVATORY_ALERTS_FILE": str(rules),
        "OBSERVATORY_PHASE_BUDGET_S": str(3 * STALL_S),
    }
    follower = start_follower(runs, db, env=env, stderr=subprocess.DEVNULL)
    stop, marks = threading.Event(), {}
    jobs = [
        threading.Thread(
            target=pod,
            args=(runs, "pod", a.hosts, stop, marks),
            kwargs={"frozen": a.hosts * 2 // 3, "slow": 7, "creep": 11},
        ),
        threading.Thread(target=pod, args=(runs, "healthy", 20, stop, {}), kwargs={"phases": True}),
        *(
            threading.Thread(target=single, args=(runs, w, stop, marks, w))
            for w in ("hang", "nan", "mfu", "diverge")
        ),
    ]
    t0 = time.time()
    for j in jobs:
        j.start()
    stop.wait(a.seconds)
    stop.set()
    for j in jobs:
        j.join(30)
    time.sleep(2 * STALL_S)  # the follower's last checks
    follower.terminate()
    follower.wait(30)

    opened = [(t, b) for t, b in GOT if not b["title"].startswith("[RESOLVED]")]

    def first(pred) -> tuple[float, dict] | None:
        return next(((t, b) for t, b in opened if pred(b)), None)

    def say(what: str, hit, since: float | None, target: str) -> None:
        late = f"{hit[0] - since:.1f} s" if hit and since else ("alerted" if hit else "NOT alerted")
        title = hit[1]["title"] if hit else "-"
        print(f"{what:<44} {late:>12}   target {target:<28} {title}")

    frozen = a.hosts * 2 // 3
    print(
        f"{a.hosts}-host pod, stall threshold {STALL_S:g} s, writers ran {time.time() - t0:.0f} s; "
        f"{len(GOT)} messages in all"
    )
    say(
        f"frozen host {frozen} among {a.hosts}: after its last beat",
        first(lambda b: f"pod host {frozen}: frozen_host" in b["title"]),
        marks.get("last_beat"),
        f"<= {2 * STALL_S:g} s (2x the threshold)",
    )
    say(
        "hang before the first step: past its budget",
        first(lambda b: "hang: stalled" in b["title"]),
        marks.get("hang_due"),
        f"<= {STALL_S:g} s (one clock tick +)",
    )
    say(
        "NaN loss: line to webhook",
        first(lambda b: "nan:" in b["title"] and "findings" in b["title"]),
        marks.get("nan_at"),
        "<= 5 s",
    )
    say("straggler host 7", first(lambda b: "pod host 7: straggler" in b["title"]), None, "alerted")
    say("HBM creep host 11", first(lambda b: "pod host 11: memory_creep" in b["title"]), None, "alerted")
    say("MFU drop to 70%", first(lambda b: "mfu: mfu-drop" in b["title"]), None, "alerted")
    say("slow loss divergence", first(lambda b: "diverge: loss-divergence" in b["title"]), None, "alerted")
    healthy = [
        f"{b['title']}: {b['message'].splitlines()[0]}"
        for _, b in opened
        if b["title"].split("] ", 1)[-1].startswith("healthy")
    ]
    print(
        f"{'healthy 20-host pod (eval, checkpoint, jitter)':<44} {len(healthy):>12}   target 0 alerts"
        + (f"   {healthy}" if healthy else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
