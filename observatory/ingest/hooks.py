"""Ingest's hooks: the other stages' code that runs on every batch, declared in one place.

Two hook points (after datasette's `hookspecs.py` and `DEFAULT_PLUGINS`); every
implementation is a module's `after_ingest` function:

`in_transaction`: `after_ingest(con, touched: dict[str, set[str]], rows) -> None`
    Runs in a write transaction, when the batch added `metrics` or `expert_load`
    rows: for a catch-up batch (`ingest.passes.ROLL_UP_APART_BELOW` bytes or more)
    inside the batch's own, before its COMMIT; for a live run's small batch right
    after its commit, in one transaction for each source table it added rows to
    (`ingest.passes._roll_up`: short holds, with waiting readers let in between).
    `con` is the ingester's write connection; `touched` maps a source table
    ("metrics", "expert_load") to the runs that got rows there (read by truthiness:
    the hook finds the new rows itself, as the rollups do from `rollup_state`, so a
    kill before it ran is caught up by the next call). `rows`: a catch-up batch's new rows
    as arrays per source table ({"metrics": `store.metric_cells.MetricRows`, "expert_load":
    `store.expert_cells.ExpertRows`}), which the rollups use where they are every new row;
    None for the rollups of a live run's small batch, after its commit. If it raises, its
    transaction is rolled back (a catch-up batch is then done again without it) and
    the hook is left out for the rest of the `ingest` call, which says so
    (`HookFailed`).

`after_commit`: `after_ingest(db, runs_dir, runs: set[str]) -> set[str]`
    Runs after the batch's commit, outside its transaction, on the runs whose own
    writers sent events in the batch. `db` is one open connection that every
    after-commit hook of the batch shares (each opening ATTACHes the store file
    and reads its catalog, ~10 ms here; a batch would otherwise pay that three
    times): a READ-ONLY one, so the hooks read beside the dashboard's readers
    instead of holding them out (the
    store's write lock is the batch's alone). A hook reads the store through it
    (`store.using`) and writes findings as host-1000 events into run folders; it
    returns the runs whose folders got new events (read by truthiness, so a bool
    works too). If it raises, ingest reports it and goes on. When a hook wrote,
    the pass ingests once more, so one `observatory ingest` leaves its findings in
    the store. What a hook keeps in the store (the detectors' `detector_state`)
    waits in memory and is written by the next batch's transaction
    (`save_pending`), or at the end of the `ingest` call (`save_pending_to`).

    An after-commit hook may also have `prepare(con, runs_dir, runs) -> job | None`, used
    for a catch-up batch instead: it makes the hook's store reads on the write connection
    inside the batch's transaction, after the in-transaction hooks (so they see the batch's
    rows); `job.compute()` then runs while the batch COMMITs on a worker thread (DuckDB
    releases the GIL: the detectors' rolling windows cost about what the commit does), and
    after the commit `job.after_commit(db)` writes and returns what `after_ingest` would
    have. A job of None: nothing to do for this batch. `compute` reports its own failures
    and never touches the store. The cheap hooks (ladder watch, decisions) run whole inside
    the transaction with their `findings.write` calls held back until after the commit
    (`_inside`), so a catch-up batch opens no read-only connection. If `prepare` raises, or
    leaves the transaction aborted (a failed query, which DuckDB's COMMIT would then roll
    back without a word), the batch is rolled back and done again with that hook run after
    its commit as above (`PrepareFailed`), for the rest of the `ingest` call.

`BUILTIN` lists the built-in implementations, in the order they run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from observatory import decisions, findings, store
from observatory.detect import scan
from observatory.ladder import watch
from observatory.store import rollups

__all__ = ["IN_TRANSACTION", "AFTER_COMMIT", "Hook", "BUILTIN", "HookFailed", "PrepareFailed", "any_in_transaction",
           "run_in_transaction", "prepare_after_commit", "commit", "run_after_commit", "save_pending",
           "save_pending_to"]  # fmt: skip

IN_TRANSACTION = "in_transaction"
AFTER_COMMIT = "after_commit"


@dataclass(frozen=True)
class Hook:
    name: str  # in messages: "<name>.after_ingest failed ..."
    point: str  # IN_TRANSACTION or AFTER_COMMIT
    call: Callable[..., Any]  # calls the module's `after_ingest` (looked up at call time)
    prepare: Callable[..., Any] | None = None  # an after-commit hook's reads inside a catch-up's transaction


def _rollups(con, touched: Mapping[str, set[str]], rows) -> None:
    rollups.after_ingest(con, touched, rows)


def _anomalies(con, runs_dir: Path, runs: set[str]) -> Any:
    return scan.after_ingest(con, runs_dir, runs)


def _anomalies_prepare(con, runs_dir: Path, runs: set[str]) -> Any:
    return scan.prepare(con, runs_dir, runs)


def _ladder_watch(con, runs_dir: Path, runs: set[str]) -> Any:
    return watch.after_ingest(con, runs_dir, runs)


def _decisions(con, runs_dir: Path, runs: set[str]) -> Any:
    return decisions.after_ingest(con, runs_dir, runs)


class _Held:
    """An after-commit hook that ran whole inside the transaction, its event files' writes held back."""

    def __init__(self, result: Any, writes: list[tuple]):
        self.result, self.writes = result, writes

    def compute(self) -> None:
        pass

    def after_commit(self, db) -> Any:
        for w in self.writes:
            findings.write(*w)
        return self.result


