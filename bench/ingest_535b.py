"""`bench/bench_ingest.py --preset 535b`: the reference run's shape through the real path, against the engine.

Every log comes from `observatory.interop.simulate` (what `observatory simulate --preset 535b`
writes); every ingest is the real command in a child process (`python -m observatory.cli
ingest|rebuild`, hooks included), timed by wall clock with its peak RSS (its own VmHWM as it
exits: `child`). The engine side is DuckDB's own Arrow append of the same rows: the rows our
ingest stored, fetched as Arrow outside the clock, `INSERT INTO <table> SELECT * FROM arrow`
into a fresh store file with the same schema and row-group size, then its close (the checkpoint
that leaves the rows in the file, as our ingest's close does), in the same run; the INSERT
alone is printed beside it. Sides alternate `--repeat` times; medians count.

1. expert_load: a 535b log with expert_load every step (`--expert-steps`): expert rows/s; and the
   line path alone, as for metrics below.
2. metrics: a 535b log without expert_load (`--metric-steps`): metric values/s. Next to it the line
   path alone: `observatory.pipeline.ingest(hooks=False)` in this process (no start-up, no hooks)
   against the same engine append, to tell the lines' cost from the fixed costs around them.
3. rebuild: `observatory rebuild` of a 535b run of `--rebuild-steps` steps, expert_load every
   10 steps; extrapolated linearly to 100k steps (the rows grow linearly with the steps).
4. append: 10 more steps appended to that run, then `observatory ingest`; next to it the same
   command with nothing new (process start-up plus an idle pass).
5. --follow: `observatory ingest --follow` on a fresh 60-step run and on the rebuilt run; one
   step appended; seconds until a read-only query sees it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb
from procs import start_follower

from observatory import findings, store
from observatory.interop.simulate import simulate

RUN = "sim-535b"
TARGETS = {
    "expert": 0.25,
    "metrics": 0.3,
    "rebuild_s": 600.0,
    "append_s": 2.0,
    "follow_s": 2.0,
    "ingest_rss_mb": 2048.0,
}
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}


CPU: dict[str, list[float]] = {}  # label -> CPU seconds (user + system, all threads) of each measured run


# How a child reports its own peak RSS: its kernel's VmHWM as it exits. `ru_maxrss` from wait4 is no
# good here: Linux carries the RSS a process had before exec into it, and a child spawned by this
# process (vfork + exec) starts with the bench's own RSS (~0.7 GB after the expert_load side: a bare
# `python -c pass` read 1,049 MB from a 1 GB parent).
_LAUNCH = """import atexit, os, runpy, sys
def _hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            os.write(2, ("\\n" + MARK + line.split()[1] + "\\n").encode())
atexit.register(_hwm)
sys.argv[0] = "observatory"
runpy.run_module("observatory.cli", run_name="__main__", alter_sys=True)
"""
_MARK = "OBSERVATORY_BENCH_VMHWM_KB="


def vmhwm_mb(pid: int) -> float:
    """A live process's peak RSS (the kernel's VmHWM, as `_LAUNCH` reads its own), MB."""
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def child(args: list[str], env: dict | None = None, label: str | None = None) -> tuple[float, float, str]:
    """(wall s, peak RSS MB, stderr) of `python -m observatory.cli ARGS` in a child process.

    Its peak RSS is its own VmHWM (`_LAUNCH`); its CPU seconds go to `CPU[label]`: on a shared, loaded
    machine wall time is partly waiting."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        [sys.executable, "-c", f"MARK = {_MARK!r}\n" + _LAUNCH, *args],
        env=env or ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    err = p.stderr.read().decode()
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t0
    p.returncode = os.waitstatus_to_exitcode(status)
    CPU.setdefault(label or args[0], []).append(ru.ru_utime + ru.ru_stime)
    if p.returncode:
        raise RuntimeError(f"{args}: exit {p.returncode}: {err[-2000:]}")
    kb = [int(x[len(_MARK) :]) for x in err.splitlines() if x.startswith(_MARK)]
    if not kb:
        raise RuntimeError(f"{args}: the child did not report its peak RSS: {err[-2000:]}")
    return wall, kb[-1] / 1024, "\n".join(x for x in err.splitlines() if not x.startswith(_MARK))


