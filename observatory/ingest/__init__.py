"""Ingest, the stage: event logs → DuckDB store, incremental, exactly-once, every line validated.

    st = Stage()
    files = look(runs_dir, db, st, emit)                 # None: nothing changed on disk
    for batch in batches(runs_dir, db, files, report, st, emit): ...   # each one committed

`observatory.pipeline` runs passes of it (`ingest`, `rebuild`, the follower) and the analyses
after each batch; this package imports none of them.

- `files`: the runs dir's logs, what each has that the store has not, reading one;
- `msgspec_lines`: a chunk of lines decoded in one call, certified in bulk and appended as
  Arrow columns; what it cannot certify goes, line by line, to
- `model`: the data model (a file, a chunk, a file's state, a batch) and `check_line`,
  `observatory.events.validate_event` plus the store's ranges: the one definition of
  "valid" (tests check the bulk path gives the store that judging every line so gives);
- `runs`: the `runs` table, folded from lifecycle events;
- `redaction`: secrets in metric names hidden in the batch (`model` scrubs the rest);
- `passes`: passes and batches, one short write transaction each, and the `Stage` state
  kept between them.

Torn last lines (no final newline) wait while the run may be live and are
recorded as `truncated` once it ended or went quiet for `stale_after_s`.
"""

from __future__ import annotations

from observatory.ingest.files import scan
from observatory.ingest.model import LogFile
from observatory.ingest.passes import IngestReport, Stage, batches, look, looked, write_failure

__all__ = ["IngestReport", "LogFile", "Stage", "batches", "look", "looked", "scan", "write_failure"]
