"""Sweeps at a lab's scale: every view of 1,000 selected runs, in stores of 10^3 and 10^5 runs, side by side.

The stores hold the many-runs bench's run shape (bench/bench_many_runs.py `write_runs`: config {lr, width,
seed}, project proj<i%5>, group g<i%50>, tags, 20-50 steps of six metrics, one `val` eval, run_end), plus
what a sweep view needs: an iso-FLOP `ladder` {budget, tokens, params_active} (4 budgets x 5 sizes) and
a restart every 100th run (a second run with the same name resumed from it). They are made by DuckDB
from `range()` (as bench/gen_store.py does: writing and ingesting 10^5 JSONL logs would take most of
the bench's time and measure ingest, which bench_many_runs already does), then the rollups are built
by the code ingest calls. Each store tags 1,000 runs `pick`, and every view selects exactly those:

    tag = pick and config.lr > 0          (a config clause, so the selection reads every run's config)

Per view (the same functions the page and the CLI call, each on a fresh read-only connection, best of
3): the selection, the group curves (by config.width, x = tokens) with their figure, the final values
pivoted by two keys, the scatter and parallel-coordinates figures, the iso-FLOP fit, a variant against
a baseline; then the Sweeps page as one AppTest script run per view (the selection box, the metric and
key choices and the view: what a visitor waits for).

Targets (issue 54): every view over 1,000 selected runs <= 2 s; a selection at 10^5 runs <= 1.5x one at
10^3.

    python bench/bench_sweeps.py                       # 10^3 and 10^5 runs (a few minutes)
    python bench/bench_sweeps.py --sizes 1000,10000    # smaller
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from observatory import store  # noqa: E402
from observatory.store import rollups  # noqa: E402

PICK = 1000
SELECTION = "tag = pick and config.lr > 0"
BUDGETS = (1e17, 3e17, 1e18, 3e18)


def build(db: Path, n: int) -> float:
    """A store of `n` runs (see the module docstring); seconds it took."""
    t0 = time.time()
    if db.exists():
        db.unlink()
    con = duckdb.connect(str(db))
    store.ensure_schema(con)
    every = max(1, n // PICK)  # runs i % every == 0 are picked: PICK of them
    # per run: the iso-FLOP cell (budget b, size k) it is, its tokens and params (6 N D = C)
    con.execute(
        f"""
        CREATE TEMP TABLE r AS
        SELECT i, format('sweep-{{:06d}}', i) AS run, (20 + hash(i) % 31)::BIGINT AS steps,
               {list(BUDGETS)}[1 + (i // {every}) % 4] AS budget, (i // ({every} * 4)) % 5 AS k,
               power(10, -4 + 2 * (hash(i, 1) % 1000) / 1000.0) AS lr, [64, 128, 256][1 + (hash(i, 2) % 3)::BIGINT] AS width
        FROM range({n}) t(i)
        """
    )
    con.execute(
        """
        CREATE TEMP TABLE cells AS
        SELECT *, 1.345 * pow(budget / 6, 0.4516) * pow(4, (k - 2) / 2.0) AS params FROM r  -- the law's N* x 1/4..4
        """
    )
    con.execute(
        f"""
        INSERT INTO runs (run, name, project, run_group, status, start_time, end_time, last_event_t, last_step,
                          final_step, parent_run, parent_step, ladder_name, ladder_rung, ladder, config, tags,
                          model, data)
        SELECT run, run, 'proj' || (i % 5), 'g' || (i % 50), 'completed', 1.76e9 + i * 100, 1.76e9 + i * 100 + steps,
               1.76e9 + i * 100 + steps, steps, steps, NULL, NULL, 'grid', format('{{:.0e}}-n{{}}', budget, k),
               json_object('name', 'grid', 'budget', budget, 'flops', budget, 'tokens', budget / (6 * params),
                           'params_active', params),
               json_object('lr', lr, 'width', width, 'seed', i % 7),
               CASE WHEN i % {every} = 0 THEN ['sweep', 'w' || (i % 3), 'pick'] ELSE ['sweep', 'w' || (i % 3)] END,
               json_object('params_active', params, 'flops_per_token', 6 * params),
               json_object('tokens', budget / (6 * params))
        FROM cells
        """
    )
    # a restart of every 100th run: the same name, resumed from its last step, 10 more steps
    con.execute(
        """
        INSERT INTO runs (run, name, project, run_group, status, start_time, end_time, last_event_t, last_step,
                          final_step, parent_run, parent_step, config, tags)
        SELECT run || '-r1', run, project, run_group, 'completed', end_time + 60, end_time + 70, end_time + 70,
               last_step + 10, last_step + 10, run, last_step, config, tags
        FROM runs WHERE hash(run) % 100 = 0
        """
    )
    # six metrics a step (train/loss ~ the cell's law), over each run's steps; the restarts' 10 more
    con.execute(
        """
        INSERT INTO metrics (run, step, name, value, t, host)
        SELECT r.run, s.step, m.name,
               CASE m.name
                 WHEN 'train/loss' THEN 1.69 + 406.4 / pow(c.params, 0.34)
                      + 410.7 / pow(c.budget / (6 * c.params) * s.step / r.last_step, 0.28) + 0.01 * random()
                 WHEN 'data/tokens' THEN c.budget / (6 * c.params) * s.step / r.last_step
                 WHEN 'opt/lr' THEN 1e-3
                 ELSE random() END,
               r.start_time + s.step, 0
        FROM runs r JOIN cells c ON c.run = regexp_replace(r.run, '-r1$', '')
        CROSS JOIN LATERAL (SELECT unnest(range(coalesce(r.parent_step, 0) + 1, r.last_step + 1)) AS step) s
        CROSS JOIN (SELECT unnest(['train/loss', 'train/accuracy', 'opt/lr', 'grad/norm/total',
                                   'throughput/tokens_per_s', 'data/tokens']) AS name) m
        """
    )
    con.execute(
        """
        INSERT INTO events (run, host, seq, kind, step, t, v, known, data)
        SELECT r.run, 0, 1000, 'eval', r.last_step, r.end_time, 1, true,
               json_object('dataset', 'val', 'loss', 1.69 + 406.4 / pow(c.params, 0.34)
                           + 410.7 / pow(c.budget / (6 * c.params), 0.28) + 0.005 * (random() - 0.5))
        FROM runs r JOIN cells c ON c.run = regexp_replace(r.run, '-r1$', '')
        WHERE r.run NOT IN (SELECT parent_run FROM runs WHERE parent_run IS NOT NULL)
        """
    )
    rollups.rebuild_rollups(con)
    con.execute("CHECKPOINT")
    con.close()
    return time.time() - t0


def timed(fn, repeat: int = 3):
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def views(db: Path) -> dict[str, float]:
    """Seconds per view (best of 3), each on a fresh read-only connection, figure included."""
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

    out: dict[str, float] = {}
    # as the page does: the selection runs once (over every run), the views read the runs it found
    out["selection"], roots = timed(on(lambda con: selected_roots(con, SELECTION)))
    assert len(roots) == PICK, f"the selection found {len(roots)} runs, not {PICK}"
    out["selection (CLI: count)"], _ = timed(on(lambda con: count_selected(con, SELECTION)))
    out["runs list"], _ = timed(on(lambda con: select_runs(con, roots, 1000)))

    def curves(con):
        v = group_curves(con, roots, "train/loss", ["config.width"], "tokens", 12, 200)
        return ch.curves_figure(v, "train/loss", 0.6)

    out["curves"], _ = timed(on(curves))

    def table(con):
        got = final_values(con, roots, "train/loss", ["config.width", "config.seed"])
        assert len(got["rows"]) == PICK
        return ch.pivot_markdown(pivot(got["rows"], "config.width", "config.seed"))

    out["table"], _ = timed(on(table))

    def scatter(con):
        got = final_values(con, roots, "eval:val", ["config.lr", "config.width"], True)
        return ch.scatter_figure(got["rows"], "config.lr", "config.width", "eval:val", True)

    out["scatter (best)"], _ = timed(on(scatter))

    def parallel(con):
        got = final_values(con, roots, "train/loss", ["config.lr", "config.width", "config.seed"])
        return ch.parcoords_figure(got["rows"], ["config.lr", "config.width", "config.seed"], "train/loss")

    out["parallel"], _ = timed(on(parallel))

    def iso(con):
        v = isoflop_view(con, roots, "eval:val", 1e19)
        assert v["fit"] and all(b["status"] in ("ok", "extrapolated") for b in v["fit"]["budgets"]), v["fit"]
        return ch.isoflop_figure(v)

    out["iso-FLOP"], _ = timed(on(iso))

    with store.connect(db) as con:  # the page resolves both selections once, as above
        base = selected_roots(con, SELECTION + " and config.width <= 128")
        var = selected_roots(con, SELECTION + " and config.width = 256")

    def variant(con):
        v = compare_view(con, base, var, "eval:val")
        return ch.envelope_figure(v) if v["multiplier"] else v

    out["variant"], _ = timed(on(variant))
    return out


def page(db: Path) -> dict[str, float]:
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
    ap.add_argument("--sizes", default="1000,100000", help="Store sizes in runs (comma-separated).")
    ap.add_argument("--keep", type=Path, help="Build the stores in this folder and keep them.")
    ap.add_argument("--reuse", action="store_true", help="With --keep: use the stores already there.")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    if min(sizes) < PICK:
        ap.error(f"every size must hold the {PICK:,} runs the views select")
    tmp = args.keep or Path(tempfile.mkdtemp(prefix="bench-sweeps-"))
    tmp.mkdir(parents=True, exist_ok=True)
    try:
        rows: dict[int, dict[str, float]] = {}
        for n in sizes:
            db = tmp / f"sweeps-{n}.duckdb"
            built = 0.0 if args.reuse and db.exists() else build(db, n)
            r = views(db)
            r.update(page(db))
            rows[n] = r
            print(f"{n:>7} runs: store built in {built:.1f} s ({db.stat().st_size / 1e6:.0f} MB)", flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    names = list(rows[sizes[0]])
    print(
        f"\n{'view over 1,000 selected runs':<32}"
        + "".join(f"{f'{n:,} runs':>14}" for n in sizes)
        + f"{'ratio':>8}"
    )
    for name in names:
        vals = [rows[n][name] for n in sizes]
        ratio = vals[-1] / vals[0] if vals[0] else float("nan")
        print(f"{name:<32}" + "".join(f"{v:>12.3f} s" for v in vals) + f"{ratio:>7.2f}x")
    worst = max(max(r.values()) for r in rows.values())
    sel = rows[sizes[-1]]["selection"] / rows[sizes[0]]["selection"]
    print(
        f"\ntargets: every view <= 2 s: worst {worst:.2f} s {'OK' if worst <= 2 else 'MISSED'}; "
        f"selection at {sizes[-1]:,} <= 1.5x at {sizes[0]:,}: {sel:.2f}x {'OK' if sel <= 1.5 else 'MISSED'}"
    )
    print(json.dumps({"sizes": sizes, "seconds": {str(n): rows[n] for n in sizes}}))


if __name__ == "__main__":
    main()
