"""A lab's store of thousands of small runs: built in one pass, in many passes, and by `rebuild`, it is the
same store (rollups, series, findings, runs table), and the rollups equal a recount from the raw rows.

Real event logs (some runs with a loss spike or a NaN, some on two hosts, some written over several
passes), real ingest with its hooks, real DuckDB files.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import time

import pytest
from conftest import recounted_copy

from observatory.ingest import folders, passes
from observatory.pipeline import ingest, rebuild
from observatory.store import connect, schema

pytestmark = pytest.mark.slow

N_RUNS = 2000
T0 = time.time()  # the logs are of now: a run written over two passes is not silent, nor stalled, in between
TABLES = (*schema.METRIC_TABLES, *schema.EXPERT_TABLES)


def _lines(run: str, host: int, first: int, last: int, seq0: int, rnd: random.Random, i: int) -> list[str]:
    out = []
    for k, s in enumerate(range(first, last + 1)):
        loss = 4.0 * 0.98**s + rnd.gauss(0, 0.01)
        if i % 50 == 7 and s == 30:
            loss *= 8  # a spike the detectors flag
        data = {
            "train/loss": "nan" if (i % 97 == 3 and s == 25) else round(loss, 6),
            "grad/norm/total": round(rnd.uniform(0.9, 1.1), 4),
            "opt/lr": 1e-3,
        }
        out.append(
            json.dumps(
                {
                    "v": 1,
                    "run": run,
                    "kind": "metrics",
                    "step": s,
                    "t": T0 + i / 100 + s,
                    "host": host,
                    "seq": seq0 + k,
                    "data": data,
                }
            )
        )
    return out


def _write(root, i: int, upto: int | None = None, hosts: tuple[int, ...] = (0, 1)) -> None:
    """Run i's logs: host 0 (and host 1 for every 10th run), steps 1..40; `upto`: only up to that step, the
    rest appended by a later call (a run that spans passes); `hosts`: only these hosts' logs."""
    rnd = random.Random(i)
    run = f"sweep-{i:05d}"
    d = root / run
    d.mkdir(parents=True, exist_ok=True)
    for host in [h for h in ((0, 1) if i % 10 == 0 else (0,)) if h in hosts]:
        path = d / f"events.{host}.jsonl"
        have = path.read_text().splitlines() if path.exists() else []
        lines = []
        if not have:
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "run": run,
                        "kind": "run_start",
                        "step": 0,
                        "t": T0 + i / 100,
                        "host": host,
                        "seq": 0,
                        "data": {
                            "config": {"lr": 1e-3, "seed": i},
                            "project": f"p{i % 3}",
                            "group": f"g{i % 20}",
                            "tags": ["sweep"],
                        },
                    }
                )
            )
        first = 1 + max(0, len(have) - 1)
        last = 40 if upto is None else upto
        lines += _lines(run, host, first, last, len(have) + len(lines), rnd, i)
        if last == 40:
            lines.append(
                json.dumps(
                    {
                        "v": 1,
                        "run": run,
                        "kind": "run_end",
                        "step": 40,
                        "t": T0 + i / 100 + 41,
                        "host": host,
                        "seq": len(have) + len(lines),
                        "data": {"status": "completed", "final_step": 40},
                    }
                )
            )
        with open(path, "a") as f:
            f.write("".join(x + "\n" for x in lines))


def _age_folders(root) -> None:
    """Set every run folder's mtime back a minute (the files' own stay as they are)."""
    old = time.time_ns() - 60 * 1_000_000_000
    for d in root.iterdir():
        os.utime(d, ns=(old, old))


def _r(v):
    return float(f"{v:.12g}") if isinstance(v, float) and math.isfinite(v) else v


