"""Ingest: incremental, idempotent, exactly-once; runs table; the vectorised checks agree with validate_event."""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import time

import pytest
from conftest import append_in_pieces, event, write_lines, write_stall_finding

from observatory import findings, store
from observatory.events import ValidationError, validate_event
from observatory.pipeline import ingest as _ingest
from observatory.pipeline import rebuild
from observatory.queries.core import list_runs


def ingest(runs_dir, db, **kw):
    """Ingest without the anomaly hook (its stall detector would add findings to these synthetic runs)."""
    return _ingest(runs_dir, db, hooks=False, **kw)


def q(db, sql, params=None):
    with store.connect(db) as con:
        return con.execute(sql, params or []).fetchall()


def _run_lines(run: str, steps: int, start_seq: int = 0, experts: int = 4, layers: int = 2) -> list[dict]:
    out, seq = [], start_seq
    for step in range(steps):
        out.append(event(run, "metrics", {"train/loss": 3.0 - step * 0.01, "opt/lr": 1e-3}, seq, step))
        seq += 1
        for layer in range(layers):
            routed = [step + layer + e for e in range(experts)]
            out.append(
                event(
                    run,
                    "expert_load",
                    {"layer": layer, "routed": routed, "dropped": [1] * experts},
                    seq,
                    step,
                )
            )
            seq += 1
    return out


def test_ingest_counts_and_idempotent(runs_dir, db_path):
    lines = [event("a", "run_start", {"config": {"lr": 1e-3}, "name": "first"}, 0)] + _run_lines("a", 10, 1)
    write_lines(runs_dir / "a" / "events.0.jsonl", lines)
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == len(lines) and rep.rejected == 0
    assert q(db_path, "SELECT count(*), count(DISTINCT name) FROM metrics") == [(20, 2)]
    assert q(db_path, "SELECT count(*), sum(routed), sum(dropped) FROM expert_load") == [
        (80, sum(s + layer + e for s in range(10) for layer in range(2) for e in range(4)), 80)
    ]
    assert q(db_path, "SELECT max(expert), max(layer) FROM expert_load") == [(3, 1)]
    again = ingest(runs_dir, db_path, emit=None)
    assert again.events == 0 and again.files == 0
    assert q(db_path, "SELECT count(*) FROM metrics") == [(20,)]
    assert q(db_path, "SELECT name, status, last_step FROM runs") == [("first", "running", 9)]


def test_incremental_append_and_offsets(runs_dir, db_path):
    path = runs_dir / "a" / "events.0.jsonl"
    lines = _run_lines("a", 6)
    write_lines(path, lines[:7])
    ingest(runs_dir, db_path, emit=None)
    write_lines(path, lines[7:])
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == len(lines) - 7
    assert q(db_path, "SELECT count(*) FROM metrics") == [(12,)]
    assert q(db_path, "SELECT byte_offset, line, first_seq, last_seq FROM ingest_files") == [
        (path.stat().st_size, len(lines), 0, len(lines) - 1)
    ]


