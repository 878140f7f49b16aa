"""Checkpoints with orbax: `<runs_dir>/<run>/checkpoints/<step>/{state,meta}`.

`state` is the model's and optimizer's arrays (a pure dict of the nnx states, saved
with their shardings); `meta` is JSON: the resolved config, the step, the LR scale
left by rollbacks, the faults already fired and the tokens seen. Data order needs
no state: batch(step) is a function of (seed, step) (see data.py).

Saves may run in the background (`checkpoint.async_save`); `Checkpointer.completed()`
returns the saves that have landed since the last call so the loop can write one
`checkpoint` event per save with its real size on disk.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from observatory.writer import log_path

__all__ = ["Checkpointer", "parse_ref", "checkpoint_dir", "dir_bytes"]


def checkpoint_dir(runs_dir: str | Path, run_id: str) -> Path:
    """`<runs dir>/<run>/checkpoints`; for a bucket runs dir, beside the writer's local spool of the run."""
    return (log_path(runs_dir, run_id, 0).parent / "checkpoints").resolve()


def parse_ref(ref: str, *, need_step: bool) -> tuple[str, int | None]:
    """'RUN@STEP' or 'RUN' (latest) -> (run, step)."""
    m = re.fullmatch(r"([A-Za-z0-9._-]{1,128})(?:@(\d+))?", ref.strip())
    if not m:
        raise ValueError(f"{ref!r}: expected RUN or RUN@STEP (a run id and an optional checkpoint step)")
    if need_step and m[2] is None:
        raise ValueError(f"{ref!r}: a fork needs the checkpoint step, RUN@STEP")
    return m[1], (int(m[2]) if m[2] is not None else None)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def train_state(model: nnx.Module, optimizer: nnx.Optimizer) -> dict[str, Any]:
    """The arrays a checkpoint holds, as a pure nested dict (router bias included: it is model state)."""
    return {"model": nnx.to_pure_dict(nnx.state(model)), "opt": nnx.to_pure_dict(nnx.state(optimizer))}


def load_train_state(model: nnx.Module, optimizer: nnx.Optimizer, pure: dict[str, Any]) -> None:
    """Put restored arrays back into `model` and `optimizer`, in place."""
    for obj, key in ((model, "model"), (optimizer, "opt")):
        state = nnx.state(obj)
        nnx.replace_by_pure_dict(state, pure[key])
        nnx.update(obj, state)


class Checkpointer:
    """One run's checkpoint directory."""

    def __init__(self, directory: str | Path, *, keep: int = 3, async_save: bool = True, read_only=False):
        self.directory = Path(directory).resolve()
        opts = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            create=not read_only,
            read_only=read_only,
        )
        self.mgr = ocp.CheckpointManager(self.directory, options=opts)
        self._pending: list[int] = []

    # ------------------------------------------------------------------ write

    def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer, meta: dict[str, Any]) -> bool:
        """Start saving `step` (every process must call this). False if it already exists."""
        if step in self.mgr.all_steps():
            return False
        self.mgr.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(train_state(model, optimizer)),
                meta=ocp.args.JsonSave(dict(meta, step=step)),
            ),
            force=True,
        )
        self._pending.append(step)
        return True

    def completed(self, wait: bool = False) -> list[tuple[int, Path, int]]:
        """(step, path, bytes) of saves that finished since the last call."""
        if not self._pending:
            return []
        if wait:
            self.mgr.wait_until_finished()
        elif self.mgr.is_saving_in_progress():
            return []
        done, self._pending = self._pending, []
        out = []
        for step in done:
            path = self.directory / str(step)
            if path.exists():  # max_to_keep may already have removed an old one
                out.append((step, path, dir_bytes(path)))
        return out

    def close(self) -> None:
        self.mgr.wait_until_finished()
        self.mgr.close()

    # ------------------------------------------------------------------- read

    def steps(self) -> list[int]:
        return sorted(self.mgr.all_steps())

    def latest(self) -> int | None:
        return self.mgr.latest_step()

    def resolve(self, step: int | None) -> int:
        steps = self.steps()
        if not steps:
            raise ValueError(f"no checkpoints in {self.directory}")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise ValueError(f"no checkpoint at step {step} in {self.directory}; there are {steps}")
        return step

    def meta(self, step: int) -> dict[str, Any]:
        return dict(self.mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"])

    def restore(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer) -> dict[str, Any]:
        """Load `step` into `model` and `optimizer` (in place, onto their current shardings); return meta."""
        target = train_state(model, optimizer)
        abstract = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=getattr(a, "sharding", None)), target
        )
        got = self.mgr.restore(
            step,
            args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()),
        )
        load_train_state(model, optimizer, got["state"])
        return dict(got["meta"])
