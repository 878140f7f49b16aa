"""`observatory export --partitioned DIR`: the store as Hive-partitioned Parquet, read back by DuckDB."""

from __future__ import annotations

import math

import duckdb
import pytest
from click.testing import CliRunner
from conftest import event, write_lines

from observatory.cli import main as cli
from observatory.interop.export import ExportError, export_partitioned
from observatory.interop.simulate import simulate
from observatory.pipeline import ingest
from observatory.store import connect, write_connection

T = 1_700_000_000.0


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("partitioned")
    runs, db, out = root / "runs", root / "o.duckdb", root / "export"
    simulate("tiny", runs, steps=60, hosts=2)
    # a run with a NaN and a kind this reader does not know, named like a path
    lines = [
        event("odd.run-1", "run_start", {"config": {"lr": 1e-3}}, 0, t=T),
        event("odd.run-1", "metrics", {"train/loss": 2.0}, 1, step=1, t=T),
        event("odd.run-1", "metrics", {"train/loss": "nan", "opt/lr": 1e-3}, 2, step=2, t=T),
        event("odd.run-1", "../../escape", {"x": 1}, 3, step=2, t=T),
        event("odd.run-1", "run_end", {"status": "failed", "final_step": 2}, 4, t=T),
    ]
    write_lines(runs / "odd.run-1" / "events.0.jsonl", lines)
    ingest(runs, db, emit=None)
    res = export_partitioned(out, db=db)
    return db, out, res


def _parquet(out, where: str = "**/*.parquet") -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(
        f"CREATE VIEW p AS SELECT * FROM read_parquet('{out}/{where}', hive_partitioning=true, union_by_name=true)"
    )
    return con


def _store(db, sql):
    with connect(db) as con:
        return con.execute(sql).fetchall()


def test_layout_is_kind_then_run(exported):
    _, out, res = exported
    assert res.runs == 3 and res.files > 0
    for path in out.rglob("*"):
        rel = path.relative_to(out).parts
        assert rel[0].startswith("kind=")
        if len(rel) > 1:
            assert rel[1].startswith("run=")
        assert len(rel) <= 3
    kinds = {p.name for p in out.iterdir()}
    assert {
        "kind=runs",
        "kind=metrics",
        "kind=expert_load",
        "kind=run_start",
        "kind=eval",
        "kind=failure",
        "kind=config_diff",
        "kind=unknown",
    } <= kinds
    assert not list(out.parent.glob(".*partial*"))


def test_counts_per_run_and_kind_match_the_store(exported):
    db, out, res = exported
    p = _parquet(out)
    got = dict(
        ((k, r), n) for k, r, n in p.execute("SELECT kind, run, count(*) FROM p GROUP BY ALL").fetchall()
    )
    want = {}
    for r, n in _store(db, "SELECT run, count(*) FROM metrics GROUP BY run"):
        want["metrics", r] = n
    for r, n in _store(db, "SELECT run, count(*) FROM expert_load GROUP BY run"):
        want["expert_load", r] = n
    for r, n in _store(db, "SELECT run, count(*) FROM runs GROUP BY run"):
        want["runs", r] = n
    for k, r, n in _store(db, "SELECT kind, run, count(*) FROM events GROUP BY ALL"):
        key = ("unknown" if k == "../../escape" else k, r)
        want[key] = want.get(key, 0) + n
    assert got == want
    assert res.rows["metrics"] == sum(n for (k, _), n in want.items() if k == "metrics")


def test_values_series_and_expert_load_match_the_store(exported):
    db, out, _ = exported
    m = _parquet(out, "kind=metrics/*/*.parquet")
    sql = "SELECT run, name, count(*), sum(value) FILTER (WHERE isfinite(value)), count(*) FILTER (WHERE isnan(value)) FROM {} GROUP BY ALL ORDER BY ALL"
    assert m.execute(sql.format("p")).fetchall() == _store(db, sql.format("metrics"))
    series = (
        "SELECT step, value, t, host FROM {} WHERE run = 'sim-tiny' AND name = 'train/loss' ORDER BY step, t"
    )
    a, b = m.execute(series.format("p")).fetchall(), _store(db, series.format("metrics"))
    assert len(a) == len(b) > 60  # the rollback replays some steps
    for x, y in zip(a, b, strict=True):
        assert x[0] == y[0] and x[2:] == y[2:]
        assert x[1] == y[1] or (math.isnan(x[1]) and math.isnan(y[1]))
    e = _parquet(out, "kind=expert_load/*/*.parquet")
    loads = "SELECT run, layer, expert, sum(routed), sum(dropped), count(*) FROM {} GROUP BY ALL ORDER BY ALL"
    assert e.execute(loads.format("p")).fetchall() == _store(db, loads.format("expert_load"))


def test_events_and_runs_keep_their_payloads(exported):
    db, out, _ = exported
    ev = _parquet(out, "kind=*/*/*.parquet")
    q = "SELECT run, host, seq, step, t, data::VARCHAR FROM {} WHERE {} ORDER BY run, host, seq"
    assert ev.execute(q.format("p", "kind = 'eval'")).fetchall() == _store(
        db, q.format("events", "kind = 'eval'")
    )
    (raw,) = ev.execute("SELECT raw_kind FROM p WHERE kind = 'unknown'").fetchall()
    assert raw == ("../../escape",)
    r = _parquet(out, "kind=runs/*/*.parquet")
    cols = "run, status, parent_run, parent_step, final_step, config::VARCHAR, mesh::VARCHAR, tags"
    assert r.execute(f"SELECT {cols} FROM p ORDER BY run").fetchall() == _store(
        db, f"SELECT {cols} FROM runs ORDER BY run"
    )


def test_refuses_a_folder_that_is_not_empty_and_a_hostile_run_id(exported, tmp_path):
    db, out, _ = exported
    with pytest.raises(ExportError, match="not an empty folder"):
        export_partitioned(out, db=db)
    bad = tmp_path / "bad.duckdb"
    with connect(bad):
        pass  # an empty store
    with write_connection(bad) as con:
        con.execute(
            "INSERT INTO metrics (run, step, name, value, t, host) VALUES ('..', 1, 'x', 1.0, 0.0, 0)"
        )
    with pytest.raises(ExportError, match="not safe"):
        export_partitioned(tmp_path / "out", db=bad)
    assert not (tmp_path / "out").exists()


def test_cli(exported, tmp_path):
    db, _, _ = exported
    out = tmp_path / "p"
    out.mkdir()  # an empty folder is fine
    r = CliRunner().invoke(cli, ["export", "--partitioned", str(out), "--db", str(db)])
    assert r.exit_code == 0, r.output
    assert "3 run(s)" in r.output and (out / "kind=metrics").is_dir()
    r = CliRunner().invoke(cli, ["export", "sim-tiny", "--partitioned", str(tmp_path / "q"), "--db", str(db)])
    assert r.exit_code == 2 and "no RUN" in r.output
    r = CliRunner().invoke(cli, ["export", "--db", str(db)])
    assert r.exit_code == 2 and "--partitioned" in r.output
