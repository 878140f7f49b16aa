"""The test tiers, kept honest: `make check` runs the tests with no child process, browser or JAX.

A test is left out of `make check` by a marker: `slow`, `browser`, `timing`, `subprocess`, or `jax`, which is given
here to every test of a module that has imported JAX (the trainer's tests). While a test without one of
those markers runs (its fixtures included), starting a child process or importing JAX fails it, with the
marker to give it; so a test that needs either cannot slip into the quick tier unnoticed.
"""

from __future__ import annotations

import sys
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

    def __call__(self, event: str, args: tuple) -> None:
        if self.nodeid is None:
            return
        if event in SPAWN_EVENTS:
            self._refuse(f"starts a child process ({event})", "subprocess")
        elif event == "import" and args[0].partition(".")[0] in JAX_PACKAGES and args[0] not in sys.modules:
            self._refuse(f"imports {args[0]}", "jax")

    def _refuse(self, what: str, marker: str) -> None:
        nodeid, self.nodeid = self.nodeid, None  # once: the error's own handling may spawn or import
        raise RuntimeError(
            f"{nodeid} {what}, which `make check` leaves out: mark it @pytest.mark.{marker} (tests/tiers.py)"
        )


def imports_jax(module: ModuleType | None) -> bool:
    return module is not None and any(
        isinstance(v, ModuleType) and v.__name__.partition(".")[0] in JAX_PACKAGES
        for v in vars(module).values()
    )


class TiersPlugin:
    def __init__(self) -> None:
        self.guard = Guard()
        sys.addaudithook(self.guard)

    @pytest.hookimpl(tryfirst=True)  # before `-m` deselects
    def pytest_collection_modifyitems(self, items) -> None:
        for item in items:
            if imports_jax(getattr(item, "module", None)):
                item.add_marker(pytest.mark.jax)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        quick = not any(item.get_closest_marker(m) for m in HEAVY)
        self.guard.nodeid = item.nodeid if quick else None
        try:
            yield
        finally:
            self.guard.nodeid = None


def pytest_configure(config) -> None:
    config.pluginmanager.register(TiersPlugin(), "observatory-tiers")
