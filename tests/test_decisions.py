"""Decision history: records validated, written as events, folded by the store, round-tripped as Markdown.

Real parts throughout: the observatory writer, the real ingest into a DuckDB file
in tmp_path, the real `observatory` CLI through click's CliRunner.
"""

from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

import observatory
from observatory import decisions as dec
from observatory import findings
from observatory.cli import main
from observatory.decisions import markdown as decisions_md
from observatory.pipeline import ingest


def _ingest(runs, db):
    ingest(runs, db, hooks=False, emit=None)


@pytest.fixture
def store(tmp_path, monkeypatch):
    """A runs dir with one finished run `r1` (with a config_diff and two failures) and its store."""
    runs, db = tmp_path / "runs", tmp_path / "obs.duckdb"
    monkeypatch.setenv("OBSERVATORY_RUNS", str(runs))
    monkeypatch.setenv("OBSERVATORY_DB", str(db))
    monkeypatch.setenv("USER", "tester")
    with observatory.init(
        run_id="r1", runs_dir=runs, config={"optim": {"lr": 3e-4}}, install_signal_handlers=False
    ) as run:
        run.event(
            "config_diff", {"against": {"run": "r0", "step": 100}, "changes": {"optim.lr": [1e-3, 3e-4]}}, 0
        )
        for step in range(10):
            run.log({"train/loss": 3.0 - 0.1 * step}, step=step)
        run.event("failure", {"type": "nan_loss", "message": "loss is nan", "action": "skip_batch"}, step=5)
        run.event("failure", {"type": "exception", "message": "boom", "action": "halt"}, step=7)
    _ingest(runs, db)
    return runs, db


def invoke(*args, ok=True):
    res = CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)
    if ok:
        assert res.exit_code == 0, res.output
    return res


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"kind": "hunch"}, "kind must be one of experiment, intervention, policy"),
        ({"status": "done"}, "status must be one of proposed"),
        ({"forecast": {"metric": "train/loss"}}, "forecast.value is required"),
        (
            {"forecast": {"metric": "train/loss", "value": 1.0, "confidence": 0.9}},
            "unknown keys ['confidence']",
        ),
        ({"runs": [{"run": "bad run!"}]}, "runs[].run must be a run id"),
        ({"runs": ["r1@x"]}, "step after '@' must be an integer"),
        ({"config_diff": {"optim.lr": 3}}, "config_diff must map 'dotted.key' to [old, new]"),
        ({"cost": {"hours": -1}}, "cost.hours must be >= 0"),
        ({"alternatives": "just one"}, "alternatives must be a list of text"),
        ({"id": "has space"}, "decision id must match"),
        ({"title": "  "}, "title must be non-empty"),
    ],
)
def test_bad_fields_raise_clear_errors(fields, message):
    with pytest.raises(ValueError) as e:
        dec.Decision(**{"id": "d1", "title": "t", **fields})
    assert message in str(e.value)


def test_transitions():
    d = dec.Decision("d1", "t")
    d.check_transition("running")
    d.check_transition("abandoned")
    with pytest.raises(ValueError, match="cannot go from proposed to succeeded"):
        d.check_transition("succeeded")
    done = dec.Decision("d1", "t", status="failed")
    with pytest.raises(ValueError, match="it is final"):
        done.check_transition("running")


# ---------------------------------------------------------------- life cycle through the CLI


