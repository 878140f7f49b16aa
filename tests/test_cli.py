"""The CLI's surface: every output format for every table, one-line errors, shared flags, progress."""

from __future__ import annotations

import csv
import io
import json

import click
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import event, write_lines

from observatory import decisions, docs, store
from observatory.cli import COMMANDS, main
from observatory.commands import common_options, progress
from observatory.ingest import passes
from observatory.pipeline import ingest
from observatory.store.schema import VIEW_NAMES, schema_columns

FORMATS = ("table", "csv", "json", "parquet")


def run(*args, **kw):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False, **kw)


@pytest.fixture(scope="module")
def real_store(tmp_path_factory):
    """A store built by ingest: simulated runs (a fork, expert load, anomalies), a decision, a bad line."""
    tmp = tmp_path_factory.mktemp("store")
    runs_dir, db = tmp / "runs", tmp / "store.duckdb"
    res = run("simulate", "--preset", "tiny", "--steps", "60", "--runs-dir", runs_dir, "--db", db)
    assert res.exit_code == 0, res.output
    write_lines(
        runs_dir / "r1" / "events.0.jsonl",
        [
            event("r1", "run_start", {"config": {"lr": 0.1}, "name": "first", "tags": ["a", "b"]}, 0),
            event("r1", "metrics", {"train/loss": 3.0}, 1, 0),
            "{broken",
        ],
    )
    decisions.new(runs_dir, db, ingest=ingest, title="Lower the LR", kind="experiment", runs=[])
    assert run("ingest", "-q", "--runs-dir", runs_dir, "--db", db).exit_code == 0
    return runs_dir, db


def _relations(db) -> list[str]:
    with store.connect(db) as con:
        names = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' ORDER BY 1"
            ).fetchall()
        ]
    # the store really has every table and view the schema module declares
    assert set(schema_columns()) | set(VIEW_NAMES) <= set(names)
    return names


def _count(db, rel: str) -> int:
    with store.connect(db) as con:
        return min(con.execute(f"SELECT count(*) FROM {rel}").fetchone()[0], 200)


def test_store_has_nested_and_json_columns(real_store):
    _, db = real_store
    with store.connect(db) as con:
        types = {r[0] for r in con.execute("SELECT data_type FROM information_schema.columns").fetchall()}
    assert "VARCHAR[]" in types and "JSON" in types


@pytest.mark.subprocess
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_handles_every_table_and_view(real_store, tmp_path, fmt):
    _, db = real_store
    for rel in _relations(db):
        n = _count(db, rel)
        out = tmp_path / f"{rel}.{fmt}"
        res = run("sql", f"SELECT * FROM {rel} LIMIT 200", "--db", db, "--format", fmt, "--out", out)
        assert res.exit_code == 0, (rel, fmt, res.output)
        if fmt == "csv":
            rows = list(csv.reader(io.StringIO(out.read_text())))
            assert len(rows) == n + 1, rel
        elif fmt == "json":
            assert len(json.loads(out.read_text())) == n, rel
        elif fmt == "parquet":
            assert pl.read_parquet(out).height == n, rel
        else:
            assert out.stat().st_size > 0


@pytest.mark.subprocess
def test_csv_writes_nested_and_json_values_as_json_text(real_store):
    _, db = real_store
    res = run("sql", "SELECT run, tags, config FROM runs WHERE run = 'r1'", "--db", db, "--format", "csv")
    assert res.exit_code == 0, res.output
    (row,) = list(csv.DictReader(io.StringIO(res.stdout)))
    assert json.loads(row["tags"]) == ["a", "b"] and json.loads(row["config"]) == {"lr": 0.1}
    res = run(
        "sql",
        "SELECT {'a': 1, 'b': [1, 2]} AS s, MAP {'k': 2} AS m, [[1], [2, 3]] AS ll",
        "--db",
        db,
        "--format",
        "csv",
    )
    (row,) = list(csv.DictReader(io.StringIO(res.stdout)))
    assert json.loads(row["s"]) == {"a": 1, "b": [1, 2]} and json.loads(row["ll"]) == [[1], [2, 3]]
    assert json.loads(row["m"]) == {"k": 2}


