"""What runs on the device: the optimizer, the jitted train and eval steps, the peak-FLOP/s probe.

`train_step` computes the loss, gradients, AdamW update and every telemetry scalar on the
device (MoE statistics arrive already reduced over the mesh from `loss_fn`) and packs them
into one f32 vector plus one int32 array of per-expert counts, so the host fetches a step's
values in two transfers; `scalar_names` gives the vector's names. A step whose loss or
gradient norm is not finite leaves the weights, the optimizer state and the router bias as
they were (the update is selected away on the device).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from trainer.config import TrainConfig
from trainer.model import TRAINABLE, ModelConfig, loss_fn, update_router_bias

__all__ = [
    "lr_schedule",
    "make_optimizer",
    "place_on_mesh",
    "train_step",
    "scalar_names",
    "eval_step",
    "measure_peak_flops",
]


# ---------------------------------------------------------------- optimizer


def lr_schedule(cfg: TrainConfig) -> np.ndarray:
    """Learning rate of every step 0..steps as float32 [steps + 1]; step s (1-based) uses lrs[s]."""
    o, s, n = cfg.optimizer, cfg.schedule, cfg.steps
    w = min(s.warmup_steps, n)
    end = o.lr * s.min_lr_ratio
    if s.kind == "cosine":
        sched = optax.warmup_cosine_decay_schedule(0.0, o.lr, max(w, 1) if w else 0, max(n, w + 1), end)
    elif s.kind == "wsd":
        d = max(1, int(round(n * s.decay_fraction)))
        stable_end = max(w, n - d)
        sched = optax.join_schedules(
            [
                optax.linear_schedule(0.0, o.lr, max(w, 1)),
                optax.constant_schedule(o.lr),
                optax.linear_schedule(o.lr, end, max(n - stable_end, 1)),
            ],
            [w, stable_end],
        )
    else:
        sched = optax.join_schedules(
            [optax.linear_schedule(0.0, o.lr, max(w, 1)), optax.constant_schedule(o.lr)], [w]
        )
    return np.asarray(jax.vmap(sched)(jnp.arange(n + 1)), dtype=np.float32)


def _scale_by_lr_arg() -> optax.GradientTransformationExtraArgs:
    """The last link of AdamW with the LR as a step argument (so rollbacks and LR spikes change it
    without recompiling): updates * -lr."""

    def init(params):
        return optax.EmptyState()

    def update(updates, state, params=None, *, lr, **extra):
        return jax.tree.map(lambda u: (-lr * u).astype(u.dtype), updates), state

    return optax.GradientTransformationExtraArgs(init, update)


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformationExtraArgs:
    """AdamW (optax's adamw chain, LR passed per step) after global-norm clipping.

    Weight decay skips vectors (norm scales); the router bias is not a Param, so it is never touched.
    """
    o = cfg.optimizer
    return _adamw(o.grad_clip, o.b1, o.b2, o.eps, o.weight_decay)


@functools.lru_cache(maxsize=16)
def _adamw(grad_clip: float, b1: float, b2: float, eps: float, weight_decay: float):
    # One transformation object per setting (the LR is a step argument, not part of it): tx is static
    # in the optimizer's graphdef, so a fresh object per run would make every later run in the same
    # process (ladder rungs, LR sweeps, tests) retrace and recompile the step.
    return optax.chain(
        optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity(),
        optax.scale_by_adam(b1, b2, eps),
        optax.add_decayed_weights(weight_decay, mask=lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)),
        _scale_by_lr_arg(),
    )


# ------------------------------------------------------------------- steps


def place_on_mesh(tree, mesh) -> None:
    """Give every array not yet on the mesh (step counters, Adam's count, RNG counters) a replicated
    mesh sharding, as the step's outputs will have: otherwise step 2 sees new input shardings and
    compiles the step a second time."""
    rep = NamedSharding(mesh, P())
    for _, var in nnx.iter_graph(tree):
        if isinstance(var, nnx.Variable):
            v = var.get_value()
            if isinstance(v, jax.Array) and not (
                isinstance(v.sharding, NamedSharding) and v.sharding.mesh == mesh
            ):
                var.set_value(jax.device_put(v, rep))


def _snapshot(tree):
    # a new pytree holding the current arrays (Variables are mutated in place by the update)
    return jax.tree.map(lambda x: x, tree)


# (model config, telemetry) -> the names of train_step's "scalars" vector, recorded at trace time
_SCALAR_NAMES: dict[tuple, tuple[str, ...]] = {}


@nnx.jit(static_argnames=("telemetry",))
def train_step(model, optimizer, batch, lr, poison, telemetry: bool = True):
    """One AdamW step. batch int32 [B, T+1] (sharded over the mesh), lr and poison f32 scalars
    (poison is NaN only for inject=nan). Returns {"scalars": f32[K] (names: `scalar_names`),
    "loads": int32[2, L_moe, E] (routed, dropped; with telemetry only)}."""

    def objective(m):
        loss, aux = loss_fn(m, batch)
        return loss * (1.0 + poison), aux  # poison=NaN makes the loss and every gradient NaN

    old = _snapshot(nnx.state((model, optimizer)))
    (loss, aux), grads = nnx.value_and_grad(objective, argnums=nnx.DiffState(0, TRAINABLE), has_aux=True)(
        model
    )
    gnorm = optax.global_norm(grads)
    ok = jnp.isfinite(loss) & jnp.isfinite(gnorm)
    optimizer.update(model, grads, lr=lr)
    update_router_bias(model, aux["stats"]["routed"])
    new = nnx.state((model, optimizer))
    # A non-finite step leaves weights, optimizer moments and the router bias as they were.
    nnx.update((model, optimizer), jax.tree.map(lambda n, o: jnp.where(ok, n, o), new, old))

    out = {"train/loss": loss, "ok": ok.astype(jnp.float32)}
    if telemetry:
        for k, v in aux.items():
            if k != "stats" and k != "train/loss":
                out[k] = v
        out["grad/norm/total"] = gnorm
        for name, sub in grads.items():  # top-level modules: embed, layers, final_norm, lm_head
            out[f"grad/norm/{name}"] = optax.global_norm(sub)
        old_params, new_params = nnx.state(old[0], TRAINABLE), nnx.state(model, TRAINABLE)
        out["opt/update_norm"] = optax.global_norm(jax.tree.map(lambda a, b: a - b, new_params, old_params))
        out["opt/param_norm"] = optax.global_norm(new_params)
    # Every scalar in one f32 vector, the per-expert counts in one int32 array: two transfers to the
    # host per step instead of one per metric. The names are fixed by the model config; they are
    # recorded here, at trace time, for the host to read the vector with.
    _SCALAR_NAMES[(model.cfg, telemetry)] = tuple(out)
    packed = {"scalars": jnp.stack([jnp.asarray(v, jnp.float32) for v in out.values()])}
    if telemetry:
        packed["loads"] = jnp.stack([aux["stats"]["routed"], aux["stats"]["dropped"]])  # int32 (2, L_moe, E)
    return packed


def scalar_names(model_cfg: ModelConfig, telemetry: bool) -> tuple[str, ...]:
    """The names of `train_step`'s "scalars" vector, in order (known once the step has been traced)."""
    return _SCALAR_NAMES[(model_cfg, telemetry)]


@nnx.jit
def eval_step(model, batch):
    """Held-out cross-entropy (nats per byte) of one batch [B, T+1]."""
    _, aux = loss_fn(model, batch)
    return aux["train/ce_loss"]


# ------------------------------------------------------------------ probe


def measure_peak_flops(seconds: float = 0.5, n: int = 1024) -> float:
    """float32 matmul FLOP/s this process's devices reach: the MFU denominator.

    On CPU every simulated device shares the same cores, so one device's matmul is the process's
    peak; on accelerators it is one device's peak times the local device count.
    """
    dev = jax.local_devices()[0]
    a = jax.device_put(jnp.ones((n, n), jnp.float32), dev)
    f = jax.jit(lambda x: x @ x * (1.0 / n))
    f(a).block_until_ready()
    best, t_end = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        f(a).block_until_ready()
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
    return best if dev.platform == "cpu" else best * jax.local_device_count()
