"""The run folders' kept listings (`observatory.ingest.folders`): a folder whose mtime has not changed since it
was listed is not listed again, and every change of its names (a new host's log, a removed folder) is still
seen. Real event logs, real folders, real `observatory ingest` calls into a real DuckDB file."""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest

from observatory.ingest import folders
from observatory.ingest.folders import SETTLED_S, keeps_mtimes
from observatory.pipeline import ingest
from observatory.store import connect


def _log(path, run: str, host: int, steps: range, seq0: int = 0) -> None:
    with open(path, "a") as f:
        for k, s in enumerate(steps):
            kind, data = ("run_start", {"config": {"lr": 1e-3}}) if s == 0 else ("metrics", {"loss": 4.0 / s})
            line = {
                "v": 1,
                "run": run,
                "kind": kind,
                "step": s,
                "t": time.time(),
                "host": host,
                "seq": seq0 + k,
            }
            f.write(json.dumps({**line, "data": data}) + "\n")


def _age(folder) -> None:
    """Set a folder's mtime back a minute, as if it had been written long before this pass."""
    old = time.time_ns() - 60 * 1_000_000_000
    os.utime(folder, ns=(old, old))


@pytest.fixture()
def runs(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_FINDINGS_DIR", str(tmp_path / "findings"))
    monkeypatch.setattr(folders, "KEEP_FROM", 0)  # listings kept for three folders too (else from 1,000 on)
    assert keeps_mtimes(tmp_path), f"{tmp_path} is not on a file system of KEEPS_MTIMES: these tests need one"
    root = tmp_path / "runs"
    for run in ("a", "b", "c"):
        (root / run).mkdir(parents=True)
        _log(root / run / "events.0.jsonl", run, 0, range(0, 5))
    return root


@pytest.fixture()
def listed(monkeypatch):
    """The folders `os.scandir` is called on, from here on."""
    seen: list[str] = []
    scandir = os.scandir

    def spy(path="."):
        if not isinstance(path, int):  # (a folder's descriptor: shutil.rmtree's walk)
            seen.append(os.path.basename(os.fspath(path)))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", spy)
    return seen


def _kept(db) -> dict[str, tuple[int, str]]:
    with connect(db) as con:
        return {
            f: (m, n)
            for f, m, n in con.execute("SELECT folder, mtime_ns, names FROM ingest_folders").fetchall()
        }


def _steps(db, run: str, host: int | None = None) -> int:
    with connect(db) as con:
        where = "" if host is None else f" AND host = {host}"
        return con.execute(f"SELECT count(*) FROM metrics WHERE run = ?{where}", [run]).fetchall()[0][0]


def test_an_unchanged_folder_is_not_listed_again_but_its_logs_growth_is_read(runs, tmp_path, listed):
    db = tmp_path / "store.duckdb"
    for run in ("a", "b", "c"):
        _age(runs / run)
    ingest(runs, db, emit=None)
    assert set(_kept(db)) == {"a", "b", "c"}
    assert _kept(db)["a"][1] == "events.0.jsonl"
    assert {"a", "b", "c"} <= set(listed)

    listed.clear()
    _log(
        runs / "b" / "events.0.jsonl", "b", 0, range(5, 9), seq0=5
    )  # grows: the folder's names do not change
    report = ingest(runs, db, emit=None)
    assert not {"a", "b", "c"} & set(listed), listed  # each folder had one stat, no listing
    assert report.events == 4 and _steps(db, "b") == 8


def test_a_new_host_log_in_a_kept_folder_is_read(runs, tmp_path, listed):
    db = tmp_path / "store.duckdb"
    for run in ("a", "b", "c"):
        _age(runs / run)
    ingest(runs, db, emit=None)
    listed.clear()
    _log(runs / "a" / "events.1.jsonl", "a", 1, range(0, 7))  # a new name: the folder's mtime moves
    ingest(runs, db, emit=None)
    assert "a" in listed and "b" not in listed
    assert _steps(db, "a", host=1) == 6
    # listed again just now, so its new listing is not kept yet (its mtime is not SETTLED_S old): the old one
    # is not used either, since its mtime no longer matches
    assert _kept(db)["a"][1] == "events.0.jsonl"
    listed.clear()
    ingest(runs, db, emit=None)
    assert "a" in listed and "b" not in listed


def test_a_folder_changed_within_settled_s_is_not_kept(runs, tmp_path):
    db = tmp_path / "store.duckdb"
    _age(runs / "a")
    recent = time.time_ns() - (SETTLED_S * 1_000_000_000) // 4
    os.utime(runs / "b", ns=(recent, recent))
    ingest(runs, db, emit=None)
    kept = _kept(db)
    assert "a" in kept and "b" not in kept and "c" not in kept  # c: made by the fixture, just now


def test_a_removed_folder_is_forgotten_and_one_made_again_is_listed(runs, tmp_path, listed):
    db = tmp_path / "store.duckdb"
    for run in ("a", "b", "c"):
        _age(runs / run)
    ingest(runs, db, emit=None)
    shutil.rmtree(runs / "c")
    ingest(runs, db, emit=None)
    assert set(_kept(db)) == {"a", "b"}

    (runs / "c").mkdir()
    _log(runs / "c" / "events.2.jsonl", "c", 2, range(0, 4))
    _age(runs / "c")
    listed.clear()
    ingest(runs, db, emit=None)
    assert "c" in listed and _steps(db, "c", host=2) == 3
    assert _kept(db)["c"][1] == "events.2.jsonl"


def test_a_bad_host_in_a_kept_folder_is_still_reported_on_every_call(runs, tmp_path):
    db = tmp_path / "store.duckdb"
    _log(runs / "a" / "events.70000.jsonl", "a", 0, range(0, 3))
    _age(runs / "a")
    for _ in range(2):
        said: list[str] = []
        ingest(runs, db, emit=said.append)
        assert any("events.70000.jsonl" in m and "above 65535" in m for m in said), said
    assert "events.70000.jsonl" in _kept(db)["a"][1]


def test_under_keep_from_folders_every_folder_is_listed_and_nothing_kept(runs, tmp_path, listed, monkeypatch):
    monkeypatch.setattr(folders, "KEEP_FROM", 4)
    db = tmp_path / "store.duckdb"
    for run in ("a", "b", "c"):
        _age(runs / run)
    for _ in range(2):
        listed.clear()
        ingest(runs, db, emit=None)
        assert {"a", "b", "c"} <= set(listed)
    assert _kept(db) == {}
    (runs / "d").mkdir()
    _log(runs / "d" / "events.0.jsonl", "d", 0, range(0, 3))
    _age(runs / "d")
    ingest(runs, db, emit=None)  # four folders: from now on their listings are kept
    assert set(_kept(db)) == {"a", "b", "c", "d"}


def test_only_file_systems_that_keep_folder_mtimes_are_trusted(tmp_path):
    assert keeps_mtimes(tmp_path)
    assert not keeps_mtimes("/proc/self")  # procfs: its folders' mtimes say nothing of their names
    assert not keeps_mtimes("/sys/kernel")


def test_a_kept_name_that_is_no_event_log_is_passed_over(runs, tmp_path):
    db = tmp_path / "store.duckdb"
    for run in ("a", "b", "c"):
        _age(runs / run)
    ingest(runs, db, emit=None)
    with connect(db, read_only=False) as con:  # a store whose listing of "a" names what no scan would keep
        con.execute(
            "UPDATE ingest_folders SET names = names || ' ../../etc/passwd notes.txt' WHERE folder = 'a'"
        )
    _log(runs / "a" / "events.0.jsonl", "a", 0, range(5, 7), seq0=5)
    report = ingest(runs, db, emit=None)
    assert report.events == 2 and _steps(db, "a") == 6
