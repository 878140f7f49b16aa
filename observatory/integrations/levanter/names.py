"""Levanter's (and Marin's) metric names onto the observatory's: one table, `NAMES`.

Every metric Levanter logs is kept under its source name. A row of `NAMES` adds
something where the meaning matches ours:

- `metric`: the value is also written under our name (a scale may convert units);
- `expert_load`: per-expert routed counts for one layer become an `expert_load`
  event (the Experts page and the hot/dead-expert detectors read those);
- `eval`: an eval loss (and its bits per byte) becomes an `eval` event (the Live
  page draws those on the loss chart).

`translate` applies the table to one flat `log` payload. docs/levanter.md's
section shows the same table (`markdown_table` prints it).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

__all__ = ["Name", "NAMES", "Translated", "translate", "markdown_table"]


@dataclass(frozen=True)
class Name:
    source: str  # a regex over the whole source name; groups `layer`, `expert`, `dataset` where they apply
    target: str  # our name (may use {layer}); for expert_load/eval rows a short description
    kind: str  # "metric", "expert_load" or "eval"
    origin: str  # who logs it
    note: str = ""
    divide_by: tuple[str, ...] = ()  # dotted config keys whose product divides the value ("metric" rows)

    @property
    def pattern(self) -> re.Pattern:
        return _compiled(self.source)


@functools.cache
def _compiled(source: str) -> re.Pattern:
    return re.compile(source + r"\Z")


# `(?:train/)?` on Mixtral's names: the launcher returns the loss function's deferred jit_log values
# as loss metrics, which Levanter's trainer prefixes with `train/`.
NAMES: tuple[Name, ...] = (
    Name(r"train/loss", "train/loss", "metric", "Levanter", "same name and meaning"),
    Name(r"grad/norm/total", "grad/norm/total", "metric", "Levanter watch", "same name and meaning"),
    Name(
        r"grad/norm/(?P<param>.+)",
        "grad/norm/{param}",
        "metric",
        "Levanter watch",
        "per parameter; same naming as our grad/norm/<module>",
    ),
    Name(r"optim/learning_rate", "opt/lr", "metric", "Levanter"),
    Name(r"throughput/tokens_per_second", "throughput/tokens_per_s", "metric", "Levanter"),
    Name(r"throughput/total_tokens", "data/tokens", "metric", "Levanter"),
    Name(
        r"train/load_balancing_loss",
        "router/lb_loss",
        "metric",
        "Levanter Mixtral",
        "Levanter's is weighted by lbl_coef and summed over layers: ours is it / (lbl_coef x layers)",
        ("model.lbl_coef", "model.num_layers"),
    ),
    Name(
        r"train/router_z_loss",
        "router/z_loss",
        "metric",
        "Levanter Mixtral",
        "Levanter's is weighted by rzl_coef and summed over layers: ours is it / (rzl_coef x layers)",
        ("model.rzl_coef", "model.num_layers"),
    ),
    Name(
        r"(?:train/)?moe/layer(?P<layer>\d+)/expert(?P<expert>\d+)_load",
        "expert_load.routed",
        "expert_load",
        "Levanter Mixtral",
        "a share of the layer's assignments; counts = share x tokens per step x top-k",
    ),
    Name(
        r"train/router/load_balancing_loss", "router/lb_loss", "metric", "Marin grug MoE", "mean over layers"
    ),
    Name(r"train/router/router_z_loss", "router/z_loss", "metric", "Marin grug MoE", "mean over layers"),
    Name(
        r"train/router/routing_entropy_mean", "router/entropy", "metric", "Marin grug MoE", "mean over layers"
    ),
    Name(
        r"train/router/layer_(?P<layer>\d+)/routing_hist",
        "expert_load.routed",
        "expert_load",
        "Marin grug MoE",
        "a histogram over expert ids: bucket i holds expert i's assignments",
    ),
    Name(
        r"train/router/routing_counts_per_layer",
        "expert_load.routed",
        "expert_load",
        "Marin grug MoE",
        "a layers x experts array of assignments; not a scalar, so not kept as a metric",
    ),
    Name(r"moe/drop_fraction", "moe/drop_fraction", "metric", "Marin grug MoE", "same name and meaning"),
    Name(
        r"train/router/layer_(?P<layer>\d+)/capacity_overflow_rate",
        "moe/layer_{layer}/drop_fraction",
        "metric",
        "Marin grug MoE",
        "assignments over capacity / assignments, per layer",
    ),
    Name(
        r"eval/loss",
        "eval (dataset `eval`)",
        "eval",
        "Levanter",
        "micro-averaged over eval sets; bpb from eval/bpb",
    ),
    Name(
        r"eval/(?P<dataset>.+)/loss",
        "eval (dataset = the tag)",
        "eval",
        "Levanter",
        "one eval set (tag); bpb from eval/<tag>/bpb",
    ),
)


@dataclass
class Translated:
    metrics: dict[str, float]  # source names and our names
    loads: dict[int, dict[int, float]]  # layer -> expert -> share of the layer's assignments (Mixtral)
    counts: dict[int, list[int]]  # layer -> routed count per expert (grug)
    evals: dict[str, dict[str, float]]  # dataset -> {loss, bpb}
    claimed: set[str]  # names of `arrays` a row read


def translate(
    flat: dict[str, float], arrays: dict[str, object] | None = None, config: dict[str, object] | None = None
) -> Translated:
    """Apply `NAMES` to one log payload: `flat` scalar metrics, `arrays` non-scalar values by name.

    `arrays` holds numpy arrays (routing counts per layer) and (limits, counts) pairs of histograms.
    `config` is the run's config flattened to dotted keys (for the rows that divide by config
    values); a row whose divisors are missing writes only the source name.
    """
    out = Translated(dict(flat), {}, {}, {}, set())
    arrays = arrays or {}
    for name, value in flat.items():
        row = _match(name)
        if row is None:
            continue
        m = row.pattern.match(name)
        if row.kind == "metric":
            target = row.target.format(**m.groupdict())
            divisor = _divisor(row, config or {})
            if target != name and divisor:
                out.metrics[target] = value / divisor
        elif row.kind == "expert_load":
            out.loads.setdefault(int(m["layer"]), {})[int(m["expert"])] = value
        elif row.kind == "eval":
            ds = m.groupdict().get("dataset") or "eval"
            entry = out.evals.setdefault(ds, {})
            entry["loss"] = value
            bpb = flat.get(name[: -len("loss")] + "bpb")
            if bpb is not None and math.isfinite(bpb):
                entry["bpb"] = bpb
    for name, value in arrays.items():
        row = _match(name)
        if row is None or row.kind != "expert_load":
            continue
        m = row.pattern.match(name)
        out.claimed.add(name)
        if "layer" in m.groupdict() and isinstance(value, tuple):  # routing_hist: (limits, counts)
            out.counts[int(m["layer"])] = _counts(value[1])
        elif getattr(value, "ndim", 0) == 2:  # routing_counts_per_layer: layers x experts
            for layer, row_counts in enumerate(value):
                out.counts.setdefault(layer, _counts(row_counts))
    return out


def _divisor(row: Name, config: dict[str, object]) -> float | None:
    d = 1.0
    for key in row.divide_by:
        v = config.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v:
            return None
        d *= v
    return d


def _counts(values) -> list[int]:
    return [max(0, int(round(float(v)))) for v in values]


def _match(name: str) -> Name | None:
    for row in NAMES:
        if row.pattern.match(name):
            return row
    return None


def markdown_table() -> str:
    """`NAMES` as docs/levanter.md's Markdown table."""
    lines = ["| Levanter / Marin name | becomes | origin | note |", "|---|---|---|---|"]
    for row in NAMES:
        shown = row.source.replace(r"(?P<layer>\d+)", "{i}").replace(r"(?P<expert>\d+)", "{j}")
        shown = shown.replace(r"(?P<dataset>.+)", "<tag>").replace("(?:train/)?", "[train/]")
        target = row.target.replace("{layer}", "{i}")
        shown = shown.replace(r"(?P<param>.+)", "<param>")
        target = target.replace("{param}", "<param>")
        if row.kind == "metric":
            what = f"`{target}`"
        elif row.kind == "expert_load":
            what = "`expert_load` event (`routed`)"
        else:
            what = "`eval` event, " + target.split(" ", 1)[1].strip("()")
        lines.append(f"| `{shown}` | {what} | {row.origin} | {row.note} |")
    return "\n".join(lines)
