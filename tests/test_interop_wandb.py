"""W&B import: real offline runs made by the real `wandb` package, clean and damaged copies."""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path

import pytest
from click.testing import CliRunner
from wandb_fixtures import run_wandb_offline

pytest.importorskip("wandb")

from observatory.cli import main as cli  # noqa: E402
from observatory.interop.wandb_import import convert_wandb_file, find_wandb_files, import_wandb  # noqa: E402
from observatory.interop.wandb_reader import BLOCK, FILE_HEADER, WandbLogReader, parse_record  # noqa: E402
from observatory.store import connect  # noqa: E402

# Runs a real W&B offline run in a child process (wandb starts its own service; keep it out
# of the test process) and dumps exactly what was logged, to compare against.
MAKE_RUNS = r"""
import json, math, sys
import numpy as np
import wandb

out = sys.argv[1]
run = wandb.init(mode="offline", dir=out, project="obs-test", id="good1", name="good run", tags=["a", "b"],
                 config={"lr": 3e-4, "model": {"d_model": 64, "n_experts": 8}, "wandb_api_key": "sekrit"})
logged, media = {}, 0
for s in range(0, 800, 2):
    row = {"train/loss": 3.0 / (1 + s) + 0.001 * (s % 7), "opt": {"lr": 1e-4 * (s % 11)},
           "moe/drop_fraction": (s % 13) / 100, "count": s // 2}
    if s == 100:
        row["train/loss"] = float("nan")
    if s == 102:
        row["train/loss"] = float("inf")
    flat = {"train/loss": row["train/loss"], "opt/lr": row["opt"]["lr"],
            "moe/drop_fraction": row["moe/drop_fraction"], "count": float(row["count"])}
    if s % 200 == 0:
        row["hist"] = wandb.Histogram(np.arange(10))
        row["img"] = wandb.Image(np.zeros((4, 4, 3), dtype=np.uint8))
        media += 1
    wandb.log(row, step=s)
    logged[s] = {k: (repr(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in flat.items()}
run.summary["best_loss"] = 0.01
run.finish()

bad = wandb.init(mode="offline", dir=out, project="obs-test", id="bad1", config={"lr": 1.0}, reinit="create_new")
for s in range(10):
    bad.log({"train/loss": 1.0 + s}, step=s)
bad.finish(exit_code=3)

# a resumed run: two sessions (two offline-run folders, two files) with one run id
for session, steps in enumerate((range(0, 10), range(10, 20))):
    r = wandb.init(mode="offline", dir=out, project="obs-test", id="res1", resume="allow",
                   config={"session": session}, reinit="create_new")
    for s in steps:
        r.log({"train/loss": 10.0 - s}, step=s)
    r.finish(exit_code=1 if session == 0 else 0)
json.dump({"logged": logged, "media": media}, open(out + "/logged.json", "w"))
"""


@pytest.fixture(scope="module")
def wandb_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("wandb")
    run_wandb_offline(MAKE_RUNS, out)
    info = json.loads((out / "logged.json").read_text())
    files = {f.name: f for f in find_wandb_files([out]) if f.name != "run-res1.wandb"}
    logged = {int(s): {k: float(v) for k, v in row.items()} for s, row in info["logged"].items()}
    return {
        "dir": out,
        "good": files["run-good1.wandb"],
        "bad": files["run-bad1.wandb"],
        "logged": logged,
        "media": info["media"],
    }


def _metrics(log) -> dict[int, dict[str, float]]:
    out = {}
    for ev in log.events:
        if ev["kind"] == "metrics":
            out[ev["step"]] = {k: float(v) for k, v in ev["data"].items()}
    return out


def _same(a: dict, b: dict) -> bool:
    """Equal, NaN equal to NaN (a NaN loss is data, not noise)."""
    if a.keys() != b.keys():
        return False
    for k in a:
        if a[k].keys() != b[k].keys():
            return False
        for name, x in a[k].items():
            y = b[k][name]
            if not (x == y or (math.isnan(x) and math.isnan(y))):
                return False
    return True


def _spans(path: Path) -> list[tuple[int, int, bytes]]:
    """(start, end, payload) of every logical record, from a clean read."""
    reader = WandbLogReader(path)
    out = []
    for start, payload in reader:
        out.append((start, reader.bytes_read, payload))
    assert not reader.problems and not reader.truncated
    return out


