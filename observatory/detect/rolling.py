"""Rolling quantiles in numpy, for the detectors' trailing windows (`observatory.detect.detectors`).

The same numbers as polars' `rolling_quantile` / `rolling_median` / `rolling_min` over
nulls, bit for bit, without loading polars on ingest's path (start-up time of
`observatory ingest`, whose hooks run the detectors).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

__all__ = ["rolling", "shift", "trailing", "level_noise", "ROLLING_BLOCK"]

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
    # a series shorter than the window: each row's window holds every row up to it either way, so sort
    # rows of n, not of `window` mostly NaN (a sweep's 30-step run against a 128-step window)
    window = min(window, n)
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


def trailing(x: np.ndarray, window: int, min_history: int) -> tuple[np.ndarray, np.ndarray]:
    """Median and robust sigma (IQR / 1.349) of the previous `window` finite values; NaN before min_history."""
    prev = shift(np.where(np.isfinite(x), x, np.nan), 1)
    med, q25, q75 = rolling(prev, window, min_history, (0.5, 0.25, 0.75))
    return med, (q75 - q25) / 1.349


_LEVEL_NOISE: dict[
    tuple, tuple[np.ndarray, np.ndarray]
] = {}  # the last few `level_noise` results (read-only)


def level_noise(x: np.ndarray, window: int, min_history: int) -> tuple[np.ndarray, np.ndarray]:
    """`_level_noise_of`, kept for the next call on the same values: the loss's spike and dip detectors
    both ask for it, and its rolling quantiles are most of a scan's time (~0.05 s per 20k steps)."""
    x = np.ascontiguousarray(x, dtype=float)
    key = (hashlib.blake2b(x.view(np.uint8), digest_size=16).digest(), len(x), window, min_history)
    got = _LEVEL_NOISE.get(key)
    if got is None:
        if len(_LEVEL_NOISE) >= 8:
            _LEVEL_NOISE.clear()
        got = _LEVEL_NOISE[key] = _level_noise_of(x, window, min_history)
        for a in got:
            a.flags.writeable = False
    return got


def _level_noise_of(x: np.ndarray, window: int, min_history: int) -> tuple[np.ndarray, np.ndarray]:
    """Recent level and noise, both from previous values only; NaN before `min_history`.

    level: median of the previous `min_history` finite values (follows a trend
    closely); noise: robust sigma of step-to-step differences over the previous
    `window` (IQR / 1.349 / sqrt 2), which a falling loss does not inflate the way
    the spread of the values themselves would.
    """
    prev = shift(np.where(np.isfinite(x), x, np.nan), 1)
    # half the window may be missing (a skipped NaN step, sparse logging) without blinding it
    (level,) = rolling(prev, min_history, max(1, min_history // 2), (0.5,))
    d = prev - shift(prev, 1)  # NaN next to a missing value
    q25, q75 = rolling(d, window, min_history, (0.25, 0.75))
    return level, (q75 - q25) / (1.349 * math.sqrt(2))
