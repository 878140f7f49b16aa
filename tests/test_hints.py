"""The commands we print work in a new shell, where the venv is not active: the writer's "see it: ...",
`make demo`'s "try: observatory sql ...". `observatory dashboard` says a port is taken before it
announces a URL, and offers a free one."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap

import pytest

from observatory import demo
from observatory.pipeline import ingest

pytestmark = [pytest.mark.subprocess]  # each test runs a printed command in a new shell

BARE_PATH = "/usr/bin:/bin"  # a new shell's PATH: no venv on it


def _new_shell_env(tmp_path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OBSERVATORY_") or k.endswith("_FILE")}
    return {**env, "PATH": BARE_PATH, "XDG_DATA_HOME": str(tmp_path / "home"), "HOME": str(tmp_path)}


def test_the_writers_see_it_hint_runs_in_a_new_shell(tmp_path):
    env = _new_shell_env(tmp_path)
    script = textwrap.dedent(
        """
        import observatory as wandb
        run = wandb.init(project="mnist", id="hinted", config={"lr": 0.1})
        for s in range(5):
            wandb.log({"loss": 1.0 / (s + 1)})
        wandb.finish()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    hints = re.findall(r"see it: (.+)", done.stderr)
    assert len(hints) == 2 and hints[1].endswith("report hinted"), done.stderr
    shell = subprocess.run(
        ["bash", "-c", hints[1]], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert shell.returncode == 0, (hints[1], shell.stderr)


def test_the_demos_sql_hint_runs_in_a_new_shell(tmp_path, runs_dir, monkeypatch):
    from conftest import event, write_lines

    write_lines(runs_dir / "r" / "events.0.jsonl", [event("r", "metrics", {"train/loss": 2.5}, 1, step=1)])
    db = tmp_path / "demo-store.duckdb"  # OBSERVATORY_DB=... make demo: not the default store
    ingest(runs_dir, db, emit=None)
    monkeypatch.setenv("PATH", BARE_PATH)
    hint = demo._sql_hint(db)
    shell = subprocess.run(
        ["bash", "-c", hint], env=_new_shell_env(tmp_path), capture_output=True, text=True, timeout=120
    )
    assert shell.returncode == 0 and "train/loss" in shell.stdout, (hint, shell.stderr)


def test_the_dashboard_says_its_port_is_taken_before_announcing_a_url(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from observatory.entry import run; run()",
                "dashboard",
                "--port",
                str(port),
            ],
            env={**_new_shell_env(tmp_path), "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=60,
        )
    out = done.stdout + done.stderr
    assert done.returncode != 0 and "Observatory dashboard on" not in out, out
    assert f"port {port} on 127.0.0.1 is already in use: try --port " in out, out
    offered = int(re.search(r"try --port (\d+)", out).group(1))
    assert offered > port
