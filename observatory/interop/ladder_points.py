"""Bring your own ladder: a table of (published) points as ordinary event logs.

    from observatory.interop.ladder_points import import_points
    res = import_points("chinchilla.csv", runs_dir, db)      # writes the logs, then ingests them

A row is one loss of one run: `ladder, rung, flops, loss` and optionally `tokens`, `params`
(active), `seed`, `step` or `fraction` (a point of the curve; neither: the run's final loss),
`steps` (the run's total steps), `dataset`, `source` (where the number comes from), `target`
(a held-out run the ladder forecasts; its `loss` may be empty) and `run` (the run id; default
`<ladder>-<rung>[-s<seed>]`). Other columns are kept in the run's config. CSV (a header line;
`#` lines are comments) or JSON (a list of objects, or an object whose `rows` or `points` list
them, its other keys the default of every row).

Every (ladder, rung, seed) becomes one run, written by `observatory.interop.RunLogBuilder` as
the trainer would have written it: `run_start` with `ladder` {name, rung, flops, steps, tokens,
params_active, seed, target, source}, an `eval` event per point (the final one at the run's last
step) and a `run_end`. Re-importing the same table writes the same bytes (a no-op); the store
stays a function of the logs (`observatory rebuild`). Imported runs have no wall time: their
events carry `t` = 0.

The table is checked whole before anything is written: each problem names its row (the CSV
line, or the JSON item) and field, and one bad row writes nothing (a ladder missing a rung
would fit without it and say nothing). A target without its loss is not a run: it is listed
(`targets`) for `observatory ladder forecast NAME --flops C`.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from observatory.events import RUN_ID_RE
from observatory.interop import RunLogBuilder, ingest_runs
from observatory.ladder.rungs import as_run_id

__all__ = [
    "Point",
    "PointsError",
    "LadderImport",
    "read_points",
    "check_points",
    "import_points",
    "run_id_for",
    "as_run_id",
]

COLUMNS = (
    "ladder",
    "rung",
    "flops",
    "loss",
    "tokens",
    "params",
    "seed",
    "step",
    "fraction",
    "steps",
    "dataset",
    "source",
    "target",
    "run",
)
FRACTION_STEPS = 1000  # a run given by schedule fractions is written as this many steps
DEFAULT_DATASET = "eval"
SOURCE = {"trainer": "observatory ladder import"}


class PointsError(ValueError):
    """The table's problems, each `WHERE row N, field F: what is wrong` (all of them, not the first)."""

    def __init__(self, where: str, problems: list[str]):
        self.problems = problems
        shown = problems[:30]
        more = f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        super().__init__(
            f"{where}: {len(problems)} problem(s), nothing written:\n  " + "\n  ".join(shown) + more
        )


@dataclass(frozen=True, slots=True)  # (slots: a table's 10^5 points are held at once)
class Point:
    row: int  # the CSV line (the header is line 1) or the JSON item (from 1)
    ladder: str
    rung: str
    flops: float
    loss: float | None
    tokens: int | None = None
    params: int | None = None
    seed: int | None = None
    step: int | None = None
    fraction: float | None = None
    steps: int | None = None
    dataset: str = DEFAULT_DATASET
    source: str | None = None
    target: bool = False
    run: str | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class LadderImport:
    """What an import did: runs written (run -> new | unchanged | extended | replaced), targets
    without a loss (to forecast), the ladders, and the store's ingest report (None: not ingested)."""

    runs: dict[str, str] = field(default_factory=dict)
    targets: list[dict] = field(default_factory=list)
    ladders: list[str] = field(default_factory=list)
    ingest: Any = None


# ------------------------------------------------------------------- reading


def read_points(path: str | Path) -> tuple[Iterable[dict], str]:
    """The table's rows as dicts, each with its `_row` number; and the word rows are counted in. A CSV's
    rows come one at a time as its lines are read (a 34 MB table is never held whole: `check_points`
    keeps each row's `Point` only)."""
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix in (".csv", ".tsv", ".txt"):
        return _csv_rows(p, suffix), "line"
    text = p.read_text(encoding="utf-8-sig")
    if suffix == ".json":
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise PointsError(str(p), [f"not valid JSON: {e}"]) from None
        defaults: dict = {}
        if isinstance(doc, dict):
            key = next((k for k in ("rows", "points") if isinstance(doc.get(k), list)), None)
            if key is None:
                raise PointsError(
                    str(p), ["a JSON table is a list of row objects, or an object with a `rows` list"]
                )
            defaults = {k: v for k, v in doc.items() if k != key}
            doc = doc[key]
        if not isinstance(doc, list):
            raise PointsError(
                str(p), ["a JSON table is a list of row objects, or an object with a `rows` list"]
            )
        rows = []
        for i, item in enumerate(doc, 1):
            rows.append(
                {**defaults, **item, "_row": i} if isinstance(item, dict) else {"_row": i, "_bad": item}
            )
        return rows, "item"
    raise PointsError(str(p), [f"unknown table type {suffix or '(none)'!r}: give a .csv or .json file"])


