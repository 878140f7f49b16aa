"""Dashboard bench: every page's queries on a 10^8-row store, and the Live page's first chart in a browser.

1. Queries. On the store of `bench/gen_store.py` (100k steps x 30 metrics, 100k
   steps x 16 layers x 64 experts = 1.0e8 expert_load rows), run each page's
   queries the way the page does (one read-only connection per batch, cold
   cache) and print each query's time, the page's total (connections included)
   and the ratio to the 500 ms goal. Side by side, the plain scans the rollups
   replace (a one-layer heatmap and the per-step drop fraction from raw rows).
2. Browser. Two `streamlit run` servers over the same store: the app, and a bare
   page holding one plotly chart of the same run's loss. Debian chromium opens
   each in turn (fresh context, no cache, query cache off) and times until the
   first plotly trace is drawn; the ratio Live / bare is the figure (goal <= 1.3).

    nice .venv/bin/python bench/bench_dashboard.py                 # generates, measures, deletes the store
    nice .venv/bin/python bench/bench_dashboard.py --db /tmp/b.duckdb --keep
    nice .venv/bin/python bench/bench_dashboard.py --only browser --db /tmp/small.duckdb  # gen_store --steps 20000
    nice .venv/bin/python bench/bench_dashboard.py --real 10000 --db /tmp/real.duckdb --keep  # the real path

`--real STEPS` builds the store through the real path instead: `observatory simulate --preset
535b --steps STEPS` (48 layers x 384 experts, expert_load every 10 steps) and `observatory ingest`
in a child process (its peak RSS printed); the pages then show run `sim-535b`. Each dashboard
process's peak RSS is printed too: the streamlit servers' (each one's VmHWM, read before it is
stopped) and this process's after the page queries.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
GOAL_MS = 500.0
RUN = "bench-moe"
from bench.gen_store import generate  # noqa: E402  (after the sys.path line)
from bench.ingest_535b import child, vmhwm_mb  # noqa: E402  (children's own peak RSS, not what they inherit)
from observatory import report, store  # noqa: E402
from observatory.dashboard import cache  # noqa: E402
from observatory.queries import core  # noqa: E402
from observatory.queries import dashboard as qd  # noqa: E402
from observatory.queries import experts as qe  # noqa: E402

CHROMIUM_ARGS = list(report.CHROMIUM_ARGS)
RSS_MB: list[float] = []  # peak RSS of each streamlit server, app first


def build_real(db: Path, steps: int) -> None:
    """The store through the real path: simulate the 535b preset, then `observatory ingest` it (a child)."""
    from observatory.interop.simulate import simulate

    runs = db.with_name(db.name + ".runs")
    if not runs.exists():
        simulate("535b", runs, steps=steps, expert_load_every=10)
    wall, mb, _ = child(["ingest", "-q", "--runs-dir", str(runs), "--db", str(db)])
    print(
        f"built {db} through simulate + observatory ingest ({steps} steps) in {wall:.0f} s; "
        f"ingester peak RSS {mb:.0f} MB"
    )


# ---------------------------------------------------------------- 1. queries


def page_batches(run: str, fork: str) -> dict[str, list[list[tuple]]]:
    """Per page view, its batches of (label, fn, args), as the page issues them."""
    # lazy for start-up time: the pages bring Streamlit, which `--help` does not need
    from observatory.dashboard.pages import compare
    from observatory.dashboard.pages.live import HEALTH_NAMES, LAYER_FAMILIES, LOSS

    runs = [("list_runs", core.list_runs, ()), ("runs_extras", qd.runs_extras, ())]
    panel = [
        ("markers", qd.markers, (run,)),
        ("evals", qd.evals, (run,)),
        ("forecasts", qd.forecasts, (run,)),
    ]

    def live(lo, hi):  # a deep link (?run=) fetches the run list and the whole panel on one connection
        view = (run, list(LOSS), HEALTH_NAMES, lo, hi, 1000, 300, list(LAYER_FAMILIES.values()), True)
        return runs + [("live_view: 9 series", qd.live_view, view), *panel]

    def experts(lo, hi):
        return [("experts_view: heatmap + layer series", qe.experts_view, (run, 3, lo, hi, 400, 500))]

    return {
        "Runs": [runs],
        "Live, all 100k steps": [live(None, None)],
        "Live refresh, zoom 5k steps": [live(40_000, 44_999)],
        "Live refresh, zoom 800 steps (every step)": [live(40_000, 40_799)],
        "Experts, all steps": [runs + experts(None, None)],  # a deep link: one connection
        "Experts, zoom 5k steps": [runs + experts(40_000, 44_999)],
        "Experts, zoom 500 steps (every step)": [runs + experts(40_000, 40_499)],
        "Live drop fraction from loads (no metric)": [
            [("run_drop_series", qe.run_drop_series, (run, 0, 99_999, 1000))]
        ],
        "Compare (overlay, diff, lineage)": [
            runs,
            [
                ("metric_names_for", qd.metric_names_for, ([run, fork],)),
                ("runs_view", qd.runs_view, ([run, fork], "train/loss", None, None, 1000)),
                ("run_configs", qd.run_configs, ([run, fork],)),
                ("lineage_view", compare.lineage_view, (run, "train/loss")),
            ],
        ],
        "SQL (schema browser)": [[("schema", qd.schema, ())]],
    }


def plain_scans(con, run: str) -> list[tuple[str, float]]:
    """The scans the rollups replace, timed on the same store (reference, not a page)."""
    out = []
    for label, fn in (
        (
            "plain scan: heatmap of 1 layer, all steps",
            lambda: qe.heatmap(con, run, 3, 0, 99_999, 400, plain=True),
        ),
        ("plain scan: drop fraction per step", lambda: qe.plain_drop_per_step(con, run)),
    ):
        t = time.perf_counter()
        fn()
        out.append((label, (time.perf_counter() - t) * 1000))
    return out


def bench_queries(db: Path) -> tuple[float, float]:
    """(the slowest page's ms, this process's peak RSS in MB after the page queries, before the reference scans)."""
    import duckdb

    worst = 0.0
    opens = []
    for _ in range(3):  # what merely starting a DuckDB instance costs on this machine right now
        t = time.perf_counter()
        duckdb.connect(":memory:").close()
        opens.append((time.perf_counter() - t) * 1000)
    batches = page_batches(RUN, RUN + "-fork")
    with store.connect(
        db
    ) as con:  # a server is long-lived: its first-ever query (imports, cold pages) is not a page
        for _, fn, args in batches["Runs"][0]:
            fn(con, *args)
    print(f"\n## Page queries on {db} (goal: each page within {GOAL_MS:.0f} ms)\n")
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; opening an empty in-memory DuckDB "
        f"takes {statistics.median(opens):.0f} ms here (each batch below opens the store once)\n"
    )
    print("| page | query | ms | ratio to 500 ms |")
    print("|---|---|---|---|")
    for page, page_calls in batches.items():
        t_page = time.perf_counter()
        for batch in page_calls:
            with store.connect(db) as con:
                cache.limit_memory(con)  # as the dashboard's page queries run
                for label, fn, args in batch:
                    t = time.perf_counter()
                    fn(con, *args)
                    ms = (time.perf_counter() - t) * 1000
                    print(f"| {page} | {label} | {ms:.1f} | {ms / GOAL_MS:.2f} |")
        total = (time.perf_counter() - t_page) * 1000
        worst = max(worst, total)
        print(
            f"| **{page}** | **total, {len(page_calls)} connection(s)** | **{total:.1f}** | **{total / GOAL_MS:.2f}** |"
        )
    import resource

    pages_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the reference scans
    with store.connect(db) as con:
        for label, ms in plain_scans(con, RUN):
            print(f"| (reference) | {label} | {ms:.1f} | {ms / GOAL_MS:.2f} |")
    return worst, pages_mb


# ---------------------------------------------------------------- 2. browser

BARE_PAGE = textwrap.dedent(
    """
    import plotly.graph_objects as go
    import streamlit as st
    from observatory.queries import dashboard as qd
    from observatory.store import connect
    import os

    run = st.query_params.get("run", "bench-moe")
    with connect(os.environ["OBSERVATORY_DB"]) as con:
        lo, hi = qd.metric_extent(con, [run], ["train/loss"])
        d = qd.downsample(con, run, ["train/loss"], lo, hi, 1000)
    st.plotly_chart(go.Figure(go.Scatter(x=d["step"].to_list(), y=d["last"].to_list(), mode="lines")))
    """
)


def _serve(script: Path, db: Path, port: int, log) -> subprocess.Popen:
    env = dict(os.environ, OBSERVATORY_DB=str(db))  # default cache TTL: loads are seconds apart, so cold
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(script),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"streamlit on {script} did not start")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def app_and_bare(db: Path) -> Iterator[dict[str, str]]:
    """The app and the bare page (`BARE_PAGE`) served over `db`: {"live": the Live page's URL, "bare": ...};
    each server's peak RSS goes to RSS_MB, app first, when they are stopped."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-dash-"))
    bare = tmp / "bare.py"
    bare.write_text(BARE_PAGE)
    p_app, p_bare = _free_port(), _free_port()
    with open(tmp / "app.log", "wb") as la, open(tmp / "bare.log", "wb") as lb:
        servers = [_serve(ROOT / "app.py", db, p_app, la), _serve(bare, db, p_bare, lb)]
        try:
            yield {
                "live": f"http://127.0.0.1:{p_app}/live?run={RUN}",
                "bare": f"http://127.0.0.1:{p_bare}/?run={RUN}",
            }
        finally:
            for s in servers:
                # its own VmHWM, read before it goes: wait4's ru_maxrss would carry this process's RSS
                # at the spawn (Linux keeps a process's pre-exec peak; see bench/ingest_535b.py)
                RSS_MB.append(vmhwm_mb(s.pid))
                s.terminate()
                s.wait()


def bench_browser(db: Path, repeats: int) -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {"live": [], "bare": []}
    with app_and_bare(db) as urls, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        for i in range(repeats + 1):  # the first round warms both servers (imports), not counted
            for name in ("bare", "live") if i % 2 else ("live", "bare"):
                ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
                page = ctx.new_page()
                t = time.perf_counter()
                page.goto(urls[name])
                page.wait_for_selector(".js-plotly-plot .scatterlayer .trace", timeout=120_000)
                dt = time.perf_counter() - t
                ctx.close()
                if i:
                    times[name].append(dt)
        browser.close()
    live, bare_t = statistics.median(times["live"]), statistics.median(times["bare"])
    print(
        f"\n## First chart in chromium (median of {repeats}, fresh browser context and cold query cache each)\n"
    )
    print(f"- bare page, one plotly chart: {bare_t:.2f} s  {', '.join(f'{x:.2f}' for x in times['bare'])}")
    print(f"- Live run page:               {live:.2f} s  {', '.join(f'{x:.2f}' for x in times['live'])}")
    print(f"- ratio Live / bare: {live / bare_t:.2f} (goal <= 1.3)")
    return live, bare_t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=None, help="an existing bench store (else one is generated)")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    ap.add_argument("--repeats", type=int, default=7)  # single loads vary by +-1 s on a shared machine
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument(
        "--only",
        choices=("queries", "browser"),
        help="one part only (e.g. the browser part against a small store from bench/gen_store.py)",
    )
    ap.add_argument(
        "--real", type=int, metavar="STEPS", help="build the store by simulate + ingest (535b preset)"
    )
    ap.add_argument(
        "--run", default=None, help="the run the pages show (default: bench-moe; sim-535b with --real)"
    )
    a = ap.parse_args()
    global RUN
    RUN = a.run or ("sim-535b" if a.real else RUN)
    made = None
    db = a.db
    if a.real and (db is None or not db.exists()):
        db = db or Path(tempfile.gettempdir()) / "observatory-bench-dashboard-real.duckdb"
        build_real(db, a.real)
        made = db
    elif db is None or not db.exists():
        db = db or Path(tempfile.gettempdir()) / "observatory-bench-dashboard.duckdb"
        t = time.time()
        info = generate(db, 100_000, 16, 64, 30)
        print(
            f"generated {db}: {info['expert_load_rows']:,} expert_load rows, {info['metric_rows']:,} metric rows "
            f"in {time.time() - t:.0f} s (rollups {info['rollups']:.0f} s)"
        )
        made = db
    with store.connect(db) as con:
        n_rows = con.execute("SELECT count(*) FROM expert_load").fetchall()[0][0]
    try:
        import resource

        worst, self_mb = (
            (None, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
            if a.only == "browser"
            else bench_queries(db)
        )
        print(
            f"\npeak RSS of this process after the page queries (before the reference scans): {self_mb:.0f} MB"
        )
        browser = None if a.no_browser or a.only == "queries" else bench_browser(db, a.repeats)
    finally:
        if made is not None and not a.keep:
            for p in (made, made.with_name(made.name + ".wal"), *store.lock_files(made)):
                p.unlink(missing_ok=True)
    cmd = " ".join(["python bench/bench_dashboard.py", *sys.argv[1:]])
    print()
    print("| target | measured | goal | command |")
    print("|---|---|---|---|")
    if worst is not None:
        print(
            f"| dashboard: slowest page's queries on {n_rows / 1e6:.0f}M expert_load rows | {worst:.0f} ms ({worst / GOAL_MS:.2f}x of 500 ms) "
            f"| <= 500 ms | `{cmd}` |"
        )
    if worst is not None:
        print(
            f"| dashboard process peak RSS, page queries ({n_rows / 1e6:.0f}M expert_load rows) | {self_mb:.0f} MB "
            f"| <= 1.5 GB | `{cmd}` |"
        )
    if RSS_MB:
        print(
            f"| dashboard: streamlit server peak RSS ({n_rows / 1e6:.0f}M expert_load rows) | app {RSS_MB[0]:.0f} MB, "
            f"bare page {RSS_MB[1]:.0f} MB "
            f"| <= 1.5 GB | `{cmd}` |"
        )
    if browser:
        live, bare = browser
        print(
            f"| dashboard: Live page first chart vs bare plotly page | {live:.2f} s vs {bare:.2f} s ({live / bare:.2f}x) "
            f"| <= 1.3x | `{cmd}` |"
        )


if __name__ == "__main__":
    main()
