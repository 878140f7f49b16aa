"""Mixture-of-Experts feed-forward: float32 router, top-k, fixed capacity, expert parallelism.

Routing, per group (a group is ONE SEQUENCE of ``S = T`` tokens, so the drop counts do not depend on
how the batch is spread over devices):

1. router logits ``x @ W_r`` in float32 ``(G, S, E)``; probabilities ``softmax(logits)``.
2. selection: ``top_k(probs)`` (gating ``softmax_topk``) or ``top_k(probs + bias)`` (gating
   ``aux_free``: the per-expert bias is used ONLY to choose experts, never in the gate weights).
3. gate weights: the chosen experts' probabilities, renormalised to sum to 1 when ``top_k > 1``
   (with ``top_k == 1`` the raw probability is kept so the router still gets a gradient).
4. capacity ``C = ceil(capacity_factor * S * top_k / n_routed)`` slots per expert per group.
5. position in expert by cumulative sum, in PRIORITY ORDER: first every token's 1st choice (in token
   order), then every token's 2nd choice (in token order), and so on. An assignment whose position is
   ``>= C`` is dropped; its token still flows on through the residual stream. ``dropped`` counts these
   assignments exactly; ``routed`` counts all ``S * top_k`` assignments the router made.
   This is the Switch/GShard convention (first choices are protected). Like them it is not strictly
   causal: whether token t's 2nd choice is dropped can depend on LATER tokens' 1st choices. Without
   drops (enough capacity) the layer is exactly causal; a test checks that.
6. dispatch into a fixed ``[E, C, D]`` buffer per group (scatter by slot index, not a one-hot einsum),
   ``all_to_all`` over ``'expert'`` so each device holds its ``E / n_expert`` experts' slots from every
   device, batched SwiGLU expert FFN (einsum), ``all_to_all`` back, weighted combine (gather).

Statistics (routed/dropped counts, router z-loss, load-balancing loss, router entropy) are reduced over
the whole global batch with ``jax.lax.psum`` inside the ``shard_map``: no host callbacks.

``moe_reference`` is a plain single-device implementation of the same layer (one-hot dispatch and
combine tensors, a Python loop over top-k ranks for the positions) used by the equivalence tests.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from trainer.mesh import BATCH_AXES, EXPERT_AXIS, EXPERT_SHARDED

__all__ = [
    "MoE",
    "MoEStats",
    "RouterBias",
    "SwiGLU",
    "capacity",
    "moe_forward",
    "moe_reference",
    "normal_init",
]


class RouterBias(nnx.Variable):
    """Aux-loss-free balancing bias ``(E,)``. Only chooses experts; excluded from the optimizer
    (it is not an ``nnx.Param``) and therefore from weight decay. Updated by
    ``trainer.model.update_router_bias`` after each step."""


class MoEStats(NamedTuple):
    """Per-layer MoE statistics, already reduced over the global batch."""

    routed: jax.Array  # int32 (E,): assignments the router made (before capacity)
    dropped: jax.Array  # int32 (E,): assignments cut by capacity
    router_z: jax.Array  # f32 (): mean over tokens of logsumexp(router_logits)^2
    lb: jax.Array  # f32 (): Switch load-balancing loss, 1.0 at perfect balance
    entropy: jax.Array  # f32 (): mean over tokens of the router distribution's entropy (nats)


def normal_init(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> jax.Array:
    """float32 N(0, std^2) drawn on the host with numpy from a key of ``rngs.params()``.

    Deterministic in the nnx seed like ``jax.random``, but without compiling one XLA program per
    parameter shape (eager jax.random init costs seconds of compile on CPU for a small model).
    """
    key = rngs.params()
    if isinstance(key, jax.core.Tracer):  # under jit / nnx.eval_shape: stay traceable
        return jax.random.normal(key, shape, jnp.float32) * std
    seed = np.asarray(jax.random.key_data(key), np.uint32).ravel().tolist()
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape, np.float32) * np.float32(std))


def capacity(capacity_factor: float, group_tokens: int, top_k: int, n_routed: int) -> int:
    """Slots per expert per group: ``ceil(capacity_factor * group_tokens * top_k / n_routed)``."""
    # the 1e-9 keeps float noise (0.55 * 100 * 3 / 3 = 55.00000000000001) from adding a whole slot
    return max(1, math.ceil(capacity_factor * group_tokens * top_k / n_routed - 1e-9))


def _swiglu(x, w_gate, w_up, w_down):
    """SwiGLU ``(silu(x W_g) * (x W_u)) W_d``; x ``(..., D)``, w_gate/w_up ``(D, F)``, w_down ``(F, D)``."""
    return (jax.nn.silu(x @ w_gate) * (x @ w_up)) @ w_down


class SwiGLU(nnx.Module):
    """Dense SwiGLU FFN (dense layers and the fused shared experts)."""

    def __init__(self, d_model: int, d_hidden: int, *, rngs: nnx.Rngs, dtype, out_std: float):
        self.w_gate = nnx.Param(normal_init(rngs, (d_model, d_hidden), 0.02))
        self.w_up = nnx.Param(normal_init(rngs, (d_model, d_hidden), 0.02))
        self.w_down = nnx.Param(normal_init(rngs, (d_hidden, d_model), out_std))
        self.dtype = dtype

    def __call__(self, x):  # (B, T, D) -> (B, T, D)
        dt = self.dtype
        return _swiglu(
            x.astype(dt), self.w_gate[...].astype(dt), self.w_up[...].astype(dt), self.w_down[...].astype(dt)
        )


# ----------------------------------------------------------------------------------------------
# Routing shared by the fast path (the reference re-derives positions on its own).


def _router(x, router_w, bias, *, top_k: int, aux_free: bool):
    """x ``(G, S, D)`` -> logits/probs ``(G, S, E)`` f32, expert ids ``(G, S, k)``, gates ``(G, S, k)`` f32."""
    logits = jnp.einsum("gsd,de->gse", x.astype(jnp.float32), router_w.astype(jnp.float32))
    probs = jax.nn.softmax(logits, axis=-1)
    select = probs + jax.lax.stop_gradient(bias) if aux_free else probs
    _, idx = jax.lax.top_k(select, top_k)  # (G, S, k)
    gate = jnp.take_along_axis(probs, idx, axis=-1)
    if top_k > 1:
        gate = gate / jnp.sum(gate, axis=-1, keepdims=True)
    return logits, probs, idx, gate


def _positions(idx, n_routed: int):
    """Position of each assignment inside its expert, priority (rank, token).

    idx ``(G, S, k)`` -> pos ``(G, S, k)`` int32, and the one-hot mask ``(G, S, k, E)``.
    """
    g, s, k = idx.shape
    mask = jax.nn.one_hot(idx, n_routed, dtype=jnp.int32)  # (G, S, k, E)
    ranked = mask.transpose(0, 2, 1, 3).reshape(g, k * s, n_routed)  # rank-major, then token order
    pos = jnp.cumsum(ranked, axis=1) - 1
    pos = jnp.sum(pos * ranked, axis=-1).reshape(g, k, s).transpose(0, 2, 1)  # (G, S, k)
    return pos, mask


def _stats_local(logits, probs, mask, keep):
    """Local sums that are psum'd to global stats. Returns a dict of partial sums."""
    lse = jax.nn.logsumexp(logits, axis=-1)  # (G, S)
    ent = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
    routed = jnp.sum(mask, axis=(0, 1, 2))  # (E,)
    dropped = jnp.sum(mask * (~keep)[..., None].astype(jnp.int32), axis=(0, 1, 2))
    return dict(
        routed=routed.astype(jnp.int32),
        dropped=dropped.astype(jnp.int32),
        z_sum=jnp.sum(lse**2),
        ent_sum=jnp.sum(ent),
        prob_sum=jnp.sum(probs, axis=(0, 1)),  # (E,)
    )


