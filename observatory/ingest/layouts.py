"""The msgspec types the bulk path (`msgspec_lines`) decodes lines into, and the layouts it learns.

A run's metric names become a layout: a Struct whose fields are its names, so `data`
decodes straight into floats (`Layout`). What one ingester learnt is a `Layouts`, owned by
its `passes.Stage` and carried by each batch: bounded, so that a long `--follow` whose
metric names change keeps a bounded number of classes (a Struct class of ours is never kept
by a module global).
"""

from __future__ import annotations

import math
import operator
from collections import OrderedDict
from typing import Annotated, Any, Union

from observatory.events import KINDS
from observatory.ingest.rules import LAYER

try:  # without msgspec (>= 0.19: Decoder.decode_lines) every line is judged alone (`model.plain_ingest_chunk`)
    import msgspec

    if not hasattr(msgspec.json.Decoder, "decode_lines"):  # pragma: no cover
        msgspec = None
except ImportError:  # pragma: no cover - msgspec is a declared dependency
    msgspec = None


__all__ = ["Layouts", "LAYOUT_MAX", "SMALL", "SMALL_LAYOUT_MAX", "msgspec"]

if msgspec is not None:
    from msgspec import Meta, Struct

    class ExpertData(Struct):
        layer: Annotated[int, Meta(ge=LAYER.lo, le=LAYER.hi)]
        # the JSON text of the lists, parsed in bulk by `_int_lists` (msgspec still checks the syntax):
        # 2 x 64 Python ints per event would cost as decoding the rest of the line
        routed: msgspec.Raw
        dropped: msgspec.Raw

    # class attributes, no fields: `bulk_kind` the kind the bulk path certifies (`rules.certain`; other
    # kinds have none: check_line judges them), `metrics` whether `data` is a metrics dict or layout
    class Envelope(Struct):
        """The fields every line has before its `data` (then `step`: `astuple` gives them in this order)."""

        v: int
        run: str
        t: float
        host: int
        seq: int

    class MetricsLine(Envelope, tag_field="kind", tag="metrics"):
        bulk_kind = "metrics"
        metrics = True
        data: dict[str, float]  # (K,) name -> value; duplicate keys: the last wins, as in json.loads
        step: int | None = None

    class ExpertLine(Envelope, tag_field="kind", tag="expert_load"):
        bulk_kind = "expert_load"
        metrics = False
        data: ExpertData
        step: int | None = None

    # every other known kind: decoded to its seq alone (the rest skipped, JSON still checked), sent to
    # check_line; the seq (any JSON value: a wrong type fails no decode) lets `ingest_small` check a small
    # file's seqs at once
    OTHERS = tuple(
        msgspec.defstruct(f"_Other_{k}", [("seq", Any, None)], tag_field="kind", tag=k)
        for k in KINDS
        if k not in ("metrics", "expert_load")
    )
    DECODER = msgspec.json.Decoder(Union[(MetricsLine, ExpertLine, *OTHERS)])  # noqa: UP007 (a built union)
    DECODE_ERRORS: tuple = (msgspec.MsgspecError, RecursionError)
    astuple = msgspec.structs.astuple
    DATA = operator.attrgetter("data")


class Layout:
    """A run's metric names as a Struct: `data` decoded straight into K float fields, no dict, no name strings.

    Each field defaults to NaN, which marks an absent name: a JSON number never decodes
    to NaN (msgspec has no NaN literal), so NaN in a field can only mean "not in this
    line". Names outside the layout make the decode fail (`forbid_unknown_fields`), and
    the piece is decoded with dicts again. A duplicate key keeps its last value, as
    json.loads and the dict decoder do.
    """

    def __init__(self, names: tuple[str, ...]):
        self.names = names
        fields = [(f"f{i}", float, math.nan) for i in range(len(names))]
        data = msgspec.defstruct(
            "_LayoutData",
            fields,
            rename=dict(zip((f[0] for f in fields), names, strict=True)),
            forbid_unknown_fields=True,
            gc=False,
            namespace={"names": names},  # its metric names, by field (a class attribute, no field)
        )
        line = msgspec.defstruct(
            "_LayoutMetrics",
            [("data", data), ("step", int | None, None)],
            bases=(Envelope,),
            tag_field="kind",
            tag="metrics",
            namespace={"bulk_kind": "metrics", "metrics": True},
        )
        self.decoder = msgspec.json.Decoder(Union[(line, ExpertLine, *OTHERS)])  # noqa: UP007 (a built union)


LAYOUT_MAX = 1024  # names in a run's layout; past that its metrics lines decode into dicts
# Several files' lines (`ingest_small`: a sweep's small runs) share one layout, under this key (no run id is
# empty): the names of the last pieces, at most SMALL_LAYOUT_MAX of them, as every line's row of the matrix
# is that wide. Most sweeps log a few names each: a piece decodes into Structs as one run's would (10^4 runs:
# their decode and columns took 1.1 s with dicts). A piece with names outside it is decoded with dicts
# again (its cost twice) and the layout learnt anew from it.
SMALL = ""
SMALL_LAYOUT_MAX = 64


class Layouts:
    """One ingester's layouts (its `Stage` owns them): by run (or SMALL; None: dicts) and by names. At most
    `KEEP` each, least recently used dropped first: a long `--follow` whose metric names change keeps a
    bounded number of Struct classes (a dropped run learns its layout again from its next piece)."""

    KEEP = 64

    def __init__(self) -> None:
        self.by_run: OrderedDict[str, Layout | None] = OrderedDict()
        self.by_names: OrderedDict[tuple[str, ...], Layout] = OrderedDict()

    def of(self, run: str) -> Layout | None:
        layout = self.by_run.get(run)
        if layout is not None:
            self.by_run.move_to_end(run)
        return layout

    def set(self, run: str, names: tuple[str, ...] | None) -> None:
        """The run's layout from now on: the one of these names (made if new); None: dicts."""
        layout = None
        if names is not None:
            layout = self.by_names.get(names)
            if layout is None:
                layout = self.by_names[names] = Layout(names)
                while len(self.by_names) > self.KEEP:
                    self.by_names.popitem(last=False)
            self.by_names.move_to_end(names)
        self.by_run[run] = layout
        self.by_run.move_to_end(run)
        while len(self.by_run) > self.KEEP:
            self.by_run.popitem(last=False)
