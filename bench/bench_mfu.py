"""MFU of the MoE training step against this machine's float32 matmul peak, measured in one run.

    .venv/bin/python bench/bench_mfu.py [--d-model 512 --batch 16 --seq 256 --steps 4]

1. peak: FLOP/s of ``jnp.dot`` on two ``n x n`` float32 matrices (2 n^3 FLOPs), best of several;
2. step: one full training step of the MoE transformer (forward, backward, AdamW update, aux-free
   bias update) on one device; achieved FLOP/s = ``flops_per_token(cfg) * tokens / step_time``, with
   ``flops_per_token`` from trainer/flops.py (model FLOPs: capacity padding and dispatch not counted).

Peak and step are timed in alternation over windows of equal length (best of each) so that load from
other processes on a shared machine hits both alike; the ratio is also printed in process CPU seconds. The shape is chosen to be matmul-bound: wide layers, a long enough batch, and
half-width experts of width ``2 * d_model``.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from trainer.flops import flops_per_token, param_counts
from trainer.model import TRAINABLE, ModelConfig, Transformer, make_train_step

GOAL = 0.40


def make_matmul(n: int):
    """A jitted f32 ``n x n @ n x n`` (2 n^3 FLOPs) and its operands, warmed up."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
    f = jax.jit(jnp.dot)
    f(a, b).block_until_ready()
    return lambda: f(a, b)


def timed(fn, reps: int = 1) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of ``reps`` back-to-back calls, blocking on the last."""
    w, c = time.perf_counter(), time.process_time()
    for _ in range(reps):
        out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - w, time.process_time() - c


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--experts", type=int, default=8)
    ap.add_argument("--top-k", type=int, default=2)
    ap.add_argument("--capacity-factor", type=float, default=1.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--matmul-n", type=int, default=2048)
    args = ap.parse_args(argv)

    d = args.d_model
    cfg = ModelConfig(
        d_model=d,
        n_layers=args.layers,
        n_heads=args.heads,
        seq_len=args.seq,
        n_routed=args.experts,
        top_k=args.top_k,
        d_ff=4 * d,
        d_expert=2 * d,
        d_shared=2 * d,
        n_shared=1,
        capacity_factor=args.capacity_factor,
        gating="aux_free",
        lb_coef=0.0,
    )
    total, active = param_counts(cfg)
    fpt = flops_per_token(cfg)
    tokens = args.batch * args.seq
    print(f"devices: {jax.devices()}")
    print(
        f"model: d_model={d} layers={cfg.n_layers} experts={cfg.n_routed} top_k={cfg.top_k} "
        f"d_expert={cfg.d_expert} params total={total / 1e6:.1f}M active={active / 1e6:.1f}M "
        f"flops/token={fpt / 1e6:.1f}M tokens/step={tokens}"
    )

    model = Transformer(cfg, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adamw(1e-3, weight_decay=0.1), wrt=TRAINABLE)
    step = make_train_step()
    rng = np.random.default_rng(0)
    batch = jnp.asarray(rng.integers(0, 256, (args.batch, args.seq + 1)), jnp.int32)
    t0 = time.perf_counter()
    jax.block_until_ready(step(model, opt, batch))
    print(f"compile + first step: {time.perf_counter() - t0:.1f}s")

    n = args.matmul_n
    mm = make_matmul(n)
    # Time the matmul over a window as one step, so that load from other processes on a
    # shared machine hits both measurements alike; alternate them and keep the best of each.
    reps = max(1, round(timed(lambda: step(model, opt, batch))[0] / timed(mm)[0]))
    best_mm = best_step = best_mm_cpu = best_step_cpu = float("inf")
    for _ in range(args.steps):
        w, c = timed(mm, reps)
        best_mm, best_mm_cpu = min(best_mm, w / reps), min(best_mm_cpu, c / reps)
        w, c = timed(lambda: step(model, opt, batch))
        best_step, best_step_cpu = min(best_step, w), min(best_step_cpu, c)
    loss, _ = step(model, opt, batch)
    peak = 2 * n**3 / best_mm
    achieved = fpt * tokens / best_step
    ratio = achieved / peak
    cpu_ratio = (fpt * tokens / best_step_cpu) / (2 * n**3 / best_mm_cpu)
    print(f"matmul peak (f32 {n}x{n}): {peak / 1e9:.1f} GFLOP/s")
    print(
        f"train step: {best_step * 1e3:.0f} ms, {tokens / best_step:.0f} tokens/s, "
        f"{achieved / 1e9:.1f} GFLOP/s (loss {float(loss):.3f}: the same batch every step)"
    )
    print(
        f"MFU = achieved / peak = {ratio:.1%} (goal >= {GOAL:.0%}); matmul timed as {reps} x {n}^3 "
        f"back to back per window"
    )
    print(f"same ratio in process CPU seconds (insensitive to other processes' load): {cpu_ratio:.1%}")
    print(
        f"| MoE train-step MFU vs f32 matmul peak | {ratio:.1%} | >= {GOAL:.0%} | `python bench/bench_mfu.py` |"
    )
    return ratio


if __name__ == "__main__":
    main()