def _inside(call: Callable[..., Any]) -> Callable[..., Any]:
    """A `prepare` for a cheap after-commit hook: run it on the transaction's connection, its writes (through
    `findings.write`) held for after the commit; the batch then needs no read-only connection of its own."""

    def prepare(con, runs_dir: Path, runs: set[str]) -> _Held:
        with findings.deferred() as writes:
            result = call(con, runs_dir, runs)
        return _Held(result, writes)

    return prepare


BUILTIN = (
    Hook("rollups", IN_TRANSACTION, _rollups),  # observatory.store.rollups.after_ingest
    Hook("anomalies", AFTER_COMMIT, _anomalies, _anomalies_prepare),  # observatory.detect.scan.after_ingest
    Hook("ladder_watch", AFTER_COMMIT, _ladder_watch, _inside(_ladder_watch)),  # observatory.ladder.watch.after_ingest
    Hook("decisions", AFTER_COMMIT, _decisions, _inside(_decisions)),  # observatory.decisions.after_ingest
)


class HookFailed(Exception):
    """An in-transaction hook raised; the batch must be rolled back and done again without it."""

    def __init__(self, hook: Hook, error: BaseException):
        super().__init__(str(error))
        self.hook = hook
        self.error = error


class PrepareFailed(Exception):
    """An after-commit hook's `prepare` raised inside the transaction: roll back, do the batch again without."""

    def __init__(self, hook: Hook, error: BaseException):
        super().__init__(str(error))
        self.hook = hook
        self.error = error


def any_in_transaction(skip: set[str]) -> bool:
    """Whether an in-transaction hook not in `skip` is left to run."""
    return any(h.point == IN_TRANSACTION and h.name not in skip for h in BUILTIN)


def run_in_transaction(con, touched: Mapping[str, set[str]], skip: set[str], rows=None) -> None:
    """The in-transaction hooks not in `skip`, when `touched` names metrics or expert_load runs; a catch-up
    batch passes its new rows as arrays, per source table, on to them (see the module doc)."""
    if not (touched["metrics"] or touched["expert_load"]):
        return
    for hook in BUILTIN:
        if hook.point == IN_TRANSACTION and hook.name not in skip:
            try:
                hook.call(con, touched, rows)
            except Exception as e:
                raise HookFailed(hook, e) from e


def prepare_after_commit(con, runs_dir: Path, runs: set[str], skip: set[str]) -> dict[str, Any]:
    """Each after-commit hook's `prepare` (those not in `skip`), inside the batch's transaction: {name: job}."""
    jobs = {}
    for hook in BUILTIN:
        if hook.point == AFTER_COMMIT and hook.prepare is not None and hook.name not in skip:
            try:
                jobs[hook.name] = hook.prepare(con, runs_dir, set(runs))
                # a failed query aborts DuckDB's transaction, and a COMMIT then rolls back without a word:
                # a hook that caught its own error (they never raise) must not cost the batch its rows
                con.execute("SELECT 1").fetchall()
            except Exception as e:
                raise PrepareFailed(hook, e) from e
    return jobs


def commit(con, jobs: Mapping[str, Any]) -> None:
    """COMMIT the batch's transaction on `con`; with prepared jobs, on a worker thread while they compute.

    A job whose `compute` raises is replaced by its error in `jobs` (`run_after_commit` says it)."""
    if not any(job is not None for job in jobs.values()):
        con.execute("COMMIT")
        return
    with ThreadPoolExecutor(1, thread_name_prefix="observatory-commit") as pool:
        done = pool.submit(con.execute, "COMMIT")  # nothing below touches `con` until it is done
        for name, job in list(jobs.items()):
            if job is not None:
                try:
                    job.compute()
                except Exception as e:
                    jobs[name] = e  # type: ignore[index]
        done.result()


def run_after_commit(db: Path, runs_dir: Path, runs: set[str], emit: Callable[[str], None],
                     prepared: Mapping[str, Any] | None = None) -> set[str]:  # fmt: skip
    """The after-commit hooks on `runs`, in order; the names of those that wrote events. `prepared`: the
    jobs `prepare_after_commit` made for this batch, computed during its commit; those hooks finish them."""
    wrote = set()
    with ExitStack() as stack:
        shared = None  # the hooks' one connection, opened at the first of them
        for hook in BUILTIN:
            if hook.point != AFTER_COMMIT:
                continue
            try:
                if prepared is not None and hook.name in prepared:
                    job = prepared[hook.name]
                    if isinstance(job, BaseException):
                        raise job
                    if job is not None and job.after_commit(db):
                        wrote.add(hook.name)
                    continue
                if shared is None:
                    shared = stack.enter_context(store.connect(db))  # read-only: see the module doc
                if hook.call(shared, runs_dir, set(runs)):
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
        emit(f"observatory ingest: the detectors' state was not saved ({type(e).__name__}: {e}); "
             "the next ingest re-reads a little more")  # fmt: skip
