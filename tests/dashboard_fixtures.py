"""A small real store for the dashboard tests: runs written by the real writer, loaded by the real ingest.

`make_store(tmp)` writes three runs into `tmp/runs` and ingests them into
`tmp/store.duckdb`:

- `base-run` (completed, 120 steps): every health metric, a loss spike and a NaN,
  expert loads for 2 layers x 8 experts (expert 3 hot, layer 1 dropping), eval
  points, a checkpoint, a config change, a failure, an anomaly, a decision, a
  forecast with points and a note whose Markdown carries raw HTML;
- `fork-run` (completed, forked from base-run at step 60, lower LR);
- `crashed-run`: no run_end, last event long ago (shown as crashed).
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import observatory
from observatory.events import OBSERVATORY_HOST
from observatory.pipeline import ingest

BASE_STEPS = 120
E, L = 8, 2
HTML_NOTE = "**bold** <script>alert('x')</script><img src=x onerror=alert(1)>"

PAGE_TIMEOUT_S = 60  # a page run under AppTest (two shared cores: a cold one can take a while)


def metrics_at(step: int, lr: float = 3e-4) -> dict[str, float]:
    loss = 2.0 + 6.0 * (step + 10) ** -0.5
    if step == 77:
        loss += 5.0  # a one-step spike that downsampling must keep
    return {
        "train/loss": math.nan if step == 90 else loss,
        "train/z_loss": 1e-3 + 1e-5 * step,
        "router/z_loss": 2e-3,
        "router/lb_loss": 0.01 + 0.001 * (step % 7),
        "grad/norm/total": 1.0 + 0.01 * step,
        "opt/lr": lr,
        "throughput/tokens_per_s": 5000.0 + step,
        "moe/drop_fraction": 0.05,
        "data/tokens": float((step + 1) * 1024),
    }


def expert_loads(step: int, layer: int) -> tuple[list[int], list[int]]:
    routed = [100 + (300 if e == 3 else 0) + step % 5 for e in range(E)]
    cap = 150
    dropped = [max(0, r - cap) if layer == 1 else 0 for r in routed]
    return routed, dropped


def write_run(runs_dir: Path, run_id: str, steps: range, parent=None, lr=3e-4, finish=True, t_offset=0.0):
    cfg = {
        "steps": BASE_STEPS,
        "optim": {"lr": lr, "warmup": 10},
        "model": {"experts": E, "layers": L},
        "wandb": {"api_key": "sk-secret-value"},
    }
    run = observatory.init(
        run_id=run_id,
        config=cfg,
        runs_dir=runs_dir,
        parent=parent,
        tags=["test", run_id.split("-")[0]],
        ladder={"name": "tiny", "rung": "d32"} if run_id == "base-run" else None,
        model={"params_total": 1e6, "params_active": 2e5, "flops_per_token": 1.2e6},
        install_signal_handlers=False,
    )
    for s in steps:
        run.log(metrics_at(s, lr), step=s)
        for layer in range(L):
            r, d = expert_loads(s, layer)
            run.log_expert_load(s, layer, r, d)
        if s % 40 == 0:
            run.event("eval", {"dataset": "val", "loss": 2.1 + 6.0 * (s + 10) ** -0.5}, step=s)
    if run_id == "base-run":
        run.event("checkpoint", {"path": "/ckpt/60", "bytes": 1234}, step=60)
        run.event(
            "config_diff",
            {"against": {"run": run_id, "step": 0}, "changes": {"optim.lr": [3e-4, 2e-4]}},
            step=50,
        )
        run.event(
            "failure", {"type": "nan_loss", "message": "loss became NaN", "action": "skip_batch"}, step=90
        )
        run.note(HTML_NOTE, author="tester", step=100)
    if finish:
        run.finish("completed", final_step=steps[-1])
    else:
        run.flush()
        run.close()
    return run


def write_findings(runs_dir: Path) -> None:
    """Forecast, anomaly and decision as the observatory writes them (host 1000)."""
    obs = observatory.init(
        run_id="base-run",
        runs_dir=runs_dir,
        host=OBSERVATORY_HOST,
        write_start=False,
        install_signal_handlers=False,
    )
    obs.event(
        "anomaly",
        {
            "detector": "zscore",
            "metric": "train/loss",
            "severity": "warn",
            "message": "loss spike above 6 sigma",
            "window": [75, 80],
        },
        step=77,
    )
    obs.event(
        "decision",
        {
            "id": "D-7",
            "title": "lower the LR",
            "status": "accepted",
            "hypothesis": "the spike comes from a high LR",
        },
        step=50,
    )
    obs.event(
        "forecast",
        {
            "metric": "train/loss",
            "method": "power law",
            "source": {"ladder": "tiny"},
            "points": [
                {
                    "step": s,
                    "value": 2.0 + 6.0 * (s + 10) ** -0.5,
                    "low": 1.9 + 6.0 * (s + 10) ** -0.5,
                    "high": 2.1 + 6.0 * (s + 10) ** -0.5,
                }
                for s in range(0, 121, 20)
            ],
        },
        step=0,
    )
    obs.close()


def write_crashed(runs_dir: Path, run_id: str, steps: int, age_s: float) -> None:
    """A run whose writer died `age_s` ago without run_end, written as raw event lines (the public format)."""
    d = runs_dir / run_id
    d.mkdir(parents=True, exist_ok=True)
    t0 = time.time() - age_s - steps
    lines = [
        {
            "v": 1,
            "run": run_id,
            "kind": "run_start",
            "step": None,
            "t": t0,
            "host": 0,
            "seq": 0,
            "data": {"config": {"steps": 1000}, "tags": ["test"]},
        }
    ]
    for s in range(steps):
        m = {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in metrics_at(s).items()}
        lines.append(
            {
                "v": 1,
                "run": run_id,
                "kind": "metrics",
                "step": s,
                "t": t0 + s + 1,
                "host": 0,
                "seq": s + 1,
                "data": m,
            }
        )
    with open(d / "events.0.jsonl", "w") as f:
        f.writelines(json.dumps(x) + "\n" for x in lines)


def make_store(tmp: Path) -> tuple[Path, Path]:
    """(runs_dir, db) with the three runs ingested by the real ingester."""
    runs_dir, db = tmp / "runs", tmp / "store.duckdb"
    write_run(runs_dir, "base-run", range(BASE_STEPS))
    write_findings(runs_dir)
    write_run(runs_dir, "fork-run", range(61, 100), parent={"run": "base-run", "step": 60}, lr=1.5e-4)
    write_crashed(runs_dir, "crashed-run", 30, age_s=3600)
    ingest(runs_dir, db, emit=None)
    return runs_dir, db


def age_run(runs_dir: Path, run: str, seconds: float) -> None:
    """Make a run's files look `seconds` old (a writer that went silent)."""
    t = time.time() - seconds
    for f in (runs_dir / run).glob("events.*.jsonl"):
        os.utime(f, (t, t))


