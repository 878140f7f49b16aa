"""The bulk ingest path (msgspec_lines) gives the same store as judging every line alone (`model.check_line`:
validate_event and the store's ranges), table by table.

Differential: varied logs (several runs and hosts, every kind, NaN/inf, duplicates, torn
lines, out-of-order seqs, every kind of bad line, tricky JSON, .gz copies) are ingested
once with `ingest_fast.ENABLED = False` (the reference) and once with it on; the stores
and the reports must be equal.
"""

from __future__ import annotations

import gzip
import itertools
import json
import math
import os
import random
import time
from pathlib import Path

import pytest
from conftest import event, write_lines

from observatory import provenance, store
from observatory.ingest import msgspec_lines as ingest_fast
from observatory.ingest import passes as ingest_mod
from observatory.ingest import rules
from observatory.pipeline import ingest

TABLES = {
    "metrics": "SELECT * FROM metrics",
    "expert_load": "SELECT * FROM expert_load",
    "events": "SELECT run, host, seq, kind, step, t, v, known, data::VARCHAR FROM events",
    "rejected_events": "SELECT file, run, line, field, reason, raw FROM rejected_events",
    "ingest_files": "SELECT * FROM ingest_files",
    "runs": "SELECT * FROM runs",
}
REPORT_FIELDS = (
    "files",
    "events",
    "metric_values",
    "expert_rows",
    "rejected",
    "duplicates",
    "truncated",
    "bytes",
    "passes",
    "runs",
    "messages",
)


def _norm(x):
    if isinstance(x, float) and math.isnan(x):
        return "nan"  # NaN != NaN; the store keeps NaN losses, so compare them by name
    return x


def dump(db: Path) -> dict[str, list[tuple]]:
    with store.connect(db) as con:
        return {
            t: sorted((tuple(_norm(v) for v in r) for r in con.execute(sql).fetchall()), key=repr)
            for t, sql in TABLES.items()
        }


# --------------------------------------------------------------- the logs

E = '"v":1,"t":1700000000.5,"host":0'


