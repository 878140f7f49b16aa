"""Safe on the public internet: what a hostile visitor gets out of the dashboard's server.

Sections (each prints its own figures; `--only NAME` runs one):

- `sql`: the hostile SQL corpus of tests/sql_corpus.py through the user-SQL door, under
  a 1000 ms / 256 MB limit. Prints the refused / harmless / harmful counts, every harmful
  statement with its reasons, and the worst time and peak memory of any statement as a
  ratio to its limit (goal: 0 harmful, both ratios at most 1.5).

- `load`: `bench/bench_load.py` (20 viewers on Live, Experts and SQL for 2 minutes while a
  run trains: time to first chart against one viewer, errors, busy, staleness, RSS).
- `faults`: `bench/bench_public_faults.py` (the fault matrix: each scenario, recovered or
  not, events lost).

    python bench/bench_public.py [--only sql|load|faults] [--verbose]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from dashboard_fixtures import make_store  # noqa: E402  (after the sys.path lines)
from sql_corpus import CORPUS, MEMORY_LIMIT_MB, TIME_LIMIT_MS, Probe, limits_env  # noqa: E402


def section_sql(verbose: bool) -> bool:
    """The SQL corpus; True when nothing was harmful and every statement stayed within 1.5x its limits."""
    os.environ.update(limits_env())
    with tempfile.TemporaryDirectory() as tmp:
        _, db = make_store(Path(tmp))
        probe = Probe(db)
        try:
            verdicts = [probe.judge(case) for case in CORPUS]
        finally:
            probe.close()
    counts = {k: sum(v.outcome == k for v in verdicts) for k in ("refused", "harmless", "harmful")}
    print(f"SQL corpus: {len(verdicts)} statements (limits {TIME_LIMIT_MS} ms, {MEMORY_LIMIT_MB} MB)")
    print(f"  refused {counts['refused']}, harmless {counts['harmless']}, harmful {counts['harmful']}")
    for v in verdicts:
        if v.outcome == "harmful":
            print(f"  HARMFUL {v.case.label}: {'; '.join(v.reasons)}")
        elif not v.expected:
            print(f"  unexpected {v.outcome}: {v.case.label}: {v.message[:120]}")
        elif verbose:
            print(
                f"  {v.outcome:8s} {v.case.label:26s} {v.elapsed_ms:7.0f} ms {v.peak_memory_mb:7.1f} MB  {v.message[:90]!r}"
            )
    slowest = max(verdicts, key=lambda v: v.elapsed_ms)
    biggest = max(verdicts, key=lambda v: v.peak_memory_mb)
    t_ratio = slowest.elapsed_ms / TIME_LIMIT_MS
    m_ratio = biggest.peak_memory_mb / MEMORY_LIMIT_MB
    print(f"  worst time:   {slowest.elapsed_ms:.0f} ms = {t_ratio:.2f}x the limit ({slowest.case.label})")
    print(
        f"  worst memory: {biggest.peak_memory_mb:.0f} MB = {m_ratio:.2f}x the limit ({biggest.case.label})"
    )
    return counts["harmful"] == 0 and t_ratio <= 1.5 and m_ratio <= 1.5


def _script(name: str) -> bool:
    """Another bench script of this folder, in a process of its own; True when it met its goals."""
    return subprocess.run([sys.executable, str(ROOT / "bench" / name)]).returncode == 0


def section_load(verbose: bool) -> bool:
    return _script("bench_load.py")


def section_faults(verbose: bool) -> bool:
    return _script("bench_public_faults.py")


SECTIONS = {"sql": section_sql, "load": section_load, "faults": section_faults}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(SECTIONS), help="run one section")
    ap.add_argument("--verbose", action="store_true", help="print every statement's verdict")
    args = ap.parse_args()
    ok = True
    for name, section in SECTIONS.items():
        if args.only in (None, name):
            ok = section(args.verbose) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
