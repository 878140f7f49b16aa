"""Load bench: 20 concurrent viewers on the Live, Experts and SQL pages for 2 minutes, while a run trains.

A bounded load generator on 127.0.0.1 only. It starts, in a temp dir, a trainer
(`trainer train --config trainer/configs/tiny.yaml`, many steps), `observatory
ingest --follow` and `observatory dashboard`, then speaks Streamlit's own
websocket protocol (`/_stcore/stream`, the protobufs `streamlit.proto` ships) as
a browser would: each viewer opens a page (a `rerun_script` BackMsg with the
page name and query string), answers each `auto_rerun` of the Live page (its
status line's and its panel's) by rerunning that fragment every interval,
submits the SQL form, stays a few seconds and opens the next page, so exactly N
sessions are open at any time until the hard stop (once all have arrived: evenly
over the first `--ramp` seconds, 8 by default, the shortest stay; `--ramp 0` opens
all N pages in the same instant).
The server does all its real work; only the browser's drawing is left out.

Figures, first with ONE viewer (the baseline, same store, trainer writing), then
with N at once:

- time to first chart: from opening a page to its first plotly chart (Live,
  Experts) or, on SQL, to the result of the example query submitted as soon as the
  form arrives; p50/p95 per page, and the ratio p95(N) / p50(1) (goal <= 3);
- errors: exceptions, error alerts, page-not-found, dropped connections, views
  with no first chart, anything a viewer would see as broken (goal 0); "busy"
  messages (the SQL executor's concurrency cap, the calm "store busy" note) are
  counted apart;
- staleness: each Live view's "Last step" against the event log's own times:
  the age of the oldest step the viewer is not yet shown, at each refresh and just
  before the next one (the worst moment; goal <= 5 s);
- the dashboard process's RSS, sampled every second: peak, and its growth over
  the second half (MB/min), goal peak < 1500 MB;
- how long the follower held the store's write lock (readers wait for it): share
  of the load's time, and the holds' p50/p95/max, from /proc/locks.

    nice .venv/bin/python bench/bench_load.py                      # 20 viewers x 120 s
    nice .venv/bin/python bench/bench_load.py --viewers 5 --duration 20
    .venv/bin/python bench/bench_load.py --trainer-nice 10       # the trainer yields the cores to visitors
    nice .venv/bin/python bench/bench_load.py --ramp 0             # all 20 arrive in the same instant (a burst)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the viewers, shared with the tests

from load_viewer import PAGES, RUN, View, page_query, run_viewers, view_page  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
GOALS = {"ratio": 3.0, "staleness_s": 5.0, "rss_mb": 1500.0}


# ---------------------------------------------------------------- the world around the viewers


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StepClock:
    """When each step was logged, read from the run's event log as it grows (the `t` of its metrics event)."""

    def __init__(self, runs_dir: Path):
        self.runs_dir = runs_dir
        self.t: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tail, daemon=True)
        self._thread.start()

    def _tail(self) -> None:
        pos: dict[Path, int] = {}
        while not self._stop.wait(0.1):
            for path in self.runs_dir.glob(f"{RUN}/events.*.jsonl"):
                with path.open("rb") as f:
                    f.seek(pos.get(path, 0))
                    chunk = f.read()
                    cut = chunk.rfind(b"\n") + 1
                    pos[path] = pos.get(path, 0) + cut
                for line in chunk[:cut].splitlines():
                    if b'"metrics"' not in line:
                        continue
                    ev = json.loads(line)
                    if ev.get("kind") == "metrics" and ev.get("step") is not None:
                        self.t.setdefault(int(ev["step"]), float(ev["t"]))

    def first_after(self, step: int) -> float | None:
        """When the first step after `step` was logged, None if none yet."""
        later = [t for s, t in self.t.items() if s > step]
        return min(later) if later else None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def staleness(views: list[View], clock: StepClock) -> tuple[list[float], list[float]]:
    """(at each refresh, just before the next) ages in s of the oldest step a Live viewer was not shown."""
    steps = sorted(clock.t.items())
    at, before = [], []

    def newer_than(step: int) -> float | None:
        # steps are logged in order: the first one after `step` is the oldest not shown
        import bisect

        i = bisect.bisect_right(steps, (step, float("inf")))
        return steps[i][1] if i < len(steps) else None

    for v in views:
        for k, (t, step) in enumerate(v.steps):
            nxt = newer_than(step)
            at.append(max(0.0, t - nxt) if nxt is not None and nxt < t else 0.0)
            until = v.steps[k + 1][0] if k + 1 < len(v.steps) else None
            if until is not None:
                before.append(max(0.0, until - nxt) if nxt is not None and nxt < until else 0.0)
    return at, before


