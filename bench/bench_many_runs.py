"""A lab's whole history: ingest and read at 10^3, 10^4 and 10^5 small runs, side by side in one run.

Each run is what a sweep, ladder or seed run leaves: a `run_start` (config, project, group, tags),
20-50 steps of six metrics, an eval and a `run_end` (~8.5 KB). For each N the bench writes N such
runs, then through the CLI (a child process each, as a user runs it):

- `observatory ingest` of all N into a new store: wall time, per run, the ingester's peak RSS;
- append one more run to the N-run store and `observatory ingest` it, three times (the median);
- at the largest N, next: the same bytes as ONE run (one log of as many metrics lines) into a new store,
  twice, then the N runs again (the ratio: both N-run ingests against both one-run ones);
- the read side (`bench/many_runs_pages.py`): `observatory runs --search PREFIX`, the Runs page's
  first table and the Live page at `/live?run=ID` in chromium, the dashboard server's peak RSS.

    python bench/bench_many_runs.py                      # N = 1k, 10k, 100k (~15 min, ~1.7 GB of logs)
    python bench/bench_many_runs.py --runs 1000,10000     # smaller
    python bench/bench_many_runs.py --no-pages            # ingest only

Targets (issue "a lab's whole history"): per run at 100k <= 1.3x per run at 1k, 100k runs <= 10 min;
the same bytes as one run vs as 100k runs <= 2x; append one run to a 100k-run store <= 2 s + start-up;
`runs --search` at 100k <= 1 s; Runs page and Live page at 100k <= 1.5x at 1k; dashboard RSS at 100k
<= 1.2x at 1k.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import ingest_535b  # noqa: E402 (bench/ is not a package)
from ingest_535b import child  # noqa: E402

APPENDS = 3  # one-run appends at each N, one after another: their median is the figure (each is ~2 s of I/O)
METRICS = (
    "train/loss",
    "train/accuracy",
    "opt/lr",
    "grad/norm/total",
    "throughput/tokens_per_s",
    "data/tokens",
)


def write_runs(root: Path, n: int, start: int = 0, seed: int = 0, shape=None) -> int:
    """`n` small runs `sweep-<i>` (i from `start`) under `root`; returns the bytes written.

    `shape(i)`, for a many-run analysis (bench_sweeps): None, or a dict that makes run i a cell of a
    sweep: `start` (fields merged into its run_start: ladder, model, data; `tags` are added to its own),
    `loss(s, steps)` (its train/loss at step s of `steps`, before noise), `tokens` (its data/tokens at
    the end), `eval` (its final val loss) and `restart` (0, or the steps of a second attempt
    `sweep-<i>-r1` resumed from its last step under the same name: the first attempt is then preempted
    and the eval is the second's). Without `shape` the logs are the same bytes as ever."""
    rnd = random.Random(seed + start)
    total = 0

    def log(run: str, t: float, head: dict, steps: range, loss, tokens, end: dict, evl) -> int:
        lines, seq = [], 0

        def ev(kind: str, step: int, data: dict) -> None:
            nonlocal t, seq
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "run": run,
                        "kind": kind,
                        "step": step,
                        "t": round(t, 3),
                        "host": 0,
                        "seq": seq,
                        "data": data,
                    },
                    separators=(",", ":"),
                )
            )
            seq += 1
            t += 0.5

        ev("run_start", steps.start - 1, head)
        for s in steps:
            ev(
                "metrics",
                s,
                {
                    "train/loss": round(loss(s) + rnd.gauss(0, 0.02), 5),
                    "train/accuracy": round(0.2 + s / 100, 4),
                    "opt/lr": 1e-3,
                    "grad/norm/total": round(rnd.uniform(0.5, 1.5), 4),
                    "throughput/tokens_per_s": round(rnd.uniform(9e3, 1.1e4), 1),
                    "data/tokens": tokens(s),
                },
            )
        if evl is not None:
            ev("eval", steps.stop - 1, {"dataset": "val", "loss": evl})
        ev("run_end", steps.stop - 1, end)
        d = root / run
        d.mkdir(parents=True, exist_ok=True)
        text = "\n".join(lines) + "\n"
        (d / "events.0.jsonl").write_text(text)
        return len(text)

    for i in range(start, start + n):
        run = f"sweep-{i:06d}"
        head = {
            "config": {
                "lr": 10 ** rnd.uniform(-4, -2),
                "width": rnd.choice([64, 128, 256]),
                "seed": i % 7,
            },
            "name": run,
            "project": f"proj{i % 5}",
            "group": f"g{i % 50}",
            "tags": ["sweep", f"w{i % 3}"],
        }
        steps, t0 = rnd.randint(20, 50), 1.76e9 + i * 100.0
        x = shape(i) if shape else None
        if x is None:
            curve = [4.0]  # the loss a step, multiplied as it always was
            for _ in range(steps):
                curve.append(curve[-1] * 0.98)
            total += log(
                run,
                t0,
                head,
                range(1, steps + 1),
                lambda s, c=curve: c[s],
                lambda s: s * 4096,
                {"status": "completed", "final_step": steps},
                round(curve[steps], 4),
            )
            continue
        head = {**head, **x["start"], "tags": head["tags"] + list(x["start"].get("tags", []))}
        more = x.get("restart", 0)
        last = steps + more
        law = x["loss"]

        def tokens(s, last=last, x=x):
            return round(x["tokens"] * s / last)

        total += log(
            run,
            t0,
            head,
            range(1, steps + 1),
            lambda s, last=last, law=law: law(s, last),
            tokens,
            {"status": "preempted" if more else "completed", "final_step": steps},
            None if more else x["eval"],
        )
        if more:
            resumed = {**head, "parent": {"run": run, "step": steps}}
            total += log(
                f"{run}-r1",
                t0 + steps + 60,
                resumed,
                range(steps + 1, last + 1),
                lambda s, last=last, law=law: law(s, last),
                tokens,
                {"status": "completed", "final_step": last},
                x["eval"],
            )
    return total


