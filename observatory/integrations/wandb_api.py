"""The wandb-compatible API: `import observatory as wandb` runs a W&B training loop unchanged.

    import observatory as wandb
    run = wandb.init(project="mnist", config={"lr": 3e-4})
    for epoch in range(10):
        wandb.log({"loss": loss, "acc": acc})
    wandb.finish()

`init` returns a `Run`, the event writer (`observatory.writer.Run`: the call site never
waits on the disk) with wandb's `log(data, step=None, commit=None)`, `config`, `summary`,
`define_metric`, `name`, `id` and `finish(exit_code=)`. trackio's `init(project, name,
group, config=)`, `log(metrics, step=None)` and `finish()` are the same calls.

wandb's step rules, one `metrics` event per `log` call:

- `step=None` logs at the current step, and a committed log (the default) then advances it by one;
- `commit=False` logs at the current step and does not advance it, so values accumulate into
  that step until the next committed log; with an explicit `step`, `commit` defaults to False;
- an explicit step above the current one moves the current step there; one below it is refused
  as wandb refuses it: the data is dropped with wandb's warning, counted in `run.refused_logs`
  and, when there were any, in the final summary as `writer/refused_logs`.

As in wandb, a run the script does not finish is finished at exit (`completed`, or `failed`
after an uncaught exception).

Called with our writer's own argument names (`run_id=`, `runs_dir=`), `init` keeps the writer's
rules instead: an explicit step may go back (a trainer's rollback re-logs earlier steps), and a
run that is not finished stays without `run_end` (a crash). `wandb_rules=` chooses explicitly.

`define_metric(name, step_metric=, summary=, goal=, ...)` is recorded in the run's summary as
`_define_metric/<name>`, the JSON of its arguments; its `summary` statistics become summary
keys `<metric>/min`, `/max`, `/mean`, `/first`, `/best` (`last` keeps the metric's own key).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from observatory import bucket, settings, writer
from observatory.events import OBSERVATORY_HOST, STATUSES
from observatory.integrations.wandb_objects import (
    Config,
    ConfigError,
    Error,
    MetricRule,
    PreInit,
    Settings,
    Summary,
    config_changes,
    config_dict,
    flatten_metrics,
)
from observatory.redact import redact

__all__ = [
    "Error",
    "ConfigError",
    "Settings",
    "PreInit",
    "Run",
    "DisabledRun",
    "init",
    "log",
    "finish",
    "define_metric",
    "watch",
    "active",
    "on_active_change",
    "RESUME_MODES",
]

RESUME_MODES = (None, False, True, "allow", "auto", "must", "never")
MODES = (None, "online", "offline", "shared", "disabled")
# wandb and trackio arguments that shape W&B's or trackio's servers, code saving or UI: accepted, unused
IGNORED_INIT_ARGS = frozenset(
    "entity job_type save_code settings anonymous force sync_tensorboard tensorboard monitor_gym magic "
    "space_id space_storage dataset_id private embed webhook_url "
    "webhook_min_level".split()
)


class Run(writer.Run):
    """A run with wandb's `log`, `config`, `summary` and `define_metric` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.name: str = self.id
        self.project: str | None = None
        self.group: str | None = None
        self.notes: str | None = None
        self.tags: tuple[str, ...] = ()
        self.step = 0  # wandb's current step: where the next log goes
        self.config = Config(self)
        self.summary = Summary(self)
        self.refused_logs = 0
        self.wandb_rules = True  # False: the writer's rules (see the module docstring)
        self._rules: list[MetricRule] = []
        self._rule_of: dict[str, MetricRule | None] = {}
        self.quiet = True  # `init` sets it: False prints a line at init and at finish (see `_say`)

    disabled = False

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        """Log scalars (nested dicts as `a/b`) by wandb's step rules; the call never waits on the disk."""
        if self._finished:
            raise RuntimeError(f"run {self.id} is finished; start a new one with observatory.init")
        if not isinstance(data, Mapping):
            raise TypeError(f"log: metrics must be a dict of name to number, got {type(data).__name__}")
        if step is not None:
            step = writer.check_step(step, "log")
            if step < self.step and self.wandb_rules:
                self._refuse(step)
                return
            self.step = step
        flat: dict[str, float] = {}
        flatten_metrics("", data, flat)
        at = self.step
        if flat:
            self._put_metrics(flat, at)
            self.summary._data.update(flat)
            if self._rules:
                self._aggregate(flat)
        if commit is None:
            commit = step is None  # wandb: an explicit step does not commit unless told to
        if commit:
            self.step = at + 1

    def define_metric(
        self,
        name: str,
        step_metric: str | None = None,
        step_sync: bool | None = None,
        hidden: bool | None = None,
        summary: str | None = None,
        goal: str | None = None,
        overwrite: bool | None = None,
    ) -> None:
        """Record what wandb's define_metric says, as `_define_metric/<name>` in the summary."""
        if not isinstance(name, str) or not name or (name.endswith("*") and "*" in name[:-1]):
            raise ValueError(
                f"define_metric: name must be a metric name or a prefix glob like 'train/*', got {name!r}"
            )
        spec = {
            k: v
            for k, v in (
                ("step_metric", step_metric),
                ("step_sync", step_sync),
                ("hidden", hidden),
                ("summary", summary),
                ("goal", goal),
            )
            if v is not None
        }
        if summary is not None or goal is not None:
            rule = MetricRule(name, summary, goal)
            self._rules = [r for r in self._rules if r.name != name] + [rule]
            self._rule_of.clear()
        self.summary.update({f"_define_metric/{name}": json.dumps(spec, sort_keys=True)})

    def watch(self, *args: Any, **kwargs: Any) -> None:
        """Accepted and not done: gradients and parameters are not recorded (log grad norms with `log`)."""
        _warn_once("watch", "wandb.watch records nothing here; log gradient norms with wandb.log")

    def finish(
        self,
        status: str | int | None = None,
        final_step: int | None = None,
        *,
        exit_code: int | None = None,
        quiet: bool | None = None,
    ) -> None:
        """wandb's `finish(exit_code=)` (non-zero: `failed`) or the writer's `finish(status)`."""
        if isinstance(status, int) and not isinstance(status, bool):
            exit_code, status = status, None
        if status is None:
            status = "completed" if exit_code in (None, 0) else "failed"
        if status not in STATUSES:
            raise ValueError(f"finish: status must be one of {', '.join(STATUSES)}, got {status!r}")
        if not self._finished:
            final = self.summary.final()
            if self.refused_logs:
                final["writer/refused_logs"] = self.refused_logs
            if final:
                self._put("summary", redact(final), None)
        done = self._finished
        super().finish(status, final_step)
        if not done and not (quiet or self.quiet):
            _say(
                f"run {self.id} {status}, {self.logged_events} events in {self.where}; "
                f"see it: {show_command(self.runs_dir, f'report {self.id}')}"
            )
        _deactivate(self)

    def _aggregate(self, flat: dict[str, float]) -> None:
        rule_of = self._rule_of
        for key, value in flat.items():
            rule = rule_of.get(key, _UNSEEN)
            if rule is _UNSEEN:
                rule = rule_of[key] = next((r for r in reversed(self._rules) if r.matches(key)), None)
            if rule is not None:
                rule.add(key, value, self.summary)

    def _refuse(self, step: int) -> None:
        self.refused_logs += 1
        n = self.refused_logs
        if n == 1 or n % 1000 == 0:
            _warn(
                f"Tried to log to step {step} that is less than the current step {self.step}. Steps must be "
                f"monotonically increasing, so this data will be ignored ({n} refused so far in run {self.id}; "
                "the count is run.refused_logs and the summary's writer/refused_logs)."
            )

    def _atexit(self) -> None:
        if self.wandb_rules and not self._finished and self._signal is None and not self._stop.is_set():
            self._exiting = True  # as wandb does, a run the script did not finish is finished at exit
            self.finish("completed")
            return
        super()._atexit()


