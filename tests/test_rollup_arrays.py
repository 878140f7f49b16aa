"""A catch-up's rollups made from its rows as arrays (`store.metric_cells`, `store.expert_cells`) equal
DuckDB's recount.

Real writer, real ingest with its hooks, real DuckDB files; the reference is `rollups.rebuild_rollups`
on a copy of the store (every rollup recounted from `metrics` by SQL). Every batch is made a catch-up
(`ROLL_UP_APART_BELOW = 0`), whose rollups run in its own transaction, where the arrays are passed.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import recounted_copy

import observatory
from observatory.ingest import ingest, msgspec_lines, passes
from observatory.store import connect, expert_cells, metric_cells, schema

TABLES = (*schema.METRIC_TABLES, *schema.EXPERT_TABLES)


def _r(v):
    return float(f"{v:.12g}") if isinstance(v, float) and math.isfinite(v) else v  # sums' order differs


def snapshot(db) -> dict[str, list]:
    with connect(db) as con:
        return {t: sorted(repr(tuple(map(_r, row))) for row in con.execute(f"SELECT * FROM {t}").fetchall())
                for t in TABLES}  # fmt: skip


def recounted(db, tmp_path) -> dict[str, list]:
    copy = recounted_copy(db, tmp_path)
    out = snapshot(copy)
    copy.unlink()
    return out


def _spy(monkeypatch, module, note) -> list:
    """What each call of `module.roll_up` gave (`note(result, firsts)` appended), the call left as it was."""
    used: list = []
    real = module.roll_up

    def spy(con, rows, firsts):
        got = real(con, rows, firsts)
        used.extend(note(got, firsts))
        return got

    monkeypatch.setattr(module, "roll_up", spy)
    return used


@pytest.fixture
def paths(tmp_path, monkeypatch):
    monkeypatch.setattr(passes, "ROLL_UP_APART_BELOW", 0)  # every batch rolls up inside its transaction
    # one True a call of metric_cells.roll_up
    return tmp_path / "runs", tmp_path / "store.duckdb", _spy(monkeypatch, metric_cells, lambda got, firsts: [True])


@pytest.fixture
def expert_paths(paths, monkeypatch):
    return *paths[:2], _spy(monkeypatch, expert_cells, lambda got, firsts: sorted(firsts))


def _log(run, steps, k=0.0, extra=None):
    for s in steps:
        run.log({"train/loss": 3.0 - s / 1000 + k, "train/grad_norm": 1.0 + (s % 7) / 10 + k, **(extra or {})}, step=s)
    run.flush()


def test_two_catch_ups_sharing_a_bucket_with_a_replay_and_a_nan(paths, tmp_path):
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    b = observatory.init(run_id="run-b", runs_dir=runs, install_signal_handlers=False)
    _log(a, range(0, 101))  # ends inside bucket 12 (steps 96..103)
    _log(b, range(0, 13))
    ingest(runs, db, emit=None)
    assert used == [True]
    assert snapshot(db) == recounted(db, tmp_path)

    # next: run-a goes on in the shared bucket, logs steps 40..63 again (a rollback: ties at each step),
    # a new name, and a NaN (a line the vectorised path leaves to `_check_line`); run-b goes on too
    _log(a, range(101, 120), extra={"eval/loss": 2.5})
    _log(a, range(40, 64), k=0.5)  # to bucket 7's last step, 63
    a.log({"train/loss": float("nan")}, step=64)
    _log(b, range(13, 40))
    a.flush()
    ingest(runs, db, emit=None)
    assert used == [True, True]
    got = snapshot(db)
    assert got == recounted(db, tmp_path)
    with connect(db) as con:
        assert con.execute("SELECT n_nonfinite FROM metrics_r8 WHERE run = 'run-a' AND name = 'train/loss' "
                           "AND bucket = 8").fetchall() == [(1,)]  # fmt: skip
        # a tie at the bucket's last step: the row stored first wins, as in DuckDB's recount (not the replay)
        assert con.execute("SELECT last FROM metrics_r8 WHERE run = 'run-a' AND name = 'train/grad_norm' "
                           "AND bucket = 7").fetchall() == [(1.0 + (63 % 7) / 10,)]  # fmt: skip
        assert con.execute("SELECT n, first_step, last_step FROM metric_series WHERE run = 'run-a' "
                           "AND name = 'train/loss'").fetchall() == [(101 + 19 + 24 + 1, 0, 119)]  # fmt: skip


def test_a_name_only_the_store_has_in_the_shared_bucket(paths, tmp_path):
    """The store's cells in the bucket the new rows reach into hold a name the new rows lack (an eval at the
    tail's step): folded in at every level, and `metric_series` gets the new rows' names."""
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _log(a, range(0, 100))
    a.log({"eval/loss": 2.0}, step=100)
    a.flush()
    ingest(runs, db, emit=None)
    _log(a, range(101, 104))  # metrics_r8 bucket 12 (steps 96..103), which eval/loss's step 100 is in
    msgspec_lines._LAYOUTS.clear()  # as in a new `observatory ingest` process: the run's layout is learnt anew
    ingest(runs, db, emit=None)
    assert used == [True, True]
    assert snapshot(db) == recounted(db, tmp_path)


def test_coarser_levels_across_their_buckets_and_a_rollback(paths, tmp_path):
    """metrics_r64 and metrics_r512 made from the cells: the second catch-up starts inside a bucket of each
    (the store's part of it folded in first), then replays steps of an earlier r512 bucket."""
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _log(a, range(0, 1100))  # into r512 bucket 2 and r64 bucket 17 (steps 1088..1151)
    ingest(runs, db, emit=None)
    _log(a, range(1100, 1700))
    _log(a, range(700, 760), k=0.25)  # a rollback into r512 bucket 1
    ingest(runs, db, emit=None)
    assert used == [True, True]
    assert snapshot(db) == recounted(db, tmp_path)
    with connect(db) as con:
        assert con.execute("SELECT count(*) FROM metrics_r512 WHERE run = 'run-a'").fetchall() == [(2 * 4,)]
        assert con.execute("SELECT n, first_step, last_step FROM metrics_r64 WHERE run = 'run-a' "
                           "AND name = 'train/loss' AND bucket = 11").fetchall() == [(64 + 56, 704, 767)]  # fmt: skip


def test_rows_the_arrays_do_not_cover_take_the_sql_recount(paths, tmp_path, monkeypatch):
    """Rows the SQL path inserted, and a secret-shaped name renamed in the store, leave the arrays out."""
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _log(a, range(0, 30))
    monkeypatch.setattr(msgspec_lines, "ENABLED", False)  # the SQL path inserts every row itself
    ingest(runs, db, emit=None)
    assert used == []  # no arrays to use: the counts past the watermark are not theirs
    assert snapshot(db) == recounted(db, tmp_path)

    monkeypatch.setattr(msgspec_lines, "ENABLED", True)
    _log(a, range(30, 50), extra={"key=sk-live-abcdefghijklmnopqrstuvwx": 1.0})
    ingest(runs, db, emit=None)
    assert used == []  # the name was renamed after the arrays were made
    assert snapshot(db) == recounted(db, tmp_path)
    with connect(db) as con:
        names = [r[0] for r in con.execute("SELECT name FROM metric_series").fetchall()]
    assert len(names) == 3 and not any("sk-live" in n for n in names)


def test_steps_far_apart_a_sparse_grid_and_a_wide_layout(paths, tmp_path):
    """Buckets far apart, names each at a step of its own (a dense (bucket, name) grid would be far bigger
    than the rows: the keys are sorted instead), and a layout of 400 names of which the rows use two."""
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _log(a, [0, 1, 10**9, 2 * 10**12])
    ingest(runs, db, emit=None)
    for i in range(300):
        a.log({f"probe/{i}": float(i)}, step=2 * 10**12 + 8 * (i + 1))
    a.flush()
    ingest(runs, db, emit=None)
    assert used == [True, True]
    assert snapshot(db) == recounted(db, tmp_path)
    a.log({f"layer/{i}": float(i) for i in range(400)}, step=3 * 10**12)
    a.flush()
    ingest(runs, db, emit=None)
    _log(a, range(3 * 10**12 + 8, 3 * 10**12 + 8 * 300, 8))  # decoded into the run's 700-name layout
    ingest(runs, db, emit=None)
    assert used == [True] * 4
    assert snapshot(db) == recounted(db, tmp_path)


def _load(run, steps, layers=3, experts=6, k=0):
    for s in steps:
        for layer in range(layers):
            routed = [(s * 7 + layer * 3 + e * 5 + k) % 50 + (900 if e == 2 and layer == 1 else 0) for e in range(experts)]
            run.log_expert_load(s, layer, routed, [r // 10 for r in routed])
    run.flush()


def test_expert_rollups_from_arrays_over_a_shared_bucket_a_replay_and_an_odd_line(expert_paths, tmp_path):
    runs, db, used = expert_paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    b = observatory.init(run_id="run-b", runs_dir=runs, install_signal_handlers=False)
    _load(a, range(0, 21))  # ends inside bucket 1 (steps 16..31)
    _load(b, range(0, 5), layers=2, experts=4)
    ingest(runs, db, emit=None)
    assert used == ["run-a", "run-b"]
    assert snapshot(db) == recounted(db, tmp_path)
    # run-a goes on in the shared bucket, then logs steps 10..24 again (a rollback), with one layer's
    # list written with spaces (left to `_check_line`, whose rows come as Python lists)
    _load(a, range(21, 40))
    _load(a, range(10, 25), k=3)
    path = runs / "run-a" / "events.0.jsonl"
    with open(path, "a") as f:
        seq = sum(1 for _ in open(path))
        f.write(json.dumps({"v": 1, "kind": "expert_load", "run": "run-a", "t": 1e9, "host": 0, "seq": seq + 10**6,
                            "step": 40, "data": {"layer": 0, "routed": [1, 2, 3], "dropped": [0, 0, 1]}},
                           separators=(", ", ": ")) + "\n")  # fmt: skip
    ingest(runs, db, emit=None)
    assert used == ["run-a", "run-b", "run-a"]
    assert snapshot(db) == recounted(db, tmp_path)
    with connect(db) as con:
        # a replayed step's rows are counted twice, as DuckDB's own recount does
        assert con.execute("SELECT n_experts FROM expert_layer_step WHERE run = 'run-a' AND layer = 0 AND step = 12"
                           ).fetchall() == [(12,)]  # fmt: skip
        assert con.execute("SELECT routed, n_experts FROM expert_layer_step WHERE run = 'run-a' AND step = 40"
                           ).fetchall() == [(6, 3)]  # fmt: skip


def test_expert_rows_inserted_by_sql_take_the_sql_recount(expert_paths, tmp_path, monkeypatch):
    runs, db, used = expert_paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _load(a, range(0, 30))
    monkeypatch.setattr(msgspec_lines, "ENABLED", False)
    ingest(runs, db, emit=None)
    assert used == []
    assert snapshot(db) == recounted(db, tmp_path)


def test_rows_an_earlier_call_left_without_rollups_are_counted_once(paths, tmp_path):
    """Rows committed without their rollups (hooks off here; a kill between a batch and its rollups is
    the same) are past the watermark beside the next batch's own: its arrays are not all of them, so
    that batch is recounted from the store; the one after uses its arrays again."""
    runs, db, used = paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _log(a, range(0, 45))
    ingest(runs, db, hooks=False, emit=None)
    _log(a, range(45, 90))
    ingest(runs, db, emit=None)
    assert used == []
    assert snapshot(db) == recounted(db, tmp_path)
    _log(a, range(90, 100))
    ingest(runs, db, emit=None)
    assert used == [True]
    assert snapshot(db) == recounted(db, tmp_path)
    with connect(db) as con:
        assert con.execute("SELECT n FROM metric_series WHERE name = 'train/loss'").fetchall() == [(100,)]


def test_expert_load_logged_every_few_steps_is_left_to_sql(expert_paths, tmp_path):
    """A big part whose 16-step cells hold 1-2 rows each (load logged every 10 steps) keeps no cells: as many
    as its rows, they cost more to keep and fold than DuckDB's GROUP BY. Logged every step, it keeps them."""
    runs, db, used = expert_paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _load(a, range(0, 300, 10), layers=40, experts=64)  # 76,800 rows over 19 buckets: 48,640 cells
    ingest(runs, db, emit=None)
    assert used == []
    assert snapshot(db) == recounted(db, tmp_path)
    _load(a, range(300, 330), layers=40, experts=64)  # 76,800 rows in 5,120 cells
    ingest(runs, db, emit=None)
    assert used == ["run-a"]
    assert snapshot(db) == recounted(db, tmp_path)


def test_expert_load_at_steps_far_apart(expert_paths, tmp_path):
    """Steps 10^6 apart in one part: a dense (layer, step, expert) grid would be far bigger than the rows, so
    the distinct keys are found by sorting; each is one cell, as in DuckDB's recount."""
    runs, db, used = expert_paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _load(a, [0, 1, 10**6, 10**6 + 1, 2 * 10**6])
    ingest(runs, db, emit=None)
    assert used == ["run-a"]
    assert snapshot(db) == recounted(db, tmp_path)


def test_a_big_piece_of_a_few_steps_at_a_bucket_edge_keeps_its_cells(expert_paths, tmp_path):
    """48 x 384 experts at steps 14..17: 73,728 rows in two 16-step buckets, 2 rows to a cell, but every step
    logged: the arrays are used (how densely steps are logged decides, not rows per cell)."""
    runs, db, used = expert_paths
    a = observatory.init(run_id="run-a", runs_dir=runs, install_signal_handlers=False)
    _load(a, range(14, 18), layers=48, experts=384)
    ingest(runs, db, emit=None)
    assert used == ["run-a"]
    assert snapshot(db) == recounted(db, tmp_path)
