"""Settings as one declarative table, shared by the CLI, the environment and the dashboard.

Each setting has a name, a default, the environment variable that overrides it,
and a line of help; a numeric one may have a range (`low`..`high`, inclusive), and
`get` refuses a value outside it. `get(name)` reads the environment each time, so a
test or a dashboard can change a setting without re-importing anything.

The `anomaly_*` rows are the detector thresholds: `observatory.detect.thresholds`
takes each `Thresholds` field's default from its row here.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass
from typing import Any

__all__ = ["Setting", "SETTINGS", "get", "describe", "quiet", "default", "cli_command", "LOSS_NAMES"]


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    help: str
    low: float | None = None  # inclusive bounds of a numeric setting (None: unbounded)
    high: float | None = None
    path: bool = False  # a path: `~` expanded; a default under ~/.local/share follows $XDG_DATA_HOME

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

    def check(self, value: Any, raw: str) -> Any:
        """`value` (parsed from `raw`), or ValueError naming the env var when it is outside the range."""
        if (self.low is not None and value < self.low) or (self.high is not None and value > self.high):
            raise ValueError(f"{self.env}={raw!r} is out of range: {self.name} must be {self.range_text()}")
        return value

    def range_text(self) -> str:
        """'between 1.0 and 1.5', 'at least 0', ... ('' when unbounded)."""
        if self.low is not None and self.high is not None:
            return f"between {self.low} and {self.high}"
        if self.low is not None:
            return f"at least {self.low}"
        return f"at most {self.high}" if self.high is not None else ""


# the per-user data folder of `runs` and `db` ($XDG_DATA_HOME/observatory when XDG_DATA_HOME is set)
DATA_HOME = "~/.local/share/observatory"
# the names W&B, Hugging Face, Lightning and our trainer users give the loss, most specific first
LOSS_NAMES = (
    "train/loss",
    "train/ce_loss",
    "loss",
    "train_loss",
    "training_loss",
    "train/loss_step",
    "eval/loss",
    "eval_loss",
    "val/loss",
    "val_loss",
    "validation_loss",
)

SETTINGS: dict[str, Setting] = {
    s.name: s
    for s in (
        Setting(
            "runs",
            f"{DATA_HOME}/runs",
            "runs dir: where event logs live (flag --runs-dir); the per-user default is the same from any folder, so a run started anywhere is on the dashboard",
            path=True,
        ),
        Setting("db", f"{DATA_HOME}/observatory.duckdb", "the DuckDB store (flag --db)", path=True),
        Setting(
            "findings_dir",
            f"{DATA_HOME}/findings",
            "where the observatory writes its own events (forecasts, anomalies, decisions, alerts: host 1000) for a runs dir: `<this>/<runs dir's name>-<8 hex of its path>/<run>/events.1000.jsonl`, ingested with the runs dir; the run folders are not written to",
            path=True,
        ),
        Setting(
            "findings_in_run_folders",
            False,
            "write the observatory's own events into each run's folder (`<runs dir>/<run>/events.1000.jsonl`) instead of findings_dir; a run folder that has that file already keeps getting it",
        ),
        Setting(
            "spool_dir",
            f"{DATA_HOME}/spool",
            "a writer's local copy of what it logs to a bucket runs dir (`<this>/<bucket>-<8 hex>/<run>/events.<host>.jsonl`), uploaded from there as chunks; a restarted writer uploads what is left",
            path=True,
        ),
        Setting(
            "chunk_s", 10.0, "a writer to a bucket uploads a chunk this many seconds after the last", low=0.05
        ),
        Setting("chunk_mb", 8.0, "... or once this many MB are waiting, whichever comes first", low=0.001),
        Setting(
            "upload_timeout_s",
            60.0,
            "how long finish() (or a dying process) keeps retrying the last chunk of a bucket runs dir; what is not uploaded stays in spool_dir",
            low=0.0,
        ),
        Setting(
            "journal_margin_s",
            300.0,
            "a bucket reader lists the journal from this many seconds before the newest entry it saw: the writers' clocks may be this far behind each other",
            low=0.0,
        ),
        Setting(
            "bucket_analyst",
            "auto",
            "which observatory following a bucket runs dir runs the analyses (detectors, forecasts, decisions, alerts) and writes their findings to the bucket; the others read them: `auto` (the first to ingest the bucket), `yes` (this one, taking the role over), `no` (a replica)",
        ),
        Setting(
            "loss_names",
            ",".join(LOSS_NAMES),
            "a run's loss: the first of these comma-separated metric names it logged (the Live chart, the Runs table's last loss, the report)",
        ),
        Setting(
            "quiet",
            False,
            "`observatory.init` and `finish` print no line (wandb's `settings=Settings(quiet=True)`; WANDB_QUIET and WANDB_SILENT count too)",
        ),
        Setting(
            "stale_after_s",
            120.0,
            "a run with no run_end and no event for this long is shown as crashed (in an init, compile, eval or checkpoint phase: once its budget_s, else phase_budget_s, has passed too)",
        ),
        Setting("sql_time_limit_ms", 5000, "time limit for one user SQL query"),
        Setting("sql_max_rows", 10000, "row cap for one user SQL query; more rows set `truncated`"),
        Setting(
            "sql_memory_limit_mb",
            512,
            "memory limit for one user SQL query (DuckDB memory_limit, and its worker process may grow by no more)",
        ),
        Setting("sql_threads", 2, "threads one user SQL query may use"),
        Setting(
            "sql_max_concurrent",
            4,
            "user SQL queries that run at once per server process; more wait sql_queue_wait_ms, then are told the server is busy",
        ),
        Setting(
            "sql_queue_wait_ms",
            1000,
            "how long a user SQL query waits for a free slot (sql_max_concurrent) before it is told to try again",
        ),
        Setting("sql_max_result_mb", 64, "largest result one user SQL query may return (after the row cap)"),
        Setting(
            "sql_results_mb",
            256,
            "SQL console results the dashboard keeps for all its visitors together; the oldest go first",
            low=1,
        ),
        Setting(
            "sql_kill_after",
            1.25,
            "a user SQL worker still running at this multiple of sql_time_limit_ms (DuckDB's interrupt did not land: a long scalar function, a frozen process) is SIGKILLed and replaced; 1.5 at most keeps every query under 1.5x its limit",
            low=1.0,
            high=1.5,
        ),
        Setting("lock_timeout_s", 30.0, "how long a reader or writer retries a busy store before giving up"),
        Setting("follow_interval_s", 0.5, "how often `ingest --follow` polls the runs dir"),
        Setting("max_line_bytes", 8 << 20, "ingest rejects an event line longer than this many bytes"),
        Setting(
            "max_rejected_per_file",
            1000,
            "rejected lines of one event log stored with their text in rejected_events; past it they are only counted (ingest_files.rejected), so a hostile log cannot fill the store",
            low=0,
        ),
        Setting("cache_ttl_s", 1.0, "dashboard query cache lifetime"),
        Setting(
            "dashboard_cache_mb",
            256,
            "bytes the dashboard's query cache may hold, and as many its derived results (figures); the least recently used go first",
            low=1,
        ),
        Setting(
            "dashboard_memory_limit_mb",
            1024,
            "DuckDB memory limit of the dashboard's page queries (its buffer cache and working memory; more spills to disk), so a large store cannot grow the server past it",
            low=64,
        ),
        Setting(
            "anomaly_window", 128, "anomaly detectors: trailing window (logged steps) for rolling baselines"
        ),
        Setting(
            "anomaly_min_history", 16, "anomaly detectors: logged steps of history needed before flagging"
        ),
        Setting(
            "anomaly_loss_z",
            6.0,
            "loss spike: robust sigmas above the recent level (noise: IQR of step-to-step changes over the window)",
        ),
        Setting(
            "anomaly_loss_min_rise",
            0.05,
            "loss spike: also needs loss above its recent level by this fraction",
        ),
        Setting(
            "anomaly_loss_dip",
            0.5,
            "loss dip: loss below its recent level by this fraction (and anomaly_loss_z sigmas)",
        ),
        Setting("anomaly_grad_z", 6.0, "grad-norm spike: robust z-score of log grad norm to flag"),
        Setting(
            "anomaly_grad_min_ratio",
            5.0,
            "grad-norm spike: also needs grad norm / its recent level above this",
        ),
        Setting(
            "anomaly_grad_single_ratio",
            10.0,
            "grad-norm spike: one step this many times the level is enough (else two in a row)",
        ),
        Setting(
            "anomaly_grad_growth",
            3.0,
            "grad-norm growth: rolling median / lowest earlier rolling median to flag",
        ),
        Setting("anomaly_growth_steps", 32, "grad-norm growth: logged steps the growth must last"),
        Setting(
            "anomaly_recovery_steps",
            64,
            "incomplete recovery: steps after a loss spike to be back near baseline",
        ),
        Setting(
            "anomaly_recovery_tol", 0.05, "incomplete recovery: allowed fraction above the pre-spike loss"
        ),
        Setting("anomaly_drop_jump", 0.1, "drop-fraction jump: absolute rise over the recent level to flag"),
        Setting("anomaly_drop_z", 6.0, "drop-fraction jump: also needs this many robust sigmas of its noise"),
        Setting(
            "anomaly_hot_ratio",
            4.0,
            "hot expert: max/mean routed load in a layer to flag (can only fire below n_routed/top_k)",
        ),
        Setting(
            "anomaly_expert_steps", 20, "hot/dead expert: consecutive logged steps the condition must last"
        ),
        Setting(
            "anomaly_throughput_drop", 0.5, "throughput drop: flag below this fraction of the trailing median"
        ),
        Setting("anomaly_throughput_steps", 5, "throughput drop: consecutive logged steps it must last"),
        Setting(
            "anomaly_throughput_sustain",
            128,
            "throughput drop: logged steps it must last to warn; a shorter dip (a busy machine) is info",
        ),
        Setting("anomaly_stall_s", 300.0, "stalled run: seconds without events (and no run_end) to flag"),
        Setting(
            "anomaly_trend_steps",
            256,
            "slow changes: the shortest trend window in steps; at a step the window is 1/8 of the steps so far,"
            " from this up to 16x this, and a change must last that long",
        ),
        Setting(
            "anomaly_trend_loss_rise",
            0.05,
            "slow changes: nats the smoothed train or eval loss must rise above its lowest earlier level",
        ),
        Setting(
            "anomaly_trend_ratio",
            2.0,
            "slow changes: times its lowest earlier smoothed level the grad norm or drop fraction must grow",
        ),
        Setting("anomaly_drop_max", 0.07, "MoE health: the smoothed drop fraction's limit"),
        Setting(
            "anomaly_entropy_fall",
            0.15,
            "MoE health: nats the smoothed router entropy must fall below its highest earlier level",
        ),
        Setting(
            "anomaly_entropy_floor",
            0.0,
            "MoE health: the smoothed router entropy's floor (0: none; it depends on the expert count, e.g."
            " 5.92 for 384 experts)",
            low=0.0,
        ),
        Setting(
            "anomaly_throughput_loss",
            0.8,
            "sustained throughput loss: smoothed tokens/s or MFU below this fraction of its earlier best"
            " (or of the config's `baseline_run`)",
        ),
        Setting(
            "anomaly_crash_steps",
            5,
            "crash loop: failures of the same type this many steps apart or less in consecutive attempts are one",
        ),
        Setting(
            "heartbeat_s",
            30.0,
            "every writing process sends a heartbeat (its step, phase and host telemetry) this often; 0 turns them off",
            low=0.0,
        ),
        Setting(
            "key_file",
            f"{DATA_HOME}/observatory.key",
            "the private Ed25519 key the observatory signs its findings with (made on first use, mode 0600; keep it off the runs dir)",
            path=True,
        ),
        Setting(
            "trusted_keys",
            "ed25519:EdxLOxWshzDRetSIrI9Za0nsEmdOzdBd189qfRmLUyk=",
            "public keys (`ed25519:<base64>`, space-separated) whose signed findings ingest accepts besides "
            "this observatory's own: the committed samples' key by default; add your lab's earlier keys "
            "after a rotation",
        ),
        Setting(
            "alerts_file",
            "",
            "alert rules, channels, silences and disabled rules (YAML; `observatory alerts`); empty: the store's own, `<store>.alerts.yaml` beside it (`observatory.duckdb`: `observatory.alerts.yaml`)",
            path=True,
        ),
        Setting(
            "alert_horizon_s",
            21600.0,
            "alerts: a running or crashed run is watched until its writers have been silent this long",
            low=60.0,
        ),
        Setting(
            "alert_episode_steps",
            200,
            "alerts: a finding's alert resolves once the run is this many steps past its newest finding",
            low=1,
        ),
        Setting(
            "phase_budget_s",
            1800.0,
            "how long init, compile, eval or checkpoint may take before it is a stall, when the phase event gives no budget_s",
            low=1.0,
        ),
        Setting("public_url", "http://localhost:8501", "the dashboard's address, for the links in alerts"),
        Setting(
            "ladder_deviation_evals", 3, "ladder: consecutive evals outside a target's forecast band to flag"
        ),
    )
}


def get(name: str) -> Any:
    s = SETTINGS[name]
    raw = os.environ.get(s.env)
    if s.path:
        return _expand(s.default if raw is None or raw == "" else raw, raw is None or raw == "")
    return s.default if raw is None or raw == "" else s.check(s.parse(raw), raw)


def default(name: str) -> Any:
    """A setting's value in a shell that does not set its environment variable."""
    s = SETTINGS[name]
    return _expand(s.default, True) if s.path else s.default


