"""One writer and one pending-scanner for the observatory's own events, with the contract's torn-line rule."""

from __future__ import annotations

import json
import time

import pytest
from conftest import event, write_lines

from observatory import findings
from observatory.events import OBSERVATORY_HOST


def test_write_then_pending_round_trip(runs_dir):
    n = findings.write(runs_dir, "r", "anomaly", [({"detector": "d", "severity": "warn", "message": "m"}, 7)])
    assert n == 1
    evs = findings.pending(runs_dir, "r", "anomaly")
    assert [(e["host"], e["step"], e["data"]["detector"]) for e in evs] == [(OBSERVATORY_HOST, 7, "d")]
    kinds = [json.loads(line)["kind"] for line in findings.path(runs_dir, "r").read_text().splitlines()]
    assert kinds == ["anomaly"], "the observatory never writes run_start/run_end into someone's run"
    assert findings.pending(runs_dir, "r", "decision") == []
    assert findings.pending(runs_dir, "absent", "anomaly") == []


def test_write_appends_in_the_callers_thread_numbered_after_the_files_tail(runs_dir, monkeypatch):
    """No writer `Run` (and its thread) per call: the lines are appended where `write` is called, each call's
    seqs after the last, a torn line a dead writer left ended first, a bad item after good ones raising."""
    import threading

    from observatory import writer

    def no_run(*a, **k):
        raise AssertionError("findings.write started a writer Run")

    monkeypatch.setattr(writer.Run, "__init__", no_run)
    before = threading.active_count()
    item = ({"detector": "d", "severity": "warn", "message": "m"}, 1)
    assert findings.write(runs_dir, "r", "anomaly", [item, item]) == 2
    with open(findings.path(runs_dir, "r"), "ab") as f:
        f.write(b'{"torn":')
    with pytest.raises(ValueError, match="step"):
        findings.write(runs_dir, "r", "anomaly", [item, ({"detector": "d"}, -1)])
    assert threading.active_count() == before
    lines = findings.path(runs_dir, "r").read_text().splitlines()
    assert lines[2] == '{"torn":'
    evs = [json.loads(line) for i, line in enumerate(lines) if i != 2]
    assert [e["seq"] for e in evs] == [0, 1, 2] and all(e["host"] == OBSERVATORY_HOST for e in evs)
    assert [e["step"] for e in findings.pending(runs_dir, "r", "anomaly")] == [1, 1, 1]


def test_pending_skips_a_torn_last_line_even_if_it_parses(runs_dir):
    p = findings.path(runs_dir, "r")
    good = event("r", "decision", {"id": "a"}, 0, host=OBSERVATORY_HOST)
    torn = event("r", "decision", {"id": "b"}, 1, host=OBSERVATORY_HOST)
    write_lines(p, [good, "{not json", {"v": 1, "kind": "decision", "data": "x"}])
    with open(p, "ab") as f:
        f.write(json.dumps(torn).encode())  # complete JSON, but no final newline: the writer is mid-line
    assert [e["data"]["id"] for e in findings.pending(runs_dir, "r", "decision")] == ["a"]


