"""Ingest throughput: metric values per second into DuckDB, side by side with plain DuckDB.

Both sides load the same event log into a fresh store file:

- observatory: `observatory.ingest.ingest` (every line validated, offsets, runs table,
  exactly-once bookkeeping), without the dashboard/anomaly hooks;
- baseline: one DuckDB `read_json` of the file + `INSERT ... SELECT` into the same
  `metrics` and `expert_load` tables (no validation, no bookkeeping) -- the practical
  limit of this machine.

    python bench/bench_ingest.py [--steps 20000] [--scalars 50]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from observatory import store
from observatory.ingest import ingest

TARGET = 5_000_000  # metric values / s


def make_log(path: Path, steps: int, scalars: int, layers: int = 8, experts: int = 64, every: int = 10) -> int:
    """A realistic log: `scalars` metrics per step, expert_load for every layer every `every` steps."""
    rng = random.Random(0)
    names = [f"train/m{i:02d}" for i in range(scalars)]
    seq = 0
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for step in range(steps):
            t = 1.7e9 + step * 0.05
            data = {n: rng.random() for n in names}
            f.write(json.dumps({"v": 1, "run": "bench", "kind": "metrics", "step": step, "t": t, "host": 0,
                                "seq": seq, "data": data}, separators=(",", ":")) + "\n")  # fmt: skip
            seq += 1
            if step % every == 0:
                for layer in range(layers):
                    d = {"layer": layer, "routed": [rng.randrange(5000) for _ in range(experts)],
                         "dropped": [rng.randrange(50) for _ in range(experts)]}  # fmt: skip
                    f.write(json.dumps({"v": 1, "run": "bench", "kind": "expert_load", "step": step, "t": t,
                                        "host": 0, "seq": seq, "data": d}, separators=(",", ":")) + "\n")  # fmt: skip
                    seq += 1
    return steps * scalars


def baseline(path: Path, db: Path) -> float:
    t0 = time.perf_counter()
    con = duckdb.connect(str(db))
    con.execute("SET enable_progress_bar = false")
    store.ensure_schema(con)
    cols = "{v:'INT',run:'VARCHAR',kind:'VARCHAR',step:'BIGINT',t:'DOUBLE',host:'INT',seq:'BIGINT',data:'JSON'}"
    con.execute(f"CREATE TEMP TABLE raw AS SELECT * FROM read_json('{path}', format='newline_delimited', columns={cols})")
    con.execute("""INSERT INTO metrics SELECT run, step, unnest(map_keys(m)), unnest(map_values(m)), t, host
                   FROM (SELECT *, json_transform(data, '"MAP(VARCHAR, DOUBLE)"') AS m FROM raw WHERE kind = 'metrics')""")
    con.execute("""INSERT INTO expert_load SELECT run, step, x.layer, unnest(range(len(x.routed))), unnest(x.routed),
                          unnest(x.dropped)
                   FROM (SELECT *, json_transform(data, '{"layer":"USMALLINT","routed":["UINTEGER"],"dropped":["UINTEGER"]}') AS x
                         FROM raw WHERE kind = 'expert_load')""")
    con.close()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--scalars", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        log = tmp / "runs" / "bench" / "events.0.jsonl"
        n_values = make_log(log, args.steps, args.scalars)
        mb = log.stat().st_size / 1e6
        # process CPU seconds (all threads) too: on a shared, loaded machine wall time is mostly waiting
        c0 = time.process_time()
        t_base = baseline(log, tmp / "base.duckdb")
        c_base = time.process_time() - c0
        c0, t0 = time.process_time(), time.perf_counter()
        rep = ingest(tmp / "runs", tmp / "obs.duckdb", hooks=False, emit=None)
        t_obs, c_obs = time.perf_counter() - t0, time.process_time() - c0
        with duckdb.connect(str(tmp / "obs.duckdb"), read_only=True) as con:
            got = con.execute("SELECT count(*) FROM metrics").fetchall()[0][0]
        assert got == n_values == rep.metric_values, (got, n_values)
    obs_rate, base_rate = n_values / t_obs, n_values / t_base
    print(f"log: {args.steps} steps, {n_values:,} metric values + expert_load, {mb:.0f} MB")
    print(f"observatory ingest : {t_obs:6.2f} s  {obs_rate / 1e6:6.2f} M metric values/s "
          f"({rep.fast_events}/{rep.events} events on the vectorised path); {c_obs:.2f} CPU s")  # fmt: skip
    print(f"plain DuckDB       : {t_base:6.2f} s  {base_rate / 1e6:6.2f} M metric values/s (read_json + INSERT); {c_base:.2f} CPU s")
    print(f"ratio observatory / plain DuckDB: {obs_rate / base_rate:.2f} wall, {c_base / c_obs:.2f} CPU")
    print(f"per CPU second: observatory {n_values / c_obs / 1e6:.2f} M values, plain DuckDB {n_values / c_base / 1e6:.2f} M")
    print(
        f"| ingest throughput | {obs_rate / 1e6:.2f} M metric values/s ({obs_rate / base_rate:.2f}x plain DuckDB "
        f"read_json+INSERT at {base_rate / 1e6:.2f} M/s; {c_base / c_obs:.2f}x by CPU s) | >= {TARGET / 1e6:.0f}M values/s "
        "| python bench/bench_ingest.py |"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