def _tricky(run: str, seq: int) -> list[str | bytes]:
    """Lines the two decoders could disagree on; each is valid, invalid, or odd in its own way."""
    s = seq
    env = f'"v":1,"run":"{run}","t":1700000000.5,"host":0'
    return [
        f'{{{env},"kind":"metrics","step":1,"seq":{s},"data":{{"a":NaN}}}}',  # NaN literal (json.loads takes it)
        f'{{{env},"kind":"metrics","step":1,"seq":{s + 1},"data":{{"a":1,"a":2,"\\u0061":3}}}}',  # duplicate keys
        f'{{{env},"kind":"metrics","step":1,"seq":{s + 2},"r\\u0075n":"other","data":{{"a":1}}}}',  # escaped key
        f'{{{env},"kind":"metrics","step":1,"seq":{s + 3},"data":{{"a":123456789012345678901234567890,"b":-0.0}}}}',
        f'{{{env},"kind":"metrics","step":1,"seq":{s + 4},"data":{{"a":1e400}}}}',  # overflows to inf
        f'{{{env},"kind":"metrics","step":null,"seq":{s + 5},"data":{{"a":1.25}}}}',  # no step
        f'{{{env},"kind":"metrics","step":2,"seq":{s + 6},"data":{{}}}}',  # no values
        f'{{{env},"kind":"metrics","step":2,"seq":{s + 7},"data":{{"":1}}}}',  # empty name
        f'{{{env},"kind":"metrics","step":2,"seq":{s + 8},"data":{{"a":true,"b":"inf","c":5}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 9},"data":{{"layer":70000,"routed":[1],"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 10},"data":{{"layer":1,"routed":[5000000000],"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 11},"data":{{"layer":1,"routed":[1,2],"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":null,"seq":{s + 12},"data":{{"layer":1,"routed":[1],"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":2147483648,"seq":{s + 13},"data":{{"layer":1,"routed":[1],"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":3,"seq":{s + 14},"data":{{"layer":1,"routed":[],"dropped":[],"x":[1]}}}}',
        f'{{{env},"kind":"metrics","step":3,"seq":9223372036854775808,"data":{{"a":1}}}}',  # seq too large
        f'{{{env},"kind":"metrics","step":3,"seq":-1,"data":{{"a":1}}}}',
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 15},"data":{{"a":1}},"x":"\xff"}}'.encode(
            "latin-1"
        ),  # not UTF-8
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 16},"data":{{"a":1}},"x":"a\x01b"}}',  # control character
        f' {{{env},"kind":"metrics","step":3,"seq":{s + 17},"data":{{"a":1}}}}',  # leading space
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 18},"data":{{"a":1}}}} ',  # trailing space
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 19},"data":{{"a":1}}}}\r',  # CRLF
        "",  # blank line
        "   ",
        f'{{{env},"kind":"mystery","step":3,"seq":{s + 20},"data":{{"a":1}}}}',  # unknown kind
        f'{{{env},"kind":"metrics","kind":"eval","step":3,"seq":{s + 21},"data":{{"a":1}}}}',
        f'{{{env},"kind":"note","kind":"metrics","step":3,"seq":{s + 22},"data":{{"a":1}}}}',
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 23},"data":{{"a":1}}}} {{{env},"kind":"metrics","seq":{s + 24},"data":{{}}}}',
        f'{{{env},"kind":"metrics","step":3,',  # a line torn mid-file, then a line that continues it
        f'"seq":{s + 25},"data":{{"a":1}}}}',
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 26},"data":{{"a":1}},"x":{"[" * 300}{"]" * 300}}}',  # deep
        f'{{"v":1.0,"run":"{run}","t":1.5,"host":0,"kind":"metrics","step":3,"seq":{s + 27},"data":{{"a":1}}}}',
        f'{{"v":true,"run":"{run}","t":1.5,"host":0,"kind":"metrics","step":3,"seq":{s + 28},"data":{{"a":1}}}}',
        f'{{"v":1,"run":"{run}","t":"1.5","host":0,"kind":"metrics","step":3,"seq":{s + 29},"data":{{"a":1}}}}',
        f'{{"v":1,"run":"{run}","t":1e400,"host":0,"kind":"metrics","step":3,"seq":{s + 30},"data":{{"a":1}}}}',
        f'{{"v":1,"run":"{run}","t":1.5,"host":0,"kind":"metrics","step":3,"seq":{s + 31},"data":{{"a":1}},"extra":{{"k":[1,"x",null]}}}}',
        f'{{"run":"{run}","t":1.5,"host":0,"kind":"metrics","step":3,"seq":{s + 32},"data":{{"a":1}},"v":1}}',  # order
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 33},"data":{{"a":1,"b":[1]}}}}',
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 34},"data":{{"a":{{"b":1}}}}}}',
        f'{{{env},"kind":"note","step":3,"seq":{s + 35},"data":{{"text":"{"x" * 5000}"}}}}',  # over max_line_bytes
        f'{{{env},"kind":"metrics","step":3,"seq":{s + 36},"data":{{"caf\\u00e9/loss":1,"\u00fcber":2}}}}',  # non-ASCII
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 37},"data":{{"layer":1,"routed":[1,{10**29}],"dropped":[0,0]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 38},"data":{{"layer":1,"routed":[1, 2],"dropped":[0,-0]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 39},"data":{{"layer":1,"routed":{{"a":1}},"dropped":[0]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 40},"data":{{"layer":1,"routed":[[1]],"dropped":[[0]]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 41},"data":{{"layer":1,"routed":7,"dropped":7}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 42},"data":{{"layer":1,"routed":[1.0],"dropped":[1e2]}}}}',
        f'{{{env},"kind":"expert_load","step":2,"seq":{s + 43},"data":{{"layer":2,"routed":[4294967295],"dropped":[0]}}}}',
        "[1, 2, 3]",
        "{}",
    ]


def _bad_events(run: str, seq: int) -> list[dict]:
    """One of each rejection tests/test_bad_input.py checks, as envelopes."""
    m = event(run, "metrics", {"x": 1.0}, seq, 1)
    return [
        m | {"v": None},
        {k: v for k, v in m.items() if k != "t"},
        m | {"step": "12"},
        m | {"host": 3},
        m | {"v": 9},
        event("zz", "metrics", {"x": 1.0}, seq, 1),
        event(run, "metrics", {"x": "fast"}, seq, 1),
        event(run, "expert_load", {"layer": 0, "routed": [1, 2], "dropped": [0]}, seq, 1),
        event(run, "eval", {"loss": 2.0}, seq, 1),
        event(run, "run_end", {"status": "exploded"}, seq, 1),
    ]


def _other(run: str, kind: str, seq: int, step: int, rng: random.Random) -> dict:
    data = {
        "run_start": {
            "config": {"lr": 3e-4, "nested": {"x": [1, 2]}},
            "name": run,
            "tags": ["a"],
            "ladder": {"name": "lad", "rung": "d64"},
            "parent": {"run": "p", "step": 5},
        },
        "eval": {"dataset": "val", "loss": rng.random(), "bpb": "nan"},
        "checkpoint": {"path": f"/ckpt/{step}", "bytes": 123},
        "config_diff": {"against": {"run": "p", "step": 1}, "changes": {"opt.lr": [1, 2]}},
        "decision": {"id": "d1", "status": "open"},
        "forecast": {"metric": "eval/loss", "target_step": 100, "value": 2.5, "low": 2.4, "high": 2.6},
        "anomaly": {"detector": "spike", "severity": "warn", "message": "m", "window": [1, 2]},
        "failure": {"type": "nan_loss", "message": "boom", "action": "skip_batch"},
        "note": {"text": "**hi**"},
        "run_end": {"status": "completed", "final_step": step},
    }[kind]
    return event(run, kind, data, seq, step, t=1.7e9)


def make_log(path: Path, run: str, host: int, seed: int, steps: int, messy: bool) -> list[bytes]:
    """The lines of one log (not written): metrics with a few key sets, expert_load, other kinds, and mess."""
    rng = random.Random(seed)
    lines: list = []
    seq = 0

    def add(x):
        nonlocal seq
        lines.append(x)
        seq += 1

    add(_other(run, "run_start", seq, 0, rng) | {"host": host})
    names = [f"train/m{i}" for i in range(rng.randrange(3, 12))]
    for step in range(steps):
        data = {n: rng.random() * 10 ** rng.randrange(-5, 5) for n in names}
        if step % 7 == 0:
            data["eval/extra"] = rng.randrange(100)  # an int value, another key set
        if messy and rng.random() < 0.05:
            data[rng.choice(names)] = rng.choice(["nan", "inf", "-inf", "NaN", "+inf"])
        add(event(run, "metrics", data, seq, step, t=1.7e9 + step, host=host))
        if step % 5 == 0:
            for layer in range(2):
                n = rng.randrange(0, 6)
                add(
                    event(
                        run,
                        "expert_load",
                        {
                            "layer": layer,
                            "routed": [rng.randrange(1000) for _ in range(n)],
                            "dropped": [rng.randrange(10) for _ in range(n)],
                        },
                        seq,
                        step,
                        t=1.7e9 + step,
                        host=host,
                    )
                )
        if rng.random() < 0.08:
            add(
                _other(
                    run,
                    rng.choice(
                        [
                            "eval",
                            "checkpoint",
                            "config_diff",
                            "decision",
                            "forecast",
                            "failure",
                            "note",
                        ]
                    ),
                    seq,
                    step,
                    rng,
                )
                | {"host": host}
            )
        if messy and rng.random() < 0.15:
            r = rng.random()
            if r < 0.3:
                lines.append(rng.choice(lines[1:]))  # a repeated line: seq not above the cursor
            elif r < 0.4:
                seq -= 3  # out of order from here on
            elif r < 0.7:
                bad = rng.choice(_bad_events(run, seq))
                lines.append(bad | {"host": host} if bad.get("host") == 0 else bad)
            else:
                lines.append(rng.choice(_tricky(run, seq)))
                seq += 50
    if messy:
        lines.extend(_tricky(run, seq))
        seq += 50
    add(_other(run, "run_end", seq, steps, rng) | {"host": host})
    out = []
    for x in lines:
        if isinstance(x, dict):
            x = json.dumps(x, separators=(",", ":"))
        out.append((x.encode() if isinstance(x, str) else x) + b"\n")
    return out


def build_runs(root: Path, seed: int, steps: int) -> dict[Path, list[bytes]]:
    """Every file's lines: several runs and hosts, a .gz copy overlapping a live file, an invalid run folder.

    (No host above 65535: ingest skips such a file up front, before either path sees it.)
    """
    files = {
        root / "alpha" / "events.0.jsonl": make_log(root, "alpha", 0, seed, steps, messy=True),
        root / "alpha" / "events.1.jsonl": make_log(root, "alpha", 1, seed + 1, steps, messy=False),
        root / "beta" / "events.0.jsonl": make_log(root, "beta", 0, seed + 2, steps // 2, messy=True),
        root / "beta" / f"events.{1000}.jsonl": [
            (
                json.dumps(provenance.signed(_other("beta", k, i, 3, random.Random(i)) | {"host": 1000}))
                + "\n"
            ).encode()
            for i, k in enumerate(["anomaly", "forecast", "decision"])
        ],
        root / "bad run!" / "events.0.jsonl": make_log(root, "bad run!", 0, seed + 3, 5, messy=False),
    }
    half = files[root / "alpha" / "events.1.jsonl"][: steps // 2]
    files[root / "alpha" / "events.1.jsonl.gz"] = (
        half  # an import copy: the live file's first half are duplicates
    )
    files[root / "beta" / "events.0.jsonl"][-1] = files[root / "beta" / "events.0.jsonl"][-1][
        :-1
    ]  # torn last line
    return files


def write_files(files: dict[Path, list[bytes]], upto: float = 1.0) -> None:
    for path, lines in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        data = b"".join(lines[: max(1, int(len(lines) * upto))])
        if path.suffix == ".gz":
            path.write_bytes(gzip.compress(data))
        else:
            path.write_bytes(data)
    old = time.time() - 3600
    for path in files:
        if path.parent.name == "beta":
            os.utime(path, (old, old))  # silent for an hour: its torn last line is recorded as truncated


def _ingest_both(tmp_path: Path, monkeypatch, runs: Path, rounds: int = 1):
    out = {}
    for name, enabled in (("old", False), ("fast", True)):
        monkeypatch.setattr(ingest_fast, "ENABLED", enabled)
        db = tmp_path / f"{name}.duckdb"
        msgs: list[str] = []
        reps = [ingest(runs, db, hooks=False, emit=msgs.append) for _ in range(rounds)]
        out[name] = (dump(db), reps, msgs)
    return out


def _assert_same(out) -> None:
    (old, old_reps, old_msgs), (new, new_reps, new_msgs) = out["old"], out["fast"]
    for table in TABLES:
        assert new[table] == old[table], f"{table} differs"
    for a, b in zip(old_reps, new_reps, strict=True):
        assert {f: getattr(a, f) for f in REPORT_FIELDS} == {f: getattr(b, f) for f in REPORT_FIELDS}
    assert new_msgs == old_msgs


# --------------------------------------------------------------- the tests


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize(
    "piece",
    [(4 << 20, 4 << 20), (1500, 1500), (3000, 700)],
    ids=["one-piece", "many-pieces", "metrics-pieces-smaller"],
)
def test_fast_path_store_equals_old_path(tmp_path, monkeypatch, seed, piece):
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", piece[0])
    monkeypatch.setattr(ingest_fast, "METRICS_PIECE_BYTES", piece[1])
    monkeypatch.setenv("OBSERVATORY_MAX_LINE_BYTES", "4000")  # the 5000-byte note is oversized
    runs = tmp_path / "runs"
    files = build_runs(runs, seed, steps=300)
    write_files(files)
    out = _ingest_both(tmp_path, monkeypatch, runs, rounds=2)  # the second round adds nothing, in both
    _assert_same(out)
    store_ = out["fast"][0]
    assert len(store_["metrics"]) > 1000 and store_["expert_load"] and store_["rejected_events"]
    assert {r[3] for r in store_["events"]} >= {"eval", "note", "mystery", "run_end"}
    assert out["fast"][1][0].duplicates > 0 and out["fast"][1][0].truncated == 1
    assert any(v == "nan" for r in store_["metrics"] for v in r)


def test_a_rule_changed_in_one_place_changes_both_paths(tmp_path, monkeypatch):
    """The bulk path takes its bounds from `ingest.rules`, as `check_line` does: tightened there, the
    lines past them are rejected with the rule's reason, the same lines by both paths."""
    monkeypatch.setitem(rules.STEP, "", rules.Bound("step", 0, 150, "step {value} is past the test's 150"))
    monkeypatch.setattr(rules, "COUNT", rules.Bound("data.routed", 0, 900, "counts must be below {above}"))
    runs = tmp_path / "runs"
    write_files(build_runs(runs, 0, steps=300))
    out = _ingest_both(tmp_path, monkeypatch, runs)
    _assert_same(out)
    reasons = [r[4] for r in out["fast"][0]["rejected_events"]]
    assert any(r.endswith("is past the test's 150") for r in reasons)
    assert "data.routed: counts must be below 901" in reasons
    assert max(r[1] for r in out["fast"][0]["metrics"] if r[1] is not None) <= 150
    assert out["fast"][1][0].fast_events > 0  # the bulk path certified the others


@pytest.mark.slow
@pytest.mark.parametrize("batch", [20_000, 1 << 20])
def test_incremental_and_batched_ingest_same_store(tmp_path, monkeypatch, batch):
    """Half of every file, then the rest, in small transactions and pieces: offsets, cursors and duplicates agree."""
    monkeypatch.setattr(ingest_mod, "BATCH_BYTES", batch)
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 3000)
    runs = tmp_path / "runs"
    files = build_runs(runs, 7, steps=200)
    reps: dict[str, list] = {"old": [], "fast": []}
    msgs: dict[str, list] = {"old": [], "fast": []}
    for upto in (0.5, 1.0):
        write_files(files, upto)  # both stores read the same files (sizes and mtimes are stored)
        for name, enabled in (("old", False), ("fast", True)):
            monkeypatch.setattr(ingest_fast, "ENABLED", enabled)
            reps[name].append(ingest(runs, tmp_path / f"{name}.duckdb", hooks=False, emit=msgs[name].append))
    _assert_same({name: (dump(tmp_path / f"{name}.duckdb"), reps[name], msgs[name]) for name in reps})


def test_clean_log_never_takes_the_old_path(tmp_path, monkeypatch):
    """Metrics, expert_load and other known kinds mixed: all decoded by msgspec, no piece judged line by line."""
    calls = []
    monkeypatch.setattr(ingest_fast, "plain_ingest_chunk", lambda *a: calls.append(a))
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 2000)
    runs = tmp_path / "runs"
    lines = make_log(runs, "a", 0, 3, 100, messy=False)
    write_lines(runs / "a" / "events.0.jsonl", lines)
    rep = ingest(runs, tmp_path / "s.duckdb", hooks=False, emit=None)
    n_other = sum(1 for x in lines if b'"kind":"metrics"' not in x and b'"kind":"expert_load"' not in x)
    assert calls == [] and rep.rejected == 0
    assert rep.events == len(lines) and rep.fast_events == len(lines) - n_other


def test_a_line_that_does_not_fit_is_judged_alone(tmp_path, monkeypatch):
    """A NaN string in one piece: that line alone goes to validate_event (`check_line`), no piece line by line."""
    pieces, checked = [], []
    real_check = ingest_fast.check_line
    monkeypatch.setattr(ingest_fast, "plain_ingest_chunk", lambda *a: pieces.append(a))
    monkeypatch.setattr(
        ingest_fast,
        "check_line",
        lambda b, lf, st, n, raw: (checked.append(raw), real_check(b, lf, st, n, raw)),
    )
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 1000)
    lines = [event("a", "metrics", {"loss": 1.0 + i}, i, i) for i in range(100)]
    lines[50]["data"]["loss"] = "nan"
    write_lines(tmp_path / "runs" / "a" / "events.0.jsonl", lines)
    rep = ingest(tmp_path / "runs", tmp_path / "s.duckdb", hooks=False, emit=None)
    assert rep.events == 100 and rep.rejected == 0
    assert pieces == [] and len(checked) == 1 and b'"nan"' in checked[0]
    with store.connect(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT count(*), count(*) FILTER (isnan(value)) FROM metrics").fetchall() == [
            (100, 1)
        ]


