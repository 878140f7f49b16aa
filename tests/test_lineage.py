"""Run lineage: the fork tree from run_start `parent`, and the stitched curve, on a real store."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

import observatory
from observatory import lineage as lin
from observatory.cli import main
from observatory.pipeline import ingest


def _run(runs, run_id, steps, parent=None, offset=0.0):
    with observatory.init(
        run_id=run_id, runs_dir=runs, config={"seed": 0}, parent=parent, install_signal_handlers=False
    ) as r:
        for s in steps:
            r.log({"train/loss": offset + s}, step=s)  # value encodes (run, step): easy to check the stitch


@pytest.fixture
def tree(tmp_path):
    """root (0..59) -> a @20 (21..79) -> b @40 (41..99); root -> c @10 (11..29); lone (0..4)."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    _run(runs, "root", range(60))
    _run(runs, "a", range(21, 80), {"run": "root", "step": 20}, offset=1000)
    _run(runs, "b", range(41, 100), {"run": "a", "step": 40}, offset=2000)
    _run(runs, "c", range(11, 30), {"run": "root", "step": 10}, offset=3000)
    _run(runs, "lone", range(5))
    ingest(runs, db, hooks=False, emit=None)
    return runs, db


def test_chain_tree_and_stitched_curve(tree):
    _, db = tree
    li = lin.lineage(db, "b")
    assert [r["run"] for r in li.chain] == ["root", "a", "b"]
    assert li.root == "root"
    assert {r["run"]: r["depth"] for r in li.tree} == {"root": 0, "a": 1, "c": 1, "b": 2}
    assert li.segments == (("root", 20), ("a", 40), ("b", None))
    steps = [s for _, s, _ in li.curve]
    assert steps == list(range(100))  # one point per step, no overlap, no gap
    for run, step, value in li.curve:
        expect = {"root": 0, "a": 1000, "b": 2000}[run] + step
        assert value == expect
        assert (run == "root") == (step <= 20) and (run == "b") == (step > 40)
    assert [r["run"] for r in lin.lineage(db, "root").children] == ["a", "c"]


def test_single_run_and_unknown_run(tree):
    _, db = tree
    li = lin.lineage(db, "lone")
    assert [r["run"] for r in li.chain] == ["lone"] and len(li.tree) == 1 and len(li.curve) == 5
    with pytest.raises(ValueError, match="no run 'ghost'"):
        lin.lineage(db, "ghost")


def test_parent_cycle_terminates(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    _run(runs, "x", range(3), {"run": "y", "step": 1})
    _run(runs, "y", range(3), {"run": "x", "step": 1})
    ingest(runs, db, hooks=False, emit=None)
    li = lin.lineage(db, "x")  # bad data must not hang
    assert li.chain[-1]["run"] == "x"


def test_lineage_cli(tree):
    _, db = tree
    res = CliRunner().invoke(main, ["lineage", "b", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["root"] == "root" and [s["run"] for s in out["segments"]] == ["root", "a", "b"]
    assert len(out["curve"]) == 100
    text = CliRunner().invoke(main, ["lineage", "b", "--db", str(db)]).output
    assert "<- this run" in text and "b @40" in text and "c @10" in text
    bad = CliRunner().invoke(main, ["lineage", "ghost", "--db", str(db)])
    assert bad.exit_code != 0 and "no run 'ghost'" in bad.output
