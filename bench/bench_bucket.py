"""A runs dir in a bucket against the same runs in a local folder, side by side in one run.

Against moto's S3 server on a local port (the same requests a real bucket gets; its latency is a local
process's, not a region's):

- requests per idle pass (`ingest` with nothing new) at 10, 10^3 and 10^4 finished runs, and that pass's
  wall time, beside a local folder's idle pass;
- catch-up: the first `ingest` of the largest N into a new store, bucket against local folder: the
  first observatory's (chunk by chunk), and a new replica's once the analyst packed them (`_packs/`);
- step -> store lag, p50 and p95, with `ingest --follow` and one live writer logging a step every 0.1 s:
  the default roll (`chunk_s` 10 s), a short roll (1 s), and the local folder;
- the writer's overhead per `log()` call: bucket runs dir against local folder.

    python bench/bench_bucket.py                       # N = 10, 1000, 10000 (~5 min on 2 cores)
    python bench/bench_bucket.py --runs 10,300 --lag-s 20

Goals (issue 53): idle pass requests at 10^4 runs <= 2x those at 10; catch-up <= 3x the local folder's;
lag p95 <= 60 s with the defaults and <= 10 s with a shorter roll.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import bucket_fixtures  # noqa: E402 (the tests' emulators)

import observatory  # noqa: E402
from observatory import bucket, store  # noqa: E402
from observatory.ingest.bucket_source import BucketSource  # noqa: E402
from observatory.pipeline import ingest  # noqa: E402

DIRECT = False  # --direct: populate moto's S3 in this process without HTTP


def run_log(run: str, t0: float) -> bytes:
    lines = [
        f'{{"v":1,"run":"{run}","kind":"run_start","step":null,"t":{t0},"host":0,"seq":0,"data":{{"config":{{"lr":0.001}}}}}}'
    ]
    for s in range(20):
        lines.append(
            f'{{"v":1,"run":"{run}","kind":"metrics","step":{s},"t":{t0 + s},"host":0,"seq":{s + 1},'
            f'"data":{{"train/loss":{3.0 - s * 0.01},"lr":0.001}}}}'
        )
    lines.append(
        f'{{"v":1,"run":"{run}","kind":"run_end","step":19,"t":{t0 + 20},"host":0,"seq":21,'
        f'"data":{{"status":"completed","final_step":19}}}}'
    )
    return ("\n".join(lines) + "\n").encode()


def populate(url: str, local: Path, start: int, stop: int) -> None:
    """Runs [start, stop) as one chunk each in the bucket (with its journal entry) and as a file locally."""
    b = bucket.Bucket(url)
    t0 = time.time() - 86400
    objects = {}
    for i in range(start, stop):
        run = f"sweep-{i:06d}"
        data = run_log(run, t0)
        objects[b._path(bucket.chunk_key(run, 0, 0))] = data
        # finished runs: their journal entries a second apart, all older than a follower's margin
        objects[b._path(bucket.journal_key(int(t0 * 1000) + i * 1000, run, 0, 0))] = b""
        (local / run).mkdir(parents=True, exist_ok=True)
        (local / run / "events.0.jsonl").write_bytes(data)
    if DIRECT:  # moto in this process: its objects made directly (the set-up is not what is measured)
        from moto.core.models import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        backend = s3_backends[DEFAULT_ACCOUNT_ID]["aws"]
        for path, data in objects.items():
            name, _, key = path.partition("/")
            backend.put_object(name, key, data)
        return
    items = list(objects.items())
    for i in range(0, len(items), 2000):
        b.fs.pipe(dict(items[i : i + 2000]))


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def lag(runs_dir: str | Path, db: Path, seconds: float, chunk_s: float) -> tuple[float, float]:
    """p50, p95 of (seen in the store - logged) over a live writer's steps, `ingest --follow` running."""
    stop = threading.Event()
    follower = threading.Thread(
        target=ingest, args=(runs_dir, db), kwargs={"follow": True, "stop_event": stop, "emit": None}
    )
    follower.start()
    run = observatory.init(run_id=f"live-{chunk_s}", runs_dir=runs_dir, chunk_s=chunk_s, heartbeat_s=0)
    logged: dict[int, float] = {}
    seen: dict[int, float] = {}
    t_end = time.monotonic() + seconds
    step = 0
    last_poll = 0.0
    while time.monotonic() < t_end or (
        len(seen) < len(logged) and time.monotonic() < t_end + 3 * chunk_s + 30
    ):
        if time.monotonic() < t_end:
            run.log({"train/loss": 1.0}, step=step)
            logged[step] = time.time()
            step += 1
        if time.monotonic() - last_poll > 0.25 and db.exists():
            last_poll = time.monotonic()
            try:
                with store.connect(db) as con:
                    rows = con.execute("SELECT step FROM metrics WHERE run = ?", [run.id]).fetchall()
                now = time.time()
                for (s,) in rows:
                    seen.setdefault(s, now)
            except Exception:
                pass
        time.sleep(0.1)
    run.finish()
    stop.set()
    follower.join()
    lags = sorted(seen[s] - logged[s] for s in seen if s in logged)
    if not lags:
        return float("nan"), float("nan")
    return statistics.median(lags), lags[min(len(lags) - 1, int(0.95 * len(lags)))]