def test_a_piece_is_decoded_in_bulk_around_a_line_that_does_not_fit(tmp_path, monkeypatch):
    """Once the run's layout is known, a value of the wrong type fails its decode at one line (msgspec names
    it): the piece is decoded around it, and only that line is decoded alone."""
    alone = []
    real = ingest_fast._decode_line
    monkeypatch.setattr(ingest_fast, "_decode_line", lambda line: (alone.append(line), real(line))[1])
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 8000)
    monkeypatch.setattr(ingest_mod.fs, "SMALL_FILE", 0)  # read alone, in pieces: the run's layout
    lines = [event("a", "metrics", {"loss": 1.0 + i, "lr": 1e-3}, i, i) for i in range(300)]
    lines[150]["data"]["loss"] = "nan"
    lines[153]["step"] = "153"  # a string step: the envelope's type, same rule
    write_lines(tmp_path / "runs" / "a" / "events.0.jsonl", lines)
    rep = ingest(tmp_path / "runs", tmp_path / "s.duckdb", hooks=False, emit=None)
    assert rep.events == 299 and rep.rejected == 1  # the string step is rejected, as validate_event says
    assert len(alone) == 2 and b'"nan"' in alone[0] and b'"153"' in alone[1]
    with store.connect(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT count(*), count(*) FILTER (isnan(value)) FROM metrics").fetchall() == [
            (598, 1)
        ]