def test_gz_copy_is_read_and_deduplicated(runs_dir, db_path):
    lines = _run_lines("a", 5)
    plain = write_lines(runs_dir / "a" / "events.0.jsonl", lines)
    with gzip.open(runs_dir / "a" / "events.0.jsonl.gz", "wb") as f:
        f.write(plain.read_bytes())
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == len(lines) and rep.duplicates == len(lines)
    assert q(db_path, "SELECT count(*) FROM metrics") == [(10,)]
    # a gz alone (an imported run) is enough
    shutil.copytree(runs_dir / "a", runs_dir / "b")
    (runs_dir / "b" / "events.0.jsonl").unlink()
    (runs_dir / "b" / "events.0.jsonl.gz").write_bytes(
        gzip.compress(json.dumps(event("b", "metrics", {"x": 1.0}, 0, 0)).encode() + b"\n")
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT count(*) FROM metrics WHERE run = 'b'") == [(1,)]


def test_nan_inf_strings_stored_as_ieee(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "metrics", {"train/loss": "nan", "g": "inf", "h": "-inf", "ok": 1.5}, 0, 3),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    vals = dict(q(db_path, "SELECT name, value FROM metrics"))
    assert (
        math.isnan(vals["train/loss"])
        and vals["g"] == math.inf
        and vals["h"] == -math.inf
        and vals["ok"] == 1.5
    )


def test_run_status_lifecycle(runs_dir, db_path, monkeypatch):
    now = time.time()
    write_lines(
        runs_dir / "done" / "events.0.jsonl",
        [
            event(
                "done",
                "run_start",
                {
                    "config": {},
                    "parent": {"run": "p", "step": 7},
                    "ladder": {"name": "lad", "rung": "d64"},
                    "tags": ["x"],
                },
                0,
                t=now,
            ),
            event("done", "metrics", {"loss": 1.0}, 1, 5, t=now),
            event("done", "run_end", {"status": "preempted", "final_step": 5}, 2, t=now),
        ],
    )
    write_lines(runs_dir / "live" / "events.0.jsonl", [event("live", "run_start", {"config": {}}, 0, t=now)])
    write_lines(
        runs_dir / "dead" / "events.0.jsonl", [event("dead", "run_start", {"config": {}}, 0, t=now - 1000)]
    )
    ingest(runs_dir, db_path, emit=None)
    with store.connect(db_path) as con:
        runs = {r["run"]: r for r in list_runs(con)}
    assert runs["done"]["status"] == "preempted" and runs["done"]["final_step"] == 5
    assert (runs["done"]["parent_run"], runs["done"]["parent_step"]) == ("p", 7)
    assert (runs["done"]["ladder_name"], runs["done"]["ladder_rung"], runs["done"]["tags"]) == (
        "lad",
        "d64",
        ["x"],
    )
    assert runs["live"]["status"] == "running"
    assert runs["dead"]["status"] == "crashed"  # silent longer than stale_after_s, no run_end
    # a resume writes a new run_start after the run_end: running again
    write_lines(
        runs_dir / "done" / "events.0.jsonl", [event("done", "run_start", {"config": {}}, 3, t=now + 10)]
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT status, end_time FROM runs WHERE run = 'done'") == [("running", None)]
    # a crashed run that speaks again is running
    write_lines(runs_dir / "dead" / "events.0.jsonl", [event("dead", "metrics", {"x": 1.0}, 1, 1, t=now)])
    ingest(runs_dir, db_path, emit=None)
    with store.connect(db_path) as con:
        assert {r["run"]: r["status"] for r in list_runs(con)}["dead"] == "running"


def test_a_run_resumed_without_a_new_run_start_is_running(runs_dir, db_path):
    """`trainer train --resume` and the wandb API's `init(resume=)` append to the run's log with no
    second run_start: events after its run_end mean it is running again, until its next run_end."""
    now = time.time()
    log = runs_dir / "r" / "events.0.jsonl"
    write_lines(
        log,
        [
            event("r", "run_start", {"config": {}}, 0, t=now),
            event("r", "metrics", {"loss": 1.0}, 1, 5, t=now),
            event("r", "run_end", {"status": "preempted", "final_step": 5}, 2, t=now),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT status, final_step FROM runs") == [("preempted", 5)]
    write_lines(
        log,
        [
            event("r", "note", {"text": "resumed from checkpoint at step 5"}, 3, 5, t=now + 30),
            event("r", "metrics", {"loss": 0.9}, 4, 6, t=now + 30),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT status, end_time, final_step, last_step FROM runs") == [
        ("running", None, None, 6)
    ]
    write_lines(log, [event("r", "run_end", {"status": "completed", "final_step": 6}, 5, t=now + 30)])
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT status, final_step FROM runs") == [("completed", 6)]
    # the same log in one batch, and a two-host run whose host 1 logged after host 0's run_end (its own
    # run_end comes later still): completed, not running
    write_lines(
        runs_dir / "h" / "events.0.jsonl",
        [
            event("h", "run_start", {"config": {}}, 0, t=now),
            event("h", "run_end", {"status": "completed", "final_step": 3}, 1, t=now),
        ],
    )
    write_lines(
        runs_dir / "h" / "events.1.jsonl",
        [
            event("h", "metrics", {"loss": 1.0}, 0, 3, t=now + 1, host=1),
            event("h", "run_end", {"status": "completed", "final_step": 3}, 1, t=now + 1, host=1),
        ],
    )
    fresh = db_path.with_name("fresh.duckdb")
    ingest(runs_dir, fresh, emit=None)
    assert q(fresh, "SELECT run, status, final_step FROM runs ORDER BY run") == [
        ("h", "completed", 3),
        ("r", "completed", 6),
    ]


def test_a_final_failure_is_crashed_at_its_time_until_the_run_writes_again(runs_dir, db_path):
    """A `failure` with `final: true` (an importer's run cut short) says its writer stopped: the run is
    crashed at that event's time at once, not after stale_after_s; from the logs alone (a new store, a
    rebuild). Events written after it make the run running again; older ones (another host) do not."""
    now = time.time()
    stop = {"type": "crashed", "message": "log ends without an exit record", "final": True}
    log = write_lines(
        runs_dir / "c" / "events.0.jsonl",
        [
            event("c", "run_start", {"config": {}}, 0, t=now),
            event("c", "metrics", {"loss": 1.0}, 1, 1, t=now),
            event("c", "failure", stop, 2, 1, t=now),
        ],
    )
    write_lines(
        runs_dir / "f" / "events.0.jsonl",
        [
            event("f", "run_start", {"config": {}}, 0, t=now),
            event(
                "f", "failure", {"type": "nan_loss", "message": "loss is nan", "action": "halt"}, 1, 1, t=now
            ),
        ],
    )
    sql = "SELECT run, status, end_time, final_step FROM runs ORDER BY run"
    want = [("c", "crashed", now + 0.02, None), ("f", "running", None, None)]
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, sql) == want
    rebuild(runs_dir, db_path, emit=None)
    assert q(db_path, sql) == want
    write_lines(
        runs_dir / "c" / "events.1.jsonl", [event("c", "metrics", {"loss": 2.0}, 0, 0, t=now - 5, host=1)]
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, sql)[0] == (
        "c",
        "crashed",
        now + 0.02,
        None,
    )  # older than the crash: not a sign of life
    write_lines(log, [event("c", "metrics", {"loss": 0.9}, 3, 2, t=now + 10)])
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, sql)[0] == ("c", "running", None, None)
    write_lines(log, [event("c", "failure", stop, 4, 2, t=now + 10)])
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, sql)[0] == ("c", "crashed", now + 10.04, None)
    fresh = db_path.with_name("fresh.duckdb")
    ingest(runs_dir, fresh, emit=None)
    assert q(fresh, sql) == q(db_path, sql)


def test_unknown_kind_kept_and_flagged(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "gpu_temps", {"gpu0": 71}, 0),
            event("a", "note", {"text": "hello **world**"}, 1),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT kind, known, data->>'$.gpu0' FROM events ORDER BY seq") == [
        ("gpu_temps", False, "71"),
        ("note", True, None),
    ]


def test_summary_histogram_artifact_are_known_and_queryable(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "summary", {"best/loss": 2.5, "best/name": "d64", "done": True}, 0),
            event(
                "a",
                "histogram",
                {"name": "router/hist", "bucket_limits": [0, 1, 2], "bucket_counts": [3, 4]},
                1,
                step=5,
            ),
            event("a", "artifact", {"name": "cfg", "type": "config", "path": "/x/cfg.yaml", "bytes": 12}, 2),
            event(
                "a", "histogram", {"name": "bad", "bucket_limits": [0, 1], "bucket_counts": [3, 4]}, 3, step=6
            ),
            event("a", "summary", {"nested": {"a": 1}}, 4),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT kind, known, step FROM events ORDER BY seq") == [
        ("summary", True, None),
        ("histogram", True, 5),
        ("artifact", True, None),
    ]
    assert q(
        db_path,
        "SELECT data->>'$.best/name', data->>'$.bucket_counts[1]' FROM events WHERE seq <= 1 ORDER BY seq",
    ) == [("d64", None), (None, "4")]
    rejected = q(db_path, "SELECT line, field FROM rejected_events ORDER BY line")
    assert rejected == [(4, "data.bucket_limits"), (5, "data.nested")]


