"""Sweeps at a lab's scale: every view of 1,000 selected runs, in stores of 10^3 and 10^5 runs, side by side.

The stores are the many-runs bench's (bench/bench_many_runs.py `write_runs`: config {lr, width, seed},
project proj<i%5>, group g<i%50>, tags, 20-50 steps of six metrics, one `val` eval, run_end), written
with its sweep shape: each run is a cell of an iso-FLOP grid, `ladder` {budget, tokens, params_active}
(4 budgets x 5 sizes, train/loss and the eval following a known law), and one run in 50 is restarted
(a second attempt `<run>-r1` under the same name, resumed from its last step). The logs are ingested
by `observatory ingest` in a child process, as a user does. Each store tags 1,000 runs `pick`, spread
over the whole store (every n/1,000th run), and every view selects exactly those:

    tag = pick and config.lr > 0          (a config clause too, checked on the runs the tag keeps)

Per view (the same functions the page and the CLI call, each on a fresh read-only connection, best of
5): the selection, the group curves (by config.width, x = tokens) with their figure, the final values
pivoted by two keys, the scatter and parallel-coordinates figures, the iso-FLOP fit, a variant against
a baseline; then the Sweeps page as one AppTest script run per view (the selection box, the metric and
key choices and the view: what a visitor waits for, best of 3). Each figure is given twice: wall
seconds, and the process's CPU seconds (this shared machine's load moves the first 2-5x).

Targets (issue 54): every view over 1,000 selected runs <= 2 s; a selection at 10^5 runs <= 1.5x one at
10^3. Two floor rows show what a selection cannot go below at each size: the one scan of the columns its
clauses read, and the 1,000 runs reached by id through the runs' primary key instead (the index way).

    python bench/bench_sweeps.py                           # 10^3 and 10^5 runs (~1 GB of logs; minutes)
    python bench/bench_sweeps.py --runs 1000,10000         # smaller
    python bench/bench_sweeps.py --runs 1000               # one store, for development
    python bench/bench_sweeps.py --keep DIR [--reuse]      # keep the logs and stores; reuse them next time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import bench_many_runs  # noqa: E402 (bench/ is not a package)
import ingest_535b  # noqa: E402

from observatory import store  # noqa: E402

PICK = 1000
SELECTION = "tag = pick and config.lr > 0"
BUDGETS = (1e17, 3e17, 1e18, 3e18)
RESTART_STEPS = 10


def grid(n: int):
    """The sweep shape of an `n`-run store, for `write_runs`: run i is the iso-FLOP cell (budget b, size k)
    with N = N*(b) x 4^((k-2)/2) (N* = 1.345 (C/6)^0.4516), D = C / 6N, and a loss of
    1.69 + 406.4 / N^0.34 + 410.7 / D^0.28 (Chinchilla's fit); every n/1,000th run is tagged `pick`."""
    every = max(1, n // PICK)

    def shape(i: int) -> dict:
        b, k = BUDGETS[(i // every) % 4], (i // (every * 4)) % 5
        params = 1.345 * (b / 6) ** 0.4516 * 4 ** ((k - 2) / 2)
        tokens = b / (6 * params)

        def loss(s: int, last: int) -> float:
            return 1.69 + 406.4 / params**0.34 + 410.7 / (tokens * s / last) ** 0.28

        return {
            "start": {
                "ladder": {
                    "name": "grid",
                    "rung": f"{b:.0e}-n{k}",
                    "budget": b,
                    "flops": b,
                    "tokens": tokens,
                    "params_active": params,
                },
                "model": {"params_active": params, "flops_per_token": 6 * params},
                "data": {"tokens": tokens},
                "tags": ["pick"] if i % every == 0 else [],
            },
            "loss": loss,
            "tokens": tokens,
            "eval": round(loss(1, 1) + 0.005 * (random.Random(i).random() - 0.5), 5),
            "restart": RESTART_STEPS if (i // every) % 50 == 7 else 0,
        }

    return shape


def build(folder: Path, n: int) -> tuple[float, float]:
    """The logs of `n` runs (see the module docstring) in `folder`/runs-<n>, ingested into
    `folder`/sweeps-<n>.duckdb by `observatory ingest`: (seconds writing, seconds ingesting)."""
    runs, db = folder / f"runs-{n}", folder / f"sweeps-{n}.duckdb"
    shutil.rmtree(runs, ignore_errors=True)
    db.unlink(missing_ok=True)
    t0 = time.perf_counter()
    bench_many_runs.write_runs(runs, n, shape=grid(n))
    wrote = time.perf_counter() - t0
    return wrote, bench_many_runs.ingest(runs, db, f"ingest-{n}")[0]


def timed(fn, repeat: int = 3):
    """((best wall s, best CPU s), the result) over `repeat` calls. The CPU seconds are the process's (every
    DuckDB thread's, the AppTest script thread's): on this shared machine the wall time of the same call
    moves 2-5x with the load, its CPU time much less, so the two are printed side by side."""
    wall, cpu, out = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return (wall, cpu), out


def views(db: Path) -> dict[str, tuple[float, float]]:
    """(wall, CPU) seconds per view (best of 5), each on a fresh read-only connection, figure included."""
    from observatory.dashboard import sweeps_charts as ch
    from observatory.ladder.sweep import compare_view, isoflop_view, pivot
    from observatory.queries.sweeps import (
        count_selected,
        final_values,
        group_curves,
        select_runs,
        selected_roots,
    )

    def on(fn):
        def run():
            with store.connect(db) as con:
                return fn(con)

        return run

    out: dict[str, tuple[float, float]] = {}
    # as the page does: the selection runs once (over every run), the views read the runs it found
    out["selection"], roots = timed(on(lambda con: selected_roots(con, SELECTION)), 5)
    assert len(roots) == PICK, f"the selection found {len(roots)} runs, not {PICK}"
    out["selection (CLI: count)"], _ = timed(on(lambda con: count_selected(con, SELECTION)), 5)
    # the selection's floor at this store size: one scan of the columns its clauses read (no fold, nothing
    # else), and the other way DuckDB has to reach the 1,000 runs, by id through the runs' primary key
    # (an index scan, which DuckDB takes for at most 50 ids: per run, x 1,000)
    floor = "SELECT count(*) FROM runs WHERE list_contains(tags, 'pick') AND TRY_CAST(config->>'$.lr' AS DOUBLE) > 0"
    out["floor: scan of tags and config"], _ = timed(on(lambda con: con.execute(floor).fetchall()), 5)
    by_id = "SELECT run, name, start_time, parent_run FROM runs WHERE run IN (SELECT unnest($ids::VARCHAR[]))"
    with store.connect(db) as con:  # the query alone (x 20, not the connection)
        (wall, cpu), _ = timed(lambda: con.execute(by_id, {"ids": roots[:50]}).fetchall(), 5)
    out["floor: 1,000 runs by id (50 x 20)"] = (wall * 20, cpu * 20)
    out["runs list"], _ = timed(on(lambda con: select_runs(con, roots, 1000)), 5)

    def curves(con):
        v = group_curves(con, roots, "train/loss", ["config.width"], "tokens", 12, 200)
        return ch.curves_figure(v, "train/loss", 0.6)

    out["curves"], _ = timed(on(curves), 5)

    def table(con):
        got = final_values(con, roots, "train/loss", ["config.width", "config.seed"])
        assert len(got["rows"]) == PICK
        return ch.pivot_markdown(pivot(got["rows"], "config.width", "config.seed"))

    out["table"], _ = timed(on(table), 5)

    def scatter(con):
        got = final_values(con, roots, "eval:val", ["config.lr", "config.width"], True)
        return ch.scatter_figure(got["rows"], "config.lr", "config.width", "eval:val", True)

    out["scatter (best)"], _ = timed(on(scatter), 5)

    def parallel(con):
        got = final_values(con, roots, "train/loss", ["config.lr", "config.width", "config.seed"])
        return ch.parcoords_figure(got["rows"], ["config.lr", "config.width", "config.seed"], "train/loss")

    out["parallel"], _ = timed(on(parallel), 5)

    def iso(con):
        v = isoflop_view(con, roots, "eval:val", 1e19)
        assert v["fit"] and all(b["status"] in ("ok", "extrapolated") for b in v["fit"]["budgets"]), v["fit"]
        return ch.isoflop_figure(v)

    out["iso-FLOP"], _ = timed(on(iso), 5)

    with store.connect(db) as con:  # the page resolves both selections once, as above
        base = selected_roots(con, SELECTION + " and config.width <= 128")
        var = selected_roots(con, SELECTION + " and config.width = 256")

    def variant(con):
        v = compare_view(con, base, var, "eval:val")
        return ch.envelope_figure(v) if v["multiplier"] else v

    out["variant"], _ = timed(on(variant), 5)
    return out


def page(db: Path) -> dict[str, tuple[float, float]]:
    """The Sweeps page as one AppTest script run per view, best of 3 (the cache off: every query runs)."""
    from streamlit.testing.v1 import AppTest

    from observatory.dashboard.pages.sweeps import VIEWS

    os.environ["OBSERVATORY_DB"] = str(db)
    os.environ["OBSERVATORY_CACHE_TTL_S"] = "0"
    query = {
        "sel": SELECTION,
        "metric": "eval:val",
        "cmetric": "train/loss",
        "by": "config.width",
        "x": "tokens",
        "rows": "config.width",
        "cols": "config.seed",
        "key": "config.lr",
        "color": "config.width",
        "pkeys": "config.lr,config.width,config.seed",
        "budget": "1e19",
        "var": SELECTION + " and config.width = 256",
    }

    def once(view):
        at = AppTest.from_string(
            "from observatory.dashboard.pages import sweeps\nsweeps.render()\n", default_timeout=120
        )
        for k, v in {**query, "view": view}.items():
            at.query_params[k] = v
        at.run()
        assert not at.exception, at.exception
        return at

    return {f"page: {v}": timed(lambda v=v: once(v))[0] for v in VIEWS}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", "--sizes", default="1000,100000", help="Store sizes in runs (comma-separated).")
    ap.add_argument(
        "--keep", type=Path, help="Write the logs and build the stores in this folder; keep them."
    )
    ap.add_argument("--reuse", action="store_true", help="With --keep: use the stores already there.")
    args = ap.parse_args()
    sizes = [int(x) for x in args.runs.split(",")]
    if min(sizes) < PICK:
        ap.error(f"every size must hold the {PICK:,} runs the views select")
    if args.reuse and not args.keep:
        ap.error("--reuse needs --keep DIR (the folder of an earlier run's stores)")
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-sweeps-"))
    tmp.mkdir(parents=True, exist_ok=True)
    # the detectors' findings (ingest runs them) go in the work folder, not in the user's findings folder
    os.environ["OBSERVATORY_FINDINGS_DIR"] = ingest_535b.ENV["OBSERVATORY_FINDINGS_DIR"] = str(
        tmp / "findings"
    )
    try:
        rows: dict[int, dict[str, tuple[float, float]]] = {}
        for n in sizes:
            db = tmp / f"sweeps-{n}.duckdb"
            wrote, ingested = (0.0, 0.0) if args.reuse and db.exists() else build(tmp, n)
            r = views(db)
            r.update(page(db))
            rows[n] = r
            print(
                f"{n:>7} runs: logs written in {wrote:.1f} s, `observatory ingest` {ingested:.1f} s "
                f"({db.stat().st_size / 1e6:.0f} MB)" + (" (reused)" if not ingested else ""),
                flush=True,
            )
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    names = list(rows[sizes[0]])
    for k, what in ((0, "wall"), (1, "CPU")):
        print(
            f"\n{'view over 1,000 selected runs':<32}"
            + "".join(f"{f'{what}, {n:,} runs':>19}" for n in sizes)
            + (f"{'ratio':>8}" if len(sizes) > 1 else "")
        )
        for name in names:
            vals = [rows[n][name][k] for n in sizes]
            ratio = f"{vals[-1] / vals[0]:>7.2f}x" if len(sizes) > 1 and vals[0] else ""
            print(f"{name:<32}" + "".join(f"{v:>17.3f} s" for v in vals) + ratio)
    print("\ntargets (load average now: " + ", ".join(f"{x:.1f}" for x in os.getloadavg()) + ")")
    for k, what in ((0, "wall"), (1, "CPU")):
        worst = max(v[k] for r in rows.values() for v in r.values())
        line = f"{what}: every view <= 2 s: worst {worst:.2f} s {'OK' if worst <= 2 else 'MISSED'}"
        if len(sizes) > 1:
            sel = rows[sizes[-1]]["selection"][k] / rows[sizes[0]]["selection"][k]
            line += f"; selection at {sizes[-1]:,} <= 1.5x at {sizes[0]:,}: {sel:.2f}x {'OK' if sel <= 1.5 else 'MISSED'}"
        print(line)
    print(json.dumps({"sizes": sizes, "seconds": {str(n): rows[n] for n in sizes}}))


if __name__ == "__main__":
    main()
