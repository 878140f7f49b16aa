"""docs/architecture.md, "The rule for the store": a writer, `ingest --follow` and several SQL readers at once.

No lock error reaches anyone, no event is lost, readers see new data within 2 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from polling import wait_until

WRITER = textwrap.dedent(
    """
    import sys, time, observatory
    runs_dir, seconds = sys.argv[1], float(sys.argv[2])
    run = observatory.init(run_id="conc", runs_dir=runs_dir, config={"lr": 1e-3})
    t_end = time.time() + seconds
    step = 0
    with run:
        while time.time() < t_end:
            run.log({"train/loss": 1.0 / (step + 1), "opt/lr": 1e-3}, step=step)
            run.log_expert_load(step, 0, [step % 7, 3], [0, 1])
            print(step, time.time(), flush=True)
            step += 1
            time.sleep(0.01)
    """
)

READER = textwrap.dedent(
    """
    import sys, time, json
    from observatory.queries.user_sql import run_user_sql
    db, seconds = sys.argv[1], float(sys.argv[2])
    t_end = time.time() + seconds
    while time.time() < t_end:
        t = time.time()
        try:
            res = run_user_sql(db, "SELECT max(step) FROM metrics WHERE run = 'conc'")
            print(json.dumps([t, res.rows[0][0]]), flush=True)
        except Exception as e:
            print(json.dumps([t, "ERROR", type(e).__name__, str(e)]), flush=True)
        time.sleep(0.1)
    """
)


@pytest.mark.slow
@pytest.mark.timing
def test_writer_follower_and_readers_at_once(tmp_path):
    """Correctness must hold on every attempt; freshness (<= 2 s) on one of two.

    On a freshly installed machine the first attempt has lagged (cold page cache and
    bytecode for every import in four processes at once); the same run on a warm machine
    passes. What is judged strictly every time: no lock error, no reader error, nothing lost.
    """
    os.sync()  # pending writeback (a fresh install's venv) stalls every fsync the writer and store make
    lags = []
    for attempt in range(2):
        lag = _scenario(tmp_path / f"attempt{attempt}")
        lags.append(lag)
        if lag <= 0:
            break
    assert min(lags) <= 0, (
        f"readers lagged more than 2 s behind the writer on every attempt (by {lags} steps)"
    )


def _scenario(tmp_path: Path) -> int:
    """Writer + follower + readers for a few seconds; returns the worst reader lag in steps past 2 s."""
    tmp_path.mkdir()
    runs_dir, db = tmp_path / "runs", tmp_path / "store.duckdb"
    runs_dir.mkdir()
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "reader.py").write_text(READER)
    env = {**os.environ, "OBSERVATORY_FOLLOW_INTERVAL_S": "0.2"}
    seconds = 8.0
    obs = [sys.executable, "-m", "observatory.cli"]
    follower = subprocess.Popen(
        obs + ["ingest", "--follow", "--runs-dir", str(runs_dir), "--db", str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    writer = subprocess.Popen(
        [sys.executable, str(tmp_path / "writer.py"), str(runs_dir), str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    first = writer.stdout.readline()  # the writer is logging
    wait_until(lambda: _has_run(db), 60, every=0.1, what="the follower is up and warm")  # steady state
    readers = [
        subprocess.Popen(
            [sys.executable, str(tmp_path / "reader.py"), str(db), str(seconds + 3)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    cli_runs = [
        subprocess.run(
            obs + ["sql", "SELECT count(*) FROM metrics", "--db", str(db), "--format", "csv"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        for _ in range(2)
    ]
    w_out = first + writer.stdout.read()  # not communicate(timeout=): it would skip readline's buffer
    writer.wait(timeout=120)
    r_outs = [r.communicate(timeout=120) for r in readers]
    logged = {int(s): float(t) for s, t in (line.split() for line in w_out.split("\n") if line)}
    # wait for the follower to catch up, then stop it like a user would (Ctrl-C / SIGTERM)
    wait_until(lambda: _caught_up(db, len(logged)), 30, every=0.2, what="the follower caught up")
    follower.send_signal(signal.SIGTERM)
    f_out, f_err = follower.communicate(timeout=60)
    assert follower.returncode == 0, f_err

    for c in cli_runs:
        assert c.returncode == 0 and "lock" not in c.stderr.lower(), c.stderr
    lags, spans = [], []
    for out, err in r_outs:
        assert "Traceback" not in err, err
        samples = [json.loads(line) for line in out.splitlines()]
        spans.append((len(samples), samples[0][0] if samples else None, samples[-1][0] if samples else None))
        assert samples, "reader produced nothing"
        errors = [s for s in samples if s[1] == "ERROR"]
        assert not errors, errors[:3]
        for t_read, seen in samples:
            due = [s for s, t in logged.items() if t < t_read - 2.0]  # logged more than 2 s before the read
            if due:
                lags.append(max(due) - (seen if seen is not None else -1))
    assert len(lags) >= 3, (
        "too few reads overlapped the writer to judge freshness: the writer logged "
        f"{len(logged)} steps, t {min(logged.values(), default=0):.2f}..{max(logged.values(), default=0):.2f}; "
        f"the readers' (samples, first t, last t): {spans}"
    )
    assert "lock" not in f_err.lower() and "busy" not in f_err.lower(), f_err

    from observatory.store import connect

    with connect(db) as con:
        steps = {r[0] for r in con.execute("SELECT step FROM metrics WHERE name = 'train/loss'").fetchall()}
        status = con.execute("SELECT status FROM runs WHERE run = 'conc'").fetchall()
        n_expert = con.execute("SELECT count(*) FROM expert_load").fetchall()[0][0]
    assert steps == set(logged), "events were lost"
    assert n_expert == 2 * len(logged)
    assert status == [("completed",)]
    return max(lags)


def _has_run(db: Path) -> bool:
    from observatory.store import connect

    if not db.exists():
        return False
    with connect(db) as con:
        return con.execute("SELECT count(*) FROM metrics WHERE run = 'conc'").fetchall()[0][0] > 0


def _caught_up(db: Path, n: int) -> bool:
    from observatory.store import connect

    if not db.exists():
        return False
    with connect(db) as con:
        got = con.execute("SELECT count(*) FROM metrics WHERE name = 'train/loss'").fetchall()[0][0]
        done = con.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchall()[0][0]
    return got == n and done == 1
