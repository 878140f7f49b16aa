"""Decoder-only MoE transformer (flax nnx): RoPE, RMSNorm, optional QK-norm, MoE FFN every k-th layer.

Public interface used by the training loop::

    cfg = ModelConfig(d_model=128, n_layers=4, ...)
    model = Transformer(cfg, rngs=nnx.Rngs(0), mesh=make_mesh(data, expert))  # mesh optional
    logits, stats = model(tokens)                  # tokens (B, T) int32 -> (B, T, V) f32
    loss, aux = loss_fn(model, batch)              # batch (B, T+1) int32
    opt = nnx.Optimizer(model, tx, wrt=TRAINABLE)  # TRAINABLE = nnx.Param: RouterBias is left out
    grads = nnx.grad(loss_fn, argnums=nnx.DiffState(0, TRAINABLE), has_aux=True)(model, batch)
    update_router_bias(model, aux["stats"]["routed"])   # after each step; no-op unless aux_free

``stats`` (per MoE layer, stacked in layer order, reduced over the global batch inside the step):
``routed`` int32 (L_moe, E), ``dropped`` int32 (L_moe, E), ``router_z`` f32 (L_moe,),
``lb`` f32 (L_moe,), ``entropy`` f32 (L_moe,). ``moe_layers(cfg)`` gives the model-layer index of each.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from trainer.mesh import shard_model
from trainer.moe import MoE, RouterBias, SwiGLU, normal_init

__all__ = [
    "BIAS",
    "TRAINABLE",
    "ModelConfig",
    "Transformer",
    "loss_fn",
    "make_train_step",
    "moe_layers",
    "update_router_bias",
]

# nnx filters the training loop uses: optimise and weight-decay only TRAINABLE; RouterBias is updated
# by update_router_bias and checkpointed with the model state.
TRAINABLE = nnx.Param
BIAS = RouterBias

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclass(frozen=True)
class ModelConfig:
    """Model shape and MoE options. Zero-valued widths are derived in ``__post_init__``."""

    vocab: int = 256  # byte-level tokens
    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    head_dim: int = 0  # 0 -> d_model // n_heads
    seq_len: int = 256  # maximum sequence length (RoPE table size)
    rope_theta: float = 10000.0
    qk_norm: bool = True  # RMSNorm on each head's queries and keys (stabilises attention logits)
    moe_every: int = 1  # layer i is MoE iff (i + 1) % moe_every == 0; other layers use a dense SwiGLU
    d_ff: int = 0  # dense SwiGLU width; 0 -> 4 * d_model
    n_shared: int = 1  # always-on shared experts per MoE layer
    n_routed: int = 8  # routed experts per MoE layer
    top_k: int = 2  # routed experts per token
    d_expert: int = 0  # routed expert width; 0 -> d_ff // 2 (half-width experts, as the 535B design)
    d_shared: int = 0  # width of each shared expert; 0 -> d_expert
    capacity_factor: float = 1.25  # slots per expert = ceil(cf * tokens_per_group * top_k / n_routed)
    router_z_coef: float = 1e-3  # weight of the router z-loss
    lb_coef: float = 1e-2  # weight of the Switch load-balancing loss (set 0 for aux_free gating)
    logit_z_coef: float = 1e-4  # weight of the output-logit z-loss
    gating: Literal["softmax_topk", "aux_free"] = "softmax_topk"
    bias_rate: float = 1e-3  # aux_free: bias step per update, bias += rate * sign(mean_load - load)
    dtype: Literal["float32", "bfloat16"] = "float32"  # compute dtype; params and router stay float32

    def __post_init__(self):
        def bad(field: str, why: str):
            raise ValueError(f"model.{field}={getattr(self, field)!r}: {why}")

        for f in ("vocab", "d_model", "n_layers", "n_heads", "seq_len", "moe_every", "n_routed", "top_k"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                bad(f, "must be an integer >= 1")
        for f in ("head_dim", "d_ff", "d_expert", "d_shared", "n_shared"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 0:
                bad(f, "must be an integer >= 0 (0 derives it from d_model)")
        head_dim = self.head_dim or self.d_model // self.n_heads
        if not self.head_dim and self.d_model % self.n_heads:
            bad("n_heads", f"must divide d_model={self.d_model}, or set head_dim explicitly")
        if head_dim % 2:
            bad("head_dim", f"derived head_dim {head_dim} must be even for RoPE; set head_dim")
        d_ff = self.d_ff or 4 * self.d_model
        d_expert = self.d_expert or max(1, d_ff // 2)
        d_shared = self.d_shared or d_expert
        object.__setattr__(self, "head_dim", head_dim)
        object.__setattr__(self, "d_ff", d_ff)
        object.__setattr__(self, "d_expert", d_expert)
        object.__setattr__(self, "d_shared", d_shared)
        if self.top_k > self.n_routed:
            bad("top_k", f"cannot exceed n_routed={self.n_routed}")
        if not self.capacity_factor > 0:
            bad("capacity_factor", "must be > 0 (1.0 = exactly the balanced load; 1.25 is common)")
        if self.rope_theta <= 0:
            bad("rope_theta", "must be > 0 (10000 is the usual value)")
        for f in ("router_z_coef", "lb_coef", "logit_z_coef", "bias_rate"):
            v = getattr(self, f)
            if not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
                bad(f, "must be a finite number >= 0")
        if self.gating not in ("softmax_topk", "aux_free"):
            bad("gating", "must be 'softmax_topk' or 'aux_free'")
        if self.dtype not in _DTYPES:
            bad("dtype", f"must be one of {sorted(_DTYPES)}")

    @property
    def compute_dtype(self):
        return _DTYPES[self.dtype]

    def is_moe(self, layer: int) -> bool:
        return (layer + 1) % self.moe_every == 0


def moe_layers(cfg: ModelConfig) -> list[int]:
    """Model-layer index of each MoE layer, in the order of the ``stats`` arrays' first axis."""
    return [i for i in range(cfg.n_layers) if cfg.is_moe(i)]