def _finish_stats(s, n_tokens: int, top_k: int, n_routed: int) -> MoEStats:
    """Global sums -> MoEStats. The Switch load-balancing loss is

        lb = E * sum_e f_e * P_e,   f_e = routed_e / (N * k),   P_e = mean_tokens(prob_e)

    with N the global token count; f and P each sum to 1, so lb == 1 at perfect balance (f = P = 1/E)
    and lb == E when all tokens go to one expert with probability 1. Gradient flows through P only.
    """
    f = jax.lax.stop_gradient(s["routed"].astype(jnp.float32)) / (n_tokens * top_k)
    p_mean = s["prob_sum"] / n_tokens
    return MoEStats(
        routed=s["routed"],
        dropped=s["dropped"],
        router_z=s["z_sum"] / n_tokens,
        lb=n_routed * jnp.sum(f * p_mean),
        entropy=s["ent_sum"] / n_tokens,
    )


def _moe_local(
    x, router_w, bias, w_gate, w_up, w_down, *, top_k, capacity_factor, aux_free, dtype, ep_size, reduce_axes
):
    """The per-device body. x ``(G, S, D)`` local sequences; w_* hold this device's ``E/ep`` experts.

    Returns y ``(G, S, D)`` and the globally reduced partial sums.
    """
    g, s, d = x.shape
    e_local = w_gate.shape[0]
    n_routed = e_local * ep_size
    c = capacity(capacity_factor, s, top_k, n_routed)
    logits, probs, idx, gate = _router(x, router_w, bias, top_k=top_k, aux_free=aux_free)
    pos, mask = _positions(idx, n_routed)
    keep = pos < c  # (G, S, k)
    # Slot in the flat (E*C) buffer; dropped assignments point past the end and are dropped by scatter.
    slot = jnp.where(keep, idx * c + pos, n_routed * c).reshape(g, s * top_k)
    xs = jnp.repeat(x.astype(dtype), top_k, axis=1)  # (G, S*k, D), assignment order (token, rank)

    def scatter(slot_g, x_g):
        return jnp.zeros((n_routed * c, d), dtype).at[slot_g].add(x_g, mode="drop")

    buf = jax.vmap(scatter)(slot, xs).reshape(g, n_routed, c, d)  # (G, E, C, D)
    buf = buf.transpose(1, 0, 2, 3).reshape(n_routed, g * c, d)  # (E, G*C, D)
    if ep_size > 1:
        # Send expert block j to device j; receive (E/ep, ep*G*C, D): my experts, every device's slots.
        buf = jax.lax.all_to_all(buf, EXPERT_AXIS, split_axis=0, concat_axis=1, tiled=True)
    h = jax.nn.silu(jnp.einsum("ecd,edf->ecf", buf, w_gate.astype(dtype)))
    h = h * jnp.einsum("ecd,edf->ecf", buf, w_up.astype(dtype))
    out = jnp.einsum("ecf,efd->ecd", h, w_down.astype(dtype))  # (E/ep, ep*G*C, D)
    if ep_size > 1:
        out = jax.lax.all_to_all(out, EXPERT_AXIS, split_axis=1, concat_axis=0, tiled=True)
    out = out.reshape(n_routed, g, c, d).transpose(1, 0, 2, 3).reshape(g, n_routed * c, d)

    def gather(out_g, slot_g):
        return out_g.at[slot_g].get(mode="fill", fill_value=0)

    ys = jax.vmap(gather)(out, slot).reshape(g, s, top_k, d)  # dropped -> 0
    y = jnp.sum(ys.astype(jnp.float32) * gate[..., None], axis=2).astype(dtype)
    st = _stats_local(logits, probs, mask, keep)
    if reduce_axes:
        st = jax.lax.psum(st, reduce_axes)
    return y, st


