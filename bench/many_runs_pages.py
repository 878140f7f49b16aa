"""The read side of `bench/bench_many_runs.py`: what a user feels of a store of many runs.

`measure(db, run, prefix)` gives, for the store `db`:

- `search_s`: `observatory runs --search PREFIX --limit 20` as a child process, start-up included;
- `runs_page_s`: the Runs page opened in chromium until its first table shows the newest run;
- `live_page_s`: the Live page opened at `/live?run=RUN` until its loss chart is drawn;
- `server_rss_mb`: the dashboard server's peak RSS (its VmHWM) after those.

Each page is opened `repeat` times on one server (the first open of each counts its cold queries);
the median counts.

    python bench/many_runs_pages.py --db STORE --run RUN [--prefix P]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the browser tests' server and page helpers

from browser_fixtures import LOAD_MS, chromium, dashboard, open_page  # noqa: E402


def _vmhwm_mb(pid: int) -> float:
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _server_pid(url: str) -> int | None:
    """The pid of the streamlit process listening on `url`'s port (ours: started by `dashboard`)."""
    port = url.rsplit(":", 1)[1]
    out = subprocess.run(
        ["pgrep", "-f", "--", f"--server.port {port}"], capture_output=True, text=True
    ).stdout.split()
    return int(out[0]) if out else None


def search_s(db: Path, prefix: str) -> float:
    t0 = time.perf_counter()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "observatory.cli",
            "runs",
            "--db",
            str(db),
            "--search",
            prefix,
            "--limit",
            "20",
        ],
        check=True,
        capture_output=True,
    )
    return time.perf_counter() - t0


def _timed(browser, url: str, ready) -> float:
    t0 = time.perf_counter()
    page = open_page(browser, url)
    try:
        ready(page)
        return time.perf_counter() - t0
    finally:
        page.close()


def measure(db: Path, run: str, prefix: str, repeat: int = 3) -> dict:
    """The figures above for the store `db` (see the module doc)."""
    out = {"search_s": statistics.median(search_s(db, prefix) for _ in range(repeat))}
    log = Path(db).with_suffix(".streamlit.log")
    with dashboard(Path(db), log) as url, chromium() as browser:

        def runs_ready(page):
            page.wait_for_function(
                "() => (document.querySelector('[data-testid=\"stDataFrame\"]') || {}).textContent?.includes('sweep-')",
                timeout=LOAD_MS,
            )

        def live_ready(page):
            page.wait_for_function(
                "() => document.querySelectorAll('.js-plotly-plot .scatterlayer .trace').length > 0",
                timeout=LOAD_MS,
            )

        out["runs_page_s"] = statistics.median(_timed(browser, f"{url}/", runs_ready) for _ in range(repeat))
        out["live_page_s"] = statistics.median(
            _timed(browser, f"{url}/live?run={run}", live_ready) for _ in range(repeat)
        )
        pid = _server_pid(url)
        out["server_rss_mb"] = _vmhwm_mb(pid) if pid else float("nan")
    return out


def describe(d: dict) -> str:
    return (
        f"runs --search {d['search_s']:.2f} s; Runs page first table {d['runs_page_s']:.2f} s; Live page "
        f"first chart {d['live_page_s']:.2f} s; dashboard server peak RSS {d['server_rss_mb']:,.0f} MB"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", type=Path, required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument(
        "--prefix", default=None, help="the search (default: the run id less its last two characters)"
    )
    a = ap.parse_args()
    print(describe(measure(a.db, a.run, a.prefix or a.run[:-2])))


if __name__ == "__main__":
    main()