@pytest.mark.subprocess
def test_json_embeds_json_columns_and_parquet_keeps_types(real_store, tmp_path):
    _, db = real_store
    res = run("sql", "SELECT run, tags, config FROM runs WHERE run = 'r1'", "--db", db, "--format", "json")
    assert json.loads(res.stdout) == [{"run": "r1", "tags": ["a", "b"], "config": {"lr": 0.1}}]
    out = tmp_path / "runs.parquet"
    assert run("sql", "SELECT * FROM runs", "--db", db, "--format", "parquet", "--out", out).exit_code == 0
    schema = pl.read_parquet_schema(out)
    assert schema["tags"] == pl.List(pl.String) and schema["last_step"].is_integer()
    out = tmp_path / "empty.parquet"
    query = "SELECT * FROM rejected_events WHERE false"
    assert run("sql", query, "--db", db, "--format", "parquet", "--out", out).exit_code == 0
    schema = pl.read_parquet_schema(out)
    assert schema["line"].is_integer() and schema["reason"] == pl.String  # types survive zero rows


@pytest.mark.subprocess
@pytest.mark.parametrize("fmt", FORMATS)
def test_errors_are_one_line_and_nonzero(real_store, tmp_path, fmt, monkeypatch):
    runs_dir, db = real_store
    cases = [
        ("SELECT * FROM", "does not parse"),
        ("DROP TABLE runs", "refused"),
        ("SELECT * FROM nope", "nope"),
        ("SELECT 1; SELECT 2", "one statement"),
    ]
    for query, words in cases:
        res = run("sql", query, "--db", db, "--format", fmt, "--out", tmp_path / "x")
        assert res.exit_code != 0 and words in res.stderr, (query, res.output)
        assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output
    # an --out that cannot be written: a folder, a missing parent, a read-only place
    for out in (tmp_path, tmp_path / "no" / "such" / "dir" / "x", "/proc/x"):
        res = run("sql", "SELECT * FROM runs", "--db", db, "--format", fmt, "--out", out)
        assert res.exit_code == 1 and res.stderr.startswith("Error:"), (out, res.output)
        assert len(res.stderr.strip().splitlines()) == 1
    # a store that is not a DuckDB file
    bad = tmp_path / "bad.duckdb"
    bad.write_text("not a database")
    res = run("sql", "SELECT 1", "--db", bad, "--format", fmt, "--out", tmp_path / "y")
    assert res.exit_code == 1 and len(res.stderr.strip().splitlines()) == 1, res.output
    # a busy store: a writer holds it past the lock timeout
    monkeypatch.setenv("OBSERVATORY_LOCK_TIMEOUT_S", "0.2")
    with store.write_connection(db):
        res = run("sql", "SELECT 1", "--db", db, "--format", fmt, "--out", tmp_path / "z")
    assert res.exit_code == 1 and "busy" in res.stderr.lower() and len(res.stderr.strip().splitlines()) == 1


def test_traceback_flag_shows_the_traceback(tmp_path):
    bad = tmp_path / "bad.duckdb"
    bad.write_text("not a database")
    res = CliRunner().invoke(main, ["runs", "--db", str(bad)])
    assert res.exit_code == 1 and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["--traceback", "runs", "--db", str(bad)])
    assert res.exit_code == 1 and res.exception is not None and not isinstance(res.exception, SystemExit)


# ------------------------------------------------------------------ one set of store flags


# commands that neither read nor write a store or a runs dir
NO_STORE = {"observatory settings"}
# ... or only name a store: the alerts' rules-file edits and channel test (the store's own rules file)
DB_ONLY = {f"observatory alerts {c}" for c in ("silence", "disable", "enable", "test")}
LEAVES = list(docs._commands(COMMANDS))  # every command, a group's subcommands in its place
SHARED = {p.name: p for p in click.command()(common_options(lambda **_: None)).params}


@pytest.mark.parametrize("name,cmd", LEAVES, ids=[n for n, _ in LEAVES])
def test_every_command_takes_the_shared_store_flags(name, cmd):
    params = {p.name: p for p in cmd.params}
    if name in NO_STORE:
        assert not {"db", "runs_dir"} & set(params)
        return
    if name in DB_ONLY:
        assert "runs_dir" not in params
    for flag in ("db",) if name in DB_ONLY else ("runs_dir", "db"):
        assert flag in params, f"observatory {name} has no --{flag.replace('_', '-')}"
        mine, shared = params[flag], SHARED[flag]
        assert (mine.opts, mine.help, mine.show_default, mine.type) == (
            shared.opts,
            shared.help,
            shared.show_default,
            shared.type,
        )


def test_decide_list_takes_runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_DB", str(tmp_path / "nowhere.duckdb"))
    res = run("decide", "list", "--runs-dir", tmp_path / "runs", "--db", tmp_path / "s.duckdb")
    assert res.exit_code == 0 and "no decisions" in res.stdout