def write_one_run(root: Path, nbytes: int) -> int:
    """One run `one-big` of about `nbytes` of metrics lines (the same six metrics, one line a step)."""
    d = root / "one-big"
    d.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(1)
    total, seq = 0, 0
    with open(d / "events.0.jsonl", "w") as f:
        head = (
            json.dumps(
                {
                    "v": 1,
                    "run": "one-big",
                    "kind": "run_start",
                    "step": 0,
                    "t": 1.76e9,
                    "host": 0,
                    "seq": 0,
                    "data": {"config": {"lr": 1e-3}, "name": "one-big"},
                },
                separators=(",", ":"),
            )
            + "\n"
        )
        f.write(head)
        total += len(head)
        step = 0
        while total < nbytes:
            step += 1
            seq += 1
            line = (
                json.dumps(
                    {
                        "v": 1,
                        "run": "one-big",
                        "kind": "metrics",
                        "step": step,
                        "t": 1.76e9 + step,
                        "host": 0,
                        "seq": seq,
                        "data": {m: round(rnd.uniform(0, 4), 5) for m in METRICS},
                    },
                    separators=(",", ":"),
                )
                + "\n"
            )
            f.write(line)
            total += len(line)
    return total


def ingest(runs: Path, db: Path, label: str) -> tuple[float, float]:
    """(wall s, peak RSS MB) of `observatory ingest` in a child process. First, off the clock: the disk's
    backlog is written out (the logs just written and the last step's store, ~1.3 GB at 100k runs, were
    still being written back while the next step ran, and a 2 s append measured up to 3.6 s), and the logs
    are read once (`warm`)."""
    os.sync()
    warm(runs)
    wall, rss, _ = child(["ingest", "--runs-dir", str(runs), "--db", str(db), "-q"], label=label)
    return wall, rss


