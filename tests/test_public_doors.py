"""Smaller doors (issue 55, class 6): CSV formula cells, terminal escapes in names `ingest` prints."""

from __future__ import annotations

import csv
import io
import os
import sys

import polars as pl
import pytest
from click.testing import CliRunner
from conftest import event, write_lines

from observatory.markup import csv_cell

FORMULAS = ["=cmd|' /C calc'!A0", "+1+1", "-2+3", "@SUM(A1)", "\t=1", "\r=1"]


def test_the_sql_pages_csv_prefixes_formula_cells():
    """Fails before the fix: `=cmd|…` went into the download as is."""
    from observatory.dashboard.pages.sql import csv_text

    frame = pl.DataFrame({"name": [*FORMULAS, "ok", None], "n": list(range(len(FORMULAS) + 2))})
    rows = list(csv.reader(io.StringIO(csv_text(frame))))[1:]
    assert [r[0] for r in rows] == [*("'" + f for f in FORMULAS), "ok", ""]
    assert [r[1] for r in rows] == [str(i) for i in range(len(FORMULAS) + 2)]


@pytest.mark.slow  # (several seconds: an ingest with its analyses)
def test_export_csv_prefixes_formula_metric_names(tmp_path):
    from observatory.interop.export import export_run
    from observatory.pipeline import ingest

    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    lines = [event("r", "run_start", {"config": {}}, 0, step=0)]
    lines += [event("r", "metrics", {f: 1.0 for f in FORMULAS[:4]} | {"loss": 2.0}, 1, step=1)]
    write_lines(runs / "r" / "events.0.jsonl", lines)
    ingest(runs, db, emit=None)
    out = tmp_path / "r.csv"
    export_run("r", "csv", out, runs_dir=runs, db=db)
    names = {row["name"] for row in csv.DictReader(out.open())}
    assert names == {csv_cell(f) for f in FORMULAS[:4]} | {"loss"}
    assert all(not n.startswith(("=", "+", "-", "@")) for n in names)


@pytest.mark.skipif(sys.platform == "win32", reason="control characters in file names")
def test_ingest_prints_no_terminal_escape_from_a_folder_name(tmp_path):
    """Fails before the fix: a folder named with an escape sequence (a window title, a cleared screen) was
    printed raw by `observatory ingest`."""
    from observatory.cli import main as cli

    runs = tmp_path / "runs"
    evil = "x\x1b]0;pwned\x07\x1b[2J\u202e"
    write_lines(runs / "r" / "events.0.jsonl", [event("r", "run_start", {"config": {}}, 0)])
    (runs / evil).mkdir()
    os.symlink(runs / "r", runs / f"{evil}-link")  # said by ingest: a linked run folder is not read
    res = CliRunner().invoke(cli, ["ingest", "--runs-dir", str(runs), "--db", str(tmp_path / "s.duckdb")])
    assert res.exit_code == 1, res.output  # the linked folder is not stored, and ingest says so
    out = res.output + (res.stderr if res.stderr_bytes is not None else "")
    assert "symbolic link" in out and "\\x1b]0;pwned\\x07" in out
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out


def test_a_3000_word_search_matches_a_bounded_number_of_words(tmp_path):
    """Fails before the fix: each of 3,000 words was a LIKE over every run (5 s of CPU a view)."""
    from observatory.pipeline import ingest
    from observatory.queries import core
    from observatory.store import using

    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    write_lines(runs / "alpha-1" / "events.0.jsonl", [event("alpha-1", "run_start", {"config": {}}, 0)])
    ingest(runs, db, emit=None)
    text = "alpha " + " ".join(f"w{i:04d}" + "x" * 500 for i in range(3000))
    sql, params = core._run_filter(text, None, (), ())
    words = [k for k in params if k.startswith("w") and k[1:].isdigit()]
    assert len(words) == core.SEARCH_WORDS and all(len(params[k]) <= core.SEARCH_WORD_CHARS for k in words)
    assert len(params["raw"]) <= core.SEARCH_TEXT_CHARS
    assert sql.count(" contains(") == core.SEARCH_WORDS
    with using(db) as con:
        assert core.count_runs(con, "alpha", None, (), (), (), ()) == 1
        assert core.count_runs(con, text, None, (), (), (), ()) == 0  # still an AND of the words it matches


def test_a_metrics_scrape_reads_the_open_alerts_once_not_once_per_run(tmp_path, monkeypatch):
    """Fails before the fix: each run's count was a pass over every open alert (quadratic: 22 s at 8k runs).
    The open alerts are a dict that counts its passes; a scrape of 300 live runs makes one."""
    from prometheus_client import CollectorRegistry, generate_latest

    from observatory.alerts import prometheus
    from observatory.pipeline import ingest

    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    for i in range(300):
        run = f"r{i}"
        write_lines(
            runs / run / "events.0.jsonl",
            [event(run, "run_start", {"config": {}}, 0), event(run, "metrics", {"loss": 1.0}, 1, step=1)],
        )
    ingest(runs, db, emit=None)

    class Counted(dict):
        passes = 0

        def items(self):
            type(self).passes += 1
            return super().items()

    opened = Counted({(f"r{i}", "findings", None, "d", "m"): {"severity": "critical"} for i in range(300)})
    monkeypatch.setattr(prometheus, "open_alerts", lambda con, runs: opened)
    reg = CollectorRegistry(auto_describe=False)
    reg.register(prometheus.RunHealth(db))
    text = generate_latest(reg).decode()
    assert Counted.passes == 1
    assert 'observatory_run_open_alerts{project="",run="r7",severity="critical"} 1.0' in text


def test_the_html_reports_figures_carry_no_live_link_from_a_failure_message(tmp_path):
    """Fails before the fix: a failure window's title (the failure's message) went to plotly as is, and
    plotly draws `<a href>` there as a live link (in the HTML report and the PDF printed from it)."""
    from observatory import report
    from observatory.pipeline import ingest

    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    link = '<a href="https://evil.example/reset">Reset your password</a>'
    lines = [event("r", "run_start", {"config": {}}, 0, step=0)]
    lines += [event("r", "metrics", {f"loss{link}": 3.0 - i / 100}, i + 1, step=i) for i in range(40)]
    lines.append(
        event("r", "failure", {"type": "exception", "message": f"boom {link}", "action": "halt"}, 41, step=39)
    )
    lines.append(event("r", "run_end", {"status": "failed", "final_step": 39}, 42, step=39))
    write_lines(runs / "r" / "events.0.jsonl", lines)
    ingest(runs, db, emit=None)
    html = report.render_html(report.build(db, "r"))
    assert "evil.example" in html  # the text is there, as text
    assert '<a href="https://evil' not in html and '<a href=\\"https://evil' not in html
    assert "\\u003ca href" not in html.lower() and "u003ca href" not in html.lower()
