"""`import observatory as wandb`: a W&B training script runs unchanged, with wandb's step rules, config and summary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import observatory
from observatory.events import validate_event
from observatory.pipeline import ingest
from observatory.store import connect

ROOT = Path(__file__).resolve().parent.parent

# W&B's quickstart loop as its documentation writes one (module-level calls, config access, a
# numpy metric, nested dicts, commit=False, an explicit step, a summary value, a config change);
# only the import differs. The runs dir comes from the environment (OBSERVATORY_RUNS).
WANDB_SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import observatory as wandb

    wandb.init(
        project="my-awesome-project",
        name="quickstart",
        config={
            "learning_rate": 0.02,
            "architecture": "CNN",
            "dataset": "CIFAR-100",
            "epochs": 5,
            "optimizer": {"name": "adam", "beta1": 0.9},
        },
        tags=["baseline"],
        group="cnn",
        notes="first try",
    )
    lr = wandb.config.learning_rate
    wandb.define_metric("val/acc", summary="max")
    for epoch in range(wandb.config["epochs"]):
        for batch in range(3):
            loss = 1.0 / (1 + 3 * epoch + batch)
            wandb.log({"train": {"loss": loss, "lr": lr}})
        wandb.log({"val/acc": np.float32(0.5 + epoch / 10)}, commit=False)
        wandb.log({"epoch": epoch})
    wandb.config.update({"learning_rate": lr / 10}, allow_val_change=True)
    wandb.log({"train/loss": 0.01}, step=100)
    wandb.log({"val/acc": 0.125}, step=100)
    wandb.summary["best_epoch"] = wandb.config.epochs - 1
    print(wandb.run.id, flush=True)
    wandb.finish()
    """
)


# The shape of W&B's current quickstart: a `with wandb.init(...) as run:` block and `run.log` per epoch.
WITH_SCRIPT = textwrap.dedent(
    """
    import random
    import observatory as wandb

    config = {"epochs": 8, "lr": 0.01}
    with wandb.init(project="my-awesome-project", config=config) as run:
        offset = random.random() / 5
        for epoch in range(run.config["epochs"]):
            acc = 1 - 2 ** -(epoch + 1) - offset
            loss = 2 ** -(epoch + 1) + offset
            run.log({"accuracy": acc, "loss": loss})
        print(run.id, flush=True)
    """
)


@pytest.fixture(autouse=True)
def _no_active_run():
    yield
    observatory.finish()  # a test's active run must not leak into the next