def test_rebuild_gives_same_answers(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [event("a", "run_start", {"config": {}}, 0)] + _run_lines("a", 8, 1),
    )
    write_lines(runs_dir / "a" / "events.0.jsonl", ["{not json"])
    write_lines(runs_dir / "b" / "events.0.jsonl", _run_lines("b", 3))
    ingest(runs_dir, db_path, emit=None)
    write_lines(runs_dir / "b" / "events.0.jsonl", _run_lines("b", 5, 9)[9:])
    ingest(runs_dir, db_path, emit=None)
    queries = [
        "SELECT run, step, name, value, host FROM metrics ORDER BY ALL",
        "SELECT * FROM expert_load ORDER BY ALL",
        "SELECT run, host, seq, kind, step, data FROM events ORDER BY ALL",
        "SELECT file, line, field, reason FROM rejected_events ORDER BY ALL",
        "SELECT run, status, last_step, start_time FROM runs ORDER BY ALL",
        "SELECT * FROM run_drop_fraction ORDER BY ALL",
    ]
    before = [q(db_path, s) for s in queries]
    rebuild(runs_dir, db_path, emit=None)
    assert [q(db_path, s) for s in queries] == before
    os.remove(db_path)  # decision 1: the store is a rebuildable index
    ingest(runs_dir, db_path, emit=None)
    assert [q(db_path, s) for s in queries] == before


def test_fast_path_agrees_with_validate_event(runs_dir, db_path):
    """Every mutated line is accepted iff validate_event accepts it (vectorised or line by line alike)."""
    base_m = event("a", "metrics", {"train/loss": 2.5, "x": 1}, 0, 1)
    base_x = event("a", "expert_load", {"layer": 1, "routed": [3, 4], "dropped": [0, 1]}, 0, 1)
    variants = []
    for base in (base_m, base_x):
        variants.append(dict(base))
        for key, bad in [
            ("v", 2),
            ("v", "1"),
            ("v", 1.0),
            ("run", "b"),
            ("run", 7),
            ("kind", ""),
            ("step", -1),
            ("step", 1.5),
            ("step", "3"),
            ("step", True),
            ("t", "1"),
            ("t", None),
            ("t", True),
            ("host", 1),
            ("host", -1),
            ("host", 0.0),
            ("seq", -2),
            ("seq", 1.5),
            ("data", [1]),
            ("data", None),
            ("step", None),
        ]:
            variants.append({**base, key: bad})
        variants.append({k: v for k, v in base.items() if k != "step"})
        variants.append({k: v for k, v in base.items() if k != "seq"})
    for data in [
        {"a": True},
        {"a": "3"},
        {"a": None},
        {"a": [1]},
        {"a": {"b": 1}},
        {"": 1.0},
        {"a": "nan"},
        {"a": 1e308},
        {"a": -0.0},
        {"a:b": 1},
        {},
    ]:
        variants.append({**base_m, "data": data})
    for data in [
        {"layer": 1.5, "routed": [1], "dropped": [0]},
        {"layer": 1, "routed": [1.5], "dropped": [0]},
        {"layer": 1, "routed": [1.0], "dropped": [0]},
        {"layer": 1, "routed": [-1], "dropped": [0]},
        {"layer": 1, "routed": [1, 2], "dropped": [0]},
        {"layer": 1, "routed": [True], "dropped": [0]},
        {"layer": 1, "routed": ["1"], "dropped": [0]},
        {"layer": -1, "routed": [1], "dropped": [0]},
        {"routed": [1], "dropped": [0]},
        {"layer": 1, "routed": [], "dropped": []},
        {"layer": 1, "routed": [1], "dropped": [0], "extra": 1},
        {"layer": 1, "routed": [5000000000], "dropped": [0]},
        {"layer": 70000, "routed": [1], "dropped": [0]},
    ]:
        variants.append({**base_x, "data": data})
    lines, expected = [], 0
    for i, ev in enumerate(variants):
        ev = {**ev, "seq": i} if isinstance(ev.get("seq"), int) and ev.get("seq", 0) >= 0 else ev
        lines.append(ev)
        try:
            validate_event(ev, run_folder="a", host=0)
            ok = ev["kind"] != "expert_load" or (
                ev.get("step") is not None
                and ev["data"]["layer"] <= 65535
                and max(ev["data"]["routed"], default=0) < 2**32
            )
        except ValidationError:
            ok = False
        expected += ok
    # clean lines around them, so that the bulk path takes the piece and hands it the odd lines one by one
    clean = [event("a", "metrics", {"train/loss": 2.0, "x": 1}, len(variants) + i, 1) for i in range(800)]
    lines += clean
    expected += len(clean)
    write_lines(runs_dir / "a" / "events.0.jsonl", lines)
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == expected
    assert 0 < rep.fast_events < expected  # both paths were exercised
    assert rep.rejected == len(lines) - expected
    assert q(db_path, "SELECT count(*) FROM rejected_events") == [(len(lines) - expected,)]
    assert q(db_path, "SELECT count(*) FROM rejected_events WHERE reason = '' OR field IS NULL") == [(0,)]


