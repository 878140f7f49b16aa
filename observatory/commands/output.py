"""Query results out of the CLI as a table, CSV, JSON or Parquet, for any column type.

- table / CSV: nested values (lists, structs, maps) and JSON columns become JSON text;
- JSON: JSON columns are embedded as JSON, not as strings holding JSON;
- Parquet: each column keeps its DuckDB type (its Arrow form, as DuckDB itself exports it),
  zero rows included; a value Arrow cannot take in that type falls back to the inferred
  type, then to JSON text, so no column type makes the write fail.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import decimal
import io
import json
import re
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

__all__ = ["FORMATS", "emit", "emit_stream", "json_text"]

FORMATS = ("table", "csv", "json", "parquet")


def _default(v: Any) -> Any:
    """JSON for what `json` cannot encode: times as ISO text, bytes as base64, the rest as text."""
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode()
    if isinstance(v, (set, frozenset)):
        return sorted(v, key=str)
    if isinstance(v, (decimal.Decimal, uuid.UUID, dt.timedelta)):
        return str(v)
    return str(v)


def json_text(v: Any) -> str:
    return json.dumps(v, default=_default, ensure_ascii=False)


def _text(v: Any, float_fmt: str | None = None) -> str:
    """One cell as text: nested values as JSON, the rest as themselves."""
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return format(v, float_fmt) if float_fmt else repr(v)
    if isinstance(v, (list, tuple, dict)):
        return json_text(v)
    if isinstance(v, (dt.datetime, dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _default(v)
    return str(v)


def _cell(v: Any) -> str:
    """A table cell for a person: a list of plain values as `a, b`, floats to 6 digits, the rest as `_text`."""
    if isinstance(v, list) and all(isinstance(x, (str, int, float)) for x in v):
        return ", ".join(_text(x, ".6g") for x in v)
    return _text(v, ".6g")


def _json_column(types: Sequence[str] | None, i: int) -> bool:
    return bool(types) and i < len(types) and types[i] == "JSON"


def _rows_as_json(columns: list[str], rows: list[tuple], types: Sequence[str] | None) -> str:
    parsed = [_json_column(types, i) for i in range(len(columns))]

    def value(i, v):
        if parsed[i] and isinstance(v, str):
            try:
                return json.loads(v)
            except ValueError:
                return v
        return v

    objs = [{c: value(i, v) for i, (c, v) in enumerate(zip(columns, r, strict=True))} for r in rows]
    return json.dumps(objs, default=_default, indent=1, ensure_ascii=False) + "\n"


def _csv(columns: list[str], rows: list[tuple]) -> str:
    from observatory.markup import csv_cell

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow([csv_cell(c) for c in columns])
    w.writerows([csv_cell(_text(v)) for v in r] for r in rows)  # a formula cell prefixed (`markup.csv_cell`)
    return buf.getvalue()


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def terminal_text(msg: str) -> str:
    """`msg` for a terminal: control characters (an escape sequence in a folder name that a log writer
    chose, a carriage return that overwrites the line) and bidi overrides as `\\xNN`/`\\uNNNN` escapes."""
    return _CONTROL.sub(lambda m: ascii(m.group(0))[1:-1], str(msg))


def _arrow_types(types: Sequence[str] | None, n: int) -> list[Any]:
    """The Arrow type DuckDB exports for each DuckDB type name (None where there is none)."""
    import duckdb  # lazy for start-up time: only parquet output needs these

    if not types or len(types) != n:
        return [None] * n
    con = duckdb.connect()

    def one(t: str):
        try:
            return con.sql(f"SELECT CAST(NULL AS {t}) AS c").to_arrow_table().schema.field(0).type
        except duckdb.Error:
            return None

    try:
        cache = {t: one(t) for t in set(types)}
    finally:
        con.close()
    return [cache[t] for t in types]


def _arrow_column(values: list, typ: Any):
    import pyarrow as pa

    def fit(v):  # the Python forms DuckDB returns, in the shape pyarrow wants for that type
        if v is None:
            return v
        if pa.types.is_map(typ) and isinstance(v, dict):
            return list(v.items())
        if pa.types.is_decimal(typ) and isinstance(v, (str, int)):
            return decimal.Decimal(v)
        return v

    if typ is not None:
        try:
            return pa.array([fit(v) for v in values], type=typ)
        except (pa.ArrowException, TypeError, ValueError, OverflowError, decimal.InvalidOperation):
            pass
    try:
        arr = pa.array(values)
        if not pa.types.is_null(arr.type) or typ is None:
            return arr
    except (pa.ArrowException, TypeError, ValueError, OverflowError):
        pass
    return pa.array([None if v is None else _text(v) for v in values], type=pa.string())


def _parquet(columns: list[str], rows: list[tuple], types: Sequence[str] | None, out: Path) -> None:
    import pyarrow as pa  # lazy for start-up time
    import pyarrow.parquet as pq

    arrow_types = _arrow_types(types, len(columns))
    arrays = [_arrow_column([r[i] for r in rows], arrow_types[i]) for i in range(len(columns))]
    names = _unique(columns)
    pq.write_table(pa.Table.from_arrays(arrays, names=names), out)


def _unique(columns: list[str]) -> list[str]:
    """Column names made distinct (`SELECT 1, 1` has two columns named `1`): a, a_2, a_3."""
    seen: dict[str, int] = {}
    out = []
    for c in columns:
        seen[c] = seen.get(c, 0) + 1
        out.append(c if seen[c] == 1 else f"{c}_{seen[c]}")
    return out


def _table(columns: list[str], rows: list[tuple], out: Path | None, title: str | None) -> None:
    from rich.console import Console  # lazy for start-up time
    from rich.table import Table

    table = Table(title=title, show_lines=False)
    for c in columns:
        table.add_column(c, overflow="fold")
    for r in rows:
        table.add_row(*(_cell(v) for v in r))
    if out is not None:
        with open(out, "w") as f:
            Console(file=f, width=200).print(table)
    else:
        # piped output (a file, `less`, a test) gets a wide table instead of wrapped cells
        Console(width=None if sys.stdout.isatty() else 240).print(table)


def emit(
    columns: list[str],
    rows: list[tuple],
    fmt: str,
    out: Path | None,
    title: str | None = None,
    types: Sequence[str] | None = None,
) -> None:
    """Write rows in `fmt` to `out` (stdout when None); `types` are the columns' DuckDB types, if known.

    A file that cannot be written is a one-line `click.ClickException`, never a traceback.
    """
    if fmt == "parquet" and out is None:
        raise click.UsageError("--format parquet needs --out FILE (parquet is binary)")
    try:
        if fmt == "table":
            _table(columns, rows, out, title)
        elif fmt == "parquet":
            _parquet(columns, rows, types, Path(out))
        else:
            text = _csv(columns, rows) if fmt == "csv" else _rows_as_json(columns, rows, types)
            if out is None:
                sys.stdout.write(text)
            else:
                Path(out).write_text(text)
    except OSError as e:
        raise click.ClickException(f"cannot write {e.filename or out}: {e.strerror or e}") from None


def emit_stream(columns: list[str], rows, fmt: str, out: Path | None, chunk: int = 1000) -> None:
    """`emit` for csv or json, written `chunk` rows at a time as `rows` (an iterable of tuples) yields them:
    the first lines are out before the last rows are formatted, and no whole text is held."""
    import itertools

    try:
        f = sys.stdout if out is None else open(out, "w")
        try:
            it = iter(rows)
            first = True
            if fmt == "csv":
                w = csv.writer(f, lineterminator="\n")
                w.writerow(columns)
            else:
                f.write("[")
            while batch := list(itertools.islice(it, chunk)):
                if fmt == "csv":
                    w.writerows([_text(v) for v in r] for r in batch)
                else:
                    text = _rows_as_json(columns, batch, None).strip()[1:-1].strip()  # the array's items
                    f.write(("\n" if first else ",\n") + text)
                first = False
                f.flush()
            if fmt != "csv":
                f.write("\n]\n" if not first else "]\n")
        finally:
            if out is not None:
                f.close()
    except OSError as e:
        raise click.ClickException(f"cannot write {e.filename or out}: {e.strerror or e}") from None
