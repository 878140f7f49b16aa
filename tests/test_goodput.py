"""Goodput: where a run's wall time went, from process 0's phases and steps (the `goodput` views)."""

from __future__ import annotations

import duckdb
import pytest
from conftest import write_lines

from observatory.pipeline import ingest

T = 1_700_000_000.0


def _story(run: str = "g") -> list[dict]:
    """init 10 s, compile 20 s, 100 steps of 1 s with a 5 s checkpoint after step 50; the process dies after
    step 100 and comes back 60 s later (attempt 1) from the step-50 checkpoint: init 10 s, compile 20 s,
    steps 51-150 again at 1 s, one of them stalled 30 s more; run_end."""
    evs: list[dict] = []

    def ev(kind, data, step, t):
        evs.append(
            {"v": 1, "run": run, "kind": kind, "step": step, "t": t, "host": 0, "seq": len(evs), "data": data}
        )

    ev("run_start", {}, 0, T)
    ev("phase", {"phase": "init", "attempt": 0}, None, T)
    ev("phase", {"phase": "compile", "attempt": 0}, None, T + 10)
    t = T + 30
    for s in range(1, 101):
        t += 1
        ev("metrics", {"train/loss": 3.0, "opt/lr": 1e-3}, s, t)
        if s == 50:
            ev("phase", {"phase": "checkpoint", "attempt": 0}, s, t)
            t += 5
            ev("phase", {"phase": "train", "attempt": 0}, s, t)
    t += 60
    ev("phase", {"phase": "init", "attempt": 1}, None, t)
    t += 10
    ev("phase", {"phase": "compile", "attempt": 1}, None, t)
    t += 20
    for s in range(51, 151):
        t += 1
        ev("metrics", {"train/loss": 3.0}, s, t)
        if s == 120:
            t += 30
    ev("run_end", {"status": "completed", "final_step": 150}, 150, t)
    return evs


def test_goodput_splits_a_preempted_run_by_what_its_time_went_to(runs_dir, db_path):
    write_lines(runs_dir / "g" / "events.0.jsonl", _story())
    write_lines(
        runs_dir / "g" / "events.1.jsonl", [{**e, "host": 1} for e in _story() if e["kind"] != "run_start"]
    )
    ingest(runs_dir, db_path, emit=None)
    with duckdb.connect(str(db_path), read_only=True) as con:
        row = con.execute("SELECT * FROM goodput WHERE run = 'g'").fetchdf().iloc[0].to_dict()
        per_attempt = con.execute(
            "SELECT attempt, category, sum(seconds) FROM goodput_segments WHERE run = 'g' GROUP BY ALL ORDER BY ALL"
        ).fetchall()
    # the first step after each compile is the compile's (it holds the jit): 1 s of each attempt
    expect = {
        "init_s": 20,
        "compile_s": 42,
        "checkpoint_s": 5,
        "down_s": 60,
        "stall_s": 31,
        "redone_s": 49,
        "productive_s": 99 + 49,
        "eval_s": 0,
        "other_s": 0,
    }
    assert {k: row[k] for k in expect} == pytest.approx(expect)
    assert row["total_s"] == pytest.approx(sum(expect.values())) and row["attempts"] == 2
    assert row["goodput"] == pytest.approx(148 / 355)
    assert (1, "redone", 49.0) in per_attempt and (0, "down", 60.0) in per_attempt


def test_a_run_without_phases_counts_its_start_as_init_and_its_steps_as_productive(runs_dir, db_path):
    evs = [e for e in _story("plain") if e["kind"] != "phase" and e["t"] <= T + 135]  # attempt 0, no phases
    write_lines(runs_dir / "plain" / "events.0.jsonl", evs)
    ingest(runs_dir, db_path, emit=None)
    with duckdb.connect(str(db_path), read_only=True) as con:
        row = con.execute("SELECT * FROM goodput WHERE run = 'plain'").fetchdf().iloc[0].to_dict()
    assert row["init_s"] == pytest.approx(31) and row["attempts"] == 1  # start to the first logged step
    # the 5 s save without its phase is step 51's time (6 s: under 10x the median step, not a stall)
    assert (
        row["productive_s"] == pytest.approx(99 + 5)
        and row["stall_s"] == 0
        and row["total_s"] == pytest.approx(135)
    )


def test_the_report_and_the_cli_say_the_goodput(runs_dir, db_path, tmp_path):
    from click.testing import CliRunner

    from observatory.cli import main
    from observatory.report import build

    write_lines(runs_dir / "g" / "events.0.jsonl", _story())
    ingest(runs_dir, db_path, emit=None)
    rows = dict(build(db_path, "g").summary)
    assert rows["goodput"].startswith(
        "41.7% of 5.9 min productive; lost: down 60 s, redone 49 s, compile 42 s"
    )
    assert rows["goodput"].endswith("2 attempt(s)")
    out = CliRunner().invoke(main, ["goodput", "g", "--db", str(db_path), "--runs-dir", str(runs_dir)])
    assert out.exit_code == 0 and "g  41.7% of 5.9 min productive" in out.output