def _csv_rows(p: Path, suffix: str) -> Iterator[dict]:
    """A CSV's rows, read line by line (`#` lines and blank lines skipped), each with its line number."""
    numbers: list[int] = []  # the line number of the line the reader took last

    def lines() -> Iterator[str]:
        with open(p, encoding="utf-8-sig", newline="") as f:
            for n, line in enumerate(f, 1):
                if line.strip() and not line.lstrip().startswith("#"):
                    numbers.append(n)
                    yield line.rstrip("\r\n")

    reader = csv.reader(lines(), delimiter="\t" if suffix == ".tsv" else ",")
    header = next(reader, None)
    if header is None:
        raise PointsError(str(p), ["empty: no header line"])
    header = [h.strip().lower() for h in header]
    for cells in reader:
        n = numbers[-1]
        del numbers[:-1]
        if len(cells) > len(header):
            yield {"_row": n, "_bad": f"{len(cells)} cells for {len(header)} columns"}
            continue
        yield {"_row": n, **{h: c.strip() for h, c in zip(header, cells, strict=False) if c.strip() != ""}}


# ------------------------------------------------------------------ checking


def _number(v: Any) -> float | None:
    if isinstance(v, bool):
        raise ValueError(f"{v!r} is not a number")
    if isinstance(v, (int, float)):
        x = float(v)
    else:
        x = float(str(v).replace("_", ""))  # "1e23", "5.76e+23"
    if not math.isfinite(x):
        raise ValueError(f"{v!r} is not finite")
    return x


# the largest values a row may hold: beyond them (1e308, 2^70) a ladder's page and tables cannot show it
MAX_FLOPS = 1e40
MAX_COUNT = 1 << 53
MAX_LOSS = 1e6


def _positive(v: Any, most: float = MAX_COUNT) -> float:
    x = _number(v)
    if not x > 0:
        raise ValueError(f"{v!r} must be > 0")
    if x > most:
        raise ValueError(f"{v!r} is beyond {most:.3g}, the largest this field may be")
    return x


def _count(v: Any, least: int) -> int:
    x = _number(v)
    if x != int(x) or x < least:
        raise ValueError(f"{v!r} must be a whole number >= {least}")
    if x > MAX_COUNT:
        raise ValueError(f"{v!r} is beyond {MAX_COUNT:.3g}, the largest this field may be")
    return int(x)


