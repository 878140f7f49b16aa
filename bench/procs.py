"""What the benches share for their child processes: the CLI, a follower, a bench's own `--child` runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

OBSERVATORY = [sys.executable, "-m", "observatory.cli"]


def start_follower(runs: Path, db: Path, **popen) -> subprocess.Popen:
    """`observatory ingest --follow -q` over `runs` into `db`, started (Popen's keywords: env, stdout, ...)."""
    return subprocess.Popen(
        [*OBSERVATORY, "ingest", "--follow", "-q", "--runs-dir", str(runs), "--db", str(db)], **popen
    )


def child_result(script: str, tool: str, args: list[str], timeout: float, env: dict | None = None) -> dict:
    """`python script --child tool *args`: the last JSON line it printed, or {"tool", "missing": why} when
    it failed (a peer tool not installed, or one that broke)."""
    out = subprocess.run(
        [sys.executable, script, "--child", tool, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = [x for x in out.stdout.splitlines() if x.startswith("{")]
    if out.returncode != 0 or not lines:
        return {"tool": tool, "missing": f"failed (rc {out.returncode}): {out.stderr.strip()[-300:]}"}
    return json.loads(lines[-1])