def log_overhead(runs_dir: str | Path, n: int) -> float:
    """Microseconds per `log()` call (the call alone: the upload is on the writer's threads)."""
    run = observatory.init(
        run_id=f"overhead-{os.getpid()}-{time.time_ns()}", runs_dir=runs_dir, chunk_s=1, heartbeat_s=0
    )
    t = time.perf_counter()
    for s in range(n):
        run.log({"train/loss": 1.0, "lr": 0.001, "grad_norm": 0.5}, step=s)
    dt = time.perf_counter() - t
    run.finish()
    return dt / n * 1e6


def main() -> None:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log
    os.environ["OBSERVATORY_QUIET"] = "1"
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", default="10,1000,10000")
    ap.add_argument("--lag-s", type=float, default=60.0, help="seconds of live logging per lag measurement")
    ap.add_argument(
        "--direct",
        action="store_true",
        help="moto in this process, the runs put into it without HTTP (10^4 runs in seconds, not minutes); "
        "every measured request still goes over HTTP",
    )
    ap.add_argument("--no-lag", action="store_true", help="skip the lag and log() measurements")
    args = ap.parse_args()
    global DIRECT
    DIRECT = args.direct
    sizes = [int(x) for x in args.runs.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-bucket-"))
    os.environ["OBSERVATORY_SPOOL_DIR"] = str(tmp / "spool")
    os.environ["OBSERVATORY_FINDINGS_DIR"] = str(tmp / "findings")
    os.environ["OBSERVATORY_ALERTS_FILE"] = str(tmp / "alerts.yaml")
    with bucket_fixtures.running(s3_process=not args.direct) as em:
        url = em.new_bucket("s3")
        local = tmp / "local"
        local.mkdir()
        populate(url, tmp / "warm", 0, 1)  # the imports and the first store's set-up, before any timing
        ingest(tmp / "warm", tmp / "warm.duckdb", emit=None, hooks=False)
        ingest(url, tmp / "warm2.duckdb", emit=None, hooks=False)
        print(
            f"{'runs':>7} | {'bucket: requests/idle pass':>26} | {'its LIST (s)':>12} | "
            f"{'idle ingest (s)':>15} | {'local idle ingest (s)':>21}"
        )
        have = 0
        catchup = None
        for n in sizes:
            populate(url, local, have, n)
            have = n
            db_b, db_l = tmp / f"b{n}.duckdb", tmp / f"l{n}.duckdb"
            # the catch-up: the chunks fetched into the mirror (a follower's first pass), then the rest of ingest
            first = BucketSource(url, db_b, margin_s=300)
            t_get = timed(lambda: first.pull(lambda m: None))  # noqa: B023
            t_b = t_get + timed(lambda: ingest(url, db_b, emit=None, hooks=False))  # noqa: B023
            t_l = timed(lambda: ingest(local, db_l, emit=None, hooks=False))  # noqa: B023
            catchup = (n, t_b, t_l, t_get, first.bucket.requests)
            # one live run's newest entry (now): the finished runs' entries are settled, the analyst packs them
            b = bucket.Bucket(url)
            b.put_new(bucket.journal_key(int(time.time() * 1000), "live-now", 0, 0), b"")
            b.put_new(bucket.chunk_key("live-now", 0, 0), run_log("live-now", time.time()))
            first.pull(lambda m: None)
            packs = [0]
            t_pack = timed(lambda: packs.extend(iter(lambda: first.pack(lambda m: None), 0)))  # noqa: B023
            replica = BucketSource(url, tmp / f"r{n}.duckdb", margin_s=300)
            t_rget = timed(lambda: replica.pull(lambda m: None))  # noqa: B023
            t_r = t_rget + timed(lambda: ingest(url, tmp / f"r{n}.duckdb", emit=None, hooks=False))  # noqa: B023
            packed = (len(packs) - 1, sum(packs), t_pack, t_r, t_rget, replica.bucket.requests)
            src = BucketSource(url, db_b, margin_s=300)
            src.pull(lambda m: None)  # a follower's client is made once; then its passes
            before = src.bucket.requests
            idle_pull = timed(lambda: src.pull(lambda m: None))  # noqa: B023
            reqs = src.bucket.requests - before
            idle_b = timed(lambda: ingest(url, db_b, emit=None, hooks=False))  # noqa: B023
            idle_l = timed(lambda: ingest(local, db_l, emit=None, hooks=False))  # noqa: B023
            print(f"{n:>7} | {reqs:>26} | {idle_pull:>12.3f} | {idle_b:>15.3f} | {idle_l:>21.3f}")
        n, t_b, t_l, t_get, reqs = catchup
        print(
            f"\ncatch-up of {n} runs into a new store: bucket {t_b:.1f} s, local folder {t_l:.1f} s ({t_b / t_l:.2f}x); "
            f"of the bucket's, {t_get:.1f} s fetching the chunks ({reqs} requests, {reqs / t_get:.0f}/s)"
        )
        k, chunks, t_pack, t_r, t_rget, r_reqs = packed
        print(
            f"a new replica's catch-up from the analyst's {k} packs ({chunks} chunks; packing took the analyst "
            f"{t_pack:.1f} s, once): {t_r:.1f} s ({t_r / t_l:.2f}x the local folder), of which {t_rget:.1f} s "
            f"fetching ({r_reqs} requests)"
        )
        if args.no_lag:
            return
        print(f"\n{'step -> store lag':>26} | {'p50 (s)':>8} | {'p95 (s)':>8}")
        for label, where, chunk_s in (
            ("bucket, chunk_s 10 (default)", em.new_bucket("s3"), 10.0),
            ("bucket, chunk_s 1", em.new_bucket("s3"), 1.0),
            ("local folder", tmp / "lag-local", 10.0),
        ):
            p50, p95 = lag(where, tmp / f"lag-{label[:6]}-{chunk_s}.duckdb", args.lag_s, chunk_s)
            print(f"{label:>26} | {p50:>8.2f} | {p95:>8.2f}")
        print(f"\n{'log() overhead':>26} | {'us/call':>8}")
        for label, where in (("bucket", em.new_bucket("s3")), ("local folder", tmp / "ov-local")):
            print(f"{label:>26} | {log_overhead(where, 20000):>8.2f}")


if __name__ == "__main__":
    main()
