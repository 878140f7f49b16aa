"""All SQL of the observatory lives in this package, one module per area.

CLI commands, reports and dashboard pages call these functions and hold no SQL
strings. Each function takes an open connection that the caller owns
(`with observatory.store.connect(db) as con:`), except `core.run_user_sql`, the
one safe door for SQL typed by a person (read-only, external access off, row cap,
time limit).

- `core`: runs with live status, metric series, rejected lines, user SQL
- `dashboard`, `experts`: the dashboard's charts (downsampled, rollup-backed)
- `anomalies`, `decisions`, `lineage`, `report`, `export`: their areas
"""
