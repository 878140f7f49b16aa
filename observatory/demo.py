"""`make demo`: the sample ladder, a live training run, the ingester and the dashboard, together.

1. Seed the runs dir with the committed sample runs (data/samples: a scaling ladder,
   its forecast and a target run, and a simulated iso-FLOP grid with a variant of it),
   unless they are there already.
2. Ingest everything once, so the dashboard has history from its first second.
3. Start, as child processes: a real training run (`trainer train`, config tiny.yaml
   with `OBSERVATORY_DEMO_STEPS` steps, default 30000: about 25 minutes on 2 CPU cores),
   the follower (`observatory ingest --follow`) and the dashboard (`streamlit run app.py`).
   When a training run ends, the next one starts (`demo-<time>`), so something is always
   training; the Live page draws each run against the previous one (same name and steps).
4. Once the dashboard answers, print a few lines (the Sweeps page on the iso-FLOP grid among them), the URL last (the follower's and the dashboard's
   own output go to log files in the runs dir); Ctrl-C stops them all.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlencode

from observatory import bucket, settings

DEFAULT_STEPS = 30000  # ~25 min at ~20 steps/s on a shared 2-core CPU
# a long run logs evals and checkpoints less often than tiny.yaml's 40 and 50 steps
LONG_RUN = ("eval.every=500", "checkpoint.every=2000")
ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "data" / "samples"


def isoflop_view(ladder: str, variant: str) -> dict[str, str]:
    """The Sweeps page's query for the iso-FLOP view of `ladder`'s grid: the fit per budget over tokens, and
    the compute multiplier of the `variant` ladder's grid at 1e19 FLOPs."""
    return {
        "sel": f"ladder = {ladder}",
        "metric": "eval:eval",
        "by": "config.budget",
        "x": "tokens",
        "rows": "config.budget",
        "cols": "config.model.width",
        "key": "config.model.width",
        "color": "config.budget",
        "budget": "1e19",
        "var": f"ladder = {variant}",
    }


# the Sweeps page on the samples' iso-FLOP grids (data/samples/sweep-isoflop*)
SWEEPS_QUERY = urlencode(isoflop_view("sweep-isoflop", "sweep-isoflop-var"))


def seed_samples(runs_dir: Path, samples: Path = SAMPLES) -> int:
    """Copy the sample runs' event logs (`samples`: data/samples) into the runs dir; returns how many runs
    were added or updated. Their findings are signed with the sample key, which `trusted_keys` trusts.

    A sample file that is missing from the runs dir, or there with another size (the samples
    gained events, e.g. decision records), is copied; ingest reads a changed `.gz` again and
    skips the events it already has.
    """
    changed = 0
    if not samples.is_dir():
        return 0
    for run_dir in sorted(p for p in samples.iterdir() if p.is_dir()):
        dest = runs_dir / run_dir.name
        dest.mkdir(parents=True, exist_ok=True)
        copied = False
        for f in sorted(run_dir.glob("events.*.jsonl*")):
            target = dest / f.name
            if not target.exists() or target.stat().st_size != f.stat().st_size:
                shutil.copy2(f, target)
                copied = True
        changed += copied
    return changed