_UNSEEN = object()


class DisabledRun:
    """wandb's `mode="disabled"`: the same calls, in memory only; nothing is written."""

    disabled = True

    def __init__(self, run_id: str, name: str | None, config: Mapping[str, Any]):
        self.id = run_id
        self.name = name or run_id
        self.project = self.group = self.notes = None
        self.tags: tuple[str, ...] = ()
        self.step = 0
        self.dir = self.path = None
        self.config = Config(None, config)
        self.summary = Summary(None)
        self.refused_logs = 0

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        pass

    def define_metric(self, name: str, *args: Any, **kwargs: Any) -> None:
        pass

    def watch(self, *args: Any, **kwargs: Any) -> None:
        pass

    def event(self, kind: str, data: Mapping[str, Any], step: int | None = None) -> None:
        pass

    def note(self, text: str, author: str | None = None, step: int | None = None) -> None:
        pass

    def log_expert_load(self, *args: Any, **kwargs: Any) -> None:
        pass

    def flush(self, timeout: float = 10.0) -> None:
        pass

    def finish(self, *args: Any, **kwargs: Any) -> None:  # the Run's arguments, all ignored
        _deactivate(self)

    def __enter__(self) -> DisabledRun:
        return self

    def __exit__(self, *exc: Any) -> bool:
        self.finish()
        return False


