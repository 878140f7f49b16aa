"""Byte-level corpus: default stdlib corpus, text/JSONL directories, determinism, held-out split."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from trainer.data import DOC_SEP, bits_per_byte, load_corpus, stdlib_dir


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    # a private cache, built once for the module (the stdlib corpus takes a second to read)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRAINER_DATA_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def test_default_corpus_is_this_pythons_stdlib():
    c = load_corpus(None)
    assert c.root == str(stdlib_dir()) and c.name.startswith("python3.")
    assert c.files > 500 and c.tokens > 5_000_000 and c.heldout.size > 10_000
    assert b"def " in bytes(c.train[:200_000])
    h = c.unigram_entropy()
    assert 2.5 < h < math.log(256)  # source code: far from uniform bytes
    again = load_corpus(None)  # second load: memory-mapped cache, same fingerprint
    assert again.fingerprint == c.fingerprint and np.array_equal(again.train[:1000], c.train[:1000])


def test_batches_are_a_function_of_seed_and_step():
    c = load_corpus(None)
    a = c.batch(7, 8, 32, seed=0)
    assert a.shape == (8, 33) and a.dtype == np.int32 and a.min() >= 0 and a.max() < 256
    assert np.array_equal(a, c.batch(7, 8, 32, seed=0))
    assert not np.array_equal(a, c.batch(8, 8, 32, seed=0))
    assert not np.array_equal(a, c.batch(7, 8, 32, seed=1))
    # a process's rows are its slice of the same global batch
    halves = [c.batch(7, 8, 32, seed=0, process_index=i, process_count=2) for i in range(2)]
    assert np.array_equal(np.concatenate(halves), a)
    ev = c.eval_batches(2, 8, 32)
    assert len(ev) == 2 and ev[0].shape == (8, 33)
    assert all(np.array_equal(x, y) for x, y in zip(ev, c.eval_batches(2, 8, 32), strict=True))


def test_text_and_jsonl_directory(tmp_path):
    d = tmp_path / "corpus"
    (d / "sub").mkdir(parents=True)
    for i in range(40):
        (d / "sub" / f"doc{i:02d}.txt").write_text(f"document number {i} " * 200)
    with open(d / "extra.jsonl", "w") as f:
        for i in range(50):
            f.write(json.dumps({"text": f"json line {i} " * 20, "id": i}) + "\n")
    (d / "blob.bin").write_bytes(b"\x00\x01binary" * 100)  # binary: not text, skipped
    c = load_corpus(str(d), eval_fraction=0.1)
    assert c.name == "corpus" and c.files == 42
    both = bytes(c.train) + bytes(c.heldout)
    assert b"document number 7 " in both and b"json line 3 " in both and b"binary" not in both
    assert b'"text"' not in both  # JSONL contributes its text field, not the JSON
    assert c.heldout.size > 0 and both.count(bytes([DOC_SEP])) == 40 + 50
    # held-out documents never appear in the train stream
    held_docs = [x for x in bytes(c.heldout).split(bytes([DOC_SEP])) if x]
    assert held_docs and all(doc not in bytes(c.train) for doc in held_docs)
    fp = c.fingerprint
    (d / "sub" / "doc00.txt").write_text("changed")
    assert load_corpus(str(d), eval_fraction=0.1).fingerprint != fp


def test_bad_input_names_file_and_line(tmp_path):
    d = tmp_path / "c"
    d.mkdir()
    (d / "a.jsonl").write_text('{"text": "fine"}\n{"body": "no text field"}\n')
    with pytest.raises(ValueError, match=r"a.jsonl:2: field 'text' is missing"):
        load_corpus(str(d))
    (d / "a.jsonl").write_text('{"text": "fine"}\n{not json\n')
    with pytest.raises(ValueError, match=r"a.jsonl:2: not valid JSON"):
        load_corpus(str(d))
    with pytest.raises(ValueError, match="is not a directory"):
        load_corpus(str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no text or JSONL files"):
        load_corpus(str(tmp_path / "empty"))


def test_single_small_file_still_gets_a_heldout_tail(tmp_path):
    d = tmp_path / "one"
    d.mkdir()
    (d / "only.txt").write_text("abcdefgh" * 5000)
    c = load_corpus(str(d), eval_fraction=0.05)
    assert c.heldout.size == pytest.approx(0.05 * 40001, abs=2) and c.train.size > 0
    with pytest.raises(ValueError, match="fewer than seq_len"):
        c.batch(0, 2, 10**6, seed=0)


def test_unigram_entropy_and_bpb():
    d = load_corpus(None)
    counts = np.bincount(d.train, minlength=256)
    p = counts[counts > 0] / counts.sum()
    assert d.unigram_entropy() == pytest.approx(-(p * np.log(p)).sum())
    assert bits_per_byte(math.log(2)) == pytest.approx(1.0)