def warm(runs: Path) -> None:
    """Read every log under `runs` (its folders listed, its files read), so that each ingest finds them in
    the page cache; how long that took is printed when the logs were not there (over 5 s).

    This VM gives its page cache back within minutes. From a cold cache, listing and reading 10^5 small
    files cost ~25 s more than from a warm one, one 850 MB file ~3 s more, and whether an ingest found them
    cold depended on how long ago they were last read: the same 100k-run ingest measured 80 s and 94 s
    minutes apart. Warm, each ingest measures the ingester, on both sides of the ratio alike; what a
    cold disk adds is the file system's cost of 10^5 files (docs/benchmarks.md gives it)."""
    t0 = time.perf_counter()
    for d in os.scandir(runs):
        if d.is_dir():
            for f in os.scandir(d.path):
                with open(f.path, "rb") as fh:
                    while fh.read(1 << 24):
                        pass
    took = time.perf_counter() - t0
    if took > 5:
        print(f"{'':>7}  (the logs were read into the page cache first: {took:.0f} s)", flush=True)


def startup() -> float:
    """Wall seconds of the CLI's start-up alone (`observatory settings`), the 'start-up' of the targets."""
    return min(child(["settings"], label="startup")[0] for _ in range(3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--runs", default="1000,10000,100000", help="comma-separated run counts (default %(default)s)"
    )
    ap.add_argument(
        "--tmp", type=Path, default=None, help="work folder (default: a new temporary one, removed)"
    )
    ap.add_argument("--no-pages", action="store_true", help="ingest only: no CLI search, chromium or server")
    ap.add_argument(
        "--keep", action="store_true", help="keep the work folder and its stores (store-<N>.duckdb)"
    )
    a = ap.parse_args()
    sizes = sorted(int(x) for x in a.runs.split(","))
    tmp = a.tmp or Path(tempfile.mkdtemp(prefix="bench-many-runs-"))
    tmp.mkdir(parents=True, exist_ok=True)
    # the findings the detectors write (the one-run log's stall, say) go in the work folder, removed with it,
    # not in the user's findings folder (one more folder a run of the bench, never read again)
    os.environ["OBSERVATORY_FINDINGS_DIR"] = ingest_535b.ENV["OBSERVATORY_FINDINGS_DIR"] = str(
        tmp / "findings"
    )
    rows: dict[int, dict] = {}
    try:
        up = startup()
        print(f"CLI start-up (observatory settings): {up:.2f} s")
        runs, have = tmp / "runs", 0
        for n in sizes:
            t0 = time.perf_counter()
            write_runs(runs, n - have, start=have)
            have = n
            gen = time.perf_counter() - t0
            total = sum(p.stat().st_size for p in runs.glob("*/events.0.jsonl"))
            db = tmp / f"store-{n}.duckdb"
            wall, rss = ingest(runs, db, f"ingest-{n}")
            r = rows[n] = {
                "runs": n,
                "bytes": total,
                "ingest_s": wall,
                "per_run_ms": 1000 * wall / n,
                "rss_mb": rss,
                "mb_per_s": total / 1e6 / wall,
            }
            print(
                f"{n:>7,} runs ({total / 1e6:,.0f} MB, written in {gen:.0f} s): ingest into a new store {wall:,.1f} s "
                f"= {r['per_run_ms']:.2f} ms a run, {r['mb_per_s']:.1f} MB/s, peak RSS {rss:,.0f} MB",
                flush=True,
            )
            # the start-up again, next to the appends it is part of: the one measured when the bench began
            # is of another moment, and this machine's speed drifts (a run right after a long one is slower)
            r["startup_s"] = startup()
            appends = []
            for k in range(APPENDS):
                extra = tmp / "extra"
                shutil.rmtree(extra, ignore_errors=True)
                write_runs(extra, 1, start=n + 10_000_000 + k)
                for p in extra.iterdir():
                    shutil.move(str(p), runs / p.name)
                appends.append(ingest(runs, db, f"append-{n}")[0])
            r["append_s"] = statistics.median(appends)
            print(
                f"{'':>7}  append one run and ingest: {r['append_s']:.2f} s, the median of "
                f"{', '.join(f'{x:.2f}' for x in appends)} s (start-up just before: {r['startup_s']:.2f} s)",
                flush=True,
            )
            for k in range(APPENDS):  # the next N's logs are the sweep's alone
                shutil.rmtree(runs / f"sweep-{n + 10_000_000 + k:06d}")
            if n == sizes[-1]:
                r.update(side_by_side(tmp, runs, total, wall, a.keep))
            if not a.no_pages:
                import many_runs_pages

                run_id = f"sweep-{n // 2:06d}"
                pages = many_runs_pages.measure(db, run_id, prefix=f"sweep-{n // 2:06d}"[:-2])
                r.update(pages)
                print(f"{'':>7}  {many_runs_pages.describe(pages)}", flush=True)
            if not a.keep:
                db.unlink(missing_ok=True)
        summary(rows, sizes)
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)


