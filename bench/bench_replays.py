"""What marking replayed steps (`observatory.store.replays.mark`) costs a batch, beside the batch's rollups.

A store with one big run (`--steps` x `--names` metric rows) and `--runs` small runs; then a batch of new
rows, once a run logging forward (the normal case: no replay) and once a resumed attempt that logs again
the last `--replay` steps. Prints, for each, the seconds of `mark` alone and of the whole
`rollups.after_ingest` (which includes it), measured side by side on the same store.

    python bench/bench_replays.py --steps 100000 --names 30 --runs 10000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import duckdb

from observatory.store import ensure_schema, replays, rollups


def fill(con, run: str, lo: int, hi: int, names: int, t0: float, host: int = 0) -> None:
    con.execute(
        f"""INSERT INTO metrics (run, step, name, value, t, host)
            SELECT '{run}', s.range, 'm/' || n.range, 1.0 + 0.001 * s.range + n.range, {t0} + s.range, {host}
            FROM range({lo}, {hi}) s, range({names}) n ORDER BY s.range, n.range"""
    )


def timed(db: Path, batch, mark_only: bool) -> float:
    con = duckdb.connect(str(db))
    con.execute("BEGIN")
    start = rollups._state(con, "metrics")[0]
    batch(con)
    t = time.perf_counter()
    if mark_only:
        old = replays.mark(con, start)
        if old:
            con.execute(f"DROP TABLE {old}")
    else:
        rollups.after_ingest(con, {"metrics": {"*"}})
    dt = time.perf_counter() - t
    con.execute("ROLLBACK")
    con.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--names", type=int, default=30)
    ap.add_argument("--runs", type=int, default=10_000, help="small runs of 20 steps beside the big one")
    ap.add_argument("--batch", type=int, default=1000, help="steps of the big run in the new batch")
    ap.add_argument("--replay", type=int, default=35, help="steps a resumed attempt logs again")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "store.duckdb"
        con = duckdb.connect(str(db))
        ensure_schema(con)
        fill(con, "big", 0, a.steps, a.names, 1e9)
        con.execute(
            f"""INSERT INTO metrics (run, step, name, value, t, host)
                SELECT 'small-' || r.range, s.range, 'm/' || n.range, 1.0, 1e9 + s.range, 0
                FROM range({a.runs}) r, range(20) s, range({min(a.names, 5)}) n ORDER BY 1, 2"""
        )
        con.execute("BEGIN")
        rollups.rebuild_rollups(con)
        con.execute("COMMIT")
        n = con.execute("SELECT count(*) FROM metrics").fetchall()[0][0]
        con.close()
        print(f"store: {n:,} metric rows ({a.runs:,} small runs beside a {a.steps:,}-step run)")
        cases = {
            "forward (no replay)": lambda c: fill(c, "big", a.steps, a.steps + a.batch, a.names, 2e9),
            f"resume replaying {a.replay} steps": lambda c: fill(
                c, "big", a.steps - a.replay, a.steps - a.replay + a.batch, a.names, 2e9
            ),
            "a small run's resume replaying 10 steps": lambda c: fill(
                c, f"small-{a.runs // 2}", 10, 40, 5, 2e9
            ),
        }
        for what, batch in cases.items():
            rows = a.batch * a.names if "small" not in what else 30 * 5
            mark = min(timed(db, batch, True) for _ in range(5))
            total = min(timed(db, batch, False) for _ in range(5))
            print(
                f"{what}: batch of {rows:,} rows: mark {mark * 1e3:.1f} ms of the rollups' {total * 1e3:.1f} ms "
                f"({mark / total:.0%})"
            )


if __name__ == "__main__":
    main()