class RssSampler:
    """The dashboard process's resident memory, every second."""

    def __init__(self, pid: int):
        import psutil

        self.proc = psutil.Process(pid)
        self.samples: list[tuple[float, float]] = []  # (time, MB)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(1.0):
            with contextlib.suppress(Exception):
                self.samples.append((time.time(), self.proc.memory_info().rss / 2**20))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def between(self, t0: float, t1: float) -> list[tuple[float, float]]:
        return [(t, mb) for t, mb in self.samples if t0 <= t <= t1]


class LockWatch:
    """When the store's writer holds `<store>.lock` exclusively (an ingest batch with its hooks), read from
    /proc/locks every 5 ms: a probe that takes no lock, so it cannot delay the writer or the readers."""

    def __init__(self, db: Path):
        self.lock = db.with_name(db.name + ".lock")
        self.holds: list[tuple[float, float]] = []  # (start, end), wall time
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _held(self, inode: int) -> bool:
        with open("/proc/locks") as f:
            return any(
                " WRITE " in line and line.split()[5].endswith(f":{inode}") for line in f if "FLOCK" in line
            )

    def _run(self) -> None:
        since = None
        while not self._stop.wait(0.005):
            try:
                held = self._held(os.stat(self.lock).st_ino)
            except (OSError, IndexError):
                continue
            now = time.time()
            if held and since is None:
                since = now
            elif not held and since is not None:
                self.holds.append((since, now))
                since = None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def summary(self, t0: float, t1: float) -> str:
        ms = [1000 * (b - a) for a, b in self.holds if t0 <= a <= t1]
        if not ms:
            return "  store write lock: never seen held (or /proc/locks unreadable)"
        return (
            f"  store write lock (the follower's batches): held {sum(ms) / 10 / (t1 - t0):.0f} % of the load, "
            f"{len(ms)} holds, p50 {pct(ms, 50):.0f} ms, p95 {pct(ms, 95):.0f} ms, max {max(ms):.0f} ms"
        )


def growth_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of RSS over the second half of the samples, MB/min."""
    half = samples[len(samples) // 2 :]
    if len(half) < 3:
        return 0.0
    ts = [t for t, _ in half]
    ms = [m for _, m in half]
    return statistics.linear_regression(ts, ms).slope * 60


class World:
    """Trainer, follower and dashboard over one temp runs dir and store; all on 127.0.0.1, all stopped at exit."""

    def __init__(self, tmp: Path, steps: int = 1_000_000, trainer_nice: int = 0):
        self.trainer_nice = trainer_nice
        self.runs_dir, self.db, self.tmp = tmp / "runs", tmp / "store.duckdb", tmp
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[subprocess.Popen] = []
        self.env = dict(os.environ, OBSERVATORY_RUNS=str(self.runs_dir), OBSERVATORY_DB=str(self.db))
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), self.env.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        self.steps = steps
        self.port = free_port()

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = (self.tmp / f"{name}.log").open("wb")
        p = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(p)
        return p

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text(errors="replace")

    def start(self, timeout_s: float = 240.0) -> None:
        obs = [str(BIN / "observatory")]
        where = ["--runs-dir", str(self.runs_dir), "--db", str(self.db)]
        nice = ["nice", "-n", str(self.trainer_nice)] if self.trainer_nice else []
        self.trainer = self._spawn(
            "trainer",
            [
                *nice,
                str(BIN / "trainer"),
                "train",
                "--config",
                "trainer/configs/tiny.yaml",
                "--runs-dir",
                str(self.runs_dir),
                "--run-id",
                RUN,
                f"steps={self.steps}",
                "checkpoint.every=1000000",
            ],
        )
        deadline = time.time() + timeout_s
        while not list(self.runs_dir.glob(f"{RUN}/events.*.jsonl")):
            self._alive(deadline, "trainer", self.trainer)
        while True:  # wait for the first steps (the JAX compile), then ingest once so the run is in the store
            with contextlib.suppress(OSError):
                if any(b'"metrics"' in p.read_bytes() for p in self.runs_dir.glob(f"{RUN}/events.*.jsonl")):
                    break
            self._alive(deadline, "trainer", self.trainer)
        subprocess.run(
            [*obs, "ingest", *where, "--quiet"], cwd=ROOT, env=self.env, check=True, capture_output=True
        )
        self.follower = self._spawn("follow", [*obs, "ingest", *where, "--follow", "--quiet"])
        self.server = self._spawn("dashboard", [*obs, "dashboard", *where, "--port", str(self.port)])
        while True:
            self._alive(deadline, "dashboard", self.server)
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/_stcore/health", timeout=2) as r:
                    if r.status == 200:
                        return

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds so far of the trainer and the follower (with their children)."""
        import psutil

        out = {}
        for name, p in (("trainer", self.trainer), ("follower", self.follower)):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(p.pid)
                out[name] = sum(sum(c.cpu_times()[:2]) for c in [proc, *proc.children(recursive=True)])
        return out

    def _alive(self, deadline: float, name: str, p: subprocess.Popen) -> None:
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited: {self.log(name)[-2000:]}")
        if time.time() > deadline:
            raise RuntimeError(f"{name} not ready in time: {self.log(name)[-2000:]}")
        time.sleep(0.3)

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self) -> World:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------- figures


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


