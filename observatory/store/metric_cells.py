"""The metrics rollups of a catch-up transaction, every level, from its new rows as numpy arrays.

`rollups.after_ingest` recomputes `metrics_r8` and `metric_series` from the store with a
GROUP BY (run, name, step // 8). Over a catch-up's ~10^6 new rows that costs DuckDB ~0.3 s
here: not the scan but the ~10^5 groups of its hash table, about as long as the engine's
whole append of the same rows from Arrow. The ingester has those rows as arrays already
(`msgspec_lines` builds them; `_check_line`'s rows are Python lists), so `MetricRows` folds
each part of them into (bucket, name) cells as it comes (`np.bincount` and `ufunc.at` over a
dense grid, or the distinct keys sorted where a grid would be sparse; the rows are not kept), and `roll_up` folds the parts together and with the cells
the store has for the buckets the new rows reach into (the one a run's tail shares with its
new steps, or more after a rollback), as DuckDB's recount of those rows would. The coarser levels
(`metrics_r64`, `metrics_r512`) are those cells coarsened, with the store's cells of the level below
in the part of a coarse bucket before the new rows: as `rollups`' GROUP BY over that level would.

Used only when it provably covers every new row: `rollups.after_ingest` compares the count of
rows past the watermark with the rows given here, and anything else (rows from the SQL path, a
renamed secret-shaped name, a NULL step or value) takes the SQL path. The cells equal DuckDB's: min, max, counts and steps exactly; `last`
is the value at the last step, the first such row in insertion order on a tie (DuckDB's
`arg_max` in a sequential scan); float sums may differ in the last bits (their order differs).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from observatory.store.arrow import column, numeric
from observatory.store.schema import METRIC_RESOLUTIONS

__all__ = ["MetricRows", "roll_up", "cell_index", "by_run", "distinct"]

RES = METRIC_RESOLUTIONS[0]  # the finest metrics rollup's bucket
GRID_SLACK = 4  # a dense (bucket, name) grid of more cells than this many per entry (plus 4096): sort instead


class MetricRows:
    """The `metrics` rows one write transaction added, per run, folded into cells part by part as they come
    (a part's rows are not kept: ~1/8 as many cells, and the work overlaps the ingester's INSERTs)."""

    def __init__(self) -> None:
        # run -> parts of (names, cells of the part (`_cells`, names as codes into `names`), latest t per name)
        self.parts: dict[str, list[tuple[list[str], dict, np.ndarray]]] = {}
        self.counts: dict[str, int] = {}
        self.usable = True  # False: some rows came another way (or were renamed): the SQL path

    def add(self, run: str, names: list[str], codes: np.ndarray, steps: np.ndarray, values: np.ndarray,
            ts: np.ndarray) -> None:  # fmt: skip
        """Rows (N,) of one run: `codes` index `names`; steps int, values and ts float."""
        if not self.usable or not len(codes):
            return
        codes = np.asarray(codes, np.int64)
        cells = _cells(codes, np.asarray(steps, np.int64), np.asarray(values, np.float64))
        latest = np.full(len(names), -np.inf)
        np.maximum.at(latest, codes, ts)  # all `metric_series` needs of t
        self.parts.setdefault(run, []).append((names, cells, latest))
        self.counts[run] = self.counts.get(run, 0) + len(codes)

    def add_lists(self, runs: list, steps: list, names: list, values: list, ts: list) -> None:
        """Rows as the Python lists `sql_lines._check_line` stages (`_Batch.metrics`), in order."""
        if not self.usable or not runs:
            return
        if any(s is None for s in steps) or any(v is None for v in values):
            self.forget()  # NULL steps and values: rare; DuckDB's own rules for them apply
            return
        for run, rows in by_run(runs).items():
            index: dict[str, int] = {}
            codes = np.fromiter((index.setdefault(names[i], len(index)) for i in rows), np.int64, len(rows))
            self.add(run, list(index), codes, np.array([steps[i] for i in rows], np.int64),
                     np.array([values[i] for i in rows], np.float64), np.array([ts[i] for i in rows], np.float64))  # fmt: skip

    def names(self) -> set[str]:
        """Every name the parts' rows may use (each part's names, of which its codes index some)."""
        return {n for parts in self.parts.values() for names, _, _ in parts for n in names}

    def first_steps(self) -> dict[str, int]:
        """Each run's smallest step."""
        return {run: min(int(c["first_step"].min()) for _, c, _ in parts) for run, parts in self.parts.items()}

    def forget(self) -> None:
        """Rows came another way (the SQL path's bulk insert, a renamed name): the SQL path decides."""
        self.usable, self.parts, self.counts = False, {}, {}