def test_a_piece_of_many_odd_lines_goes_to_the_old_path(tmp_path, monkeypatch):
    """Every other line with a NaN string: that piece is judged line by line; the store is the same."""
    seen = []
    real = ingest_fast.plain_ingest_chunk
    monkeypatch.setattr(
        ingest_fast,
        "plain_ingest_chunk",
        lambda b, lf, st, ch, m: (seen.append(ch.data), real(b, lf, st, ch, m)),
    )
    lines = [event("a", "metrics", {"loss": "nan" if i % 2 else 1.0 + i}, i, i) for i in range(100)]
    write_lines(tmp_path / "runs" / "a" / "events.0.jsonl", lines)
    rep = ingest(tmp_path / "runs", tmp_path / "s.duckdb", hooks=False, emit=None)
    assert rep.events == 100 and rep.rejected == 0 and len(seen) == 1
    with store.connect(tmp_path / "s.duckdb") as con:
        assert con.execute("SELECT count(*), count(*) FILTER (isnan(value)) FROM metrics").fetchall() == [
            (100, 50)
        ]


def test_changing_key_sets_give_the_same_store(tmp_path, monkeypatch):
    """Metric names that come and go, change order, repeat in a line, or are odd: a run's layout (its names as
    a Struct) is learnt, outgrown and relearnt, and the store equals the SQL path's, row by row."""
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 700)
    monkeypatch.setattr(ingest_mod.fs, "SMALL_FILE", 0)  # read alone, in pieces: the run's layout
    rng = random.Random(5)
    base = [f"train/m{i}" for i in range(6)]
    lines: list = []
    for i in range(400):
        names = base[: rng.randrange(1, 7)] if i % 9 else base + [f"late/n{i // 50}"]  # subsets, new names
        if i % 11 == 0:
            names = names[::-1]  # another order
        data = {n: rng.choice([rng.random(), rng.randrange(-5, 5), -0.0, 1e300, 5e-324]) for n in names}
        lines.append(event("lay", "metrics", data, i, i, t=1.7e9))
    raw = json.dumps(event("lay", "metrics", {"train/m0": 1.0}, 400, 400, t=1.7e9), separators=(",", ":"))
    extra = [
        raw.replace('"data":{', '"data":{"train/m1":5.0,"train/m1":6.0,'),  # a duplicate key: the last wins
        raw.replace('"seq":400', '"seq":401').replace('"train/m0":1.0', '"train/m0":1e999'),  # inf
        raw.replace('"seq":400', '"seq":402').replace('"train/m0"', '""'),  # an empty name
        raw.replace('"seq":400', '"seq":403').replace("1.0", "true"),  # a bool
        raw.replace('"seq":400', '"seq":404').replace('{"train/m0":1.0}', "{}"),
    ]
    lines += extra
    write_lines(tmp_path / "runs" / "lay" / "events.0.jsonl", lines)
    learnt: dict = {}  # run -> the names of the layouts it was given, in turn
    real_set = ingest_fast.Layouts.set
    monkeypatch.setattr(
        ingest_fast.Layouts,
        "set",
        lambda self, run, names: [learnt.setdefault(run, []).append(names), real_set(self, run, names)],
    )
    out = _ingest_both(tmp_path, monkeypatch, tmp_path / "runs")
    _assert_same(out)
    assert "late/n7" in learnt["lay"][-1]  # the layout grew with the names
    got = {(r[1], r[2]): r[3] for r in out["fast"][0]["metrics"]}
    assert got[(400, "train/m1")] == 6.0
    assert len(out["fast"][0]["rejected_events"]) == 2  # the empty name and the bool; 1e999 is inf, kept
    assert any(r[3] == math.inf for r in out["fast"][0]["metrics"])