def _history_step(payload: bytes) -> int | None:
    rec = parse_record(payload)
    if rec.WhichOneof("record_type") != "history":
        return None
    for item in rec.history.item:
        if list(item.nested_key or [item.key]) == ["_step"]:
            return int(json.loads(item.value_json))
    return rec.history.step.num


# ------------------------------------------------------------------ clean runs


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_import_gives_exactly_the_logged_values_at_the_logged_steps(wandb_runs):
    log, res = convert_wandb_file(wandb_runs["good"])
    assert res.error is None and not res.problems and not res.truncated
    assert _same(_metrics(log), wandb_runs["logged"])
    media = {k: n for k, n in res.skipped.items() if "system stat" not in k}  # W&B's per-core CPU, threads...
    assert media == {"histogram": wandb_runs["media"], "image-file": wandb_runs["media"]}
    start, end = log.events[0], log.events[-1]
    assert start["kind"] == "run_start" and start["run"] == "wandb-good1"
    assert start["data"]["config"] == {
        "lr": 3e-4,
        "model": {"d_model": 64, "n_experts": 8},
        "wandb_api_key": "<redacted>",
    }
    assert start["data"]["name"] == "good run" and start["data"]["tags"] == ["a", "b"]
    assert start["data"]["wandb"]["project"] == "obs-test"
    assert end["kind"] == "run_end" and end["data"]["status"] == "completed"
    assert end["data"]["final_step"] == max(wandb_runs["logged"])
    assert end["data"]["summary"]["best_loss"] == 0.01
    # t comes from W&B's _timestamp: increasing, and not the time of the import
    ts = [ev["t"] for ev in log.events if ev["kind"] == "metrics"]
    assert ts == sorted(ts) and ts[-1] < os.path.getmtime(wandb_runs["good"]) + 1


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_nonzero_exit_code_is_a_failed_run(wandb_runs):
    log, res = convert_wandb_file(wandb_runs["bad"])
    assert res.status == "failed"
    assert log.events[-1]["data"]["exit_code"] == 3 and log.events[-1]["data"]["status"] == "failed"
    assert _metrics(log) == {s: {"train/loss": 1.0 + s} for s in range(10)}


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_import_folder_writes_runs_and_reimport_is_idempotent(wandb_runs, tmp_path):
    runs = tmp_path / "runs"
    first = import_wandb([wandb_runs["dir"]], runs, ingest=False)
    # latest-run symlink not doubled; the resumed run's two session files make one run
    assert sorted(r.run for r in first) == ["wandb-bad1", "wandb-good1", "wandb-res1", "wandb-res1"]
    assert {r.written for r in first} == {"new"}
    resumed = [json.loads(x) for x in (runs / "wandb-res1" / "events.0.jsonl").read_text().splitlines()]
    resumed = [e for e in resumed if e["kind"] != "heartbeat"]  # W&B's system stats: heartbeats
    assert [e["kind"] for e in resumed] == ["run_start"] + ["metrics"] * 20 + ["run_end"]
    assert [e["step"] for e in resumed[1:-1]] == list(range(20))
    assert [e["data"]["train/loss"] for e in resumed[1:-1]] == [10.0 - s for s in range(20)]
    assert resumed[0]["data"]["config"] == {"session": 1} and resumed[0]["data"]["resumed_sessions"] == 2
    assert resumed[-1]["data"]["status"] == "completed" and resumed[-1]["data"]["final_step"] == 19
    assert [r.status for r in first if r.run == "wandb-res1"] == ["completed", "completed"]
    before = (runs / "wandb-good1" / "events.0.jsonl").read_bytes()
    again = import_wandb([wandb_runs["good"]], runs, ingest=False)
    assert again[0].written == "unchanged"
    assert (runs / "wandb-good1" / "events.0.jsonl").read_bytes() == before


