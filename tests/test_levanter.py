"""The Levanter tracker against the real package: real `train_lm` runs on CPU, then our store and pages.

Levanter pins its own jax, so it lives in a venv of its own, `.venv-levanter` (`make
levanter-venv`; `make test` builds it). These tests run in the main venv and drive that
venv's python through `tests/levanter_fixture.py`: a tiny llama and a tiny Mixtral train
for real with the tracker list `[{type: observatory}, {type: wandb, mode: offline}]`, and a
scripted session calls every Tracker method with Levanter's own value types. What they
wrote is then ingested, drawn by the Live and Experts pages and compared with W&B's files.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import CliRunner
from streamlit.testing.v1 import AppTest
from test_dashboard import arr, specs

from observatory.cli import main as cli
from observatory.pipeline import ingest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "levanter_fixture.py"
PYTHON = Path(os.environ.get("OBSERVATORY_LEVANTER_PYTHON", ROOT / ".venv-levanter" / "bin" / "python"))
RUN_TIMEOUT_S = 900
PAGE_TIMEOUT = 60

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * RUN_TIMEOUT_S)]


def levanter_run(out: Path, model: str) -> dict:
    """Train (or drive the tracker) in the Levanter venv; return run.json's paths."""
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: build the Levanter venv with `make levanter-venv`")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("OBSERVATORY_DB", None)
    env.pop("XLA_FLAGS", None)  # conftest's 8 host devices: these runs use one (batch 4 would not divide)
    proc = subprocess.run(
        [str(PYTHON), str(FIXTURE), str(out), "--model", model],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    if model == "calls":  # ends with an uncaught exception on purpose
        assert proc.returncode != 0 and "boom in the training loop" in proc.stderr
        return {"run_id": "levanter-calls", "runs_dir": str(out / "runs")}
    assert proc.returncode == 0, proc.stderr[-6000:]
    return json.loads((out / "run.json").read_text())


def trained(tmp_path_factory, model: str) -> dict:
    """A real train_lm run of `model`, ingested into a store of its own."""
    out = tmp_path_factory.mktemp(f"levanter-{model}")
    info = levanter_run(out, model)
    db = out / "store.duckdb"
    report = ingest(info["runs_dir"], db, emit=None)
    assert report.rejected == 0, report.messages[:5]
    return {**info, "db": db, "out": out}


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return trained(tmp_path_factory, "llama")


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    return trained(tmp_path_factory, "mixtral")


@pytest.fixture(scope="module")
def calls(tmp_path_factory):
    out = tmp_path_factory.mktemp("levanter-calls")
    info = levanter_run(out, "calls")
    path = Path(info["runs_dir"]) / info["run_id"] / "events.0.jsonl"
    return {
        "events": [json.loads(line) for line in path.read_text().splitlines()],
        "names": (out / "names.md").read_text(),
    }


def page(db: Path, name: str, run: str, monkeypatch) -> AppTest:
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    at = AppTest.from_string(
        f"from observatory.dashboard.pages import {name}\n{name}.render()\n", default_timeout=PAGE_TIMEOUT
    )
    at.query_params["run"] = run
    return at.run()


def series(db: Path, run: str, name: str) -> list[tuple[int, float]]:
    with duckdb.connect(str(db), read_only=True) as con:
        rows = con.execute(
            "SELECT step, any_value(value) FROM metrics WHERE run = ? AND name = ? GROUP BY step ORDER BY step",
            [run, name],
        ).fetchall()
    return [(int(s), float(v)) for s, v in rows]


def test_llama_run_ingests_with_config_and_summary(llama):
    with duckdb.connect(str(llama["db"]), read_only=True) as con:
        status, final_step, tags, config = con.execute(
            "SELECT status, final_step, tags, config FROM runs WHERE run = ?", [llama["run_id"]]
        ).fetchone()
        kinds = dict(
            con.execute(
                "SELECT kind, count(*) FROM events WHERE run = ? GROUP BY kind", [llama["run_id"]]
            ).fetchall()
        )
    assert status == "completed" and final_step == 19
    assert tags == ["levanter", "llama"]
    config = json.loads(config)
    assert config["model"]["hidden_dim"] == 32 and config["trainer"]["num_train_steps"] == 20
    assert config["trainer"]["mp"]["compute_dtype"] == "float32"  # a jmp policy's dtypes, as text
    assert kinds["summary"] >= 1 and kinds["artifact"] >= 1 and kinds["eval"] >= 1 and kinds["histogram"] >= 1
    loss = series(llama["db"], llama["run_id"], "train/loss")
    assert len(loss) >= 15 and loss[-1][1] < loss[0][1]  # it learned something
    assert series(llama["db"], llama["run_id"], "opt/lr")  # mapped from optim/learning_rate
    assert series(llama["db"], llama["run_id"], "optim/learning_rate")  # and kept under its own name


def test_llama_run_on_the_live_page(llama, monkeypatch):
    at = page(llama["db"], "live", llama["run_id"], monkeypatch)
    assert not at.exception
    at.run()  # the rerun after the first paint draws the health charts
    assert not at.exception
    charts = specs(at)  # the run details' histogram (st.plotly_chart) and the Live charts
    loss = next((c for c in charts if any(t.get("name") == "train/loss" for t in c["data"])), None)
    assert loss is not None, [c["layout"]["title"]["text"] for c in charts]
    assert any((t.get("name") or "").startswith("eval ") for t in loss["data"]), "eval loss points are drawn"
    by_title = {c["layout"]["title"]["text"]: c for c in charts}
    assert by_title["Grad norm"]["data"], "grad/norm/total from Levanter's watch callback is drawn"
    assert by_title["Learning rate"]["data"]


def test_llama_wandb_offline_files_give_the_same_loss(llama):
    runs_dir, db = llama["out"] / "wandb-runs", llama["out"] / "wandb.duckdb"
    r = CliRunner().invoke(
        cli, ["import", "wandb", llama["wandb_dir"], "--runs-dir", str(runs_dir), "--db", str(db)]
    )
    assert r.exit_code == 0, r.output
    with duckdb.connect(str(db), read_only=True) as con:
        (wandb_run,) = con.execute("SELECT run FROM runs").fetchone()
    ours = series(llama["db"], llama["run_id"], "train/loss")
    theirs = series(db, wandb_run, "train/loss")
    assert [s for s, _ in ours] == [s for s, _ in theirs]
    np.testing.assert_allclose([v for _, v in ours], [v for _, v in theirs], rtol=1e-6)


def test_mixtral_run_reaches_the_experts_page(mixtral, monkeypatch):
    with duckdb.connect(str(mixtral["db"]), read_only=True) as con:
        (status,) = con.execute("SELECT status FROM runs WHERE run = ?", [mixtral["run_id"]]).fetchone()
        loads = con.execute(
            "SELECT step, layer, list(routed ORDER BY expert) FROM expert_load WHERE run = ? "
            "GROUP BY step, layer ORDER BY step, layer",
            [mixtral["run_id"]],
        ).fetchall()
    assert status == "completed"
    assert {layer for _, layer, _ in loads} == {0, 1}
    assert len({step for step, _, _ in loads}) >= 15
    assert len(loads) == len({(s, layer) for s, layer, _ in loads})  # one event per step and layer
    # 4 sequences x 64 tokens x top-2 = 512 assignments per layer per step, over 4 experts
    for _, _, routed in loads:
        assert len(routed) == 4 and abs(sum(routed) - 512) <= 4
    lb = [v for _, v in series(mixtral["db"], mixtral["run_id"], "router/lb_loss")]
    assert lb and all(0.5 < v < 4.0 for v in lb)  # our normalisation: about 1.0 at perfect balance
    assert series(mixtral["db"], mixtral["run_id"], "train/load_balancing_loss")

    at = page(mixtral["db"], "experts", mixtral["run_id"], monkeypatch)
    assert not at.exception
    share = next(s for s in specs(at) if "load share" in s["layout"]["title"]["text"])
    z = arr(share["data"][0]["z"])
    assert z.shape[0] == 4  # experts x steps
    np.testing.assert_allclose(np.nansum(z, axis=0), 1.0, atol=1e-6)


def test_the_docs_have_the_name_table(calls):
    assert calls["names"].strip() in (ROOT / "docs" / "levanter.md").read_text(), (
        "docs/levanter.md's name table is stale"
    )


def test_tracker_calls_map_onto_events(calls):
    calls = calls["events"]
    by_kind: dict[str, list[dict]] = {}
    for ev in calls:
        by_kind.setdefault(ev["kind"], []).append(ev)
    start = by_kind["run_start"][0]["data"]
    assert start["source"]["trainer"] == "levanter" and start["tags"] == ["unit"]
    assert start["config"] == {
        "dtype": "bfloat16",
        "np_dtype": "float32",
        "path": "/tmp/ckpt",
        "every": 600.0,
        "mode": "fast",
        "inner": {"path": "/data/x"},
        "fn": "len",
        "wandb": {"api_key": "<redacted>"},
        "steps": [1, 2, 3],
    }
    metrics = {}
    for ev in by_kind["metrics"]:
        for k, v in ev["data"].items():
            metrics[(ev["step"], k)] = v
    assert metrics[(0, "train/loss")] == 3.5 and metrics[(0, "np")] == 2.0 and metrics[(0, "nested/a")] == 0.5
    assert metrics[(1, "from_jit")] == 7.0  # step=None attaches to the step logged next
    for stat in ("min", "max", "mean", "rms", "variance", "nonzero_count"):
        assert (1, f"grad/hist/w/{stat}") in metrics
    assert metrics[(1, "grad/hist/w/max")] == 1.0
    hist = next(e for e in by_kind["histogram"] if e["data"]["name"] == "grad/hist/w")["data"]
    assert len(hist["bucket_limits"]) == len(hist["bucket_counts"]) + 1 and sum(hist["bucket_counts"]) == 101
    # grug MoE names
    assert metrics[(2, "moe/layer_0/drop_fraction")] == 0.125
    assert metrics[(2, "router/lb_loss")] == 1.01 and metrics[(2, "moe/drop_fraction")] == 0.05
    loads = {e["data"]["layer"]: e["data"] for e in by_kind["expert_load"]}
    assert loads[0]["routed"] == [10, 30, 0, 24] and loads[1]["routed"] == [24, 0, 30, 10]
    summary = {}
    for ev in by_kind["summary"]:
        summary.update(ev["data"])
    assert summary["note_text"] == "hello" and summary["backend"] == "cpu" and summary["ok"] is True
    art = by_kind["artifact"][0]["data"]
    assert art["name"] == "config.yaml" and art["type"] == "config" and art["bytes"] == 5
    assert by_kind["config_diff"][0]["data"]["changes"] == {"optimizer.lr": [None, 0.1]}
    failure = by_kind["failure"][0]["data"]
    assert failure["type"] == "exception" and "boom in the training loop" in failure["message"]
    assert by_kind["run_end"][0]["data"] == {"status": "failed", "final_step": 2}
    assert calls[-1]["kind"] == "run_end"