@dataclass
class Figures:
    viewers: int
    duration_s: float
    single: dict[str, list[float]]
    load: dict[str, list[float]]
    views: int
    errors: list[str]
    busy: list[str]
    stale_at: list[float]
    stale_before: list[float]
    rss_peak_mb: float
    rss_growth_mb_min: float
    rss_idle_mb: float
    cpu: dict[str, float] = field(default_factory=dict)  # % of one core during the load: server, viewers
    load_avg: float = 0.0
    # one viewer: the server's CPU seconds per view (by page) and per Live auto-refresh
    cpu_view: dict[str, list[float]] = field(default_factory=dict)
    cpu_refresh: list[tuple[float, float]] = field(default_factory=list)  # (fragment interval, CPU s)
    server_cpu_s: float = 0.0  # under load: the server's CPU seconds in all
    refreshes: int = 0  # under load: the Live auto-refreshes asked for
    lock_line: str = ""  # under load: how long the writer held the store (`LockWatch`)
    ramp_s: float = 0.0  # the viewers arrived evenly over this many seconds (0: all in the same instant)
    # SQL views, one viewer and under load: (opening -> form submitted, submitted -> result rows) in s
    sql_phases: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)

    def ratio(self, page: str | None = None) -> float:
        pages = [page] if page else [p for p in PAGES if self.load.get(p) and self.single.get(p)]
        return max(pct(self.load[p], 95) / statistics.median(self.single[p]) for p in pages)

    def ok(self) -> dict[str, bool]:
        return {
            "no errors": not self.errors,
            f"p95 first chart <= {GOALS['ratio']:g}x single": self.ratio() <= GOALS["ratio"],
            f"staleness <= {GOALS['staleness_s']:g} s": max(self.stale_before + self.stale_at, default=0)
            <= GOALS["staleness_s"],
            f"peak RSS < {GOALS['rss_mb']:g} MB": self.rss_peak_mb < GOALS["rss_mb"],
        }

    def lines(self) -> list[str]:
        arrive = (
            f"arriving over the first {self.ramp_s:g} s"
            if self.ramp_s
            else "all arriving at the same instant"
        )
        out = [
            f"load: {self.viewers} viewers x {self.duration_s:.0f} s on Live/Experts/SQL ({arrive}), {self.views} views"
        ]
        out.append(
            f"  {'page':<8} {'1 p50':>7} {'1 p95':>7} {'N p50':>7} {'N p95':>7} {'ratio':>6}  (first chart, s)"
        )
        for p in PAGES:
            s, n = self.single.get(p, []), self.load.get(p, [])
            if s and n:
                out.append(
                    # one viewer's median as the ratio takes it (pct(s, 50) is the upper middle of an even count)
                    f"  {p:<8} {statistics.median(s):7.2f} {pct(s, 95):7.2f} {pct(n, 50):7.2f} {pct(n, 95):7.2f}"
                    f" {self.ratio(p):6.2f}  ({len(s)} / {len(n)} views)"
                )
        out.append(f"  errors: {len(self.errors)}   busy: {len(self.busy)}")
        kinds: dict[str, int] = {}
        for e in self.errors:
            k = re.sub(r"within \d+ s", "within the view", e)
            kinds[k] = kinds.get(k, 0) + 1
        for e, n in sorted(kinds.items(), key=lambda kv: -kv[1])[:8]:
            out.append(f"    {n:4d} x {e}")
        for b in sorted(set(self.busy))[:5]:
            out.append(f"    busy: {b}")
        sa, sb = self.stale_at, self.stale_before
        out.append(
            f"  staleness (s): at refresh p95 {pct(sa, 95):.2f} max {max(sa, default=0):.2f}; "
            f"just before the next p95 {pct(sb, 95):.2f} max {max(sb, default=0):.2f}  ({len(sa)} refreshes)"
        )
        out.append(
            f"  dashboard RSS: {self.rss_idle_mb:.0f} MB before load, peak {self.rss_peak_mb:.0f} MB, "
            f"growth over the second half {self.rss_growth_mb_min:+.1f} MB/min"
        )
        med = lambda xs: statistics.median(xs) if xs else float("nan")  # noqa: E731
        out.append(
            "  server CPU-s, one viewer: per view "
            + ", ".join(f"{p} {med(self.cpu_view.get(p, [])):.3f}" for p in PAGES)
            + "; per Live refresh "
            + ", ".join(
                f"every {k:g} s {med([c for i, c in self.cpu_refresh if i == k]):.3f} "
                f"({sum(i == k for i, _ in self.cpu_refresh)} refreshes)"
                for k in sorted({i for i, _ in self.cpu_refresh}, reverse=True)
            )
        )
        out.append(
            f"  server CPU-s under load: {self.server_cpu_s:.1f} for {self.views} views and {self.refreshes} "
            f"refreshes ({self.server_cpu_s / max(1, self.views):.3f} per view with its refreshes)"
        )
        out.append(
            f"  CPU during the load (% of one core): dashboard {self.cpu.get('server', 0):.0f}, "
            f"viewers {self.cpu.get('viewers', 0):.0f}, trainer {self.cpu.get('trainer', 0):.0f}, "
            f"follower {self.cpu.get('follower', 0):.0f}; machine load average {self.load_avg:.1f} "
            f"({os.cpu_count()} cores)"
        )
        if self.sql_phases:
            out.append(
                "  sql phases (s): "
                + "; ".join(
                    f"{who}: page to its form p50 {pct(f, 50):.2f} p95 {pct(f, 95):.2f}, "
                    f"query to its rows p50 {pct(q, 50):.2f} p95 {pct(q, 95):.2f}"
                    for who, (f, q) in self.sql_phases.items()
                    if f
                )
            )
        if self.lock_line:
            out.append(self.lock_line)
        for name, good in self.ok().items():
            out.append(f"  {'PASS' if good else 'FAIL'}  {name}")
        return out