def _expand(value: str, default: bool) -> str:
    """A path setting's value with `~` expanded; the default's data folder under $XDG_DATA_HOME when set."""
    xdg = os.environ.get("XDG_DATA_HOME")
    if default and xdg and value.startswith("~/.local/share/"):
        value = os.path.join(xdg, value.removeprefix("~/.local/share/"))
    return os.path.expanduser(value)


def quiet() -> bool:
    """Whether `init` and `finish` keep quiet: the `quiet` setting, or wandb's WANDB_QUIET / WANDB_SILENT."""
    on = ("1", "true", "yes", "on")
    return bool(get("quiet")) or any(
        os.environ.get(v, "").strip().lower() in on for v in ("WANDB_QUIET", "WANDB_SILENT")
    )


def describe() -> list[tuple[str, Any, str, str]]:
    """(name, current value, env var, help) for every setting."""
    return [(s.name, get(s.name), s.env, s.help) for s in SETTINGS.values()]


def cli_command() -> str:
    """How a new shell runs this environment's `observatory` command, for the hints we print: the bare
    name when the `observatory` on PATH is this one, else this environment's script by its absolute
    path (a venv that is not active: `make demo`'s, a training script's `.venv/bin/python train.py`)."""
    here = os.path.join(os.path.dirname(sys.executable), "observatory")
    found = shutil.which("observatory")
    if not os.path.exists(here) or (found and os.path.realpath(found) == os.path.realpath(here)):
        return "observatory"
    return shlex.quote(here)
