"""Secrets never reach the public: a corpus planted in foreign logs and W&B/TensorBoard imports.

The store is built from a hand-written foreign log (`public_secrets.write_foreign_run`: every
place text is stored), a real W&B offline run and a real TensorBoard file, all with secrets
in them. Then no needle may appear in the store (every column of every table), any dashboard
page (the whole element tree AppTest gets, for each run), the SQL console, a report (HTML,
Markdown, PDF) or an export (parquet, csv, jsonl, --partitioned); and each run says how
many values were hidden.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from public_secrets import DECISION, RUN, SECRETS, leaks, write_foreign_run
from streamlit.testing.v1 import AppTest

from observatory import report
from observatory.cli import main as cli
from observatory.pipeline import ingest, rebuild
from observatory.redact import redacted_note
from observatory.store import connect, write_connection

pytestmark = pytest.mark.slow

WB = {
    "wb_key": "0a1b2c3d4e5f" * 3 + "a1b2c3d4",  # 44 hex under api_key
    "wb_hf": "hf_PlantedInWandbConfig012345678",
    "wb_name": "ghp_PlantedInAWandbRunName0123456789",
    "wb_tag": "sk-PlantedInAWandbTag0123456789ab",
    "wb_metric": "hf_PlantedInAWandbMetric01234567",
}
TB = {"tb_metric": "hf_PlantedInATensorBoardTag0123456"}
ALL = {**SECRETS, **WB, **TB}

MAKE_WANDB = f"""
import sys, wandb
run = wandb.init(mode="offline", dir=sys.argv[1], project="obs-secrets", id="leaky", name="run {WB["wb_name"]}",
                 tags=["{WB["wb_tag"]}"], config={{"api_key": "{WB["wb_key"]}", "nested": {{"hf_token": "x"}},
                 "cmd": "pull with {WB["wb_hf"]}", "lr": 1e-3}})
for s in range(10):
    wandb.log({{"train/loss": 2.0 - 0.1 * s, "debug/{WB["wb_metric"]}": 1.0}}, step=s)