def test_store_flags_default_to_their_env(tmp_path, monkeypatch):
    runs_dir = tmp_path / "elsewhere"
    write_lines(runs_dir / "r9" / "events.0.jsonl", [event("r9", "run_start", {"config": {}}, 0)])
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs_dir))
    monkeypatch.setenv("OBSERVATORY_DB", str(tmp_path / "env.duckdb"))
    assert run("ingest", "-q").exit_code == 0
    assert (tmp_path / "env.duckdb").exists()
    assert [r["run"] for r in json.loads(run("runs", "--format", "json").stdout)] == ["r9"]


# ------------------------------------------------------------------ progress


def _three_files(runs_dir):
    for r in ("a", "b", "c"):
        write_lines(
            runs_dir / r / "events.0.jsonl",
            [
                event(r, "run_start", {"config": {}}, 0),
                *[event(r, "metrics", {"train/loss": 1.0 / (i + 1)}, i + 1, i) for i in range(40)],
            ],
        )


def test_ingest_reports_progress_per_batch(runs_dir, db_path, monkeypatch):
    _three_files(runs_dir)
    monkeypatch.setattr(passes, "BATCH_BYTES", 1000)  # one file a batch
    calls: list[dict] = []
    report = ingest(runs_dir, db_path, emit=None, progress=calls.append)
    total = sum(p.stat().st_size for p in runs_dir.rglob("*.jsonl"))
    assert len(calls) >= 4  # the start, then once a file
    done = [c["done"] for c in calls]
    assert done == sorted(done) and len(set(done)) >= 4
    assert all(c["done"] <= c["total"] for c in calls)
    assert [c["total"] for c in calls] == sorted(c["total"] for c in calls)
    assert calls[-1]["done"] == calls[-1]["total"] == report.bytes == total
    assert calls[-1]["files"] == 3
    # incremental: a second ingest has nothing to do and counts nothing as done
    calls.clear()
    ingest(runs_dir, db_path, emit=None, progress=calls.append)
    assert all(c["done"] == 0 for c in calls)


@pytest.fixture
def tty(monkeypatch):
    monkeypatch.setattr(progress, "isatty", lambda: True)


def test_ingest_shows_progress_on_a_terminal(runs_dir, db_path, tty):
    _three_files(runs_dir)
    res = run("ingest", "--runs-dir", runs_dir, "--db", db_path)
    assert res.exit_code == 0
    assert "ingest" in res.stderr and "kB" in res.stderr and "3 files" in res.stderr  # the bar's last frame
    assert "ingested 123 events" in res.stderr


def test_quiet_or_a_pipe_shows_no_progress(runs_dir, db_path, tty, monkeypatch):
    _three_files(runs_dir)
    res = run("rebuild", "-q", "--runs-dir", runs_dir, "--db", db_path)
    assert res.exit_code == 0 and res.stderr.strip().splitlines() == [res.stderr.strip()]
    assert res.stderr.startswith("rebuilt ")
    monkeypatch.setattr(progress, "isatty", lambda: False)
    res = run("rebuild", "--runs-dir", runs_dir, "--db", db_path)
    assert res.exit_code == 0 and res.stderr.startswith("rebuilt ") and "\x1b[" not in res.stderr


def test_rebuild_shows_progress_on_a_terminal(runs_dir, db_path, tty):
    _three_files(runs_dir)
    res = run("rebuild", "--runs-dir", runs_dir, "--db", db_path)
    assert res.exit_code == 0 and "rebuild" in res.stderr and "kB" in res.stderr


def test_import_jsonl_shows_progress_per_file(runs_dir, db_path, tmp_path, tty):
    _three_files(runs_dir)
    files = []
    for r in ("a", "b", "c"):
        out = tmp_path / f"{r}.jsonl"
        assert run("export", r, "--out", out, "--runs-dir", runs_dir, "--db", db_path).exit_code == 0
        files.append(out)
    other = tmp_path / "other_runs"
    res = run("import", "jsonl", *files, "--runs-dir", other, "--db", tmp_path / "o.duckdb")
    assert res.exit_code == 0, res.output
    assert "3/3" in res.stderr and "import" in res.stderr
    res = run(
        "import", "jsonl", *files, "-q", "--runs-dir", tmp_path / "third", "--db", tmp_path / "t.duckdb"
    )
    assert res.exit_code == 0 and "3/3" not in res.output and "host 0" not in res.output


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_ladder_fit_reports_progress_per_round(tmp_path, tty):
    runs_dir, db = tmp_path / "runs", tmp_path / "s.duckdb"
    assert (
        run(
            "simulate", "--preset", "ladder", "--steps", "40", "--runs-dir", runs_dir, "--db", db, "--ingest"
        ).exit_code
        == 0
    )
    name = json.loads(run("ladder", "list", "--json", "--db", db).stdout)[0]["name"]
    res = run("ladder", "fit", name, "--n-boot", "5", "--runs-dir", runs_dir, "--db", db)
    assert res.exit_code == 0, res.output
    assert "fit" in res.stderr and "backtest" in res.stderr and "rounds" in res.stderr
    res = run(
        "ladder", "fit", name, "--n-boot", "5", "--no-backtest", "-q", "--runs-dir", runs_dir, "--db", db
    )
    assert res.exit_code == 0 and res.stderr == ""

    from observatory.ladder.fit import FitConfig, fit_ladder
    from observatory.ladder.watch import load_ladder

    with store.connect(db) as con:
        rungs, _, _ = load_ladder(con, name, None)
    calls: list[dict] = []
    fit_ladder(rungs, FitConfig(n_boot=5), name=name, progress=calls.append)
    done = [c["done"] for c in calls]
    assert done == sorted(done) and calls[-1]["done"] == calls[-1]["total"] > 1


