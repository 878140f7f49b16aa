"""Goodput reads: the `goodput` view's row per run (see `observatory.store.goodput` for the rules)."""

from __future__ import annotations

from typing import Any

from observatory.store.goodput import CATEGORIES

__all__ = ["goodput", "describe_goodput"]


def goodput(con, runs: list[str]) -> dict[str, dict[str, Any]]:
    """{run: the goodput view's row as a dict} for `runs` (a run with no segment is left out)."""
    # list_contains, not IN (subquery): DuckDB pushes it through the view's windows (per run), IN it does not
    # (at 10^5 runs: 30 ms against 2.3 s)
    cur = con.execute(
        "SELECT * FROM goodput WHERE list_contains($runs::VARCHAR[], run) ORDER BY run", {"runs": list(runs)}
    )
    cols = [d[0] for d in cur.description]
    return {r[0]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}


def describe_goodput(row: dict[str, Any]) -> str:
    """'41.7% of 5.9 min productive; lost: down 1.0 min, redone 49 s, ...; 2 attempts'."""

    def dur(s: float) -> str:
        return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"

    lost = sorted(
        ((row[f"{c}_s"], c) for c in CATEGORIES if c != "productive" and row[f"{c}_s"] > 0), reverse=True
    )
    share = "-" if row["goodput"] is None else f"{100 * row['goodput']:.1f}%"
    text = f"{share} of {dur(row['total_s'] or 0)} productive"
    if lost:
        text += "; lost: " + ", ".join(f"{c} {dur(s)}" for s, c in lost)
    return text + f"; {row['attempts'] or 1} attempt(s)"
