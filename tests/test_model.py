"""Transformer: config validation, loss terms by hand, sharded == single device, aux-free bias."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from trainer.flops import flops_per_token, param_breakdown, param_counts  # noqa: E402
from trainer.mesh import make_mesh, shard_batch  # noqa: E402
from trainer.model import (  # noqa: E402
    BIAS,
    TRAINABLE,
    ModelConfig,
    Transformer,
    loss_fn,
    make_train_step,
    moe_layers,
    update_router_bias,
)

TINY = dict(d_model=32, n_layers=2, n_heads=2, seq_len=16, n_routed=8, top_k=2, d_ff=64)


def _batch(b=8, t=16, seed=0):
    return jax.random.randint(jax.random.key(seed), (b, t + 1), 0, 256, dtype=jnp.int32)


@pytest.mark.parametrize(
    "kw,field",
    [
        (dict(d_model=30, n_heads=4), "n_heads"),
        (dict(top_k=9, n_routed=8), "top_k"),
        (dict(capacity_factor=0.0), "capacity_factor"),
        (dict(gating="sigmoid"), "gating"),
        (dict(dtype="float16"), "dtype"),
        (dict(lb_coef=-1.0), "lb_coef"),
        (dict(moe_every=0), "moe_every"),
    ],
)
def test_config_errors_name_the_field(kw, field):
    with pytest.raises(ValueError, match=rf"model\.{field}="):
        ModelConfig(**kw)


def test_config_derives_widths():
    cfg = ModelConfig(d_model=64, n_heads=4)
    assert (cfg.head_dim, cfg.d_ff, cfg.d_expert, cfg.d_shared) == (16, 256, 128, 128)
    assert moe_layers(ModelConfig(n_layers=5, moe_every=2)) == [1, 3]


def test_param_counts_match_the_model():
    cfg = ModelConfig(**{**TINY, "n_layers": 3, "moe_every": 2, "n_shared": 2})
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    actual = sum(x.size for x in jax.tree.leaves(nnx.state(model, TRAINABLE)))
    total, active = param_counts(cfg)
    assert total == actual
    p = param_breakdown(cfg)
    assert total - active == p["routed_experts"] * (cfg.n_routed - cfg.top_k) // cfg.n_routed
    # training FLOPs: 6 per active matmul weight (all but the embedding gather) plus attention
    attn = 12 * cfg.n_layers * cfg.seq_len * cfg.n_heads * cfg.head_dim
    norms = p["norms"]
    assert flops_per_token(cfg) == 6 * (active - p["embed"] - norms) + attn


@pytest.mark.slow
def test_forward_stats_and_loss_terms_by_hand():
    cfg = ModelConfig(**TINY, capacity_factor=1.0, logit_z_coef=0.1, router_z_coef=0.01, lb_coef=0.05)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    batch = _batch()
    logits, stats = nnx.jit(lambda m, t: m(t))(model, batch[:, :-1])
    loss, aux = nnx.jit(loss_fn)(model, batch)
    assert logits.shape == (8, 16, 256) and logits.dtype == jnp.float32
    assert stats["routed"].shape == (2, 8) and stats["routed"].dtype == jnp.int32
    assert stats["dropped"].shape == (2, 8) and stats["lb"].shape == (2,)
    assert stats["routed"].sum(axis=1).tolist() == [8 * 16 * 2] * 2

    lg = np.asarray(logits, np.float64)
    m = lg.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(lg - m).sum(-1, keepdims=True)))[..., 0]
    tgt = np.take_along_axis(lg, np.asarray(batch[:, 1:])[..., None], -1)[..., 0]
    ce, z = (lse - tgt).mean(), (lse**2).mean()
    np.testing.assert_allclose(aux["train/ce_loss"], ce, rtol=1e-5)
    np.testing.assert_allclose(aux["train/z_loss"], z, rtol=1e-5)
    rz, lb = np.asarray(stats["router_z"]).mean(), np.asarray(stats["lb"]).mean()
    np.testing.assert_allclose(aux["router/z_loss"], rz, rtol=1e-6)
    np.testing.assert_allclose(aux["router/lb_loss"], lb, rtol=1e-6)
    np.testing.assert_allclose(loss, ce + 0.1 * z + 0.01 * rz + 0.05 * lb, rtol=1e-5)
    np.testing.assert_allclose(aux["train/loss"], loss)
    drop = np.asarray(stats["dropped"]).sum() / np.asarray(stats["routed"]).sum()
    assert 0 < drop < 1
    np.testing.assert_allclose(aux["moe/drop_fraction"], drop, rtol=1e-6)
    np.testing.assert_allclose(aux["router/layer_1/lb_loss"], stats["lb"][1])
    assert 1.0 <= float(aux["router/lb_loss"]) < cfg.n_routed
    assert 0 < float(aux["router/entropy"]) <= np.log(cfg.n_routed) + 1e-6


def _loss_and_grads(model, batch):
    grad_fn = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, TRAINABLE), has_aux=True)
    return nnx.jit(grad_fn)(model, batch)


@pytest.mark.slow
def test_sharded_model_matches_single_device():
    cfg = ModelConfig(**TINY, capacity_factor=1.0)
    batch = _batch()
    (loss1, aux1), g1 = _loss_and_grads(Transformer(cfg, rngs=nnx.Rngs(0)), batch)
    mesh = make_mesh(2, 4)
    model8 = Transformer(cfg, rngs=nnx.Rngs(0), mesh=mesh)
    w = model8.layers[0].ffn.w_gate[...]
    assert len({s.device for s in w.addressable_shards}) == 8
    assert w.addressable_shards[0].data.shape == (2, cfg.d_model, cfg.d_expert)  # 8 experts / 4
    (loss8, aux8), g8 = _loss_and_grads(model8, shard_batch(mesh, batch))
    assert int(aux1["stats"]["dropped"].sum()) > 0
    np.testing.assert_array_equal(aux8["stats"]["routed"], aux1["stats"]["routed"])
    np.testing.assert_array_equal(aux8["stats"]["dropped"], aux1["stats"]["dropped"])
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    flat1, flat8 = jax.tree.leaves_with_path(g1), jax.tree.leaves(g8)
    assert len(flat1) == len(flat8)
    for (path, a), b in zip(flat1, flat8, strict=True):
        np.testing.assert_allclose(b, a, rtol=2e-4, atol=2e-6, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_aux_free_bias_balances_and_is_not_optimized():
    cfg = ModelConfig(**{**TINY, "n_layers": 1}, gating="aux_free", bias_rate=0.02, lb_coef=0.0)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    moe = model.layers[0].ffn
    moe.router_bias[...] = jnp.zeros(8).at[0].set(0.3)  # start badly unbalanced: expert 0 everywhere
    batch = _batch()
    fwd = nnx.jit(lambda m, t: m(t)[1]["routed"])

    def imbalance(routed):  # max load over mean load, 1.0 = perfect
        r = np.asarray(routed, np.float64)
        return float((r.max(-1) / r.mean(-1)).max())

    routed0 = fwd(model, batch[:, :-1])
    start = imbalance(routed0)
    assert start > 2.0
    update_router_bias(model, routed0)
    b = np.asarray(moe.router_bias[...])
    assert b[0] == pytest.approx(0.3 - 0.02)  # overloaded expert pushed down by exactly the rate
    assert b[1:][np.asarray(routed0)[0, 1:] < routed0.mean()] == pytest.approx(0.02)
    for _ in range(25):
        update_router_bias(model, fwd(model, batch[:, :-1]))
    assert imbalance(fwd(model, batch[:, :-1])) < 0.6 * start

    # the optimizer (with weight decay) never sees the bias
    opt = nnx.Optimizer(model, optax.adamw(1e-2, weight_decay=0.5), wrt=TRAINABLE)
    assert not jax.tree.leaves(nnx.state(opt, BIAS))
    before = np.asarray(moe.router_bias[...]).copy()
    router_before = np.asarray(moe.router[...]).copy()
    (_, aux), grads = _loss_and_grads(model, batch)
    assert not jax.tree.leaves(nnx.state(grads, BIAS))
    opt.update(model, grads)
    np.testing.assert_array_equal(moe.router_bias[...], before)
    assert not np.allclose(moe.router[...], router_before)  # the trained router weights did move


def test_softmax_topk_ignores_bias_update():
    cfg = ModelConfig(**{**TINY, "n_layers": 1})
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    update_router_bias(model, jnp.arange(8, dtype=jnp.int32)[None])
    assert not np.asarray(model.layers[0].ffn.router_bias[...]).any()


@pytest.mark.slow
def test_causal_in_bfloat16():
    """Changing future tokens never changes earlier logits (with room for every assignment: capacity
    drops are decided per sequence and may depend on later tokens, see trainer/moe.py)."""
    cfg = ModelConfig(**TINY, dtype="bfloat16", capacity_factor=8.0)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    fwd = nnx.jit(lambda m, t: m(t))
    t = _batch(2)[:, :-1]
    t2 = t.at[:, 10:].set((t[:, 10:] + 7) % 256)
    (l1, s1), (l2, _) = fwd(model, t), fwd(model, t2)
    assert l1.dtype == jnp.float32 and bool(jnp.isfinite(l1).all())
    assert int(s1["dropped"].sum()) == 0
    np.testing.assert_array_equal(l1[:, :10], l2[:, :10])
    assert float(jnp.abs(l1[:, 10:] - l2[:, 10:]).max()) > 0


def test_bare_train_step_learns_and_moves_the_router_bias():
    """make_train_step (what the benchmarks time): the loss on a fixed batch falls, the drop fraction
    is a fraction, and the aux-free bias update runs inside the step."""
    model = Transformer(ModelConfig(**TINY, gating="aux_free"), rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(3e-3), wrt=TRAINABLE)
    step, batch = make_train_step(), _batch()
    bias0 = np.array(model.layers[0].ffn.router_bias[...])
    losses = []
    for _ in range(8):
        loss, drop = step(model, opt, batch)
        losses.append(float(loss))
        assert 0.0 <= float(drop) <= 1.0
    assert losses[-1] < losses[0] - 0.1, losses
    assert not np.array_equal(np.array(model.layers[0].ffn.router_bias[...]), bias0)
