"""The finest metrics rollups of a catch-up transaction, from its new rows as numpy arrays.

`rollups.after_ingest` recomputes `metrics_r8` and `metric_series` from the store with a
GROUP BY (run, name, step // 8). Over a catch-up's ~10^6 new rows that costs DuckDB ~0.3 s
here: not the scan but the ~10^5 groups of its hash table, as long as the whole append of
the same rows from Arrow. The ingester has those rows as arrays already (`msgspec_lines`
builds them; `_check_line`'s rows are Python lists), so `MetricRows` keeps them for the
transaction and `roll_up` makes the same cells with `np.bincount` and `ufunc.at` over a dense
(bucket, name) grid, then merges them with the cells the store has for the buckets the new
rows reach into (the one a run's tail shares with its new steps, or more after a rollback),
as DuckDB's own recomputation would count those rows again.

Used only when it provably covers every new row: `rollups.after_ingest` compares each run's
count of rows past the watermark with the rows given here, and anything else (rows from the
SQL path, a renamed secret-shaped name, a NULL step or value, a sparse grid) takes the SQL
path. The cells equal DuckDB's: min, max, counts and steps exactly; `last` is the value at the
last step, the first such row in insertion order on a tie (DuckDB's `arg_max` in a sequential
scan); float sums may differ in the last bits (their order differs, as between two DuckDB runs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

__all__ = ["MetricRows", "roll_up"]

RES = 8  # the finest metrics rollup's bucket (`schema.METRIC_RESOLUTIONS[0]`; checked by rollups)
GRID_SLACK = 4  # a dense (bucket, name) grid of more cells than this many per row (plus 4096): SQL path


class MetricRows:
    """The `metrics` rows one write transaction added, per run, as the arrays the ingester built."""

    def __init__(self) -> None:
        # run -> parts of (names, codes (N,) into them, steps (N,), values (N,), the latest t of each name (K,))
        self.parts: dict[str, list[tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.counts: dict[str, int] = {}
        self.usable = True  # False: some rows came another way (or were renamed): the SQL path

    def add(self, run: str, names: list[str], codes: np.ndarray, steps: np.ndarray, values: np.ndarray,
            ts: np.ndarray) -> None:  # fmt: skip
        """Rows (N,) of one run: `codes` index `names`; steps int, values and ts float."""
        if not self.usable or not len(codes):
            return
        latest = np.full(len(names), -np.inf)
        np.maximum.at(latest, codes, ts)  # all `metric_series` needs of t: not a float per row kept
        self.parts.setdefault(run, []).append((names, codes, steps, values, latest))
        self.counts[run] = self.counts.get(run, 0) + len(codes)

    def add_lists(self, runs: list, steps: list, names: list, values: list, ts: list) -> None:
        """Rows as the Python lists `sql_lines._check_line` stages (`_Batch.metrics`), in order."""
        if not self.usable or not runs:
            return
        if any(s is None for s in steps) or any(v is None for v in values):
            self.usable = False  # NULL steps and values: rare; DuckDB's own rules for them apply
            return
        by_run: dict[str, list[int]] = {}
        for i, r in enumerate(runs):
            by_run.setdefault(r, []).append(i)
        for run, rows in by_run.items():
            index: dict[str, int] = {}
            codes = np.fromiter((index.setdefault(names[i], len(index)) for i in rows), np.int64, len(rows))
            self.add(run, list(index), codes, np.array([steps[i] for i in rows], np.int64),
                     np.array([values[i] for i in rows], np.float64), np.array([ts[i] for i in rows], np.float64))  # fmt: skip

    def forget(self) -> None:
        """Rows came another way (the SQL path's bulk insert, a renamed name): the SQL path decides."""
        self.usable, self.parts, self.counts = False, {}, {}


def _concat(parts) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One run's parts as (names, codes into them, steps, values, each name's latest t), in insertion order."""
    index: dict[str, int] = {}
    codes, remaps = [], []
    for names, c, *_ in parts:
        remap = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64, len(names))
        codes.append(remap[np.asarray(c, np.int64)])
        remaps.append(remap)
    latest = np.full(len(index), -np.inf)
    for remap, part in zip(remaps, parts, strict=True):
        np.maximum.at(latest, remap, part[4])
    steps, values = (np.concatenate([np.asarray(p[k], dt) for p in parts]) for k, dt in ((2, np.int64), (3, np.float64)))
    return list(index), np.concatenate(codes), steps, values, latest


def _cells(codes, steps, values, k: int):
    """Per occupied (bucket, name) cell: dict of column arrays, or None when the grid would be too sparse."""
    buckets = steps // RES
    lo_b, hi_b = int(buckets.min()), int(buckets.max())
    bound = GRID_SLACK * len(codes) + 4096
    if (hi_b - lo_b + 1) * k <= bound:  # the common case: every bucket of the range has rows (no sort)
        ub, binv = np.arange(lo_b, hi_b + 1), buckets - lo_b
    else:
        ub, binv = np.unique(buckets, return_inverse=True)
    size = len(ub) * k
    if size > bound:
        return None
    cell = binv * k + codes
    n = np.bincount(cell, minlength=size)
    finite = np.isfinite(values)
    fc, fv = cell[finite], values[finite]
    nf = np.bincount(fc, minlength=size)
    total = np.bincount(fc, weights=fv, minlength=size)
    lo, hi = np.full(size, np.inf), np.full(size, -np.inf)
    np.minimum.at(lo, fc, fv)
    np.maximum.at(hi, fc, fv)
    first, last_step = np.full(size, np.iinfo(np.int64).max), np.full(size, np.iinfo(np.int64).min)
    np.minimum.at(first, cell, steps)
    np.maximum.at(last_step, cell, steps)
    at_last = np.flatnonzero(steps == last_step[cell])  # rows at their cell's last step, in insertion order
    cells_at, pick = np.unique(cell[at_last], return_index=True)  # the first of them per cell
    last = np.full(size, np.nan)
    last[cells_at] = values[at_last[pick]]
    occ = np.flatnonzero(n)
    return {"name": occ % k, "bucket": ub[occ // k], "first_step": first[occ], "last_step": last_step[occ],
            "min": lo[occ], "max": hi[occ], "last": last[occ], "sum": total[occ], "n": n[occ],
            "n_finite": nf[occ]}  # fmt: skip


def _merge(new: dict, old: list[tuple], names: list[str]) -> dict:
    """`new` cells with the store's `old` rows (name, bucket, first_step, last_step, min, max, last, sum, n,
    n_nonfinite) of the same buckets folded in: what recounting the old rows with the new ones gives."""
    index = {n: i for i, n in enumerate(names)}
    for row in old:
        if row[0] not in index:
            index[row[0]] = len(names)
            names.append(row[0])
    keys = {(int(c), int(b)): i for i, (c, b) in enumerate(zip(new["name"], new["bucket"], strict=True))}
    out = {k: list(v) for k, v in new.items()}
    for name, bucket, first, last_step, lo, hi, last, total, n, nnf in old:
        nf = n - nnf
        i = keys.get((index[name], bucket))
        if i is None:  # an old cell no new row falls in: kept as it is (no finite value: nulls again)
            vals = (index[name], bucket, first, last_step, lo if nf else np.inf, hi if nf else -np.inf, last,
                    total if nf else 0.0, n, nf)  # fmt: skip
            for col, v in zip(out, vals, strict=True):
                out[col].append(v)
            continue
        out["first_step"][i] = min(out["first_step"][i], first)
        if last_step >= out["last_step"][i]:  # a tie: the old row came first
            out["last"][i] = last
            out["last_step"][i] = last_step
        if nf:
            out["min"][i] = min(out["min"][i], lo)
            out["max"][i] = max(out["max"][i], hi)
            out["sum"][i] = total + out["sum"][i] if out["n_finite"][i] else total
        out["n"][i] += n
        out["n_finite"][i] += nf
    return {k: np.asarray(v, np.float64 if k in ("min", "max", "last", "sum") else np.int64) for k, v in out.items()}


def _num(a: np.ndarray, nulls: np.ndarray | None = None) -> pa.Array:
    """A zero-copy Arrow array of a numpy array (`pa.array` would import pandas), null where `nulls`."""
    a = np.ascontiguousarray(a)
    valid = pa.py_buffer(np.packbits(~nulls, bitorder="little")) if nulls is not None and nulls.any() else None
    return pa.Array.from_buffers(pa.from_numpy_dtype(a.dtype), len(a), [valid, pa.py_buffer(a)])


def _strings(names: list[str]) -> pa.Array:
    encoded = [n.encode("utf-8", "replace") for n in names]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum(np.fromiter(map(len, encoded), np.int64, len(encoded)), out=offsets[1:])
    return pa.Array.from_buffers(pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))])


def roll_up(con, rows: MetricRows, firsts: dict[str, int]) -> bool:
    """`metrics_r8` and `metric_series` for the new rows in `rows` (inside the write transaction);
    False, having written nothing, when the arrays cannot stand in for the store (the SQL path then)."""
    tables, series = [], []
    for run in sorted(rows.parts):
        names, codes, steps, values, latest = _concat(rows.parts[run])
        cells = _cells(codes, steps, values, len(names))
        if cells is None:
            return False
        first_bucket = int(steps.min()) // RES
        if first_bucket != firsts[run] // RES:
            return False
        old = con.execute(
            """SELECT name, bucket, first_step, last_step, min, max, last, sum, n, n_nonfinite
               FROM metrics_r8 WHERE run = ? AND bucket >= ?""", [run, first_bucket]).fetchall()  # fmt: skip
        if old:
            cells = _merge(cells, old, names)
        tables.append((run, names, cells))
        series.append((run, names, *_series(codes, steps, values, latest, len(names))))
    for run, names, c in tables:
        con.execute(f"DELETE FROM metrics_r{RES} WHERE run = ? AND bucket >= ?", [run, int(firsts[run]) // RES])
        order = np.lexsort((c["bucket"], np.argsort(np.argsort(np.array(names, dtype=object)))[c["name"]]))
        empty = c["n_finite"][order] == 0
        con.register("_cells", pa.table({
            "name": pa.DictionaryArray.from_arrays(_num(c["name"][order].astype(np.int32)), _strings(names)),
            "bucket": _num(c["bucket"][order]), "first_step": _num(c["first_step"][order]),
            "last_step": _num(c["last_step"][order]), "min": _num(c["min"][order], empty),
            "max": _num(c["max"][order], empty), "last": _num(c["last"][order]), "sum": _num(c["sum"][order], empty),
            "n": _num(c["n"][order]), "n_nonfinite": _num(c["n"][order] - c["n_finite"][order]),
        }))  # fmt: skip
        try:
            con.execute(f"""INSERT INTO metrics_r{RES} SELECT $run, name, bucket, first_step, last_step, min, max,
                            last, sum, n, n_nonfinite FROM _cells""", {"run": run})  # fmt: skip
        finally:
            con.unregister("_cells")
    for run, names, n, first, last_step, last, last_t in series:
        con.register("_series", pa.table({
            "name": _strings(names), "n": _num(n), "first_step": _num(first), "last_step": _num(last_step),
            "last_value": _num(last), "last_t": _num(last_t)}))  # fmt: skip
        try:
            con.execute(SERIES_UPSERT.format(source="SELECT $run, name, n, first_step, last_step, last_value, "
                                                    "last_t FROM _series WHERE n > 0"), {"run": run})  # fmt: skip
        finally:
            con.unregister("_series")
    return True


def _series(codes, steps, values, latest, k: int):
    """Per name (k,): n, first step, last step, the value at the last step (first such row), max t."""
    n = np.bincount(codes, minlength=k)
    first, last_step = np.full(k, np.iinfo(np.int64).max), np.full(k, np.iinfo(np.int64).min)
    np.minimum.at(first, codes, steps)
    np.maximum.at(last_step, codes, steps)
    at_last = np.flatnonzero(steps == last_step[codes])
    named, pick = np.unique(codes[at_last], return_index=True)
    last = np.full(k, np.nan)
    last[named] = values[at_last[pick]]
    last_t = np.full(k, -np.inf)
    last_t[: len(latest)] = latest  # names the store's old cells added (`_merge`) come after, with n = 0
    return n, first, last_step, last, last_t


# `metric_series` folds new per-name rows in (`rollups._merge_metric_series` runs it over the store)
SERIES_UPSERT = """
INSERT INTO metric_series {source}
ON CONFLICT (run, name) DO UPDATE SET
    n = metric_series.n + excluded.n,
    first_step = least(metric_series.first_step, excluded.first_step),
    last_value = CASE WHEN excluded.last_step >= coalesce(metric_series.last_step, -1)
                      THEN excluded.last_value ELSE metric_series.last_value END,
    last_step = greatest(metric_series.last_step, excluded.last_step),
    last_t = greatest(metric_series.last_t, excluded.last_t)
"""
