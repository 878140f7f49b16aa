"""Detect: instability detectors over a run's metrics, and their scan of the store.

- `thresholds`: `Thresholds`, the detectors' knobs (defaults: the `anomaly_*` settings).
- `detectors`: pure functions over numpy series -> `Finding`s; no store, no files.
- `scan`: the detectors over one run's frames and over the store, incrementally;
  new findings written as `anomaly` events (ingest's `after_ingest` hook, `observatory detect`).
"""