@pytest.mark.slow
def test_each_tricky_line_alone(tmp_path, monkeypatch):
    """Every tricky line between good ones, one file each: lines that decode are judged one by one, not by piece."""
    monkeypatch.setenv("OBSERVATORY_MAX_LINE_BYTES", "4000")
    runs = tmp_path / "runs"
    for k, line in enumerate(_tricky("r", 10)):
        run = f"case{k:02d}"
        line = (
            line.replace(b'"run":"r"', f'"run":"{run}"'.encode())
            if isinstance(line, bytes)
            else line.replace('"run":"r"', f'"run":"{run}"')
        )
        good = [event(run, "metrics", {"x": 1.0}, i, i, t=1.7e9) for i in range(3)]
        after = [
            event(run, "expert_load", {"layer": 0, "routed": [1, 2], "dropped": [0, 1]}, 100 + i, 9, t=1.7e9)
            for i in range(3)
        ]
        write_lines(runs / run / "events.0.jsonl", [*good, line, *after])
    out = _ingest_both(tmp_path, monkeypatch, runs)
    _assert_same(out)
    assert out["fast"][1][0].rejected > 10


@pytest.mark.timeout(60)
def test_gz_larger_than_a_batch_is_read_once(tmp_path, monkeypatch):
    """A .gz bigger than the batch budget: read to its end in one go, not re-read from 0 in every batch."""
    monkeypatch.setattr(ingest_mod, "BATCH_BYTES", 5000)
    lines = [event("a", "metrics", {"x": float(i)}, i, i, t=1.7e9) for i in range(300)]
    path = tmp_path / "runs" / "a" / "events.0.jsonl.gz"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b"".join(json.dumps(x).encode() + b"\n" for x in lines)))
    rep = ingest(tmp_path / "runs", tmp_path / "s.duckdb", hooks=False, emit=None)
    assert (rep.events, rep.duplicates, rep.files) == (300, 0, 1)
    again = ingest(tmp_path / "runs", tmp_path / "s.duckdb", hooks=False, emit=None)
    assert (again.events, again.files) == (0, 0)