def test_runs_table_shows_every_runs_name(runs_dir, db_path):
    """A run named after its id (every sample ladder run) still shows its name, not an empty cell."""
    write_lines(
        runs_dir / "ladder-cpu-d24" / "events.0.jsonl",
        [
            event(
                "ladder-cpu-d24",
                "run_start",
                {"config": {}, "name": "ladder-cpu-d24", "ladder": {"name": "ladder-cpu", "rung": "d24"}},
                0,
            ),
            event("ladder-cpu-d24", "run_end", {"status": "completed", "final_step": 0}, 1),
        ],
    )
    ingest(runs_dir, db_path, emit=None)
    out = run("runs", "--db", db_path, "--format", "table", env={"COLUMNS": "300"}).output
    row = next(line for line in out.splitlines() if "ladder-cpu-d24" in line and "completed" in line)
    assert row.count("ladder-cpu-d24") == 2, out  # the run column and the name column


def test_quiet_leaves_out_rejected_lines_not_errors(runs_dir, db_path):
    """-q: "only the summary and errors". A rejected line (and the count past the stored ones) is left
    out, the summary counts it; a missing runs dir and a host number the store cannot hold are said."""
    write_lines(runs_dir / "a" / "events.0.jsonl", [event("a", "metrics", {"x": 1.0}, 0, 0), "not json"])
    write_lines(
        runs_dir / "b" / f"events.{2**16}.jsonl", [event("b", "metrics", {"x": 1.0}, 0, 0, host=2**16)]
    )
    res = run("ingest", "-q", "--runs-dir", runs_dir, "--db", db_path)
    assert res.exit_code == 1, res.output  # the file the store cannot keep is not stored: said last
    lines = res.stderr.strip().splitlines()
    assert lines[-1] == "Error: not stored: 1 file(s) not ingested (see above)"
    assert "1 rejected" in lines[-2] and not any("events.0.jsonl:2" in x for x in lines)
    assert any(f"events.{2**16}.jsonl: host {2**16}" in x for x in lines[:-2]), lines
    loud = run("rebuild", "--runs-dir", runs_dir, "--db", db_path).stderr
    assert "events.0.jsonl:2: bad JSON" in loud
    res = run("ingest", "-q", "--runs-dir", runs_dir / "missing", "--db", db_path)
    assert res.exit_code == 0 and "runs dir does not exist" in res.stderr


@pytest.mark.subprocess
def test_the_collector_setting_is_the_command_processes_alone(tmp_path):
    """`cli.run` (the console script's process) makes full collections rare; importing the package or the
    CLI (a training script, the dashboard, a notebook) leaves Python's collector as it was."""
    import ast
    import subprocess
    import sys

    from observatory import cli

    probe = (
        "import gc, sys\n"
        "default = gc.get_threshold()\n"
        "import observatory, observatory.cli as cli\n"
        "assert gc.get_threshold() == default, ('changed at import', gc.get_threshold())\n"
        "import click\n"
        "@cli.main.command('probe-gc')\n"
        "def probe():\n"
        "    click.echo(repr((default, gc.get_threshold())))\n"
        "sys.argv = ['observatory', 'probe-gc']\n"
        "cli.run()\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert out.returncode == 0, out.stderr
    default, inside = ast.literal_eval(out.stdout.strip())
    assert inside == (default[0], default[1], cli.FULL_COLLECTION_AFTER)
    assert default[2] != cli.FULL_COLLECTION_AFTER