def snapshot(db) -> dict[str, list]:
    with connect(db) as con:
        out = {
            t: sorted(repr(tuple(map(_r, r))) for r in con.execute(f"SELECT * FROM {t}").fetchall())
            for t in TABLES
        }
        out["runs"] = sorted(map(repr, con.execute("SELECT * FROM runs").fetchall()))
        out["findings"] = sorted(
            con.execute(
                "SELECT run, data->>'detector', data->>'metric', data->>'severity', data->'window' FROM events "
                "WHERE kind = 'anomaly'"
            ).fetchall()
        )
        out["counts"] = con.execute(
            "SELECT (SELECT count(*) FROM metrics), (SELECT count(*) FROM events)"
        ).fetchall()
    return out


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The same 2,000 runs three ways, each from its own copy of the logs (each build writes its findings)."""
    tmp = tmp_path_factory.mktemp("many")
    mp = pytest.MonkeyPatch()
    mp.setenv("OBSERVATORY_STALE_AFTER_S", "3600")  # however slow the machine, no run goes silent meanwhile
    mp.setenv("OBSERVATORY_ANOMALY_STALL_S", "3600")
    logs = tmp / "logs"
    for i in range(N_RUNS):
        _write(logs, i, upto=20 if i % 3 == 0 else None, hosts=(0,) if i % 3 == 0 else (0, 1))
    for i in range(0, N_RUNS, 3):
        _write(logs, i)  # the rest of every third run: the logs are whole, as they are for each build below
    out = {}
    try:
        one = tmp / "one"
        shutil.copytree(logs, one)
        ingest(one, tmp / "one.duckdb", emit=None)
        out["one pass"] = tmp / "one.duckdb"

        # many passes: the runs arrive a few hundred at a time, every third one written over two passes (of
        # those on two hosts, host 1's log appears in the second), and each transaction takes in ~64 KB
        # (hundreds of transactions). After each pass the run folders are as if written long before, so
        # the next passes list only the folders whose names changed (`ingest.folders`)
        many = tmp / "many"
        mp.setattr(passes, "BATCH_BYTES", 64 << 10)
        mp.setattr(folders, "KEEP_FROM", 0)  # the first 1,000 run folders' and the findings' listings too
        for lo in range(0, N_RUNS, 500):
            for i in range(lo, min(lo + 500, N_RUNS)):
                _write(many, i, upto=20 if i % 3 == 0 else None, hosts=(0,) if i % 3 == 0 else (0, 1))
            for _ in range(2):
                ingest(many, tmp / "many.duckdb", emit=None)
                _age_folders(many)
            for i in range(lo, min(lo + 500, N_RUNS)):
                if i % 3 == 0:
                    _write(many, i)
            ingest(many, tmp / "many.duckdb", emit=None)
            _age_folders(many)
        with connect(tmp / "many.duckdb") as con:  # every run folder's listing was kept, and used
            runs, found = con.execute(
                "SELECT count(*) FILTER (NOT starts_with(folder, 'findings:')), "
                "count(*) FILTER (starts_with(folder, 'findings:')) FROM ingest_folders"
            ).fetchall()[0]
        assert runs == N_RUNS and found > 0  # found: the findings folder's, of the runs with findings
        out["many passes"] = tmp / "many.duckdb"
        mp.undo()
        mp.setenv("OBSERVATORY_STALE_AFTER_S", "3600")
        mp.setenv("OBSERVATORY_ANOMALY_STALL_S", "3600")

        again = tmp / "again"
        shutil.copytree(logs, again)
        rebuild(again, tmp / "rebuilt.duckdb", emit=None)
        out["rebuild"] = tmp / "rebuilt.duckdb"
    finally:
        mp.undo()
    return tmp, {k: snapshot(v) for k, v in out.items()}, out


def test_one_pass_many_passes_and_rebuild_give_the_same_store(built):
    _, snaps, _ = built
    one = snaps["one pass"]
    assert len(one["runs"]) == N_RUNS
    assert one["counts"][0][0] == N_RUNS * 40 * 3 + (N_RUNS // 10) * 40 * 3  # every value, both hosts
    assert len(one["findings"]) >= N_RUNS // 50  # the planted spikes were found
    for name in ("many passes", "rebuild"):
        for key in one:
            assert snaps[name][key] == one[key], f"{name}: {key}"


def test_the_rollups_equal_a_recount_from_the_raw_rows(built, tmp_path):
    _, _, dbs = built
    for name, db in dbs.items():
        assert snapshot(recounted_copy(db, tmp_path)) == snapshot(db), name
