"""The Health page's queries at 1,000 hosts, and the alert rules' reads, on a store of a long many-host run.

The target (issue "Operate the hero run"): the Health page at 1,000 hosts x 100k steps answers within
500 ms of queries, like every other page. The store holds one run whose `hosts` processes each sent a
heartbeat every `every_s` seconds for `steps` steps of `step_s` seconds (100k steps of 1 s at 30 s: 3,334
heartbeats a host, 3.3M heartbeats and 20M host_telemetry rows at 1,000 hosts), made by DuckDB from
range() generators (as bench/gen_store.py makes its rows): ingesting 3.3M heartbeat lines would measure
ingest, which bench_ingest does. Side by side in one run: the page's batch (`health_view`) for the step-time
matrix and for a telemetry name, one host's series, and one evaluation of every alert rule (the follower's
clock tick) over the run.

    nice .venv/bin/python bench/bench_health.py                       # 1,000 hosts x 100k steps
    nice .venv/bin/python bench/bench_health.py --hosts 200 --steps 20000
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import duckdb

from observatory import store
from observatory.alerts import conditions, rules
from observatory.queries import health as qh
from observatory.store import using

NAMES = qh.SUMMARY_NAMES  # the host telemetry the Health page summarizes


def build(db: Path, hosts: int, steps: int, step_s: float, every_s: float) -> float:
    t0 = time.perf_counter()
    with duckdb.connect(str(db)) as con:
        store.ensure_schema(con)
        beats = int(steps * step_s / every_s) + 1
        start = time.time() - steps * step_s
        con.execute(
            """INSERT INTO runs (run, name, status, start_time, last_event_t, last_step)
               VALUES ('pod', 'pod', 'running', $s, $e, $n)""",
            {"s": start, "e": start + steps * step_s, "n": steps},
        )
        con.execute(
            """
            INSERT INTO heartbeats
            SELECT 'pod', h, k, $s + k * $every + h * 0.001, CAST(k * $every / $step_s AS BIGINT), 'train'
            FROM range($beats) b(k), range($hosts) r(h) ORDER BY k, h  -- in time order, as ingest appends them
            """,
            {"s": start, "every": every_s, "step_s": step_s, "hosts": hosts, "beats": beats},
        )
        con.execute(
            """
            INSERT INTO host_telemetry
            SELECT run, host, t, n.name,
                   CASE n.name WHEN 'accel/0/hbm_limit_bytes' THEN 80e9 WHEN 'accel/0/hbm_used_bytes' THEN 60e9
                               ELSE 50 + (hash(host, seq, n.name) % 1000) / 20.0 END
            FROM heartbeats, (SELECT unnest($names::VARCHAR[]) AS name) n ORDER BY t, host, n.name
            """,
            {"names": list(NAMES)},
        )
        con.execute("CHECKPOINT")
    return time.perf_counter() - t0


def timed(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--step-s", type=float, default=1.0)
    ap.add_argument("--every-s", type=float, default=30.0, help="heartbeat_s")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--db", type=Path, help="keep the store here (default: a temp dir)")
    a = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = a.db or Path(tmp.name) / "health.duckdb"
    if not db.exists():
        built = build(db, a.hosts, a.steps, a.step_s, a.every_s)
        print(
            f"built {db}: {a.hosts} hosts x {a.steps:,} steps, heartbeat every {a.every_s:g} s, in {built:.1f} s"
        )
    with duckdb.connect(str(db), read_only=True) as con:
        n_beats, n_tm = con.execute(
            "SELECT (SELECT count(*) FROM heartbeats), (SELECT count(*) FROM host_telemetry)"
        ).fetchone()
    print(f"heartbeats {n_beats:,} rows, host_telemetry {n_tm:,} rows")
    rule_set = rules.Rules(list(rules.DEFAULT_RULES))
    with using(db) as con:  # one connection, as a page batch or a clock tick has
        cases = {
            "Health page: seconds-per-step matrix + hosts": lambda: qh.health_view(con, "pod", qh.STEP_TIME),
            "Health page: a telemetry name's matrix + hosts": lambda: qh.health_view(
                con, "pod", "system/rss_bytes"
            ),
            "Health page: one host's every name": lambda: qh.host_series(con, "pod", a.hosts // 2),
            "alerts: every rule over the run (a clock tick)": lambda: conditions.firing(
                con, rule_set, conditions.live_runs(con, time.time()), time.time()
            ),
        }
        for name, fn in cases.items():
            print(f"{name:<50} {1000 * timed(fn, a.repeats):8.0f} ms (median of {a.repeats})")
    print("target: each Health page batch <= 500 ms of queries")


if __name__ == "__main__":
    main()