# ------------------------------------------------------------- the active run

_active: Run | DisabledRun | None = None
_listeners: list[Callable[[Run | DisabledRun | None], None]] = []
_warned: set[str] = set()
_previous_excepthook: Callable | None = None


def active() -> Run | DisabledRun | None:
    """The run module-level `log`, `config` and `summary` act on (wandb's `wandb.run`)."""
    return _active


def on_active_change(fn: Callable[[Run | DisabledRun | None], None]) -> None:
    """Call `fn(run)` now and whenever the active run changes (`observatory` rebinds `run`, `config`, `summary`)."""
    _listeners.append(fn)
    fn(_active)


def _set_active(run: Run | DisabledRun | None) -> None:
    global _active
    _active = run
    for fn in _listeners:
        fn(run)


def _deactivate(run: Run | DisabledRun) -> None:
    if _active is run:
        _set_active(None)


def _excepthook(exc_type, exc, tb) -> None:
    """An exception that ends the script ends the active run: `failure`, then run_end `failed` (or `killed`)."""
    run = _active
    if isinstance(run, Run) and run.wandb_rules and not run._finished:
        try:
            run.__exit__(exc_type, exc, tb)
        except Exception as e:  # the script's own traceback must still be printed
            _warn(f"could not end run {run.id}: {e}")
    (_previous_excepthook or sys.__excepthook__)(exc_type, exc, tb)


def _install_excepthook() -> None:
    global _previous_excepthook
    if sys.excepthook is not _excepthook:
        _previous_excepthook = sys.excepthook
        sys.excepthook = _excepthook


def show_command(runs_dir: Path | str, then: str) -> str:
    """The command that ingests the runs of `runs_dir` (named when it is not the default), then runs
    `observatory <then>`; one that works in a new shell (`settings.cli_command`: the absolute path of
    this environment's `observatory` when it is not on PATH; the default runs dir is the one a new shell
    has, without the environment's OBSERVATORY_RUNS)."""
    obs = settings.cli_command()
    here, default = bucket.location(runs_dir), bucket.location(settings.default("runs"))
    if isinstance(here, Path) and isinstance(default, Path):
        here, default = here.resolve(), default.resolve()
    flag = "" if here == default else f" --runs-dir {shlex.quote(bucket.safe(str(here)))}"
    return f"{obs} ingest{flag} && {obs} {then}"


def _quiet(ws: Any) -> bool:
    """wandb's `settings=Settings(quiet=True)` (or silent, or a dict of them), the `quiet` setting, WANDB_QUIET."""
    get = ws.get if isinstance(ws, Mapping) else (lambda k: getattr(ws, k, None))
    return settings.quiet() or (ws is not None and bool(get("quiet") or get("silent")))


def _say(msg: str) -> None:
    """The line `init` and `finish` print (stderr, as wandb's `wandb: ...` lines)."""
    print(f"observatory: {msg}", file=sys.stderr, flush=True)


def _warn(msg: str) -> None:
    print(f"observatory: {msg}", file=sys.stderr)


def _warn_once(key: str, msg: str) -> None:
    if key not in _warned:
        _warned.add(key)
        _warn(msg)


def _version() -> str:
    from importlib import metadata  # ~0.05 s to import: here, not at every `import observatory`

    try:
        return metadata.version("observatory")
    except metadata.PackageNotFoundError:
        return "unknown"


def _resumed(path: Path) -> tuple[dict, int | None]:
    """A run's config from its first run_start and its last metrics step, read from its event log."""
    config: dict | None = None
    last: int | None = None
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")[:-1]  # the part after the last newline is empty or torn
    for raw in lines:
        if b'"run_start"' in raw:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("kind") == "run_start":
                config = (ev.get("data") or {}).get("config") or {}
                break
    for raw in reversed(lines):  # wandb-style steps only grow: the last metrics event has the highest
        if b'"metrics"' in raw:
            try:
                ev = json.loads(raw)
            except ValueError:
                continue
            if ev.get("kind") == "metrics" and isinstance(ev.get("step"), int):
                last = ev["step"]
                break
    return config or {}, last


def _fork_point(spec: str | None, what: str) -> dict | None:
    """wandb's `fork_from="<run>?_step=<n>"` as a run_start parent."""
    if spec is None:
        return None
    run, sep, step = spec.partition("?_step=")
    if not sep or not step.isdigit() or not run:
        raise ValueError(f"init: {what} must look like '<run id>?_step=<step>', got {spec!r}")
    return {"run": run, "step": int(step)}