def test_life_cycle_through_cli(store):
    runs, db = store
    res = invoke(
        "decide",
        "new",
        "--title",
        "Enable z-loss",
        "--kind",
        "intervention",
        "--run",
        "r1@5",
        "--trigger-metric",
        "grad/norm/total",
        "--trigger-rule",
        "> 4 for 50 steps",
        "--action",
        "z_loss=1e-4",
        "--forecast-metric",
        "train/loss",
        "--forecast-value",
        "2.1",
        "--alternative",
        "lower LR",
        "--config-change",
        "model.z_loss=[0, 1.0e-4]",
        "--cost-steps",
        "200",
        "--json",
    )
    rec = json.loads(res.output)
    did = rec["id"]
    assert did == "enable-z-loss" and rec["status"] == "proposed" and rec["author"] == "tester"
    assert rec["config_diff"] == {"model.z_loss": [0, 1e-4]}

    invoke("decide", "update", did, "--status", "running", "--evidence", "https://example.org/run/r1")
    invoke("decide", "update", did, "--status", "succeeded", "--outcome", "grad norm back under 1")
    bad = invoke("decide", "update", did, "--status", "running", ok=False)
    assert bad.exit_code != 0 and "cannot go from succeeded to running" in bad.output

    shown = json.loads(invoke("decide", "show", did, "--json").output)
    assert shown["status"] == "succeeded" and shown["outcome"] == "grad norm back under 1"
    assert shown["evidence"] == ["https://example.org/run/r1"]
    assert shown["trigger"] == {
        "metric": "grad/norm/total",
        "rule": "> 4 for 50 steps",
        "step": None,
    } or shown["trigger"] == {"metric": "grad/norm/total", "rule": "> 4 for 50 steps"}
    # each change is its own event: the whole history stays visible
    assert [sorted(set(h["data"]) - {"id", "updated"}) for h in shown["history"]][1:] == [
        ["evidence", "status"],
        ["outcome", "status"],
    ]
    assert shown["created"] < shown["updated"]

    # written into the linked run's folder as host 1000, and nothing else touched there
    lines = [json.loads(x) for x in findings.path(runs, "r1").read_text().splitlines()]
    assert [x["kind"] for x in lines] == ["decision"] * 3 and all(x["host"] == 1000 for x in lines)
    assert lines[0]["step"] == 5

    listed = json.loads(invoke("decide", "list", "--status", "succeeded", "--json").output)
    assert [x["id"] for x in listed] == [did]
    assert json.loads(invoke("decide", "list", "--status", "proposed", "--json").output) == []
    assert did in invoke("decide", "list").output
    text = invoke("decide", "show", did).output
    assert "history (3 events)" in text and "[intervention, succeeded]" in text
    missing = invoke("decide", "show", "nope", ok=False)
    assert missing.exit_code != 0 and "no decision 'nope'" in missing.output


def test_unlinked_decision_goes_to_decisions_folder(store):
    runs, db = store
    invoke(
        "decide", "new", "--title", "Policy: z-loss on every run", "--kind", "policy", "--id", "zloss-policy"
    )
    assert findings.path(runs, "decisions").exists()
    d = dec.get(db, "zloss-policy")
    assert d is not None and d.kind == "policy" and d.runs == ()
    # a linked run that does not exist locally also lands in decisions/, not in a fake run folder
    dec.new(runs, db, id="far", title="About a remote run", runs=["elsewhere@3"], ingest=ingest)
    assert not (runs / "elsewhere").exists()
    assert dec.get(db, "far").runs == (dec.RunLink("elsewhere", 3),)


def test_new_from_markdown_file(store, tmp_path):
    runs, db = store
    f = tmp_path / "plan.md"
    f.write_text(
        "---\nkind: experiment\nruns: [{run: r1, step: 9}]\nforecast: {metric: eval/loss, value: 2.6}\n---\n"
        "# Try a longer warmup\n\n## Hypothesis\n\nSpikes at step 5 come from the LR ramp.\n\n"
        "## Goal\n\nNo spike in the first 1k steps.\n",
        encoding="utf-8",
    )
    res = invoke("decide", "new", str(f), "--author", "ana", "--json")
    rec = json.loads(res.output)
    assert rec["title"] == "Try a longer warmup" and rec["author"] == "ana"
    assert rec["hypothesis"] == "Spikes at step 5 come from the LR ramp."
    assert rec["goal"] == "No spike in the first 1k steps."
    assert dec.get(db, rec["id"]).forecast == dec.Forecast("eval/loss", 2.6)
    bad = tmp_path / "bad.md"
    bad.write_text("---\ntitle: x\nkind: guess\n---\n", encoding="utf-8")
    res = invoke("decide", "new", str(bad), ok=False)
    assert res.exit_code != 0 and "kind must be one of" in res.output


