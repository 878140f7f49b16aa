"""Byte-level training data: a corpus of text files as one uint8 token stream.

Tokens are bytes (vocab 256). The default corpus is the Python standard library's
`*.py` sources of the running interpreter (real text, no download); `data.path=DIR`
takes any directory of text files and JSONL files (one document per line, in a
`"text"` field).

Documents are split into train and held-out by a hash of their relative path (so
the held-out set does not move when the seed changes), joined with a 0 byte as the
document separator, cached once as a flat `.u8` file and memory-mapped after.

Batches are a pure function of `(seed, step)`: `Corpus.batch(step, ...)` draws
`B` random windows of `T + 1` bytes with `np.random.default_rng([seed, step])`.
A resumed, forked or rolled-back run therefore sees exactly the batches the
original would have seen, and no data-loader state goes in checkpoints.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["Corpus", "load_corpus", "list_files", "fingerprint", "stdlib_dir", "DOC_SEP"]

DOC_SEP = 0  # byte between documents; source text never contains NUL
_TEXT_SUFFIXES_SKIP = {".pyc", ".so", ".o", ".a", ".png", ".jpg", ".gif", ".gz", ".zip", ".npy", ".u8"}


def stdlib_dir() -> Path:
    """The running interpreter's standard library (the default corpus)."""
    return Path(sysconfig.get_paths()["stdlib"])