def moe_forward(
    x,
    router_w,
    bias,
    w_gate,
    w_up,
    w_down,
    *,
    top_k: int,
    capacity_factor: float,
    aux_free: bool,
    dtype=jnp.float32,
    mesh: Mesh | None = None,
):
    """Routed-expert part of the MoE layer. x ``(B, T, D)``; router_w ``(D, E)``; bias ``(E,)``;
    w_gate/w_up ``(E, D, F)``; w_down ``(E, F, D)``. Returns y ``(B, T, D)`` and ``MoEStats``.

    With a mesh, runs inside ``jax.shard_map``: batch over ('data', 'expert'), experts over 'expert'.
    ``B`` must be divisible by the mesh size and ``E`` by the 'expert' axis size.
    """
    b, t, _ = x.shape
    n_routed = w_gate.shape[0]
    kw = dict(top_k=top_k, capacity_factor=capacity_factor, aux_free=aux_free, dtype=dtype)
    if mesh is None or mesh.size == 1:
        y, st = _moe_local(x, router_w, bias, w_gate, w_up, w_down, ep_size=1, reduce_axes=(), **kw)
    else:
        ep = mesh.shape[EXPERT_AXIS]
        if n_routed % ep:
            raise ValueError(
                f"n_routed={n_routed} is not divisible by mesh expert={ep}; choose "
                f"n_routed as a multiple of the expert-parallel size"
            )
        if b % mesh.size:
            raise ValueError(f"batch {b} is not divisible by the mesh size {mesh.size}")
        body = jax.shard_map(
            lambda *a: _moe_local(*a, ep_size=ep, reduce_axes=BATCH_AXES, **kw),
            mesh=mesh,
            in_specs=(P(BATCH_AXES), P(), P(), P(EXPERT_AXIS), P(EXPERT_AXIS), P(EXPERT_AXIS)),
            out_specs=(P(BATCH_AXES), P()),
        )
        y, st = body(x, router_w, bias, w_gate, w_up, w_down)
    return y, _finish_stats(st, b * t, top_k, n_routed)


