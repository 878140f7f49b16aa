"""A finished bulk command's process ends without the interpreter's teardown, where that loses nothing.

After `observatory ingest` or `rebuild` has printed its summary, a normal exit still spends
~0.045 s here (3-4 % of a 20k-step catch-up's whole command) destroying what the process built:
the idle in-memory DuckDB instances the store was attached to (`store.connection._Instances`),
every module and the heap of a catch-up. None of it is data: each store connection was closed
before the command returned (DETACH checkpoints a writer's WAL into the file and releases its
locks), and an idle instance holds no attached database. So `run` (the `observatory` console
script and `python -m observatory.cli`) ends such a command with `os._exit`, after what an exit
must still do: the `atexit` handlers (a caller's, the writer's), and stdout and stderr flushed.

It does so only when nothing is left that an exit would finish: no store connection open, no
idle instance with temporary (spill) files, no other non-daemon thread alive. Otherwise, and for
every other command, in tests (click's runner never calls `run`) and on any error, the exit is
the normal one.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

__all__ = ["want", "wanted", "safe", "exit_now"]

_WANTED = [False]


def want() -> None:
    """The command finished its work: `run` may end the process quickly (if `safe`)."""
    _WANTED[0] = True


def wanted() -> bool:
    return _WANTED[0]


def safe() -> bool:
    """Whether skipping the interpreter's teardown would leave nothing undone (see the module doc)."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return False
    connection = sys.modules.get("observatory.store.connection")
    return connection is None or connection.nothing_to_close()


def exit_now(code: int = 0) -> None:
    """Run the `atexit` handlers, flush stdout and stderr, and end the process with `code`."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)
