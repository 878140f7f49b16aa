"""Run lineage: the tree that forks and resumes make, and a lineage's stitched curve.

A run started from another's checkpoint names it in run_start `parent {run, step}`.
`lineage(db, run)` gives the chain root -> ... -> run, the whole tree under the
root, and the stitched curve of one metric: each ancestor up to the step its
child forked at, then the run itself. The dashboard and reports draw that curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from observatory.queries import lineage as q
from observatory.store import using

__all__ = ["Lineage", "lineage", "format_text"]


@dataclass(frozen=True)
class Lineage:
    run: str
    metric: str
    chain: tuple[dict[str, Any], ...]  # root first, ending with `run`; rows of queries.lineage.RUN_COLUMNS
    tree: tuple[dict[str, Any], ...]  # the root's whole tree, each row with `depth`
    curve: tuple[tuple[str, int, float], ...] = field(default=())  # (run, step, value), stitched

    @property
    def root(self) -> str:
        return self.chain[0]["run"]

    @property
    def children(self) -> tuple[dict[str, Any], ...]:
        """Runs forked or resumed from this one (direct children only)."""
        return tuple(r for r in self.tree if r["parent_run"] == self.run and r["run"] != self.run)

    @property
    def segments(self) -> tuple[tuple[str, int | None], ...]:
        """(run, cut step) per chain member: each ancestor ends where the next one forked."""
        runs = [r["run"] for r in self.chain]
        cuts = [self.chain[i + 1]["parent_step"] for i in range(len(runs) - 1)] + [None]
        return tuple(zip(runs, cuts, strict=True))

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "root": self.root,
            "metric": self.metric,
            "chain": list(self.chain),
            "tree": list(self.tree),
            "segments": [{"run": r, "until_step": s} for r, s in self.segments],
            "curve": [
                {"run": r, "step": s, "value": (v if math.isfinite(v) else str(v))} for r, s, v in self.curve
            ],
        }


def lineage(db, run: str, metric: str = "train/loss") -> Lineage:
    """The lineage of `run` from the store (a path or an open connection). ValueError if unknown."""
    with using(db) as con:
        if q.run_row(con, run) is None:
            raise ValueError(f"no run {run!r} in the store (see `observatory runs`)")
        chain = q.ancestors(con, run)
        if not chain or chain[-1]["run"] != run:  # a parent cycle: show just the run
            chain = [q.run_row(con, run)]
        tree = q.subtree(con, chain[0]["run"])
        li = Lineage(run, metric, tuple(chain), tuple(tree))
        return Lineage(
            run, metric, li.chain, li.tree, tuple(q.stitched_curve(con, list(li.segments), metric))
        )


def format_text(li: Lineage) -> str:
    """The root's tree, indented, marking `li.run` and each fork step."""
    lines = [f"lineage of {li.run} (root {li.root}, {len(li.chain)} in chain, {len(li.tree)} in tree)"]
    in_chain = {r["run"] for r in li.chain}
    by_parent: dict[str | None, list[dict]] = {}
    for r in li.tree:
        by_parent.setdefault(r["parent_run"] if r["run"] != li.root else None, []).append(r)

    def walk(r: dict, prefix: str, last: bool, top: bool) -> None:
        fork = f" @{r['parent_step']}" if r["parent_step"] is not None and not top else ""
        steps = r["final_step"] if r["final_step"] is not None else r["last_step"]
        mark = "  <- this run" if r["run"] == li.run else (" *" if r["run"] in in_chain else "")
        branch = "" if top else ("`- " if last else "|- ")
        lines.append(f"{prefix}{branch}{r['run']}{fork}  [{r['status'] or '?'}, step {steps}]{mark}")
        kids = [k for k in by_parent.get(r["run"], []) if k["run"] != r["run"]]
        for i, k in enumerate(kids):
            walk(k, prefix + ("" if top else ("   " if last else "|  ")), i == len(kids) - 1, False)

    for i, r in enumerate(by_parent.get(None, [])):
        walk(r, "", i == 0, True)
    if li.curve:
        first, last = li.curve[0], li.curve[-1]
        lines.append(
            f"stitched {li.metric}: {len(li.curve)} points, {first[0]}@{first[1]} -> {last[0]}@{last[1]}"
            f" = {last[2]:.4g}"
        )
    return "\n".join(lines)