_COLS = ("name", "bucket", "first_step", "last_step", "min", "max", "last", "sum", "n", "n_finite")
_IMAX, _IMIN = np.iinfo(np.int64).max, np.iinfo(np.int64).min


def distinct(a: np.ndarray) -> np.ndarray:
    """`np.unique(a)` (sorted distinct values) without its first call's import of numpy.ma (numpy 2.4
    asks `np.ma.is_masked`: ~30 ms of an `observatory ingest` command's start)."""
    s = np.sort(a)
    return s[np.concatenate(([True], s[1:] != s[:-1]))] if len(s) else s


def cell_index(keys: list[np.ndarray]):
    """(cell of each entry (N,), number of cells, at) for entries keyed by integer columns (N,) each, cells
    numbered in the keys' order; `at(cells)` gives those cells' keys. A dense grid over the keys' ranges
    when it is not much bigger than the entries (no sort), else the distinct keys found by sorting."""
    lows = [int(k.min()) for k in keys]
    widths = [int(k.max()) - lo + 1 for k, lo in zip(keys, lows, strict=True)]
    size = int(np.prod(widths, dtype=object))
    if size <= GRID_SLACK * len(keys[0]) + 4096:
        cell = np.zeros(len(keys[0]), np.int64)
        for k, lo, w in zip(keys, lows, widths, strict=True):
            cell = cell * w + (k - lo)

        def at(occ):
            out, rest = [], occ
            for lo, w in reversed(list(zip(lows, widths, strict=True))):
                out.append(rest % w + lo)
                rest = rest // w
            return out[::-1]

        return cell, size, at
    order = np.lexsort(keys[::-1])
    sk = [k[order] for k in keys]
    new = np.zeros(len(order), bool)
    new[0] = True
    for k in sk:
        new[1:] |= k[1:] != k[:-1]
    cell = np.empty(len(order), np.int64)
    cell[order] = np.cumsum(new) - 1
    distinct = [k[new] for k in sk]
    return cell, len(distinct[0]), lambda occ: [d[occ] for d in distinct]


def by_run(runs: list) -> dict[str, list[int]]:
    """The positions of each run's rows in a batch's staged lists."""
    out: dict[str, list[int]] = {}
    for i, r in enumerate(runs):
        out.setdefault(r, []).append(i)
    return out


