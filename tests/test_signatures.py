"""Findings signed with Ed25519: anyone holding the lab's public key checks them (issue 55).

The private key (`key_file`) signs; any observatory verifies against its own public key and `trusted_keys`;
each signature names its key, so a rotated-out key's findings stay valid while it is trusted; the committed
samples are signed by the sample key, trusted by default, so ingesting `data/samples` rejects nothing.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import duckdb
import pytest
from conftest import event, write_lines

from observatory import provenance
from observatory.events import OBSERVATORY_HOST
from observatory.pipeline import ingest

SAMPLES = Path(__file__).resolve().parent.parent / "data" / "samples"


def _use_key(monkeypatch, path: Path, trusted: str | None = None) -> None:
    monkeypatch.setenv("OBSERVATORY_KEY_FILE", str(path))
    if trusted is not None:
        monkeypatch.setenv("OBSERVATORY_TRUSTED_KEYS", trusted)


def _anomaly(seq=0, **over):
    ev = event("r", "anomaly", {"detector": "nan_loss", "severity": "critical", "message": "m"}, seq, step=1)
    ev.pop("sig", None)
    return {**ev, **over}


def test_a_signature_checks_with_the_public_key_alone(tmp_path, monkeypatch):
    """Signed on one machine, checked on another that holds only the public half (HMAC could not: fails before)."""
    _use_key(monkeypatch, tmp_path / "lab" / "observatory.key")
    ev = provenance.signed(_anomaly())
    lab = provenance.public_key()
    assert ev["sig"].startswith(f"ed25519:{provenance.key_id(lab)}:")
    assert provenance.judge(ev, OBSERVATORY_HOST) is None
    # a mirror: its own key, the lab's public key trusted
    _use_key(monkeypatch, tmp_path / "mirror" / "observatory.key", trusted=lab)
    assert provenance.judge(ev, OBSERVATORY_HOST) is None
    # a mirror that does not trust the lab
    _use_key(monkeypatch, tmp_path / "other" / "observatory.key", trusted="")
    assert "not trusted" in provenance.judge(ev, OBSERVATORY_HOST)


@pytest.mark.parametrize(
    "change",
    [
        lambda ev: {**ev, "data": {**ev["data"], "severity": "info"}},
        lambda ev: {**ev, "step": 2},
        lambda ev: {**ev, "run": "s"},
        lambda ev: {**ev, "sig": ev["sig"][:-6] + "AAAA=="},
        lambda ev: {**ev, "sig": "ed25519:0123456789abcdef:" + ev["sig"].rsplit(":", 1)[1]},
        lambda ev: {**ev, "sig": "not a signature"},
        lambda ev: {**ev, "sig": "0" * 64},  # an HMAC shape made with another key
        lambda ev: {k: v for k, v in ev.items() if k != "sig"},
    ],
)
def test_an_altered_or_forged_finding_is_rejected(change):
    ev = provenance.signed(_anomaly())
    assert provenance.judge(change(ev), OBSERVATORY_HOST) is not None


def test_rotation_keeps_old_findings_valid(tmp_path, monkeypatch):
    """Key A signs; the lab rotates to key B and lists A's public half in trusted_keys: A's findings stay
    valid, B signs the new ones; dropping A from trusted_keys rejects A's (its key id says which)."""
    _use_key(monkeypatch, tmp_path / "a.key")
    old = provenance.signed(_anomaly(0))
    a = provenance.public_key()
    _use_key(monkeypatch, tmp_path / "b.key", trusted=f"{a} {provenance.SAMPLE_KEY}")
    new = provenance.signed(_anomaly(1))
    assert provenance.signer(old) == provenance.key_id(a) != provenance.signer(new)
    assert provenance.judge(old, OBSERVATORY_HOST) is None and provenance.judge(new, OBSERVATORY_HOST) is None
    monkeypatch.setenv("OBSERVATORY_TRUSTED_KEYS", provenance.SAMPLE_KEY)
    assert provenance.key_id(a) in provenance.judge(old, OBSERVATORY_HOST)


def test_an_older_hmac_finding_is_valid_only_where_its_key_file_is(tmp_path, monkeypatch):
    import hashlib
    import hmac

    _use_key(monkeypatch, tmp_path / "k.key")
    seed = bytes.fromhex(provenance.public_key() and (tmp_path / "k.key").read_text().strip())
    ev = _anomaly()
    ev["sig"] = hmac.new(seed, provenance.canonical(ev), hashlib.sha256).hexdigest()
    assert provenance.judge(ev, OBSERVATORY_HOST) is None
    _use_key(monkeypatch, tmp_path / "other.key")
    assert "HMAC" in provenance.judge(ev, OBSERVATORY_HOST)