def _flag(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    s = str(v).strip().lower()
    if s in ("1", "true", "yes", "y", "target"):
        return True
    if s in ("0", "false", "no", "n", "rung", ""):
        return False
    raise ValueError(f"{v!r} is not true/false")


def run_id_for(ladder: str, rung: str, seed: int | None) -> str:
    """`<ladder>-<rung>[-s<seed>]` as a run id (`as_run_id`)."""
    return as_run_id(f"{ladder}-{rung}" + ("" if seed is None else f"-s{seed}"))


def _point(row: dict, where: str, problems: list[str]) -> Point | None:
    """One row as a `Point`, or None with its problems added (each naming the row and the field)."""
    n = row["_row"]
    at = f"{where} {n}"
    if "_bad" in row:
        problems.append(f"{at}: not a row: {row['_bad']!r:.80}")
        return None
    got: dict[str, Any] = {}
    before = len(problems)

    def take(name, conv, *args):
        v = row.get(name)
        if v is None or v == "":
            return None
        try:
            return conv(v, *args)
        except (TypeError, ValueError) as e:
            problems.append(f"{at}, field {name}: {e}")
            return None

    for name in ("ladder", "rung"):
        v = row.get(name)
        if v is None or str(v).strip() == "":
            problems.append(f"{at}, field {name}: missing")
        else:
            got[name] = str(v).strip()
    got["target"] = bool(take("target", _flag))
    got["flops"] = take("flops", _positive, MAX_FLOPS)
    if row.get("flops") in (None, ""):
        problems.append(f"{at}, field flops: missing (the run's training compute C in FLOPs, e.g. 6*N*D)")
    got["loss"] = take("loss", _positive, MAX_LOSS)
    if got["loss"] is None and not got["target"] and row.get("loss") in (None, ""):
        problems.append(f"{at}, field loss: missing (only a target row may leave it empty)")
    got["tokens"] = take("tokens", lambda v: int(_positive(v)))
    got["params"] = take("params", lambda v: int(_positive(v)))
    got["seed"] = take("seed", _count, 0)
    got["steps"] = take("steps", _count, 1)
    got["step"] = take("step", _count, 0)
    if got["step"] == 0:
        problems.append(
            f"{at}, field step: 0 is before any training: a point is the loss after training (leave "
            "step empty for the final loss) or at a step >= 1 of the run"
        )
        got["step"] = None
    got["fraction"] = take("fraction", _number)
    if got["fraction"] is not None and not (0 < got["fraction"] <= 1):
        problems.append(f"{at}, field fraction: {got['fraction']} must be in (0, 1] (1 = the final loss)")
    if got["step"] is not None and got["fraction"] is not None:
        problems.append(f"{at}, fields step and fraction: give one or the other")
    if got["step"] is not None and got["steps"] is not None and got["step"] > got["steps"]:
        problems.append(f"{at}, field step: {got['step']} is past the run's steps ({got['steps']})")
    for name in ("dataset", "source", "run"):
        v = row.get(name)
        if v is not None and not isinstance(v, (str, int, float)):
            problems.append(f"{at}, field {name}: not text")
        elif v is not None and str(v).strip():
            got[name] = str(v).strip()
    if "run" in got and not RUN_ID_RE.match(got["run"]):
        problems.append(
            f"{at}, field run: {got['run']!r} is not a run id ([A-Za-z0-9._-]{{1,128}}, not . or ..); "
            f"e.g. {as_run_id(got['run'])!r}"
        )
    if len(problems) > before:
        return None
    extra = {
        k: v for k, v in row.items() if k not in COLUMNS and not k.startswith("_") and v not in (None, "")
    }
    return Point(row=n, extra=extra, **{k: v for k, v in got.items() if v is not None or k in ("loss",)})


def check_points(rows: Iterable[dict], where: str = "row") -> dict[str, list[Point]]:
    """The rows as points grouped by run id; raises `PointsError` listing every problem.

    Per run: one ladder, rung, seed, compute (and tokens, params) and target flag; a step or
    fraction at most once per dataset; a rung's final loss (a point at 100% of its schedule).
    Seeds of a rung must share its compute.
    """
    problems: list[str] = []
    pts = [p for p in (_point(r, where, problems) for r in rows) if p is not None]
    runs: dict[str, list[Point]] = {}
    keys: dict[str, tuple] = {}
    for p in pts:
        run = p.run or run_id_for(p.ladder, p.rung, p.seed)
        key = (p.ladder, p.rung, p.seed)
        if keys.setdefault(run, key) != key:
            first = runs[run][0]
            problems.append(
                f"{where} {p.row}: run id {run!r} is also that of {where} {first.row} (ladder {first.ladder!r}, "
                f"rung {first.rung!r}, seed {first.seed}); give the rows a `run` column to tell them apart"
            )
            continue
        runs.setdefault(run, []).append(p)
    rung_flops: dict[tuple, tuple[float, int]] = {}
    for run, ps in runs.items():
        first = ps[0]
        for name in ("flops", "tokens", "params", "target", "steps"):
            vals = {getattr(p, name) for p in ps if getattr(p, name) is not None}
            if len(vals) > 1:
                rows_ = ", ".join(str(p.row) for p in ps)
                problems.append(
                    f"run {run} ({where}s {rows_}), field {name}: differs between its rows ({sorted(vals)})"
                )
        if not first.target:
            prev = rung_flops.setdefault((first.ladder, first.rung), (first.flops, first.row))
            if (
                prev[0] is not None
                and first.flops is not None
                and not math.isclose(prev[0], first.flops, rel_tol=1e-9)
            ):
                problems.append(
                    f"{where} {first.row}, field flops: rung {first.rung!r} of ladder {first.ladder!r} has "
                    f"C={prev[0]:.6g} at {where} {prev[1]}: seeds of a rung train the same model on the same tokens"
                )
        steps = _steps(ps)
        seen: dict[tuple, int] = {}
        for p in ps:
            s = _step(p, steps)
            if (p.dataset, s) in seen:
                problems.append(
                    f"{where} {p.row}: a second loss of run {run} for dataset {p.dataset!r} at step {s} "
                    f"(the first at {where} {seen[(p.dataset, s)]})"
                )
            seen[(p.dataset, s)] = p.row
        if not first.target and not any(_step(p, steps) == steps for p in ps if p.loss is not None):
            last = max(ps, key=lambda p: _step(p, steps))
            problems.append(
                f"run {run} ({where}s {', '.join(str(p.row) for p in ps)}): no loss at 100% of its schedule "
                f"(its last point, {where} {last.row}, is at step {_step(last, steps)} of {steps}); the fit "
                "needs every rung's final loss: a row without step and fraction, or fraction 1, or step = steps"
            )
    if problems:
        raise PointsError("the table", problems)
    return runs


def _steps(ps: list[Point]) -> int:
    """A run's total steps: its `steps`, else its largest step, else FRACTION_STEPS for fractions, else 1."""
    given = next((p.steps for p in ps if p.steps is not None), None)
    if given is not None:
        return given
    if any(p.step is not None for p in ps):
        return max(p.step for p in ps if p.step is not None)
    return FRACTION_STEPS if any(p.fraction is not None and p.fraction < 1 for p in ps) else 1


def _step(p: Point, steps: int) -> int:
    if p.step is not None:
        return p.step
    if p.fraction is not None:
        return max(1, round(p.fraction * steps))
    return steps


# ------------------------------------------------------------------- writing


def _log(run: str, ps: list[Point], origin: str) -> RunLogBuilder:
    """One run's event log, as the trainer would have written it, every event at t = 0."""
    first, steps = ps[0], _steps(ps)
    ladder = {"name": first.ladder, "rung": first.rung, "flops": first.flops, "steps": steps}
    for key, value in (
        ("tokens", first.tokens),
        ("params_active", first.params),
        ("seed", first.seed),
        ("source", next((p.source for p in ps if p.source), None)),
    ):
        if value is not None:
            ladder[key] = value
    if first.target:
        ladder["target"] = True
    extra: dict = {}
    for p in ps:
        extra.update(p.extra)
    b = RunLogBuilder(run)
    b.start(
        0.0,
        extra,
        name=run,
        ladder=ladder,
        source={**SOURCE, "file": origin},
        data={"name": first.dataset, **({"tokens": first.tokens} if first.tokens else {})},
        model={"params_active": first.params} if first.params else None,
        notes=ladder.get("source"),
    )
    for p in sorted((p for p in ps if p.loss is not None), key=lambda p: (_step(p, steps), p.dataset)):
        b.add("eval", {"dataset": p.dataset, "loss": p.loss}, _step(p, steps), 0.0)
    b.add("run_end", {"status": "completed", "final_step": steps}, steps, 0.0)
    return b


def import_points(
    source: str | Path | list[Mapping],
    runs_dir: str | Path,
    db: str | Path | None = None,
    *,
    ingest: bool = True,
    replace: bool = False,
    origin: str | None = None,
) -> LadderImport:
    """Check a table of ladder points (a .csv/.json path, or row dicts), write one event log per run
    into `runs_dir`, then (`ingest`) bring the store `db` up to date. Raises `PointsError` (nothing
    written) when a row is wrong, or when a run imported earlier from other data would be overwritten
    (unless `replace`: the store is then rebuilt)."""
    if isinstance(source, (str, Path)):
        rows, where = read_points(source)
        origin = origin or Path(source).name
    else:
        rows = [{**r, "_row": i} for i, r in enumerate(source, 1)]
        where, origin = "row", origin or "python"
    runs = check_points(rows, where)
    out = LadderImport(ladders=sorted({ps[0].ladder for ps in runs.values()}))
    logs = {}
    for run, ps in runs.items():
        if ps[0].target and all(p.loss is None for p in ps):
            out.targets.append(
                {
                    "ladder": ps[0].ladder,
                    "rung": ps[0].rung,
                    "flops": ps[0].flops,
                    "run": run,
                    "tokens": ps[0].tokens,
                    "params": ps[0].params,
                    "row": ps[0].row,
                }
            )
            continue
        logs[run] = ps
    # a run's log is made twice (to check, then to write), one at a time: all of them at once held
    # every event of the table in memory
    conflicts = [
        run for run, ps in logs.items() if not replace and _conflicts(Path(runs_dir), _log(run, ps, origin))
    ]
    if conflicts:
        raise PointsError(
            "the runs dir",
            [
                f"run {r} is already in {runs_dir} with different events (imported "
                "earlier from other numbers?); pass --replace (replace=True) to "
                "overwrite it, the store is then rebuilt"
                for r in conflicts
            ],
        )
    for run, ps in logs.items():
        out.runs[run] = _log(run, ps, origin).write(runs_dir, replace=replace)
    if ingest and db is not None and any(s != "unchanged" for s in out.runs.values()):
        out.ingest = ingest_runs(runs_dir, db, rebuild="replaced" in out.runs.values())
    return out


def _conflicts(runs_dir: Path, b: RunLogBuilder) -> bool:
    path = runs_dir / b.run / f"events.{b.host}.jsonl"
    if not path.exists():
        return False
    old, new = path.read_bytes(), b.to_bytes()
    return old != new and not new.startswith(old)
