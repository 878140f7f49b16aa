"""The expert-load rollups read from raw rows, for a catch-up transaction, from its new rows as numpy arrays.

`rollups.after_ingest` recomputes `expert_layer_step` (run, layer, step) and `expert_load_r16`
(run, layer, step // 16, expert) from `expert_load` with a GROUP BY over the new rows. At the
reference run's shape (48 layers x 384 experts, 18,432 rows a step) a catch-up of 10^7 rows
spends ~1.8 s there, as long as the engine's own append of the same rows. The ingester has the
rows as arrays (`msgspec_lines._experts_table`; `_check_line`'s as Python lists), so
`ExpertRows` sums each part of them into cells as it comes (integer `np.add.at` over a dense
grid, or the distinct keys found by sorting where a grid would be sparse: `metric_cells.cell_index`), and `roll_up` adds the parts together and to the cells the store has where the new rows
reach into them (the 16-step bucket a run's tail shares with its new steps; a replayed step),
as DuckDB's recount of those rows would. Every column is an integer sum, max or count: the cells
equal DuckDB's exactly. The coarser levels (`expert_run_step`, `expert_layer_r64`,
`expert_load_r128`, `_r1024`) are still made by SQL, from these.

Used only when it covers every new row: `rollups.after_ingest` compares the count of rows
past the watermark with the rows given here; rows from the SQL path's bulk insert make it step aside.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from observatory.store.arrow import numeric
from observatory.store.metric_cells import by_run, cell_index, distinct

__all__ = ["ExpertRows", "roll_up"]

RES = 16  # the finest expert_load rollup's bucket (`schema.RESOLUTIONS[0]`; checked by rollups)
_STEP = ("layer", "step", "routed", "dropped", "routed_max", "n_experts")  # expert_layer_step's columns
_BUCKET = ("layer", "bucket", "expert", "routed", "dropped", "steps")  # expert_load_r16's


# logged steps per 16 steps below which a part (of 2^16 rows or more, over 16 steps or more) gives up on arrays:
# logged every step, a 16-step cell sums 16 rows; every 10 steps (a rebuild's log), 1-2, and its cells, about as
# many as its rows, cost more memory and time to keep and fold than DuckDB's GROUP BY (measured: a 10k-step
# rebuild's peak RSS 1.6 GB against 1.05 GB, no faster). Judged by how densely the steps are logged, not by
# rows per cell: a piece of a few steps at a bucket's edge has few rows per cell however the run logs
MIN_STEPS_PER_BUCKET = 4
EXACT_FLOAT = 1 << 21  # entries fewer than this: float64 sums of uint32 values are exact (< 2^53 each)


def _sum(cell, size, values, exact_float: bool) -> np.ndarray:
    if exact_float:  # np.bincount's float sums: exact here, and several times faster than np.add.at
        return np.bincount(cell, values.astype(np.float64), size).astype(np.int64)
    out = np.zeros(size, np.int64)
    np.add.at(out, cell, values)
    return out


def _group(keys: dict[str, np.ndarray], sums: dict[str, np.ndarray], maxes: dict[str, np.ndarray],
           rows: bool = True) -> dict:  # fmt: skip
    """Entries grouped by `keys` (in their order): integer `sums`, `maxes` per occupied cell. `rows`: the
    entries' values are uint32 counts (rows, or one event's sums of fewer than 2^21 of them) and the
    float sums exact; else (cells' sums folded) integer sums."""
    cell, size, at = cell_index(list(keys.values()))
    exact_float = rows and len(cell) < EXACT_FLOAT
    out = {col: _sum(cell, size, v, exact_float) for col, v in sums.items()}
    for col, v in maxes.items():
        out[col] = np.zeros(size, np.int64)
        np.maximum.at(out[col], cell, v)
    occ = np.flatnonzero(np.bincount(cell, minlength=size))
    return {**dict(zip(keys, at(occ), strict=True)), **{col: v[occ] for col, v in out.items()}}


def _step_cells(layer, step, routed, dropped, n, routed_max, rows: bool = False) -> dict:
    return _group({"layer": layer, "step": step}, {"routed": routed, "dropped": dropped, "n_experts": n},
                  {"routed_max": routed_max}, rows)  # fmt: skip


def _bucket_cells(layer, bucket, expert, routed, dropped, steps, rows: bool = False) -> dict:
    return _group({"layer": layer, "bucket": bucket, "expert": expert},
                  {"routed": routed, "dropped": dropped, "steps": steps}, {}, rows)  # fmt: skip


def _sparsely_logged(steps: np.ndarray) -> bool:
    """Whether `steps` (each row's, or each event's) span 16 steps or more with fewer than
    `MIN_STEPS_PER_BUCKET` of every 16 logged."""
    span = int(steps.max()) - int(steps.min()) + 1
    return span >= RES and len(distinct(steps)) * RES < MIN_STEPS_PER_BUCKET * span


class ExpertRows:
    """The `expert_load` rows one write transaction added, per run, summed into cells part by part."""

    def __init__(self) -> None:
        self.parts: dict[str, list[tuple[dict, dict]]] = {}  # run -> (layer-step cells, 16-step cells) a part
        self.counts: dict[str, int] = {}
        self.usable = True  # False: some rows came another way: the SQL path

    def add(self, run: str, steps, layers, experts, routed, dropped, lens=None) -> None:
        """Rows (R,) of one run: step, layer, expert, routed, dropped; `lens` (E,), when given: the rows come
        event by event, `lens[i]` of them for event i (its layer and step on each), so the per-(layer, step)
        sums are made per event first (`np.add.reduceat`), not row by row."""
        if not self.usable or not len(steps):
            return
        step, layer = np.asarray(steps, np.int64), np.asarray(layers, np.int64)
        routed, dropped = np.asarray(routed, np.int64), np.asarray(dropped, np.int64)
        starts = None if lens is None else (np.cumsum(lens) - np.asarray(lens, np.int64))[np.asarray(lens) > 0]
        if len(step) >= 1 << 16 and _sparsely_logged(step if starts is None else step[starts]):
            self.forget()  # load logged every few steps: SQL's GROUP BY is cheaper than keeping these cells
            return
        one = np.ones(len(step), np.int64)
        buckets = _bucket_cells(layer, step // RES, np.asarray(experts, np.int64), routed, dropped, one, True)
        if lens is None:
            per_step = _step_cells(layer, step, routed, dropped, one, routed, rows=True)
        else:
            lens = np.asarray(lens, np.int64)
            per_step = _step_cells(layer[starts], step[starts], np.add.reduceat(routed, starts),
                                   np.add.reduceat(dropped, starts), lens[lens > 0], np.maximum.reduceat(routed, starts),
                                   rows=False)  # fmt: skip
        self.parts.setdefault(run, []).append((per_step, buckets))
        self.counts[run] = self.counts.get(run, 0) + len(step)

    def add_lists(self, runs: list, steps: list, layers: list, experts: list, routed: list, dropped: list) -> None:
        """Rows as the Python lists `sql_lines._check_line` stages (`_Batch.experts`), in order."""
        if not self.usable or not runs:
            return
        for run, rows in by_run(runs).items():
            self.add(run, *(np.array([col[i] for i in rows], np.int64) for col in (steps, layers, experts, routed, dropped)))

    def first_steps(self) -> dict[str, int]:
        """Each run's smallest step."""
        return {run: min(int(p[0]["step"].min()) for p in parts) for run, parts in self.parts.items()}

    def forget(self) -> None:
        self.usable, self.parts, self.counts = False, {}, {}


def _fold_steps(parts: list[dict]) -> dict:
    c = {col: np.concatenate([p[col] for p in parts]) for col in _STEP}
    return _step_cells(c["layer"], c["step"], c["routed"], c["dropped"], c["n_experts"], c["routed_max"])


def _fold_buckets(parts: list[dict]) -> dict:
    c = {col: np.concatenate([p[col] for p in parts]) for col in _BUCKET}
    return _bucket_cells(c["layer"], c["bucket"], c["expert"], c["routed"], c["dropped"], c["steps"])


def _stored(con, sql: str, params: list, cols: tuple[str, ...]) -> dict | None:
    got = con.execute(sql, params).fetchnumpy()
    if not len(got[cols[0]]):
        return None
    return {col: np.asarray(got[col], np.int64) for col in cols}


def _insert(con, table: str, run: str, cells: dict, cols: tuple[str, ...], types: dict[str, type]) -> None:
    """Append `cells` (from `_group`: in the order of their keys, as the SQL path's ORDER BY) to `table`."""
    con.register("_cells", pa.table({c: numeric(cells[c].astype(types.get(c, np.int64))) for c in cols}))
    try:
        con.execute(f"INSERT INTO {table} SELECT $run, {', '.join(cols)} FROM _cells", {"run": run})
    finally:
        con.unregister("_cells")


_TYPES = {"layer": np.uint16, "expert": np.uint16, "step": np.int32, "bucket": np.int32, "routed": np.uint64,
          "dropped": np.uint64, "routed_max": np.uint32, "n_experts": np.uint16, "steps": np.uint32}  # fmt: skip


def roll_up(con, rows: ExpertRows, firsts: dict[str, int]) -> None:
    """`expert_layer_step` and `expert_load_r16` for the new rows in `rows` (inside the write transaction)."""
    for run in sorted(rows.parts):
        first = int(firsts[run])
        steps = _fold_steps([p[0] for p in rows.parts[run]])
        buckets = _fold_buckets([p[1] for p in rows.parts[run]])
        old = _stored(con, "SELECT layer, step, routed, dropped, routed_max, n_experts FROM expert_layer_step "
                           "WHERE run = ? AND step >= ?", [run, first], _STEP)  # fmt: skip
        if old is not None:  # a replayed step: its earlier rows are counted again
            steps = _fold_steps([old, steps])
        old = _stored(con, f"SELECT layer, bucket, expert, routed, dropped, steps FROM expert_load_r{RES} "
                           "WHERE run = ? AND bucket >= ?", [run, first // RES], _BUCKET)  # fmt: skip
        if old is not None:  # the bucket the run's tail shares with its new steps, or more after a rollback
            buckets = _fold_buckets([old, buckets])
        con.execute("DELETE FROM expert_layer_step WHERE run = ? AND step >= ?", [run, first])
        _insert(con, "expert_layer_step", run, steps, _STEP, _TYPES)
        con.execute(f"DELETE FROM expert_load_r{RES} WHERE run = ? AND bucket >= ?", [run, first // RES])
        _insert(con, f"expert_load_r{RES}", run, buckets, _BUCKET, _TYPES)