def _trainer(bin_dir: Path, runs_dir: Path, run_id: str, steps: str, env: dict) -> subprocess.Popen:
    """One demo training run (tiny.yaml, `steps` steps) as a child process; its stderr goes to a log."""
    return subprocess.Popen(
        [
            bin_dir / "trainer",
            "train",
            "--config",
            str(ROOT / "trainer" / "configs" / "tiny.yaml"),
            "--run-id",
            run_id,
            f"steps={steps}",
            *LONG_RUN,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(runs_dir / f"{run_id}.trainer.log", "w"),
    )


def _wait_healthy(port: int, dashboard: subprocess.Popen, seconds: float = 120.0) -> None:
    """Until the dashboard answers its health check (so the URL printed last works when clicked)."""
    import urllib.request

    deadline = time.time() + seconds
    while time.time() < deadline and dashboard.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return
        except OSError:
            time.sleep(0.5)


def _stop(signum, frame):
    raise KeyboardInterrupt


def _sql_hint(db: Path) -> str:
    """A query of the demo's store that works in a new shell: this venv's `observatory` (by its absolute
    path when the venv is not active) and the store named when it is not the default one."""
    flag = (
        ""
        if Path(db).resolve() == Path(settings.default("db")).resolve()
        else f" --db {shlex.quote(str(db))}"
    )
    return f"{settings.cli_command()} sql{flag} 'SELECT * FROM latest_metrics LIMIT 10'"


def main() -> int:
    if bucket.is_url(settings.get("runs")):
        print("demo: OBSERVATORY_RUNS is a bucket; the demo needs a local folder", file=sys.stderr)
        return 2
    runs_dir = Path(settings.get("runs"))
    db = Path(settings.get("db"))
    port = int(os.environ.get("OBSERVATORY_PORT", "8501"))
    steps = os.environ.get("OBSERVATORY_DEMO_STEPS", str(DEFAULT_STEPS))
    runs_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "OBSERVATORY_RUNS": str(runs_dir), "OBSERVATORY_DB": str(db)}

    n = seed_samples(runs_dir)
    print(f"demo: {n} sample runs copied or updated in {runs_dir}" if n else f"demo: runs dir {runs_dir}")
    subprocess.run([bin_dir / "observatory", "ingest", "-q"], env=env, check=True)  # one summary line

    # SIGTERM (a service manager, `kill`) stops the children too, like Ctrl-C does
    signal.signal(signal.SIGTERM, _stop)
    run_id = "demo-" + time.strftime("%Y%m%d-%H%M%S")
    logs = {name: runs_dir / f"demo.{name}.log" for name in ("ingest", "dashboard")}
    procs = {
        "trainer": _trainer(bin_dir, runs_dir, run_id, steps, env),
        "ingest": subprocess.Popen(
            [bin_dir / "observatory", "ingest", "--follow"],
            env=env,
            stdout=open(logs["ingest"], "w"),
            stderr=subprocess.STDOUT,
        ),
        "dashboard": subprocess.Popen(
            [bin_dir / "observatory", "dashboard", "--port", str(port)],
            env=env,
            stdout=open(logs["dashboard"], "w"),
            stderr=subprocess.STDOUT,
        ),
    }
    _wait_healthy(port, procs["dashboard"])
    print(
        f"  Live run:   {run_id}, {steps} steps; the next starts when it ends (OBSERVATORY_DEMO_STEPS)\n"
        f"  Logs:       {runs_dir}/{run_id}.trainer.log, demo.ingest.log, demo.dashboard.log\n"
        f"  Store:      {db}   try: {_sql_hint(db)}\n"
        "  Ctrl-C stops the demo.\n\n"
        f"  Iso-FLOP:   http://localhost:{port}/sweeps?{SWEEPS_QUERY}  (the samples' simulated grid)\n"
        f"  Dashboard:  http://localhost:{port}/live?run={run_id}",
        flush=True,
    )
    failed = False
    try:
        while True:
            time.sleep(1)
            for name in ("ingest", "dashboard"):
                if procs[name].poll() is not None:
                    print(
                        f"demo: {name} exited with {procs[name].returncode}; see {logs[name]}",
                        file=sys.stderr,
                    )
                    return 1
            rc = procs["trainer"].poll()
            if rc is not None and rc != 0 and not failed:
                failed = True  # no restart loop on a trainer that cannot run; the rest stays up
                print(
                    f"demo: trainer exited with {rc}; see {runs_dir / (run_id + '.trainer.log')}",
                    file=sys.stderr,
                )
            elif rc == 0:
                time.sleep(1)  # the next run id is a second later
                run_id = "demo-" + time.strftime("%Y%m%d-%H%M%S")
                print(f"demo: next live run {run_id}: http://localhost:{port}/live?run={run_id}", flush=True)
                procs["trainer"] = _trainer(bin_dir, runs_dir, run_id, steps, env)
    except KeyboardInterrupt:
        pass
    finally:
        _shut_down(procs.values())
    return 0


def _shut_down(procs) -> None:
    """SIGTERM to each process, then up to 20 s each to finish; a second Ctrl-C (or SIGTERM) meanwhile kills
    them at once instead of leaving a traceback and the processes behind."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    try:
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
    except KeyboardInterrupt:
        for p in procs:
            if p.poll() is None:
                p.kill()


if __name__ == "__main__":
    sys.exit(main())
