"""Goodput as SQL views: where each second of a run's wall time went, from process 0's timeline.

Process 0's marks, in time order, cut the run into segments, each counted by what began it:
its `run_start` (`init`), each `phase` event (`init`, `compile`, `eval`, `checkpoint`, `shutdown`; a
`train` phase trains), and each logged step (its `metrics` events: the time to the next logged step is
that step's training). A training segment is
- `redone` when the step it ends at is one an earlier attempt had already reached (a restart or a
  rollback trained it again),
- `stall` when it is longer than `goodput_stall_factor` (10) times the run's median training segment,
- `productive` otherwise;
and the segment that ends at a new attempt's `init` phase is `down` (from the last mark of the attempt
that died to the next attempt's start: lost work and the time to restart).

`goodput` = productive / total. This follows ml-goodput-measurement's split (productive step time over
job time; badput for initialisation and program start-up, checkpoints, evals, disruptions and wasted
progress), with two differences: a stall is its own bucket (theirs counts anomalous step times only on
Pathways), and the time between a disruption and the restart is counted from the last logged mark, so the
work lost since the last checkpoint is inside `down`, not apart from it.
"""

from __future__ import annotations

__all__ = ["GOODPUT_VIEWS", "GOODPUT_DOCS", "STALL_FACTOR", "CATEGORIES"]

STALL_FACTOR = 10
CATEGORIES = ("productive", "init", "compile", "eval", "checkpoint", "stall", "redone", "down", "other")

GOODPUT_VIEWS = f"""
CREATE OR REPLACE VIEW goodput_segments AS
WITH marks AS (
    SELECT run, min(t) AS t, 0 AS o, 'init' AS what, NULL::BIGINT AS attempt, NULL::BIGINT AS step
    FROM events WHERE kind = 'run_start' AND host = 0 GROUP BY run
    UNION ALL
    SELECT run, t, 1, 'step', NULL, step FROM metrics WHERE host = 0 GROUP BY run, t, step
    UNION ALL  -- at one time, a step is logged before the phase it enters (a checkpoint after step s)
    SELECT run, t, 2, coalesce(data->>'phase', 'other'), TRY_CAST(data->>'attempt' AS BIGINT), NULL
    FROM events WHERE kind = 'phase' AND host = 0
    UNION ALL
    SELECT run, t, 3, 'end', NULL, NULL FROM events WHERE kind = 'run_end' AND host = 0
), seg AS (
    SELECT run, t AS t_start, what,
           lead(t) OVER w AS t_end, lead(what) OVER w AS next_what, lead(step) OVER w AS next_step,
           lead(attempt) OVER w AS next_attempt,
           coalesce(max(attempt) OVER (w ROWS UNBOUNDED PRECEDING), 0) AS attempt,
           max(step) OVER (w ROWS UNBOUNDED PRECEDING) AS reached
    FROM marks WINDOW w AS (PARTITION BY run ORDER BY t, o)
), typed AS (
    SELECT run, t_start, t_end, t_end - t_start AS seconds, attempt, next_step AS step,
           CASE
               WHEN next_what = 'init' AND next_attempt > attempt THEN 'down'
               WHEN what IN ('step', 'train') AND next_what = 'step' AND next_step <= reached THEN 'redone'
               WHEN what IN ('step', 'train') AND next_what = 'step' THEN 'train'
               WHEN what IN ('init', 'compile', 'eval', 'checkpoint') THEN what
               ELSE 'other'
           END AS kind
    FROM seg WHERE t_end IS NOT NULL
)
SELECT run, t_start, t_end, seconds, attempt, step,
       CASE WHEN kind <> 'train' THEN kind
            WHEN seconds > {STALL_FACTOR} * median(seconds) FILTER (WHERE kind = 'train') OVER (PARTITION BY run)
                THEN 'stall'
            ELSE 'productive' END AS category
FROM typed;
CREATE OR REPLACE VIEW goodput AS
SELECT run, sum(seconds) AS total_s,
       {", ".join(f"coalesce(sum(seconds) FILTER (WHERE category = '{c}'), 0) AS {c}_s" for c in CATEGORIES)},
       coalesce(sum(seconds) FILTER (WHERE category = 'productive'), 0) / nullif(sum(seconds), 0) AS goodput,
       max(attempt) + 1 AS attempts
FROM goodput_segments GROUP BY run;
"""

GOODPUT_DOCS = {
    "goodput_segments": "View: each run's wall time cut at process 0's marks (run_start, phases, logged "
    "steps, run_end), one row per segment (`run`, `t_start`, `t_end`, `seconds`, `attempt`, `step`: the "
    "logged step it ends at, `category`: productive, init, compile, eval, checkpoint, stall, redone, down "
    "or other); see docs/operate.md for the rules.",
    "goodput": "View: per run, `total_s`, one `<category>_s` column per category of `goodput_segments`, "
    "`goodput` (productive / total) and `attempts` (restart attempts seen).",
}
