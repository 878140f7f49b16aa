"""Generate a large store for the dashboard bench: 100k steps x 30 metrics, 100k x 16 x 64 expert loads.

Rows are made by DuckDB itself from `range()` generators (no Python loop, no
JSONL): writing and ingesting 10^8 expert_load rows as events would take far
longer than the bench is about. The rollups are then built with the same code
ingest calls (`observatory.store.rollups.rebuild_rollups`), and their time is printed.

    nice .venv/bin/python bench/gen_store.py --db /tmp/bench.duckdb            # full size
    nice .venv/bin/python bench/gen_store.py --db /tmp/small.duckdb --steps 2000

The shapes are realistic: loss decays as a power law with noise and a few
spikes (one NaN), router load is skewed so that some experts run hot and drop
tokens above a capacity factor of 1.25, and a run has checkpoints, an anomaly,
a failure, a config change, a decision and a ladder forecast as events.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import duckdb

from observatory import store
from observatory.interop.simulate import STEP_SCALARS
from observatory.store import rollups

RUN = "bench-moe"
METRICS = (
    [
        *STEP_SCALARS,
        "grad/norm/total",
        "opt/lr",
        "throughput/tokens_per_s",
        "throughput/mfu",
        "data/tokens",
    ]
    + [f"grad/norm/layer_{i}" for i in range(16)]
    + ["train/accuracy", "writer/queue"]
)


LAYER_METRICS = (
    "router/layer_{}/z_loss",
    "router/layer_{}/lb_loss",
    "router/layer_{}/entropy",
    "moe/layer_{}/drop_fraction",
)


def generate(
    db: Path, steps: int, layers: int, experts: int, n_metrics: int, layer_metrics: bool = False
) -> dict[str, float]:
    """Write the store at `db` (replaced) and return timings in seconds.

    layer_metrics: also the trainer's per-layer names (LAYER_METRICS) for every layer.
    """
    if db.exists():
        db.unlink()
    times = {}
    con = duckdb.connect(str(db))
    con.execute("SET preserve_insertion_order = true")
    store.ensure_schema(con)
    t0 = time.time()
    tokens_per_step = 8192
    config = {
        "model": {"d_model": 512, "layers": layers, "experts": experts, "top_k": 2},
        "optim": {"lr": 3e-4, "warmup": 1000},
        "data": {"seq_len": 1024},
        "wandb": {"api_key": "<redacted>"},
    }
    for run, n, parent in ((RUN, steps, None), (RUN + "-fork", min(steps, 5000), RUN)):
        cfg = json.loads(json.dumps(config))
        if parent:
            cfg["optim"]["lr"] = 1.5e-4
        con.execute(
            """INSERT INTO runs (run, name, status, start_time, end_time, last_event_t, last_step, final_step,
                   parent_run, parent_step, ladder_name, ladder_rung, ladder, config, tags, code, data, mesh, model)
               VALUES (?, ?, 'completed', 1.7e9, 1.7e9 + ?, 1.7e9 + ?, ?, ?, ?, ?, 'bench', 'd512', ?, ?, ?,
                       NULL, NULL, NULL, ?)""",
            [
                run,
                run,
                n * 0.5,
                n * 0.5,
                n - 1,
                n - 1,
                parent,
                steps // 2 if parent else None,
                json.dumps({"name": "bench", "rung": "d512"}),
                json.dumps(cfg),
                ["bench"],
                json.dumps({"params_total": 1e9, "params_active": 1e8, "flops_per_token": 6e8}),
            ],
        )
    names = METRICS[:n_metrics] + [f"extra/m{i}" for i in range(max(0, n_metrics - len(METRICS)))]
    if layer_metrics:
        names += [m.format(i) for i in range(layers) for m in LAYER_METRICS]
    con.execute(
        "CREATE TEMP TABLE names AS SELECT name, row_number() OVER () - 1 AS k FROM (SELECT unnest(?) AS name)",
        [names],
    )
    # metrics: (step, metric) cross product; value depends on the name so each series looks like itself
    for run, n in ((RUN, steps), (RUN + "-fork", min(steps, 5000))):
        con.execute(
            f"""
            INSERT INTO metrics (run, step, name, value, t, host)
            SELECT ?, s.range, n.name,
                   CASE
                     WHEN n.name = 'train/loss' AND s.range = {n // 3} THEN 'nan'::DOUBLE
                     WHEN n.name IN ('train/loss', 'train/ce_loss')
                       THEN 2.2 + 8.0 * pow(s.range + 10, -0.35) + 0.02 * (random() - 0.5)
                            + CASE WHEN s.range % 9973 = 0 THEN 3.0 ELSE 0 END
                     WHEN n.name = 'opt/lr' THEN 3e-4 * least(1.0, (s.range + 1) / 1000.0)
                     WHEN n.name = 'data/tokens' THEN (s.range + 1) * {tokens_per_step}
                     WHEN n.name = 'moe/drop_fraction' THEN 0.07 + 0.01 * random()
                     ELSE 1.0 + n.k * 0.1 + 0.05 * random()
                   END,
                   1.7e9 + s.range * 0.5, 0
            FROM range({n}) s, names n ORDER BY s.range, n.k
            """,
            [run],
        )
    times["metrics"] = time.time() - t0
    t0 = time.time()
    # expert loads: per (step, layer) the routed assignments (tokens * top_k) spread over experts with a
    # skew that drifts slowly (hash of expert and step // 500), capacity 1.25x the mean
    mean = tokens_per_step * 2 // experts
    cap = int(mean * 1.25)
    con.execute(
        f"""
        INSERT INTO expert_load
        SELECT ?, step, layer, expert, routed, greatest(routed::BIGINT - {cap}, 0)::UINTEGER
        FROM (
            SELECT (i // {layers * experts})::INTEGER AS step,
                   ((i // {experts}) % {layers})::USMALLINT AS layer,
                   (i % {experts})::USMALLINT AS expert,
                   ({mean} * (0.55 + 0.9 * ((hash(i % {layers * experts}, i // {layers * experts * 500}) % 1000)
                                            / 1000.0))
                    + 20 * random())::UINTEGER AS routed
            FROM range({steps * layers * experts}) r(i)
        )
        """,
        [RUN],
    )
    times["expert_load"] = time.time() - t0
    t0 = time.time()
    ev = []
    seq = 0

    def add(kind, step, data):
        nonlocal seq
        seq += 1
        ev.append(
            (
                RUN,
                1000 if kind in ("forecast", "anomaly", "decision") else 0,
                seq,
                kind,
                step,
                1.7e9 + (step or 0) * 0.5,
                1,
                True,
                json.dumps(data),
            )
        )

    for s in range(0, steps, max(1, steps // 20)):
        add("checkpoint", s, {"path": f"/ckpt/{s}", "bytes": 1 << 30})
        add("eval", s, {"dataset": "val", "loss": 2.3 + 8.0 * (s + 10) ** -0.35})
    add(
        "anomaly",
        9973,
        {
            "detector": "zscore",
            "metric": "train/loss",
            "severity": "warn",
            "message": "loss spike > 6 sigma",
            "window": [9970, 9980],
        },
    )
    add("failure", steps // 3, {"type": "nan_loss", "message": "loss became NaN", "action": "skip_batch"})
    add(
        "config_diff", steps // 2, {"against": {"run": RUN, "step": 0}, "changes": {"optim.lr": [3e-4, 2e-4]}}
    )
    add(
        "decision",
        steps // 2,
        {"id": "D-1", "title": "lower LR", "status": "accepted", "hypothesis": "spikes come from a high LR"},
    )
    add(
        "forecast",
        0,
        {
            "metric": "train/loss",
            "method": "power law",
            "source": {"ladder": "bench"},
            "points": [
                {
                    "step": s,
                    "value": 2.2 + 8.0 * (s + 10) ** -0.35,
                    "low": 2.15 + 8.0 * (s + 10) ** -0.35,
                    "high": 2.25 + 8.0 * (s + 10) ** -0.35,
                }
                for s in range(0, steps + 1, max(1, steps // 50))
            ],
        },
    )
    con.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", ev)
    con.execute("CHECKPOINT")
    times["events"] = time.time() - t0
    t0 = time.time()
    con.execute("BEGIN")
    rollups.rebuild_rollups(con)
    con.execute("COMMIT")
    con.execute("CHECKPOINT")
    times["rollups"] = time.time() - t0
    n_el = con.execute("SELECT count(*) FROM expert_load").fetchall()[0][0]
    n_m = con.execute("SELECT count(*) FROM metrics").fetchall()[0][0]
    con.close()
    times["expert_load_rows"] = n_el
    times["metric_rows"] = n_m
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=Path("/tmp/observatory-bench.duckdb"))
    ap.add_argument("--steps", type=int, default=100_000)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--metrics", type=int, default=30)
    ap.add_argument("--layer-metrics", action="store_true", help="also router/layer_<i>/... per layer")
    a = ap.parse_args()
    t = generate(a.db, a.steps, a.layers, a.experts, a.metrics, a.layer_metrics)
    size = a.db.stat().st_size / 2**20
    print(
        f"store {a.db}: {t['metric_rows']:,} metric rows in {t['metrics']:.1f} s, "
        f"{t['expert_load_rows']:,} expert_load rows in {t['expert_load']:.1f} s, "
        f"rollups in {t['rollups']:.1f} s, {size:.0f} MiB"
    )


if __name__ == "__main__":
    main()
