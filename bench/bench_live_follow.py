"""Live page freshness: with `ingest --follow`, how soon a new step shows on the Live page, in a real browser.

Two 535b runs from `observatory simulate` (48 layers x 384 experts, expert_load every 10 steps),
each still running (its final `run_end` cut off the log, so the Live page refreshes itself): a
short one (60 steps) and a long one (`--steps`, default 10k; 100000 is the reference run's
length). Each is ingested into its own store by `observatory ingest`; then `observatory ingest
--follow` and the dashboard (app.py under `streamlit run`, default settings) run over that store,
and headless Debian chromium holds the run's Live page open. Each try appends one step to the log
(`bench/ingest_535b.append_steps`) at a random moment and times two things: until the page's
status line shows it ("Last step N": the follower's poll (`follow_interval_s`), its pass, the
cache keeper's refill, the status line's own refresh (every `live.STATUS_S` s) and the browser's
redraw, all of it), and until the loss chart is redrawn with it (the charts' refresh, every
`live.REFRESH_S` s). Side by side in one run: the long run's figures against the short run's
(goal: within 2 s at either length, and no slower at the long run's length than at its start).

    .venv/bin/python bench/bench_live_follow.py                    # 60 steps vs 10k steps
    .venv/bin/python bench/bench_live_follow.py --steps 100000     # vs the reference run's length
    .venv/bin/python bench/bench_live_follow.py --runs DIR --db DB # an existing running run (sim-535b)
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the browser tests' page helpers

from browser_fixtures import last_step  # noqa: E402
from procs import start_follower  # noqa: E402

from bench.bench_dashboard import CHROMIUM_ARGS, _free_port, _serve  # noqa: E402
from bench.ingest_535b import ENV, RUN, append_steps, append_target, child, compile_bytecode  # noqa: E402
from observatory.dashboard.pages.live import REFRESH_S, STATUS_S  # noqa: E402
from observatory.interop.simulate import simulate  # noqa: E402

GOAL_S = 2.0
# the loss chart's line as drawn (the first plotly chart's `train/loss` trace): its length and last point,
# which change when a redraw brings the new step (its bucket's last value)
LOSS_JS = """() => { const gd = document.querySelector('.js-plotly-plot');
  const t = gd && gd._fullData && gd._fullData.find(t => t.name === 'train/loss');
  if (!t || !t.x || !t.x.length) return null;
  return [t.x.length, Number(t.x[t.x.length - 1]), Number(t.y[t.y.length - 1])]; }"""


def running_run(runs: Path, steps: int) -> Path:
    """A 535b run of `steps` steps under `runs`, still running: its last `run_end` cut off, and its clock
    moved on so that its last event is a few seconds old (the simulator's clock starts on 2026-08-03,
    and a run silent for `stale_after_s` is shown crashed). Its log."""
    simulate("535b", runs, steps=steps, expert_load_every=10)
    log = runs / RUN / "events.0.jsonl"
    events = [json.loads(x) for x in log.read_bytes().splitlines()]
    while events and events[-1]["kind"] == "run_end":
        events.pop()
    shift = time.time() - 5.0 - max(e["t"] for e in events)
    with open(log, "wb") as f:
        for e in events:
            e["t"] += shift
            f.write(json.dumps(e, separators=(",", ":")).encode() + b"\n")
    return log


def measure(
    browser, runs: Path, db: Path, log: Path, tries: int, rng: random.Random, tmp: Path
) -> tuple[list[float], list[float]]:
    """Seconds from appending a step to `log` until the Live page's status line shows it, and until its loss
    chart is redrawn with it, `tries` times."""
    follower = start_follower(runs, db, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    append_steps(log, 1)  # news since the ingest (a long run's ingest outlasts `stale_after_s`)
    with open(tmp / f"streamlit-{db.stem}.log", "wb") as slog:
        port = _free_port()
        server = _serve(ROOT / "app.py", db, port, slog)
        page = None
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(f"http://127.0.0.1:{port}/live?run={RUN}")
            page.get_by_text(
                "Live: the charts are redrawn"
            ).first.wait_for()  # the run is live: the panel refreshes
            deadline = time.time() + 120
            while (last_step(page) or -1) < append_target(log):  # the follower has caught up
                if time.time() > deadline:
                    raise RuntimeError(f"the Live page did not reach step {append_target(log)}")
                time.sleep(0.2)
            page.wait_for_function(f"() => ({LOSS_JS})() !== null")  # the loss chart is drawn
            status, chart = [], []
            for _ in range(tries):
                time.sleep(1.0 + rng.uniform(0.0, 2.0 * REFRESH_S))  # a random phase of the poll and refresh
                before = page.evaluate(LOSS_JS)
                step = append_steps(log, 1)
                t0 = time.perf_counter()
                t_status = t_chart = None
                while t_status is None or t_chart is None:
                    now = time.perf_counter() - t0
                    if now > 60:
                        raise RuntimeError(
                            f"step {step} not on the Live page after 60 s ({t_status}, {t_chart})"
                        )
                    if t_status is None and (last_step(page) or -1) >= step:
                        t_status = now
                    if t_chart is None and page.evaluate(LOSS_JS) != before:
                        t_chart = now
                    time.sleep(0.05)
                status.append(t_status)
                chart.append(t_chart)
            if page.locator('[data-testid="stException"]').count():
                raise RuntimeError("an exception on the Live page")
            return status, chart
        finally:
            if page is not None:
                page.close()
            server.terminate()
            server.wait(30)
            follower.terminate()
            follower.wait(30)


def summary(xs: list[float]) -> str:
    q = statistics.quantiles(xs, n=10, method="inclusive") if len(xs) >= 2 else xs  # within the data
    return f"median {statistics.median(xs):.2f} s, p90 {q[-1]:.2f} s, max {max(xs):.2f} s (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10_000, help="steps of the long run")
    ap.add_argument("--tries", type=int, default=10, help="steps appended per run")
    ap.add_argument("--runs", type=Path, help="the long run's runs dir (a running sim-535b): reuse it")
    ap.add_argument("--db", type=Path, help="with --runs: its store")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    compile_bytecode()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        sides = {}
        for name, steps in (("short", 60), ("long", args.steps)):
            if name == "long" and args.runs:
                runs, db = args.runs, args.db
                log = runs / RUN / "events.0.jsonl"
            else:
                runs, db = tmp / f"runs-{name}", tmp / f"{name}.duckdb"
                log = running_run(runs, steps)
            if not db.exists():
                wall, mb, _ = child(["ingest", "--runs-dir", str(runs), "--db", str(db), "-q"])
                print(f"{name}: {steps} steps ingested in {wall:.1f} s (peak RSS {mb:.0f} MB)", flush=True)
            sides[name] = (runs, db, log)
        res = {}
        with sync_playwright() as pw:
            browser = pw.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS, headless=True
            )
            try:
                for name, (runs, db, log) in sides.items():
                    res[name] = st, ch = measure(browser, runs, db, log, args.tries, rng, tmp)
                    print(
                        f"{name} run (step ~{append_target(log):,}): a new step in the status line after "
                        f"{summary(st)}: {', '.join(f'{x:.2f}' for x in st)}",
                        flush=True,
                    )
                    print(
                        f"{name} run: on the loss chart after {summary(ch)}: {', '.join(f'{x:.2f}' for x in ch)}",
                        flush=True,
                    )
            finally:
                browser.close()
    (s_st, s_ch), (l_st, l_ch) = res["short"], res["long"]
    within = [
        f"{k} {sum(x <= GOAL_S for x in v)}/{len(v)}"
        for k, v in (
            ("status line at step 60", s_st),
            (f"at step {args.steps:,}", l_st),
            ("loss chart at step 60", s_ch),
            (f"at step {args.steps:,}", l_ch),
        )
    ]
    print(
        f"long / short, medians: status line {statistics.median(l_st) / statistics.median(s_st):.2f}x, loss chart "
        f"{statistics.median(l_ch) / statistics.median(s_ch):.2f}x; within {GOAL_S:g} s: {', '.join(within)} "
        f"(the follower's 0.5 s poll + its pass + the status line's {STATUS_S:g} s / the charts' {REFRESH_S} s "
        "refresh + the redraw)"
    )
    cmd = "python bench/bench_live_follow.py" + (f" --steps {args.steps}" if args.steps != 10_000 else "")
    print(
        f"| --follow: a new step on the Live page, in chromium | status line: step 60 {summary(s_st)}; step "
        f"{args.steps:,} {summary(l_st)}. Loss chart: step 60 {summary(s_ch)}; step {args.steps:,} {summary(l_ch)} "
        f"| <= {GOAL_S:g} s at any step | {cmd} |"
    )


if __name__ == "__main__":
    main()
