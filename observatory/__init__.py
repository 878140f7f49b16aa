"""Observatory: a transparent training-log observatory for Mixture-of-Experts language models.

Write events with `init` (wandb-like), read the store with `connect`:

    import observatory
    with observatory.init(name="my-run", config={"lr": 3e-4}) as run:
        run.log({"train/loss": 2.5}, step=1)
    con = observatory.connect()          # read-only DuckDB connection
"""

from __future__ import annotations

from observatory.store import connect
from observatory.writer import Run, init

__all__ = ["init", "Run", "connect"]
__version__ = "0.1.0"