# --------------------------------------------------------------- damaged files


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_truncated_file_imports_up_to_its_last_whole_record_as_a_crashed_run(wandb_runs, tmp_path):
    spans = _spans(wandb_runs["good"])
    cut_start, cut_end, _ = spans[int(len(spans) * 0.6)]
    for cut in (cut_start + 3, cut_start + 7 + (cut_end - cut_start - 7) // 2):  # mid-header, mid-data
        copy = tmp_path / f"run-good1-{cut}.wandb"
        copy.write_bytes(wandb_runs["good"].read_bytes()[:cut])
        log, res = convert_wandb_file(copy)
        assert res.truncated and not res.problems and res.status == "crashed"
        assert [ev["kind"] for ev in log.events].count("run_end") == 0
        kept = {s for start, end, p in spans if end <= cut and (s := _history_step(p)) is not None}
        expected = {s: v for s, v in wandb_runs["logged"].items() if s in kept}
        assert expected and len(expected) < len(wandb_runs["logged"])
        assert _same(_metrics(log), expected)


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_flipped_crc_byte_loses_one_record_and_reports_its_offset(wandb_runs, tmp_path):
    spans = _spans(wandb_runs["good"])
    start, end, payload = next(sp for sp in spans[len(spans) // 2 :] if _history_step(sp[2]) is not None)
    lost_step = _history_step(payload)
    data = bytearray(wandb_runs["good"].read_bytes())
    data[start] ^= 0xFF  # first CRC byte
    copy = tmp_path / "run-good1.wandb"
    copy.write_bytes(bytes(data))
    log, res = convert_wandb_file(copy)
    assert len(res.problems) == 1 and f"byte {start} (+{end - start})" in res.problems[0]
    assert "CRC" in res.problems[0]
    expected = {s: v for s, v in wandb_runs["logged"].items() if s != lost_step}
    assert _same(_metrics(log), expected)
    assert res.status == "completed"  # the exit record is intact


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_garbage_block_loses_only_records_that_touch_it(wandb_runs, tmp_path):
    data = bytearray(wandb_runs["good"].read_bytes())
    assert len(data) > 3 * BLOCK, "the fixture run must span several blocks"
    rng = random.Random(0)
    data[BLOCK : 2 * BLOCK] = bytes(rng.randrange(256) for _ in range(BLOCK))
    copy = tmp_path / "run-good1.wandb"
    copy.write_bytes(bytes(data))
    reader = WandbLogReader(copy)
    got = {start: payload for start, payload in reader}
    spans = _spans(wandb_runs["good"])
    untouched = [(s, p) for s, e, p in spans if e <= BLOCK or s >= 2 * BLOCK]
    touched = [(s, p) for s, e, p in spans if not (e <= BLOCK or s >= 2 * BLOCK)]
    assert got == dict(untouched)  # everything else, byte for byte, and nothing invented
    assert touched
    # the reported regions cover the garbage block, and name offsets inside or at its edges
    covered = sorted((p.offset, p.offset + p.length) for p in reader.problems)
    pos = BLOCK
    for a, b in covered:
        if a <= pos < b:
            pos = b
    assert pos >= 2 * BLOCK, reader.problems
    assert all(touched[0][0] <= p.offset <= 2 * BLOCK + BLOCK for p in reader.problems)
    log, res = convert_wandb_file(copy)
    assert res.status == "completed" and res.problems
    lost = {_history_step(p) for _, p in touched} - {None}
    assert _same(_metrics(log), {s: v for s, v in wandb_runs["logged"].items() if s not in lost})


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_wrong_header_is_reported_and_every_record_still_read(wandb_runs, tmp_path):
    data = bytearray(wandb_runs["good"].read_bytes())
    assert bytes(data[:7]) == FILE_HEADER
    data[:4] = b"XXXX"
    copy = tmp_path / "run-good1.wandb"
    copy.write_bytes(bytes(data))
    log, res = convert_wandb_file(copy)
    assert len(res.problems) == 1 and "byte 0" in res.problems[0] and "header" in res.problems[0]
    assert _same(_metrics(log), wandb_runs["logged"])


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_cli_imports_every_run_even_with_a_broken_file_among_them(wandb_runs, tmp_path):
    junk = tmp_path / "junk" / "run-junk.wandb"
    junk.parent.mkdir()
    junk.write_bytes(b"this is not a W&B file at all\n" * 100)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(
        cli,
        ["import", "wandb", str(junk), str(wandb_runs["dir"]), "--runs-dir", str(runs), "--no-ingest"],
    )
    assert result.exit_code == 1, result.output  # one source gave nothing: say so in the exit code
    assert "FAILED" in result.output and "run-junk.wandb" in result.output and "byte 0" in result.output
    assert "3 run(s) imported from 4 source(s), 1 failed" in result.output
    assert (runs / "wandb-good1" / "events.0.jsonl").exists() and (
        runs / "wandb-bad1" / "events.0.jsonl"
    ).exists()


def test_reader_rejects_nothing_in_an_empty_or_missing_file(tmp_path):
    empty = tmp_path / "run-e.wandb"
    empty.write_bytes(b"")
    reader = WandbLogReader(empty)
    assert list(reader) == [] and reader.truncated and not reader.problems
    with pytest.raises(FileNotFoundError, match="no-such"):
        WandbLogReader(tmp_path / "no-such.wandb")


# ------------------------------------------------------------------ the store


def _store(db):
    with connect(db) as con:
        runs = dict(con.execute("SELECT run, status FROM runs").fetchall())
        rows = con.execute("SELECT run, step, name, value FROM metrics ORDER BY ALL").fetchall()
    metrics: dict = {}
    for run, step, name, value in rows:
        metrics.setdefault(run, {}).setdefault(step, {})[name] = value
    return runs, metrics


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_imported_runs_land_in_the_store_and_reimport_adds_nothing(wandb_runs, tmp_path, monkeypatch):
    # the detectors write findings about the NaN (host 1000, t = now), which ingest counts as
    # signs of life; with no grace period a run without run_end shows as crashed at once
    monkeypatch.setenv("OBSERVATORY_STALE_AFTER_S", "0")
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    args = ["--runs-dir", str(runs), "--db", str(db)]
    r = CliRunner().invoke(cli, ["import", "wandb", str(wandb_runs["dir"]), *args])
    assert r.exit_code == 0, r.output
    status, metrics = _store(db)
    assert status == {"wandb-good1": "completed", "wandb-bad1": "failed", "wandb-res1": "completed"}
    assert _same(metrics["wandb-good1"], wandb_runs["logged"])  # exact, NaN and inf included
    r = CliRunner().invoke(cli, ["import", "wandb", str(wandb_runs["dir"]), *args])
    assert r.exit_code == 0 and r.output.count("file unchanged") == 4
    assert _store(db)[0] == status and _same(_store(db)[1]["wandb-good1"], metrics["wandb-good1"])

    # a truncated copy of the same run: a conflict, refused; with --replace the store is rebuilt
    spans = _spans(wandb_runs["good"])
    cut = tmp_path / "cut" / "run-good1.wandb"
    cut.parent.mkdir()
    cut.write_bytes(wandb_runs["good"].read_bytes()[: spans[len(spans) // 2][0] + 5])
    r = CliRunner().invoke(cli, ["import", "wandb", str(cut), *args])
    assert r.exit_code == 1 and "already in the runs dir with different events" in r.output
    r = CliRunner().invoke(cli, ["import", "wandb", str(cut), "--replace", *args])
    assert r.exit_code == 0 and "file replaced" in r.output, r.output
    status, metrics = _store(db)
    assert status["wandb-good1"] == "crashed"  # no exit record: the run died
    kept = {s for start, end, p in spans if end <= cut.stat().st_size and (s := _history_step(p)) is not None}
    assert _same(metrics["wandb-good1"], {s: v for s, v in wandb_runs["logged"].items() if s in kept})


def _import_cut_run(wandb_runs, tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("OBSERVATORY_STALE_AFTER_S", raising=False)  # the default grace period
    spans = _spans(wandb_runs["good"])
    cut = tmp_path / "cut" / "run-good1.wandb"
    cut.parent.mkdir()
    cut.write_bytes(wandb_runs["good"].read_bytes()[: spans[len(spans) // 2][0] + 5])
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    r = CliRunner().invoke(cli, ["import", "wandb", str(cut), "--runs-dir", str(runs), "--db", str(db)])
    assert r.exit_code == 0 and "status crashed" in r.output, r.output
    return db


@pytest.mark.slow  # a real W&B run is made once for the module (wandb.init ~1-2 s each)
def test_a_truncated_import_is_crashed_in_the_store_at_once(wandb_runs, tmp_path, monkeypatch):
    """The import says `status crashed` for a run cut short (a recent one); the store says so at once."""
    db = _import_cut_run(wandb_runs, tmp_path, monkeypatch)
    assert _store(db)[0] == {"wandb-good1": "crashed"}
    with connect(db) as con:
        end, last = con.execute("SELECT end_time, last_event_t FROM runs").fetchall()[0]
    assert end == last  # a crash known for certain: it ended at its last event


@pytest.mark.slow
def test_a_truncated_import_is_crashed_in_observatory_runs_at_once(wandb_runs, tmp_path, monkeypatch):
    db = _import_cut_run(wandb_runs, tmp_path, monkeypatch)
    r = CliRunner().invoke(cli, ["runs", "--db", str(db), "--format", "json"])
    assert r.exit_code == 0 and json.loads(r.output)[0]["status"] == "crashed", r.output


def _log(runs: Path, run: str = "wandb-good1") -> list[dict]:
    return [json.loads(x) for x in (runs / run / "events.0.jsonl").read_text().splitlines()]


def _row(db) -> tuple:
    with connect(db) as con:
        return con.execute(
            "SELECT status, end_time, last_event_t FROM runs WHERE run = 'wandb-good1'"
        ).fetchall()[0]


@pytest.mark.slow
def test_a_truncated_import_is_crashed_from_the_logs_alone(wandb_runs, tmp_path, monkeypatch):
    """The store is rebuildable from the logs: `observatory ingest` of the imported folder into a new
    store, and `observatory rebuild`, show the cut run crashed at its last event, as the import did."""
    db = _import_cut_run(wandb_runs, tmp_path, monkeypatch)
    runs = tmp_path / "runs"
    log = _log(runs)
    last_t = max(e["t"] for e in log if e["kind"] == "metrics")  # a recent time: not yet stale
    assert log[-1]["kind"] == "failure" and log[-1]["data"]["final"] is True and log[-1]["t"] == last_t
    assert [e["kind"] for e in log].count("run_end") == 0
    want = ("crashed", last_t, last_t)
    assert _row(db) == want  # the import's own store
    fresh = tmp_path / "fresh.duckdb"
    for args in (
        ["ingest", "--db", str(fresh)],
        ["rebuild", "--db", str(fresh)],
        ["rebuild", "--db", str(db)],
    ):
        r = CliRunner().invoke(cli, [*args, "--runs-dir", str(runs), "-q"])
        assert r.exit_code == 0, r.output
        assert _row(fresh if str(fresh) in args else db) == want, args


@pytest.mark.slow
def test_a_cut_run_imported_again_after_it_grew_extends_its_log(wandb_runs, tmp_path, monkeypatch):
    """A live W&B run imported, then imported again once its file grew: the log only grows (what the
    source added follows the first import's crash marker), so ingest reads just the rest; the run is
    crashed at its new last event, in the import's store and in a new one; once the source has its exit
    record the log grows again and the run is completed."""
    monkeypatch.delenv("OBSERVATORY_STALE_AFTER_S", raising=False)
    spans, data = _spans(wandb_runs["good"]), wandb_runs["good"].read_bytes()
    src = tmp_path / "src" / "run-good1.wandb"
    src.parent.mkdir()
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    args = ["--runs-dir", str(runs), "--db", str(db)]
    src.write_bytes(data[: spans[len(spans) // 3][0] + 5])
    r = CliRunner().invoke(cli, ["import", "wandb", str(src), *args])
    assert r.exit_code == 0 and "file new" in r.output and "status crashed" in r.output, r.output
    first = (runs / "wandb-good1" / "events.0.jsonl").read_bytes()
    src.write_bytes(data[: spans[len(spans) // 2][0] + 5])
    r = CliRunner().invoke(cli, ["import", "wandb", str(src), *args])
    assert r.exit_code == 0 and "file extended" in r.output and "status crashed" in r.output, r.output
    log = _log(runs)
    assert (runs / "wandb-good1" / "events.0.jsonl").read_bytes().startswith(first)
    assert [e["seq"] for e in log] == list(range(len(log)))
    markers = [i for i, e in enumerate(log) if e["kind"] == "failure" and e["data"].get("final")]
    assert len(markers) == 2 and markers[1] == len(log) - 1
    grown, _ = convert_wandb_file(src)  # the same events as a fresh import of the grown source
    assert _same(
        _metrics(grown),
        {e["step"]: {k: float(v) for k, v in e["data"].items()} for e in log if e["kind"] == "metrics"},
    )
    last_t = max(e["t"] for e in log if e["kind"] == "metrics")
    assert log[markers[0]]["t"] < last_t
    assert _row(db) == ("crashed", last_t, last_t)
    r = CliRunner().invoke(cli, ["import", "wandb", str(src), *args])
    assert r.exit_code == 0 and "file unchanged" in r.output, r.output
    fresh = tmp_path / "fresh.duckdb"
    r = CliRunner().invoke(cli, ["ingest", "--runs-dir", str(runs), "--db", str(fresh), "-q"])
    assert r.exit_code == 0 and _row(fresh) == ("crashed", last_t, last_t), r.output
    src.write_bytes(data)
    r = CliRunner().invoke(cli, ["import", "wandb", str(src), *args])
    assert r.exit_code == 0 and "file extended" in r.output and "status completed" in r.output, r.output
    assert _log(runs)[-1]["kind"] == "run_end" and _row(db)[0] == "completed"
    assert _same(_store(db)[1]["wandb-good1"], wandb_runs["logged"])