def _pick_last(cell: np.ndarray, at: np.ndarray, last_step: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """Per cell, the value of its first entry (in order) whose step `at` is the cell's last step."""
    hits = np.flatnonzero(at == last_step[cell])
    cells_at, pick = np.unique(cell[hits], return_index=True)
    last = np.full(size, np.nan)
    last[cells_at] = values[hits[pick]]
    return last


def _cells(codes, steps, values) -> dict:
    """Rows -> their occupied (bucket, name) cells, as arrays `_COLS`."""
    cell, size, at = cell_index([steps // RES, codes])
    n = np.bincount(cell, minlength=size)
    finite = np.isfinite(values)
    fc, fv = cell[finite], values[finite]
    lo, hi = np.full(size, np.inf), np.full(size, -np.inf)
    np.minimum.at(lo, fc, fv)
    np.maximum.at(hi, fc, fv)
    first, last_step = np.full(size, _IMAX), np.full(size, _IMIN)
    np.minimum.at(first, cell, steps)
    np.maximum.at(last_step, cell, steps)
    last = _pick_last(cell, steps, last_step, values, size)
    occ = np.flatnonzero(n)
    bucket, name = at(occ)
    return {"name": name, "bucket": bucket, "first_step": first[occ], "last_step": last_step[occ],
            "min": lo[occ], "max": hi[occ], "last": last[occ], "sum": np.bincount(fc, fv, size)[occ], "n": n[occ],
            "n_finite": np.bincount(fc, minlength=size)[occ]}  # fmt: skip


def _fold(parts: list[dict]) -> dict:
    """Cells of the same (bucket, name) in several parts folded into one, as recounting their rows would:
    the sums added in part order, `last` from the first part at the cell's last step (`_pick_last`)."""
    c = {col: np.concatenate([p[col] for p in parts]) for col in _COLS}
    cell, size, at = cell_index([c["bucket"], c["name"]])
    out = {}
    for col, fill, op in (("first_step", _IMAX, np.minimum), ("last_step", _IMIN, np.maximum),
                          ("min", np.inf, np.minimum), ("max", -np.inf, np.maximum)):  # fmt: skip
        out[col] = np.full(size, fill)
        op.at(out[col], cell, c[col])
    n, nf = np.zeros(size, np.int64), np.zeros(size, np.int64)
    np.add.at(n, cell, c["n"])
    np.add.at(nf, cell, c["n_finite"])
    total = np.zeros(size)
    np.add.at(total, cell, c["sum"])  # in order: part by part
    last = _pick_last(cell, c["last_step"], out["last_step"], c["last"], size)
    occ = np.flatnonzero(n)
    bucket, name = at(occ)
    return {"name": name, "bucket": bucket, **{col: out[col][occ] for col in out}, "last": last[occ],
            "sum": total[occ], "n": n[occ], "n_finite": nf[occ]}  # fmt: skip


def _run_cells(parts) -> tuple[list[str], dict, np.ndarray]:
    """One run's parts as (names, their cells folded, each name's latest t), names in order of appearance."""
    index: dict[str, int] = {}
    cells, remaps = [], []
    for names, c, _ in parts:
        remap = np.fromiter((index.setdefault(n, len(index)) for n in names), np.int64, len(names))
        cells.append({**c, "name": remap[c["name"]]})
        remaps.append(remap)
    latest = np.full(len(index), -np.inf)
    for remap, part in zip(remaps, parts, strict=True):
        np.maximum.at(latest, remap, part[2])
    return list(index), cells[0] if len(cells) == 1 else _fold(cells), latest


def _old_cells(rows: list[tuple], names: list[str]) -> dict:
    """The store's cells (name, bucket, first_step, last_step, min, max, last, sum, n, n_nonfinite) as `_COLS`
    arrays, names added to `names` where new (a cell with no finite value: its nulls as the folds' fills)."""
    index = {n: i for i, n in enumerate(names)}
    for row in rows:
        if row[0] not in index:
            index[row[0]] = len(names)
            names.append(row[0])
    cols = list(zip(*rows, strict=True))
    n, nnf = np.array(cols[8], np.int64), np.array(cols[9], np.int64)
    def num(i, fill):  # noqa: E306
        return np.array([fill if v is None else v for v in cols[i]], np.float64)
    return {"name": np.array([index[x] for x in cols[0]], np.int64), "bucket": np.array(cols[1], np.int64),
            "first_step": np.array(cols[2], np.int64), "last_step": np.array(cols[3], np.int64),
            "min": num(4, np.inf), "max": num(5, -np.inf), "last": num(6, np.nan), "sum": num(7, 0.0), "n": n,
            "n_finite": n - nnf}  # fmt: skip


def _series(c: dict, latest: np.ndarray, k: int):
    """Per name (k,) of the new rows' cells: n, first step, last step, the value at the last step, max t."""
    n = np.zeros(k, np.int64)
    np.add.at(n, c["name"], c["n"])
    first, last_step = np.full(k, _IMAX), np.full(k, _IMIN)
    np.minimum.at(first, c["name"], c["first_step"])
    np.maximum.at(last_step, c["name"], c["last_step"])
    last = _pick_last(c["name"], c["last_step"], last_step, c["last"], k)  # one cell per name has it
    last_t = np.full(k, -np.inf)
    last_t[: len(latest)] = latest  # names the store's old cells added come after, with n = 0
    return n, first, last_step, last, last_t


def roll_up(con, rows: MetricRows, firsts: dict[str, int]) -> None:
    """Every `metrics_r*` level and `metric_series` for the new rows in `rows` (inside the write transaction),
    each run's from the bucket of its smallest new step (`firsts`) on.

    The finest level (`RES`) folds the new cells with the store's in those buckets; each coarser one is
    the level below coarsened (buckets // k), with the store's rows of that level below in the coarse
    bucket's part before the new ones: what `rollups`' GROUP BY over the level below makes (~0.03 s of a
    20k-step catch-up's ~1.1 s as SQL here)."""
    tables, series = [], []
    for run in sorted(rows.parts):
        names, cells, latest = _run_cells(rows.parts[run])
        first = int(firsts[run])
        series.append((run, list(names), *_series(cells, latest, len(names))))  # `_old_cells` adds to `names`
        old = _stored(con, RES, run, first // RES)
        if old:  # the store's rows in these buckets are counted again, first (they came first)
            cells = _fold([_old_cells(old, names), cells])
        levels = [(RES, cells)]
        for res in METRIC_RESOLUTIONS[1:]:
            prev, below = levels[-1]
            k = res // prev
            old = _stored(con, prev, run, (first // res) * k, first // prev)  # the coarse bucket's earlier part
            parts = ([_old_cells(old, names)] if old else []) + [below]
            levels.append((res, _fold([{**c, "bucket": c["bucket"] // k} for c in parts])))
        tables.append((run, names, first, levels))
    for run, names, first, levels in tables:
        for res, c in levels:
            _write(con, res, run, first // res, names, c)
    for run, names, n, first, last_step, last, last_t in series:
        con.register("_series", pa.table({
            "name": column(names, pa.string()), "n": numeric(n), "first_step": numeric(first), "last_step": numeric(last_step),
            "last_value": numeric(last), "last_t": numeric(last_t)}))  # fmt: skip
        try:
            con.execute(SERIES_UPSERT.format(source="SELECT $run, name, n, first_step, last_step, last_value, "
                                                    "last_t FROM _series WHERE n > 0"), {"run": run})  # fmt: skip
        finally:
            con.unregister("_series")


def _stored(con, res: int, run: str, lo: int, hi: int | None = None) -> list[tuple]:
    """The store's `metrics_r{res}` rows of `run` with lo <= bucket (< hi), as `_old_cells` takes them."""
    return con.execute(
        f"""SELECT name, bucket, first_step, last_step, min, max, last, sum, n, n_nonfinite FROM metrics_r{res}
            WHERE run = ? AND bucket >= ?{"" if hi is None else " AND bucket < ?"}""",
        [run, lo] + ([] if hi is None else [hi])).fetchall()  # fmt: skip


def _write(con, res: int, run: str, lo: int, names: list[str], c: dict) -> None:
    """Replace `run`'s `metrics_r{res}` rows from bucket `lo` on with the cells `c` (names coded into `names`)."""
    con.execute(f"DELETE FROM metrics_r{res} WHERE run = ? AND bucket >= ?", [run, lo])
    order = np.lexsort((c["bucket"], np.argsort(np.argsort(np.array(names, dtype=object)))[c["name"]]))
    empty = c["n_finite"][order] == 0
    con.register("_cells", pa.table({
        "name": pa.DictionaryArray.from_arrays(numeric(c["name"][order].astype(np.int32)), column(names, pa.string())),
        "bucket": numeric(c["bucket"][order]), "first_step": numeric(c["first_step"][order]),
        "last_step": numeric(c["last_step"][order]), "min": numeric(c["min"][order], empty),
        "max": numeric(c["max"][order], empty), "last": numeric(c["last"][order]), "sum": numeric(c["sum"][order], empty),
        "n": numeric(c["n"][order]), "n_nonfinite": numeric(c["n"][order] - c["n_finite"][order]),
    }))  # fmt: skip
    try:
        con.execute(f"""INSERT INTO metrics_r{res} SELECT $run, name, bucket, first_step, last_step, min, max,
                        last, sum, n, n_nonfinite FROM _cells""", {"run": run})  # fmt: skip
    finally:
        con.unregister("_cells")


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
