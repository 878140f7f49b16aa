"""One writer and one pending-scanner for the observatory's own events, with the contract's torn-line rule."""

from __future__ import annotations

import json

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


def test_pending_skips_a_torn_last_line_even_if_it_parses(runs_dir):
    p = findings.path(runs_dir, "r")
    good = event("r", "decision", {"id": "a"}, 0, host=OBSERVATORY_HOST)
    torn = event("r", "decision", {"id": "b"}, 1, host=OBSERVATORY_HOST)
    write_lines(p, [good, "{not json", {"v": 1, "kind": "decision", "data": "x"}])
    with open(p, "ab") as f:
        f.write(json.dumps(torn).encode())  # complete JSON, but no final newline: the writer is mid-line
    assert [e["data"]["id"] for e in findings.pending(runs_dir, "r", "decision")] == ["a"]


def test_an_unreadable_key_file_loses_no_finding_and_ingest_says_why(runs_dir, tmp_path, monkeypatch):
    """The observatory's writer cannot read its key (a folder where the file should be): the finding is still
    written, unsigned, and ingest rejects it naming the key file, without stopping."""
    from observatory.ingest import ingest

    bad = tmp_path / "key-is-a-folder"
    bad.mkdir()
    monkeypatch.setenv("OBSERVATORY_KEY_FILE", str(bad))
    n = findings.write(runs_dir, "r", "anomaly", [({"detector": "d", "severity": "warn", "message": "m"}, 7)])
    assert n == 1 and '"anomaly"' in findings.path(runs_dir, "r").read_text()
    rep = ingest(runs_dir, tmp_path / "s.duckdb", emit=None)
    assert rep.rejected == 1 and any("key_file" in m for m in rep.messages)