def test_a_group_readable_key_file_warns(tmp_path, monkeypatch, capfd):
    """Fails before the fix: a key file anyone on the machine could read was used without a word."""
    k = tmp_path / "k.key"
    _use_key(monkeypatch, k)
    provenance.public_key()  # made 0600: no warning
    assert "warning" not in capfd.readouterr().err
    os.chmod(k, 0o644)
    provenance._seed_cached.cache_clear()  # read once a process: a new process reads it again
    provenance._private.cache_clear()
    provenance.public_key()
    err = capfd.readouterr().err
    assert f"key_file {k}" in err and "644" in err and "chmod 600" in err


def test_every_committed_sample_finding_verifies_with_the_default_trusted_keys(tmp_path, monkeypatch):
    """Fails before the fix: the samples were unsigned (16 rejected lines on a hand ingest)."""
    _use_key(monkeypatch, tmp_path / "fresh.key")  # any install: its own new key
    monkeypatch.delenv("OBSERVATORY_TRUSTED_KEYS", raising=False)
    n = 0
    for p in sorted(SAMPLES.glob("*/events.1000.jsonl.gz")):
        with gzip.open(p, "rb") as f:
            for raw in f:
                ev = json.loads(raw)
                if ev["kind"] in provenance.FINDING_KINDS:
                    assert provenance.judge(ev, OBSERVATORY_HOST) is None, (p, ev["seq"])
                    assert provenance.signer(ev) == provenance.key_id(provenance.SAMPLE_KEY)
                    n += 1
    assert n == 16


@pytest.mark.slow
def test_ingesting_the_samples_by_hand_rejects_nothing(tmp_path, monkeypatch):
    """`observatory ingest --runs-dir data/samples` into a new store: no rejected line, the forecasts kept,
    and the Ladder page's line says who signed each and that it came before its target's first step."""
    from observatory.dashboard.pages.ladder import registration_text
    from observatory.queries import ladder as ql

    _use_key(monkeypatch, tmp_path / "fresh.key")
    monkeypatch.delenv("OBSERVATORY_TRUSTED_KEYS", raising=False)
    db = tmp_path / "s.duckdb"
    rep = ingest(SAMPLES, db, emit=None, hooks=False)
    assert rep.rejected == 0
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM rejected_events").fetchone() == (0,)
        fcs = ql.forecast_events(con)
    assert sorted(f["run"] for f in fcs) == ["ladder-cpu-d72", "ladder-cpu-d72-s1"]
    kid = provenance.key_id(provenance.SAMPLE_KEY)
    for fc in fcs:
        text = registration_text(fc)
        assert (
            text.startswith(f"Signed by key {kid}, registered at ") and ", before the target's first" in text
        )


@pytest.mark.slow  # (several seconds: an ingest with its analyses, a page under AppTest)
def test_a_forecast_registered_after_its_target_started_says_so(runs_dir, db_path):
    from observatory.dashboard.pages.ladder import registration_text
    from observatory.queries import ladder as ql

    write_lines(runs_dir / "r" / "events.0.jsonl", [event("r", "run_start", {"config": {}}, 0, t=1000.0)])
    fc = event(
        "r",
        "forecast",
        {"metric": "eval/loss", "value": 1.0, "low": 0.9, "high": 1.1},
        0,
        t=2000.0,
        host=OBSERVATORY_HOST,
    )
    write_lines(runs_dir / "r" / f"events.{OBSERVATORY_HOST}.jsonl", [fc])
    ingest(runs_dir, db_path, emit=None, hooks=False)
    with duckdb.connect(str(db_path), read_only=True) as con:
        (got,) = ql.forecast_events(con, "r")
    assert "NOT before the target's first step" in registration_text(got)
    assert got["signed_by"] == provenance.key_id(provenance.public_key())


def test_the_lab_publishes_its_public_keys_without_making_a_key(tmp_path, monkeypatch):
    """The dashboard's About and `export` show this observatory's public key and the trusted ones."""
    k = tmp_path / "k.key"
    _use_key(monkeypatch, k)
    text = provenance.published()
    assert not k.exists() and provenance.SAMPLE_KEY in text
    own = provenance.public_key()
    text = provenance.published()
    assert f"`{provenance.key_id(own)}`: `{own}`" in text and provenance.SAMPLE_KEY in text
    assert (tmp_path / "k.key").read_text().strip() not in text  # the private half never


def test_a_key_file_inside_the_runs_dir_warns(tmp_path, monkeypatch, capfd):
    """The private key must sit where no log writer reaches it: a key file under the runs dir is said."""
    from observatory import findings

    runs = tmp_path / "runs"
    (runs / "r").mkdir(parents=True)
    _use_key(monkeypatch, tmp_path / "elsewhere.key")
    findings.write(runs, "r", "note", [({"text": "x"}, None)])
    assert "inside the runs dir" not in capfd.readouterr().err
    _use_key(monkeypatch, runs / "keys" / "observatory.key")
    findings.write(runs, "r", "note", [({"text": "y"}, None)])
    assert "is inside the runs dir" in capfd.readouterr().err
