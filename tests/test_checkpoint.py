"""orbax checkpoints of the real model and optimizer: round trip, meta, sizes, references."""

from __future__ import annotations

import numpy as np
import optax
import pytest
from flax import nnx

from trainer.checkpoint import Checkpointer, parse_ref, train_state
from trainer.model import TRAINABLE, ModelConfig, Transformer

pytestmark = pytest.mark.slow  # builds real models (JAX init) and writes real orbax checkpoints

CFG = ModelConfig(d_model=32, n_layers=1, n_heads=2, seq_len=16, n_routed=4, top_k=2)


def _make(seed):
    model = Transformer(CFG, rngs=nnx.Rngs(seed))
    return model, nnx.Optimizer(model, optax.adam(1e-3), wrt=TRAINABLE)


def _flat(model, opt):
    import jax

    return [np.asarray(x) for x in jax.tree.leaves(train_state(model, opt))]


@pytest.mark.parametrize("async_save", [True, False])
def test_round_trip_restores_model_and_optimizer(tmp_path, async_save):
    model, opt = _make(0)
    opt.step[...] = 7  # optimizer state that must survive too
    ck = Checkpointer(tmp_path / "ck", keep=2, async_save=async_save)
    assert ck.save(5, model, opt, {"config": {"steps": 9}, "lr_scale": 0.5})
    assert not ck.save(5, model, opt, {})  # already there
    done = ck.completed(wait=True)
    assert [(s, p.name) for s, p, _ in done] == [(5, "5")] and done[0][2] > 1000
    assert ck.completed() == []  # each save reported once

    other, other_opt = _make(1)
    assert not all(
        np.array_equal(a, b) for a, b in zip(_flat(model, opt), _flat(other, other_opt), strict=True)
    )
    meta = ck.restore(5, other, other_opt)
    assert meta == {"config": {"steps": 9}, "lr_scale": 0.5, "step": 5}
    assert all(np.array_equal(a, b) for a, b in zip(_flat(model, opt), _flat(other, other_opt), strict=True))
    assert int(other_opt.step[...]) == 7
    ck.close()


def test_keep_latest_and_resolve(tmp_path):
    model, opt = _make(0)
    ck = Checkpointer(tmp_path / "ck", keep=2, async_save=False)
    for s in (1, 2, 3):
        ck.save(s, model, opt, {"s": s})
    ck.completed(wait=True)
    assert ck.steps() == [2, 3] and ck.latest() == 3 and ck.resolve(None) == 3
    assert ck.meta(2)["s"] == 2
    with pytest.raises(ValueError, match=r"no checkpoint at step 1 .* there are \[2, 3\]"):
        ck.resolve(1)
    ck.close()
    with pytest.raises(ValueError, match="no checkpoints in"):
        Checkpointer(tmp_path / "empty", read_only=True).resolve(None)


def test_parse_ref():
    assert parse_ref("run-1", need_step=False) == ("run-1", None)
    assert parse_ref("run-1@40", need_step=True) == ("run-1", 40)
    with pytest.raises(ValueError, match="needs the checkpoint step"):
        parse_ref("run-1", need_step=True)
    with pytest.raises(ValueError, match="expected RUN or RUN@STEP"):
        parse_ref("bad/run@x", need_step=False)
