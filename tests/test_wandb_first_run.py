"""A W&B user's first run: `loss` and `acc` drawn on every page, the run where every command looks, one line said.

The run is the W&B tutorial loop through `import observatory as wandb`, ingested by the real
ingester; the pages run under streamlit's AppTest.
"""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from dashboard_fixtures import chart_specs
from streamlit.testing.v1 import AppTest
from wandb_fixtures import run_as_user, user_env

import observatory as wandb
from observatory import report, settings
from observatory.dashboard.auto_panels import MAX_PANELS, UNGROUPED, choose_panels
from observatory.pipeline import ingest
from observatory.queries import dashboard as qd
from observatory.queries.core import loss_name
from observatory.report import figures as report_figures
from observatory.store import connect

TIMEOUT = 60
STEPS = 30


def tutorial_run(runs_dir: Path, project: str = "mnist", **kw) -> str:
    """The W&B tutorial loop (plain names, a prefixed eval, a summary), quiet; returns the run id."""
    run = wandb.init(
        project=project,
        config={"lr": 3e-4, "epochs": 3},
        dir=runs_dir,
        settings=wandb.Settings(quiet=True),
        **kw,
    )
    for i in range(STEPS):
        wandb.log({"loss": 2.0 * math.exp(-i / 10), "acc": 1 - math.exp(-i / 8)})
        if i % 10 == 9:
            wandb.log({"val/loss": 2.1 * math.exp(-i / 10)}, commit=False)
    wandb.run.summary["best_acc"] = 0.93
    wandb.finish()
    return run.id


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("wandb_first")
    runs_dir, db = tmp / "runs", tmp / "obs.duckdb"
    plain = tutorial_run(runs_dir)
    ours = wandb.init(run_id="ours", runs_dir=runs_dir)
    for i in range(5):
        ours.log({"train/loss": 3.0 - i / 10, "loss": 99.0}, step=i)  # our name wins over a plain one
    ours.finish()
    ingest(runs_dir, db, emit=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OBSERVATORY_DB", str(db))
        yield db, plain


# ---------------------------------------------------------------- item 1: the loss rule, every page


def test_the_loss_is_found_by_the_names_wandb_users_use_or_by_the_setting(monkeypatch):
    assert loss_name(["acc", "loss"]) == "loss"
    assert loss_name(["acc", "train_loss", "eval/loss"]) == "train_loss"
    assert loss_name(["eval/loss", "acc"]) == "eval/loss"
    assert loss_name(["train/loss", "loss"]) == "train/loss"
    assert loss_name(["acc"]) is None
    monkeypatch.setenv("OBSERVATORY_LOSS_NAMES", "my_objective, loss")
    assert loss_name(["loss", "my_objective"]) == "my_objective"


def test_runs_table_last_loss_follows_the_rule_for_a_page_of_runs_at_once(store, monkeypatch):
    db, plain = store
    with connect(db) as con:
        rows = {r["run"]: r["last_loss"] for r in qd.runs_extras(con, [plain, "ours"]).to_dicts()}
        assert rows[plain] == pytest.approx(2.0 * math.exp(-(STEPS - 1) / 10))
        assert rows["ours"] == pytest.approx(2.6)  # train/loss, not its `loss`
        monkeypatch.setenv("OBSERVATORY_LOSS_NAMES", "acc")
        rows = {r["run"]: r["last_loss"] for r in qd.runs_extras(con, [plain, "ours"]).to_dicts()}
        assert rows[plain] == pytest.approx(1 - math.exp(-(STEPS - 1) / 8))
        assert rows["ours"] is None


def test_report_of_a_wandb_run_charts_loss_and_acc(store):
    db, plain = store
    rep = report.build(db, plain)
    assert rep.loss_name == "loss"
    assert list(rep.series)[:2] == ["loss", "acc"] and "val/loss" in rep.series
    assert dict(rep.summary)["final loss (last finite)"].startswith("0.1")
    fig = report_figures.figures(rep)["overview"]
    titles = [a.text for a in fig.layout.annotations]
    assert titles[:2] == ["loss", "acc"] and "val/loss" in titles


def test_panels_are_grouped_by_prefix_loss_first_and_bounded():
    loss, groups, left = choose_panels(["val/loss", "acc", "loss", "lr", "val/acc", "sys/gpu"])
    assert loss == "loss"
    assert groups == [(UNGROUPED, ["acc", "lr"]), ("sys", ["sys/gpu"]), ("val", ["val/acc", "val/loss"])]
    assert left == []
    many = [f"m{i:03d}" for i in range(MAX_PANELS + 5)]
    loss, groups, left = choose_panels(many)
    assert loss is None and sum(len(g) for _, g in groups) == MAX_PANELS and len(left) == 5


def live(run: str) -> AppTest:
    at = AppTest.from_string(
        "from observatory.dashboard.pages import live\nlive.render()\n", default_timeout=TIMEOUT
    )
    at.query_params["run"] = run
    return at.run()


def chart_titles(at: AppTest) -> list[str]:
    out = []
    for spec in chart_specs(at):
        title = spec["layout"].get("title") or {}
        out.append(title.get("text") if isinstance(title, dict) else title)
    return out


def test_live_draws_a_panel_per_metric_grouped_by_prefix(store):
    db, plain = store
    at = live(plain)
    assert not at.exception
    assert not [i.value for i in at.info if "No metrics" in i.value]
    titles = chart_titles(at)
    assert titles[0] == "loss" and set(titles) == {"loss", "acc", "val/loss"}
    assert [h.value for h in at.subheader] == [UNGROUPED, "val"]
    assert "Last loss** 0.1" in " ".join(m.value for m in at.markdown)


# ---------------------------------------------------------------- item 2: where the run goes, one line each

SCRIPT = """
import math, observatory as wandb
wandb.init(project="mnist", config={"lr": 3e-4})
for i in range(5):
    wandb.log({"loss": math.exp(-i), "acc": i / 5})
wandb.run.summary["best_acc"] = 0.8
wandb.finish()
"""


@pytest.mark.subprocess
def test_init_writes_to_the_per_user_runs_dir_from_any_folder_and_says_where(tmp_path):
    home, elsewhere = tmp_path / "home", tmp_path / "some" / "folder"
    elsewhere.mkdir(parents=True)
    out = run_as_user([sys.executable, "-c", SCRIPT], elsewhere, home)
    runs = home / ".local/share/observatory/runs"
    logs = list(runs.glob("*/events.0.jsonl"))
    assert len(logs) == 1 and not (elsewhere / "data").exists()
    said = [line for line in out.stderr.splitlines() if line.startswith("observatory:")]
    assert len(said) == 2, out.stderr
    # the command works in a new shell: the venv's observatory by its absolute path when it is not on PATH
    assert str(logs[0]) in said[0] and re.search(r"see it: (\S*observatory) ingest && \1 dashboard$", said[0])
    assert "completed" in said[1] and "observatory report" in said[1]
    # every command without a flag reads the same place
    cli = Path(sys.executable).parent / "observatory"
    run_as_user([str(cli), "ingest", "-q"], tmp_path, home)
    assert (home / ".local/share/observatory/observatory.duckdb").is_file()


@pytest.mark.subprocess
@pytest.mark.parametrize("how", ["settings", "OBSERVATORY_QUIET", "WANDB_SILENT"])
def test_quiet_init_and_finish_say_nothing(tmp_path, how):
    script = SCRIPT.replace('config={"lr": 3e-4}', 'config={"lr": 3e-4}, settings=wandb.Settings(quiet=True)')
    extra = {how: "true"} if how != "settings" else {}
    out = subprocess.run(
        [sys.executable, "-c", script if how == "settings" else SCRIPT],
        cwd=tmp_path,
        env=user_env(tmp_path / "home", **extra),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "observatory:" not in out.stderr


def test_the_runs_and_db_defaults_are_per_user_and_follow_xdg(monkeypatch, tmp_path):
    for v in ("OBSERVATORY_RUNS", "OBSERVATORY_DB", "XDG_DATA_HOME"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert settings.get("runs") == str(tmp_path / ".local/share/observatory/runs")
    assert settings.get("db") == str(tmp_path / ".local/share/observatory/observatory.duckdb")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert settings.get("runs") == str(tmp_path / "xdg/observatory/runs")
    monkeypatch.setenv("OBSERVATORY_RUNS", "~/elsewhere")
    assert settings.get("runs") == str(tmp_path / "elsewhere")


# ---------------------------------------------------------------- item 9: Compare's config diff, runs picked by hand


def test_compare_config_diff_keeps_run_b_when_both_runs_are_picked_by_hand(store):
    db, plain = store
    at = AppTest.from_string(
        "from observatory.dashboard.pages import compare\ncompare.render()\n", default_timeout=TIMEOUT
    ).run()
    at.multiselect(key="compare_runs").set_value([]).run()
    at.multiselect(key="compare_runs").set_value(["ours"]).run()
    at.multiselect(key="compare_runs").set_value(["ours", plain]).run()
    assert not at.exception
    assert at.selectbox(key="compare_a").value == "ours" and at.selectbox(key="compare_b").value == plain
    assert not [i.value for i in at.info if "Pick two different runs" in i.value]
    assert set(at.dataframe[-1].value["key"]) >= {"lr", "epochs"}
