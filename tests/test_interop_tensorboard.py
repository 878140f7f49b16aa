"""TensorBoard import: files written by a real writer (tensorboardX.SummaryWriter)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

tbx = pytest.importorskip("tensorboardX")

from observatory.cli import main as cli  # noqa: E402
from observatory.interop.tensorboard_import import (  # noqa: E402
    convert_tensorboard_dir,
    find_tfevents_dirs,
    import_tensorboard,
)


def _write_run(folder, steps, restart_at=None):
    """Log scalars (and things that are not scalars) with tensorboardX; return what was logged.

    TensorBoard stores scalars as float32, so the expected value is the float32 of what was
    logged. `restart_at` closes the writer and opens a second file, as a resumed job does.
    """
    logged: dict[int, dict[str, float]] = {}
    w = tbx.SummaryWriter(str(folder))
    for s in steps:
        if restart_at is not None and s == restart_at:
            w.close()
            w = tbx.SummaryWriter(str(folder), filename_suffix=".resumed")
        loss = 3.0 / (1 + s) if s != 30 else float("nan")
        w.add_scalar("train/loss", loss, s)
        w.add_scalar("opt/lr", 1e-4 * (s % 7), s)
        logged[s] = {"train/loss": float(np.float32(loss)), "opt/lr": float(np.float32(1e-4 * (s % 7)))}
        if s % 20 == 0:
            w.add_histogram("weights", np.arange(10), s)
            w.add_text("note", f"step {s}", s)
    w.close()
    return logged


def _metrics(log):
    return {
        ev["step"]: {k: float(v) for k, v in ev["data"].items()}
        for ev in log.events
        if ev["kind"] == "metrics"
    }


def _same(a, b):
    return a.keys() == b.keys() and all(
        a[s].keys() == b[s].keys()
        and all(x == b[s][k] or (math.isnan(x) and math.isnan(b[s][k])) for k, x in a[s].items())
        for s in a
    )


@pytest.fixture(scope="module")
def tb_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("tb")
    logged = {
        "tb-exp-a": _write_run(root / "exp" / "a", range(0, 60, 2)),
        "tb-exp-b": _write_run(root / "exp" / "b", range(0, 50), restart_at=25),
    }
    return root, logged


def test_one_run_per_folder_with_ids_from_the_path(tb_root):
    root, logged = tb_root
    found = find_tfevents_dirs([root])
    assert [run for _, run in found] == ["tb-exp-a", "tb-exp-b"]
    assert find_tfevents_dirs([root / "exp" / "a"]) == [(root / "exp" / "a", "tb-a")]


def test_scalars_round_trip_exactly_and_other_plugins_are_counted(tb_root):
    root, logged = tb_root
    for folder, run in find_tfevents_dirs([root]):
        log, res = convert_tensorboard_dir(folder, run)
        assert res.error is None and not res.problems
        assert _same(_metrics(log), logged[run]), run
        n = len([s for s in logged[run] if s % 20 == 0])
        assert res.skipped == {"histograms": n, "text": n}
        assert log.events[0]["kind"] == "run_start" and log.events[-1]["kind"] == "run_end"
        assert log.events[-1]["data"] == {
            "status": "completed",
            "final_step": max(logged[run]),
            "status_inferred": True,
        }
        ts = [ev["t"] for ev in log.events]
        assert ts == sorted(ts)


def test_resumed_run_in_two_files_is_one_run(tb_root):
    root, logged = tb_root
    folder = root / "exp" / "b"
    assert len(list(folder.glob("*tfevents*"))) == 2
    log, res = convert_tensorboard_dir(folder, "tb-exp-b")
    assert sorted(_metrics(log)) == list(range(50))


def test_status_none_leaves_the_run_without_an_end(tb_root):
    root, _ = tb_root
    log, res = convert_tensorboard_dir(root / "exp" / "a", "tb-exp-a", status=None)
    assert res.status == "crashed" and all(ev["kind"] != "run_end" for ev in log.events)


def test_truncated_file_imports_what_is_whole(tmp_path):
    logged = _write_run(tmp_path / "t", range(100))
    f = next((tmp_path / "t").glob("*tfevents*"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size * 2 // 3 + 5])
    log, res = convert_tensorboard_dir(tmp_path / "t", "tb-t")
    assert res.truncated and not res.problems
    got = _metrics(log)
    assert 0 < len(got) < 100
    assert _same(got, {s: v for s, v in logged.items() if s in got})
    assert sorted(got) == list(range(len(got)))  # a prefix: nothing after the cut invented


def test_cli_import_is_idempotent_and_rejects_empty_paths(tb_root, tmp_path):
    root, _ = tb_root
    runs = tmp_path / "runs"
    r1 = CliRunner().invoke(cli, ["import", "tensorboard", str(root), "--runs-dir", str(runs), "--no-ingest"])
    assert r1.exit_code == 0, r1.output
    assert "tb-exp-a" in r1.output and "file new" in r1.output and "skipped" in r1.output
    before = {p: p.read_bytes() for p in runs.rglob("events.0.jsonl")}
    assert len(before) == 2
    r2 = CliRunner().invoke(cli, ["import", "tensorboard", str(root), "--runs-dir", str(runs), "--no-ingest"])
    assert r2.exit_code == 0 and r2.output.count("file unchanged") == 2
    assert {p: p.read_bytes() for p in runs.rglob("events.0.jsonl")} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    r3 = CliRunner().invoke(cli, ["import", "tensorboard", str(empty), "--runs-dir", str(runs)])
    assert r3.exit_code == 2 and "no tfevents files" in r3.output
    assert import_tensorboard([empty], runs, ingest=False) == []


def test_cli_import_lands_in_the_store(tb_root, tmp_path):
    from observatory.store import connect

    root, logged = tb_root
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    r = CliRunner().invoke(
        cli, ["import", "tensorboard", str(root), "--runs-dir", str(runs), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    assert "2 run(s) imported from 2 source(s), 0 failed" in r.output and "store" in r.output
    with connect(db) as con:
        status = dict(con.execute("SELECT run, status FROM runs").fetchall())
        rows = con.execute("SELECT step, name, value FROM metrics WHERE run = 'tb-exp-a'").fetchall()
    assert status == {"tb-exp-a": "completed", "tb-exp-b": "completed"}
    got: dict = {}
    for step, name, value in rows:
        got.setdefault(step, {})[name] = value
    assert _same(got, logged["tb-exp-a"])


def test_status_none_is_crashed_at_the_last_event_from_the_logs_alone(tb_root, tmp_path):
    """`--status none`: no run_end, a final `failure` instead; the import's store and a new one say crashed."""
    from observatory.store import connect

    root, _ = tb_root
    runs = tmp_path / "runs"
    stores = [tmp_path / "o.duckdb", tmp_path / "fresh.duckdb"]
    r = CliRunner().invoke(
        cli,
        [
            "import",
            "tensorboard",
            str(root),
            "--status",
            "none",
            "--runs-dir",
            str(runs),
            "--db",
            str(stores[0]),
        ],
    )
    assert r.exit_code == 0 and "status crashed" in r.output, r.output
    r = CliRunner().invoke(cli, ["ingest", "--runs-dir", str(runs), "--db", str(stores[1]), "-q"])
    assert r.exit_code == 0, r.output
    want = []
    for run in ("tb-exp-a", "tb-exp-b"):
        log = [json.loads(x) for x in (runs / run / "events.0.jsonl").read_text().splitlines()]
        assert "run_end" not in [e["kind"] for e in log] and log[-1]["data"]["final"] is True
        want.append((run, "crashed", max(e["t"] for e in log if e["kind"] == "metrics")))
    for db in stores:
        with connect(db) as con:
            assert con.execute("SELECT run, status, end_time FROM runs ORDER BY run").fetchall() == want, db


def test_corrupt_record_is_reported_with_its_offset(tmp_path):
    from observatory.interop.tensorboard_import import _record_offsets

    logged = _write_run(tmp_path / "c", range(100))
    f = next((tmp_path / "c").glob("*tfevents*"))
    offsets, torn = _record_offsets(f)
    assert not torn and len(offsets) > 150  # file_version + 2 scalars per step + histograms, text
    bad = offsets[len(offsets) // 2]
    data = bytearray(f.read_bytes())
    data[bad + 14] ^= 0xFF  # a byte of the record's data: its CRC no longer matches
    f.write_bytes(bytes(data))
    log, res = convert_tensorboard_dir(tmp_path / "c", "tb-c")
    assert (
        len(res.problems) == 1
        and f"byte {bad}: record {len(offsets) // 2 + 1} of {len(offsets)}" in res.problems[0]
    )
    got = _metrics(log)
    last = max(got)  # the step the bad record belonged to may be partly read
    assert 0 < len(got) < 100 and sorted(got) == list(range(last + 1))
    assert _same({s: v for s, v in got.items() if s < last}, {s: v for s, v in logged.items() if s < last})
    assert all(logged[last][k] == v for k, v in got[last].items())
