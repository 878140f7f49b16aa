"""The `observatory` console script: the command line, or what to install for it.

`pip install observatory` is the writer alone (`import observatory as wandb` in a training script);
the commands need the store and the rest: `pip install 'observatory[server]'`.
"""

from __future__ import annotations

import sys

__all__ = ["run"]


def run() -> None:
    try:
        from observatory.cli import run as cli_run
    except ModuleNotFoundError as e:  # a light install: say what to install, not a traceback
        sys.exit(
            f"observatory: the command line needs the server extra ({e.name} is not installed): "
            "pip install 'observatory[server]'"
        )
    cli_run()
