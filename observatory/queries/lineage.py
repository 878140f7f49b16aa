"""SQL for run lineage: runs form a tree through run_start's `parent {run, step}`.

Recursive CTEs use UNION (not UNION ALL) so a parent cycle in bad data ends
instead of looping. Rows without a `run_start` (the `decisions` pseudo-run) have
no parent and no start time; they show up as a one-node lineage at most.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RUN_COLUMNS", "run_row", "ancestors", "subtree", "stitched_curve"]

RUN_COLUMNS = ("run", "name", "status", "parent_run", "parent_step", "last_step", "final_step", "start_time")
_COLS = ", ".join(RUN_COLUMNS)


def _rows(cur) -> list[dict[str, Any]]:
    return [dict(zip(RUN_COLUMNS, r, strict=True)) for r in cur.fetchall()]


def run_row(con, run: str) -> dict[str, Any] | None:
    rows = _rows(con.execute(f"SELECT {_COLS} FROM runs WHERE run = ?", [run]))
    return rows[0] if rows else None


def ancestors(con, run: str) -> list[dict[str, Any]]:
    """The run and its ancestors, root first."""
    return _rows(
        con.execute(
            f"""
            WITH RECURSIVE up(run, depth) AS (
                SELECT run, 0 FROM runs WHERE run = ?
                UNION
                SELECT r.parent_run, up.depth + 1 FROM up JOIN runs r ON r.run = up.run
                WHERE r.parent_run IS NOT NULL AND up.depth < 1000
            )
            SELECT {", ".join("r." + c for c in RUN_COLUMNS)}
            FROM (SELECT run, max(depth) AS depth FROM up GROUP BY run) u JOIN runs r USING (run)
            ORDER BY u.depth DESC
            """,
            [run],
        )
    )


def subtree(con, root: str) -> list[dict[str, Any]]:
    """The root and every run descending from it, with depth; ordered by depth, start time, id."""
    rows = con.execute(
        f"""
        WITH RECURSIVE down(run, depth) AS (
            SELECT run, 0 FROM runs WHERE run = ?
            UNION
            SELECT r.run, down.depth + 1 FROM down JOIN runs r ON r.parent_run = down.run
            WHERE r.run <> down.run AND down.depth < 1000
        )
        SELECT {", ".join("r." + c for c in RUN_COLUMNS)}, d.depth
        FROM (SELECT run, min(depth) AS depth FROM down GROUP BY run) d JOIN runs r USING (run)
        ORDER BY d.depth, r.start_time NULLS LAST, r.run
        """,
        [root],
    ).fetchall()
    return [{**dict(zip(RUN_COLUMNS, r[:-1], strict=True)), "depth": r[-1]} for r in rows]


def stitched_curve(con, segments: list[tuple[str, int | None]], metric: str) -> list[tuple[str, int, float]]:
    """(run, step, value) of `metric` over segments [(run, last step or None), ...] in order.

    Each run contributes its steps up to its cut (the fork step of the next run in the
    chain); the last contributes all. A step logged twice (several hosts, a rewrite)
    keeps its newest value.
    """
    if not segments:
        return []
    runs = [s[0] for s in segments]
    cuts = [s[1] for s in segments]
    rows = con.execute(
        """
        WITH seg AS (
            SELECT unnest(?::VARCHAR[]) AS run, unnest(?::BIGINT[]) AS cut,
                   unnest(range(len(?::VARCHAR[]))) AS ord
        )
        SELECT m.run, m.step, arg_max(m.value, m.t) AS value, any_value(seg.ord) AS ord
        FROM metrics m JOIN seg ON m.run = seg.run
        WHERE m.name = ? AND m.step IS NOT NULL AND NOT m.replaced AND (seg.cut IS NULL OR m.step <= seg.cut)
        GROUP BY m.run, m.step
        ORDER BY ord, m.step
        """,
        [runs, cuts, runs, metric],
    ).fetchall()
    return [(r[0], int(r[1]), float(r[2]) if r[2] is not None else float("nan")) for r in rows]