def _rope(x, theta: float):
    """Rotary embedding (rotate-half form). x (B, T, H, Dh) -> same shape."""
    t, dh = x.shape[1], x.shape[-1]
    freqs = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))  # (Dh/2,)
    ang = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs[None, :]  # (T, Dh/2)
    cos, sin = jnp.cos(ang)[None, :, None, :], jnp.sin(ang)[None, :, None, :]
    x1, x2 = jnp.split(x.astype(jnp.float32), 2, axis=-1)
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, computed in float32; learned scale initialised to 1."""

    def __init__(self, dim: int, eps: float = 1e-6):
        self.scale = nnx.Param(jnp.asarray(np.ones((dim,), np.float32)))
        self.eps = eps

    def __call__(self, x):
        x32 = x.astype(jnp.float32)
        return x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps) * self.scale[...]


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, out_std: float):
        hd = cfg.n_heads * cfg.head_dim
        self.wqkv = nnx.Param(normal_init(rngs, (cfg.d_model, 3 * hd), 0.02))  # fused q, k, v
        self.wo = nnx.Param(normal_init(rngs, (hd, cfg.d_model), out_std))
        self.q_norm = RMSNorm(cfg.head_dim) if cfg.qk_norm else None
        self.k_norm = RMSNorm(cfg.head_dim) if cfg.qk_norm else None
        self.n_heads, self.head_dim, self.theta = cfg.n_heads, cfg.head_dim, cfg.rope_theta
        self.dtype = cfg.compute_dtype

    def __call__(self, x):  # (B, T, D) -> (B, T, D)
        b, t, _ = x.shape
        qkv = x.astype(self.dtype) @ self.wqkv[...].astype(self.dtype)
        q, k, v = jnp.split(qkv.reshape(b, t, 3 * self.n_heads, self.head_dim), 3, axis=2)  # (B,T,H,Dh)
        if self.q_norm is not None:
            q, k = self.q_norm(q).astype(self.dtype), self.k_norm(k).astype(self.dtype)
        q, k = _rope(q, self.theta), _rope(k, self.theta)
        o = jax.nn.dot_product_attention(q, k, v, is_causal=True)  # (B, T, H, Dh)
        return o.reshape(b, t, -1) @ self.wo[...].astype(self.dtype)


class Block(nnx.Module):
    """Pre-norm block: x + attn(norm(x)); x + ffn(norm(x)), ffn = MoE or dense SwiGLU."""

    def __init__(self, cfg: ModelConfig, layer: int, *, rngs: nnx.Rngs, mesh: Mesh | None):
        out_std = 0.02 / math.sqrt(2 * cfg.n_layers)
        self.attn_norm = RMSNorm(cfg.d_model)
        self.attn = Attention(cfg, rngs=rngs, out_std=out_std)
        self.ffn_norm = RMSNorm(cfg.d_model)
        if cfg.is_moe(layer):
            self.ffn = MoE(cfg, rngs=rngs, mesh=mesh, out_std=out_std)
        else:
            self.ffn = SwiGLU(cfg.d_model, cfg.d_ff, rngs=rngs, dtype=cfg.compute_dtype, out_std=out_std)
        self.is_moe = cfg.is_moe(layer)

    def __call__(self, x):
        x = x + self.attn(self.attn_norm(x)).astype(x.dtype)
        h = self.ffn(self.ffn_norm(x))
        stats = None
        if self.is_moe:
            h, stats = h
        return x + h.astype(x.dtype), stats


class Transformer(nnx.Module):
    """Top-level modules (for per-module grad norms): ``embed``, ``layers``, ``final_norm``, ``lm_head``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, mesh: Mesh | None = None):
        self.cfg = cfg
        self.mesh = mesh
        self.embed = nnx.Param(normal_init(rngs, (cfg.vocab, cfg.d_model), 0.02))  # (V, D)
        self.layers = nnx.List([Block(cfg, i, rngs=rngs, mesh=mesh) for i in range(cfg.n_layers)])
        self.final_norm = RMSNorm(cfg.d_model)
        self.lm_head = nnx.Param(normal_init(rngs, (cfg.d_model, cfg.vocab), 0.02))  # (D, V)
        if mesh is not None:
            shard_model(self, mesh)

    def __call__(self, tokens) -> tuple[jax.Array, dict[str, jax.Array]]:
        """tokens (B, T) int32 -> logits (B, T, V) float32 and per-MoE-layer ``stats`` (module doc)."""
        if tokens.shape[1] > self.cfg.seq_len:
            raise ValueError(f"sequence length {tokens.shape[1]} exceeds model.seq_len={self.cfg.seq_len}")
        x = jnp.take(self.embed[...], tokens, axis=0)  # residual stream kept in float32, (B, T, D)
        per_layer = []
        for block in self.layers:
            x, st = block(x)
            if st is not None:
                per_layer.append(st)
        x = self.final_norm(x)
        logits = x.astype(self.cfg.compute_dtype) @ self.lm_head[...].astype(self.cfg.compute_dtype)
        stats = (
            {
                name: jnp.stack([getattr(s, name) for s in per_layer])
                for name in ("routed", "dropped", "router_z", "lb", "entropy")
            }
            if per_layer
            else _empty_stats(self.cfg)
        )
        return logits.astype(jnp.float32), stats


