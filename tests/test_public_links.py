"""Symbolic links in the runs dir are never followed, either way (issue 55, class 1).

A log writer controls the runs dir: it may link `events.0.jsonl`, or its whole run folder, to any file the
observatory's user can read (the signing key, `alerts.yaml` and its webhook, `/etc/passwd`). Ingest must
store none of those bytes (not as events, not in `rejected_events`), and the observatory's own writers
(the findings file, any `observatory.init` log) must not append through a link.
"""

from __future__ import annotations

import os

import duckdb
import pytest
from conftest import event, write_lines

from observatory import findings
from observatory.events import OBSERVATORY_HOST
from observatory.logtail import LinkRefused
from observatory.pipeline import ingest
from observatory.writer import init

SECRET = "hunter2-SECRET-CONTENTS-of-a-private-file"


def _private(tmp_path, lines=None):
    """A file outside the runs dir: JSON event lines (what a forged link would want stored) or a secret."""
    p = tmp_path / "outside" / "private.txt"
    p.parent.mkdir(exist_ok=True)
    if lines is None:
        p.write_text(f"password={SECRET}\n{SECRET}\n")
    else:
        write_lines(p, lines)
    return p


def _every_text(db) -> str:
    """Every stored value of every table, as one string: where a leaked byte would show."""
    out = []
    with duckdb.connect(str(db), read_only=True) as con:
        for (t,) in con.execute("SELECT table_name FROM information_schema.tables").fetchall():
            out.append(repr(con.execute(f'SELECT * FROM "{t}"').fetchall()))
    return "\n".join(out)


def _good(runs, run="r"):
    write_lines(runs / run / "events.0.jsonl", [event(run, "run_start", {"config": {}}, 0)])


@pytest.mark.parametrize("name", ["events.2.jsonl", "events.1.jsonl.gz", f"events.{OBSERVATORY_HOST}.jsonl"])
def test_a_log_linked_to_a_file_outside_is_not_read(runs_dir, db_path, tmp_path, name):
    """Fails before the fix: the linked file's lines (events, or its secret as a rejected line) were stored."""
    _good(runs_dir)
    outside = _private(tmp_path)
    os.symlink(outside, runs_dir / "r" / name)
    messages = []
    ingest(runs_dir, db_path, emit=messages.append)
    ingest(runs_dir, db_path, emit=messages.append)  # a second pass: still nothing of it, said once
    text = _every_text(db_path)
    assert SECRET not in text and "password" not in text
    with duckdb.connect(str(db_path), read_only=True) as con:
        rows = con.execute("SELECT file, reason, raw FROM rejected_events").fetchall()
    assert [(f, raw) for f, _, raw in rows] == [(f"r/{name}", "")]
    assert "symbolic link" in rows[0][1]
    assert sum(f"r/{name}" in m for m in messages) == 1, messages


def test_a_linked_log_of_events_stores_none_of_them(runs_dir, db_path, tmp_path):
    """Valid event lines behind a link (another lab's log, a forged finding) are not ingested either."""
    _good(runs_dir)
    outside = _private(tmp_path, [event("r", "metrics", {"loss": 1.0}, 1, step=1)])
    os.symlink(outside, runs_dir / "r" / "events.3.jsonl")
    ingest(runs_dir, db_path, emit=None)
    with duckdb.connect(str(db_path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM metrics").fetchone() == (0,)


def test_a_run_folder_linked_elsewhere_is_not_read(runs_dir, db_path, tmp_path):
    """Fails before the fix: a run folder linked to a folder outside was ingested as a run."""
    _good(runs_dir)
    elsewhere = tmp_path / "elsewhere" / "x"
    write_lines(elsewhere / "events.0.jsonl", [event("evil", "run_start", {"config": {"k": SECRET}}, 0)])
    os.symlink(elsewhere, runs_dir / "evil")
    for _ in range(2):  # said once a pass
        messages = []
        ingest(runs_dir, db_path, emit=messages.append)
        assert sum("evil" in m and "symbolic link" in m for m in messages) == 1, messages
    assert SECRET not in _every_text(db_path)
    with duckdb.connect(str(db_path), read_only=True) as con:
        assert con.execute("SELECT run FROM runs").fetchall() == [("r",)]


def test_the_writer_does_not_append_through_a_link(runs_dir, tmp_path):
    """Fails before the fix: `init` appended its events to the file the log's link points to."""
    outside = _private(tmp_path)
    before = outside.read_bytes()
    (runs_dir / "r").mkdir()
    os.symlink(outside, runs_dir / "r" / "events.0.jsonl")
    with pytest.raises(LinkRefused):
        init(run_id="r", runs_dir=runs_dir, install_signal_handlers=False)
    assert outside.read_bytes() == before


def test_the_writer_does_not_write_into_a_linked_run_folder(runs_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, runs_dir / "r")
    with pytest.raises(LinkRefused):
        init(run_id="r", runs_dir=runs_dir, install_signal_handlers=False)
    assert list(elsewhere.iterdir()) == []


def test_findings_never_go_through_a_link_a_log_writer_made(runs_dir, tmp_path, monkeypatch):
    """A log writer links the run folder's `events.1000.jsonl` to alerts.yaml (or the key): the findings go to
    the findings folder, and the linked file is untouched (before the fix: appended to)."""
    alerts = tmp_path / "outside" / "alerts.yaml"
    alerts.parent.mkdir()
    alerts.write_text("rules: []\n")
    (runs_dir / "r").mkdir()
    os.symlink(alerts, runs_dir / "r" / findings.NAME)
    assert findings.write(runs_dir, "r", "note", [({"text": "x"}, None)]) == 1
    assert alerts.read_text() == "rules: []\n"
    assert findings.path(runs_dir, "r") == findings.root(runs_dir) / "r" / findings.NAME
    assert findings.pending(runs_dir, "r", "note")[0]["data"] == {"text": "x"}
    # the findings folder's run folder linked elsewhere: refused, not written through
    monkeypatch.setenv("OBSERVATORY_FINDINGS_IN_RUN_FOLDERS", "1")
    os.unlink(runs_dir / "r" / findings.NAME)
    os.rmdir(runs_dir / "r")
    os.symlink(alerts.parent, runs_dir / "r")
    with pytest.raises(LinkRefused):
        findings.write(runs_dir, "r", "note", [({"text": "y"}, None)])
    assert sorted(p.name for p in alerts.parent.iterdir()) == ["alerts.yaml"]
    assert findings.pending_many(runs_dir, ["r"], "note") == {"r": []}


def test_export_reads_no_log_through_a_link(runs_dir, tmp_path):
    """`export --format jsonl` reads the run's files as ingest does: a linked log or run folder is not read."""
    from observatory.interop.export import ExportError, export_run

    _good(runs_dir)
    other = tmp_path / "other" / "events.0.jsonl"
    write_lines(other, [event("r", "note", {"text": SECRET}, 5)])
    os.symlink(other, runs_dir / "r" / "events.4.jsonl")
    out = tmp_path / "r.jsonl"
    export_run("r", "jsonl", out, runs_dir=runs_dir, db=tmp_path / "none.duckdb")
    assert SECRET not in out.read_text() and out.read_text().count("\n") == 1
    os.symlink(other.parent, runs_dir / "evil")
    with pytest.raises(ExportError, match="symbolic link"):
        export_run("evil", "jsonl", tmp_path / "e.jsonl", runs_dir=runs_dir, db=tmp_path / "none.duckdb")