def init(
    project: str | None = None,
    name: str | None = None,
    group: str | None = None,
    *,
    config: Any = None,
    tags: Iterable[str] | None = None,
    notes: str | None = None,
    id: str | None = None,  # noqa: A002 - wandb's argument name
    resume: bool | str | None = None,
    dir: str | os.PathLike | None = None,  # noqa: A002 - wandb's argument name
    mode: str | None = None,
    reinit: bool | str | None = None,
    allow_val_change: bool | None = None,
    config_exclude_keys: Iterable[str] | None = None,
    config_include_keys: Iterable[str] | None = None,
    fork_from: str | None = None,
    resume_from: str | None = None,
    run_id: str | None = None,
    runs_dir: str | os.PathLike | None = None,
    host: int = 0,
    parent: Mapping[str, Any] | None = None,
    source: Mapping[str, Any] | None = None,
    write_start: bool = True,
    wandb_rules: bool | None = None,
    **kwargs: Any,
) -> Run | DisabledRun:
    """Start a run, wandb's way or ours; it becomes the active run of module-level `log`, `config`, `summary`.

    wandb's arguments: `project`, `name`, `group`, `notes`, `tags` go into run_start; `id=` is the
    run id (ours: `run_id=`); `dir=` is the runs dir (ours: `runs_dir=`, default the `runs` setting).
    `mode`: "online", "offline" and "shared" write the event log alike; "disabled" returns a
    `DisabledRun` that writes nothing. `fork_from`/`resume_from="<run>?_step=<n>"` become the
    run_start parent. `resume` with an id whose event log exists:

    - "allow", "auto", True: continue that run: no new run_start, seq numbering and wandb's step go
      on after what the log holds, a `config` that differs from its run_start writes a `config_diff`;
      a run that does not exist yet starts fresh;
    - "must": continue it, or raise `Error` when it does not exist;
    - "never": raise `Error` when it exists;
    - None, False: append to it as a new start (a new run_start), step from 0: the writer's own rule.

    `reinit` while a run is active: "return_previous" returns it; "finish_previous" or True finishes
    it first; "create_new" starts a run and leaves the active one as it is; by default the new run
    starts and becomes the active one, the old one running on. The arguments of our writer
    (`host`, `parent`, `ladder`, `code`, `data`, `mesh`, `model`, `sinks`, `write_start`, writer
    options) pass through; wandb's and trackio's server and UI arguments are accepted and unused.
    `wandb_rules` (default: True unless `run_id=` or `runs_dir=` is given) is whether the run follows
    wandb's step and exit rules or the writer's (see the module docstring).
    """
    if mode not in MODES:
        raise ValueError(f"init: mode must be one of online, offline, shared, disabled, got {mode!r}")
    if resume not in RESUME_MODES:
        raise ValueError(
            f"init: resume must be one of allow, auto, must, never, True, False, None, got {resume!r}"
        )
    if id is not None and run_id is not None and id != run_id:
        raise ValueError(f"init: id={id!r} and run_id={run_id!r} name two runs; pass one")
    quiet = _quiet(kwargs.get("settings"))
    for key in [k for k in kwargs if k in IGNORED_INIT_ARGS]:
        kwargs.pop(key)
    auto_gpu = _gpu_heartbeats(kwargs)
    if reinit in ("return_previous", False) and _active is not None:
        return _active
    if reinit in ("finish_previous", True) and _active is not None:
        _active.finish()
    rid = id or run_id
    if wandb_rules is None:
        wandb_rules = run_id is None and runs_dir is None
    cfg = config_dict(config)
    if config_include_keys is not None:
        cfg = {k: v for k, v in cfg.items() if k in set(config_include_keys)}
    if config_exclude_keys is not None:
        cfg = {k: v for k, v in cfg.items() if k not in set(config_exclude_keys)}

    if mode == "disabled":
        run: Run | DisabledRun = DisabledRun(rid or writer.new_run_id(name or project), name, cfg)
    else:
        run = _start(
            rid,
            project,
            name,
            cfg,
            tags,
            group,
            notes,
            resume,
            runs_dir or dir,
            host,
            parent or _fork_point(fork_from, "fork_from") or _fork_point(resume_from, "resume_from"),
            source,
            write_start,
            allow_val_change,
            wandb_rules,
            kwargs,
        )
        run.quiet = quiet
        if auto_gpu:
            _check_gpu_telemetry()
        if not quiet:
            _say(f"run {run.id} logs to {run.where}; see it: {show_command(run.runs_dir, 'dashboard')}")
        _install_excepthook()
    if reinit != "create_new":
        _set_active(run)
    return run


