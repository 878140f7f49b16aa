"""A hostile log cannot fill `rejected_events`: past `max_rejected_per_file` rejected lines are counted, not stored.

Each file keeps its count in `ingest_files` (`rejected`, `rejected_dropped`), across
passes over a growing file; the good lines around the bad ones are still ingested,
on both line paths (msgspec and SQL), plain and gzip.
"""

from __future__ import annotations

import gzip
import json
import zlib

import duckdb
import pytest
from conftest import event, write_lines

from observatory import store
from observatory.ingest import model, msgspec_lines
from observatory.pipeline import ingest as _ingest

CAP = 50


@pytest.fixture(autouse=True)
def cap(monkeypatch):
    monkeypatch.setenv("OBSERVATORY_MAX_REJECTED_PER_FILE", str(CAP))


def ingest(runs_dir, db):
    msgs: list[str] = []
    rep = _ingest(runs_dir, db, hooks=False, emit=msgs.append)
    return rep, msgs


def q(db, sql):
    with store.connect(db) as con:
        return con.execute(sql).fetchall()


def bad(i: int) -> bytes:
    """Three kinds of short bad line: junk, an object that is no event, an event of another run."""
    return [
        b"junk %d" % i,
        b'{"v":1,"run":"a","kind":"metrics","n":%d}' % i,
        b'{"v":1,"run":"b","kind":"metrics","step":1,"t":1.7e9,"host":0,"seq":%d,"data":{}}' % (i + 5),
    ][i % 3]


def good(seq: int) -> bytes:
    return json.dumps(
        event("a", "metrics", {"train/loss": float(seq)}, seq, seq), separators=(",", ":")
    ).encode()


def counts(db, rel: str) -> tuple[int, int, int]:
    """(rows stored in rejected_events, ingest_files.rejected, ingest_files.rejected_dropped) of one file."""
    stored = q(db, f"SELECT count(*) FROM rejected_events WHERE file = '{rel}'")[0][0]
    return (stored, *q(db, f"SELECT rejected, rejected_dropped FROM ingest_files WHERE path = '{rel}'")[0])


@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("fast", [True, False], ids=["msgspec-path", "sql-path"])
def test_rejected_lines_past_the_cap_are_counted_not_stored(runs_dir, db_path, monkeypatch, gz, fast):
    monkeypatch.setattr(msgspec_lines, "ENABLED", fast)
    n_bad = 3000
    data = b"\n".join([good(0), *(bad(i) for i in range(n_bad)), good(1)]) + b"\n"
    name = "events.0.jsonl.gz" if gz else "events.0.jsonl"
    path = runs_dir / "a" / name
    path.parent.mkdir()
    path.write_bytes(gzip.compress(data) if gz else data)
    rep, msgs = ingest(runs_dir, db_path)
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [
        (0,),
        (1,),
    ]  # the line after the bad ones too
    assert counts(db_path, f"a/{name}") == (CAP, n_bad, n_bad - CAP)
    assert rep.rejected == n_bad and rep.rejected_dropped == n_bad - CAP
    said = [m for m in msgs if "not stored in rejected_events" in m]
    assert said == [
        f"{path}: {n_bad - CAP:,} more rejected lines not stored in rejected_events: this file has {n_bad:,} "
        f"rejected lines, the first {CAP} stored (max_rejected_per_file, env OBSERVATORY_MAX_REJECTED_PER_FILE; "
        'counts: observatory sql "SELECT path, rejected, rejected_dropped FROM ingest_files")'
    ], msgs[-3:]
    assert f"{n_bad} rejected ({n_bad - CAP} of them not stored" in rep.summary()
    assert (
        len([m for m in msgs if m.startswith(f"{path}:") and "not stored" not in m]) == CAP
    )  # one per stored


def mixed_lines(n: int, seed: int) -> list[bytes]:
    """Junk of every first byte beside lines the one-by-one path must judge: good events, seqs out of order,
    objects that are no event, bad JSON, blank and indented lines, non-UTF-8, a BOM."""
    import random

    rng = random.Random(seed)
    out, seq = [], 0
    for i in range(n):
        r = rng.random()
        if r < 0.45:
            out.append(
                rng.choice(
                    [
                        b"junk %d" % i,
                        b"[1, 2]",
                        b"123",
                        b'"a string"',
                        b"\xff\xfe%d" % i,
                        b"\xef\xbb\xbf" + good(10**6 + i),
                        b"null",
                        b"}{",
                    ]
                )
            )
        elif r < 0.65:
            seq += 1
            out.append(good(seq))
        elif r < 0.7:
            out.append(good(max(0, seq - 3)))  # a seq not above the previous one
        elif r < 0.8:
            out.append(bad(i))
        elif r < 0.85:
            out.append(b"{not json %d" % i)
        elif r < 0.9:
            out.append(rng.choice([b"", b"   ", b"\r"]))
        else:
            seq += 1
            out.append(b"  " + good(seq))  # leading whitespace: JSON allows it
    return out