def test_clearing_a_field_and_python_api(store):
    runs, db = store
    d = dec.new(runs, db, title="Lower LR", goal="stable", runs=["r1"], ingest=ingest)
    d2 = dec.update(runs, db, d.id, goal="", ingest=ingest)
    assert d2.goal == "" and dec.get(db, d.id).goal == ""
    assert dec.update(runs, db, d.id, goal="", ingest=ingest) == dec.get(
        db, d.id
    )  # nothing changed: no event
    assert len(dec.history(db, d.id)) == 2
    with pytest.raises(ValueError, match="already exists"):
        dec.new(runs, db, id=d.id, title="again", ingest=ingest)


# ---------------------------------------------------------------- automatic records


def test_after_ingest_records_config_changes_and_interventions(store):
    runs, db = store
    wrote = dec.after_ingest(db, runs, ["r1"])
    assert wrote == {"r1"}
    assert dec.after_ingest(db, runs, ["r1"]) == set()  # idempotent before the next ingest
    _ingest(runs, db)
    assert dec.after_ingest(db, runs, None) == set()  # and after it
    autos = {d.id: d for d in dec.list_decisions(db) if d.id.startswith("auto-")}
    assert len(autos) == 2  # the `halt` failure is not an intervention
    cfg = next(d for d in autos.values() if d.kind == "experiment")
    assert cfg.status == "proposed" and cfg.config_diff == {"optim.lr": [1e-3, 3e-4]}
    assert [r.run for r in cfg.runs] == ["r1", "r0"]
    iv = next(d for d in autos.values() if d.kind == "intervention")
    assert iv.action == "skip_batch" and iv.trigger.step == 5 and iv.status == "running"
    assert iv.evidence[0]["event"]["kind"] == "failure"


def test_after_ingest_accepts_an_open_connection(store):
    runs, db = store
    from observatory.store import connect

    with connect(db) as con:
        assert dec.after_ingest(con, runs, ["r1"]) == {"r1"}


# ---------------------------------------------------------------- Markdown round trip


def _rich_decisions(runs, db):
    a = dec.new(
        runs,
        db,
        id="zloss",
        title="Enable z-loss: grad norm > 4",
        kind="intervention",
        hypothesis="Logit growth drives the grad norm.\n\n## Not a section\nsecond paragraph, ünïcode ✓",
        goal="grad norm < 1",
        forecast={"metric": "train/loss", "value": 2.25, "assumptions": "same data"},
        trigger={"metric": "grad/norm/total", "rule": "> 4", "step": 7},
        action="z_loss=1e-4",
        alternatives=["lower LR", "QK-norm"],
        runs=[{"run": "r1", "step": 7}],
        config_diff={"model.z_loss": [0.0, 1e-4], "optim.clip": [None, 1.0]},
        evidence=["https://example.org/x", {"metric": "grad/norm/total", "step": 7, "value": 4.5}],
        cost={"steps": 100, "tokens": 409600, "hours": 0.5},
        author="ana",
        ingest=ingest,
    )
    dec.update(runs, db, a.id, status="running", ingest=ingest)
    dec.update(
        runs,
        db,
        a.id,
        status="succeeded",
        outcome="worked\n",
        follow_up="## Outcome\nkeep it on",
        ingest=ingest,
    )
    dec.new(
        runs,
        db,
        id="ladder-policy",
        title="Policy: every hero run has a ladder",
        kind="policy",
        ingest=ingest,
    )
    dec.new(
        runs,
        db,
        id="odd",
        title="Odd values",
        hypothesis="  leading space",
        extra={"reviewer": "bo"},
        ingest=ingest,
    )


