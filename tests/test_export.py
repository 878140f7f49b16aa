"""Export: jsonl (re-importable, all hosts merged), parquet and csv metrics, on a real store."""

from __future__ import annotations

import json
import math

import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import observatory
from observatory import findings
from observatory.cli import main as cli
from observatory.pipeline import ingest
from observatory.queries.export import METRIC_COLUMNS
from observatory.store import connect

RUN = "exp-2host"


def _make_run(runs):
    """A two-host run with every common kind, NaN and inf included."""
    h0 = observatory.init(
        run_id=RUN,
        config={"lr": 3e-4, "api_token": "x"},
        runs_dir=runs,
        install_signal_handlers=False,
        tags=["t"],
    )
    h1 = observatory.init(run_id=RUN, runs_dir=runs, host=1, write_start=False, install_signal_handlers=False)
    for step in range(40):
        loss = float("nan") if step == 7 else 3.0 / (1 + step)
        h0.log(
            {"train/loss": loss, "opt/lr": 1e-4 * step, "grad/norm/total": math.inf if step == 9 else 1.0},
            step=step,
        )
        h1.log({"throughput/tokens_per_s": 1000.0 + step}, step=step)
        if step % 10 == 0:
            h0.log_expert_load(step, 0, [5, 3, 2, 6], [0, 1, 0, 2])
    h0.event("eval", {"dataset": "val", "loss": 2.5, "bpb": 1.1}, step=39)
    h0.note("looks fine", author="me", step=20)
    h1.close()
    h0.finish(final_step=39)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    runs, db = root / "runs", root / "o.duckdb"
    _make_run(runs)
    # a run that must not leak into the export
    with observatory.init(run_id="other", runs_dir=runs, install_signal_handlers=False) as other:
        other.log({"train/loss": 9.0}, step=0)
    ingest(runs, db, emit=None)
    ingest(runs, db, emit=None)  # the detectors' findings (events, host 1000) from the first pass
    return root, runs, db


def _store_rows(db, run=RUN):
    with connect(db) as con:
        metrics = con.execute(
            "SELECT run, step, name, value, t, host, replaced FROM metrics WHERE run = ? ORDER BY step, name, host",
            [run],
        ).fetchall()
        events = con.execute(
            "SELECT host, seq, kind, step, t, data::VARCHAR FROM events WHERE run = ? ORDER BY host, seq",
            [run],
        ).fetchall()
        experts = con.execute(
            "SELECT step, layer, expert, routed, dropped FROM expert_load WHERE run = ? ORDER BY ALL", [run]
        ).fetchall()
        runs = con.execute(
            "SELECT run, status, start_time, end_time, final_step, config::VARCHAR, tags FROM runs WHERE run = ?",
            [run],
        ).fetchall()
    return metrics, events, experts, runs