@contextmanager
def growing_run(runs_dir: Path, db: Path, run_id: str, every_s: float = 0.25) -> Iterator[threading.Event]:
    """`run_id`, which a writer thread appends a step to every `every_s` while `ingest --follow` runs: yields
    the event that stops the writer (which then ends the run); writer and follower are stopped after."""
    stop_ev = threading.Event()
    run = observatory.init(
        run_id=run_id, config={"steps": 100_000}, runs_dir=runs_dir, install_signal_handlers=False
    )

    def write():
        step = 0
        while not stop_ev.is_set():
            run.log(metrics_at(step % 200), step=step)
            run.log_expert_load(step, 0, [10, 20, 30, 40], [0, 0, 1, 5])
            step += 1
            stop_ev.wait(every_s)
        run.finish("completed", final_step=step - 1)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(1.0)
    ingest(runs_dir, db, emit=None)  # the run is in the store before a page opens
    stop_follower = threading.Event()
    follower = threading.Thread(
        target=ingest,
        args=(runs_dir, db),
        kwargs={"follow": True, "stop_event": stop_follower, "emit": None},
        daemon=True,
    )
    follower.start()
    try:
        yield stop_ev
    finally:
        stop_ev.set()
        writer.join(10)
        stop_follower.set()
        follower.join(30)


def page(name: str, **query):
    """The dashboard page `name` (observatory.dashboard.pages), run once under Streamlit's AppTest with
    `query` as its URL's query parameters."""
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=PAGE_TIMEOUT_S
    )
    for k, v in query.items():
        at.query_params[k] = v
    return at.run()


def chart_specs(at) -> list[dict]:
    """The figures an AppTest run drew: `st.plotly_chart`'s specs, then the Live page's in-place charts'
    (`dashboard.live_chart`, a v2 component whose data holds the figure), each in page order."""
    out = []
    for el in at.get("plotly_chart") + at.get("bidi_component"):
        if el.type == "plotly_chart":
            out.append(json.loads(el.proto.spec))
        elif el.proto.component_name == "observatory_live_chart":
            out.append(json.loads(el.proto.json)["figure"])
    return out