def test_seq_must_increase_and_duplicates_skip(runs_dir, db_path):
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "metrics", {"x": 1.0}, 0, 0),
            event("a", "metrics", {"x": 2.0}, 1, 1),
            event("a", "metrics", {"x": 3.0}, 1, 2),
            event("a", "metrics", {"x": 4.0}, 5, 3),
        ],
    )
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == 3 and rep.rejected == 1
    assert q(db_path, "SELECT line, field, reason FROM rejected_events") == [
        (3, "seq", "seq 1 is not above the previous seq 1 in this file")
    ]


@pytest.mark.parametrize("kind", ["metrics", "expert_load"])
def test_many_lines_bulk(runs_dir, db_path, kind):
    lines = [
        event("a", "metrics", {f"m{i}": i * 0.5 for i in range(50)}, s, s)
        if kind == "metrics"
        else event(
            "a", "expert_load", {"layer": s % 8, "routed": list(range(64)), "dropped": [0] * 64}, s, s // 8
        )
        for s in range(2000)
    ]
    write_lines(runs_dir / "a" / "events.0.jsonl", lines)
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == rep.fast_events == 2000
    if kind == "metrics":
        assert q(db_path, "SELECT count(*), sum(value) FROM metrics") == [
            (100_000, 2000 * sum(i * 0.5 for i in range(50)))
        ]
    else:
        assert q(db_path, "SELECT count(*), sum(routed), count(DISTINCT (step, layer)) FROM expert_load") == [
            (128_000, 2000 * sum(range(64)), 2000)
        ]


def test_hooks_run_and_their_failures_do_not_stop_ingest(runs_dir, db_path, monkeypatch):
    """Rollups run in the batch's transaction, anomalies after it; a failing hook loses nothing."""
    from observatory.detect import scan as anomalies
    from observatory.store import rollups

    write_lines(runs_dir / "a" / "events.0.jsonl", _run_lines("a", 5))
    _ingest(runs_dir, db_path, emit=None)
    assert q(db_path, "SELECT count(*) FROM metric_series WHERE run = 'a'") == [
        (2,)
    ]  # rollups ran in the batch

    seen = []
    monkeypatch.setattr(
        rollups, "after_ingest", lambda con, touched: (_ for _ in ()).throw(RuntimeError("rollup bug"))
    )
    monkeypatch.setattr(
        anomalies, "after_ingest", lambda db, runs, touched, **kw: seen.append(set(touched)) or 1 / 0
    )
    write_lines(runs_dir / "a" / "events.0.jsonl", _run_lines("a", 8, 15)[15:])
    msgs: list[str] = []
    rep = _ingest(runs_dir, db_path, emit=msgs.append)
    assert rep.events == 9 and q(db_path, "SELECT count(*) FROM metrics") == [(16,)]
    assert any("rollups.after_ingest failed (RuntimeError: rollup bug)" in m for m in msgs)
    assert any("anomalies.after_ingest failed: ZeroDivisionError" in m for m in msgs)
    assert seen == [{"a"}, set()]  # the batch's runs; then the clock's tick (no run: the stall check)


def test_rows_committed_without_their_rollups_are_rolled_up_by_the_next_call(runs_dir, db_path, tmp_path):
    """Ingest commits a batch, then rolls it up in a transaction of its own; rows left without their
    rollups (a kill in between, or an ingest with the hooks off) are caught up by the next call with
    hooks, even when it finds nothing new to read, and equal what one call with hooks makes."""
    write_lines(runs_dir / "a" / "events.0.jsonl", _run_lines("a", 20))
    ingest(runs_dir, db_path)  # hooks off: the rows, no rollups (the state a kill between the two leaves)
    assert q(db_path, "SELECT count(*) FROM metrics_r8") == [(0,)] and q(
        db_path, "SELECT count(*) FROM metrics"
    ) == [(40,)]
    rep = _ingest(runs_dir, db_path, emit=None)
    assert rep.events == 0  # nothing new was read
    whole = tmp_path / "whole.duckdb"
    _ingest(runs_dir, whole, emit=None)
    for table in (
        "metrics_r8",
        "metrics_r512",
        "metric_series",
        "expert_layer_step",
        "expert_load_r16",
        "expert_load_r1024",
    ):
        sql = f"SELECT * FROM {table} ORDER BY ALL"
        got = q(db_path, sql)
        assert got and got == q(whole, sql), table


