"""A batch's appends to its write connection, run in order on one worker thread while the caller decodes on.

The msgspec path (`ingest.msgspec_lines`) hands each group of decoded pieces' rows to `hold`, which
gathers them across pieces and files (the rows carry their run and host) and submits one INSERT per
`INSERT_ROWS`: DuckDB releases the GIL while it appends, so the next pieces decode meanwhile, and a
batch of 10^4 small files costs a few INSERTs, not one per file. Whoever uses the connection on its
own thread (`check_line`'s rows, the batch's flush, its hooks, COMMIT or ROLLBACK) calls `drain` first: one
DuckDB connection must not run two statements at once.

At most one task that carries rows is queued or running when another is submitted (`submit` waits
for it), and `hold` keeps at most `HOLD_WHILE_BUSY` times its limit while one runs: the decoded rows in
memory stay within about twice `HOLD_WHILE_BUSY * msgspec_lines.INSERT_ROWS` (2^21 rows).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

__all__ = ["Appends", "HOLD_WHILE_BUSY"]

# While the worker is still busy with the last rows given to it, up to this many times a hold's limit are
# held before the caller waits: the worker writes each row group as it fills (~0.2 s for 2^20 metrics
# rows here), and the decoder goes on meanwhile instead of waiting for it
HOLD_WHILE_BUSY = 8


class Appends:
    """One batch's queue of statements on its write connection (see the module doc); a context manager
    whose exit drains the queue (quietly when the block raised: the transaction is rolled back then)."""

    def __init__(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._queued: list[Future] = []  # in submission order; the done ones are checked for errors
        self._rows: Future | None = None  # the last task that carries rows
        self._held: list = []  # decoded pieces' rows not submitted yet, all for `_insert`
        self._held_rows = 0
        self._insert: Callable[[list], None] | None = None

    def hold(self, rows: Any, n: int, insert: Callable[[list], None], limit: int) -> None:
        """Keep `rows` (n of them, of any file) for `insert(list of held rows)`, which runs once `limit` rows
        are held, or at `drain`."""
        self._held.append(rows)
        self._held_rows += n
        self._insert = insert
        busy = self._rows is not None and not self._rows.done()
        if self._held_rows >= (limit * HOLD_WHILE_BUSY if busy else limit):
            self.release()

    def release(self) -> None:
        """Submit the held rows' insert now."""
        if self._held:
            held, self._held, self._held_rows = self._held, [], 0
            self.submit(self._insert, held, rows=True)

    def submit(self, fn: Callable[..., None], *args: Any, rows: bool = False) -> None:
        """Run `fn(*args)` on the worker after what is queued; `rows`: it carries decoded rows (see the module
        doc). An error of an earlier task is raised here, before anything more is queued."""
        self._check()
        if rows and self._rows is not None:
            self._rows.result()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="observatory-ingest")
        future = self._pool.submit(fn, *args)
        self._queued.append(future)
        if rows:
            self._rows = future

    def _check(self) -> None:
        while self._queued and self._queued[0].done():
            self._queued.pop(0).result()

    def drain(self) -> None:
        """Submit the held rows, wait for every queued task; the first error among them is raised once all
        have finished."""
        self.release()
        queued, self._queued, self._rows = self._queued, [], None
        error = None
        for future in queued:
            try:
                future.result()
            except BaseException as e:
                error = error or e
        if error is not None:
            raise error

    def close(self) -> None:
        """Wait for the queue without raising (an error is on its way out already), then end the worker."""
        self._held, self._held_rows = [], 0
        try:
            self.drain()
        except BaseException:
            pass
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None

    def __enter__(self) -> Appends:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self.close()
            return
        try:
            self.drain()
        finally:
            self.close()