def _tree(root):
    """(path, size, mtime) of every file under `root`: what a runs dir holds, to the byte and the touch."""
    return sorted((str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*"))


def test_ingest_leaves_the_runs_dir_as_it_found_it_and_keeps_its_findings(tmp_path, monkeypatch):
    """A silent run's stalled_run finding is stored, and a rebuild finds it again, with nothing written into
    the runs dir (someone's data, maybe read-only): the findings go to the runs dir's findings folder."""
    from test_anomalies import clean, stored_anomalies, write_run

    from observatory.detect import scan as A
    from observatory.pipeline import ingest, rebuild

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    steps, loss, grad, _, _ = clean(200, seed=11)
    write_run(runs, "silent", steps, loss, grad, end=False)
    monkeypatch.setenv("OBSERVATORY_ANOMALY_STALL_S", "0.5")
    time.sleep(0.6)
    before = _tree(runs)
    ingest(runs, db, emit=None)
    A.after_ingest(db, runs, [])
    ingest(runs, db, emit=None)
    assert _tree(runs) == before, "ingest wrote into the runs dir"
    top = findings.root(runs)
    assert findings.path(runs, "silent") == top / "silent" / "events.1000.jsonl" and top.is_dir()
    assert not top.is_relative_to(runs)
    want = [("silent", "stalled_run", [199, 199])]
    assert [(a["run"], a["detector"], a["window"]) for a in stored_anomalies(db)] == want
    rebuild(runs, db, emit=None)  # the store is a function of the logs: the findings folder's too
    assert [(a["run"], a["detector"], a["window"]) for a in stored_anomalies(db)] == want


def test_findings_in_run_folders_when_asked_or_when_the_folder_has_them(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    findings.write(runs, "a", "note", [({"text": "x"}, None)])
    assert not (runs / "a").exists()
    legacy = runs / "b" / "events.1000.jsonl"  # an older runs dir: its run folders have their file
    write_lines(legacy, [event("b", "note", {"text": "old"}, 0, host=OBSERVATORY_HOST)])
    findings.write(runs, "b", "note", [({"text": "new"}, None)])
    assert [json.loads(x)["data"]["text"] for x in legacy.read_text().splitlines()] == ["old", "new"]
    monkeypatch.setenv("OBSERVATORY_FINDINGS_IN_RUN_FOLDERS", "1")
    findings.write(runs, "c", "note", [({"text": "y"}, None)])
    assert findings.root(runs) is None and (runs / "c" / "events.1000.jsonl").exists()


def test_pending_many_reads_what_pending_reads_run_by_run(tmp_path, monkeypatch):
    """One listing of the findings folder for many runs gives each run what `pending` gives it: a run with a
    file in the findings folder, one with its own (older) file in its run folder, one with none, one whose
    file holds a torn line and a forged finding; with `findings_in_run_folders` set too."""
    runs = tmp_path / "runs"
    good = {"detector": "d", "severity": "warn", "message": "m"}
    findings.write(runs, "in-top", "anomaly", [(good, 3)])
    own = runs / "own" / "events.1000.jsonl"  # an older runs dir: the run folder has its file
    write_lines(own, [event("own", "note", {"text": "old"}, 0, host=OBSERVATORY_HOST)])
    findings.write(runs, "own", "anomaly", [(good, 5)])
    findings.write(runs, "odd", "anomaly", [(good, 7)])
    with open(findings.path(runs, "odd"), "ab") as f:
        forged = {**event("odd", "anomaly", good, 9, 8), "host": OBSERVATORY_HOST}  # not signed by us
        f.write((json.dumps(forged) + "\n" + json.dumps(forged)).encode())  # the last one torn
    names = ["in-top", "own", "none", "odd"]
    for in_folders in ("0", "1"):
        monkeypatch.setenv("OBSERVATORY_FINDINGS_IN_RUN_FOLDERS", in_folders)
        many = findings.pending_many(runs, names, "anomaly")
        assert many == {run: findings.pending(runs, run, "anomaly") for run in names}
        steps = {run: [e["step"] for e in evs] for run, evs in many.items()}
        assert steps == (
            {"in-top": [3], "own": [5], "none": [], "odd": [7]}
            if in_folders == "0"
            else {"in-top": [], "own": [5], "none": [], "odd": []}
        )


def test_a_findings_file_continues_the_numbering_of_the_run_folders_gz_copy(tmp_path):
    """Seqs ingest has from a sibling file of the same (run, host) are duplicates: a findings-folder file
    numbered from 0 beside a run folder's events.1000.jsonl.gz would lose its events."""
    import gzip

    from observatory.pipeline import ingest
    from observatory.store import connect

    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    write_lines(runs / "r" / "events.0.jsonl", [event("r", "run_start", {"config": {}}, 0)])
    old = [event("r", "note", {"text": f"old {i}"}, i, host=OBSERVATORY_HOST) for i in range(3)]
    with gzip.open(runs / "r" / "events.1000.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in old)
    findings.write(runs, "r", "note", [({"text": "new"}, None)])
    assert json.loads(findings.path(runs, "r").read_text())["seq"] == 3
    ingest(runs, db, hooks=False, emit=None)
    with connect(db) as con:
        texts = con.execute("SELECT data->>'text' FROM events WHERE kind = 'note' ORDER BY seq").fetchall()
    assert [t for (t,) in texts] == ["old 0", "old 1", "old 2", "new"]


def test_an_unreadable_key_file_loses_no_finding_and_ingest_says_why(runs_dir, tmp_path, monkeypatch):
    """The observatory's writer cannot read its key (a folder where the file should be): the finding is still
    written, unsigned, and ingest rejects it naming the key file, without stopping."""
    from observatory.pipeline import ingest

    bad = tmp_path / "key-is-a-folder"
    bad.mkdir()
    monkeypatch.setenv("OBSERVATORY_KEY_FILE", str(bad))
    n = findings.write(runs_dir, "r", "anomaly", [({"detector": "d", "severity": "warn", "message": "m"}, 7)])
    assert n == 1 and '"anomaly"' in findings.path(runs_dir, "r").read_text()
    rep = ingest(runs_dir, tmp_path / "s.duckdb", emit=None)
    assert rep.rejected == 1 and any("key_file" in m for m in rep.messages)