run.finish()
"""


def _wandb_dir(tmp: Path) -> Path:
    out = tmp / "wandb"
    out.mkdir()
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(out), WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    subprocess.run([sys.executable, "-c", MAKE_WANDB, str(out)], check=True, env=env, timeout=300)
    return out


def _tb_dir(tmp: Path) -> Path:
    tbx = pytest.importorskip("tensorboardX")
    root = tmp / "tb"
    w = tbx.SummaryWriter(str(root / "leaky"))
    for s in range(10):
        w.add_scalar("train/loss", 1.0 / (1 + s), s)
        w.add_scalar(f"debug/{TB['tb_metric']}", 1.0, s)
    w.close()
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("wandb")
    from observatory.interop.tensorboard_import import import_tensorboard
    from observatory.interop.wandb_import import import_wandb

    tmp = tmp_path_factory.mktemp("secrets")
    runs, db = tmp / "runs", tmp / "store.duckdb"
    write_foreign_run(runs)
    import_wandb([_wandb_dir(tmp)], runs, None, ingest=False)
    import_tensorboard([_tb_dir(tmp)], runs, None, ingest=False)
    # the importers hide config secrets in the logs they write; the rest waits for ingest
    imported = "".join(p.read_text() for p in runs.rglob("events.*.jsonl") if p.parent.name != RUN)
    assert leaks(imported, {k: WB[k] for k in ("wb_key", "wb_hf")}) == []
    assert leaks(imported, {**WB, **TB}) == ["wb_name", "wb_tag", "wb_metric", "tb_metric"]
    # ...but a hand-written log keeps its secrets: the runs dir is private; only ingest protects the store
    assert leaks((runs / RUN / "events.0.jsonl").read_text()) == list(SECRETS)
    ingest(runs, db, emit=None)
    old = os.environ.get("OBSERVATORY_DB")
    os.environ["OBSERVATORY_DB"] = str(db)
    yield {"runs": runs, "db": db, "tmp": tmp}
    if old is None:
        os.environ.pop("OBSERVATORY_DB", None)
    else:
        os.environ["OBSERVATORY_DB"] = old


def _dump_store(db: Path) -> str:
    """Every value of every column of every table and view, as text."""
    out = []
    with connect(db) as con:
        tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        for t in tables:
            for row in con.execute(f'SELECT * FROM "{t}"').fetchall():
                out.append(repr(row))
    return "\n".join(out)


def _runs(db: Path) -> dict[str, int]:
    with connect(db) as con:
        return dict(con.execute("SELECT run, redactions FROM runs").fetchall())


def test_store_holds_no_secret_and_counts_what_it_hid(world):
    text = _dump_store(world["db"])
    assert leaks(text, ALL) == []
    assert "<redacted>" in text
    runs = _runs(world["db"])
    assert set(runs) >= {RUN, "wandb-leaky", "tb-leaky"}, runs
    # foreign: by key 4 (wandb.api_key, client_secret, db.password, wandb.api_key diff) + patterns
    assert runs[RUN] >= len(SECRETS) - 4
    assert runs["tb-leaky"] == 10  # one name, 10 values
    assert runs["wandb-leaky"] >= 10  # the metric name, at each of 10 steps; the rest the importer hid


def test_rebuild_redacts_a_store_built_before_redaction(world, tmp_path):
    """An old store (secrets in clear, no redactions column) is redacted by `observatory rebuild`."""
    db = tmp_path / "old.duckdb"
    shutil.copy(world["db"], db)
    with write_connection(db) as con:
        con.duckdb.execute(
            'UPDATE runs SET config = \'{"wandb": {"api_key": "' + SECRETS["wandb_hex"] + "\"}}'"
        )
        con.duckdb.execute("ALTER TABLE runs DROP COLUMN redactions")
    assert leaks(_dump_store(db)) == ["wandb_hex"]
    rebuild(world["runs"], db, emit=None)
    assert leaks(_dump_store(db), ALL) == []
    assert _runs(db) == _runs(world["db"])


def test_sql_console_shows_no_secret(world):
    for sql in (
        "SELECT * FROM runs",
        "SELECT * FROM events",
        "SELECT * FROM rejected_events",
        "SELECT DISTINCT name FROM metrics",
        "SELECT * FROM decisions",
    ):
        res = CliRunner().invoke(cli, ["sql", sql, "--db", str(world["db"]), "--format", "json"])
        assert res.exit_code == 0, res.output
        assert leaks(res.output, ALL) == [], sql
    res = CliRunner().invoke(cli, ["sql", "SELECT count(*) FROM rejected_events", "--db", str(world["db"])])
    assert "2" in res.output


def _tree_text(at: AppTest) -> str:
    """Everything AppTest got for the page: every element's proto (text, markdown, json, arrow, plotly spec)."""
    out = []

    def walk(node):
        proto = getattr(node, "proto", None)
        if proto is not None:
            out.append(str(proto))
        for child in getattr(node, "children", {}).values():
            walk(child)

    walk(at._tree)
    return "\n".join(out)


def _page(name: str) -> AppTest:
    return AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=90
    )


PAGES = [
    ("runs", {}),
    ("runs", {"q": "hf_"}),
    ("live", {"run": RUN}),
    ("live", {"run": "wandb-leaky"}),
    ("live", {"run": "tb-leaky"}),
    ("experts", {"run": RUN}),
    ("compare", {"runs": f"{RUN},wandb-leaky"}),
    ("compare", {"runs": "wandb-leaky,tb-leaky"}),
    ("decisions", {"decision": DECISION}),
    ("reports", {"run": RUN}),
    ("reports", {"run": "wandb-leaky"}),
    ("ladder", {}),
    ("sql", {}),
]


@pytest.mark.parametrize("name,query", PAGES, ids=[f"{p}-{'-'.join(q.values()) or 'all'}" for p, q in PAGES])
def test_no_page_shows_a_secret(world, name, query):
    at = _page(name)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception, at.exception
    text = _tree_text(at)
    assert len(text) > 200  # the page rendered something
    assert leaks(text, ALL) == [], name
    if name == "live" and query["run"] == RUN:
        assert redacted_note(_runs(world["db"])[RUN]) in text  # the status line says something was hidden
    if name == "compare" and RUN in query["runs"]:
        assert "were redacted" in text  # the config diff's caption