def engine_append(src: Path, table: str, tmp: Path) -> float:
    """Seconds DuckDB takes to append `table`'s rows of the store `src` from Arrow into a fresh store file.

    The same work as our ingest's, with nothing of ours around it: the store's schema and its row-group
    size (`store.ROW_GROUP_ROWS`, an ATTACH option), one INSERT from Arrow, and the close that leaves
    the rows in the file (DuckDB checkpoints its WAL there; our ingest's time includes its close too).
    The INSERT alone goes to `ENGINE_INSERT[table]`: the WAL's checkpoint is then still to do."""
    with duckdb.connect(str(src), read_only=True) as con:
        arrow = con.sql(f"SELECT * FROM {table}").to_arrow_table()  # noqa: F841 (read by DuckDB below)
    db = tmp / "engine.duckdb"
    for p in (db, db.with_name(db.name + ".wal")):
        p.unlink(missing_ok=True)
    con = duckdb.connect()
    con.execute(f"ATTACH '{db}' AS engine (ROW_GROUP_SIZE {store.ROW_GROUP_ROWS})")
    con.execute("USE engine")
    con.execute("SET enable_progress_bar = false")
    store.ensure_schema(con)
    t0, c0 = time.perf_counter(), time.process_time()
    con.execute(f"INSERT INTO {table} SELECT * FROM arrow")
    ENGINE_INSERT.setdefault(table, []).append(time.perf_counter() - t0)
    con.close()
    secs = time.perf_counter() - t0
    CPU.setdefault(f"engine {table}", []).append(time.process_time() - c0)
    for p in (db, db.with_name(db.name + ".wal")):
        p.unlink(missing_ok=True)
    return secs


ENGINE_INSERT: dict[str, list[float]] = {}  # table -> seconds of the engine's INSERT alone, each run


def core_side_by_side(runs: Path, tmp: Path, table: str, repeat: int) -> dict:
    """The line path alone (in this process, hooks off) vs the engine appending the same `table` rows."""
    from observatory.pipeline import ingest  # only here: the other sides run the CLI in child processes

    ingest(tmp / "warm-runs", tmp / "warm.duckdb", hooks=False, emit=None)  # imports, outside the clock
    ours, engine = [], []
    for i in range(repeat):
        db = tmp / f"core-{table}-{i}.duckdb"
        t0 = time.perf_counter()
        ingest(runs, db, hooks=False, emit=None)
        ours.append(time.perf_counter() - t0)
        engine.append(engine_append(db, table, tmp))
        for p in (db, db.with_name(db.name + ".wal")):
            p.unlink(missing_ok=True)
    return {
        "ours_s": statistics.median(ours),
        "engine_s": statistics.median(engine),
        "ratio": statistics.median(engine) / statistics.median(ours),
    }


def count(db: Path, sql: str):
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()[0][0]


