"""`make demo` seeds the runs dir with the committed sample ladder; it must ingest cleanly."""

from __future__ import annotations

from observatory import demo
from observatory.ingest import ingest
from observatory.queries.core import list_runs
from observatory.store import connect


def test_samples_seed_and_ingest_without_rejections(tmp_path):
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    n = demo.seed_samples(runs)
    assert n >= 5, "data/samples should hold a ladder of 4 rungs and a target"
    assert demo.seed_samples(runs) == 0  # seeding twice copies nothing
    rep = ingest(runs, db, hooks=False)
    assert rep.rejected == 0
    with connect(db) as con:
        ladders = con.execute(
            "SELECT count(*) FILTER (WHERE ladder_name IS NOT NULL), count(*) FROM runs"
        ).fetchall()[0]
        forecasts = con.execute("SELECT count(*) FROM events WHERE kind = 'forecast'").fetchall()[0][0]
        statuses = {r["status"] for r in list_runs(con)}
    assert ladders[0] == ladders[1] == n
    assert forecasts >= 1, "the target's pre-registered forecast is part of the sample"
    assert statuses == {"completed"}
