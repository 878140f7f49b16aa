"""All SQL of the observatory lives in this package, one module per area.

CLI commands, reports and dashboard pages call these functions and hold no SQL
strings. Each function takes an open connection that the caller owns
(`with observatory.store.connect(db) as con:`), except `user_sql.run_user_sql`, the
one safe door for SQL typed by a person (a guarded worker process: read-only, an
allow-listed policy, memory, time, concurrency and size limits, paths scrubbed).

- `core`: runs with live status, metric series, rejected lines
- `user_sql` (and `user_sql_worker`, the process it runs queries in): user SQL
- `dashboard`, `experts`: the dashboard's charts (downsampled, rollup-backed)
- `anomalies`, `alerts`, `decisions`, `lineage`, `report`, `export`: their areas (`anomalies.run_activity`:
  a run's progress and phase, for the detectors and the alert rules alike)
"""