def test_sql_page_results_show_no_secret(world):
    at = _page("sql")
    at.run()
    for sql in ("SELECT * FROM runs", "SELECT * FROM events", "SELECT * FROM rejected_events"):
        at.text_area(key="sql_text").input(sql)
        at.button[0].click()
        at.run()
        assert not at.exception
        assert at.dataframe, sql
        assert leaks(_tree_text(at), ALL) == [], sql


@pytest.mark.parametrize("fmt", ["html", "md"])
@pytest.mark.parametrize("run", [RUN, "wandb-leaky", "tb-leaky"])
def test_reports_hold_no_secret(world, tmp_path, fmt, run):
    path = report.write(world["db"], run, tmp_path, fmt)
    text = path.read_text(encoding="utf-8")
    assert leaks(text, ALL) == []
    if run == RUN:
        assert redacted_note(_runs(world["db"])[RUN]) in text.replace("\\(", "(").replace("\\)", ")")


def _pdf_text(path: Path) -> str:
    try:
        import pypdf
    except ImportError:
        pypdf = None
    if pypdf is not None:
        return "\n".join(p.extract_text() or "" for p in pypdf.PdfReader(str(path)).pages)
    if shutil.which("pdftotext"):
        return subprocess.run(
            ["pdftotext", str(path), "-"], capture_output=True, text=True, check=True
        ).stdout
    pytest.skip(
        "PDF text check needs pypdf (pip install pypdf) or pdftotext (apt-get install poppler-utils); "
        "the HTML it prints is checked by test_reports_hold_no_secret"
    )


def test_pdf_report_holds_no_secret(world, tmp_path):
    if not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()):
        pytest.skip("PDF reports need chromium (make chromium)")
    path = report.write(world["db"], RUN, tmp_path, "pdf")
    text = _pdf_text(path)
    assert "Post-mortem" in text
    assert leaks(text, ALL) == []


@pytest.mark.parametrize("fmt", ["parquet", "csv", "jsonl"])
@pytest.mark.parametrize("run", [RUN, "wandb-leaky", "tb-leaky"])
def test_exports_hold_no_secret(world, tmp_path, fmt, run):
    import duckdb

    out = tmp_path / f"x.{fmt}"
    res = CliRunner().invoke(
        cli,
        [
            "export",
            run,
            "--format",
            fmt,
            "--out",
            str(out),
            "--db",
            str(world["db"]),
            "--runs-dir",
            str(world["runs"]),
        ],
    )
    assert res.exit_code == 0, res.output
    if fmt == "parquet":
        text = "\n".join(map(repr, duckdb.sql(f"SELECT * FROM read_parquet('{out}')").fetchall()))
    else:
        text = out.read_text(encoding="utf-8")
    assert text.count("\n") > 5
    assert leaks(text, ALL) == []
    if fmt == "jsonl" and run == RUN:
        # the export is still a log ingest accepts: re-importing it gives the same runs row
        runs2, db2 = tmp_path / "runs2", tmp_path / "s2.duckdb"
        (runs2 / RUN).mkdir(parents=True)
        shutil.copy(out, runs2 / RUN / "events.0.jsonl")
        ingest(runs2, db2, emit=None)
        with connect(db2) as con, connect(world["db"]) as con1:
            q = "SELECT name, config, tags FROM runs"
            assert con.execute(q).fetchall() == con1.execute(q + f" WHERE run = '{RUN}'").fetchall()


def test_partitioned_export_holds_no_secret(world, tmp_path):
    import duckdb

    out = tmp_path / "lake"
    res = CliRunner().invoke(cli, ["export", "--partitioned", str(out), "--db", str(world["db"])])
    assert res.exit_code == 0, res.output
    parts = list(out.rglob("*.parquet"))
    assert parts
    text = "\n".join(repr(duckdb.sql(f"SELECT * FROM read_parquet('{p}')").fetchall()) for p in parts)
    assert leaks(text + " ".join(str(p) for p in parts), ALL) == []