GPU_LOG_INTERVAL_S = 10.0  # trackio's default gpu_log_interval


def _gpu_heartbeats(kwargs: dict) -> bool:
    """trackio's `auto_log_gpu=True` (and `gpu_log_interval=` seconds): the heartbeats, which carry the
    accelerators' telemetry (`accel/<i>/...`), at least that often, even where `heartbeat_s` turned them off."""
    auto, every = kwargs.pop("auto_log_gpu", None), kwargs.pop("gpu_log_interval", None)
    if not auto:
        return False
    if every is not None and (isinstance(every, bool) or not isinstance(every, (int, float)) or every <= 0):
        raise ValueError(f"init: gpu_log_interval must be a number of seconds > 0, got {every!r}")
    every = float(every or GPU_LOG_INTERVAL_S)
    beat = kwargs.get("heartbeat_s", settings.get("heartbeat_s"))
    kwargs["heartbeat_s"] = every if not beat or beat <= 0 else min(float(beat), every)
    return True


def _check_gpu_telemetry() -> None:
    """Say so when `auto_log_gpu=True` has no accelerator to report on: heartbeats carry host telemetry only."""
    from observatory.telemetry import Sampler

    if not any(name.startswith("accel/") for name in Sampler().sample()):
        import warnings

        warnings.warn(
            "init: auto_log_gpu=True but no accelerator telemetry here: the heartbeats carry system/* only "
            "(NVIDIA GPUs need nvidia-ml-py installed; jax's memory_stats are read once jax is imported)",
            stacklevel=3,
        )


def _start(
    rid,
    project,
    name,
    cfg,
    tags,
    group,
    notes,
    resume,
    runs_dir,
    host,
    parent,
    source,
    write_start,
    allow_val_change,
    wandb_rules,
    options,
) -> Run:
    runs_dir = bucket.location(runs_dir if runs_dir is not None else settings.get("runs"))
    if resume == "must" and rid is None:
        raise Error("init: resume='must' needs id= (the run to continue)")
    log_file = writer.log_path(runs_dir, rid, host) if rid else None
    exists = log_file is not None and log_file.is_file() and log_file.stat().st_size > 0
    if resume == "must" and not exists:
        raise Error(f"init: resume='must' but run {rid!r} has no event log under {runs_dir}")
    if resume == "never" and exists:
        raise Error(
            f"init: resume='never' but run {rid!r} already exists under {runs_dir}; "
            "pass a new id, or resume='allow' to continue it"
        )
    resuming = exists and resume in (True, "allow", "auto", "must")
    prior, last_step = _resumed(log_file) if resuming else ({}, None)
    run = writer.init(
        run_id=rid or writer.new_run_id(name or project),
        name=name,
        config=cfg,
        runs_dir=runs_dir,
        host=host,
        parent=parent,
        tags=list(tags)
        if tags is not None and not isinstance(tags, str)
        else tags,  # a str: the writer refuses it
        project=project,
        group=group,
        notes=notes,
        source=source
        if source is not None or not wandb_rules
        else {"trainer": "wandb-api", "version": _version()},
        write_start=write_start and not resuming,
        run_class=Run,
        **options,
    )
    if host < OBSERVATORY_HOST:  # a process of the run (not the observatory's own file): its phases
        run.phase("init")  # the first log says "train" (the writer's rule): a hang before it is told apart
    run.name = name or run.id
    run.wandb_rules = wandb_rules
    run.project, run.group, run.notes = project, group, notes
    run.tags = tuple(tags or ())
    run.config = Config(run, {**prior, **cfg}, allow_val_change)
    if resuming:
        run.step = 0 if last_step is None else last_step + 1
        changes = config_changes(prior, redact(cfg))  # the log holds the redacted config
        run.config._write(changes)
    return run


# ------------------------------------------------- module-level wandb calls


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """`wandb.log`: log to the active run."""
    run = _active
    if run is None:
        raise Error("You must call wandb.init() before wandb.log()")
    run.log(data, step=step, commit=commit)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """`wandb.finish`: finish the active run, if there is one."""
    if _active is not None:
        _active.finish(exit_code=exit_code, quiet=quiet)


def define_metric(name: str, *args: Any, **kwargs: Any) -> None:
    """`wandb.define_metric` on the active run."""
    if _active is None:
        raise Error("You must call wandb.init() before wandb.define_metric()")
    _active.define_metric(name, *args, **kwargs)


def watch(*args: Any, **kwargs: Any) -> None:
    """`wandb.watch`: accepted on an active run, records nothing."""
    if _active is None:
        raise Error("You must call wandb.init() before wandb.watch()")
    _active.watch(*args, **kwargs)
