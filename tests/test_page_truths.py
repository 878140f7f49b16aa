"""Small truths a newcomer checks: the docs' page table names every page; the Runs table shows no column
of "None" for what a W&B script does not log."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import event, write_lines
from streamlit.testing.v1 import AppTest

from observatory.dashboard.pages import PAGES
from observatory.pipeline import ingest

ROOT = Path(__file__).resolve().parents[1]


def test_the_dashboard_docs_page_table_names_every_page():
    text = (ROOT / "docs" / "dashboard.md").read_text()
    table = text.split("| page | what it shows |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \|", table, flags=re.M)
    assert [r for r in rows if not r.startswith("---")] == [title for _, title, _, _ in PAGES]


def _runs_table(tmp_path, monkeypatch, logs: dict[str, list[dict]]):
    """The Runs page's table over a store of these runs' event logs."""
    runs, db = tmp_path / "runs", tmp_path / "s.duckdb"
    for run, evs in logs.items():
        write_lines(runs / run / "events.0.jsonl", evs)
    ingest(runs, db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = AppTest.from_string(
        "from observatory.dashboard.pages import runs\nruns.render()\n", default_timeout=60
    )
    at.run()
    assert not at.exception, at.exception
    return at.dataframe[0].value


def test_the_runs_table_leaves_out_a_column_no_run_has(tmp_path, monkeypatch):
    # a W&B script's run: `loss` and `acc`, no tokens, no planned steps (no progress)
    evs = [event("wb", "run_start", {"config": {"lr": 0.1}}, 0, step=0)]
    evs += [event("wb", "metrics", {"loss": 1.0 / s, "acc": 0.5}, s, step=s) for s in range(1, 4)]
    df = _runs_table(tmp_path, monkeypatch, {"wb": evs})
    assert list(df["run"]) == ["wb"] and "tokens" not in df.columns and "progress" not in df.columns
    assert df["last loss"].iloc[0] == 1.0 / 3
    assert not any(v is None for col in df.columns for v in df[col].tolist()), df.to_dict()


def test_a_run_without_tokens_among_runs_with_them_says_dash(tmp_path, monkeypatch):
    wb = [event("wb", "metrics", {"loss": 1.0}, 1, step=1)]
    trained = [event("tr", "metrics", {"train/loss": 2.0, "data/tokens": 2.5e9}, 1, step=1)]
    df = _runs_table(tmp_path, monkeypatch, {"wb": wb, "tr": trained})
    assert dict(zip(df["run"], df["tokens"], strict=True)) == {"wb": "—", "tr": "2.5B"}
