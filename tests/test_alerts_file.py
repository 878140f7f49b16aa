"""Whose rules and channels: each store has its own alerts file (`<store>.alerts.yaml` beside it), or the
one named by --rules or OBSERVATORY_ALERTS_FILE; never one per-user file read by every process. A process
that sends says so when it starts."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner
from conftest import event, write_lines
from test_alerts import webhook  # noqa: F401, F811 (the fixture: a webhook receiver on 127.0.0.1)

from observatory.alerts import rules
from observatory.cli import main as cli


@pytest.fixture
def no_named_file(tmp_path, monkeypatch):
    """No OBSERVATORY_ALERTS_FILE (the tests' conftest names one): the per-store default, under a data home
    of the test's own."""
    monkeypatch.delenv("OBSERVATORY_ALERTS_FILE", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "home"))


def _stalled_run(runs_dir):
    t = time.time() - 1000  # silent for 1,000 s: the `stalled` rule fires
    evs = [event("silent", "run_start", {"config": {}}, 0, step=0, t=t - 60)]
    evs += [event("silent", "metrics", {"train/loss": 3.0}, i, step=i, t=t) for i in (1, 2, 3)]
    write_lines(runs_dir / "silent" / "events.0.jsonl", evs)


def _channel(path, port, name):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"channels:\n  - url: json://127.0.0.1:{port}/hook\n    name: {name}\n")


def test_the_rules_file_is_the_stores_own_unless_one_is_named(tmp_path, monkeypatch, no_named_file):
    a, b = tmp_path / "a" / "observatory.duckdb", tmp_path / "scratch" / "store.duckdb"
    assert rules.path_for(a) == tmp_path / "a" / "observatory.alerts.yaml"
    assert rules.path_for(b) == tmp_path / "scratch" / "store.alerts.yaml"
    assert rules.path_for(tmp_path / "plain") == tmp_path / "plain.alerts.yaml"
    # a rebuild's store built aside has the store's rules
    assert rules.path_for(tmp_path / "a" / "observatory.duckdb.rebuild-123") == rules.path_for(a)
    # the default store's: beside it, under the data home
    assert rules.path_for() == tmp_path / "home" / "observatory" / "observatory.alerts.yaml"
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(tmp_path / "named.yaml"))
    assert rules.path_for(a) == rules.path_for(b) == tmp_path / "named.yaml"


def test_a_scratch_store_does_not_page_the_channel_of_another_store_or_the_old_per_user_file(
    tmp_path,
    runs_dir,
    webhook,  # noqa: F811 (the fixture imported above)
    no_named_file,
):
    port, got = webhook
    # the lab's channel: in the old per-user location, and in the lab store's own file
    _channel(tmp_path / "home" / "observatory" / "alerts.yaml", port, "old-per-user")
    lab = tmp_path / "lab" / "observatory.duckdb"
    _channel(rules.path_for(lab), port, "lab-hook")
    _stalled_run(runs_dir)
    lab_runs = tmp_path / "lab-runs"
    _stalled_run(lab_runs)
    scratch = tmp_path / "scratch" / "store.duckdb"
    r = CliRunner().invoke(cli, ["ingest", "--runs-dir", str(runs_dir), "--db", str(scratch), "--quiet"])
    assert r.exit_code == 0, r.output
    assert got == []  # the old per-user file pages nobody, and ingest says it is not read any more
    old = tmp_path / "home" / "observatory" / "alerts.yaml"
    assert (
        f"alerts: sending to no channel ({rules.path_for(scratch)}: no such file); {old} is not read"
        in r.output
    )
    r = CliRunner().invoke(cli, ["ingest", "--runs-dir", str(lab_runs), "--db", str(lab), "--quiet"])
    assert r.exit_code == 0, r.output
    # said before anything was sent, with the channel's name (never its URL) and the file it is in
    assert f"alerts: sending to lab-hook (the channels of {rules.path_for(lab)})" in r.output
    assert str(port) not in r.output
    assert [m["title"] for m in got] == ["[CRITICAL] silent: stalled"]


def test_alerts_commands_edit_and_test_the_stores_own_file(tmp_path, webhook, no_named_file):  # noqa: F811
    port, got = webhook
    db = tmp_path / "s" / "x.duckdb"
    r = CliRunner().invoke(cli, ["alerts", "silence", "--db", str(db), "--run", "r1", "--for", "2h"])
    assert r.exit_code == 0, r.output
    assert str(rules.path_for(db)) in r.output and len(rules.load(rules.path_for(db)).silences) == 1
    r = CliRunner().invoke(cli, ["alerts", "test", "--db", str(db)])
    assert r.exit_code != 0 and "no channels" in r.output
    _channel(tmp_path / "other.yaml", port, "named")
    r = CliRunner().invoke(cli, ["alerts", "test", "--db", str(db), "--rules", str(tmp_path / "other.yaml")])
    assert r.exit_code == 0 and "named" in r.output and len(got) == 1