def test_observatory_findings_do_not_revive_a_crashed_run(runs_dir, db_path):
    from observatory.events import OBSERVATORY_HOST

    old = time.time() - 3600
    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [event("a", "run_start", {"config": {}}, 0, t=old), event("a", "metrics", {"x": 1.0}, 1, 7, t=old)],
    )
    write_stall_finding(runs_dir, "a", 7)
    rep = ingest(runs_dir, db_path, emit=None)
    assert rep.events == 3
    assert q(db_path, "SELECT status, last_step, last_event_t < epoch(now()) - 3000 FROM runs") == [
        ("crashed", 7, True)
    ]
    assert q(db_path, "SELECT kind, host FROM events WHERE kind = 'anomaly'") == [
        ("anomaly", OBSERVATORY_HOST)
    ]


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_one_ingest_leaves_auto_decisions_in_the_store(runs_dir, db_path):
    """The decision hook's records (config_diff, handled failure) are ingested in the same call, once."""
    from observatory.queries.decisions import current_states

    write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [
            event("a", "run_start", {"config": {"optim": {"lr": 3e-4}}}, 0),
            event(
                "a",
                "config_diff",
                {"against": {"run": "p", "step": 10}, "changes": {"optim.lr": [1e-3, 3e-4]}},
                1,
                0,
            ),
            *_run_lines("a", 3, 2, layers=1),
            event("a", "failure", {"type": "nan_loss", "message": "nan", "action": "skip_batch"}, 8, 2),
            event("a", "failure", {"type": "exception", "message": "boom", "action": "halt"}, 9, 2),
        ],
    )
    rep = _ingest(runs_dir, db_path, emit=None)
    assert rep.rejected == 0

    def states():
        with store.connect(db_path) as con:
            return {s["id"]: s for s in current_states(con)}

    got = states()
    assert sorted(got) == ["auto-a-1", "auto-a-8"]  # the halt is not an intervention
    assert got["auto-a-1"]["state"]["config_diff"] == {"optim.lr": [1e-3, 3e-4]}
    assert got["auto-a-8"]["state"]["action"] == "skip_batch" and got["auto-a-1"]["home_run"] == "a"
    # the records do not count as the run's own activity, and nothing is written twice
    assert q(db_path, "SELECT status, last_step FROM runs") == [("running", 2)]
    again = _ingest(runs_dir, db_path, emit=None)
    assert again.events == 0 and q(db_path, "SELECT count(*) FROM events WHERE kind = 'decision'") == [(2,)]
    write_lines(
        runs_dir / "a" / "events.0.jsonl", _run_lines("a", 5, 10, layers=1)[6:]
    )  # more activity: hook reruns
    _ingest(runs_dir, db_path, emit=None)
    written = [json.loads(x) for x in findings.path(runs_dir, "a").read_text().splitlines()]
    assert sorted(e["data"]["id"] for e in written if e["kind"] == "decision") == ["auto-a-1", "auto-a-8"]
    # rebuild reads the records back from the logs; it runs no hook and duplicates nothing
    rebuild(runs_dir, db_path, emit=None)
    assert states().keys() == got.keys() and {s["n_events"] for s in states().values()} == {1}


