"""Helpers for the W&B tests: a new user's environment, a script run as that user, a real W&B offline run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# the settings that would say where runs go, or hush what init prints: a new user has none of them
USER_SETTINGS = (
    "OBSERVATORY_RUNS",
    "OBSERVATORY_DB",
    "XDG_DATA_HOME",
    "OBSERVATORY_QUIET",
    "WANDB_QUIET",
    "WANDB_SILENT",
)


def user_env(home: Path, **extra: str) -> dict[str, str]:
    """This environment as a new user with `home` has it (none of USER_SETTINGS), plus `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in USER_SETTINGS}
    return {**env, "HOME": str(home), **extra}


def run_as_user(cmd: list[str], cwd: Path, home: Path) -> subprocess.CompletedProcess:
    """`cmd` in `cwd` as a new user with `home` (`user_env`); it must succeed."""
    out = subprocess.run(cmd, cwd=cwd, env=user_env(home), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out


def run_wandb_offline(script: str, out: Path) -> None:
    """`script` (given `out` as its argument) with the real wandb, offline, its files under `out`."""
    env = dict(os.environ, WANDB_MODE="offline", WANDB_DIR=str(out), WANDB_SILENT="true")
    env.pop("WANDB_API_KEY", None)
    subprocess.run([sys.executable, "-c", script, str(out)], check=True, env=env, timeout=300)