def list_files(root: Path, *, default: bool) -> list[Path]:
    """Files of a corpus, sorted by relative path. `default`: stdlib `*.py`, no site-packages."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        # sorted walk: the file list (and so the fingerprint) does not depend on the filesystem order
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and d not in ("site-packages", "__pycache__")
        )
        for f in sorted(filenames):
            if f.startswith("."):
                continue
            p = Path(dirpath) / f
            if default and p.suffix != ".py":
                continue
            if not default and p.suffix.lower() in _TEXT_SUFFIXES_SKIP:
                continue
            if p.is_file():
                out.append(p)
    return sorted(out, key=lambda p: p.relative_to(root).as_posix())


def fingerprint(root: Path, files: list[Path]) -> str:
    """sha256 over (relative path, size) of every file: changes when the corpus does."""
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.relative_to(root).as_posix()}\t{p.stat().st_size}\n".encode())
    return h.hexdigest()[:16]


def _read_docs(path: Path) -> list[bytes]:
    """One file's documents: the whole file, or one per JSONL line's `text` field."""
    raw = path.read_bytes()
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        if b"\x00" in raw[:8192]:
            return []  # a binary file in a text directory: not text, not a token stream
        return [raw]
    docs = []
    for lineno, line in enumerate(raw.split(b"\n"), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{lineno}: not valid JSON ({e.msg}); each line must be an object"
            ) from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise ValueError(f"{path}:{lineno}: field 'text' is missing or not a string")
        docs.append(obj["text"].encode("utf-8"))
    return docs


def _is_heldout(rel: str, fraction: float) -> bool:
    # sha1 of the path, not Python's salted hash(): the split is the same in every process
    u = int.from_bytes(hashlib.sha1(rel.encode()).digest()[:8], "big") / 2.0**64
    return u < fraction


def _cache_dir() -> Path:
    base = os.environ.get("TRAINER_DATA_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "observatory-trainer"
    )
    return Path(base)


def _build(root: Path, files: list[Path], eval_fraction: float, out_train: Path, out_eval: Path) -> None:
    train, heldout = [], []
    for p in files:
        rel = p.relative_to(root).as_posix()
        dest = heldout if _is_heldout(rel, eval_fraction) else train
        for doc in _read_docs(p):
            dest.append(doc)
            dest.append(bytes([DOC_SEP]))
    tr, ev = b"".join(train), b"".join(heldout)
    # Too few files to hold some out (a one-file corpus): hold out the stream's tail instead.
    if len(ev) < 4096 or len(tr) < 4096:
        both = tr + ev
        cut = int(len(both) * (1 - eval_fraction))
        tr, ev = both[:cut], both[cut:]
    for path, blob in ((out_train, tr), (out_eval, ev)):
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        tmp.write_bytes(blob)
        os.replace(tmp, path)  # atomic: concurrent processes building the same cache never see half a file


@dataclass
class Corpus:
    """A tokenized corpus: train and held-out streams of bytes (memory-mapped)."""

    name: str
    root: str
    fingerprint: str
    files: int
    train: np.ndarray  # uint8 [N_train]
    heldout: np.ndarray  # uint8 [N_eval]

    @property
    def tokens(self) -> int:
        return int(self.train.size)

    def unigram_entropy(self) -> float:
        """Entropy of the train stream's byte distribution, nats per byte: the loss of the best
        model that ignores context. A model that learned anything beats it."""
        counts = np.bincount(self.train, minlength=256).astype(np.float64)
        p = counts[counts > 0] / counts.sum()
        return float(-(p * np.log(p)).sum())

    def batch(
        self,
        step: int,
        batch_size: int,
        seq_len: int,
        seed: int,
        *,
        process_index: int = 0,
        process_count: int = 1,
    ) -> np.ndarray:
        """This process's rows of the global batch for `step`: int32 [batch_size / process_count, T + 1]."""
        n = self.train.size - (seq_len + 1)
        if n <= 0:
            raise ValueError(
                f"data: corpus {self.name!r} has {self.train.size} train bytes, fewer than seq_len + 1 = {seq_len + 1}"
            )
        rng = np.random.default_rng([seed, step])
        starts = rng.integers(0, n, size=batch_size)  # (B,) all processes draw the same global batch
        per = batch_size // process_count
        starts = starts[process_index * per : (process_index + 1) * per]
        idx = starts[:, None] + np.arange(seq_len + 1)[None, :]  # (B_local, T + 1)
        return self.train[idx].astype(np.int32)

    def eval_batches(
        self, n_batches: int, batch_size: int, seq_len: int, *, process_index: int = 0, process_count: int = 1
    ) -> list[np.ndarray]:
        """Fixed held-out windows, evenly spaced over the held-out stream: int32 [B_local, T + 1] each."""
        src = self.heldout if self.heldout.size > seq_len + 1 else self.train
        span = src.size - (seq_len + 1)
        total = n_batches * batch_size
        starts = (np.arange(total, dtype=np.int64) * max(span // max(total, 1), 1)) % max(span, 1)
        per = batch_size // process_count
        out = []
        for b in range(n_batches):
            s = starts[b * batch_size : (b + 1) * batch_size][process_index * per : (process_index + 1) * per]
            out.append(src[s[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int32))
        return out


def load_corpus(path: str | None = None, *, eval_fraction: float = 0.01, name: str | None = None) -> Corpus:
    """Load (building the cache on first use) the corpus at `path`, or the stdlib when None."""
    default = path is None
    root = stdlib_dir() if default else Path(path).expanduser().resolve()
    if not root.is_dir():
        raise ValueError(f"data.path: {root} is not a directory")
    files = list_files(root, default=default)
    if not files:
        raise ValueError(f"data.path: no text or JSONL files under {root}")
    fp = fingerprint(root, files)
    key = f"{fp}-{int(round(eval_fraction * 1e6))}"
    cache = _cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    tr_path, ev_path = cache / f"{key}.train.u8", cache / f"{key}.eval.u8"
    if not (tr_path.exists() and ev_path.exists()):
        _build(root, files, eval_fraction, tr_path, ev_path)
    train = np.memmap(tr_path, dtype=np.uint8, mode="r") if tr_path.stat().st_size else np.zeros(0, np.uint8)
    heldout = (
        np.memmap(ev_path, dtype=np.uint8, mode="r") if ev_path.stat().st_size else np.zeros(0, np.uint8)
    )
    if name is None:
        name = f"python{sysconfig.get_python_version()}-stdlib" if default else root.name
    return Corpus(name=name, root=str(root), fingerprint=fp, files=len(files), train=train, heldout=heldout)


def bits_per_byte(loss_nats: float) -> float:
    """Byte-level tokens: a token is a byte, so bits per byte is the loss in bits."""
    return loss_nats / math.log(2)
