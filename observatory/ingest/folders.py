"""What each run folder held when it was last listed, so that a pass lists only the folders that changed.

Every pass looks at every run folder: a new host's log may appear in any of them. Listing a folder
(`scandir`: open, read, close) is what that costs; at 10^5 run folders it was ~1 s here, half the time
of appending one run to such a store. A folder's mtime changes whenever a name in it is created,
removed or renamed, and not when a file in it grows. So a folder whose mtime is the one it had when
it was last listed holds the same event logs, and only a `stat` of each is needed (their growth).
`Folders` keeps, for each folder, that mtime and the names of its event logs: in memory between the
passes of one call, and in the store (`ingest_folders`, written with a batch) between calls.

An unchanged mtime proves an unchanged folder only where both of these hold, and otherwise every
folder is listed on every pass:

- the file system keeps directory mtimes on this machine's clock: the local file systems of
  `KEEPS_MTIMES`. Object stores mounted through FUSE (gcsfuse, s3fs, ...) may never change a
  folder's mtime, and NFS sets it with the server's clock, so there nothing is kept;
- the folder's mtime is `SETTLED_S` older than the pass's start: a name created within the same
  clock tick as the folder's last change, just after the listing, would leave the mtime as it was.

Under a root of fewer than `KEEP_FROM` run folders every folder is listed too: that costs less than
reading the kept listings from the store, and a big run's store is not opened once more for them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa

from observatory.store.arrow import column

__all__ = ["KEEPS_MTIMES", "KEEP_FROM", "SETTLED_S", "Folders", "keeps_mtimes"]

# file systems that set a directory's mtime, with the machine's clock, on each change of its names
KEEPS_MTIMES = frozenset(
    {"ext2", "ext3", "ext4", "xfs", "btrfs", "zfs", "f2fs", "tmpfs", "overlay", "apfs", "hfs", "ntfs", "refs"}
)
SETTLED_S = 2  # a folder's listing is kept once its mtime is this much older than the pass (1-s mtimes too)
# below this many run folders a pass lists them all: ~10 ms, less than reading kept listings from the store
# (a read-only connection, ~0.1 s on a big run's store)
KEEP_FROM = 1000


def keeps_mtimes(path: str | os.PathLike) -> bool:
    """Whether the file system `path` is on is one of `KEEPS_MTIMES` (its mount point's type, by psutil)."""
    try:
        import psutil

        real = os.path.realpath(path)
        best, kind = "", ""
        for part in psutil.disk_partitions(all=True):
            mount = part.mountpoint
            # the longest mount point above the path; of equal ones the last, which shadows the others
            if (real == mount or real.startswith(mount.rstrip(os.sep) + os.sep)) and len(mount) >= len(best):
                best, kind = mount, part.fstype
        return kind.lower() in KEEPS_MTIMES
    except Exception:  # no mount table to read: list every folder
        return False


class Folders:
    """{folder: (mtime in ns, the names of its event logs)} of the folders last listed; a folder is
    `prefix + run`, the store path's first part (`files.scan`). `changed`: entries to write to the store
    with the next batch (None: the folder is gone). The store's listings are read on the first pass that
    uses them (`kept`)."""

    def __init__(self, db: Path):
        self.db = db
        self.entries: dict[str, tuple[int, tuple[str, ...]]] = {}
        self.changed: dict[str, tuple[int, tuple[str, ...]] | None] = {}
        self._read = False  # whether `entries` has the store's listings yet
        self._keeps: dict[str, bool] = {}  # root -> whether its file system keeps mtimes

    def kept(self, root: str, n_folders: int) -> dict[str, tuple[int, tuple[str, ...]]] | None:
        """The listings to use under `root`, which holds `n_folders` run folders; None: list every folder
        (fewer than `KEEP_FROM`, or a file system not of `KEEPS_MTIMES`)."""
        if n_folders < KEEP_FROM:
            return None
        if root not in self._keeps:
            self._keeps[root] = keeps_mtimes(root)
        if not self._keeps[root]:
            return None
        if not self._read:
            self._read = True
            self.entries = _stored(self.db)
        return self.entries

    def put(self, folder: str, mtime_ns: int, names: tuple[str, ...]) -> None:
        if self.entries.get(folder) != (mtime_ns, names):
            self.entries[folder] = self.changed[folder] = (mtime_ns, names)

    def forget(self, seen: set[str]) -> None:
        """Drop the entries of folders that are gone (not in `seen`, the folders of kept roots a scan saw)."""
        for folder in self.entries.keys() - seen:
            del self.entries[folder]
            self.changed[folder] = None

    def save(self, con) -> None:
        """Write the changed entries in the caller's transaction (a rolled-back batch only costs a listing)."""
        if not self.changed:
            return
        changed, self.changed = self.changed, {}
        rows = pa.table(
            {
                "folder": column(list(changed), pa.string()),
                "mtime_ns": column([None if e is None else e[0] for e in changed.values()], pa.int64()),
                "names": column(
                    [None if e is None else " ".join(e[1]) for e in changed.values()], pa.string()
                ),
            }
        )
        con.register("_folders", rows)  # a folder gone has no mtime: its row goes, no new one comes
        try:
            con.execute("DELETE FROM ingest_folders WHERE folder IN (SELECT folder FROM _folders)")
            con.execute("INSERT INTO ingest_folders SELECT * FROM _folders WHERE mtime_ns IS NOT NULL")
        finally:
            con.unregister("_folders")


def _stored(db: Path) -> dict[str, tuple[int, tuple[str, ...]]]:
    """The listings the store keeps; none when it has none to give (no file, busy, a store from before the
    table): then this call lists every folder once."""
    if not db.exists():
        return {}
    from observatory import store

    try:
        with store.connect(db, timeout_s=1.0) as con:
            t = con.sql("SELECT folder, mtime_ns, names FROM ingest_folders").to_arrow_table()
    except Exception:
        return {}
    return {
        folder: (mtime, tuple(names.split()))
        for folder, mtime, names in zip(*(t.column(i).to_pylist() for i in range(3)), strict=True)
    }
