"""Settings as one declarative table, shared by the CLI, the environment and the dashboard.

Each setting has a name, a default, the environment variable that overrides it,
and a line of help. `get(name)` reads the environment each time, so a test or a
dashboard can change a setting without re-importing anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

__all__ = ["Setting", "SETTINGS", "get", "describe"]


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str

    @property
    def env(self) -> str:
        return "OBSERVATORY_" + self.name.upper()

    def parse(self, raw: str) -> Any:
        if isinstance(self.default, bool):
            return raw.strip().lower() in ("1", "true", "yes", "on")
        if isinstance(self.default, int):
            return int(raw)
        if isinstance(self.default, float):
            return float(raw)
        return raw


SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting("runs", "data/runs", "runs dir: where event logs live (flag --runs-dir)"),
        Setting("db", "data/observatory.duckdb", "the DuckDB store (flag --db)"),
        Setting("stale_after_s", 120.0, "a run with no run_end and no event for this long is shown as crashed"),
        Setting("sql_time_limit_ms", 5000, "time limit for one user SQL query"),
        Setting("sql_max_rows", 10000, "row cap for one user SQL query; more rows set `truncated`"),
        Setting("lock_timeout_s", 30.0, "how long a reader or writer retries a busy store before giving up"),
        Setting("follow_interval_s", 0.5, "how often `ingest --follow` polls the runs dir"),
        Setting("cache_ttl_s", 2.0, "dashboard query cache lifetime"),
    )
}


def get(name: str) -> Any:
    s = SETTINGS[name]
    raw = os.environ.get(s.env)
    return s.default if raw is None or raw == "" else s.parse(raw)


def describe() -> list[tuple[str, Any, str, str]]:
    """(name, current value, env var, help) for every setting."""
    return [(s.name, get(s.name), s.env, s.help) for s in SETTINGS.values()]
