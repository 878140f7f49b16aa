"""Heartbeat overhead on the trainer's step: the real jitted step and host path, in blocks with the writer's
heartbeat thread beating and blocks without, alternated, side by side in one process.

The thread beats every `--every` seconds (default 0.1 s: 300x the default `heartbeat_s` of 30 s, so the
overhead at the default is this figure / 300): psutil's CPU, RSS and memory (and jax's memory_stats) sampled
and a `heartbeat` event queued. Target (issue "Operate the hero run"): <= 1% of the step.

    python bench/bench_heartbeat.py [--blocks 16] [--steps 25] [--every 0.1]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import observatory  # noqa: E402
from observatory.telemetry import Heartbeat  # noqa: E402
from trainer.config import load_config  # noqa: E402
from trainer.data import load_corpus  # noqa: E402
from trainer.mesh import make_mesh  # noqa: E402
from trainer.model import TRAINABLE, Transformer  # noqa: E402
from trainer.runtime import enable_compile_cache  # noqa: E402
from trainer.step import make_optimizer, place_on_mesh, train_step  # noqa: E402
from trainer.train import _Loop, _model_counts  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", type=int, default=16, help="blocks of each variant, alternated")
    ap.add_argument("--steps", type=int, default=25, help="steps a block")
    ap.add_argument("--every", type=float, default=0.1, help="seconds between beats in the beating blocks")
    a = ap.parse_args()
    enable_compile_cache()
    cfg = load_config(
        ROOT / "trainer" / "configs" / "tiny.yaml",
        ["telemetry.progress=false", "telemetry.peak_flops=1e10", "checkpoint.at_exit=false"],
    )
    corpus = load_corpus(cfg.data.path, eval_fraction=cfg.data.eval_fraction)
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.expert)
    model = Transformer(cfg.model, rngs=nnx.Rngs(0), mesh=mesh)
    opt = nnx.Optimizer(model, make_optimizer(cfg), wrt=TRAINABLE)
    place_on_mesh((model, opt), mesh)
    runs = Path(tempfile.mkdtemp(prefix="bench-heartbeat-"))
    run = observatory.init(
        run_id="beats", config=cfg.to_dict(), runs_dir=runs, heartbeat_s=0, install_signal_handlers=False
    )
    loop = _Loop(cfg, run, corpus, mesh, model, opt, runs, _model_counts(cfg))
    loop.peak = 1e10
    lr, poison = np.float32(1e-3), np.float32(0.0)
    batches = [loop._batch(s, bad=False) for s in range(8)]
    times: dict[str, list[float]] = {"beating": [], "quiet": []}
    step = 0
    for _ in range(10):  # compile and warm up
        step += 1
        loop._finish_step(
            step, train_step(model, opt, batches[step % 8], lr, poison, telemetry=True), float(lr), []
        )
    for b in range(2 * a.blocks):
        name = ("beating", "quiet")[b % 2] if (b // 2) % 2 == 0 else ("quiet", "beating")[b % 2]
        stop = threading.Event()
        if name == "beating":
            Heartbeat(run._heartbeat, a.every, stop, "bench-heartbeat").start()
        for _ in range(a.steps):
            step += 1
            t0 = time.perf_counter()
            out = train_step(model, opt, batches[step % 8], lr, poison, telemetry=True)
            loop._finish_step(step, out, float(lr), [])
            times[name].append(time.perf_counter() - t0)
        stop.set()
    loop.ckpt.close()
    run.finish()
    beats = sum(1 for line in run.path.read_text().splitlines() if '"heartbeat"' in line)
    q, h = statistics.median(times["quiet"]), statistics.median(times["beating"])
    print(
        f"{len(times['quiet'])} steps a variant in {a.blocks} alternated blocks each; {beats} heartbeats written"
    )
    print(
        f"median step: quiet {1000 * q:.2f} ms, beating every {a.every:g} s {1000 * h:.2f} ms "
        f"-> {100 * (h / q - 1):+.2f}% ({100 * (h / q - 1) * a.every / 30:+.3f}% at the default 30 s)"
    )
    print("target: <= 1% of the step")


if __name__ == "__main__":
    main()
