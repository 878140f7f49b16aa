"""Shared fixtures: a temp runs dir and store, and a helper to write raw event lines.

Keep this file small and additive; area-specific fixtures live in their test modules.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest

# The test tiers (`make check`, `make test`) and the guard that keeps the quick one quick.
pytest_plugins = ["tiers"]

# Simulated CPU devices for the MoE expert-parallel tests (8-device meshes); it must be set before
# jax is first imported in this pytest process. setdefault keeps a value the user already exported.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# Every ingest evaluates the alert rules: the tests' rules are their own (none unless a test writes a file),
# never the developer's per-user rules file and its channels.
os.environ["OBSERVATORY_ALERTS_FILE"] = os.path.join(
    tempfile.mkdtemp(prefix="obs-test-alerts-"), "alerts.yaml"
)
# The observatory's own events go to a findings folder per runs dir: the tests' under a temp folder of
# their own, not the developer's ~/.local/share/observatory/findings (each test's runs dir has its own).
os.environ["OBSERVATORY_FINDINGS_DIR"] = tempfile.mkdtemp(prefix="obs-test-findings-")
# the key the observatory signs its findings with: the tests' own, never the developer's
os.environ["OBSERVATORY_KEY_FILE"] = os.path.join(tempfile.mkdtemp(prefix="obs-test-key-"), "observatory.key")


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium (tests/browser_fixtures.py), one per test module that asks for it."""
    # imported here, not at the top: the browser helpers (playwright, the report module) load only for browser tests
    from browser_fixtures import chromium

    with chromium() as b:
        yield b


@pytest.fixture
def runs_dir(tmp_path) -> Path:
    d = tmp_path / "runs"
    d.mkdir()
    return d


@pytest.fixture
def db_path(tmp_path) -> Path:
    return tmp_path / "store.duckdb"


def event(
    run: str, kind: str, data: dict, seq: int, step: int | None = None, t: float | None = None, host: int = 0
) -> dict:
    """One event envelope (version 1) as a dict; `t` defaults to now (so the run is not stale).

    A finding in the observatory's own file is signed, as its writer signs it (`observatory.provenance`)."""
    from observatory import provenance
    from observatory.events import OBSERVATORY_HOST

    t = time.time() if t is None else t
    ev = {
        "v": 1,
        "run": run,
        "kind": kind,
        "step": step,
        "t": t + seq * 0.01,
        "host": host,
        "seq": seq,
        "data": data,
    }
    return provenance.signed(ev) if host == OBSERVATORY_HOST and kind in provenance.FINDING_KINDS else ev


def append_in_pieces(src: Path, dst: Path, n: int):
    """Grow copies under `dst` of `src`'s event logs in `n` pieces cut at line ends; yields after each piece.

    The way a live run's logs reach an ingester: after the last piece the copies equal the sources.
    """
    datas = {p: p.read_bytes() for p in sorted(src.glob("*/events.*.jsonl"))}
    for k in range(1, n + 1):
        for p, data in datas.items():
            cut = data.rfind(b"\n", 0, len(data) * k // n) + 1 if k < n else len(data)
            out = dst / p.relative_to(src)
            out.parent.mkdir(parents=True, exist_ok=True)
            done = out.stat().st_size if out.exists() else 0
            with open(out, "ab") as f:
                f.write(data[done:cut])
        yield k


def recounted_copy(db: Path, tmp_path: Path) -> Path:
    """A copy of the store `db` whose rollups `rollups.rebuild_rollups` recounted from its tables, by SQL."""
    import shutil

    import duckdb

    from observatory.store import rollups

    copy = tmp_path / "recounted.duckdb"
    shutil.copy(db, copy)
    with duckdb.connect(str(copy)) as con:
        con.execute("BEGIN")
        rollups.rebuild_rollups(con)
        con.execute("COMMIT")
    return copy


def write_lines(path: Path, lines, mode: str = "a") -> Path:
    """Append raw lines (dicts are JSON-encoded; str/bytes are written as given, plus a newline)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode + "b") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line, separators=(",", ":"))
            f.write((line.encode() if isinstance(line, str) else line) + b"\n")
    return path


def write_stall_finding(runs_dir: Path, run: str, step: int, t: float | None = None) -> Path:
    """The observatory's own finding "stalled" on `run` at `step`, in its file of that run (signed)."""
    from observatory.events import OBSERVATORY_HOST

    data = {"detector": "stall", "severity": "warn", "message": "silent"}
    finding = event(run, "anomaly", data, 0, step, t=t, host=OBSERVATORY_HOST)
    return write_lines(runs_dir / run / f"events.{OBSERVATORY_HOST}.jsonl", [finding])


@pytest.fixture
def make_event():
    return event


@pytest.fixture
def append_lines():
    return write_lines


@pytest.fixture
def empty_store(tmp_path, monkeypatch):
    """An ingested store with no runs, set as the dashboard's (OBSERVATORY_DB), its cache TTL 0.3 s."""
    from observatory.pipeline import ingest  # lazy: conftest sets the environment before our modules load

    (tmp_path / "runs").mkdir()
    db = tmp_path / "store.duckdb"
    ingest(tmp_path / "runs", db, emit=None)
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    monkeypatch.setenv("OBSERVATORY_CACHE_TTL_S", "0.3")
    return db


@pytest.fixture
def query_cache(monkeypatch):
    """The dashboard's query cache of a fresh server process (`cache.CACHE`), its keeper stopped after."""
    from observatory.dashboard import cache

    fresh = cache.QueryCache()
    monkeypatch.setattr(cache, "CACHE", fresh)
    yield fresh
    fresh.stop()