def _empty_stats(cfg: ModelConfig) -> dict[str, jax.Array]:
    e = cfg.n_routed
    return dict(
        routed=jnp.zeros((0, e), jnp.int32),
        dropped=jnp.zeros((0, e), jnp.int32),
        router_z=jnp.zeros((0,)),
        lb=jnp.zeros((0,)),
        entropy=jnp.zeros((0,)),
    )


def loss_fn(model: Transformer, batch) -> tuple[jax.Array, dict]:
    """batch (B, T+1) int32 -> (loss, aux).

    ``loss = ce + logit_z_coef * train/z_loss + router_z_coef * router/z_loss + lb_coef * router/lb_loss``

    ``aux`` scalars hold the UNWEIGHTED terms so they are comparable across coefficient settings:
    ``train/loss``, ``train/ce_loss``, ``train/z_loss`` (mean logsumexp(logits)^2), ``router/z_loss``,
    ``router/lb_loss`` (1.0 at perfect balance), ``router/entropy`` (means over MoE layers),
    ``moe/drop_fraction`` (dropped / routed over all layers), per-layer
    ``router/layer_<i>/{z_loss,lb_loss,entropy}`` and ``moe/layer_<i>/drop_fraction`` (i = model layer),
    and ``stats`` (the per-layer arrays from ``Transformer.__call__``).
    """
    cfg = model.cfg
    inputs, targets = batch[:, :-1], batch[:, 1:]
    logits, stats = model(inputs)
    lse = jax.nn.logsumexp(logits, axis=-1)  # (B, T)
    tgt = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    ce = jnp.mean(lse - tgt)
    z = jnp.mean(lse**2)
    if stats["lb"].shape[0]:
        router_z, lb, ent = stats["router_z"].mean(), stats["lb"].mean(), stats["entropy"].mean()
        drop = stats["dropped"].sum() / jnp.maximum(stats["routed"].sum(), 1)
    else:
        router_z = lb = ent = drop = jnp.zeros((), jnp.float32)
    loss = ce + cfg.logit_z_coef * z + cfg.router_z_coef * router_z + cfg.lb_coef * lb
    aux = {
        "train/loss": loss,
        "train/ce_loss": ce,
        "train/z_loss": z,
        "router/z_loss": router_z,
        "router/lb_loss": lb,
        "router/entropy": ent,
        "moe/drop_fraction": drop.astype(jnp.float32),
        "stats": stats,
    }
    for j, i in enumerate(moe_layers(cfg)):
        aux[f"router/layer_{i}/z_loss"] = stats["router_z"][j]
        aux[f"router/layer_{i}/lb_loss"] = stats["lb"][j]
        aux[f"router/layer_{i}/entropy"] = stats["entropy"][j]
        aux[f"moe/layer_{i}/drop_fraction"] = (
            stats["dropped"][j].sum() / jnp.maximum(stats["routed"][j].sum(), 1)
        ).astype(jnp.float32)
    return loss, aux


