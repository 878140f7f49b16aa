"""MoE layer: expert-parallel fast path vs the plain reference, capacity and priority, loss values.

Needs 8 simulated CPU devices: XLA_FLAGS is set before jax is first imported (tests/conftest.py sets
the same default for the whole session).
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import math  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from trainer.mesh import make_mesh  # noqa: E402
from trainer.moe import capacity, moe_forward, moe_reference  # noqa: E402

E, D, F, B, S = 8, 16, 24, 8, 16

# jit the layer: eager dispatch compiles every primitive on its own and is far slower on CPU
_fwd = jax.jit(moe_forward, static_argnames=("top_k", "capacity_factor", "aux_free", "mesh"))
_ref = jax.jit(moe_reference, static_argnames=("top_k", "capacity_factor", "aux_free"))


def _params(seed=0, e=E, d=D, f=F):
    k = jax.random.split(jax.random.key(seed), 5)
    return dict(
        router_w=jax.random.normal(k[0], (d, e)) * 0.5,
        w_gate=jax.random.normal(k[1], (e, d, f)) / math.sqrt(d),
        w_up=jax.random.normal(k[2], (e, d, f)) / math.sqrt(d),
        w_down=jax.random.normal(k[3], (e, f, d)) / math.sqrt(f),
    ), jax.random.normal(k[4], (B, S, d))


def _objective(fn, **kw):
    """A scalar that touches the output and every differentiable statistic, plus the stats."""

    def obj(x, router_w, bias, w_gate, w_up, w_down):
        y, st = fn(x, router_w, bias, w_gate, w_up, w_down, **kw)
        r = jnp.sin(jnp.arange(y.size, dtype=jnp.float32).reshape(y.shape))  # fixed probe direction
        return jnp.sum(y * r) + 0.3 * st.lb + 0.1 * st.router_z + 0.2 * st.entropy, st

    return jax.jit(jax.value_and_grad(obj, argnums=(0, 1, 3, 4, 5), has_aux=True))


@pytest.mark.slow
@pytest.mark.parametrize(
    "mesh_shape,gating,top_k",
    [
        ((1, 1), "softmax_topk", 2),
        ((2, 4), "softmax_topk", 2),
        ((1, 8), "aux_free", 2),
        ((2, 4), "aux_free", 1),
    ],
)
def test_expert_parallel_matches_reference(mesh_shape, gating, top_k):
    p, x = _params()
    aux_free = gating == "aux_free"
    bias = jnp.linspace(-0.2, 0.2, E) if aux_free else jnp.zeros(E)
    kw = dict(top_k=top_k, capacity_factor=1.0, aux_free=aux_free)
    args = (x, p["router_w"], bias, p["w_gate"], p["w_up"], p["w_down"])
    (ref_val, ref_st), ref_g = _objective(moe_reference, **kw)(*args)
    mesh = make_mesh(*mesh_shape)
    (val, st), g = _objective(moe_forward, mesh=mesh, **kw)(*args)

    # capacity_factor=1.0 with random routing must actually drop something, or this proves little
    assert int(ref_st.dropped.sum()) > 0
    np.testing.assert_array_equal(np.asarray(st.routed), np.asarray(ref_st.routed))
    np.testing.assert_array_equal(np.asarray(st.dropped), np.asarray(ref_st.dropped))
    assert int(st.routed.sum()) == B * S * top_k
    np.testing.assert_allclose(val, ref_val, rtol=1e-5, atol=1e-4)
    for name in ("router_z", "lb", "entropy"):
        np.testing.assert_allclose(getattr(st, name), getattr(ref_st, name), rtol=1e-5, err_msg=name)
    for a, b, name in zip(g, ref_g, ("x", "router_w", "w_gate", "w_up", "w_down"), strict=True):
        assert float(jnp.abs(b).max()) > 0, name
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"grad {name}")


def _one_expert_params(first: int, second: int, e=4, d=D):
    """Router that sends every token (positive inputs) first to ``first``, then to ``second``."""
    router_w = jnp.zeros((d, e)).at[:, first].set(1.0).at[:, second].set(0.5)
    p, _ = _params(e=e)
    p["router_w"] = router_w
    return p


@pytest.mark.parametrize("mesh_shape", [(1, 1), (2, 2)])
def test_capacity_every_token_to_one_expert(mesh_shape):
    e, cf = 4, 1.0
    p = _one_expert_params(first=3, second=1, e=e)
    x = jnp.abs(jax.random.normal(jax.random.key(1), (B, S, D))) + 0.1  # positive -> logits ordered
    mesh = make_mesh(*mesh_shape)
    # top-1: C = ceil(1.0 * 16 * 1 / 4) = 4 slots; expert 3 gets all 16 tokens of each of the 8 groups.
    c = capacity(cf, S, 1, e)
    assert c == 4
    assert capacity(0.55, 100, 3, 3) == 55  # float noise (55.00000000000001) must not add a slot
    assert capacity(1.25, 16, 2, 8) == 5 and capacity(0.01, 16, 1, 8) == 1
    # the router and experts as arguments, without the aux-free bias (zeros)
    args = (x, p["router_w"], jnp.zeros(e), p["w_gate"], p["w_up"], p["w_down"])
    y, st = _fwd(*args, top_k=1, capacity_factor=cf, aux_free=False, mesh=mesh)
    assert st.routed.tolist() == [0, 0, 0, B * S]
    assert st.dropped.tolist() == [0, 0, 0, B * (S - c)]
    # the kept assignments are the FIRST c tokens of every group (token order within a rank)
    kept = np.abs(np.asarray(y)).sum(-1) > 0  # (B, S)
    assert kept[:, :c].all() and not kept[:, c:].any()
    # top-2: C = 8; expert 3 takes every token's first choice, expert 1 every second choice.
    y2, st2 = _fwd(*args, top_k=2, capacity_factor=cf, aux_free=False, mesh=mesh)
    c2 = capacity(cf, S, 2, e)
    assert c2 == 8
    assert st2.routed.tolist() == [0, B * S, 0, B * S]
    assert st2.dropped.tolist() == [0, B * (S - c2), 0, B * (S - c2)]
    _, ref = _ref(*args, top_k=2, capacity_factor=cf, aux_free=False)
    assert ref.dropped.tolist() == st2.dropped.tolist()


def test_priority_is_rank_then_token():
    """E=2, k=2, C=S/2: tokens 0..3 prefer expert 0, tokens 4..7 prefer expert 1. First choices win
    over earlier tokens' second choices, so every token keeps exactly its first choice."""
    d, s, e = 2, 8, 2
    x = jnp.array([[[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 4])  # (1, 8, 2)
    router_w = jnp.eye(2)
    w_gate = jnp.ones((e, d, 3))
    w_up = jnp.ones((e, d, 3))
    w_down = jnp.stack([jnp.ones((3, d)), -jnp.ones((3, d))])  # expert 0 -> +, expert 1 -> -
    y, st = _fwd(
        x, router_w, jnp.zeros(e), w_gate, w_up, w_down, top_k=2, capacity_factor=0.5, aux_free=False
    )
    assert capacity(0.5, s, 2, e) == 4
    assert st.dropped.tolist() == [4, 4]
    sign = np.sign(np.asarray(y)[0, :, 0])
    assert sign.tolist() == [1.0] * 4 + [-1.0] * 4  # each token got its first-choice expert only
    # gate = first-choice probability after renormalising over both choices = softmax([1, 0])[0]
    p0 = 1 / (1 + math.exp(-1.0))
    h = 3 * (1.0 / (1 + math.exp(-1.0))) * 1.0  # silu(1) * 1, summed over F=3
    np.testing.assert_allclose(np.asarray(y)[0, :4, 0], p0 * h, rtol=1e-6)


def test_router_z_lb_entropy_by_hand():
    # one group of 4 tokens, E = 2, identity router: logits == x
    x = jnp.array([[[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [3.0, 0.0]]])
    e, f = 2, 3
    args = (x, jnp.eye(2), jnp.zeros(e), jnp.zeros((e, 2, f)), jnp.zeros((e, 2, f)), jnp.zeros((e, f, 2)))
    _, st = _fwd(*args, top_k=1, capacity_factor=2.0, aux_free=False)
    rows = [[2.0, 0.0], [0.0, 1.0], [1.0, 0.0], [3.0, 0.0]]
    lse = [math.log(math.exp(a) + math.exp(b)) for a, b in rows]
    probs = [[math.exp(a - m), math.exp(b - m)] for (a, b), m in zip(rows, lse, strict=True)]
    assert st.routed.tolist() == [3, 1]  # top-1 picks: 0, 1, 0, 0
    z = sum(v * v for v in lse) / 4
    p_mean = [sum(p[i] for p in probs) / 4 for i in range(2)]
    lb = 2 * (3 / 4 * p_mean[0] + 1 / 4 * p_mean[1])
    ent = -sum(sum(q * math.log(q) for q in p) for p in probs) / 4
    np.testing.assert_allclose(float(st.router_z), z, rtol=1e-6)
    np.testing.assert_allclose(float(st.lb), lb, rtol=1e-6)
    np.testing.assert_allclose(float(st.entropy), ent, rtol=1e-6)
    # perfect balance: two mirror-image tokens -> f = P = (1/2, 1/2) -> lb == 1 exactly
    xb = jnp.array([[[1.5, 0.0], [0.0, 1.5]]])
    _, stb = _fwd(xb, *args[1:], top_k=1, capacity_factor=2.0, aux_free=False)
    np.testing.assert_allclose(float(stb.lb), 1.0, rtol=1e-6)
    # total collapse onto one expert with probability ~1 -> lb ~ E
    xc = jnp.array([[[40.0, 0.0], [40.0, 0.0]]])
    _, stc = _fwd(xc, *args[1:], top_k=1, capacity_factor=2.0, aux_free=False)
    np.testing.assert_allclose(float(stc.lb), 2.0, rtol=1e-6)


def test_aux_free_bias_only_selects():
    """The bias changes which experts are chosen, never the gate weights' values."""
    p, x = _params()
    big = jnp.zeros(E).at[5].set(10.0)  # forces expert 5 into every token's top-2
    args = (x, p["router_w"], big, p["w_gate"], p["w_up"], p["w_down"])
    _, st = _fwd(*args, top_k=2, capacity_factor=8.0, aux_free=True)
    assert int(st.routed[5]) == B * S
    _, st_plain = _fwd(*args, top_k=2, capacity_factor=8.0, aux_free=False)
    assert int(st_plain.routed[5]) < B * S  # softmax_topk ignores the bias
    # router statistics are computed from the unbiased probabilities in both cases
    np.testing.assert_allclose(st.router_z, st_plain.router_z, rtol=1e-6)
    np.testing.assert_allclose(st.entropy, st_plain.entropy, rtol=1e-6)


def test_bad_mesh_sizes_are_clear():
    p, x = _params()
    with pytest.raises(ValueError, match="n_routed=6 is not divisible by mesh expert=4"):
        _fwd(
            x,
            p["router_w"][:, :6],
            jnp.zeros(6),
            p["w_gate"][:6],
            p["w_up"][:6],
            p["w_down"][:6],
            top_k=2,
            capacity_factor=1.0,
            aux_free=False,
            mesh=make_mesh(2, 4),
        )
    with pytest.raises(ValueError, match="needs 16 devices"):
        make_mesh(4, 4)