def test_pieces_of_metrics_lines_are_cut_smaller(monkeypatch):
    """`METRICS_PIECE_BYTES` pieces at first and after a piece without expert_load rows, `PIECE_BYTES`
    after one with them; the pieces are the chunk's lines, each whole, in order."""
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 4000)
    monkeypatch.setattr(ingest_fast, "METRICS_PIECE_BYTES", 1000)
    seq = iter(range(10**6))

    def lines(kind, n):
        data = (
            {"layer": 0, "routed": list(range(30)), "dropped": [0] * 30}
            if kind == "expert_load"
            else {f"loss/{i}": i * 0.5 for i in range(8)}
        )
        return [
            json.dumps(event("r", kind, data, next(seq), step=i, t=1.7e9), separators=(",", ":")).encode()
            for i in range(n)
        ]

    runs = [("metrics", 40), ("expert_load", 60), ("metrics", 40)]
    kinds = [k for k, n in runs for _ in range(n)]
    data = b"".join(x + b"\n" for k, n in runs for x in lines(k, n))
    lf = type("LogFile", (), {"run": "r", "host": 0})()
    pieces = list(ingest_fast._plans(data, lf, 1 << 20, ingest_fast.Layouts()))
    assert b"".join(p for _, p, _ in pieces) == data
    assert [hi for hi, _, _ in pieces] == list(itertools.accumulate(len(p) for _, p, _ in pieces))
    line_kinds = iter(kinds)
    has_expert = [("expert_load" in [next(line_kinds) for _ in range(p.count(b"\n"))]) for _, p, _ in pieces]
    assert [bool(len(plan.x_lens)) for _, _, plan in pieces] == has_expert
    assert len(pieces[0][1]) <= 1000
    for after_expert, (_, piece, _) in zip(has_expert, pieces[1:], strict=False):
        assert len(piece) <= (4000 if after_expert else 1000)
        if after_expert and piece is not pieces[-1][1]:
            assert len(piece) > 1000  # a full PIECE_BYTES piece, less a part of a line
    assert True in has_expert and has_expert[-1] is False  # both kinds of piece, metrics at the end again


def _small_runs(root: Path, seed: int, upto: float = 1.0) -> None:
    """A sweep of small logs (a few KB each), some messy: duplicates, bad and tricky lines, torn ends, a run
    with two hosts, a .gz copy, a file of non-UTF-8 bytes, a host the store cannot keep (a run id it cannot,
    too): each file alone and many decoded together must store the same."""
    files: dict[Path, list[bytes]] = {}
    for i in range(40):
        run = f"s{i:02d}"
        files[root / run / "events.0.jsonl"] = make_log(root, run, 0, seed + i, 3 + i % 9, messy=i % 4 == 0)
    files[root / "s01" / "events.1.jsonl"] = make_log(root, "s01", 1, seed + 99, 6, messy=False)
    files[root / "s02" / "events.0.jsonl.gz"] = files[root / "s02" / "events.0.jsonl"][:3]
    files[root / "s03" / "events.0.jsonl"][-1] = files[root / "s03" / "events.0.jsonl"][-1][:-1]  # torn
    files[root / "s05" / "events.0.jsonl"][2] = b"\xff\xfe not text\n"
    files[root / "s06" / "events.70000.jsonl"] = make_log(root, "s06", 70000, seed, 3, messy=False)
    files[root / "bad run!" / "events.0.jsonl"] = make_log(root, "bad run!", 0, seed, 3, messy=False)
    write_files(files, upto)


def _groups(monkeypatch) -> list[int]:
    """The sizes of the groups of files the fast path's `ingest_small` is given, as a list that fills."""
    grouped: list[int] = []
    real = ingest_fast.ingest_small
    monkeypatch.setattr(
        ingest_mod.fs,
        "ingest_small",
        lambda con, b, items, m: (
            (grouped.append(len(items)) if ingest_fast.ENABLED else None) or real(con, b, items, m)
        ),
    )
    return grouped


