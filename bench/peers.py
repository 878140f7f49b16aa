"""What the peer-tool benches share: the version of each tool they ran."""

from __future__ import annotations

from importlib import metadata


def version(tool: str) -> str:
    """The installed version of a bench's tool ("observatory…" rows are ours), or "missing"."""
    try:
        return metadata.version("observatory" if tool.startswith("observatory") else tool)
    except metadata.PackageNotFoundError:
        return "missing"