def side_by_side(tmp: Path, runs: Path, total: int, many_s: float, keep: bool) -> dict:
    """The same bytes as one run, and the N runs once more, each into a new store, in the order N runs, one
    run, one run, N runs (the first N-run ingest is the caller's): this machine's speed drifts by a third
    within the hour, and a ratio of ingests minutes apart moved with it; in this order a steady drift
    weighs on both sides alike. The detectors' findings folder is emptied before each, as for the first."""
    one = tmp / "one"
    write_one_run(one, total)
    walls = []
    for src, label in ((one, "one-run"), (one, "one-run"), (runs, "ingest-again")):
        shutil.rmtree(os.environ["OBSERVATORY_FINDINGS_DIR"], ignore_errors=True)
        db = tmp / f"side-{len(walls)}.duckdb"
        walls.append(ingest(src, db, label)[0])
        if not keep:
            db.unlink(missing_ok=True)
    if not keep:
        shutil.rmtree(one, ignore_errors=True)
    one_1, one_2, many_2 = walls
    out = {"one_run_s": (one_1 + one_2) / 2, "ingest_again_s": many_2}
    out["ratio"] = (many_s + many_2) / (one_1 + one_2)
    print(
        f"{'':>7}  the same {total / 1e6:,.0f} MB as one run: {one_1:,.1f} s, {one_2:,.1f} s; "
        f"the {runs.name} again: {many_2:,.1f} s",
        flush=True,
    )
    return out


def summary(rows: dict[int, dict], sizes: list[int]) -> None:
    lo, hi = rows[sizes[0]], rows[sizes[-1]]
    print("\n== summary (targets in brackets)")
    per = hi["per_run_ms"] / lo["per_run_ms"]
    print(
        f"per run at {sizes[-1]:,} vs at {sizes[0]:,}: {hi['per_run_ms']:.2f} / {lo['per_run_ms']:.2f} ms = "
        f"{per:.2f}x [<= 1.3x]; {sizes[-1]:,} runs in {hi['ingest_s'] / 60:.1f} min [<= 10 min at 100k]"
    )
    many = (hi["ingest_s"] + hi["ingest_again_s"]) / 2
    print(
        f"as {sizes[-1]:,} runs vs as one run, same bytes (each the mean of two, in the order runs, one, one, "
        f"runs): {many:,.1f} / {hi['one_run_s']:,.1f} s = {hi['ratio']:.2f}x [<= 2x]"
    )
    print(
        f"append one run at {sizes[-1]:,}: {hi['append_s']:.2f} s [<= 2 s + start-up {hi['startup_s']:.2f} s, "
        "measured just before]"
    )
    if "search_s" in hi:
        print(f"runs --search at {sizes[-1]:,}: {hi['search_s']:.2f} s [<= 1 s]")
        for key, what, goal in (
            ("runs_page_s", "Runs page first table", 1.5),
            ("live_page_s", "Live page first chart", 1.5),
            ("server_rss_mb", "dashboard RSS", 1.2),
        ):
            print(
                f"{what} at {sizes[-1]:,} vs {sizes[0]:,}: {hi[key]:.2f} / {lo[key]:.2f} = {hi[key] / lo[key]:.2f}x "
                f"[<= {goal}x]"
            )


if __name__ == "__main__":
    main()