def test_a_host_above_the_stores_range_skips_that_file_with_a_clear_error(tmp_path):
    """events.70000.jsonl cannot be kept (hosts are USMALLINT): its file is named and skipped, once,
    and every other file is ingested."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_lines(runs / "ok" / "events.0.jsonl", _run_lines("ok", 3))
    write_lines(runs / "ok" / "events.70000.jsonl", [{**e, "host": 70000} for e in _run_lines("ok", 2)])
    said: list[str] = []
    report = ingest(runs, db, emit=said.append)
    assert q(db, "SELECT count(DISTINCT step), min(host), max(host) FROM metrics WHERE run = 'ok'") == [
        (3, 0, 0)
    ]
    bad = [m for m in said if "events.70000.jsonl" in m]
    assert len(bad) == 1 and "host 70000" in bad[0] and "above 65535" in bad[0] and "skipped" in bad[0]
    assert report.events == 3 * 3 and not any("cannot ingest" in m for m in said)
    said.clear()
    ingest(
        runs, db, emit=said.append
    )  # a later ingest says it again (it is still there), nothing else changes
    assert [m for m in said if "events.70000.jsonl" in m] and q(db, "SELECT count(*) FROM ingest_files") == [
        (1,)
    ]


def test_the_analyses_run_in_one_fixed_order():
    """The analyses the ingester runs after each batch, in run order (the alerts after the findings they
    read); each is a method of `Analyses`."""
    from observatory import pipeline

    assert pipeline.ANALYSES == ("anomalies", "ladder_watch", "decisions", "alerts")
    assert all(callable(getattr(pipeline.Analyses, "_" + name)) for name in pipeline.ANALYSES)
    assert set(pipeline.ON_CLOCK) <= set(pipeline.ANALYSES)


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_runs_rows_kept_by_updates_equal_one_pass(tmp_path):
    """`runs` folded batch by batch (each batch UPDATEs the columns it changed) equals one pass over the same
    bytes: a 535b-shaped story with a preemption and resume, a fork, host files and a run_end."""
    from observatory.interop.simulate import simulate

    src = tmp_path / "src"
    simulate("535b", src, steps=400, expert_load_every=0, hosts=2)
    whole_runs, whole_db = tmp_path / "whole", tmp_path / "whole.duckdb"
    shutil.copytree(src, whole_runs)
    ingest(whole_runs, whole_db)
    runs, db = tmp_path / "runs", tmp_path / "pieces.duckdb"
    for _ in append_in_pieces(src, runs, 20):
        ingest(runs, db)
    sql = "SELECT * FROM runs ORDER BY run"
    want = q(whole_db, sql)
    assert len(want) == 2 and {r[0] for r in want} == {"sim-535b", "sim-535b-fork"}
    assert q(db, sql) == want


# ------------------------------------------------------------------ catch-up transactions


def _files(runs_dir, n: int) -> None:
    for r in range(n):
        write_lines(
            runs_dir / f"r{r}" / "events.0.jsonl",
            [
                event(f"r{r}", "run_start", {"config": {}}, 0),
                *[event(f"r{r}", "metrics", {"train/loss": 1.0 / (i + 1)}, i + 1, i) for i in range(40)],
            ],
        )


def _transactions(monkeypatch) -> list[int]:
    """The input bytes of each batch transaction the ingester commits from now on."""
    from observatory.ingest import passes

    sizes: list[int] = []
    real = passes._run_batch

    def counted(*a, **k):
        b, more = real(*a, **k)
        if b is not None:
            sizes.append(b.n_bytes)
        return b, more

    monkeypatch.setattr(passes, "_run_batch", counted)
    return sizes


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_a_transaction_takes_in_batch_bytes(runs_dir, db_path, monkeypatch):
    """Each write transaction takes in about `BATCH_BYTES` of input (here one file a transaction), so a reader
    waits for one short hold at most; the rows are those of every file."""
    from observatory.ingest import passes

    _files(runs_dir, 12)
    monkeypatch.setattr(passes, "BATCH_BYTES", 1000)  # each file is more: one file a transaction
    sizes = _transactions(monkeypatch)
    rep = _ingest(runs_dir, db_path, hooks=False, emit=None)
    assert len(sizes) == 12
    assert sum(sizes) == rep.bytes == sum(p.stat().st_size for p in runs_dir.rglob("*.jsonl"))
    with store.connect(db_path) as con:
        assert con.execute("SELECT count(*), count(DISTINCT run) FROM metrics").fetchall() == [(480, 12)]


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_a_long_log_is_read_a_batch_at_a_time_and_never_past_the_budget(runs_dir, db_path, monkeypatch):
    """A log longer than a batch: each transaction takes in at most `BATCH_BYTES` (a chunk ends at its last
    newline, so reading a second full chunk after it took twice the budget; a log's last `SMALL_FILE` bytes
    may be read whole), the batch it fills takes no other file, and no batch fails (a batch that stopped just under its budget looked up the other files
    while its INSERTs were running on the connection: "connection is busy", then one file at a time)."""
    from observatory.ingest import files as fs
    from observatory.ingest import passes

    monkeypatch.setattr(passes, "BATCH_BYTES", 100_000)
    monkeypatch.setenv("OBSERVATORY_MAX_LINE_BYTES", "1000")
    write_lines(
        runs_dir / "long" / "events.0.jsonl",
        [event("long", "metrics", {"train/loss": 1.0 / (i + 1), "lr": 1e-3}, i, i) for i in range(7000)],
    )
    _files(runs_dir, 3)  # r0..r2 wait behind it in ingest order
    sizes = _transactions(monkeypatch)
    said: list[str] = []
    rep = _ingest(runs_dir, db_path, hooks=False, emit=said.append)
    long_bytes = (runs_dir / "long" / "events.0.jsonl").stat().st_size
    assert not said and rep.rejected == 0
    assert len(sizes) >= long_bytes // 100_000 and max(sizes) <= 100_000 + fs.SMALL_FILE
    assert sum(sizes) == rep.bytes == sum(p.stat().st_size for p in runs_dir.rglob("*.jsonl"))
    assert q(db_path, "SELECT run, count(*) FROM metrics GROUP BY run ORDER BY run") == [
        ("long", 14000),
        *((f"r{r}", 40) for r in range(3)),
    ]


@pytest.mark.timeout(120)  # the old code read the grown file again forever
def test_a_failed_batch_is_done_again_one_file_at_a_time_and_ends(runs_dir, db_path, monkeypatch):
    """A batch that fails is done again one file at a time: the file to blame is named and skipped, every
    other is stored, and the call ends, also when a file grew after the pass listed it (read to its new
    end, the pass's listing says it shrank: looking at it again read it from the start, forever)."""
    from observatory.ingest import passes

    _files(runs_dir, 3)
    big = (
        runs_dir / "r1" / "events.0.jsonl"
    )  # past `SMALL_FILE`: read from its offset, not to its listed size
    write_lines(big, [event("r1", "metrics", {"train/loss": 1.0 / i}, i, i) for i in range(1, 801)])
    write_lines(runs_dir / "bad" / "events.0.jsonl", [event("bad", "metrics", {"train/loss": 1.0}, 0, 1)])
    real = passes.update_runs
    grown = []

    def update_runs(con, b):
        if "bad" in b.activity:
            if not grown:  # r1 grows after the pass listed it
                grown.append(1)
                with open(big, "a") as f:
                    f.write(json.dumps(event("r1", "metrics", {"train/loss": 0.1}, 801, 801)) + "\n")
            raise RuntimeError("boom")
        return real(con, b)

    monkeypatch.setattr(passes, "update_runs", update_runs)
    said: list[str] = []
    _ingest(runs_dir, db_path, hooks=False, emit=said.append)
    assert [m for m in said if "cannot ingest" in m or "batch failed" in m] == [
        f"{runs_dir}: a batch failed (RuntimeError: boom); nothing of it was stored, and its files are read "
        "again one at a time, so that only a file that fails alone is skipped",
        f"{runs_dir / 'bad' / 'events.0.jsonl'}: cannot ingest (RuntimeError: boom); skipped until the next ingest",
    ]
    assert q(db_path, "SELECT run, count(*) FROM metrics GROUP BY run ORDER BY run") == [
        ("r0", 40),
        ("r1", 801),
        ("r2", 40),
    ]


def test_a_batch_lists_only_the_files_it_can_take(runs_dir, db_path):
    """`with_work` with a budget: the first files with new bytes, in ingest order (a run's .gz copy before its
    live file), up to the one that crosses it, and whether others wait; without one, every file with work."""
    from observatory.ingest import files as fs

    _files(runs_dir, 6)
    _ingest(runs_dir, db_path, hooks=False, emit=None)
    before = (runs_dir / "r1" / "events.0.jsonl").stat().st_size
    for r in (1, 3, 4, 5):  # new bytes in four runs, and an import copy of run 3's log
        with open(runs_dir / f"r{r}" / "events.0.jsonl", "a") as f:
            f.write(json.dumps(event(f"r{r}", "metrics", {"train/loss": 0.5}, 100, 100)) + "\n")
    (runs_dir / "r3" / "events.0.jsonl.gz").write_bytes(gzip.compress(b""))
    scan = fs.scan(runs_dir)
    grown = (runs_dir / "r1" / "events.0.jsonl").stat().st_size - before  # r1's new bytes
    with store.connect(db_path) as con:
        every, left = fs.with_work(con, scan)
        assert [f.rel for f in every] == [
            "r1/events.0.jsonl",
            "r3/events.0.jsonl.gz",
            "r3/events.0.jsonl",
            "r4/events.0.jsonl",
            "r5/events.0.jsonl",
        ] and not left
        first, left = fs.with_work(con, scan, budget=grown + 1)  # r1's bytes, then the .gz (read whole): cut
        assert [f.rel for f in first] == ["r1/events.0.jsonl", "r3/events.0.jsonl.gz"] and left
        assert fs.with_work(con, scan, budget=10**9) == (every, False)


def test_a_file_that_cannot_be_read_just_now_holds_no_other_back(runs_dir, db_path, monkeypatch):
    """The first file in ingest order is bigger than a batch and cannot be read this time (a transient
    error): the call still reads every other file, says it will retry, and ends; the next call reads it."""
    from observatory.ingest import files as fs
    from observatory.ingest import passes

    _files(runs_dir, 5)
    monkeypatch.setattr(passes, "BATCH_BYTES", 1000)  # r0's log alone is more than a batch
    real = fs.read_chunk

    def flaky(lf, *a, **k):
        if lf.run == "r0":
            return fs.Chunk(b"", 0, [], b"", 0, True, "cannot open: busy", transient=True)
        return real(lf, *a, **k)

    monkeypatch.setattr(fs, "read_chunk", flaky)
    real_rest = fs.read_rest  # a small file's one read fails too: read_chunk is then asked
    monkeypatch.setattr(fs, "read_rest", lambda lf, *a: None if lf.run == "r0" else real_rest(lf, *a))
    msgs: list[str] = []
    _ingest(runs_dir, db_path, hooks=False, emit=msgs.append)
    assert q(db_path, "SELECT DISTINCT run FROM metrics ORDER BY run") == [("r1",), ("r2",), ("r3",), ("r4",)]
    assert any("r0" in m and "will retry" in m for m in msgs)
    monkeypatch.setattr(fs, "read_chunk", real)
    _ingest(runs_dir, db_path, hooks=False, emit=None)
    assert q(db_path, "SELECT count(DISTINCT run), count(*) FROM metrics") == [(5, 200)]


def test_a_run_in_a_long_budgeted_phase_is_not_crashed_before_its_budget(runs_dir, db_path):
    """A run that writes no heartbeats and is 400 s into a checkpoint save (budget 600 s), or 400 s into a
    compile that names no budget (`phase_budget_s`, 30 min), is running, not crashed after `stale_after_s`
    (120 s); one whose save outran its budget, or whose newest phase is `train`, is crashed. Every reader
    (the stored status, the runs listing, the report) says so, and a rebuild stores the same."""
    from observatory.report import effective_status

    now = time.time()

    def run(name, phases):
        lines = [event(name, "run_start", {"config": {}}, 0, t=now - 1000)]
        lines.append(event(name, "metrics", {"train/loss": 2.0}, 1, 10, t=now - 990))
        for i, (phase, t, budget) in enumerate(phases):
            data = {"phase": phase, "attempt": 0} | ({} if budget is None else {"budget_s": budget})
            lines.append(event(name, "phase", data, 2 + i, 10, t=t))
        write_lines(runs_dir / name / "events.0.jsonl", lines)

    run("saving", [("checkpoint", now - 400, 600.0)])
    run("compiling", [("compile", now - 400, None)])
    run("overdue", [("checkpoint", now - 700, 600.0)])
    run("trained", [("checkpoint", now - 700, 600.0), ("train", now - 400, None)])
    run("budget-of-old", [("eval", now - 950, 5000.0), ("checkpoint", now - 900, 600.0)])
    ingest(runs_dir, db_path, emit=None)
    expect = {
        "saving": "running",
        "compiling": "running",
        "overdue": "crashed",
        "trained": "crashed",
        "budget-of-old": "crashed",
    }
    assert dict(q(db_path, "SELECT run, status FROM runs")) == expect
    with store.connect(db_path) as con:
        listed = {r["run"]: r["status"] for r in list_runs(con, now=now)}
        assert listed == expect
        from observatory.queries.report import run_info

        assert {r: effective_status(run_info(con, r), now) for r in expect} == expect
    again = db_path.with_name("again.duckdb")
    rebuild(runs_dir, again, emit=None)
    cols = "run, status, phase, phase_t, phase_budget_s"
    assert q(again, f"SELECT {cols} FROM runs ORDER BY run") == q(
        db_path, f"SELECT {cols} FROM runs ORDER BY run"
    )


def test_read_rest_reads_a_small_log_as_read_chunk_does_or_leaves_it_to_it(tmp_path):
    """A small log's one read (`model.read_rest`): the chunk `read_chunk` gives of a log of complete lines,
    from the start or an offset; None (read_chunk's turn) for one that grew since it was listed, ends in a
    torn line, is bigger than asked, is a FIFO (never blocks on it) or a folder named like a log."""
    import os

    from observatory.ingest.model import LogFile, read_chunk, read_rest

    def log(name: str, data: bytes | None) -> LogFile:
        p = tmp_path / name / "events.0.jsonl"
        p.parent.mkdir()
        if data is not None:
            p.write_bytes(data)
        return LogFile(str(tmp_path), f"{name}/events.0.jsonl", name, 0, False, len(data or b""), 0.0)

    lines = b'{"a": 1}\n{"b": 2}\n'
    whole = log("whole", lines)
    for offset in (0, 9):
        got, want = read_rest(whole, offset, 1 << 16), read_chunk(whole, offset, (1 << 16) + 1, 1 << 20)
        assert got == want and got.data == lines[offset:] and got.end == len(lines) and got.eof
    grown = log("grown", lines)
    with open(grown.path, "ab") as f:
        f.write(b'{"c": 3}\n')
    torn = log("torn", lines + b'{"c":')
    assert read_rest(grown, 0, 1 << 16) is None and read_rest(torn, 0, 1 << 16) is None
    assert read_rest(whole, 0, 10) is None and read_rest(whole, len(lines), 1 << 16) is None
    fifo = log("fifo", None)
    os.mkfifo(fifo.path)
    fifo = LogFile(fifo.root, fifo.rel, fifo.run, 0, False, 10, 0.0)
    assert read_rest(fifo, 0, 1 << 16) is None
    folder = tmp_path / "dir" / "events.0.jsonl"
    folder.mkdir(parents=True)
    assert (
        read_rest(LogFile(str(tmp_path), "dir/events.0.jsonl", "dir", 0, False, 10, 0.0), 0, 1 << 16) is None
    )


def test_a_pass_lists_its_files_once_and_no_batch_lists_one_read_to_its_end(runs_dir, db_path, monkeypatch):
    """A catch-up in many batches joins the scan with the store once (not once a batch), and no batch lists a
    file an earlier batch of the pass read to its end; every row is stored, and the next call lists nothing."""
    from observatory.ingest import files as fs
    from observatory.ingest import passes

    _files(runs_dir, 12)
    monkeypatch.setattr(passes, "BATCH_BYTES", 3000)  # a few files a transaction
    sizes = _transactions(monkeypatch)
    joins, taken = [], []
    real_listed, real_with_work = fs._listed, fs.with_work
    monkeypatch.setattr(fs, "_listed", lambda *a, **k: joins.append(1) or real_listed(*a, **k))

    def with_work(con, scan, only=None, budget=None):
        files, left = real_with_work(con, scan, only, budget)
        taken.append([f.rel for f in files])
        return files, left

    monkeypatch.setattr(fs, "with_work", with_work)
    rep = _ingest(runs_dir, db_path, hooks=False, emit=None)
    assert len(sizes) >= 4 and len(joins) == 1
    listed = [rel for batch in taken for rel in batch]
    assert sorted(set(listed)) == sorted(f"r{r}/events.0.jsonl" for r in range(12))
    assert len(listed) == len(set(listed))  # each file read to its end once, in one batch
    assert rep.bytes == sum(p.stat().st_size for p in runs_dir.rglob("*.jsonl"))
    assert q(db_path, "SELECT count(*) FROM metrics") == [(12 * 40,)]
    joins.clear()
    assert _ingest(runs_dir, db_path, hooks=False, emit=None).bytes == 0 and len(joins) == 1
