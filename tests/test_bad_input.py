"""One test per kind of bad input: each gets a clear `file:line: reason` and loses nothing else."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import event, write_lines
from polling import wait_until

from observatory import store
from observatory.pipeline import ingest as _ingest


def ingest(runs_dir, db, **kw):
    msgs: list[str] = []
    rep = _ingest(runs_dir, db, hooks=False, emit=msgs.append, **kw)
    return rep, msgs


def q(db, sql):
    with store.connect(db) as con:
        return con.execute(sql).fetchall()


GOOD_BEFORE = event("a", "metrics", {"train/loss": 1.0}, 0, 0)
GOOD_AFTER = event("a", "metrics", {"train/loss": 2.0}, 2, 2)


@pytest.mark.parametrize(
    "bad, field, reason",
    [
        ('{"v":1,"run":"a",', "(line)", "bad JSON"),
        ("[1, 2, 3]", "(line)", "an event is a JSON object"),
        (event("a", "metrics", {"x": 1.0}, 1, 1) | {"v": None}, "v", "missing or not an integer"),
        ({k: v for k, v in event("a", "metrics", {"x": 1.0}, 1, 1).items() if k != "t"}, "t", "missing"),
        (event("a", "metrics", {"x": 1.0}, 1, 1) | {"step": "12"}, "step", "integer >= 0"),
        (event("a", "metrics", {"x": 1.0}, 1, 1) | {"host": 3}, "host", "does not match its file name"),
        (event("a", "metrics", {"x": 1.0}, 1, 1) | {"v": 9}, "v", "unknown format version 9"),
        (event("a", "metrics", {"x": 1.0}, 0, 1), "seq", "seq 0 is not above the previous seq 0"),
        (event("b", "metrics", {"x": 1.0}, 1, 1), "run", "does not match its folder 'a'"),
        (event("a", "metrics", {"x": "fast"}, 1, 1), "data.x", "metric value must be a number"),
        (
            event("a", "expert_load", {"layer": 0, "routed": [1, 2], "dropped": [0]}, 1, 1),
            "data.dropped",
            "one entry per expert",
        ),
        (event("a", "eval", {"loss": 2.0}, 1, 1), "data.dataset", "eval requires dataset"),
        (event("a", "run_end", {"status": "exploded"}, 1, 1), "data.status", "must be one of"),
    ],
    ids=[
        "json",
        "not-object",
        "v-missing",
        "t-missing",
        "step-type",
        "host",
        "version",
        "seq",
        "run-folder",
        "metric-value",
        "expert-payload",
        "eval-payload",
        "run_end-status",
    ],
)
def test_malformed_line_is_rejected_and_the_rest_kept(runs_dir, db_path, bad, field, reason):
    path = write_lines(runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE, bad, GOOD_AFTER])
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 2 and rep.rejected == 1
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [(0,), (2,)]
    ((file, line, fld, why, raw),) = q(db_path, "SELECT file, line, field, reason, raw FROM rejected_events")
    assert (file, line, fld) == ("a/events.0.jsonl", 2, field)
    assert reason in why
    assert raw == (bad if isinstance(bad, str) else json.dumps(bad, separators=(",", ":")))
    assert msgs == [f"{path}:2: {why}"]


def test_truncated_last_line_waits_while_live_then_is_recorded(runs_dir, db_path):
    path = write_lines(runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE])
    with open(path, "ab") as f:
        f.write(b'{"v":1,"run":"a","kind":"metr')  # the writer died mid-line
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 1 and rep.rejected == 0 and not msgs  # live: maybe the rest is coming
    old = time.time() - 3600
    os.utime(path, (old, old))  # silent for an hour: the run crashed
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.truncated == 1
    assert q(db_path, "SELECT line, reason, raw FROM rejected_events") == [
        (
            2,
            "truncated: a 29-byte final line has no newline (the writer died mid-line)",
            '{"v":1,"run":"a","kind":"metr',
        )
    ]
    assert msgs == [f"{path}:2: truncated: a 29-byte final line has no newline (the writer died mid-line)"]
    # a resumed writer starts a fresh line; nothing is glued to the torn one
    import observatory

    run = observatory.init(run_id="a", runs_dir=runs_dir, install_signal_handlers=False, write_start=False)
    run.log({"train/loss": 0.5}, step=3)
    run.finish()
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.rejected == 0 and rep.events == 5, msgs  # its phases init, train, shutdown, the step, run_end
    assert q(db_path, "SELECT status FROM runs") == [("completed",)]


def test_truncated_after_run_end(runs_dir, db_path):
    path = write_lines(
        runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE, event("a", "run_end", {"status": "completed"}, 1)]
    )
    with open(path, "ab") as f:
        f.write(b'{"v":1')
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.truncated == 1 and msgs[0].startswith(f"{path}:3: truncated")


def test_random_bytes_file(runs_dir, db_path):
    import random

    rng = random.Random(0)
    junk = bytes(rng.randrange(256) for _ in range(200_000))
    path = runs_dir / "a" / "events.0.jsonl"
    path.parent.mkdir()
    path.write_bytes(junk + b"\n")
    write_lines(runs_dir / "b" / "events.0.jsonl", [event("b", "metrics", {"x": 1.0}, 0, 0)])
    rep, msgs = ingest(runs_dir, db_path)
    assert q(db_path, "SELECT run, count(*) FROM metrics GROUP BY run") == [("b", 1)]
    n_lines = junk.count(b"\n") + 1
    reasons = q(db_path, "SELECT DISTINCT split_part(reason, ' (', 1) FROM rejected_events WHERE run = 'a'")
    assert rep.rejected == q(db_path, "SELECT count(*) FROM rejected_events")[0][0] > 0
    assert rep.rejected <= n_lines  # blank lines are skipped, every other line is one rejection
    assert {r[0].split(":")[0] for r in reasons} <= {"not UTF-8 text", "bad JSON"}
    assert all(m.startswith(f"{path}:") for m in msgs[:-1]) and msgs[-1].startswith("... and ")  # capped


@pytest.mark.slow
def test_single_100mb_line_is_capped_and_memory_stays_bounded(runs_dir, db_path, tmp_path):
    path = runs_dir / "a" / "events.0.jsonl"
    path.parent.mkdir()
    with open(path, "wb") as f:
        f.write(json.dumps(GOOD_BEFORE).encode() + b"\n")
        f.write(b'{"v":1,"run":"a","kind":"note","step":1,"t":1.0,"host":0,"seq":1,"data":{"text":"')
        block = b"x" * (1 << 20)
        for _ in range(100):
            f.write(block)
        f.write(b'"}}\n')
        f.write(json.dumps(GOOD_AFTER).encode() + b"\n")
    # VmHWM is the peak of this process's own address space; getrusage's ru_maxrss would also
    # carry the parent's RSS at fork time across exec (the pytest process may be ~1 GB by now)
    code = (
        "import re; from observatory.pipeline import ingest; "
        f"r = ingest({str(runs_dir)!r}, {str(db_path)!r}, hooks=False); "
        "hwm = re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1); "
        "print(r.events, r.rejected, hwm)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    events, rejected, maxrss_kb = map(int, out.stdout.split())
    assert (events, rejected) == (2, 1)
    assert f"{path}:2: line is 104857" in out.stderr and "over max_line_bytes" in out.stderr
    assert maxrss_kb < 450_000, f"peak RSS {maxrss_kb / 1024:.0f} MiB for a 100 MB line"
    (raw_len,) = q(db_path, "SELECT length(raw) FROM rejected_events")[0]
    assert raw_len == 4096


def test_nan_and_inf_encodings(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "metrics", {"loss": "nan", "g": "inf", "h": "-inf", "i": "+inf", "j": "NaN"}, 0, 0),
            '{"v":1,"run":"a","kind":"metrics","step":1,"t":1.0,"host":0,"seq":1,"data":{"loss":NaN}}',
            event("a", "metrics", {"loss": "not-a-number"}, 2, 2),
        ],
    )
    rep, msgs = ingest(runs_dir, db_path)
    rows = q(db_path, "SELECT step, name, value::VARCHAR FROM metrics ORDER BY step, name")
    assert rows == [
        (0, "g", "inf"),
        (0, "h", "-inf"),
        (0, "i", "inf"),
        (0, "j", "nan"),
        (0, "loss", "nan"),
        (1, "loss", "nan"),
    ]
    assert len(msgs) == 1 and ":3: data.loss: metric value must be a number" in msgs[0]


def test_events_file_in_wrong_run_folder(runs_dir, db_path):
    lines = [event("right", "metrics", {"x": float(i)}, i, i) for i in range(3)]
    path = write_lines(runs_dir / "wrong" / "events.0.jsonl", lines)
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 0 and rep.rejected == 3
    assert msgs[0] == f"{path}:1: run: run id 'right' does not match its folder 'wrong'"
    assert q(db_path, "SELECT count(*) FROM runs") == [(0,)]


def test_corrupt_gzip(runs_dir, db_path):
    data = gzip.compress(
        b"".join(json.dumps(event("a", "metrics", {"x": 1.0}, i, i)).encode() + b"\n" for i in range(50))
    )
    path = runs_dir / "a" / "events.0.jsonl.gz"
    path.parent.mkdir()
    path.write_bytes(data[: len(data) // 2])
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.rejected >= 1 and any(m.startswith(f"{path}:") for m in msgs)
    rep2, _ = ingest(runs_dir, db_path)
    assert rep2.rejected == 0 and rep2.events == 0  # not re-reported until the file changes


@pytest.mark.slow
def test_db_deleted_during_follow(runs_dir, db_path, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_FOLLOW_INTERVAL_S", "0.05")
    path = runs_dir / "a" / "events.0.jsonl"
    write_lines(path, [event("a", "metrics", {"x": float(i)}, i, i) for i in range(5)])
    stop = threading.Event()
    msgs: list[str] = []
    th = threading.Thread(
        target=_ingest,
        args=(runs_dir, db_path),
        kwargs={"follow": True, "stop_event": stop, "hooks": False, "emit": msgs.append},
    )
    th.start()
    try:
        wait_until(lambda: db_path.exists() and q(db_path, "SELECT count(*) FROM metrics") == [(5,)])
        for suffix in ("", ".wal"):
            db_path.with_name(db_path.name + suffix).unlink(missing_ok=True)
        write_lines(path, [event("a", "metrics", {"x": float(i)}, i, i) for i in range(5, 8)])
        wait_until(lambda: db_path.exists() and q(db_path, "SELECT count(*) FROM metrics") == [(8,)])
    finally:
        stop.set()
        th.join(timeout=30)
    assert not th.is_alive()
    assert q(db_path, "SELECT count(*), count(DISTINCT step) FROM metrics") == [(8, 8)]


def test_read_only_runs_dir(runs_dir, db_path):
    path = write_lines(runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE, GOOD_AFTER])
    os.chmod(path, 0o444)
    os.chmod(path.parent, 0o555)
    os.chmod(runs_dir, 0o555)
    before = sorted((p, p.stat().st_mtime) for p in runs_dir.rglob("*"))
    try:
        rep, msgs = ingest(runs_dir, db_path)
    finally:
        os.chmod(runs_dir, 0o755)
        os.chmod(path.parent, 0o755)
    assert rep.events == 2 and not msgs
    assert sorted((p, p.stat().st_mtime) for p in runs_dir.rglob("*")) == before  # nothing written there


def test_unreadable_log_is_reported_not_fatal(runs_dir, db_path):
    bad = runs_dir / "a" / "events.0.jsonl"
    bad.mkdir(parents=True)  # a log that cannot be opened (root reads any file, so use a directory)
    write_lines(runs_dir / "b" / "events.0.jsonl", [event("b", "metrics", {"x": 1.0}, 0, 0)])
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 1
    assert any(m.startswith(f"{bad}: cannot open") for m in msgs), msgs


def test_a_store_file_that_is_not_a_store_is_the_error_not_the_logs(runs_dir, db_path):
    """A --db that is not a DuckDB file fails the ingest with the store's name and DuckDB's reason; no log
    is blamed or skipped for it, and the same logs go into a real store whole afterwards."""
    from click.testing import CliRunner

    from observatory.cli import main

    write_lines(runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE, GOOD_AFTER])
    db_path.write_bytes(b"not a DuckDB file, just some bytes\n" * 200)
    with pytest.raises(store.StoreUnusable, match="cannot use the store") as e:
        ingest(runs_dir, db_path)
    assert str(db_path) in str(e.value) and "not a valid DuckDB database" in str(e.value)
    res = CliRunner().invoke(main, ["ingest", "--runs-dir", str(runs_dir), "--db", str(db_path), "-q"])
    assert res.exit_code == 1
    assert f"Error: {db_path}: cannot use the store (IOException" in res.output
    assert "events.0.jsonl" not in res.output  # no log is to blame
    assert db_path.read_bytes().startswith(b"not a DuckDB file")  # left as it was
    good = db_path.with_name("good.duckdb")
    rep, msgs = ingest(runs_dir, good)
    assert (rep.events, msgs) == (2, [])
    assert q(good, "SELECT count(*) FROM metrics") == [(2,)]


@pytest.mark.parametrize("name", ['we"ird', "back\\slash", "tab\there", 'both"\\'])
def test_a_metric_name_msgspec_cannot_name_keeps_the_file(runs_dir, db_path, name):
    """A quote, backslash or control character in a metric name (valid JSON, a valid name): msgspec cannot
    make a field of it, so that run's metrics decode as dicts; every line is stored, the odd name too
    (the file was skipped whole at every ingest)."""
    lines = [
        event("a", "metrics", {"train/loss": 1.0 + i, **({name: 2.0} if i == 5 else {})}, i, i)
        for i in range(40)
    ]
    write_lines(runs_dir / "a" / "events.0.jsonl", lines)
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 40 and rep.rejected == 0 and msgs == []
    assert q(db_path, "SELECT count(*) FROM metrics") == [(41,)]
    assert q(
        db_path, "SELECT value FROM metrics WHERE name = ?".replace("?", "'" + name.replace("'", "''") + "'")
    ) == [(2.0,)]


def test_a_line_nested_too_deeply_is_rejected_and_the_rest_kept(runs_dir, db_path):
    """A line whose data nests arrays 600 levels deep (3.6 KB) is rejected with its reason; the file's other
    lines are stored in the same batch (its RecursionError downstream rolled every batch back)."""
    deep = event("a", "note", {"text": "x", "deep": 0}, 1, 1)
    raw = json.dumps(deep).replace('"deep": 0', '"deep": ' + "[" * 600 + "]" * 600)
    path = runs_dir / "a" / "events.0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join([json.dumps(GOOD_BEFORE), raw, json.dumps(GOOD_AFTER)]) + "\n")
    rep, msgs = ingest(runs_dir, db_path)
    assert rep.events == 2 and rep.rejected == 1
    assert any(":2: data: objects and arrays nested more than 64 levels deep" in m for m in msgs)
    assert q(db_path, "SELECT step FROM metrics ORDER BY step") == [(0,), (2,)]


@pytest.mark.parametrize(
    "arrays, brackets_in_text, kept",
    [(63, 0, True), (64, 0, False), (3, 200, True)],
    ids=["64-levels-kept", "65-levels-rejected", "brackets-in-a-string-kept"],
)
def test_the_depth_limit_is_exact(runs_dir, db_path, arrays, brackets_in_text, kept):
    """The data object is level 1: 63 arrays inside it make 64 levels (kept), 64 make 65 (rejected). Brackets
    inside a string are text, not levels (the check counts them only to skip the walk of a shallow line)."""
    deep = event("a", "note", {"text": "[{" * brackets_in_text, "deep": 0}, 1, 1)
    raw = json.dumps(deep).replace('"deep": 0', '"deep": ' + "[" * arrays + "]" * arrays)
    path = runs_dir / "a" / "events.0.jsonl"
    path.parent.mkdir(parents=True)
    path.write_text("\n".join([json.dumps(GOOD_BEFORE), raw, json.dumps(GOOD_AFTER)]) + "\n")
    rep, msgs = ingest(runs_dir, db_path)
    assert (rep.events, rep.rejected) == ((3, 0) if kept else (2, 1))
    assert any("nested more than 64 levels deep" in m for m in msgs) is not kept


def test_a_rejected_metric_name_holding_a_secret_is_stored_hidden(runs_dir, db_path):
    """`rejected_events.field` names the bad value's field, here a metric name that is a token: it is hidden
    there as in the raw line and the reason (the SQL console's own "Rejected lines" example selects it)."""
    token = "ghp_" + "Z" * 30
    write_lines(
        runs_dir / "a" / "events.0.jsonl", [GOOD_BEFORE, event("a", "metrics", {token: "not a number"}, 1, 1)]
    )
    rep, _ = ingest(runs_dir, db_path)
    assert rep.rejected == 1
    ((field, reason, raw),) = q(db_path, "SELECT field, reason, raw FROM rejected_events")
    assert field and token not in field and token not in reason and token not in raw
