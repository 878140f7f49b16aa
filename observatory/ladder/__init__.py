"""Ladder: forecast a big run's loss curve from a ladder of small runs, and watch it.

- `rungs`: the data (rungs and their seeds, forecast curves, the fit's version stamp).
- `powerlaw`: the law L(C) = E + A C^-alpha and its robust fit.
- `fit`: the ladder fit at every schedule fraction, with its band (`fit_ladder`).
- `backtest`: the largest rung forecast from the others and scored.
- `watch`: the store side: load a ladder, pre-register a target's forecast, check the
  target against its band (ingest's `after_ingest` hook). It loads without scipy.
"""