def side_by_side(runs: Path, tmp: Path, table: str, repeat: int) -> dict:
    """Our `observatory ingest` of `runs` into a fresh store vs the engine appending the same `table` rows."""
    ours, rss, engine = [], [], []
    for i in range(repeat):
        db = tmp / f"ours-{table}-{i}.duckdb"
        top = findings.root(runs)
        for f in [*runs.glob("*/events.1000.jsonl"), *(top.glob("*/events.1000.jsonl") if top else [])]:
            f.unlink()  # the hooks' findings of the previous repeat: each repeat finds them anew
        wall, mb, _ = child(["ingest", "--runs-dir", str(runs), "--db", str(db), "-q"], label=f"ours {table}")
        ours.append(wall)
        rss.append(mb)
        engine.append(engine_append(db, table, tmp))
        n = count(db, f"SELECT count(*) FROM {table}")
        if i < repeat - 1:
            for p in (db, db.with_name(db.name + ".wal")):
                p.unlink(missing_ok=True)
    o, e = statistics.median(ours), statistics.median(engine)
    oc, ec = statistics.median(CPU[f"ours {table}"]), statistics.median(CPU[f"engine {table}"])
    return {
        "rows": n,
        "ours_s": o,
        "engine_s": e,
        "ours_rate": n / o,
        "engine_rate": n / e,
        "ratio": e / o,
        "cpu_ratio": ec / oc,
        "ours_cpu": oc,
        "engine_cpu": ec,
        "rss_mb": max(rss),
        "db": db,
        "engine_insert_s": statistics.median(ENGINE_INSERT[table][-repeat:]),
    }


def _side_line(head: str, x: dict, unit: str) -> str:
    """One `side_by_side` result as the bench prints it: ours, the engine (and its INSERT alone), both ratios."""
    return (
        f"{head}: ours {x['ours_s']:.2f} s ({x['ours_rate'] / 1e6:.2f} M {unit}/s, peak RSS {x['rss_mb']:.0f} MB), "
        f"engine {x['engine_s']:.2f} s ({x['engine_rate'] / 1e6:.2f} M {unit}/s; its INSERT alone "
        f"{x['engine_insert_s']:.2f} s): {x['ratio']:.3f}x; CPU s ours {x['ours_cpu']:.2f}, engine "
        f"{x['engine_cpu']:.2f}: {x['cpu_ratio']:.3f}x"
    )


def _core_line(table: str, c: dict) -> str:
    """One `core_side_by_side` result as the bench prints it."""
    return (
        f"{table}, line path alone (in-process ingest, hooks off): {c['ours_s']:.2f} s vs engine "
        f"{c['engine_s']:.2f} s: {c['ratio']:.3f}x"
    )


def append_steps(log: Path, k: int, at_step: int | None = None) -> int:
    """Append `k` steps to a log: the metrics and expert_load lines of its last `k` logged steps again,
    with the steps moved past the last one (or to `at_step` on), seqs continued, times moved on."""
    lines = log.read_bytes().splitlines()
    last = json.loads(lines[-1])
    evs = [json.loads(x) for x in lines[-4000:]]
    bulk = [e for e in evs if e["kind"] in ("metrics", "expert_load")]
    top = max(e["step"] for e in bulk)
    steps = sorted({e["step"] for e in bulk})[-k:]
    first = top + 1 if at_step is None else at_step
    seq, dt = last["seq"] + 1, max(e["t"] for e in evs) - min(e["t"] for e in evs) + 1.0
    out = []
    for e in bulk:
        if e["step"] in steps:
            e = {**e, "step": first + steps.index(e["step"]), "seq": seq, "t": e["t"] + dt}
            seq += 1
            out.append(json.dumps(e, separators=(",", ":")).encode())
    with open(log, "ab") as f:
        f.write(b"\n".join(out) + b"\n")
    return first + len(steps) - 1


