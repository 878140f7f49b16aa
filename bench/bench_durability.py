"""Durability: SIGKILL a writing process (and an ingesting one) at random points.

1. Writer: a child logs ~200 events/s and prints what it logged; we SIGKILL it at a
   random moment, ingest, and compare. Goal: whatever is lost was logged in the last
   second before the kill; the store is never corrupted (every line either ingested
   or, for the torn last line, recorded as truncated).
2. Ingester: `ingest` over a multi-batch runs dir is SIGKILLed at random moments and
   restarted until it finishes. Goal: exactly once -- the same rows as one clean
   ingest, no duplicates, nothing missing.

    python bench/bench_durability.py [--kills 8]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import duckdb

WRITER = textwrap.dedent(
    """
    import sys, time, observatory
    run = observatory.init(run_id=sys.argv[2], runs_dir=sys.argv[1])
    print("ready", flush=True)
    step = 0
    while True:
        run.log({"train/loss": 1.0 / (step + 1), "opt/lr": 3e-4}, step=step)
        if step % 5 == 0:
            run.log_expert_load(step, 0, list(range(16)), [0] * 16)
        print(step, time.time(), flush=True)
        step += 1
        time.sleep(0.005)
    """
)

INGESTER = textwrap.dedent(
    """
    import sys
    import observatory.pipeline as ing
    from observatory.ingest import passes
    passes.BATCH_BYTES = 64 << 10  # many small transactions, so kills land between and inside them
    ing.ingest(sys.argv[1], sys.argv[2], hooks=False, emit=None)
    print("done", flush=True)
    """
)


def writer_kills(tmp: Path, kills: int, rng: random.Random) -> tuple[int, float, int]:
    runs, db = tmp / "runs", tmp / "w.duckdb"
    script = tmp / "writer.py"
    script.write_text(WRITER)
    from observatory.pipeline import ingest

    max_lost, max_age, bad_lines = 0, 0.0, 0
    for i in range(kills):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(runs), f"dur{i}"], stdout=subprocess.PIPE, text=True
        )
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.2, 2.0))
        proc.kill()
        t_kill = time.time()
        out, _ = proc.communicate()
        logged = {int(s): float(t) for s, t in (line.split() for line in out.splitlines())}
        rep = ingest(runs, db, hooks=False, emit=None)
        with duckdb.connect(str(db), read_only=True) as con:
            got = {
                r[0] for r in con.execute("SELECT step FROM metrics WHERE run = ?", [f"dur{i}"]).fetchall()
            }
            n_bad = con.execute(
                "SELECT count(*) FROM rejected_events WHERE run = ? AND reason NOT LIKE 'truncated%'",
                [f"dur{i}"],
            ).fetchall()[0][0]
        lost = [s for s in logged if s not in got]
        max_lost = max(max_lost, len(lost))
        if lost:
            max_age = max(max_age, t_kill - min(logged[s] for s in lost))
        bad_lines += n_bad + (rep.rejected - rep.truncated)
        print(
            f"  writer kill {i}: logged {len(logged)}, lost {len(lost)}"
            + (
                f" (oldest logged {t_kill - min(logged[s] for s in lost):.2f} s before the kill)"
                if lost
                else ""
            )
        )
    return max_lost, max_age, bad_lines


def ingester_kills(tmp: Path, kills: int, rng: random.Random) -> tuple[bool, int]:
    runs = tmp / "iruns"
    for r in range(4):
        path = runs / f"run{r}" / "events.0.jsonl"
        path.parent.mkdir(parents=True)
        with open(path, "w") as f:
            for seq in range(3000):
                ev = {
                    "v": 1,
                    "run": f"run{r}",
                    "kind": "metrics",
                    "step": seq,
                    "t": 1.7e9 + seq,
                    "host": 0,
                    "seq": seq,
                    "data": {f"m{i}": seq * 0.5 + i for i in range(20)},
                }
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
    script = tmp / "ingester.py"
    script.write_text(INGESTER)
    db, ref = tmp / "i.duckdb", tmp / "ref.duckdb"
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(script), str(runs), str(ref)], check=True, capture_output=True)
    clean_s = time.perf_counter() - t0  # the kills land within a clean ingest's time (start-up included)
    n_kills = 0
    for _ in range(kills):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(runs), str(db)], stdout=subprocess.PIPE, text=True
        )
        time.sleep(rng.uniform(0.3, 0.9) * clean_s)
        if proc.poll() is None:
            proc.kill()
            n_kills += 1
        proc.communicate()
    subprocess.run([sys.executable, str(script), str(runs), str(db)], check=True, capture_output=True)
    sql = "SELECT run, step, name, value FROM metrics ORDER BY ALL"
    with duckdb.connect(str(db), read_only=True) as a, duckdb.connect(str(ref), read_only=True) as b:
        same = a.execute(sql).fetchall() == b.execute(sql).fetchall()
        dups = a.execute("SELECT count(*) - count(DISTINCT (run, step, name)) FROM metrics").fetchall()[0][0]
        same = (
            same and dups == 0 and a.execute("SELECT count(*) FROM metrics").fetchall()[0][0] == 4 * 3000 * 20
        )
    print(
        f"  ingester: killed {n_kills} times before it finished (clean ingest {clean_s:.1f} s); final store {'identical to' if same else 'DIFFERENT from'} "
        f"a clean ingest, {dups} duplicate rows"
    )
    return same, n_kills


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        max_lost, max_age, bad = writer_kills(Path(tmp), args.kills, rng)
        same, n_kills = ingester_kills(Path(tmp), max(3, args.kills // 2), rng)
    ok = max_age <= 1.0 and bad == 0 and same
    print(
        f"writer: at most {max_lost} events lost per kill, all logged within {max_age:.2f} s of the kill; "
        f"{bad} corrupt lines. ingester: exactly-once after {n_kills} kills: {same}"
    )
    print(
        f"| durability under SIGKILL | writer: lost only events logged <= {max_age:.2f} s before the kill "
        f"(max {max_lost}/kill, {args.kills} kills), {bad} corrupt lines; ingest killed {n_kills}x: "
        f"{'exactly once' if same else 'NOT exactly once'} | <= 1 s lost, never corrupt | python bench/bench_durability.py |"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
