"""A runs dir in a bucket (s3://, gs://), against moto's S3 server and gcp-storage-emulator on local ports."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import bucket_fixtures
import pytest

import observatory
from observatory import bucket, store
from observatory.ingest.bucket_source import BucketSource
from observatory.pipeline import ingest


@pytest.fixture(scope="session")
def emulators():
    with bucket_fixtures.running() as em:
        yield em


@pytest.fixture(params=["s3", "gs"])
def bucket_url(request, emulators, tmp_path, monkeypatch) -> str:
    """A fresh bucket runs dir on each emulator; the writers' spool under the test's temp folder."""
    monkeypatch.setenv("OBSERVATORY_SPOOL_DIR", str(tmp_path / "spool"))
    return emulators.new_bucket(request.param)


@pytest.fixture
def s3_url(emulators, tmp_path, monkeypatch) -> str:
    monkeypatch.setenv("OBSERVATORY_SPOOL_DIR", str(tmp_path / "spool"))
    return emulators.new_bucket("s3")


def _steps(db: Path, run: str) -> list[int]:
    with store.connect(db) as con:
        return [
            r[0]
            for r in con.execute("SELECT step FROM metrics WHERE run = ? ORDER BY step", [run]).fetchall()
        ]


def _log(url: str, run: str, steps: range, finish: bool = True, **kw) -> None:
    r = observatory.init(run_id=run, runs_dir=url, chunk_s=0.1, heartbeat_s=0, **kw)
    for s in steps:
        r.log({"train/loss": 1.0 / (s + 1)}, step=s)
    if finish:
        r.finish()
    else:
        r.close()


def _live(url: str, run: str, steps: range, settle_s: float):
    """A run still writing to the bucket: `steps` logged and flushed, and `settle_s` for a few chunks to go up."""
    r = observatory.init(run_id=run, runs_dir=url, chunk_s=0.1, heartbeat_s=0)
    for s in steps:
        r.log({"train/loss": 1.0}, step=s)
    r.flush()
    time.sleep(settle_s)
    return r


def test_a_run_written_to_a_bucket_is_ingested_from_it(bucket_url, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _log(bucket_url, "r1", range(50))
    report = ingest(bucket_url, tmp_path / "a.duckdb", emit=None)
    assert report.events == 50 + 5  # run_start, phases init, train and shutdown, the steps, run_end
    assert _steps(tmp_path / "a.duckdb", "r1") == list(range(50))
    with store.connect(tmp_path / "a.duckdb") as con:
        assert con.execute("SELECT status FROM runs WHERE run = 'r1'").fetchone()[0] == "completed"
    assert not (tmp_path / "s3:").exists() and not (tmp_path / "gs:").exists()  # never a folder named "s3:"
    keys = bucket.Bucket(bucket_url).list_after("r1/")
    assert keys and all(k.startswith("r1/events.0/") and k.endswith(".jsonl") for k in keys)


def test_a_url_with_a_credential_is_refused_without_showing_it():
    with pytest.raises(ValueError) as e:
        bucket.location("s3://AKIAEXAMPLE:hunter2secret@bkt/runs")
    assert "hunter2secret" not in str(e.value) and "AKIAEXAMPLE" not in str(e.value)
    with pytest.raises(ValueError, match="local folder, s3://"):
        bucket.location("az://container/runs")
    assert bucket.safe("gs://u:p@bkt/x?token=abc") == "gs://bkt/x"
    assert bucket.location("gcs://bkt/runs/") == "gs://bkt/runs"
    assert isinstance(bucket.location("runs/here"), Path)


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_cli_takes_a_bucket_url(s3_url, tmp_path):
    _log(s3_url, "cli-run", range(5))
    env = {**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    db = tmp_path / "c.duckdb"
    cmd = [sys.executable, "-m", "observatory.cli", "ingest", "--runs-dir", s3_url, "--db", str(db), "-q"]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert _steps(db, "cli-run") == list(range(5))
    # a command that reads run folders gets the store's mirror of the bucket
    for args in (["runs"], ["detect"], ["report", "cli-run", "--out", str(tmp_path / "rep")]):
        cmd = [sys.executable, "-m", "observatory.cli", *args, "--runs-dir", s3_url, "--db", str(db)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert out.returncode == 0, (args, out.stderr)
    assert not (tmp_path / "s3:").exists()


def test_a_corrupt_chunk_is_quarantined_with_its_key_and_the_stream_goes_on(bucket_url, tmp_path):
    b = bucket.Bucket(bucket_url)
    lines = [
        json.dumps(
            {
                "v": 1,
                "run": "c",
                "kind": "metrics",
                "step": i,
                "t": time.time(),
                "host": 0,
                "seq": i,
                "data": {"train/loss": 1.0},
            }
        ).encode()
        + b"\n"
        for i in range(3)
    ]
    bodies = [
        lines[0],
        b'{"note": "hf_' + b"a" * 34 + b'"}\n' + lines[1][:-9],
        lines[2],
    ]  # chunk 1 cut mid-line
    for n, body in enumerate(bodies):
        assert b.put_new(bucket.chunk_key("c", 0, n), body)
        assert b.put_new(bucket.journal_key(int(time.time() * 1000), "c", 0, n), b"")
    db = tmp_path / "q.duckdb"
    ingest(bucket_url, db, emit=None)
    assert _steps(db, "c") == [0, 2]
    with store.connect(db) as con:
        rows = con.execute("SELECT file, run, field, reason FROM rejected_events").fetchall()
    assert rows == [(b.key_url("c/events.0/0000000001.jsonl"), "c", "(chunk)", pytest.approx(rows[0][3]))]
    assert "half-written" in rows[0][3]
    with store.connect(db) as con:
        raw = con.execute("SELECT raw FROM rejected_events").fetchone()[0]
    assert "hf_" + "a" * 34 not in raw and "<redacted>" in raw  # the chunk's text is public: secrets hidden


@pytest.mark.slow  # seconds each against the emulators
def test_a_follower_restarted_mid_stream_neither_loses_nor_repeats(bucket_url, tmp_path):
    db = tmp_path / "f.duckdb"
    r = _live(bucket_url, "live", range(20), 0.6)
    ingest(bucket_url, db, emit=None)
    first = _steps(db, "live")
    assert first and first == list(range(len(first)))
    # a pass cut short after appending to the mirror but before saving the cursor: bytes past the cursor
    mirror = bucket.mirror_of(bucket.location(bucket_url), db) / "live" / "events.0.jsonl"
    with open(mirror, "ab") as f:
        f.write(b'{"half": "a chunk')
    for s in range(20, 40):
        r.log({"train/loss": 1.0}, step=s)
    r.finish()
    ingest(bucket_url, db, emit=None)  # a new process: state from the mirror's cursors
    assert _steps(db, "live") == list(range(40))


@pytest.mark.slow  # seconds each against the emulators
def test_two_followers_on_one_bucket_give_the_same_answers(bucket_url, tmp_path):
    for i in range(3):
        _log(bucket_url, f"run{i}", range(10 * (i + 1)))
    answers = []
    for name in ("one", "two"):
        db = tmp_path / f"{name}.duckdb"
        ingest(bucket_url, db, emit=None)
        with store.connect(db) as con:
            answers.append(
                (
                    con.execute("SELECT run, status FROM runs ORDER BY run").fetchall(),
                    con.execute("SELECT run, step, value FROM metrics ORDER BY run, step").fetchall(),
                )
            )
    assert answers[0] == answers[1] and len(answers[0][1]) == 60


@pytest.mark.slow  # seconds each against the emulators
def test_an_idle_pass_is_one_list_whatever_the_runs(s3_url, tmp_path):
    b = bucket.Bucket(s3_url)
    old = int(time.time() * 1000) - 3_600_000  # finished an hour ago
    line = b'{"v":1,"run":"%s","kind":"run_end","step":null,"t":1.0,"host":0,"seq":0,"data":{"status":"completed"}}\n'
    for i in range(60):
        run = f"done{i:03d}"
        b.put_new(bucket.chunk_key(run, 0, 0), line % run.encode())
        b.put_new(bucket.journal_key(old + i, run, 0, 0), b"")
    src = BucketSource(s3_url, tmp_path / "i.duckdb", margin_s=300)
    assert src.pull(lambda m: None) == 60  # the catch-up: every chunk once
    before = src.bucket.requests
    assert src.pull(lambda m: None) == 0
    assert src.bucket.requests - before == 1  # idle: one LIST of the journal's recent end
    _log(s3_url, "live", range(3))  # a live run's chunks: one list, and a GET per new chunk
    before = src.bucket.requests
    got = src.pull(lambda m: None)
    assert got >= 1 and src.bucket.requests - before == 1 + got


@pytest.mark.subprocess
def test_a_writer_killed_with_sigkill_resumes_without_holes_or_duplicates(bucket_url, tmp_path):
    script = textwrap.dedent(
        f"""
        import sys, time, observatory
        r = observatory.init(run_id="k", runs_dir={bucket_url!r}, chunk_s=0.2, heartbeat_s=0,
                             write_start=sys.argv[1] == "0")
        start = int(sys.argv[1])
        for s in range(start, start + int(sys.argv[2])):
            r.log({{"train/loss": 1.0}}, step=s)
            time.sleep(0.01)
        print("logged", flush=True)
        if sys.argv[3] == "finish":
            r.finish()
        else:
            time.sleep(60)
        """
    )
    (tmp_path / "w.py").write_text(script)
    p = subprocess.Popen(
        [sys.executable, str(tmp_path / "w.py"), "0", "100", "hang"], stdout=subprocess.PIPE, text=True
    )
    assert p.stdout.readline().strip() == "logged"
    time.sleep(1.0)  # the steps are in the spool and some chunks are up; then kill -9 mid-run
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    subprocess.run([sys.executable, str(tmp_path / "w.py"), "100", "50", "finish"], check=True, timeout=120)
    db = tmp_path / "k.duckdb"
    ingest(bucket_url, db, emit=None)
    assert _steps(db, "k") == list(range(150))
    b = bucket.Bucket(bucket_url)
    keys = b.list_after("k/events.0/")
    assert keys == [bucket.chunk_key("k", 0, n) for n in range(len(keys))]  # chunks 0, 1, 2, ... no gap
    got = b.get_many(keys)
    seqs = [json.loads(line)["seq"] for k in keys for line in bytes(got[k]).splitlines()]
    assert seqs == list(range(len(seqs)))  # in the bucket itself: no hole, no duplicate


@pytest.mark.slow
def test_a_minute_without_the_store_loses_nothing(emulators, s3_url, tmp_path, capfd):
    r = observatory.init(run_id="o", runs_dir=s3_url, chunk_s=0.5, heartbeat_s=0)
    for s in range(10):
        r.log({"train/loss": 1.0}, step=s)
    time.sleep(1.5)
    emulators.stop_s3()
    try:
        t0 = time.monotonic()
        s = 10
        while time.monotonic() - t0 < 60:  # a minute of training while the store does not answer
            r.log({"train/loss": 1.0}, step=s)
            s += 1
            time.sleep(0.05)
    finally:
        emulators.start_s3()
    r.finish()
    assert (
        "cannot upload chunk" in capfd.readouterr().err
    )  # the store was down for the writer, not only in name
    db = tmp_path / "o.duckdb"
    ingest(s3_url, db, emit=None)
    assert _steps(db, "o") == list(range(s))


def test_findings_for_a_bucket_runs_dir_are_ingested_with_it(s3_url, tmp_path):
    from observatory import findings

    _log(s3_url, "f1", range(3))
    assert findings.root(s3_url) == findings.root(
        bucket.mirror_of(bucket.location(s3_url), tmp_path / "x.duckdb")
    )
    findings.write(s3_url, "f1", "note", [({"text": "a decision was made"}, 2)])
    db = tmp_path / "x.duckdb"
    ingest(s3_url, db, emit=None)
    with store.connect(db) as con:
        assert con.execute("SELECT count(*) FROM events WHERE run = 'f1' AND host = 1000").fetchone()[0] == 1


@pytest.mark.slow
@pytest.mark.subprocess
def test_simulate_and_ladder_import_write_to_a_bucket(s3_url, tmp_path):
    db = tmp_path / "s.duckdb"
    csv = tmp_path / "points.csv"
    csv.write_text("ladder,rung,flops,loss\nlab,1,1e18,3.1\nlab,2,1e19,2.8\nlab,3,1e20,2.6\n")
    for args in (
        [
            "simulate",
            "--preset",
            "tiny",
            "--steps",
            "60",
            "--run-id",
            "sim",
            "--runs-dir",
            s3_url,
            "--db",
            str(db),
            "--ingest",
        ],
        ["ladder", "import", str(csv), "--runs-dir", s3_url, "--db", str(db)],
    ):
        out = subprocess.run(
            [sys.executable, "-m", "observatory.cli", *args],
            capture_output=True,
            text=True,
            timeout=180,
            cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH") or str(Path.cwd())},
        )
        assert out.returncode == 0, out.stderr
    assert not (tmp_path / "s3:").exists()
    with store.connect(db) as con:
        runs = {r[0] for r in con.execute("SELECT run FROM runs").fetchall()}
    assert "sim" in runs and len(runs) >= 4


@pytest.mark.slow  # seconds each against the emulators
def test_ingest_follow_tails_a_live_run_in_a_bucket(bucket_url, tmp_path):
    import threading

    db = tmp_path / "live.duckdb"
    stop = threading.Event()
    follower = threading.Thread(
        target=ingest, args=(bucket_url, db), kwargs={"follow": True, "stop_event": stop, "emit": None}
    )
    follower.start()
    r = observatory.init(run_id="tail", runs_dir=bucket_url, chunk_s=0.2, heartbeat_s=0)
    try:
        for s in range(30):
            r.log({"train/loss": 1.0}, step=s)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not db.exists() or len(_steps(db, "tail")) < 30):
            time.sleep(0.3)
        assert _steps(db, "tail") == list(range(30))  # live: before the run ends
    finally:
        r.finish()
        stop.set()
        follower.join(30)


@pytest.mark.slow  # seconds each against the emulators
def test_an_announced_chunk_that_is_not_there_holds_up_only_its_stream(s3_url, tmp_path):
    b = bucket.Bucket(s3_url)
    now = int(time.time() * 1000)
    b.put_new(bucket.journal_key(now, "evil", 0, 9_999_999_999), b"")  # announces 10^10 chunks, has none
    _log(s3_url, "good", range(5))
    said: list[str] = []
    src = BucketSource(s3_url, tmp_path / "e.duckdb", margin_s=300)
    assert src.pull(said.append) >= 1
    assert any("evil/events.0/0000000000.jsonl: cannot read" in m for m in said)
    assert (src.mirror / "good" / "events.0.jsonl").stat().st_size > 0
    assert src.bucket.requests < 300  # one window of the evil stream at most, not 10^10 keys


@pytest.mark.slow
@pytest.mark.jax
def test_the_trainer_writes_its_events_to_a_bucket(s3_url, tmp_path):
    from trainer.config import load_config
    from trainer.train import train

    root = Path(__file__).resolve().parents[1]
    c = load_config(
        root / "trainer" / "configs" / "tiny.yaml",
        [
            "telemetry.progress=false",
            "telemetry.peak_flops=1e10",
            "steps=8",
            "eval.every=0",
            "checkpoint.every=4",
        ],
    )
    run_id = train(c, s3_url, run_id="trained")
    db = tmp_path / "t.duckdb"
    ingest(s3_url, db, emit=None)
    assert _steps(db, run_id)[-1] == 8  # steps 1..8
    with store.connect(db) as con:
        assert con.execute("SELECT status FROM runs WHERE run = 'trained'").fetchone()[0] == "completed"
    assert (
        Path(os.environ["OBSERVATORY_SPOOL_DIR"])
        / bucket.tag(bucket.location(s3_url))
        / run_id
        / "checkpoints"
    ).is_dir()


def test_a_wandb_style_script_with_dir_in_a_bucket(bucket_url, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OBSERVATORY_CHUNK_S", "0.2")
    import observatory as wandb

    run = wandb.init(project="mnist", config={"lr": 3e-4}, dir=bucket_url)
    for step in range(10):
        wandb.log({"train": {"loss": 1.0 / (step + 1)}, "acc": step / 10})
    wandb.finish()
    said = capsys.readouterr().err
    assert f"--runs-dir {bucket_url}" in said and "s3:/" not in said.replace("s3://", "")
    db = tmp_path / "w.duckdb"
    ingest(bucket_url, db, emit=None)
    assert len(_steps(db, run.id)) == 20  # train/loss and acc at 10 steps
    assert not {"s3:", "gs:", "wandb"} & set(os.listdir(tmp_path))  # no folder named after the URL


@pytest.mark.slow  # seconds each against the emulators
def test_rebuild_of_a_store_that_follows_a_bucket(s3_url, tmp_path):
    from observatory.pipeline import rebuild

    db = tmp_path / "r.duckdb"
    r = _live(s3_url, "rb", range(10), 0.5)
    ingest(s3_url, db, emit=None)
    rebuild(s3_url, db, emit=None)  # from a fresh mirror of its own, removed after the swap
    assert not Path(f"{db}.rebuild-{os.getpid()}.bucket").exists()
    for s in range(10, 20):
        r.log({"train/loss": 1.0}, step=s)
    r.finish()
    ingest(s3_url, db, emit=None)  # the store's own mirror again: its cursors and the rebuilt offsets agree
    assert _steps(db, "rb") == list(range(20))


def test_a_writer_resumes_from_a_ledger_torn_by_a_kill(s3_url, tmp_path):
    _log(s3_url, "torn", range(5), finish=False)  # chunks up, ledger written; the process "dies" here
    spool = observatory.writer.log_path(s3_url, "torn", 0)
    ledger = spool.with_name(spool.name + ".chunks")
    ledger.write_text(ledger.read_text() + "7 12")  # a record cut short by the kill
    _log(s3_url, "torn", range(5, 10))
    db = tmp_path / "t.duckdb"
    ingest(s3_url, db, emit=None)
    assert _steps(db, "torn") == list(range(10))
    assert ledger.read_text().split("\n")[-2].split()[1] == str(spool.stat().st_size)  # all of it up


def _answers(db: Path) -> tuple:
    with store.connect(db) as con:
        return tuple(
            con.execute(q).fetchall()
            for q in (
                "SELECT run, status FROM runs ORDER BY run",
                "SELECT run, step, name, nullif(value, 'nan'::DOUBLE) FROM metrics ORDER BY run, step, name",
                "SELECT run, host, seq, kind, step FROM events WHERE host = 1000 ORDER BY run, seq",
            )
        )


def _machine(monkeypatch, tmp_path: Path, name: str, trusted: str = "") -> None:
    """What tells two observatories apart: their findings folder and key (as on two machines)."""
    monkeypatch.setenv("OBSERVATORY_FINDINGS_DIR", str(tmp_path / name / "findings"))
    monkeypatch.setenv("OBSERVATORY_KEY_FILE", str(tmp_path / name / "observatory.key"))
    if trusted:
        monkeypatch.setenv("OBSERVATORY_TRUSTED_KEYS", trusted)
    else:
        monkeypatch.delenv("OBSERVATORY_TRUSTED_KEYS", raising=False)


@pytest.mark.slow  # seconds each against the emulators
def test_two_machines_on_one_bucket_show_the_same_findings(bucket_url, tmp_path, monkeypatch):
    from observatory import findings, provenance

    _log(bucket_url, "calm", range(40))
    r = observatory.init(run_id="sick", runs_dir=bucket_url, chunk_s=0.1, heartbeat_s=0)
    for s in range(40):
        r.log({"train/loss": float("nan") if s == 30 else 3.0 - s / 100}, step=s)
    r.finish()
    _machine(monkeypatch, tmp_path, "a")
    a_key = provenance.public_key()
    ingest(bucket_url, tmp_path / "a.duckdb", emit=None)  # the first to ingest: the analyst
    a = _answers(tmp_path / "a.duckdb")
    assert [row[3] for row in a[2]].count("anomaly") >= 1, a[2]
    # another machine that trusts the analyst's key: a replica, reading the analyst's findings
    _machine(monkeypatch, tmp_path, "b", trusted=a_key)
    if bucket_url.startswith("gs://"):  # gcp-storage-emulator ignores ifGenerationMatch: say the role
        monkeypatch.setenv("OBSERVATORY_BUCKET_ANALYST", "no")
    said = []
    ingest(bucket_url, tmp_path / "b.duckdb", emit=said.append)
    assert bucket_url.startswith("gs://") or any("a replica" in m for m in said)
    assert _answers(tmp_path / "b.duckdb") == a
    assert not list((tmp_path / "b" / "findings").rglob(findings.NAME))  # the replica wrote none
    from observatory.interop.export import run_event_files

    mirror = bucket.mirror_of(bucket.location(bucket_url), tmp_path / "b.duckdb")
    assert any("/found/" in str(p) for _, p in run_event_files(mirror, "sick"))  # an export has them too
    # a note recorded on the replica goes to the bucket in its own seq range: both stores get it
    findings.write(bucket_url, "sick", "note", [({"text": "restart from step 20"}, 30)])
    ingest(bucket_url, tmp_path / "b.duckdb", emit=None)
    _machine(monkeypatch, tmp_path, "a", trusted=provenance.public_key())
    ingest(bucket_url, tmp_path / "a.duckdb", emit=None)
    a2, b2 = _answers(tmp_path / "a.duckdb"), _answers(tmp_path / "b.duckdb")
    assert a2 == b2 and len(a2[2]) == len(a[2]) + 1
    seqs = [row[2] for row in a2[2] if row[0] == "sick"]
    assert len(seqs) == len(set(seqs))  # no seq shared by the two observatories' findings
    keys = bucket.Bucket(bucket_url).list_after(f"{bucket.FINDINGS}/sick/")
    assert len({k.split("/")[2] for k in keys}) == 2  # one findings stream per observatory


@pytest.mark.slow  # seconds each against the emulators
def test_a_new_replica_catches_up_from_the_analysts_packs(bucket_url, tmp_path):
    for i in range(12):
        _log(bucket_url, f"p{i}", range(5))
    ingest(bucket_url, tmp_path / "a.duckdb", emit=None)
    analyst = BucketSource(bucket_url, tmp_path / "a.duckdb", margin_s=0)
    analyst.pull(lambda m: None)
    packed = []
    while n := analyst.pack(print, chunks=5):
        packed.append(n)
    assert packed and all(n == 5 for n in packed)
    b = bucket.Bucket(bucket_url)
    chunks = len(b.list_after(f"{bucket.JOURNAL}/"))
    b.put_new(f"{bucket.PACKS}/9999999999999-bad-0-0000000000", b"not a pack")  # read: said, journal then
    said = []
    replica = BucketSource(bucket_url, tmp_path / "b.duckdb", margin_s=0)
    replica.pull(said.append)
    assert any("cannot read this pack" in m for m in said)
    # one GET per pack, not per chunk: the chunks after the last pack and the LISTs besides
    assert replica.bucket.requests < chunks - 5 * len(packed) + len(packed) + 6
    ingest(bucket_url, tmp_path / "b.duckdb", emit=None)
    assert _answers(tmp_path / "b.duckdb")[:2] == _answers(tmp_path / "a.duckdb")[:2]
    assert len(_answers(tmp_path / "b.duckdb")[1]) == 12 * 5


def test_a_writer_whose_clock_is_an_hour_behind_is_still_read(s3_url, tmp_path):
    _log(s3_url, "on-time", range(3))
    db = tmp_path / "k.duckdb"
    ingest(s3_url, db, emit=None)  # the follower's place in the journal: now
    spool = tmp_path / "late" / "events.0.jsonl"
    spool.parent.mkdir()
    line = {
        "v": 1,
        "run": "late",
        "kind": "metrics",
        "t": time.time(),
        "host": 0,
        "data": {"train/loss": 1.0},
    }
    spool.write_text("".join(json.dumps({**line, "step": s, "seq": s}) + "\n" for s in range(4)))
    up = bucket.Uploader(bucket.Bucket(s3_url), spool, "late", 0, 0.1, 8.0, thread=False)
    up.clock = lambda: time.time() - 3600  # NTP never ran on this host
    assert up.roll()
    assert abs(up.bucket.skew_ms - 3600_000) < 5_000
    (entry,) = [k for k in bucket.Bucket(s3_url).list_after(f"{bucket.JOURNAL}/") if "-late-" in k]
    assert abs(int(entry.split("/")[1][:13]) - time.time() * 1000) < 10_000  # named by the store's clock
    ingest(s3_url, db, emit=None)
    assert _steps(db, "late") == [0, 1, 2, 3]


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_levanter_tracker_writes_to_a_bucket(s3_url, tmp_path):
    """Levanter's own tracker config and value types (tests/levanter_fixture.py's `calls`, in .venv-levanter),
    `runs_dir` a bucket URL; the script dies of an uncaught exception, so the last chunk goes up at exit."""
    from test_levanter import FIXTURE, PYTHON, ROOT

    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: build the Levanter venv with `make levanter-venv`")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "HF_HUB_OFFLINE": "1"}
    env.pop("XLA_FLAGS", None)
    cmd = [str(PYTHON), str(FIXTURE), str(tmp_path / "out"), "--model", "calls", "--runs-dir", s3_url]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "boom in the training loop" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "out" / "runs").exists()
    db = tmp_path / "lev.duckdb"
    ingest(s3_url, db, emit=None)
    with store.connect(db) as con:
        assert con.execute("SELECT status FROM runs WHERE run = 'levanter-calls'").fetchone()[0] == "failed"
        loss = con.execute(
            "SELECT value FROM metrics WHERE run = 'levanter-calls' AND name = 'train/loss' ORDER BY step"
        ).fetchall()
        assert [v for (v,) in loss] == [3.5, 3.0]


def test_a_pack_that_names_no_stream_is_refused():
    good = bucket.pack([("r1", 0, 0, b"a\n"), ("r1", "1000.00ab12", 3, b"b\n")])
    assert bucket.unpack(good) == [("r1", 0, 0, b"a\n"), ("r1", "1000.00ab12", 3, b"b\n")]
    for index in (
        [["r1", "1000.../../x", 0, 2]],  # a host that would be a path
        [["..", 0, 0, 2]],
        [["r1", 0, -1, 2]],
        [["r1", 0, 0, 99]],  # more bytes than the pack has
    ):
        with pytest.raises(ValueError):
            bucket.unpack(gzip.compress(json.dumps(index).encode() + b"\na\n"))
    with pytest.raises(ValueError, match="not gzip"):
        bucket.unpack(b"not a pack")


def test_a_pack_that_inflates_past_its_bound_is_refused():
    """A pack is gzip (event lines shrink ~5x); one that would inflate past what a reader holds is refused
    before it is held, so a hostile bucket writer cannot exhaust a replica's memory with a small object."""
    body = b"x" * 100_000
    small = bucket.pack([("r1", 0, 0, body)])
    assert len(small) < len(body) // 20
    assert bucket.unpack(small, most=200_000)[0][3] == body
    with pytest.raises(ValueError, match="over 50,000 bytes"):
        bucket.unpack(small, most=50_000)
    with pytest.raises(ValueError, match="cut short"):
        bucket.unpack(small[: len(small) // 2], most=200_000)


@pytest.mark.slow  # seconds against the emulators
def test_a_pack_stops_at_its_byte_bound(s3_url, tmp_path, monkeypatch):
    """A huge run's big chunks: the packer stops adding chunks once a pack holds `PACK_BYTES`, so its
    memory is bounded by bytes, not by the 1,000 chunks; the next pack starts where it stopped."""
    for i in range(10):
        _log(s3_url, f"big{i}", range(5))
    db = tmp_path / "a.duckdb"
    ingest(s3_url, db, emit=None)
    analyst = BucketSource(s3_url, db, margin_s=0)
    analyst.pull(lambda m: None)
    one = len(
        bucket.Bucket(s3_url).get_many([bucket.chunk_key("big0", 0, 0)])[bucket.chunk_key("big0", 0, 0)]
    )
    monkeypatch.setattr(bucket, "PACK_BYTES", 2 * one)  # two chunks' bytes a pack
    while analyst.pack(print, chunks=4):
        pass
    b = bucket.Bucket(s3_url)
    packs = [bucket.unpack(body) for body in b.get_many(b.list_after(f"{bucket.PACKS}/")).values()]
    assert len(packs) >= 2 and any(len(p) < 4 for p in packs), [len(p) for p in packs]
    for p in packs:  # each stopped at the chunk that took it to the bound
        assert sum(len(body) for *_, body in p[:-1]) < bucket.PACK_BYTES
    replica = tmp_path / "b.duckdb"
    ingest(s3_url, replica, emit=None)
    assert _answers(replica)[:2] == _answers(db)[:2]


@pytest.mark.slow  # seconds each against the emulators
def test_the_analysts_ingest_packs_and_a_replicas_does_not(s3_url, tmp_path, monkeypatch):
    from observatory.ingest import bucket_source

    monkeypatch.setattr(bucket_source, "PACK_CHUNKS", 3)
    monkeypatch.setenv("OBSERVATORY_JOURNAL_MARGIN_S", "0")
    for i in range(5):
        _log(s3_url, f"q{i}", range(2))
    b = bucket.Bucket(s3_url)
    _machine(monkeypatch, tmp_path, "b")
    ingest(s3_url, tmp_path / "first.duckdb", emit=None)  # the first: the analyst
    packs = b.list_after(f"{bucket.PACKS}/")
    assert packs
    _machine(monkeypatch, tmp_path, "c")
    ingest(s3_url, tmp_path / "second.duckdb", emit=None)  # a replica: it reads packs, makes none
    assert b.list_after(f"{bucket.PACKS}/") == packs