def _same_rows(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        for u, v in zip(x, y, strict=True):
            assert u == v or (isinstance(u, float) and math.isnan(u) and math.isnan(v)), (x, y)


def test_jsonl_export_then_import_reproduces_the_run(store, tmp_path):
    root, runs, db = store
    out = tmp_path / "run.jsonl"
    r = CliRunner().invoke(
        cli, ["export", RUN, "--format", "jsonl", "--out", str(out), "--runs-dir", str(runs), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    lines = out.read_bytes().splitlines(keepends=True)
    # hosts 0 and 1, and 1000: the anomaly detectors' findings about the NaN and inf
    src = {
        int(p.name.split(".")[1]): p.read_bytes().splitlines(keepends=True)
        for p in [*(runs / RUN).glob("events.*.jsonl"), findings.path(runs, RUN)]
    }
    assert set(src) == {0, 1, 1000}
    assert len(lines) == sum(map(len, src.values())) and f"{len(lines)} events" in r.output
    events = [json.loads(x) for x in lines]
    assert {e["run"] for e in events} == {RUN} and {e["host"] for e in events} == set(src)
    assert [e["t"] for e in events] == sorted(e["t"] for e in events)  # merged in time order
    for h in src:  # each host's lines unchanged, in their order
        assert [x for x, e in zip(lines, events, strict=True) if e["host"] == h] == src[h]

    runs2, db2 = tmp_path / "runs2", tmp_path / "o2.duckdb"
    r = CliRunner().invoke(cli, ["import", "jsonl", str(out), "--runs-dir", str(runs2), "--db", str(db2)])
    assert r.exit_code == 0, r.output
    assert f"{RUN} host 0" in r.output and f"{RUN} host 1" in r.output
    assert not (runs2 / "other").exists()
    for got, want in zip(_store_rows(db2), _store_rows(db), strict=True):
        _same_rows(got, want)
    # and importing it again changes nothing
    r = CliRunner().invoke(cli, ["import", "jsonl", str(out), "--runs-dir", str(runs2), "--db", str(db2)])
    assert r.exit_code == 0 and r.output.count("file unchanged") == 3


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_metrics_table_export_matches_the_store(store, tmp_path, fmt):
    root, runs, db = store
    out = tmp_path / f"m.{fmt}"
    r = CliRunner().invoke(
        cli, ["export", RUN, "--format", fmt, "--out", str(out), "--runs-dir", str(runs), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    # csv writes NaN/inf as nan/inf; pyarrow's reader would take "nan" for a null unless told
    csv_opts = pacsv.ConvertOptions(null_values=[])
    table = pq.read_table(out) if fmt == "parquet" else pacsv.read_csv(out, convert_options=csv_opts)
    assert tuple(table.column_names) == METRIC_COLUMNS
    want = _store_rows(db)[0]
    assert f"{len(want)} metric values" in r.output
    got = sorted(tuple(row.values()) for row in table.to_pylist())
    _same_rows(got, sorted(want, key=lambda x: (x[1], x[2], x[5])))
    assert any(isinstance(v, float) and math.isnan(v) for v in table.column("value").to_pylist())
    assert math.inf in table.column("value").to_pylist()


def test_export_of_an_unknown_run_says_what_exists(store, tmp_path):
    root, runs, db = store
    r = CliRunner().invoke(
        cli, ["export", "exp-2hst", "--format", "csv", "--out", str(tmp_path / "x.csv"), "--db", str(db)]
    )
    assert r.exit_code == 1 and "not in the store" in r.output and RUN in r.output
    r = CliRunner().invoke(
        cli, ["export", "nope", "--format", "jsonl", "--runs-dir", str(runs), "--db", str(db)]
    )
    assert r.exit_code == 1 and "no folder" in r.output
    r = CliRunner().invoke(cli, ["export", RUN, "--format", "parquet", "--out", "-", "--db", str(db)])
    assert r.exit_code == 1 and "stdout" in r.output


def test_jsonl_export_leaves_out_what_ingest_rejects(tmp_path):
    runs = tmp_path / "runs"
    with observatory.init(run_id="r", runs_dir=runs, install_signal_handlers=False) as run:
        run.log({"a": 1.0}, step=0)
    path = runs / "r" / "events.0.jsonl"
    with open(path, "ab") as f:
        f.write(b'{"v":1,"run":"r","kind":"metrics","step":-1,"t":1.0,"host":0,"seq":99,"data":{}}\n')
        f.write(b'{"v":1,"run":"r","kind":"met')  # torn final write
    out = tmp_path / "r.jsonl"
    r = CliRunner().invoke(cli, ["export", "r", "--out", str(out), "--runs-dir", str(runs)])
    assert r.exit_code == 0 and "2 invalid or torn lines left out" in r.output
    # run_start, the phases init and train, the step, the phase shutdown, run_end: every line the writer wrote
    assert out.read_bytes() == b"".join(path.read_bytes().splitlines(keepends=True)[:6])


def test_import_jsonl_names_file_line_and_field_of_a_bad_event(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"v":1,"run":"r","kind":"metrics","step":0,"t":1.0,"host":0,"seq":0,"data":{"x":"oops"}}\n'
    )
    r = CliRunner().invoke(
        cli, ["import", "jsonl", str(bad), "--runs-dir", str(tmp_path / "runs"), "--no-ingest"]
    )
    assert r.exit_code == 1 and "bad.jsonl:1: field data.x" in r.output
    assert not (tmp_path / "runs").exists()
