"""Small truths a newcomer checks: the docs' page table names every page; the Runs table shows no column
of "None" for what a W&B script does not log."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import event, write_lines
from streamlit.testing.v1 import AppTest

from observatory.dashboard.pages import PAGES
from observatory.ingest import ingest

ROOT = Path(__file__).resolve().parents[1]


def test_the_dashboard_docs_page_table_names_every_page():
    text = (ROOT / "docs" / "dashboard.md").read_text()
    table = text.split("| page | what it shows |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \|", table, flags=re.M)
    assert [r for r in rows if not r.startswith("---")] == [title for _, title, _, _ in PAGES]


def test_the_runs_table_leaves_out_a_column_no_run_has(tmp_path, monkeypatch):
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    # a W&B script's run: `loss` and `acc`, no tokens, no planned steps (no progress)
    evs = [event("wb", "run_start", {"config": {"lr": 0.1}}, 0, step=0)]
    evs += [event("wb", "metrics", {"loss": 1.0 / s, "acc": 0.5}, s, step=s) for s in range(1, 4)]
    write_lines(runs / "wb" / "events.0.jsonl", evs)
    ingest(runs, db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = AppTest.from_string(
        "from observatory.dashboard.pages import runs\nruns.render()\n", default_timeout=60
    )
    at.run()
    assert not at.exception, at.exception
    df = at.dataframe[0].value
    assert list(df["run"]) == ["wb"] and "tokens" not in df.columns and "progress" not in df.columns
    assert df["last loss"].iloc[0] == 1.0 / 3
    assert not any(v is None for col in df.columns for v in df[col].tolist()), df.to_dict()