def freshness(runs: Path, db: Path, log: Path, tries: int = 3) -> list[float]:
    """Seconds from appending a step to `log` until a read-only query sees it, under `ingest --follow`."""
    p = start_follower(runs, db, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = []
    try:
        time.sleep(1.0)
        for _ in range(200):  # until it has caught up with what is there
            with store.connect(db) as con:
                have = con.execute("SELECT max(step) FROM metrics WHERE run = ?", [RUN]).fetchall()[0][0]
            if have is not None and have >= append_target(log):
                break
            time.sleep(0.5)
        for _ in range(tries):
            time.sleep(1.0)
            step = append_steps(log, 1)
            t0 = time.perf_counter()
            while True:
                with store.connect(db) as con:
                    have = con.execute("SELECT max(step) FROM metrics WHERE run = ?", [RUN]).fetchall()[0][0]
                if have is not None and have >= step:
                    break
                if time.perf_counter() - t0 > 60:
                    raise RuntimeError("follow: step not visible after 60 s")
                time.sleep(0.05)
            out.append(time.perf_counter() - t0)
    finally:
        p.terminate()
        p.wait(30)
    return out


def append_target(log: Path) -> int:
    lines = log.read_bytes().splitlines()
    return max(json.loads(x).get("step") or 0 for x in lines[-200:] if b'"metrics"' in x)


def compile_bytecode() -> None:
    """The package's bytecode, as `pip install` (and `make setup`) leaves it: where PYTHONDONTWRITEBYTECODE
    is set, an editable checkout whose sources changed would compile them again at every child's start."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", str(Path(__file__).resolve().parents[1] / "observatory")],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def run_535b(args, defaults: dict) -> None:
    """`defaults`: the arguments' defaults, so the summary's command names the ones that differ."""
    compile_bytecode()
    tmp_ctx = None if args.keep else tempfile.TemporaryDirectory()
    tmp = Path(args.keep or tmp_ctx.name)
    tmp.mkdir(parents=True, exist_ok=True)
    res: dict = {}
    try:
        # 1. expert_load every step
        rx = tmp / "runs-expert"
        if not rx.exists():
            simulate("535b", rx, steps=args.expert_steps, expert_load_every=1)
        res["expert"] = x = side_by_side(rx, tmp, "expert_load", args.repeat)
        mb_x = sum(f.stat().st_size for f in rx.glob("*/events.0.jsonl")) / 1e6
        print(
            _side_line(
                f"expert_load: {args.expert_steps} steps, every step, {mb_x:.0f} MB, {x['rows']:,} rows",
                x,
                "rows",
            ),
            flush=True,
        )
        res["core_x"] = cx = core_side_by_side(rx, tmp, "expert_load", args.repeat)
        print(_core_line("expert_load", cx), flush=True)
        # 2. metrics only
        rm = tmp / "runs-metrics"
        if not rm.exists():
            simulate("535b", rm, steps=args.metric_steps, expert_load_every=0)
        res["metrics"] = m = side_by_side(rm, tmp, "metrics", args.repeat)
        print(
            _side_line(f"metrics: {args.metric_steps} steps, {m['rows']:,} values", m, "values"), flush=True
        )
        res["core"] = c = core_side_by_side(rm, tmp, "metrics", args.repeat)
        print(_core_line("metrics", c), flush=True)
        # 3. rebuild
        rr, db = tmp / "runs-rebuild", tmp / "rebuild.duckdb"
        if not rr.exists():
            simulate("535b", rr, steps=args.rebuild_steps, expert_load_every=10)
        wall, mb, _ = child(["rebuild", "--runs-dir", str(rr), "--db", str(db), "-q"])
        rows = count(db, "SELECT count(*) FROM expert_load")
        vals = count(db, "SELECT count(*) FROM metrics")
        scale = 100_000 / args.rebuild_steps
        res["rebuild"] = {"s": wall, "rss_mb": mb, "rows": rows, "values": vals, "s_100k": wall * scale}
        res["rebuild"]["how"] = how = "measured" if scale == 1 else f"x{scale:g}, extrapolated"
        print(
            f"rebuild: {args.rebuild_steps} steps, expert_load every 10: {rows:,} expert rows + {vals:,} "
            f"metric values in {wall:.1f} s, {CPU['rebuild'][-1]:.1f} CPU s (peak RSS {mb:.0f} MB); at 100k steps: "
            f"{wall * scale / 60:.1f} min ({how})",
            flush=True,
        )
        # 4. append 10 steps
        log = rr / RUN / "events.0.jsonl"
        noop = [
            child(["ingest", "--runs-dir", str(rr), "--db", str(db), "-q"])[0] for _ in range(args.repeat)
        ]
        app = []
        for _ in range(args.repeat):
            append_steps(log, 10)
            app.append(child(["ingest", "--runs-dir", str(rr), "--db", str(db), "-q"])[0])
        start = [child(["--help"])[0] for _ in range(args.repeat)]
        res["append"] = {
            "s": statistics.median(app),
            "noop_s": statistics.median(noop),
            "startup_s": statistics.median(start),
        }
        a = res["append"]
        print(
            f"append 10 steps at step {args.rebuild_steps}: observatory ingest {a['s']:.2f} s; with nothing "
            f"new {a['noop_s']:.2f} s; `observatory --help` (start-up) {a['startup_s']:.2f} s; "
            f"append - start-up {a['s'] - a['startup_s']:.2f} s",
            flush=True,
        )
        # 5. --follow freshness, small run and big run
        rs, dbs = tmp / "runs-small", tmp / "small.duckdb"
        if not rs.exists():
            simulate("535b", rs, steps=60, expert_load_every=10)
        small = freshness(rs, dbs, rs / RUN / "events.0.jsonl")
        big = freshness(rr, db, log)
        res["follow"] = {"small": statistics.median(small), "big": statistics.median(big)}
        print(
            f"--follow: a new step visible after {res['follow']['small']:.2f} s at step ~60, "
            f"{res['follow']['big']:.2f} s at step ~{args.rebuild_steps} (medians of {len(small)})",
            flush=True,
        )
    finally:
        if tmp_ctx is not None:
            tmp_ctx.cleanup()
    x, m, r, a, f, c = (
        res["expert"],
        res["metrics"],
        res["rebuild"],
        res["append"],
        res["follow"],
        res["core"],
    )
    cmd = "python bench/bench_ingest.py --preset 535b" + "".join(  # the arguments that made these figures
        f" --{k.replace('_', '-')} {getattr(args, k)}"
        for k in ("repeat", "expert_steps", "metric_steps", "rebuild_steps")
        if getattr(args, k) != defaults[k]
    )
    cx = res["core_x"]
    print(
        f"| ingest, expert_load (535b, every step) | {x['ours_rate'] / 1e6:.2f} M rows/s, {x['ratio']:.2f}x "
        f"DuckDB's Arrow append ({x['engine_rate'] / 1e6:.1f} M/s); the line path alone {cx['ratio']:.2f}x "
        f"| >= {TARGETS['expert']}x | {cmd} |"
    )
    print(
        f"| ingest, metrics (535b) | {m['ours_rate'] / 1e6:.2f} M values/s, {m['ratio']:.2f}x DuckDB's Arrow "
        f"append ({m['engine_rate'] / 1e6:.1f} M/s); the line path alone (no start-up, no hooks) "
        f"{c['ratio']:.2f}x | >= {TARGETS['metrics']}x | {cmd} |"
    )
    print(
        f"| rebuild, 535b run, expert_load every 10 | {r['s']:.0f} s at {args.rebuild_steps} steps "
        f"({r['rows'] / 1e6:.1f}M rows): {r['s_100k'] / 60:.1f} min at 100k steps, {r['how']} | < 10 min | {cmd} |"
    )
    print(
        f"| append 10 steps + observatory ingest | {a['s']:.2f} s at step {args.rebuild_steps} (start-up "
        f"{a['startup_s']:.2f} s) | <= 2 s + start-up | {cmd} |"
    )
    print(
        f"| ingest --follow: new step visible | {f['small']:.2f} s at step 60, {f['big']:.2f} s at step "
        f"{args.rebuild_steps} | <= 2 s | {cmd} |"
    )
    print(f"| ingester peak RSS | {max(x['rss_mb'], m['rss_mb'], r['rss_mb']):.0f} MB | <= 2 GB | {cmd} |")
