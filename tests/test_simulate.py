"""`observatory simulate`: the reference run's shape, its incidents, determinism, hosts, clean ingest."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from observatory.cli import main as cli
from observatory.interop.eventlog import decimal_rows
from observatory.interop.simulate import LAW, PRESETS, STEP_SCALARS, eval_steps, metric_names, simulate
from observatory.pipeline import ingest
from observatory.store import connect

STEPS = 80  # 535b: spike 26, NaN 37 (rollback to 36), preemption 50, fork at 56


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_bytes().splitlines()]


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    runs = tmp_path_factory.mktemp("sim535") / "runs"
    res = simulate("535b", runs, steps=STEPS, expert_load_every=4, hosts=3)
    return runs, res, _events(runs / "sim-535b" / "events.0.jsonl")


def _kind(evs, kind):
    return [e for e in evs if e["kind"] == kind]


def test_run_start_has_the_reference_shape(big):
    _, _, evs = big
    start = evs[0]
    assert start["kind"] == "run_start" and start["seq"] == 0
    d = start["data"]
    m = d["config"]["model"]
    assert (
        m["d_model"],
        m["n_layers"],
        m["n_routed"],
        m["d_expert"],
        m["top_k"],
        m["n_shared"],
        m["seq_len"],
    ) == (
        6144,
        48,
        384,
        3072,
        8,
        2,
        4096,
    )
    assert d["mesh"] == {"data": 11, "expert": 64, "processes": 3, "devices": 704}
    assert d["model"]["params_total"] == 535_000_000_000 and d["model"]["params_active"] == 23_000_000_000
    assert d["model"]["flops_per_token"] > 6 * 23e9
    assert d["source"]["trainer"] == "observatory-simulate"
    assert "simulated" in d["tags"]


def test_expert_load_covers_every_layer_and_expert_with_realistic_drops(big):
    _, _, evs = big
    loads = _kind(evs, "expert_load")
    steps = sorted({e["step"] for e in loads})
    assert steps[:3] == [4, 8, 12]
    at = [e for e in loads if e["step"] == 40]
    assert sorted(e["data"]["layer"] for e in at) == list(range(48))
    tokens = 4096 * 4096 * 8  # global batch x seq x top-8: assignments per layer per step
    routed = np.array([e["data"]["routed"] for e in at])
    dropped = np.array([e["data"]["dropped"] for e in at])
    assert routed.shape == dropped.shape == (48, 384)
    assert (routed.sum(axis=1) == tokens).all()
    assert (dropped <= routed).all() and routed.min() > 0
    frac = dropped.sum() / routed.sum()
    assert 0.03 <= frac <= 0.07, frac
    # the metric agrees with the counts at a step that logs them
    metrics = next(e for e in _kind(evs, "metrics") if e["step"] == 40)["data"]
    assert metrics["moe/drop_fraction"] == pytest.approx(frac, rel=1e-9)
    assert metrics["moe/layer_20/drop_fraction"] == pytest.approx(
        dropped[20].sum() / routed[20].sum(), rel=1e-9
    )


def test_about_sixty_scalars_per_step_with_our_names(big):
    _, _, evs = big
    names = set().union(*(e["data"] for e in _kind(evs, "metrics")))
    assert names == set(metric_names(PRESETS["535b"]))
    assert 55 <= len(names) <= 65
    for n in (
        *STEP_SCALARS,
        "grad/norm/total",
        "grad/norm/layers",
        "opt/lr",
        "opt/update_norm",
        "throughput/tokens_per_s",
        "throughput/mfu",
        "data/tokens",
        "router/layer_45/entropy",
        "moe/layer_0/drop_fraction",
    ):
        assert n in names


def test_evals_and_checkpoints_every_five_percent(big):
    _, _, evs = big
    assert sorted({e["step"] for e in _kind(evs, "eval")}) == eval_steps(STEPS) == list(range(4, 81, 4))
    assert {e["step"] for e in _kind(evs, "checkpoint")} >= set(eval_steps(STEPS))


def test_every_incident_of_the_story_is_there(big):
    runs, res, evs = big
    assert res.runs == ["sim-535b", "sim-535b-fork"]
    (failure,) = _kind(evs, "failure")
    assert failure["data"]["type"] == "nan_loss" and failure["data"]["action"] == "rollback"
    nan_step = failure["step"]
    nan_metrics = [e for e in _kind(evs, "metrics") if e["step"] == nan_step]
    assert nan_metrics[0]["data"]["train/loss"] == "nan"  # and the replay of that step is finite
    notes = [e["data"]["text"] for e in _kind(evs, "note")]
    assert any(t.startswith("rolled back to step") for t in notes)
    assert any(t.startswith("resumed from checkpoint") for t in notes)
    ends = [e["data"]["status"] for e in _kind(evs, "run_end")]
    assert ends == ["preempted", "completed"]
    # the run goes on in the same file after its preemption
    pre = next(i for i, e in enumerate(evs) if e["kind"] == "run_end")
    assert any(e["kind"] == "metrics" for e in evs[pre:])
    # the fork: parent and config_diff
    fork = _events(runs / "sim-535b-fork" / "events.0.jsonl")
    assert fork[0]["data"]["parent"] == {"run": "sim-535b", "step": 56}
    (diff,) = _kind(fork, "config_diff")
    assert diff["data"]["against"] == {"run": "sim-535b", "step": 56}
    assert list(diff["data"]["changes"]) == ["optimizer.lr"]
    # the spike: grad norm up 3 steps before the loss
    series = {}
    for e in _kind(evs, "metrics"):
        series.setdefault(e["step"], e["data"])  # the first time each step was logged
    spike = round(0.32 * STEPS)
    grad = {s: d["grad/norm/total"] for s, d in series.items() if isinstance(d["grad/norm/total"], float)}
    loss = {s: d["train/loss"] for s, d in series.items() if isinstance(d["train/loss"], float)}
    base_g = np.median([grad[s] for s in range(spike - 15, spike - 3)])
    base_l = np.median([loss[s] for s in range(spike - 15, spike - 3)])
    assert grad[spike - 3] > 4 * base_g and loss[spike - 3] < 1.02 * base_l
    assert loss[spike + 3] > 2 * base_l
    # the hot expert: one expert of layer 20 takes a growing share
    loads = [e for e in _kind(evs, "expert_load") if e["data"]["layer"] == 20]
    first, last = np.array(loads[0]["data"]["routed"]), np.array(loads[-1]["data"]["routed"])
    hot = int(last.argmax())
    assert last[hot] / last.mean() > 6 and first[hot] / first.mean() < 2


def test_hosts_write_their_own_files(big):
    runs, _, _ = big
    for h in (1, 2):
        evs = _events(runs / "sim-535b" / f"events.{h}.jsonl")
        assert {e["kind"] for e in evs} == {"metrics", "failure", "run_end"}
        assert all(e["host"] == h for e in evs) and [e["seq"] for e in evs] == list(range(len(evs)))
        assert all(
            set(e["data"]) == {"throughput/tokens_per_s", "throughput/step_time_s", "throughput/mfu"}
            for e in _kind(evs, "metrics")
        )
    assert sorted(p.name for p in (runs / "sim-535b").iterdir()) == [f"events.{h}.jsonl" for h in range(3)]


def test_same_seed_same_bytes(tmp_path):
    a = simulate("tiny", tmp_path / "a", steps=60, hosts=2, seed=7)
    b = simulate("tiny", tmp_path / "b", steps=60, hosts=2, seed=7)
    c = simulate("tiny", tmp_path / "c", steps=60, hosts=2, seed=8)
    assert len(a.files) == 4
    for (pa, _, _), (pb, _, _), (pc, _, _) in zip(a.files, b.files, c.files, strict=True):
        assert pa.read_bytes() == pb.read_bytes()
        assert pa.read_bytes() != pc.read_bytes()
    again = simulate("tiny", tmp_path / "a", steps=60, hosts=2, seed=7)
    assert {s for _, s, _ in again.files} == {"unchanged"}
    other = simulate("tiny", tmp_path / "a", steps=60, hosts=2, seed=8)
    assert {s for _, s, _ in other.files} == {"conflict"} and other.conflicts
    assert pa.read_bytes() == pb.read_bytes()  # left alone
    assert {
        s for _, s, _ in simulate("tiny", tmp_path / "a", steps=60, hosts=2, seed=8, replace=True).files
    } == {"replaced"}
    assert not list((tmp_path / "a").rglob("*.partial"))


def test_lines_are_what_json_dumps_writes(tmp_path):
    res = simulate("tiny", tmp_path, steps=60)
    for path, _, _ in res.files:
        for line in path.read_bytes().splitlines():
            assert json.dumps(json.loads(line), separators=(",", ":"), allow_nan=False).encode() == line


def test_decimal_rows():
    a = np.array([[0, 9, 10, 99, 100], [10**9, 4294967295, 999_999_999, 1, 123456789], [1, 2, 3, 4, 5]])
    for rows in (a, a[2:], a[:, :1], np.zeros((2, 3), np.int64)):
        assert decimal_rows(rows) == [
            json.dumps(r, separators=(",", ":"))[1:-1].encode() for r in rows.tolist()
        ]
    with pytest.raises(ValueError):
        decimal_rows(np.array([[1 << 32]]))
    with pytest.raises(ValueError):
        decimal_rows(np.array([[-1]]))


def test_ingests_cleanly_and_the_detectors_find_what_was_planted(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    steps = 120
    simulate("tiny", runs, steps=steps, hosts=2)
    rep = ingest(runs, db, emit=None)
    assert rep.rejected == 0 and rep.truncated == 0
    with connect(db) as con:
        assert con.execute("SELECT count(*) FROM rejected_events").fetchall()[0][0] == 0
        status = dict(con.execute("SELECT run, status FROM runs").fetchall())
        assert status == {"sim-tiny": "completed", "sim-tiny-fork": "completed"}
        assert con.execute("SELECT parent_run FROM runs WHERE run = 'sim-tiny-fork'").fetchall() == [
            ("sim-tiny",)
        ]
        found = con.execute(
            "SELECT data->>'detector', data->>'metric', data->'window'->>0, data->'window'->>1 "
            "FROM events WHERE kind = 'anomaly' AND run = 'sim-tiny'"
        ).fetchall()
    found = [(d, m, int(a), int(b)) for d, m, a, b in found]
    spike, nan = round(0.32 * steps), round(0.46 * steps)
    by = {d: (m, a, b) for d, m, a, b in found}
    assert "loss_spike" in by and abs(by["loss_spike"][1] - spike) <= 1, found
    assert "grad_spike" in by and by["grad_spike"][1] <= by["loss_spike"][1] - 2, found  # the precursor leads
    assert "nonfinite" in by and by["nonfinite"][1] == nan, found
    assert by["hot_expert"][0] == "expert_load/layer_2", found


def test_535b_ingests_cleanly(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    res = simulate("535b", runs, steps=60, expert_load_every=20, hosts=2)
    rep = ingest(runs, db, hooks=False, emit=None)
    assert rep.rejected == 0
    assert rep.expert_rows == res.expert_rows == 48 * 384 * (3 + 1)  # steps 20, 40, 60 and the fork's 60
    assert rep.metric_values == res.metric_values


@pytest.mark.slow  # seconds: `make test`, not `make check`
def test_ladder_runs_fit_the_law(tmp_path):
    from observatory.ladder.fit import FitConfig, fit_ladder
    from observatory.ladder.watch import load_ladder

    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    res = simulate("ladder", runs, steps=40, run_id="lad")
    assert res.runs == ["lad-d768", "lad-d1024", "lad-d1536", "lad-d2048"]
    ingest(runs, db, hooks=False, emit=None)
    with connect(db) as con:
        rungs, targets, ds = load_ladder(con, "lad")
    assert len(rungs) == 4 and not targets and ds == "paloma/c4_en"
    assert all(len(r.curve) == 20 and r.steps == 40 for r in rungs)
    fit = fit_ladder(rungs, FitConfig(n_boot=10))
    e, a, alpha = LAW
    law = fit.laws[1.0]
    for c in (1e20, 1e22, 2.7e24):  # the fitted law agrees with the one the runs were drawn from
        assert math.isclose(float(law(c)), e + a * c**-alpha, rel_tol=0.02)


def test_bad_arguments():
    with pytest.raises(ValueError, match="steps"):
        simulate("535b", "/nonexistent", steps=10)
    with pytest.raises(ValueError, match="run id"):
        simulate("tiny", "/nonexistent", run_id="..")
    with pytest.raises(ValueError, match="run id"):
        simulate("tiny", "/nonexistent", run_id="a/b")
    with pytest.raises(ValueError, match="preset"):
        simulate("huge", "/nonexistent")


def test_cli(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "o.duckdb"
    args = ["simulate", "--preset", "tiny", "--steps", "60", "--runs-dir", str(runs), "--db", str(db)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    assert "2 new" in r.output and "observatory ingest --runs-dir" in r.output
    assert not db.exists()
    r = CliRunner().invoke(cli, [*args, "--seed", "3"])
    assert r.exit_code == 1 and "--replace" in r.output
    r = CliRunner().invoke(cli, [*args, "--seed", "3", "--replace", "--ingest"])
    assert r.exit_code == 0, r.output
    assert "ingested" in r.output and "0 rejected" in r.output
    r = CliRunner().invoke(cli, ["simulate", "--preset", "535b", "--steps", "5", "--runs-dir", str(runs)])
    assert r.exit_code == 2 and "steps" in r.output
