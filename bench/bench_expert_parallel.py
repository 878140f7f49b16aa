"""Expert-parallel overhead: training-step time on 8 simulated CPU devices vs 1 device, same global batch.

    .venv/bin/python bench/bench_expert_parallel.py [--steps 4]

Each configuration runs in its own subprocess (XLA_FLAGS must be set before jax is imported):
``1 device`` (mesh data=1, expert=1: no collectives) and ``8 devices`` with mesh data=1 x expert=8 and
data=2 x expert=4 (the MoE layer's two ``all_to_all`` per layer go over 'expert'; batch split over both
axes; gradients of replicated weights summed across the mesh). The printed ratio is
``step_time(8 devices) / step_time(1 device)``: on one CPU the 8 "devices" share the same cores, so this
measures the cost of partitioning and collectives, not a speed-up (1.0 = no overhead).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

GOAL = "report (<= 1.5x)"


def child(args) -> None:
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from flax import nnx

    from trainer.mesh import make_mesh, shard_batch
    from trainer.model import TRAINABLE, ModelConfig, Transformer, make_train_step

    d = args.d_model
    cfg = ModelConfig(
        d_model=d,
        n_layers=args.layers,
        n_heads=4,
        seq_len=args.seq,
        n_routed=8,
        top_k=2,
        d_ff=4 * d,
        capacity_factor=1.25,
    )
    mesh = make_mesh(args.data, args.expert)
    model = Transformer(cfg, rngs=nnx.Rngs(0), mesh=mesh)
    opt = nnx.Optimizer(model, optax.adamw(1e-3), wrt=TRAINABLE)

    step = make_train_step()

    rng = np.random.default_rng(0)
    batches = [
        shard_batch(mesh, jnp.asarray(rng.integers(0, 256, (args.batch, args.seq + 1)), jnp.int32))
        for _ in range(args.steps + 1)
    ]
    jax.block_until_ready(step(model, opt, batches[0]))
    times = []
    for b in batches[1:]:
        t = time.perf_counter()
        loss, drop = jax.block_until_ready(step(model, opt, b))
        times.append(time.perf_counter() - t)
    print(
        json.dumps(
            {
                "devices": jax.device_count(),
                "data": args.data,
                "expert": args.expert,
                "step_s": float(np.median(times)),
                "loss": float(loss),
                "drop": float(drop),
            }
        )
    )


def run_child(devices: int, data: int, expert: int, args) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--child",
        "--devices",
        str(devices),
        "--data",
        str(data),
        "--expert",
        str(expert),
        "--steps",
        str(args.steps),
        "--batch",
        str(args.batch),
        "--seq",
        str(args.seq),
        "--d-model",
        str(args.d_model),
        "--layers",
        str(args.layers),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=1200)
    if out.returncode:
        raise SystemExit(f"child {devices} devices failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--data", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--expert", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16, help="global batch (sequences), divisible by 8")
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)

    one = run_child(1, 1, 1, args)
    results = [one]
    for data, expert in ((1, 8), (2, 4)):
        results.append(run_child(8, data, expert, args))
    for r in results:
        print(
            f"devices={r['devices']} mesh data={r['data']} x expert={r['expert']}: "
            f"step {r['step_s'] * 1e3:.0f} ms, loss {r['loss']:.4f}, drop {r['drop']:.3f}"
        )
    ratios = {f"{r['data']}x{r['expert']}": r["step_s"] / one["step_s"] for r in results[1:]}
    for k, v in ratios.items():
        print(f"step time 8 devices (mesh {k}) / 1 device = {v:.2f}x")
    meas = ", ".join(f"{v:.2f}x ({k})" for k, v in ratios.items())
    print(
        f"| Expert-parallel overhead, 8 simulated devices vs 1 | {meas} | {GOAL} | "
        f"`python bench/bench_expert_parallel.py` |"
    )


if __name__ == "__main__":
    main()
