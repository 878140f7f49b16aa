"""End to end: log 200k points, then read one metric's history back, per tool, same data.

Each tool runs in a process of its own: it imports the tool and starts a run (not timed), then,
timed from the first log call to having the metric's history in memory:

- log `--steps` steps of the same `--metrics` scalars (default 20,000 x 10 = 200k points),
  one `log` call per step, W&B style (`step=None`, or the tool's own step argument), then
  finish the run (each tool's own flush: what must happen before another process can read);
- read one metric's history (`train/loss`, every step) as a tool's user reads it:
  - Observatory: `import observatory as wandb` to log; `observatory.pipeline.ingest(runs, db)`
    (imported inside the timing: logging does not import it) then `metric_series` on the store,
    the path `observatory ingest` + a query takes;
  - trackio: its local SQLite store (`SQLiteStorage.get_metric_values`);
  - MLflow (sqlite backend, async logging on: its fastest mode): `MlflowClient().get_metric_history`;
  - wandb offline: wandb 0.31 ships no reader for its offline `.wandb` files (only `wandb sync`
    to a server reads them; the old Python DataStore is gone), so 'read' is: scan the file's
    records (our LevelDB-log framing, `observatory.interop.wandb_reader`, faster than W&B's old
    reader) and decode each with W&B's own protobuf classes, keeping the metric's history items;
  - tensorboardX: TensorBoard's `EventAccumulator` (its own reader) on the event file.

Every tool's history is checked: all steps, the values logged. Printed: seconds (log, read,
total), points/s end to end, and each tool's time as a multiple of Observatory's. Tools
alternate in each of `--repeats` rounds (the machine is shared and noisy); medians reported.
A tool whose first round takes longer than `--slow-s` (MLflow: minutes) runs once.

    python bench/bench_e2e.py [--steps 20000] [--metrics 10] [--repeats 3] [--slow-s 30] [--only observatory,trackio]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from peers import NAMES, version
from procs import child_result

TOOLS = {
    "observatory": "Observatory (log, ingest, query)",
    "observatory-log": "Observatory, logging only",
    "trackio": "trackio (local SQLite)",
    "wandb": "wandb offline",
    "mlflow": "MLflow (sqlite backend)",
    "tensorboardX": "tensorboardX",
}
METRIC = "train/loss"


def _payloads(steps: int, n: int) -> list[dict[str, float]]:
    names = (NAMES + [f"extra/m{i}" for i in range(max(0, n - len(NAMES)))])[:n]
    # a loss curve with noise, and smooth curves for the rest (the detectors see a healthy run)
    out = []
    for i in range(steps):
        d = {k: 1.0 + 0.001 * j + 1.0 / (1 + i * 1e-3) for j, k in enumerate(names)}
        d[METRIC] = 2.0 + 6.0 * (i + 10) ** -0.5 + 0.01 * ((i * 7919) % 13) / 13
        out.append(d)
    return out


# ------------------------------------------------------------------ tools
# Each: start(tmp) -> (log(d, i), finish(), read() -> (steps, values)).


def _observatory(tmp: Path, read: bool):
    import observatory as wandb

    runs, db = tmp / "runs", tmp / "store.duckdb"
    run = wandb.init(project="bench", id="e2e", dir=runs, install_signal_handlers=False)

    def read_back():
        from observatory.pipeline import ingest  # the reader's own import: logging does not load it
        from observatory.queries.core import metric_series
        from observatory.store import connect

        ingest(runs, db, emit=None)
        with connect(db) as con:
            s = metric_series(con, "e2e", METRIC)
        return s["step"], s["value"]

    return (lambda d, i: run.log(d)), run.finish, (read_back if read else None)


def _trackio(tmp: Path, read: bool):
    os.environ["TRACKIO_DIR"] = str(tmp)
    import trackio
    from trackio.sqlite_storage import SQLiteStorage

    trackio.init(project="bench", name="e2e", embed=False)

    def read_back():
        rows = SQLiteStorage.get_metric_values("bench", "e2e", METRIC)
        return [r["step"] for r in rows], [r["value"] for r in rows]

    return (lambda d, i: trackio.log(d)), trackio.finish, read_back


def _wandb(tmp: Path, read: bool):
    os.environ.update(WANDB_SILENT="true", WANDB_MODE="offline", WANDB_DIR=str(tmp))
    import wandb

    run = wandb.init(project="bench", mode="offline", dir=str(tmp))

    def read_back():
        from wandb.proto import wandb_internal_pb2 as pb

        from observatory.interop.wandb_reader import WandbLogReader

        (path,) = tmp.glob("wandb/offline-run-*/run-*.wandb")
        steps, values = [], []
        rec = pb.Record()
        for _, payload in WandbLogReader(path):
            rec.ParseFromString(payload)
            if rec.WhichOneof("record_type") != "history":
                continue
            step = value = None
            for item in rec.history.item:
                key = item.key or "/".join(item.nested_key)  # wandb 0.31 writes nested_key
                if key == "_step":
                    step = int(json.loads(item.value_json))
                elif key == METRIC:
                    value = float(json.loads(item.value_json))
            if value is not None:
                steps.append(step)
                values.append(value)
        return steps, values

    return (lambda d, i: run.log(d)), run.finish, read_back


def _mlflow(tmp: Path, read: bool):
    import mlflow
    from mlflow.tracking import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.ERROR)
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    mlflow.config.enable_async_logging(True)  # MLflow's fastest documented mode (end_run waits for it)
    mlflow.set_experiment("bench")
    run = mlflow.start_run(run_name="e2e")
    rid = run.info.run_id

    def read_back():
        hist = MlflowClient(tracking_uri=uri).get_metric_history(rid, METRIC)
        hist.sort(key=lambda m: m.step)
        return [m.step for m in hist], [m.value for m in hist]

    return (lambda d, i: mlflow.log_metrics(d, step=i)), mlflow.end_run, read_back


def _tensorboardx(tmp: Path, read: bool):
    from tensorboardX import SummaryWriter

    w = SummaryWriter(logdir=str(tmp / "tb"))

    def log(d, i):
        for k, v in d.items():
            w.add_scalar(k, v, i)

    def read_back():
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        acc = EventAccumulator(str(tmp / "tb"), size_guidance={"scalars": 0})
        acc.Reload()
        ev = acc.Scalars(METRIC)
        return [e.step for e in ev], [e.value for e in ev]

    return log, w.close, read_back


START = {
    "observatory": _observatory,
    "observatory-log": _observatory,
    "trackio": _trackio,
    "wandb": _wandb,
    "mlflow": _mlflow,
    "tensorboardX": _tensorboardx,
}


def child(tool: str, steps: int, n_metrics: int) -> dict:
    payloads = _payloads(steps, n_metrics)
    with tempfile.TemporaryDirectory() as d:
        try:
            log, finish, read = START[tool](Path(d), tool != "observatory-log")
        except ImportError as e:
            return {"tool": tool, "missing": str(e)}
        t0 = time.perf_counter()
        for i, p in enumerate(payloads):
            log(p, i)
        finish()
        t1 = time.perf_counter()
        got_steps, got = read() if read else ([], [])
        t2 = time.perf_counter()
    if read:
        want = [p[METRIC] for p in payloads]
        ok = list(got_steps) == list(range(steps)) and all(
            abs(a - b) <= 1e-6 * abs(b) for a, b in zip(got, want, strict=True)
        )
        if not ok:
            return {
                "tool": tool,
                "missing": f"history wrong: {len(got)} points, steps {list(got_steps)[:3]}...",
            }
    return {
        "tool": tool,
        "log_s": t1 - t0,
        "read_s": t2 - t1,
        "total_s": t2 - t0,
        "points": steps * n_metrics,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--metrics", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--slow-s", type=float, default=30.0, help="a tool slower than this in round 1 runs once")
    ap.add_argument("--only", default=",".join(TOOLS), help="comma-separated tools: " + ", ".join(TOOLS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.metrics)))
        return
    tools = args.only.split(",")
    runs: dict[str, list[dict]] = {t: [] for t in tools}
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH")])
        ),
    }
    for rnd in range(args.repeats):
        order = tools if rnd % 2 == 0 else tools[::-1]  # alternate, side by side
        for tool in order:
            if rnd and all(r.get("total_s", 0) > args.slow_s for r in runs[tool]):
                continue
            steps = ["--steps", str(args.steps), "--metrics", str(args.metrics)]
            r = child_result(__file__, tool, steps, timeout=3600, env=env)
            runs[tool].append(r)
            print(
                f"  round {rnd + 1} {tool}: " + (f"{r['total_s']:.2f} s" if "total_s" in r else r["missing"]),
                file=sys.stderr,
            )
    med = {}
    for tool, rs in runs.items():
        ok = [r for r in rs if "total_s" in r]
        med[tool] = (
            {k: statistics.median(r[k] for r in ok) for k in ("log_s", "read_s", "total_s")}
            if ok
            else {"missing": rs[-1]["missing"]}
        )
    points = args.steps * args.metrics
    base = med.get("observatory", {}).get("total_s")
    print(
        f"log {points:,} points ({args.steps:,} steps x {args.metrics} metrics, one log call per step), then read "
        f"{METRIC}'s {args.steps:,}-point history; median of {args.repeats}, first log call to history in memory"
    )
    print(
        f"{'tool':36} {'version':>9} {'log':>8} {'read':>8} {'total':>8} {'points/s':>10} {'÷ Observatory':>14} runs"
    )
    for tool in tools:
        m = med[tool]
        if "missing" in m:
            print(f"{TOOLS[tool]:36} {version(tool):>9}  {m['missing']}")
            continue
        ratio = f"{m['total_s'] / base:.1f}×" if base and tool != "observatory" else ""
        print(
            f"{TOOLS[tool]:36} {version(tool):>9} {m['log_s']:7.2f}s {m['read_s']:7.2f}s {m['total_s']:7.2f}s "
            f"{points / m['total_s'] / 1000:9.1f}k {ratio:>14} {sum('total_s' in r for r in runs[tool]):4}"
        )


if __name__ == "__main__":
    main()
