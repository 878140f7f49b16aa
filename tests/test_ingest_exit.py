"""`observatory ingest`'s exit status and messages tell the truth: a bad line is quarantined and the command
succeeds; it fails only when data could not be stored, and then says exactly what was not."""

from __future__ import annotations

import duckdb
from click.testing import CliRunner
from conftest import event, write_lines

from observatory.cli import main


def _ingest(runs_dir, db_path):
    return CliRunner().invoke(main, ["ingest", "--runs-dir", str(runs_dir), "--db", str(db_path)])


def _count(db_path, sql: str) -> int:
    with duckdb.connect(str(db_path), read_only=True) as con:
        return con.execute(sql).fetchall()[0][0]


def test_a_line_of_another_run_is_quarantined_and_ingest_succeeds(runs_dir, db_path):
    """One line names another run than its folder's: it is rejected like any bad line (stored in
    rejected_events, said as file:line), the folder's other lines are stored, and the exit status is 0
    with no advice to rename a folder that is fine."""
    path = write_lines(
        runs_dir / "a" / "events.0.jsonl",
        [event("a", "metrics", {"x": 1.0}, 0, 0), event("b", "metrics", {"x": 2.0}, 1, 1)]
        + [event("a", "metrics", {"x": 3.0}, 2, 2)],
    )
    res = _ingest(runs_dir, db_path)
    assert res.exit_code == 0, res.output
    assert f"{path}:2: run: run id 'b' does not match its folder 'a'" in res.output
    assert "1 rejected" in res.output and "rename" not in res.output and "not in the store" not in res.output
    assert _count(db_path, "SELECT count(*) FROM metrics WHERE run = 'a'") == 2
    assert _count(db_path, "SELECT count(*) FROM rejected_events WHERE field = 'run'") == 1


def test_a_folder_whose_name_is_no_run_id_fails_and_names_it(runs_dir, db_path):
    """No line of a folder named `x+1` can be stored (its name is no run id): exit 1, naming the folder."""
    write_lines(runs_dir / "ok" / "events.0.jsonl", [event("ok", "metrics", {"x": 1.0}, 0, 0)])
    write_lines(runs_dir / "x+1" / "events.0.jsonl", [event("x+1", "metrics", {"x": 1.0}, 0, 0)])
    res = _ingest(runs_dir, db_path)
    assert res.exit_code == 1
    assert "not stored: the lines of 1 run folder(s) whose name is not a run id" in res.output
    assert "x+1" in res.output
    assert _count(db_path, "SELECT count(*) FROM metrics") == 1


def test_a_file_skipped_whole_fails_and_names_it(runs_dir, db_path):
    """A file the store cannot keep (a host past 65535 in its name) is skipped: exit 1, and the summary
    names it."""
    write_lines(runs_dir / "ok" / "events.0.jsonl", [event("ok", "metrics", {"x": 1.0}, 0, 0)])
    write_lines(runs_dir / "ok" / "events.70000.jsonl", [event("ok", "metrics", {"x": 1.0}, 0, 0)])
    res = _ingest(runs_dir, db_path)
    assert res.exit_code == 1
    assert "1 file(s) not ingested" in res.output and "ok/events.70000.jsonl" in res.output
    assert "not stored: 1 file(s) not ingested" in res.output
