"""Fitted ladders kept beside the store: one file per ladder and data version (`rungs.fit_version`).

A fit takes seconds (bootstrap refits); a dashboard's first visit after a start should not wait for one
that was already made. The fit of (ladder, version) is written once to `<store>.ladder-fits/` and read
back by every later process; a new version (a rung's evals changed) is a new file, and the ladder's
newest older fit can be shown meanwhile (`latest`). The files are pickles the dashboard itself wrote,
in the store's own folder (whoever can write there can replace the store too); a folder it cannot
write (a read-only deployment) just means no file: the fit is made per process, as before.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["folder", "load", "latest", "save"]

KEEP = 3  # files kept per ladder: the newest versions


def folder(db: str | os.PathLike) -> Path:
    return Path(f"{db}.ladder-fits")


def _stem(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:16]


def _path(db, name: str, version: str) -> Path:
    return folder(db) / f"{_stem(name)}-{hashlib.sha256(version.encode()).hexdigest()[:16]}.pkl"


def _read(p: Path) -> Any | None:
    try:
        with open(p, "rb") as f:
            return pickle.load(f)  # noqa: S301 (our own file, beside the store: see the module's doc)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError):
        return None  # gone, half-written or from another version of the code: fit again


def load(db, name: str, version: str) -> Any | None:
    """The stored fit of `name` at `version`, or None."""
    return _read(_path(db, name, version))


def latest(db, name: str) -> Any | None:
    """The newest stored fit of `name`, whatever its version, or None."""
    try:
        files = sorted(folder(db).glob(f"{_stem(name)}-*.pkl"), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return None
    return next((v for v in map(_read, files) if v is not None), None)


def save(db, name: str, version: str, value: Any) -> None:
    """Store the fit (atomically: a reader sees the whole file or none); keep the ladder's newest KEEP."""
    d = folder(db)
    try:
        d.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump(value, f, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, _path(db, name, version))
        mine = sorted(d.glob(f"{_stem(name)}-*.pkl"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in mine[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a folder this process cannot write: no stored fit, the page fits per process
