"""The test tiers, kept honest: `make check` runs the tests with no child process, browser or JAX.

A test is left out of `make check` by a marker: `slow`, `browser`, `timing`, `subprocess`, or `jax`, which is given
here to every test of a module that has imported JAX (the trainer's tests). While a test without one of
those markers runs (its fixtures included), starting a child process or importing JAX fails it, with the
marker to give it; so a test that needs either cannot slip into the quick tier unnoticed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

# The markers that keep a test out of `make check` (the Makefile's CHECK_TIER says the same).
HEAVY = ("slow", "browser", "timing", "subprocess", "jax")
# Python's audit events for starting another process (https://docs.python.org/3/library/audit_events.html).
SPAWN_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"}
)
JAX_PACKAGES = frozenset({"jax", "jaxlib", "flax", "optax", "orbax"})


class Guard:
    """The audit hook's switch: on while a quick-tier test (setup, call and teardown) runs."""

    def __init__(self) -> None:
        self.nodeid: str | None = None
        self.refused: str | None = (
            None  # what the test did, kept: a thread that started it may swallow the error
        )

    def __call__(self, event: str, args: tuple) -> None:
        if self.nodeid is None:
            return
        if event in SPAWN_EVENTS:
            self._refuse(f"starts a child process ({event})", "subprocess")
        elif event == "import" and args[0].partition(".")[0] in JAX_PACKAGES and args[0] not in sys.modules:
            self._refuse(f"imports {args[0]}", "jax")

    def _refuse(self, what: str, marker: str) -> None:
        nodeid, self.nodeid = self.nodeid, None  # once: the error's own handling may spawn or import
        self.refused = (
            f"{nodeid} {what}, which `make check` leaves out: mark it @pytest.mark.{marker} (tests/tiers.py)"
        )
        raise RuntimeError(self.refused)


# What a module says of all its tests at once, read from its text before it is imported: a top-level
# `pytestmark` with a heavy marker, or a top-level JAX import (every test of it gets `jax`, above).
MODULE_MARKS = re.compile(r"^pytestmark = .*$", re.M)
JAX_IMPORT = re.compile(r"^(?:import|from) (?:jax|jaxlib|flax|optax|orbax)\b", re.M)


def left_out_whole(path: Path, markexpr: str) -> bool:
    """Whether `-m markexpr` deselects every test of the module at `path` (`not slow` and the module is
    all slow, ...): then it is not even imported, which spares each worker of `make check` JAX's import."""
    if not path.name.startswith("test_") or path.suffix != ".py":
        return False
    text = path.read_text()
    marks = set(re.findall(r"mark\.(\w+)", "\n".join(MODULE_MARKS.findall(text))))
    if JAX_IMPORT.search(text):
        marks.add("jax")
    return any(f"not {m}" in markexpr for m in marks & set(HEAVY))


def imports_jax(module: ModuleType | None) -> bool:
    return module is not None and any(
        isinstance(v, ModuleType) and v.__name__.partition(".")[0] in JAX_PACKAGES
        for v in vars(module).values()
    )


def settle_spawners() -> None:
    """Wait until the dashboard's SQL pool starts no worker in the background (a replacement for one a test
    killed): started while the next test runs, it would be blamed on that test."""
    user_sql = sys.modules.get("observatory.queries.user_sql")
    if user_sql is not None:
        user_sql._POOL.settle()


class TiersPlugin:
    def __init__(self) -> None:
        self.guard = Guard()
        sys.addaudithook(self.guard)

    def pytest_ignore_collect(self, collection_path: Path, config) -> bool | None:
        markexpr = config.option.markexpr or ""
        return True if markexpr and left_out_whole(collection_path, markexpr) else None

    @pytest.hookimpl(tryfirst=True)  # before `-m` deselects
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if imports_jax(getattr(item, "module", None)):
                item.add_marker(pytest.mark.jax)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        quick = not any(item.get_closest_marker(m) for m in HEAVY)
        self.guard.nodeid, self.guard.refused = (item.nodeid if quick else None), None
        try:
            yield
        finally:
            self.guard.nodeid = None
            if not quick:
                settle_spawners()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        result = yield
        if (
            self.guard.refused
        ):  # done in its setup or call, though no error reached the test (another thread's)
            raise RuntimeError(self.guard.refused)
        return result


def pytest_configure(config) -> None:
    config.pluginmanager.register(TiersPlugin(), "observatory-tiers")
