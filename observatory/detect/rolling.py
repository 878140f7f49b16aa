"""Rolling quantiles in numpy, for the detectors' trailing windows (`observatory.detect.detectors`).

The same numbers as polars' `rolling_quantile` / `rolling_median` / `rolling_min` over
nulls, bit for bit, without loading polars on ingest's path (start-up time of
`observatory ingest`, whose hooks run the detectors).
"""

from __future__ import annotations

import numpy as np

__all__ = ["rolling", "shift", "ROLLING_BLOCK"]

ROLLING_BLOCK = 8192  # rows of sorted windows made at once in `_rolling` (bounds its memory: block x window)


def rolling(x: np.ndarray, window: int, min_samples: int, qs: tuple[float, ...]) -> list[np.ndarray]:
    """Rolling quantiles over the last `window` rows (this one included) of the non-NaN values; NaN where fewer
    than `min_samples` are there. Linear interpolation, as polars' `rolling_quantile` (and so
    `rolling_median`, `rolling_min` at q 0): equal to it bit for bit (tests/test_anomalies.py checks).

    Each row's window is sorted whole (NaN last), so a block of rows costs one vectorised sort; at the
    windows the detectors use (<= a few hundred rows) that is faster than polars' and needs no polars
    on ingest's path.
    """
    x = np.asarray(x, dtype=float)
    n = len(x)
    out = [np.full(n, np.nan) for _ in qs]
    if n == 0:
        return out
    padded = np.concatenate([np.full(window - 1, np.nan), x])
    views = np.lib.stride_tricks.sliding_window_view(padded, window)
    for lo in range(0, n, ROLLING_BLOCK):
        w = np.sort(views[lo : lo + ROLLING_BLOCK], axis=1)
        k = window - np.isnan(w).sum(1)
        ok = k >= max(min_samples, 1)
        last = np.maximum(k, 1) - 1
        rows = np.arange(len(w))
        for o, q in zip(out, qs, strict=True):
            idx = q * last
            i0 = np.floor(idx).astype(np.int64)
            a, b = w[rows, i0], w[rows, np.minimum(i0 + 1, last)]
            frac = idx - i0
            with np.errstate(invalid="ignore"):
                v = np.where(frac == 0, a, a + (b - a) * frac)
            o[lo : lo + len(w)] = np.where(ok, v, np.nan)
    return out


def shift(x: np.ndarray, k: int) -> np.ndarray:
    """x moved down k rows, NaN in front."""
    return np.concatenate([np.full(min(k, len(x)), np.nan), x[: max(len(x) - k, 0)]])