def _events(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _script(tmp_path, runs_dir, text: str) -> subprocess.CompletedProcess:
    """Run a script in a fresh interpreter with the runs dir from the environment."""
    script = tmp_path / "script.py"
    script.write_text(text)
    env = {**os.environ, "OBSERVATORY_RUNS": str(runs_dir), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)


def _init(runs_dir, **kw):
    return observatory.init(project="p", dir=runs_dir, install_signal_handlers=False, **kw)


def _metrics(run) -> list[tuple[int, dict]]:
    run.flush()
    return [(e["step"], e["data"]) for e in _events(run.path) if e["kind"] == "metrics"]


@pytest.mark.slow
def test_a_wandb_script_runs_unchanged_and_lands_in_the_store(tmp_path, runs_dir):
    out = _script(tmp_path, runs_dir, WANDB_SCRIPT)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    assert run_id.startswith("quickstart-")
    for ev in _events(runs_dir / run_id / "events.0.jsonl"):
        validate_event(ev, run_folder=run_id, host=0)

    db = tmp_path / "store.duckdb"
    ingest(runs_dir, db, emit=None)
    con = connect(db)
    rows = con.execute(
        "SELECT step, name, value FROM metrics WHERE run = ? ORDER BY step, name", [run_id]
    ).fetchall()
    got: dict[int, dict[str, float]] = {}
    for step, name, value in rows:
        got.setdefault(step, {})[name] = value
    # epoch e: three committed batch logs (steps 4e..4e+2), then val/acc (commit=False) and epoch at 4e+3
    assert sorted(got) == [*range(20), 100]
    assert got[0] == {"train/loss": 1.0, "train/lr": 0.02}
    assert got[3] == {"val/acc": 0.5, "epoch": 0.0}
    assert got[19] == pytest.approx({"val/acc": 0.9, "epoch": 4.0})
    assert got[100] == {"train/loss": 0.01, "val/acc": 0.125}  # two logs at one explicit step: one row

    status, final_step, name, config = con.execute(
        "SELECT status, final_step, name, config FROM runs WHERE run = ?", [run_id]
    ).fetchone()
    assert (status, final_step, name) == ("completed", 100, "quickstart")
    assert json.loads(config)["optimizer"] == {"name": "adam", "beta1": 0.9}
    events = con.execute(
        "SELECT kind, step, data FROM events WHERE run = ? AND host = 0 ORDER BY seq", [run_id]
    ).fetchall()
    by_kind: dict[str, list] = {}
    for kind, step, data in events:
        by_kind.setdefault(kind, []).append((step, json.loads(data)))
    start = by_kind["run_start"][0][1]
    assert (start["project"], start["group"], start["notes"], start["tags"]) == (
        "my-awesome-project",
        "cnn",
        "first try",
        ["baseline"],
    )
    assert start["source"]["trainer"] == "wandb-api"
    assert by_kind["config_diff"] == [
        (20, {"against": {"run": run_id, "step": 20}, "changes": {"learning_rate": [0.02, 0.002]}})
    ]
    summary: dict = {}
    for _step, data in by_kind["summary"]:
        summary.update(data)  # later summary events override earlier ones key by key
    assert summary["best_epoch"] == 4
    assert summary["val/acc/max"] == pytest.approx(0.9)
    assert json.loads(summary["_define_metric/val/acc"]) == {"summary": "max"}
    assert [d["status"] for _s, d in by_kind["run_end"]] == ["completed"]


@pytest.mark.subprocess
def test_the_drop_in_import_stays_light_and_the_run_still_names_its_version(tmp_path, runs_dir):
    """`import observatory as wandb` at the top of a training script loads no store, array or metadata
    module (duckdb, numpy, pyarrow, importlib.metadata: ~0.03 s of the import was the last alone); the
    package version that run_start records is still looked up, when a run starts."""
    from importlib import metadata

    code = textwrap.dedent(
        """
        import sys
        import observatory as wandb
        heavy = [m for m in ("duckdb", "numpy", "pyarrow", "polars", "importlib.metadata") if m in sys.modules]
        print(",".join(heavy) or "-")
        run = wandb.init(project="p", id="light")
        run.log({"train/loss": 1.0})
        run.finish()
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OBSERVATORY_RUNS": str(runs_dir)},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "-"
    start = next(e for e in _events(runs_dir / "light" / "events.0.jsonl") if e["kind"] == "run_start")
    assert start["data"]["source"] == {"trainer": "wandb-api", "version": metadata.version("observatory")}


@pytest.mark.slow
def test_the_with_block_quickstart_runs_unchanged(tmp_path, runs_dir):
    out = _script(tmp_path, runs_dir, WITH_SCRIPT)
    assert out.returncode == 0, out.stderr
    run_id = out.stdout.strip()
    db = tmp_path / "store.duckdb"
    ingest(runs_dir, db, hooks=False, emit=None)
    con = connect(db)
    steps = con.execute(
        "SELECT step, count(*) FROM metrics WHERE run = ? GROUP BY step ORDER BY step", [run_id]
    ).fetchall()
    assert steps == [(s, 2) for s in range(8)]
    assert con.execute("SELECT status FROM runs WHERE run = ?", [run_id]).fetchone() == ("completed",)


def test_step_none_advances_one_step_per_log(runs_dir):
    run = _init(runs_dir)
    for x in range(3):
        run.log({"x": x})
    assert run.step == 3
    assert _metrics(run) == [(0, {"x": 0.0}), (1, {"x": 1.0}), (2, {"x": 2.0})]


def test_commit_false_accumulates_into_the_current_step(runs_dir):
    run = _init(runs_dir)
    run.log({"a": 1}, commit=False)
    run.log({"b": 2}, commit=False)
    assert run.step == 0
    run.log({"c": 3})
    assert run.step == 1
    assert _metrics(run) == [(0, {"a": 1.0}), (0, {"b": 2.0}), (0, {"c": 3.0})]


def test_explicit_step_moves_the_step_and_does_not_commit_unless_told(runs_dir):
    run = _init(runs_dir)
    run.log({"a": 1}, step=5)
    run.log({"b": 2}, step=5)
    assert run.step == 5
    run.log({"c": 3})  # no step: joins step 5, commits
    assert run.step == 6
    run.log({"d": 4}, step=7, commit=True)
    assert run.step == 8
    assert [s for s, _ in _metrics(run)] == [5, 5, 5, 7]


def test_a_step_below_the_current_one_is_refused_with_a_warning_and_counted(runs_dir, capsys):
    run = _init(runs_dir)
    run.log({"x": 1.0}, step=10)
    run.log({"x": 2.0}, step=3)
    run.log({"x": 3.0}, step=4)
    assert "Tried to log to step 3 that is less than the current step 10" in capsys.readouterr().err
    assert run.refused_logs == 2
    run.finish()
    evs = _events(run.path)
    assert [e["step"] for e in evs if e["kind"] == "metrics"] == [10]
    summary = [e["data"] for e in evs if e["kind"] == "summary"]
    assert summary == [{"writer/refused_logs": 2}]


def test_values_numpy_torch_like_and_errors_name_the_key(runs_dir):
    class Tensor:  # torch/jax-like: a 0-d value with .item(), float() refused
        def __float__(self):
            raise TypeError("no")

        def item(self):
            return 0.25

    run = _init(runs_dir)
    run.log({"a": np.float32(1.5), "b": np.array(2.0), "c": np.int64(3), "d": Tensor(), "e": {"f": {"g": 1}}})
    assert _metrics(run) == [(0, {"a": 1.5, "b": 2.0, "c": 3.0, "d": 0.25, "e/f/g": 1.0})]
    with pytest.raises(TypeError, match=r"metric 'phase' must be a number, got str.*run.summary\['phase'\]"):
        run.log({"phase": "train"})
    with pytest.raises(TypeError, match=r"metric 'h/w' must be a number, got ndarray of shape \(3,\)"):
        run.log({"h": {"w": np.zeros(3)}})
    with pytest.raises(TypeError, match="metric 'ok' is a bool"):
        run.log({"ok": True})
    assert run.step == 1  # a refused call logs nothing and does not advance


def test_config_item_attribute_update_and_wandbs_change_rule(runs_dir):
    run = _init(runs_dir, config={"lr": 0.1, "model": {"d": 64, "L": 2}})
    assert run.config.lr == run.config["lr"] == 0.1 and run.config.model["d"] == 64
    run.log({"x": 1})
    with pytest.raises(observatory.ConfigError, match='change value of key "lr" from 0.1 to 0.2'):
        run.config.lr = 0.2
    run.config.batch = 32  # a new key is fine
    run.config.update({"model": {"d": 128, "L": 2}}, allow_val_change=True)
    run.config.setdefaults({"batch": 64, "warmup": 10})
    assert dict(run.config) == {"lr": 0.1, "model": {"d": 128, "L": 2}, "batch": 32, "warmup": 10}
    with pytest.raises(AttributeError, match="no key 'nope'"):
        run.config.nope  # noqa: B018
    run.finish()
    diffs = [(e["step"], e["data"]) for e in _events(run.path) if e["kind"] == "config_diff"]
    against = {"run": run.id, "step": 1}
    assert diffs == [
        (1, {"against": against, "changes": {"batch": [None, 32]}}),
        (1, {"against": against, "changes": {"model.d": [64, 128]}}),
        (1, {"against": against, "changes": {"warmup": [None, 10]}}),
    ]


def test_secrets_are_redacted_in_run_start_config_diff_and_summary(runs_dir):
    run = _init(runs_dir, config={"wandb_api_key": "k-1", "lr": 1})
    run.config.update({"hf_token": "hf_abcdefghijklmnopqrstuvwx", "db": {"password": "hunter2"}})
    run.config.update({"note": "Authorization: Bearer abcdefghijklmnop"})
    run.summary["cmd"] = "train.py --lr 1 password=s3cr3t-value"
    run.finish()
    text = run.path.read_text()
    for secret in ("k-1", "hf_abcdefghijklmnopqrstuvwx", "hunter2", "abcdefghijklmnop", "s3cr3t-value"):
        assert secret not in text
    diffs = [e["data"]["changes"] for e in _events(run.path) if e["kind"] == "config_diff"]
    assert diffs[0] == {"hf_token": [None, "<redacted>"], "db.password": [None, "<redacted>"]}
    assert run.config.hf_token == "hf_abcdefghijklmnopqrstuvwx"  # the script still sees its own values


def test_summary_defaults_to_the_last_value_and_set_values_persist(runs_dir):
    run = _init(runs_dir)
    run.log({"loss": 2.0})
    run.log({"loss": 1.0})
    assert run.summary["loss"] == 1.0
    run.summary["loss"] = 0.5  # written now
    run.summary.update({"best": {"acc": 0.9}, "note": "ok", "done": False})
    assert run.summary["best/acc"] == 0.9
    run.log({"loss": 0.75})  # a later log replaces the set value again, as in wandb
    assert run.summary.loss == 0.75
    run.finish()
    summaries = [e["data"] for e in _events(run.path) if e["kind"] == "summary"]
    assert summaries == [{"loss": 0.5}, {"best/acc": 0.9, "note": "ok", "done": False}, {"loss": 0.75}]
    with pytest.raises(TypeError, match="summary: 'x' must be a number, string or bool"):
        run.summary["x"] = [1, 2]


def test_define_metric_is_recorded_and_its_statistics_summarised(runs_dir):
    run = _init(runs_dir)
    run.define_metric("epoch")
    run.define_metric("val/*", step_metric="epoch", summary="min,mean,last")
    run.define_metric("acc", summary="best", goal="maximize")
    for epoch, (loss, acc) in enumerate([(3.0, 0.2), (1.0, 0.5), (2.0, 0.4)]):
        run.log({"epoch": epoch, "val/loss": loss, "acc": acc})
    assert (run.summary["val/loss/min"], run.summary["val/loss/mean"], run.summary["val/loss"]) == (
        1.0,
        2.0,
        2.0,
    )
    assert run.summary["acc/best"] == 0.5 and "acc" not in run.summary  # a summary without `last` replaces it
    with pytest.raises(ValueError, match="summary must be among"):
        run.define_metric("x", summary="median")
    run.finish()
    summary: dict = {}
    for e in _events(run.path):
        if e["kind"] == "summary":
            summary.update(e["data"])
    assert json.loads(summary["_define_metric/val/*"]) == {"step_metric": "epoch", "summary": "min,mean,last"}
    assert json.loads(summary["_define_metric/epoch"]) == {}
    assert (summary["val/loss/min"], summary["val/loss/mean"], summary["acc/best"]) == (1.0, 2.0, 0.5)


def test_name_id_finish_exit_code_and_context_manager(runs_dir):
    run = _init(runs_dir, name="exp 1", id="exp-1")
    assert (run.name, run.id, observatory.run) == ("exp 1", "exp-1", run)
    run.log({"x": 1})
    run.finish(exit_code=3)
    assert observatory.run is None
    assert _events(run.path)[-1]["data"] == {"status": "failed", "final_step": 0}
    with _init(runs_dir, id="cm") as run2:
        run2.log({"x": 1})
    assert _events(run2.path)[-1]["data"]["status"] == "completed"


def test_module_level_calls_need_an_active_run_and_raise_wandbs_errors():
    assert observatory.run is None
    with pytest.raises(observatory.Error, match=r"^You must call wandb.init\(\) before wandb.log\(\)$"):
        observatory.log({"x": 1})
    with pytest.raises(observatory.Error, match=r"before wandb.define_metric\(\)"):
        observatory.define_metric("x")
    with pytest.raises(observatory.Error, match=r"before wandb.config.lr"):
        observatory.config.lr  # noqa: B018
    with pytest.raises(observatory.Error, match=r"before wandb.summary\['x'\]"):
        observatory.summary["x"] = 1
    observatory.finish()  # nothing active: a no-op, as in wandb


def test_module_level_calls_follow_the_active_run(runs_dir):
    run = _init(runs_dir, config={"lr": 1})
    assert observatory.config is run.config and observatory.summary is run.summary
    observatory.log({"x": 1})
    observatory.config.update({"bs": 8})
    observatory.summary["s"] = "done"
    observatory.finish()
    assert observatory.run is None
    kinds = [e["kind"] for e in _events(run.path) if e["kind"] != "phase"]
    assert kinds == ["run_start", "metrics", "config_diff", "summary", "run_end"]


def test_resume_modes(runs_dir):
    first = _init(runs_dir, id="res", config={"lr": 1, "api_key": "k"})
    first.log({"x": 1}, step=7)
    first.finish()
    with pytest.raises(observatory.Error, match="resume='never' but run 'res' already exists"):
        _init(runs_dir, id="res", resume="never")
    with pytest.raises(observatory.Error, match="resume='must' but run 'nope' has no event log"):
        _init(runs_dir, id="nope", resume="must")
    again = _init(runs_dir, id="res", resume="must", config={"lr": 2, "api_key": "k"})
    assert again.step == 8 and again.config.lr == 2
    again.log({"x": 2})
    again.finish()
    evs = _events(again.path)
    assert [e["kind"] for e in evs].count("run_start") == 1  # a resumed run has one start
    assert [e["seq"] for e in evs] == list(range(len(evs)))
    assert [e["data"]["changes"] for e in evs if e["kind"] == "config_diff"] == [{"lr": [1, 2]}]
    assert [e["step"] for e in evs if e["kind"] == "metrics"] == [7, 8]
    fresh = _init(runs_dir, id="new-one", resume="allow")  # allow: a run that is not there starts fresh
    fresh.flush()
    assert fresh.step == 0 and _events(fresh.path)[0]["kind"] == "run_start"


def test_disabled_mode_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    run = observatory.init(project="p", config={"lr": 1}, mode="disabled", dir=runs)
    assert observatory.run is run and run.disabled
    run.log({"x": 1})
    run.config.update({"lr": 2}, allow_val_change=True)
    run.summary["s"] = 1
    run.define_metric("x", summary="max")
    assert run.config.lr == 2 and run.summary["s"] == 1
    observatory.finish()
    assert not runs.exists()


def test_trackio_signatures(runs_dir, monkeypatch):
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs_dir))
    import observatory as trackio

    run = trackio.init("my-project", name="t1", config={"epochs": 2})
    trackio.log({"loss": 1.0})
    trackio.log({"loss": 0.5}, step=3)
    trackio.finish()
    evs = _events(run.path)
    assert evs[0]["data"]["project"] == "my-project" and evs[0]["data"]["name"] == "t1"
    assert [e["step"] for e in evs if e["kind"] == "metrics"] == [0, 3]


def test_unknown_modes_and_arguments_are_refused(runs_dir):
    with pytest.raises(ValueError, match="mode must be one of"):
        observatory.init(mode="dryrun", dir=runs_dir)
    with pytest.raises(ValueError, match="resume must be one of"):
        observatory.init(resume="sometimes", dir=runs_dir)
    with pytest.raises(TypeError, match="unexpected keyword"):
        observatory.init(dir=runs_dir, no_such_argument=1, install_signal_handlers=False)
    run = observatory.init(
        dir=runs_dir, entity="lab", job_type="train", settings={}, install_signal_handlers=False
    )
    run.finish()  # wandb's server-side arguments are accepted and unused


def test_our_writer_names_keep_the_writers_free_step_order(runs_dir):
    run = observatory.init(run_id="trainer-like", runs_dir=runs_dir, install_signal_handlers=False)
    assert not run.wandb_rules
    run.log({"x": 1.0}, step=5)
    run.log({"x": 2.0}, step=3)  # a rollback re-logs earlier steps: kept
    run.log({"y": 1.0})  # wandb's conveniences still work
    assert [s for s, _ in _metrics(run)] == [5, 3, 3]
    assert "source" not in _events(run.path)[0]["data"]


@pytest.mark.slow
@pytest.mark.parametrize("tail, status", [("", "completed"), ("raise SystemError('boom')", "failed")])
def test_a_script_that_does_not_finish_is_finished_at_exit(tmp_path, runs_dir, tail, status):
    out = _script(
        tmp_path,
        runs_dir,
        f"import observatory as wandb\nwandb.init(id='x')\nwandb.log({{'a': 1}})\n{tail}\n",
    )
    assert out.returncode == (1 if tail else 0)
    evs = _events(runs_dir / "x" / "events.0.jsonl")
    assert evs[-1]["kind"] == "run_end" and evs[-1]["data"]["status"] == status
    if tail:
        assert evs[-2]["kind"] == "failure" and "SystemError: boom" in evs[-2]["data"]["message"]
        assert "SystemError: boom" in out.stderr  # the script's own traceback is still printed
