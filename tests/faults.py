"""Fault scenarios for `ingest`, shared by tests/test_faults.py and bench/bench_public_faults.py.

Each scenario runs the real ingester (in a child process where it is killed, limited or
measured) against a runs dir it breaks in one way, then compares the store with a clean
ingest of the same logs: `same_store` is the one definition of "nothing lost, nothing
corrupt" (every row of every table that ingest fills, ingest-time columns left out).
"""

from __future__ import annotations

import json
import os
import resource
import select
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]

# What a clean ingest and a recovered one must agree on (ingested_at, the wall time of ingest, aside).
TABLES = {
    "runs": "SELECT * EXCLUDE (status) FROM runs ORDER BY run",
    "metrics": "SELECT run, step, name, value, t, host FROM metrics ORDER BY ALL",
    "expert_load": "SELECT * FROM expert_load ORDER BY ALL",
    "events": "SELECT run, host, seq, kind, step, t, v, known, data::VARCHAR FROM events ORDER BY run, host, seq",
    "rejected_events": "SELECT file, run, line, field, reason, raw FROM rejected_events ORDER BY ALL",
    "ingest_files": "SELECT path, byte_offset, line, first_seq, last_seq, cursor_seq, size FROM ingest_files ORDER BY path",
}


def event(
    run: str, kind: str, data: dict, seq: int, step: int | None = None, host: int = 0, t: float | None = None
) -> str:
    return json.dumps(
        {
            "v": 1,
            "run": run,
            "kind": kind,
            "step": step,
            "t": 1.7e9 + seq if t is None else t,
            "host": host,
            "seq": seq,
            "data": data,
        },
        separators=(",", ":"),
    )


def write_runs(runs: Path, n_runs: int = 3, steps: int = 4000, experts: bool = True) -> None:
    """A few finished runs with metrics, expert loads and some events (a few MB in all)."""
    for r in range(n_runs):
        run = f"run{r}"
        lines, seq = [event(run, "run_start", {"config": {"lr": 1e-3 * (r + 1)}, "name": run}, 0)], 1
        for s in range(steps):
            lines.append(
                event(
                    run,
                    "metrics",
                    {"train/loss": 3.0 / (1 + s), "opt/lr": 1e-3, "grad/norm": 1.0 + s % 5},
                    seq,
                    s,
                )
            )
            seq += 1
            if experts and s % 4 == 0:
                lines.append(
                    event(
                        run,
                        "expert_load",
                        {"layer": 0, "routed": [s % 7, 3, 5, 1], "dropped": [0, 1, 0, 0]},
                        seq,
                        s,
                    )
                )
                seq += 1
            if s % 500 == 0:
                lines.append(event(run, "note", {"text": f"step {s}"}, seq, s))
                seq += 1
        lines.append(event(run, "run_end", {"status": "completed", "final_step": steps - 1}, seq, steps - 1))
        (runs / run).mkdir(parents=True, exist_ok=True)
        (runs / run / "events.0.jsonl").write_text("\n".join(lines) + "\n")


def dump(db: Path) -> dict[str, list]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return {t: con.execute(q).fetchall() for t, q in TABLES.items()}
    finally:
        con.close()


def same_store(a: Path, b: Path) -> dict[str, tuple[int, int]]:
    """{table: (rows in a, rows in b)} for each table that differs; {} when the stores agree."""
    da, dbb = dump(a), dump(b)
    return {t: (len(da[t]), len(dbb[t])) for t in TABLES if da[t] != dbb[t]}


def clean_store(runs: Path, db: Path) -> Path:
    from observatory.pipeline import ingest

    ingest(runs, db, hooks=False, emit=None)
    return db


# A child that ingests (following or not) with hooks off; SMALL_BATCHES makes many short transactions,
# IN_TX_SLEEP_S holds each transaction open a while (and says so on stdout) so a kill can land inside.
CHILD = textwrap.dedent(
    """
    import os, sys, time, signal, resource
    from observatory.ingest import passes
    from observatory.pipeline import ingest
    runs, db, follow = sys.argv[1], sys.argv[2], sys.argv[3] == "follow"
    if os.environ.get("SMALL_BATCHES"):
        passes.BATCH_BYTES = int(os.environ["SMALL_BATCHES"])
    sleep = float(os.environ.get("IN_TX_SLEEP_S", "0"))
    if sleep:
        orig = passes.redact_metric_names
        def slow(con, b, *rest):
            print("IN_TX", flush=True)
            time.sleep(sleep)
            return orig(con, b, *rest)
        passes.redact_metric_names = slow
    if os.environ.get("FSIZE_LIMIT"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        lim = int(os.environ["FSIZE_LIMIT"])
        resource.setrlimit(resource.RLIMIT_FSIZE, (lim, resource.RLIM_INFINITY))
    rep = ingest(runs, db, follow=follow, hooks=False, emit=lambda m: print("MSG", m, flush=True))
    print("DONE", rep.events, rep.rejected, flush=True)
    """
)


def child(runs: Path, db: Path, follow: bool, **env: str) -> subprocess.Popen:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **{k: str(v) for k, v in env.items()})
    e.setdefault("OBSERVATORY_FOLLOW_INTERVAL_S", "0.1")
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(runs), str(db), "follow" if follow else "once"],
        env=e,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def run_once_measured(runs: Path, db: Path, timeout: float = 600, **env: str) -> tuple[str, int]:
    """One non-follow ingest in a child: (its output, its peak RSS in bytes)."""
    code = (
        "import resource, subprocess, sys\n"
        "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
        "print(p.stdout + p.stderr)\n"
        "print('PEAK', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
    )
    e = dict(os.environ, PYTHONPATH=str(ROOT), **{k: str(v) for k, v in env.items()})
    out = subprocess.run(
        [sys.executable, "-c", code, sys.executable, "-c", CHILD, str(runs), str(db), "once"],
        env=e,
        capture_output=True,
        text=True,
        timeout=timeout,
    ).stdout
    peak = int(out.rsplit("PEAK", 1)[1].strip())
    return out, peak


def read_until(p: subprocess.Popen, prefix: str, n: int = 1, timeout: float = 60.0) -> str | None:
    """Read the child's output until the n-th line starting with `prefix` (returned); None at timeout or EOF."""
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        ready, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        line = p.stdout.readline()
        if not line:
            return None
        if line.startswith(prefix):
            seen += 1
            if seen == n:
                return line
    return None


def fsize_unlimited(pid: int) -> None:
    """Space returns: lift the child's file size limit from outside (root may raise it)."""
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
