"""The fault matrix of a public store (issue 16, part 5): each fault, recovered or not, events lost.

Runs the scenarios of tests/test_faults.py (their helpers, `tests/faults.py`) once each and
prints one row per fault: whether the store ended identical to a clean ingest of the same
logs (`recovered`), how many rows it lacks or has twice (`lost`), the clear message the
ingester gave and, for hostile lines, the child's peak RSS.

    python bench/bench_public_faults.py [--kills 10]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import faults  # noqa: E402  (after the sys.path line)

from observatory.pipeline import ingest  # noqa: E402


def _lost(db: Path, clean: Path) -> int:
    """Rows the store lacks (or has twice) against the clean one, over every table ingest fills."""
    a, b = faults.dump(db), faults.dump(clean)
    return sum(abs(len(set(b[t]) ^ set(a[t]))) + abs(len(a[t]) - len(set(a[t]))) for t in a)


def _stop(p) -> None:
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        p.wait(30)


def sigkill(tmp: Path, runs: Path, clean: Path, kills: int) -> tuple[int, str]:
    db, rng = tmp / "killed.duckdb", random.Random(16)
    for i in range(kills):
        p = faults.child(
            runs, db, True, SMALL_BATCHES=32 << 10, IN_TX_SLEEP_S=0.1, OBSERVATORY_MAX_LINE_BYTES=16 << 10
        )
        if i % 2 == 0:
            faults.read_until(p, "IN_TX", rng.randint(1, 3), 30)
        else:
            time.sleep(rng.uniform(0.3, 2.5))
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    ingest(runs, db, hooks=False, emit=None)
    return _lost(db, clean), f"{kills} kills, half inside a transaction"


def full_disk(tmp: Path, runs: Path, clean: Path) -> tuple[int, str]:
    db = tmp / "full.duckdb"
    p = faults.child(runs, db, True, FSIZE_LIMIT=1 << 20, SMALL_BATCHES=256 << 10)
    try:
        said = faults.read_until(p, f"MSG observatory ingest: {db}: cannot write", 1, 120) or "(nothing said)"
        faults.fsize_unlimited(p.pid)
        faults.read_until(p, "MSG", 1, 120)
        faults.wait_for(lambda: _quiet_lost(db, clean) == 0, timeout=120, every=1.0)
    finally:
        _stop(p)
    return _lost(db, clean), said.split(": cannot write the store: ")[-1].split(" (")[0]


def _quiet_lost(db, clean) -> int:
    try:
        return _lost(db, clean)
    except Exception:
        return -1


def replaced(tmp: Path, runs: Path, clean: Path) -> tuple[int, str]:
    db = tmp / "replaced.duckdb"
    p = faults.child(runs, db, True, SMALL_BATCHES=128 << 10)
    try:
        faults.wait_for(lambda: db.exists() and os.path.getsize(db) > 0, timeout=60)
        time.sleep(1.0)
        snap = tmp / "snap.duckdb"
        ingest(runs / "run0", snap, hooks=False, emit=None)
        os.replace(snap, db)
        faults.wait_for(lambda: _quiet_lost(db, clean) == 0, timeout=120, every=1.0)
    finally:
        _stop(p)
    return _lost(db, clean), "replaced by another store; caught up"


def truncated(tmp: Path, runs: Path, clean: Path) -> tuple[int, str]:
    db, msgs = tmp / "trunc.duckdb", []
    path = runs / "run1" / "events.0.jsonl"
    text = path.read_text()
    ingest(runs, db, hooks=False, emit=None)
    path.write_text("".join(text.splitlines(keepends=True)[:100]))
    ingest(runs, db, hooks=False, emit=msgs.append)
    path.write_text(text)  # rewritten whole: the writer restarted and rewrote it
    ingest(runs, db, hooks=False, emit=msgs.append)
    said = next((m for m in msgs if "shrank" in m), "(nothing said)")
    return _lost(db, clean), said.split(": ", 1)[-1][:60] + "..."


def two_followers(tmp: Path, runs: Path, clean: Path) -> tuple[int, str]:
    db = tmp / "two.duckdb"
    first = faults.child(runs, db, True)
    second = None
    try:
        mark = db.with_name(db.name + ".follower")
        faults.wait_for(lambda: mark.exists() and "pid" in mark.read_text(), timeout=60)
        second = faults.child(runs, db, True)
        said = faults.read_until(second, "MSG", 1, 60) or "(nothing said)"
        _stop(first)
        faults.read_until(second, "MSG", 1, 60)
        faults.wait_for(lambda: _quiet_lost(db, clean) == 0, timeout=120, every=1.0)
    finally:
        for p in (first, second):
            if p is not None:
                _stop(p)
    return _lost(db, clean), said.split(" is ", 1)[-1].split(";")[0]


def hostile(tmp: Path) -> tuple[int, str]:
    runs, db = tmp / "hostile-runs", tmp / "hostile.duckdb"
    event = faults.event
    for name, raw in (
        ("dotdot", event("../etc", "metrics", {"x": 1.0}, 1, 1)),
        ("deep", '{"v":1,"run":"deep","kind":"note","data":' + "[" * 10_000 + "]" * 10_000 + "}"),
        ("keys", event("keys", "metrics", {f"k{i}": 1.0 for i in range(1_000_000)}, 1, 1)),
    ):
        (runs / name).mkdir(parents=True)
        good = [event(name, "metrics", {"x": float(s)}, s, s) for s in (0, 2)]
        (runs / name / "events.0.jsonl").write_text(f"{good[0]}\n{raw}\n{good[1]}\n")
    _, peak = faults.run_once_measured(runs, db)
    # the good lines around each hostile one
    got = len([r for r in faults.dump(db)["metrics"] if r[2] == "x"])
    return 6 - got, f"../, 10k-deep, 1M keys: rejected with reasons; peak RSS {peak / 2**20:.0f} MB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=10)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        runs = tmp / "runs"
        faults.write_runs(runs)
        clean = faults.clean_store(runs, tmp / "clean.duckdb")
        rows = [
            ("SIGKILL of ingest --follow", *sigkill(tmp, runs, clean, args.kills)),
            ("full disk (RLIMIT_FSIZE)", *full_disk(tmp, runs, clean)),
            ("store replaced mid-follow", *replaced(tmp, runs, clean)),
            ("log truncated, rewritten", *truncated(tmp, runs, clean)),
            ("two followers", *two_followers(tmp, runs, clean)),
            ("hostile lines", *hostile(tmp)),
        ]
    print(f"{'fault':30} {'recovered':>9} {'lost':>6}  what it said / did")
    for name, lost, note in rows:
        print(f"{name:30} {'yes' if lost == 0 else 'NO':>9} {lost:>6}  {note}")


if __name__ == "__main__":
    main()