def update_router_bias(model: Transformer, routed) -> None:
    """Aux-loss-free balancing step, in place: for each MoE layer ``l``,
    ``bias[l] += bias_rate * sign(mean(load[l]) - load[l])`` with ``load = routed`` (int (L_moe, E),
    globally reduced counts from ``stats``). Overloaded experts become less likely to be chosen.
    A no-op unless ``gating == 'aux_free'``. Call it inside or outside ``nnx.jit``.
    """
    cfg = model.cfg
    if cfg.gating != "aux_free":
        return
    load = jnp.asarray(routed, jnp.float32)  # (L_moe, E)
    step = cfg.bias_rate * jnp.sign(load.mean(axis=-1, keepdims=True) - load)
    moes = [b.ffn for b in model.layers if b.is_moe]
    for j, moe in enumerate(moes):
        moe.router_bias[...] = moe.router_bias[...] + step[j]


def make_train_step():
    """A jitted bare training step ``step(model, optimizer, batch) -> (loss, drop fraction)``: forward,
    backward, the optimizer update and the aux-free bias update, with no telemetry. What the benchmarks
    time (bench_mfu, bench_expert_parallel); trainer/step.py's train_step adds telemetry, LR and NaN guards."""

    @nnx.jit(donate_argnums=(0, 1))
    def step(model, opt, batch):
        grad_fn = nnx.value_and_grad(loss_fn, argnums=nnx.DiffState(0, TRAINABLE), has_aux=True)
        (loss, aux), grads = grad_fn(model, batch)
        opt.update(model, grads)
        update_router_bias(model, aux["stats"]["routed"])
        return loss, aux["moe/drop_fraction"]

    return step
