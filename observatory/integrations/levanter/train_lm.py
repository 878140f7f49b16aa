"""`python -m observatory.integrations.levanter.train_lm --config_path CFG`: Levanter's train_lm, with our tracker.

Levanter finds tracker types only among the classes that have been imported (draccus has no
entry points), so this launcher imports `observatory.integrations.levanter` first and then runs
Levanter's own `levanter.main.train_lm.main` with the same arguments.

One change to what that main builds: its `Trainer` wraps the loss function in Levanter's own
`defer_tracker_for_jit`. Models that call `jit_log` inside the loss (Mixtral logs its router
statistics there) otherwise crash the differentiated step with "IO callbacks do not support
JVP"; deferred, the values leave the step as loss metrics, which Levanter's trainer logs with
the step, prefixed `train/`. A model that calls no `jit_log` in its loss is unaffected.
"""

from __future__ import annotations

import functools
from typing import Any

import levanter
import levanter.main.train_lm as levanter_train_lm
from levanter.metrics import Metric, ReductionType
from levanter.tracker import defer_tracker_for_jit
from levanter.trainer import Trainer

import observatory.integrations.levanter  # noqa: F401  (registers `type: observatory`)

__all__ = ["DeferringTrainer", "deferred_loss", "main"]


def deferred_loss(loss_fn):
    """`loss_fn` with its `jit_log` calls captured and returned as metrics instead of IO callbacks."""

    @functools.wraps(loss_fn)
    def loss(model, *args: Any, **kwargs: Any):
        with defer_tracker_for_jit() as logged:
            out = loss_fn(model, *args, **kwargs)
        value, metrics = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
        # the trainer prefixes loss metrics with `train/`: names that have it already keep one.
        # Router shares and losses average over microbatches.
        extra = {
            k.removeprefix("train/"): Metric.from_value(v, ReductionType.MEAN) for k, v in logged.items()
        }
        return value, {**extra, **dict(metrics)}

    return loss


class DeferringTrainer(Trainer):
    """Levanter's `Trainer`, with the loss function wrapped by `deferred_loss`."""

    def __init__(self, config, optimizer, loss_fn, **kwargs: Any):
        super().__init__(config, optimizer, deferred_loss(loss_fn), **kwargs)


def main() -> None:
    levanter_train_lm.Trainer = DeferringTrainer  # train_lm.main builds its trainer by this module name
    levanter.config.main(levanter_train_lm.main)()


if __name__ == "__main__":
    main()