@pytest.mark.parametrize("fast", [True, False], ids=["msgspec-path", "sql-path"])
@pytest.mark.parametrize("gz", [False, True], ids=["plain", "gzip"])
def test_junk_past_the_cap_counted_in_bulk_leaves_what_one_by_one_leaves(tmp_path, monkeypatch, fast, gz):
    """`model.JUNK_FAST` on and off: the same store, report and messages, over passes of a growing file."""
    monkeypatch.setattr(msgspec_lines, "ENABLED", fast)
    lines = mixed_lines(1500, seed=3)
    seen = []
    for bulk in (True, False):
        monkeypatch.setattr(model, "JUNK_FAST", bulk)
        runs, db = tmp_path / f"runs-{bulk}", tmp_path / f"s-{bulk}.duckdb"
        reports = []
        for k, (lo, hi) in enumerate(
            [(0, 20), (20, 700), (700, 1500)]
        ):  # under the cap, past it, far past it
            name = f"events.{k}.jsonl.gz" if gz else "events.0.jsonl"
            path = runs / "a" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            data = b"\n".join(lines[lo:hi]) + b"\n"
            if gz:
                path.write_bytes(gzip.compress(data))
            else:
                with open(path, "ab") as f:
                    f.write(data)
            rep, msgs = ingest(runs, db)
            reports.append(
                (
                    rep.rejected,
                    rep.rejected_dropped,
                    rep.events,
                    rep.duplicates,
                    [m.replace(str(runs), "<runs>") for m in msgs],
                )
            )
        seen.append(
            (
                reports,
                q(db, "SELECT file, line, field, reason, raw FROM rejected_events ORDER BY file, line"),
                q(
                    db,
                    "SELECT path, line, rejected, rejected_dropped, last_seq FROM ingest_files ORDER BY path",
                ),
                q(db, "SELECT step, name, value FROM metrics ORDER BY step, name"),
            )
        )
    assert seen[0] == seen[1]
    reports, rejected, files, metrics = seen[0]
    assert any(dropped for *_, dropped, _ in files)  # the cap was reached, and held in every file:
    assert all(rejected_n - dropped == min(rejected_n, CAP) for _, _, rejected_n, dropped, _ in files)
    reasons = " ".join(r[3] for r in rejected)
    assert "bad JSON" in reasons and "seq" in reasons and "UTF-8" in reasons and metrics


def test_a_gzip_bomb_of_short_bad_lines_stores_at_most_the_cap(runs_dir, db_path):
    """A few hundred KB on disk, 10^6 short bad lines inside: the store keeps CAP rows and the count."""
    n_bad = 1_000_000
    folder = runs_dir / "a"
    folder.mkdir()
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    with open(folder / "events.0.jsonl.gz", "wb") as f:
        f.write(c.compress(good(0) + b"\n"))
        for _ in range(n_bad // 1000):
            f.write(c.compress(b"x\n" * 1000))
        f.write(c.compress(good(1) + b"\n"))
        f.write(c.flush())
    assert (folder / "events.0.jsonl.gz").stat().st_size < 1 << 20
    rep, _ = ingest(runs_dir, db_path)
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [(0,), (1,)]
    assert counts(db_path, "a/events.0.jsonl.gz") == (CAP, n_bad, n_bad - CAP)
    assert rep.rejected == n_bad


def test_the_cap_holds_across_passes_over_a_growing_file(runs_dir, db_path):
    path = runs_dir / "a" / "events.0.jsonl"
    write_lines(path, [good(0), *(bad(i) for i in range(30))])
    ingest(runs_dir, db_path)
    assert counts(db_path, "a/events.0.jsonl") == (30, 30, 0)
    write_lines(path, [*(bad(i) for i in range(30, 70)), good(1)])
    _, msgs = ingest(runs_dir, db_path)
    assert counts(db_path, "a/events.0.jsonl") == (CAP, 70, 20)
    assert any(m.startswith(f"{path}: 20 more rejected lines not stored") for m in msgs), msgs[-3:]
    write_lines(path, [*(bad(i) for i in range(70, 80)), good(2)])
    rep, _ = ingest(runs_dir, db_path)
    assert counts(db_path, "a/events.0.jsonl") == (CAP, 80, 30) and rep.rejected == 10
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [(0,), (1,), (2,)]
    # another file has its own count
    write_lines(runs_dir / "c" / "events.0.jsonl", [b"junk"] * 5)
    ingest(runs_dir, db_path)
    assert counts(db_path, "c/events.0.jsonl") == (5, 5, 0)


def test_a_store_from_before_the_count_starts_from_its_stored_rejections(runs_dir, db_path):
    path = runs_dir / "a" / "events.0.jsonl"
    write_lines(path, [good(0), *(bad(i) for i in range(40))])
    ingest(runs_dir, db_path)
    con = duckdb.connect(str(db_path))  # as an older observatory left it: no per-file count
    con.execute("ALTER TABLE ingest_files DROP COLUMN rejected")
    con.execute("ALTER TABLE ingest_files DROP COLUMN rejected_dropped")
    con.close()
    # the next ingest (a new Ingester, as in a new process) makes sure of the schema again
    write_lines(path, [*(bad(i) for i in range(40, 60)), good(1)])
    ingest(runs_dir, db_path)
    assert counts(db_path, "a/events.0.jsonl") == (CAP, 60, 10)
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [(0,), (1,)]
