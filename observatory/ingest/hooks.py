"""Ingest's hooks: the other stages' code that runs on every batch, declared in one place.

Two hook points (after datasette's `hookspecs.py` and `DEFAULT_PLUGINS`); every
implementation is a module's `after_ingest` function:

`in_transaction`: `after_ingest(con, touched: dict[str, set[str]]) -> None`
    Runs inside each batch's write transaction, before its COMMIT, when the batch added
    `metrics` or `expert_load` rows. `con` is the ingester's write connection; `touched`
    maps a source table ("metrics", "expert_load") to the runs that got rows there (read
    by truthiness: the hook finds the new rows itself, as the rollups do from
    `rollup_state`, so a batch it missed is caught up by the next). If it raises, the
    batch is rolled back and done again without it, and the hook is left out for the
    rest of the `ingest` call, which says so (`HookFailed`).

`after_commit`: `after_ingest(db, runs_dir, runs: set[str]) -> set[str]`
    Runs after the batch's commit, outside its transaction, on the runs whose own
    writers sent events in the batch. `db` is one READ-ONLY connection that every
    after-commit hook of the batch shares, so the hooks read beside the dashboard's
    readers instead of holding them out. A hook reads the store through it
    (`store.using`) and writes findings as host-1000 events into run folders; it
    returns the runs whose folders got new events (read by truthiness). If it raises,
    ingest reports it and goes on. When a hook wrote, the pass ingests once more, so
    one `observatory ingest` leaves its findings in the store. What a hook keeps in the
    store (the detectors' `detector_state`) waits in memory and is written by the next
    batch's transaction (`save_pending`), or at the end of the `ingest` call
    (`save_pending_to`).

`BUILTIN` lists the built-in implementations, in the order they run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from observatory import decisions, store
from observatory.detect import scan
from observatory.ladder import watch
from observatory.store import rollups

__all__ = [
    "IN_TRANSACTION",
    "AFTER_COMMIT",
    "ALL_SOURCES",
    "Hook",
    "BUILTIN",
    "HookFailed",
    "run_in_transaction",
    "run_after_commit",
    "save_pending",
    "save_pending_to",
    "ON_CLOCK",
]

IN_TRANSACTION = "in_transaction"
ALL_SOURCES = {"metrics": {"*"}, "expert_load": {"*"}}  # `touched` for "look at every source's new rows"
AFTER_COMMIT = "after_commit"


@dataclass(frozen=True)
class Hook:
    name: str  # in messages: "<name>.after_ingest failed ..."
    point: str  # IN_TRANSACTION or AFTER_COMMIT
    call: Callable[..., Any]  # calls the module's `after_ingest` (looked up at call time)


def _rollups(con, touched: Mapping[str, set[str]], batch: Any) -> None:
    rollups.after_ingest(con, touched)


def _anomalies(con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
    # the runs the batch began are read from its first rowids on (DuckDB skips the row groups before)
    fresh = (
        None
        if batch is None
        else scan.FreshFrom(batch.metrics_start, batch.experts_start, frozenset(batch.new_runs))
    )
    return scan.after_ingest(con, runs_dir, runs, fresh_from=fresh)


def _ladder_watch(con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
    return watch.after_ingest(con, runs_dir, runs)


def _decisions(con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
    return decisions.after_ingest(con, runs_dir, runs)


def _alerts(con, runs_dir: Path, runs: set[str], batch: Any) -> Any:
    from observatory import alerts  # lazy: apprise and the rules file only when a batch or a clock tick asks

    return alerts.after_ingest(con, runs_dir, runs)


BUILTIN = (
    Hook("rollups", IN_TRANSACTION, _rollups),  # observatory.store.rollups.after_ingest
    Hook("anomalies", AFTER_COMMIT, _anomalies),  # observatory.detect.scan.after_ingest
    Hook("ladder_watch", AFTER_COMMIT, _ladder_watch),  # observatory.ladder.watch.after_ingest
    Hook("decisions", AFTER_COMMIT, _decisions),  # observatory.decisions.after_ingest
    Hook("alerts", AFTER_COMMIT, _alerts),  # observatory.alerts.after_ingest (after the findings it reads)
)


# The hooks that also run on the follower's clock (every `CLOCK_S`, with no new event; `runs` empty):
# the detectors' stall check and the alerts, whose conditions change with time alone.
ON_CLOCK = ("anomalies", "alerts")


class HookFailed(Exception):
    """An in-transaction hook raised; the batch must be rolled back and done again without it."""

    def __init__(self, hook: Hook, error: BaseException):
        super().__init__(str(error))
        self.hook = hook
        self.error = error


def run_in_transaction(con, touched: Mapping[str, set[str]], skip: set[str]) -> None:
    """The in-transaction hooks not in `skip`, when `touched` names metrics or expert_load runs."""
    if not (touched["metrics"] or touched["expert_load"]):
        return
    for hook in BUILTIN:
        if hook.point == IN_TRANSACTION and hook.name not in skip:
            try:
                hook.call(con, touched, None)
            except Exception as e:
                raise HookFailed(hook, e) from e


def run_after_commit(
    db: Path,
    runs_dir: Path,
    runs: set[str],
    emit: Callable[[str], None],
    batch: Any = None,
    only: tuple[str, ...] | None = None,
) -> set[str]:
    """The after-commit hooks on `runs`, in order, on one read-only connection; the names of those that
    wrote events. `batch`: the committed batch (`model.Batch`: where its rows began), or None. `only`:
    these hooks alone (`ON_CLOCK`: the follower's clock ticks with no batch)."""
    wrote = set()
    with store.connect(db) as shared:  # read-only: see the module doc
        for hook in BUILTIN:
            if hook.point != AFTER_COMMIT or (only is not None and hook.name not in only):
                continue
            try:
                if hook.call(shared, runs_dir, set(runs), batch):
                    wrote.add(hook.name)
            except Exception as e:  # a detector or record keeper must never take ingest down
                emit(f"observatory ingest: {hook.name}.after_ingest failed: {type(e).__name__}: {e}")
    return wrote


def save_pending(con) -> None:
    """What the after-commit hooks reached on their read-only connection and keep in the store (the
    detectors' state), written by `con`, a write connection, inside its transaction."""
    scan.save_state(con)


def save_pending_to(db: Path, emit: Callable[[str], None]) -> None:
    """`save_pending` in a write transaction of its own, if anything waits (the end of an `ingest` call)."""
    if not scan.unsaved_state(db):
        return
    try:
        with store.write_connection(db) as con:
            con.execute("BEGIN TRANSACTION")
            save_pending(con)
            con.execute("COMMIT")
    except Exception as e:  # a cache: the next ingest re-reads a little more and misses nothing
        emit(
            f"observatory ingest: the detectors' state was not saved ({type(e).__name__}: {e}); "
            "the next ingest re-reads a little more"
        )
