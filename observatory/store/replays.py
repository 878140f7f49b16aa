"""Replayed steps: the newest value of a (run, host, step, metric) wins; the rows it supersedes are `replaced`.

A process that resumes (`trainer train --resume`, `observatory.init(resume=...)`, a writer given the same
run id and host) appends to its own log, `events.<host>.jsonl`, and trains again the steps since its last
checkpoint: it crashed at step 535 after saving at 500, so attempt 1 logs 501..535 again, with values of
its own. Attempts are sequenced within a process's log, so the rule is per (run, host, step, name): the
row with the greatest `t` (the event's wall time: a later attempt writes later; equal times are ordered by
value, so the choice is a function of the logs) is the step's value, and every other row of that key gets
`metrics.replaced = true`. Nothing is deleted (goodput's `redone` time reads the first attempt's steps;
`observatory sql` sees both); every chart, rollup, detector and report reads `NOT replaced`. Several
processes logging one name at one step (per-host throughput) are not replays: each keeps its row.

Set-wise, inside ingest's write transaction (`observatory.store.rollups.after_ingest` calls `mark`, before
it rolls the new rows up), for every run of the batch at once:

1. the candidate keys: the new rows' (run, host, name, step) that repeat among the new rows, or whose
   step is at or before the last step `metric_series` holds for (run, name), the only way an older row
   can have that key (a run logging forward, the normal case, has none: one join with the small
   `metric_series`, no look at the old rows);
2. the rows of those keys, old ones read within the keys' step and run ranges (a big run's rows lie
   in step order, a catch-up's small runs in folder order: the zonemaps skip the rest), ranked newest
   first;
3. the marks that changed, written by rowid. The older rows newly replaced are returned: their rollup
   cells hold them and must be recounted.
"""

from __future__ import annotations

__all__ = ["mark", "mark_all"]

_ROWS = "_replay_rows"  # temp table: every row of a candidate key, `was` and `now` its old and new mark


def mark(con, start: int, *, all_new: bool = False) -> str | None:
    """Mark the rows that the rows from rowid `start` on supersede, and those of them that are superseded.

    Returns the temp table of the marks changed on older rows (`run`, `name`, `step`, `delta`: +1 a row
    newly replaced, -1 one no longer), or None when no older row changed. `all_new`: every row counts as
    new (a recount from scratch: `metric_series` is empty then)."""
    back = (
        ""
        if all_new
        else """UNION
            SELECT n.run, n.host, n.name, n.step FROM new n JOIN (
                -- (run, host, name) whose new rows reach back to the last step stored: few, or none
                SELECT g.run, g.host, g.name, s.last_step FROM (
                    SELECT run, host, name, min(step) AS lo FROM new GROUP BY run, host, name
                ) g JOIN metric_series s ON s.run = g.run AND s.name = g.name WHERE g.lo <= s.last_step
            ) b ON n.run = b.run AND n.host = b.host AND n.name = b.name WHERE n.step <= b.last_step"""
    )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _replay_keys AS
            WITH new AS (SELECT run, host, name, step FROM metrics WHERE rowid >= {int(start)} AND step IS NOT NULL)
            SELECT run, host, name, step FROM new GROUP BY run, host, name, step HAVING count(*) > 1
            {back}"""
    )
    lo, hi, r_lo, r_hi = con.execute(
        "SELECT min(step), max(step), min(run), max(run) FROM _replay_keys"
    ).fetchall()[0]
    if lo is None:
        return None
    # literal ranges of step and run: the zonemaps skip the row groups of other steps (a big run's rows lie in
    # step order) and of other runs (a catch-up of many small runs stores them in folder order)
    within = f"m.step BETWEEN {int(lo)} AND {int(hi)} AND m.run BETWEEN $r_lo AND $r_hi"
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE {_ROWS} AS
            SELECT m.rowid AS rid, m.run, m.name, m.step, m.rowid >= {int(start)} AS new,
                   coalesce(m.replaced, false) AS was,
                   row_number() OVER (PARTITION BY m.run, m.host, m.name, m.step
                                      ORDER BY m.t DESC, m.value DESC NULLS LAST) > 1 AS now
            FROM metrics m SEMI JOIN _replay_keys k
                ON m.run = k.run AND m.host = k.host AND m.name = k.name AND m.step = k.step
            WHERE {within}""",
        {"r_lo": r_lo, "r_hi": r_hi},
    )
    for value, which in (("true", "now AND NOT was"), ("false", "was AND NOT now")):
        # literal step and rowid ranges: the zonemaps skip every row group the marks are not in
        id_lo, id_hi = con.execute(f"SELECT min(rid), max(rid) FROM {_ROWS} WHERE {which}").fetchall()[0]
        if id_lo is not None:
            con.execute(
                f"""UPDATE metrics m SET replaced = {value}
                    WHERE {within} AND rowid BETWEEN {int(id_lo)} AND {int(id_hi)}
                      AND rowid IN (SELECT rid FROM {_ROWS} WHERE {which})""",
                {"r_lo": r_lo, "r_hi": r_hi},
            )
    con.execute(
        f"""CREATE OR REPLACE TEMP TABLE _replay_old AS
            SELECT run, name, step, sum(CASE WHEN now THEN 1 ELSE -1 END) AS delta
            FROM {_ROWS} WHERE NOT new AND now <> was GROUP BY run, name, step"""
    )
    con.execute("DROP TABLE _replay_keys")
    con.execute(f"DROP TABLE {_ROWS}")
    if not con.execute("SELECT count(*) FROM _replay_old").fetchall()[0][0]:
        con.execute("DROP TABLE _replay_old")
        return None
    return "_replay_old"


def mark_all(con) -> None:
    """Mark every row of the store from scratch (a recount of the rollups: `rollups.rebuild_rollups`). It groups
    every row by its key, as costly as the recount itself; ingest and `observatory rebuild` mark batch by batch."""
    con.execute("UPDATE metrics SET replaced = false WHERE replaced IS NOT false")
    if mark(con, 0, all_new=True) is not None:  # every row is new: no older row to report
        con.execute("DROP TABLE _replay_old")
