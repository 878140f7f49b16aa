"""Progress bars for the long commands (ingest, rebuild, import, ladder fit), on stderr.

The work reports through a callback taking a dict: `done` and `total` (in `unit`:
bytes, files, runs or rounds) and any counts worth showing beside them
(`{"done": 3_000_000, "total": 9_000_000, "unit": "bytes", "files": 2, "events": 41_000}`).
`bar(...)` turns that into a `rich` progress bar with the time left, shown only when
stderr is a terminal and the command was not given `-q`; otherwise the callback is
None and the work skips reporting altogether.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import click

__all__ = ["isatty", "quiet_option", "bar", "Callback"]

Callback = Callable[[dict], None]


def isatty() -> bool:
    """Whether stderr, where progress goes, is a terminal (stdout may be data, or piped)."""
    return sys.stderr.isatty()


def quiet_option(help: str = "No progress bar, nor a line per file or run: only the summary and errors."):
    return click.option("--quiet", "-q", is_flag=True, help=help)


def _extra(p: dict) -> str:
    return ", ".join(f"{v:,} {k}" for k, v in p.items() if k not in ("done", "total", "unit", "what"))


@contextmanager
def bar(description: str, quiet: bool = False, unit: str = "bytes") -> Iterator[Callback | None]:
    """A progress callback drawing on stderr while the block runs, or None (quiet, or not a terminal)."""
    if quiet or not isatty():
        yield None
        return
    from rich.console import Console  # lazy for start-up time: only a terminal needs these
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    count = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    columns = [TextColumn("{task.description}"), BarColumn(), count]
    if unit != "bytes":
        columns.append(TextColumn(unit))
    columns += [TextColumn("{task.fields[extra]}"), TimeRemainingColumn()]
    console = Console(file=sys.stderr, force_terminal=True)
    with Progress(*columns, console=console) as progress:
        task = progress.add_task(description, total=None, extra="")

        def update(p: dict) -> None:
            desc = f"{description} {p['what']}" if p.get("what") else description
            progress.update(task, completed=p["done"], total=p["total"], extra=_extra(p), description=desc)

        yield update