def test_markdown_export_import_round_trip(store, tmp_path):
    runs, db = store
    _rich_decisions(runs, db)
    before = {d.id: d for d in dec.list_decisions(db)}
    a = tmp_path / "a"
    invoke("decide", "export", a)
    files = sorted(p.name for p in a.glob("*.md"))
    assert files == ["ladder-policy.md", "odd.md", "zloss.md"]
    text = (a / "zloss.md").read_text(encoding="utf-8")
    assert text.startswith("---\n") and "\n## Hypothesis\n" in text and "# Enable z-loss" in text

    # into an empty store: same records, same history, same files
    runs2, db2 = tmp_path / "runs2", tmp_path / "obs2.duckdb"
    (runs2 / "r1").mkdir(parents=True)
    res = invoke("decide", "import", a, "--runs-dir", runs2, "--db", db2)
    assert "imported 3 new" in res.output
    after = {d.id: d for d in dec.list_decisions(db2)}
    assert after == before
    assert len(dec.history(db2, "zloss")) == 3
    b = tmp_path / "b"
    invoke("decide", "export", b, "--db", db2)
    for name in files:
        assert (b / name).read_text(encoding="utf-8") == (a / name).read_text(encoding="utf-8"), name

    # importing the same files again writes nothing; an edited file becomes one update
    assert "0 new, 0 updated, 3 unchanged" in invoke("decide", "import", a).output
    edited = (
        (a / "ladder-policy.md").read_text(encoding="utf-8").replace("status: proposed", "status: running")
    )
    (a / "ladder-policy.md").write_text(edited, encoding="utf-8")
    assert "1 updated" in invoke("decide", "import", a).output
    assert dec.get(db, "ladder-policy").status == "running"
    # a bad transition in a file is refused, naming the file, and nothing is written
    n = len(dec.history(db, "zloss"))
    bad = (a / "zloss.md").read_text(encoding="utf-8").replace("status: succeeded", "status: proposed", 1)
    (a / "zloss.md").write_text(bad, encoding="utf-8")
    res = invoke("decide", "import", a, ok=False)
    assert res.exit_code != 0 and "zloss.md" in res.output and "cannot go from succeeded" in res.output
    assert len(dec.history(db, "zloss")) == n


def test_markdown_parse_errors_name_the_file(tmp_path):
    p = tmp_path / "x.md"
    p.write_text("---\ntitle: [unclosed\n---\n", encoding="utf-8")
    with pytest.raises(ValueError, match="x.md: front matter is not valid YAML"):
        decisions_md.read_file(p)
    with pytest.raises(ValueError, match="s.md: hypothesis is given both"):
        decisions_md.loads("---\ntitle: t\nhypothesis: h\n---\n## Hypothesis\n\nagain\n", source="s.md")
    with pytest.raises(ValueError, match="s.md: section '## Hypothesis' appears twice"):
        decisions_md.loads("---\ntitle: t\n---\n## Hypothesis\n\na\n## Hypothesis\n\nb\n", source="s.md")
    meta, hist = decisions_md.loads("# A title\n\nJust a thought.\n")
    assert meta == {"title": "A title", "hypothesis": "Just a thought."} and hist is None


def test_dumps_loads_is_lossless_for_awkward_text():
    d = dec.Decision(
        "x",
        "t",
        hypothesis="ends with newline\n",
        goal="# looks like a title",
        outcome="## Goal\ninside",
        forecast={"metric": "m", "value": math.inf},
        created=1764400000.125,
        updated=1764400001.5,
    )
    meta, hist = decisions_md.loads(decisions_md.dumps(d))
    assert hist is None and dec.Decision.from_dict(meta) == d


# ---------------------------------------------------------------- dashboard page


@pytest.mark.slow
def test_decisions_page_renders(store):
    from streamlit.testing.v1 import AppTest

    runs, db = store
    _rich_decisions(runs, db)
    at = AppTest.from_string(
        "from observatory.dashboard.pages import decisions\ndecisions.render()\n", default_timeout=60
    ).run()
    assert not at.exception
    text = " ".join(m.value for m in at.markdown) + " ".join(str(df.value) for df in at.dataframe)
    assert "zloss" in text


