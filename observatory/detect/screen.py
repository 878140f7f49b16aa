"""Which runs of a scan can have a series finding: every run's rules over its rows at once.

An ingest batch of a sweep brings thousands of small runs (20-50 steps each). Their detectors, run by run,
cost a few dozen numpy calls on a few dozen rows each: most of the time of a catch-up of many runs. Here each
detector's rule (`spike_flags`, `dip_flags`, `growth_flags`, `drop_flags`, `throughput_flags` in
`observatory.detect.detectors`) runs once over all the runs' series laid one after another, its rolling
windows kept to each run's own rows (`observatory.detect.rolling.rolling`'s `starts`), so each run's flags are
those it gets alone, bit for bit. A detector finds only where its rule flags a row; a run with no flagged row
finds nothing, and `observatory.detect.scan` skips its series detectors. The others run as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from observatory.detect.detectors import (
    DROP,
    GRAD,
    LOSS,
    THROUGHPUT,
    UPDATE,
    dip_flags,
    drop_flags,
    growth_flags,
    spike_flags,
    throughput_flags,
)
from observatory.detect.thresholds import Thresholds

__all__ = ["loud", "SHORT"]

# a series longer than this is not screened: its own windows cost as much as the screen's, and a run that is
# flagged would pay for both (a hero run's scan)
SHORT = 512

# a rule: (values, thresholds, starts, memo) -> flags; `memo`: the screen's, for the level and noise the
# loss's spike and dip rules share (`rolling.level_noise`)
Rule = Callable[..., np.ndarray]


def _loss_spike(x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None) -> np.ndarray:
    return spike_flags(x, th.loss_z, th.loss_min_rise, th, log=False, starts=starts, memo=memo)[0]


def _loss_dip(x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None) -> np.ndarray:
    return dip_flags(x, th, starts, memo)[0]


def _norm_spike(x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None) -> np.ndarray:
    """The grad norm's spike rule, which the update norm's uses too."""
    return spike_flags(
        x, th.grad_z, th.grad_min_ratio, th, log=True, single=th.grad_single_ratio, starts=starts
    )[0]


def _grad_growth(x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None) -> np.ndarray:
    return growth_flags(x, th, starts)[0]


def _drop_jump(x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None) -> np.ndarray:
    return drop_flags(x, th, starts)[0]


def _throughput_drop(
    x: np.ndarray, th: Thresholds, starts: np.ndarray, memo: dict | None = None
) -> np.ndarray:
    return throughput_flags(x, th, starts)[0]


RULES: dict[str, tuple[Rule, ...]] = {
    LOSS: (_loss_spike, _loss_dip),
    GRAD: (_norm_spike, _grad_growth),
    UPDATE: (_norm_spike,),
    DROP: (_drop_jump,),
    THROUGHPUT: (_throughput_drop,),
}


def rows_needed(rule: Rule, th: Thresholds) -> int:
    """The fewest rows a series needs for `rule` to flag one: `growth_flags` compares a level of the last
    `growth_steps` (half of them at least) with the lowest such level `growth_steps` before it, of
    `min_history` of them at least; a sweep's 50-step runs are too short for it. The other rules: 1 (not
    worth working out: their histories are a few rows)."""
    if rule is not _grad_growth:
        return 1
    k = th.growth_steps
    return k + max(1, k // 2) + max(1, th.min_history) - 1


# metric -> (its values of several runs laid end to end, where each run's begin, the runs): what a rule reads
Columns = Callable[[str], tuple[np.ndarray, np.ndarray, Sequence]]


def loud(th: Thresholds, columns: Columns) -> set:
    """Of the runs whose series `columns` gives, those some series rule (with thresholds `th`) flags a row
    of. The others' series detectors would find nothing."""
    out: set = set()
    memo: dict = {}  # this screen's: the loss's level and noise, once for its spike and dip rules
    for metric, rules in RULES.items():
        x, starts, runs = columns(metric)
        if not len(starts):
            continue
        longest = int(np.diff(np.append(starts, len(x))).max())
        hit = np.zeros(len(starts), bool)
        for rule in rules:
            if longest >= rows_needed(rule, th):
                hit |= np.logical_or.reduceat(rule(x, th, starts, memo), starts)
        out.update(run for run, h in zip(runs, hit.tolist(), strict=True) if h)
    return out