def measure(
    world: World,
    viewers: int,
    duration_s: float,
    single_views: int = 8,
    dwell=(8.0, 16.0),
    profile: Path | None = None,
    ramp_s: float = 0.0,
    dump: Path | None = None,
) -> Figures:
    """The single-viewer baseline, then `viewers` at once for `duration_s`, with staleness and RSS.

    `profile`: a file for py-spy's collapsed stacks of the dashboard during the load (py-spy on PATH).
    `dump`: a JSON file for every view (page, opened, first chart, SQL form: wall times) and every
    write-lock hold, one viewer's and the load's, to see which views waited for what.
    """
    from observatory.queries.dashboard import SQL_EXAMPLES

    sqls = list(SQL_EXAMPLES.values())
    clock = StepClock(world.runs_dir)
    rss = RssSampler(world.server.pid)
    locks = LockWatch(world.db)
    try:
        # warm-up: the server's first page view imports the pages' modules and plotly
        asyncio.run(view_page(world.port, "live", page_query("live"), 10.0))
        single: dict[str, list[float]] = {p: [] for p in PAGES}
        cpu_view: dict[str, list[float]] = {p: [] for p in PAGES}
        cpu_refresh: list[tuple[float, float]] = []
        single_err: list[str] = []
        single_seen: list[View] = []

        def server_cpu() -> float:
            t = rss.proc.cpu_times()
            return t.user + t.system

        for k in range(single_views):
            for p in PAGES:
                v = asyncio.run(
                    view_page(world.port, p, page_query(p), 6.0, sqls[k % len(sqls)], cpu=server_cpu)
                )
                single_err += v.errors
                single_seen.append(v)
                if v.first is not None:
                    single[p].append(v.first)
                if v.cpu_view is not None:
                    cpu_view[p].append(v.cpu_view)
                cpu_refresh += v.cpu_refresh
        t_idle = time.time()
        idle = [mb for _, mb in rss.samples[-5:]] or [0.0]
        spy = None
        if profile is not None:
            spy = subprocess.Popen(
                [
                    str(BIN / "py-spy") if (BIN / "py-spy").exists() else "py-spy",
                    "record",
                    "--pid",
                    str(world.server.pid),
                    "--duration",
                    str(int(duration_s)),
                    "--rate",
                    "50",
                    "--nonblocking",
                    "--gil",
                    "--format",
                    "raw",
                    "--output",
                    str(profile),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        c0, r0, o0 = rss.proc.cpu_times(), os.times(), world.cpu_s()
        views = asyncio.run(run_viewers(world.port, viewers, duration_s, sqls, dwell, ramp_s))
        if spy is not None:
            spy.wait(60)
        t_end = time.time()
        c1, r1, o1 = rss.proc.cpu_times(), os.times(), world.cpu_s()
        span = t_end - t_idle
        cpu = {
            "server": 100 * (c1.user + c1.system - c0.user - c0.system) / span,
            "viewers": 100 * (r1.user + r1.system - r0.user - r0.system) / span,
            **{k: 100 * (o1[k] - o0.get(k, 0.0)) / span for k in o1},
        }
        time.sleep(0.5)  # the clock reads the last steps shown
    finally:
        clock.stop()
        rss.stop()
        locks.stop()
    load = {p: [v.first for v in views if v.page == p and v.first is not None] for p in PAGES}
    if dump is not None:

        def rows(vs: list[View]) -> list[dict]:
            return [
                {"page": v.page, "opened": v.opened, "first": v.first, "form": v.form, "errors": v.errors}
                for v in vs
            ]

        dump.write_text(
            json.dumps(
                {
                    "single": rows(single_seen),
                    "load": rows(views),
                    "load_from": t_idle,
                    "load_to": t_end,
                    "holds": locks.holds,
                }
            )
        )
    at, before = staleness([v for v in views if v.page == "live"], clock)
    during = rss.between(t_idle, t_end)

    def phases(vs: list[View]) -> tuple[list[float], list[float]]:
        done = [v for v in vs if v.page == "sql" and v.form is not None and v.first is not None]
        return [v.form for v in done], [v.first - v.form for v in done]

    return Figures(
        viewers=viewers,
        duration_s=duration_s,
        single=single,
        load=load,
        views=len(views),
        errors=single_err + [e for v in views for e in v.errors],
        busy=[b for v in views for b in v.busy],
        stale_at=at,
        stale_before=before,
        rss_peak_mb=max((mb for _, mb in rss.samples), default=0.0),
        rss_growth_mb_min=growth_mb_per_min(during),
        rss_idle_mb=statistics.median(idle),
        cpu=cpu,
        load_avg=os.getloadavg()[0],
        cpu_view=cpu_view,
        cpu_refresh=cpu_refresh,
        server_cpu_s=c1.user + c1.system - c0.user - c0.system,
        refreshes=sum(v.refreshes for v in views),
        lock_line=locks.summary(t_idle, t_end),
        ramp_s=ramp_s,
        sql_phases={"one viewer": phases(single_seen), "under load": phases(views)},
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--viewers", type=int, default=20)
    ap.add_argument("--duration", type=float, default=120.0, help="seconds of load (hard stop)")
    ap.add_argument(
        "--single-views",
        type=int,
        default=8,
        help="baseline views per page with one viewer (its median is the ratio's denominator: 4 swung 3x between runs)",
    )
    ap.add_argument(
        "--trainer-nice",
        type=int,
        default=0,
        metavar="N",
        help="run the trainer under `nice -n N`: as on a server whose visitors come before a trainer "
        "that shares its cores (the lab's own trainer runs on its cluster)",
    )
    ap.add_argument(
        "--ramp",
        type=float,
        default=8.0,
        metavar="S",
        help="the viewers arrive evenly over the first S seconds (default: the shortest dwell, as people who "
        "browse page after page do); 0: all open a page in the same instant, a burst of 20x the steady "
        "rate whose views are the top 10%% of a 2-minute run's",
    )
    ap.add_argument(
        "--dwell",
        type=float,
        nargs=2,
        default=(8.0, 16.0),
        metavar=("MIN", "MAX"),
        help="each viewer stays on a page between MIN and MAX seconds (default 8 16)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (logs, store)")
    ap.add_argument(
        "--profile", type=Path, help="write py-spy's collapsed stacks of the dashboard under load here"
    )
    ap.add_argument(
        "--dump", type=Path, help="write every view's times and the write lock's holds here (JSON)"
    )
    args = ap.parse_args()
    if args.viewers > 50 or args.duration > 600:
        ap.error("bounded: at most 50 viewers and 600 s")
    tmp = Path(tempfile.mkdtemp(prefix="bench-load-"))
    try:
        with World(tmp, trainer_nice=args.trainer_nice) as world:
            figs = measure(
                world,
                args.viewers,
                args.duration,
                args.single_views,
                dwell=tuple(args.dwell),
                profile=args.profile,
                ramp_s=args.ramp,
                dump=args.dump,
            )
        print("\n".join(figs.lines()))
        print(
            f"  trainer: nice {args.trainer_nice}"
            + ("" if args.trainer_nice else " (it competes with the server as an equal)")
        )
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