def _lower_lr_on_1129() -> None:
    """`lower-lr`, made at 2026-11-29 12:21:03 UTC and set running at 13:00 (written down now)."""
    invoke(
        "decide",
        "new",
        "--title",
        "Lower the LR",
        "--id",
        "lower-lr",
        "--run",
        "r1@3",
        "--at",
        "2026-11-29T12:21:03Z",
    )
    # a time without a zone is UTC
    invoke("decide", "update", "lower-lr", "--status", "running", "--at", "2026-11-29T13:00:00")


def test_at_sets_when_a_decision_was_made_and_changed(store):
    """`--at ISO` records a decision with the times it was made, for a history written down later."""
    _lower_lr_on_1129()
    d = json.loads(invoke("decide", "show", "lower-lr", "--json").output)
    assert d["created"] == 1795954863.0
    assert d["updated"] == 1795957200.0
    assert [h["data"].get("updated") for h in d["history"]] == [1795954863.0, 1795957200.0]
    early = invoke(
        "decide", "update", "lower-lr", "--status", "succeeded", "--at", "2026-11-29T12:00:00Z", ok=False
    )
    assert early.exit_code != 0 and "before its last change" in early.output
    bad = invoke("decide", "new", "--title", "x", "--at", "yesterday", ok=False)
    assert bad.exit_code == 2 and "ISO 8601" in bad.output


# ---------------------------------------------------------------- someone else's records


def test_an_invalid_foreign_record_is_named_and_the_rest_still_listed(store, tmp_path):
    """A decision event from another writer with a status no record allows does not take the list down."""
    from observatory import report

    runs, db = store
    invoke("decide", "new", "--title", "keep the LR", "--run", "r1@3", "--id", "D-ok")
    with observatory.init(
        run_id="r1", runs_dir=runs, host=5, write_start=False, install_signal_handlers=False
    ) as r:
        r.event("decision", {"id": "D-bad", "title": "lower the LR", "status": "accepted"}, step=4)
    _ingest(runs, db)

    unreadable: list = []
    ids = [d.id for d in dec.list_decisions(db, unreadable=unreadable)]
    assert "D-ok" in ids and "D-bad" not in ids
    assert unreadable == [("D-bad", unreadable[0][1])] and "'accepted'" in unreadable[0][1]

    res = CliRunner().invoke(main, ["decide", "list"])
    assert res.exit_code == 0 and "D-ok" in res.stdout
    assert "D-bad" in res.stderr and "not valid" in res.stderr

    res = invoke("decide", "export", tmp_path / "md")
    assert (tmp_path / "md" / "D-ok.md").exists() and not (tmp_path / "md" / "D-bad.md").exists()
    assert "D-bad" in res.stderr

    rep = report.build(db, "r1")  # the run's report is still built, and says what it left out
    assert any(d.id == "D-ok" for d in rep.decisions)
    assert any(k == "decision D-bad (not shown)" and "'accepted'" in v for k, v in rep.summary)


def test_the_pages_created_date_agrees_with_its_history(store):
    """A decision written down on 12-01 with `--at` 11-29: the header's created date and the history's first
    row say the same day (the row also says when it was recorded)."""
    from streamlit.testing.v1 import AppTest

    _lower_lr_on_1129()
    invoke("ingest")
    at = AppTest.from_string(
        "from observatory.dashboard.pages import decisions\ndecisions.render()\n", default_timeout=60
    ).run()
    assert not at.exception, at.exception
    header = next(c.value for c in at.caption if "created" in c.value)
    assert "created 2026-11-29 12:21 UTC" in header and "updated 2026-11-29 13:00 UTC" in header
    hist = at.dataframe[-1].value
    assert list(hist["time"]) == ["2026-11-29 12:21 UTC", "2026-11-29 13:00 UTC"]
    assert all(not r.startswith("2026-11-29") for r in hist["recorded"])  # written today