@pytest.mark.parametrize("seed", [0, 1])
def test_small_files_decoded_together_store_what_each_alone_stores(tmp_path, monkeypatch, seed):
    """A sweep's files go through `ingest_small` in groups (cut small here: several groups a batch), read
    half and then whole: the store, the reports and the messages are those of every line judged alone."""
    monkeypatch.setattr(ingest_fast, "METRICS_PIECE_BYTES", 6000)
    monkeypatch.setattr(ingest_mod.fs, "METRICS_PIECE_BYTES", 6000)
    monkeypatch.setenv("OBSERVATORY_MAX_LINE_BYTES", "4000")
    grouped = _groups(monkeypatch)
    # each batch's runs with new rows (for the rollups and detectors), as the batch's end sees them
    touched: dict[bool, list] = {False: [], True: []}
    update = ingest_mod.update_runs

    def seen(con, b):
        touched[ingest_fast.ENABLED].append({k: sorted(v) for k, v in b.touched.items()})
        return update(con, b)

    monkeypatch.setattr(ingest_mod, "update_runs", seen)
    runs = tmp_path / "runs"
    reps: dict[str, list] = {"old": [], "fast": []}
    msgs: dict[str, list] = {"old": [], "fast": []}
    for upto in (0.5, 1.0):
        _small_runs(runs, seed, upto)
        for name, enabled in (("old", False), ("fast", True)):
            monkeypatch.setattr(ingest_fast, "ENABLED", enabled)
            reps[name].append(ingest(runs, tmp_path / f"{name}.duckdb", hooks=False, emit=msgs[name].append))
    _assert_same({name: (dump(tmp_path / f"{name}.duckdb"), reps[name], msgs[name]) for name in reps})
    for fast_, old_ in zip(touched[True], touched[False], strict=True):  # the old path also counts an
        # expert_load event with empty lists (no rows)
        assert fast_["metrics"] == old_["metrics"] and set(fast_["expert_load"]) <= set(old_["expert_load"])
    assert len(touched[True][0]["metrics"]) >= 38 and touched[True][0]["expert_load"]
    fast = dump(tmp_path / "fast.duckdb")
    assert len({r[0] for r in fast["metrics"]}) >= 38 and fast["rejected_events"] and fast["expert_load"]
    assert reps["fast"][0].duplicates + reps["fast"][1].duplicates > 0
    assert len([n for n in grouped if n > 1]) >= 4  # both rounds, in several groups of many files


def test_small_files_accepted_at_once_keep_their_seq_checks_across_reads(tmp_path, monkeypatch):
    """A small file whose lines rise in seq is accepted at once (`_accept_small`); what it leaves in its
    state is what checking each line in order leaves: the next read rejects a seq below its last certified
    line (not only below its last judged one), and a file that starts with metrics records its first seq."""
    grouped = _groups(monkeypatch)

    def line(run, kind, data, seq, step):
        return json.dumps(event(run, kind, data, seq, step, t=1.7e9 + step), separators=(",", ":")) + "\n"

    def metrics(run, seq, step):
        return line(run, "metrics", {"loss": 1.0 + seq, "lr": 0.5}, seq, step)

    runs = tmp_path / "runs"
    logs = {}
    for i in range(6):
        run = f"r{i}"
        head = line(run, "run_start", {"name": run, "config": {"seed": i}}, 0, 0) if i % 2 else ""
        logs[run] = head + "".join(metrics(run, s, s) for s in range(1, 6))  # the last line certified
    logs["r6"] = "".join(metrics("r6", s, i) for i, s in enumerate((0, 1, 2, 2, 3)))  # seqs not rising
    for run, text in logs.items():
        (runs / run).mkdir(parents=True)
        (runs / run / "events.0.jsonl").write_text(text)
    out = {}
    for name, enabled in (("old", False), ("fast", True)):
        monkeypatch.setattr(ingest_fast, "ENABLED", enabled)
        out[name] = ([], [])
    for round_ in range(2):
        if round_:  # each file: a seq below its last metrics line (but above its run_start), then more
            for run in logs:
                with open(runs / run / "events.0.jsonl", "a") as f:
                    f.write(metrics(run, 3, 9) + metrics(run, 6, 10))
                    f.write(line(run, "run_end", {"status": "completed"}, 7, 10))
        for name, enabled in (("old", False), ("fast", True)):
            monkeypatch.setattr(ingest_fast, "ENABLED", enabled)
            out[name][0].append(
                ingest(runs, tmp_path / f"{name}.duckdb", hooks=False, emit=out[name][1].append)
            )
    _assert_same({name: (dump(tmp_path / f"{name}.duckdb"), *out[name]) for name in out})
    fast = dump(tmp_path / "fast.duckdb")
    assert len([r for r in fast["rejected_events"] if r[3] == "seq"]) == 8  # seq 3 in each file; r6's 2
    first = {r[0]: r[5] for r in fast["ingest_files"]}
    assert first == {f"r{i}/events.0.jsonl": 0 if i % 2 or i == 6 else 1 for i in range(7)}
    assert grouped and max(grouped) == 7  # the files decoded together, in both reads


