"""A batch's appends: decoded rows gathered across pieces and files, one INSERT per `INSERT_ROWS`.

The msgspec path (`ingest.msgspec_lines`) hands each group of decoded pieces' rows to `hold`,
which gathers them across pieces and files (the rows carry their run and host) and INSERTs them
once `limit` rows are held, or at `drain`: a batch of 10^4 small files costs a few INSERTs, not
one per file. Everything runs on the caller's thread, the one thread that uses the batch's write
connection: no statement of the batch ever runs beside another (there was a worker thread here
once, overlapping INSERTs with decoding: see bench/HISTORY.md for what it was worth).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Appends"]


class Appends:
    """One batch's rows held for their INSERT (see the module doc); a context manager whose exit
    drains what is held (and drops it when the block raised: the transaction is rolled back then)."""

    def __init__(self) -> None:
        self._held: list = []  # decoded pieces' rows not inserted yet, all for `_insert`
        self._held_rows = 0
        self._insert: Callable[[list], None] | None = None

    def hold(self, rows: Any, n: int, insert: Callable[[list], None], limit: int) -> None:
        """Keep `rows` (n of them, of any file) for `insert(list of held rows)`, which runs once `limit`
        rows are held, or at `drain`."""
        self._held.append(rows)
        self._held_rows += n
        self._insert = insert
        if self._held_rows >= limit:
            self.drain()

    def drain(self) -> None:
        """INSERT the held rows now."""
        if self._held:
            held, self._held, self._held_rows = self._held, [], 0
            self._insert(held)

    def __enter__(self) -> Appends:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None:
            self._held, self._held_rows = [], 0
            return
        self.drain()
