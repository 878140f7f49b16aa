"""Time to the Live page's first chart in chromium, on a quiet machine and with every CPU kept busy.

Two `streamlit run` servers over one store (`bench/gen_store.py`, 20k steps by default): the app, and
a bare page holding one plotly chart of the same run's loss (`bench/bench_dashboard.py`'s). Chromium
opens each in turn (fresh context, cold query cache) and times until the first plotly trace is drawn,
and for the Live page also until all seven of its charts are drawn (the loss comes first, the health
charts after it). Then the same with one busy-looping process per CPU core at the servers' own
priority, as a training job or a CI build sharing the machine would. Printed side by side: median of
`--repeats` per page, quiet and busy, and busy / quiet.

    nice .venv/bin/python bench/bench_live_first_chart.py                 # generates a store, deletes it
    nice .venv/bin/python bench/bench_live_first_chart.py --db /tmp/small.duckdb --repeats 5

The machine's load average before each phase is printed too: on a shared machine "quiet" is only as
quiet as the neighbours.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.bench_dashboard import CHROMIUM_ARGS, app_and_bare  # noqa: E402
from bench.gen_store import generate  # noqa: E402

N_CHARTS = 7  # the Live page: the loss and six health charts
PHONE = {"viewport": {"width": 390, "height": 844}, "is_mobile": True, "has_touch": True}
DESKTOP = {"viewport": {"width": 1400, "height": 1000}}
TIMEOUT_MS = 180_000


def _burn() -> None:
    while True:
        pass


def _open(browser, url: str, ctx_kw: dict, all_charts: bool) -> tuple[float, float | None]:
    """(seconds to the first drawn trace, seconds to all N_CHARTS charts drawn or None) in a fresh context."""
    ctx = browser.new_context(**ctx_kw)
    page = ctx.new_page()
    try:
        t = time.perf_counter()
        page.goto(url)
        page.wait_for_selector(".js-plotly-plot .scatterlayer .trace", timeout=TIMEOUT_MS)
        first = time.perf_counter() - t
        if not all_charts:
            return first, None
        page.wait_for_function(
            f"() => [...document.querySelectorAll('.js-plotly-plot')]"
            f".filter(g => g.querySelector('.scatterlayer .trace')).length >= {N_CHARTS}",
            timeout=TIMEOUT_MS,
        )
        return first, time.perf_counter() - t
    finally:
        ctx.close()


def _phase(browser, urls: dict[str, str], repeats: int) -> dict[str, list[float]]:
    """Each page `repeats` times, in turn (the order alternating each round)."""
    cases = {
        "bare page, one plotly chart": (urls["bare"], DESKTOP, False),
        "Live page (1400 px)": (urls["live"], DESKTOP, True),
        "Live page (phone, 390 px)": (urls["live"], PHONE, True),
    }
    out: dict[str, list[float]] = {}
    for i in range(repeats):
        names = list(cases) if i % 2 == 0 else list(reversed(cases))
        for name in names:
            url, kw, full = cases[name]
            first, whole = _open(browser, url, kw, full)
            out.setdefault(name, []).append(first)
            if whole is not None:
                out.setdefault(f"{name}: all {N_CHARTS} charts", []).append(whole)
    return out


def bench(db: Path, repeats: int, burners: int) -> dict[str, dict[str, list[float]]]:
    from playwright.sync_api import sync_playwright

    results: dict[str, dict[str, list[float]]] = {}
    with app_and_bare(db) as urls, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True)
        _phase(browser, urls, 1)  # warms both servers (imports, first queries): not counted
        print(f"quiet: load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
        results["quiet"] = _phase(browser, urls, repeats)
        procs = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(burners)]
        for p in procs:
            p.start()
        try:
            time.sleep(3)
            print(f"busy: {burners} busy loops, load average {os.getloadavg()[0]:.1f}", flush=True)
            results["busy"] = _phase(browser, urls, repeats)
        finally:
            for p in procs:
                p.terminate()
                p.join()
        browser.close()
    return results


def report(results: dict[str, dict[str, list[float]]], repeats: int, burners: int) -> None:
    quiet, busy = results["quiet"], results["busy"]
    print(
        f"\n## Live page, seconds to first chart in chromium (median of {repeats}; busy: {burners} busy loops)\n"
    )
    print("| page | quiet | busy | busy / quiet |")
    print("|---|---|---|---|")
    for name in quiet:
        q, b = statistics.median(quiet[name]), statistics.median(busy[name])
        print(f"| {name} | {q:.2f} | {b:.2f} | {b / q:.2f}x |")
    lq = statistics.median(quiet["Live page (1400 px)"]) / statistics.median(
        quiet["bare page, one plotly chart"]
    )
    lb = statistics.median(busy["Live page (1400 px)"]) / statistics.median(
        busy["bare page, one plotly chart"]
    )
    print(f"\nLive / bare first chart: quiet {lq:.2f}x, busy {lb:.2f}x")
    for phase, r in results.items():
        print(
            f"{phase} samples: " + "; ".join(f"{k}: {', '.join(f'{x:.2f}' for x in v)}" for k, v in r.items())
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, default=None, help="an existing bench store (else one is generated)")
    ap.add_argument("--steps", type=int, default=20_000, help="the generated store's steps")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--burners", type=int, default=os.cpu_count() or 1, help="busy loops in the busy phase")
    a = ap.parse_args()
    db, made = a.db, a.db is None
    if made:
        db = Path(tempfile.mkdtemp(prefix="bench-live-store-")) / "bench.duckdb"
        t = time.perf_counter()
        generate(db, a.steps, 16, 64, 30, False)
        print(f"store: {a.steps:,} steps in {time.perf_counter() - t:.1f} s", flush=True)
    try:
        report(bench(db, a.repeats, a.burners), a.repeats, a.burners)
    finally:
        if made:
            for f in db.parent.glob("*"):
                f.unlink()
            db.parent.rmdir()


if __name__ == "__main__":
    main()