def test_small_files_of_sweeps_with_other_names_share_a_layout_by_turns(tmp_path, monkeypatch):
    """Small runs decoded together use one layout (`SMALL`): learnt from a piece, outgrown by the next
    sweep's names (the piece decoded with dicts again, the layout learnt anew), none for a piece of more
    names than SMALL_LAYOUT_MAX, a bool in a line decoded around; the store is that of each line alone."""
    monkeypatch.setattr(ingest_fast, "METRICS_PIECE_BYTES", 6000)
    monkeypatch.setattr(ingest_mod.fs, "METRICS_PIECE_BYTES", 6000)
    learnt: list[int | None] = []  # the small layout's width after each learning (None: dicts)
    real = ingest_fast._learn

    def learn(layouts, run, decoded, old):
        real(layouts, run, decoded, old)
        if run == ingest_fast.SMALL:
            lay = layouts.by_run[run]
            learnt.append(None if lay is None else len(lay.names))

    monkeypatch.setattr(ingest_fast, "_learn", learn)
    rng = random.Random(3)
    sweeps = {
        "a": [f"train/m{i}" for i in range(6)],
        "b": ["eval/x", "eval/y", "train/m0"],
        "w": [f"wide/n{i}" for i in range(ingest_fast.SMALL_LAYOUT_MAX + 6)],
    }
    for i in range(36):
        sweep = "w" if i in (13, 14) else "a" if (i // 6) % 2 == 0 else "b"
        run = f"r{i:02d}-{sweep}"  # in folder order: the sweeps by turns
        lines = [event(run, "run_start", {"config": {"i": i}}, 0, 0, t=1.7e9)]
        for s in range(1, 12):
            names = sweeps[sweep][: rng.randrange(1, len(sweeps[sweep]) + 1)]
            lines.append(event(run, "metrics", {n: rng.random() for n in names}, s, s, t=1.7e9 + s))
        if i == 20:
            lines[5] = json.loads(json.dumps(lines[5]).replace(": 0.", ': true, "x": 0.', 1))
        write_lines(tmp_path / "runs" / run / "events.0.jsonl", lines)
    out = _ingest_both(tmp_path, monkeypatch, tmp_path / "runs")
    _assert_same(out)
    assert len(out["fast"][0]["rejected_events"]) == 1  # the bool
    widths = [w for w in learnt if w is not None]
    assert len(set(widths)) >= 2 and max(widths) <= ingest_fast.SMALL_LAYOUT_MAX  # learnt, outgrown
    assert any(
        a is None and b is not None for a, b in zip(learnt, learnt[1:], strict=False)
    )  # none, again one


def test_a_run_whose_names_outgrow_layout_max_decodes_into_dicts_from_then_on(tmp_path, monkeypatch):
    """A run's layout keeps every name it has seen; past LAYOUT_MAX of them the run decodes into dicts for
    good (its pieces are not decoded twice, into a layout and again), and the store is the SQL path's."""
    monkeypatch.setattr(ingest_fast, "PIECE_BYTES", 700)
    monkeypatch.setattr(ingest_fast, "METRICS_PIECE_BYTES", 700)
    monkeypatch.setattr(ingest_fast, "LAYOUT_MAX", 8)
    monkeypatch.setattr(ingest_mod.fs, "SMALL_FILE", 0)  # read alone, in pieces: the run's layout
    seen: list[int | None] = []
    real = ingest_fast._learn

    def learn(layouts, run, decoded, old):
        real(layouts, run, decoded, old)
        lay = layouts.by_run.get(run)
        seen.append(None if lay is None else len(lay.names))

    monkeypatch.setattr(ingest_fast, "_learn", learn)
    lines = [
        event("grow", "metrics", {f"m/{i // 10}": 1.0 + i, "loss": float(i)}, i, i, t=1.7e9)
        for i in range(120)
    ]
    write_lines(tmp_path / "runs" / "grow" / "events.0.jsonl", lines)
    _assert_same(_ingest_both(tmp_path, monkeypatch, tmp_path / "runs"))
    first_none = seen.index(None)
    assert first_none > 0 and max(w for w in seen[:first_none]) <= 8
    assert seen[first_none:] == [None]  # learnt no more after it: the rest decoded into dicts at once


def test_layouts_stay_bounded_when_metric_names_keep_changing():
    """A long `--follow` whose runs' metric names change: the ingester's `Layouts` keeps at most `KEEP`
    runs and name sets, and the layouts it dropped (their Struct classes) are freed, not kept by a module
    global; a run dropped learns its layout again and decodes as before."""
    import gc
    import weakref

    from observatory.ingest.layouts import Layouts

    layouts = Layouts()
    dropped = []
    for i in range(5 * Layouts.KEEP):
        layouts.set(f"run{i}", (f"m/{i}", "loss"))
        if i == 0:
            dropped.append(weakref.ref(layouts.of("run0")))
    assert len(layouts.by_run) == len(layouts.by_names) == Layouts.KEEP
    gc.collect()
    assert dropped[0]() is None  # the first layout (and its classes) is gone
    lay = layouts.of(f"run{5 * Layouts.KEEP - 1}")
    line = b'{"v":1,"run":"r","kind":"metrics","t":1.0,"host":0,"seq":0,"step":0,"data":{"loss":2.0}}\n'
    (ev,) = lay.decoder.decode_lines(line)
    assert ev.data.__class__.names == lay.names
    assert ingest_fast._as_dict(ev.data) == {"loss": 2.0}