def moe_reference(
    x, router_w, bias, w_gate, w_up, w_down, *, top_k: int, capacity_factor: float, aux_free: bool
):
    """Plain single-device float32 reference of ``moe_forward`` (same arguments, same outputs).

    One-hot dispatch/combine tensors ``(G, S, E, C)`` and a Python loop over top-k ranks for the
    in-expert positions: written for clarity, not speed.
    """
    x = x.astype(jnp.float32)
    g, s, _ = x.shape
    n_routed = w_gate.shape[0]
    c = capacity(capacity_factor, s, top_k, n_routed)
    logits = jnp.einsum("gsd,de->gse", x, router_w)
    probs = jax.nn.softmax(logits, axis=-1)
    select = probs + jax.lax.stop_gradient(bias) if aux_free else probs
    _, idx = jax.lax.top_k(select, top_k)
    gate = jnp.take_along_axis(probs, idx, axis=-1)
    if top_k > 1:
        gate = gate / gate.sum(-1, keepdims=True)
    filled = jnp.zeros((g, 1, n_routed), jnp.int32)  # slots already taken per expert
    dispatch = jnp.zeros((g, s, n_routed, c), jnp.float32)
    combine = jnp.zeros((g, s, n_routed, c), jnp.float32)
    dropped = jnp.zeros((n_routed,), jnp.int32)
    for r in range(top_k):  # rank r of every token before rank r+1 of any token
        onehot = jax.nn.one_hot(idx[:, :, r], n_routed, dtype=jnp.int32)  # (G, S, E)
        pos = jnp.cumsum(onehot, axis=1) - 1 + filled  # (G, S, E), valid where onehot
        filled = filled + onehot.sum(axis=1, keepdims=True)
        kept = onehot * (pos < c)
        dropped = dropped + (onehot - kept).sum(axis=(0, 1))
        d_r = kept[..., None] * jax.nn.one_hot(pos, c, dtype=jnp.int32)  # (G, S, E, C)
        dispatch = dispatch + d_r
        combine = combine + d_r * gate[:, :, r, None, None]
    expert_in = jnp.einsum("gsec,gsd->egcd", dispatch, x)
    h = jax.nn.silu(jnp.einsum("egcd,edf->egcf", expert_in, w_gate))
    h = h * jnp.einsum("egcd,edf->egcf", expert_in, w_up)
    expert_out = jnp.einsum("egcf,efd->egcd", h, w_down)
    y = jnp.einsum("gsec,egcd->gsd", combine, expert_out)
    n = g * s
    routed = jax.nn.one_hot(idx, n_routed, dtype=jnp.int32).sum(axis=(0, 1, 2))
    lse = jax.nn.logsumexp(logits, axis=-1)
    ent = -jnp.sum(probs * jnp.log(jnp.maximum(probs, 1e-30)), axis=-1)
    f = routed.astype(jnp.float32) / (n * top_k)
    stats = MoEStats(
        routed=routed,
        dropped=dropped,
        router_z=jnp.mean(lse**2),
        lb=n_routed * jnp.sum(f * probs.mean(axis=(0, 1))),
        entropy=jnp.mean(ent),
    )
    return y, stats


class MoE(nnx.Module):
    """MoE FFN: ``n_shared`` always-on shared experts (fused into one SwiGLU of width
    ``n_shared * d_shared``, which equals their sum) plus ``n_routed`` routed experts of width
    ``d_expert`` chosen top-k by a float32 router.

    Parameters: ``router`` ``(D, E)`` f32; ``w_gate``/``w_up`` ``(E, D, F)`` and ``w_down`` ``(E, F, D)``
    (marked ``expert_sharded``: split over the 'expert' mesh axis); ``router_bias`` ``(E,)`` RouterBias.
    """

    def __init__(self, cfg, *, rngs: nnx.Rngs, mesh: Mesh | None = None, out_std: float = 0.02):
        d, e, f = cfg.d_model, cfg.n_routed, cfg.d_expert
        self.router = nnx.Param(normal_init(rngs, (d, e), 0.02))
        self.w_gate = nnx.Param(normal_init(rngs, (e, d, f), 0.02), **{EXPERT_SHARDED: True})
        self.w_up = nnx.Param(normal_init(rngs, (e, d, f), 0.02), **{EXPERT_SHARDED: True})
        self.w_down = nnx.Param(normal_init(rngs, (e, f, d), out_std), **{EXPERT_SHARDED: True})
        self.router_bias = RouterBias(jnp.asarray(np.zeros((e,), np.float32)))
        self.shared = (
            SwiGLU(d, cfg.n_shared * cfg.d_shared, rngs=rngs, dtype=cfg.compute_dtype, out_std=out_std)
            if cfg.n_shared > 0
            else None
        )
        self.top_k = cfg.top_k
        self.capacity_factor = cfg.capacity_factor
        self.aux_free = cfg.gating == "aux_free"
        self.dtype = cfg.compute_dtype
        self.mesh = mesh

    def __call__(self, x) -> tuple[jax.Array, MoEStats]:  # x (B, T, D)
        y, stats = moe_forward(
            x,
            self.router[...],
            self.router_bias[...],
            self.w_gate[...],
            self.w_up[...],
            self.w_down[...],
            top_k=self.top_k,
            capacity_factor=self.capacity_factor,
            aux_free=self.aux_free,
            dtype=self.dtype,
            mesh=self.mesh,
        )
        if self.shared is not None:
            y = y + self.shared(x)
        return y, stats
