"""Rolling quantiles in numpy, for the detectors' trailing windows (`observatory.detect.detectors`).

The same numbers as polars' `rolling_quantile` / `rolling_median` / `rolling_min` over
nulls, bit for bit, without loading polars on ingest's path (start-up time of
`observatory ingest`, whose hooks run the detectors).
"""

from __future__ import annotations

import hashlib
import math

import numpy as np

__all__ = ["rolling", "shift", "trailing", "level_noise", "segment_of", "ROLLING_BLOCK"]

ROLLING_BLOCK = 8192  # rows of sorted windows made at once in `_rolling` (bounds its memory: block x window)


def segment_of(n: int, starts: np.ndarray | None) -> np.ndarray | None:
    """(n,) the first row of each row's segment, for rows that are several series one after another
    (`starts`: where each begins, ascending, the first 0); None for one series."""
    if starts is None:
        return None
    starts = np.asarray(starts, np.int64)
    return np.repeat(starts, np.diff(np.append(starts, n)))


def rolling(
    x: np.ndarray, window: int, min_samples: int, qs: tuple[float, ...], starts: np.ndarray | None = None
) -> list[np.ndarray]:
    """Rolling quantiles over the last `window` rows (this one included) of the non-NaN values; NaN where fewer
    than `min_samples` are there. Linear interpolation, as polars' `rolling_quantile` (and so
    `rolling_median`, `rolling_min` at q 0): equal to it bit for bit (tests/test_anomalies.py checks).

    Each row's window is sorted whole (NaN last), so a block of rows costs one vectorised sort; at the
    windows the detectors use (<= a few hundred rows) that is faster than polars' and needs no polars
    on ingest's path.

    starts: `x` is several series one after another, each beginning at these rows; a window never reaches
    into the series before its own, so each series' rows are what it gives alone, bit for bit (many small
    runs at once: `observatory.detect.screen`).
    """
    x = np.asarray(x, dtype=float)
    n = len(x)
    out = [np.full(n, np.nan) for _ in qs]
    if n == 0:
        return out
    seg = segment_of(n, starts)
    # a series shorter than the window: each row's window holds every row up to it either way, so sort
    # rows of n, not of `window` mostly NaN (a sweep's 30-step run against a 128-step window)
    longest = n if seg is None else int(np.diff(np.append(np.asarray(starts), n)).max())
    window = min(window, longest)
    padded = np.concatenate([np.full(window - 1, np.nan), x])
    views = np.lib.stride_tricks.sliding_window_view(padded, window)
    for lo in range(0, n, ROLLING_BLOCK):
        w = views[lo : lo + ROLLING_BLOCK]
        if seg is not None:  # the cells before a row's own series are not its window: NaN
            first = np.arange(lo, lo + len(w)) - (window - 1)  # the row each window's first cell holds
            w = np.where(first[:, None] + np.arange(window) >= seg[lo : lo + len(w), None], w, np.nan)
        w = np.sort(w, axis=1)
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


def shift(x: np.ndarray, k: int, starts: np.ndarray | None = None) -> np.ndarray:
    """x moved down k rows, NaN in front (of each series: `starts` as in `rolling`)."""
    if starts is None:
        return np.concatenate([np.full(min(k, len(x)), np.nan), x[: max(len(x) - k, 0)]])
    src = np.arange(len(x)) - k
    ok = src >= segment_of(len(x), starts)
    out = np.full(len(x), np.nan)
    out[ok] = np.asarray(x, dtype=float)[src[ok]]
    return out


def trailing(
    x: np.ndarray, window: int, min_history: int, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Median and robust sigma (IQR / 1.349) of the previous `window` finite values; NaN before min_history."""
    prev = shift(np.where(np.isfinite(x), x, np.nan), 1, starts)
    med, q25, q75 = rolling(prev, window, min_history, (0.5, 0.25, 0.75), starts)
    return med, (q75 - q25) / 1.349


def level_noise(
    x: np.ndarray,
    window: int,
    min_history: int,
    starts: np.ndarray | None = None,
    memo: dict | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """`_level_noise_of`, kept in the caller's `memo` (a dict it owns for one scan or one screen) for the
    next call on the same values: the loss's spike and dip detectors both ask for it, and its rolling
    quantiles are most of a scan's time. Several series one after another (`starts`, as in `rolling`) are
    kept by their values and starts. `memo` None: computed, not kept."""
    if memo is None:
        return _level_noise_of(np.asarray(x, dtype=float), window, min_history, starts)
    x = np.ascontiguousarray(x, dtype=float)
    digest = hashlib.blake2b(x.view(np.uint8), digest_size=16)
    if starts is not None:
        digest.update(np.ascontiguousarray(starts, dtype=np.int64).view(np.uint8))
    key = (digest.digest(), len(x), window, min_history, starts is None)
    got = memo.get(key)
    if got is None:
        got = memo[key] = _level_noise_of(x, window, min_history, starts)
        for a in got:
            a.flags.writeable = False
    return got


def _level_noise_of(
    x: np.ndarray, window: int, min_history: int, starts: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Recent level and noise, both from previous values only; NaN before `min_history`.

    level: median of the previous `min_history` finite values (follows a trend
    closely); noise: robust sigma of step-to-step differences over the previous
    `window` (IQR / 1.349 / sqrt 2), which a falling loss does not inflate the way
    the spread of the values themselves would.
    """
    prev = shift(np.where(np.isfinite(x), x, np.nan), 1, starts)
    # half the window may be missing (a skipped NaN step, sparse logging) without blinding it
    (level,) = rolling(prev, min_history, max(1, min_history // 2), (0.5,), starts)
    d = prev - shift(prev, 1, starts)  # NaN next to a missing value
    q25, q75 = rolling(d, window, min_history, (0.25, 0.75), starts)
    return level, (q75 - q25) / (1.349 * math.sqrt(2))
