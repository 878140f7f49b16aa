"""A simulated iso-FLOP grid with a stated ground truth, as ordinary event logs.

Ground truth: Hoffmann et al. 2022 (Chinchilla), approach 3's fitted law

    L(N, D) = E + A / N^alpha + B / D^beta,  E = 1.69, A = 406.4, B = 410.7, alpha = 0.34, beta = 0.28

on C = 6·N·D, whose compute-optimal point is N* = G·(C/6)^(beta/(alpha+beta)), D* = (C/6)/N*, with
G = (alpha·A / (beta·B))^(1/(alpha+beta)): N* ∝ C^0.452, D* ∝ C^0.548. Each budget gets `sizes` model
sizes log-spaced over `spread` either side of N*, each cell's final eval loss drawn with `noise` sd
(seeded: the same call writes the same bytes). A cell is a run with `ladder` {name, rung, budget, flops,
tokens, params_active}, config `model.width`, `budget`, `optimizer.lr`, a loss curve of `points`
metrics events (`train/loss`, `data/tokens`), one final `eval` (dataset `eval`) and `run_end`.
`observatory isoflop "ladder = <name>" --metric eval:eval` fits it.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from observatory.interop import RunLogBuilder

__all__ = ["TRUTH", "optimum", "grid_runs", "write_grid"]

TRUTH = {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
T0 = 1_780_000_000.0  # simulated start time (2026-05-28), fixed so the bytes are fixed


def law(n, d, mult: float = 1.0):
    """The ground-truth loss of N params on D tokens; `mult`: a variant worth `mult`× the compute."""
    t = TRUTH
    s = math.sqrt(mult)
    return t["E"] + t["A"] / (np.asarray(n) * s) ** t["alpha"] + t["B"] / (np.asarray(d) * s) ** t["beta"]


def optimum(c: float) -> tuple[float, float]:
    """The law's compute-optimal (N*, D*) at compute C."""
    t = TRUTH
    a, b = t["alpha"], t["beta"]
    g = (a * t["A"] / (b * t["B"])) ** (1 / (a + b))
    n = g * (c / 6) ** (b / (a + b))
    return n, c / (6 * n)


def _width(n: float) -> int:
    """A model width for N params (12·L·d² with L = d/64 layers), rounded to 64."""
    return int(max(64, round((n * 64 / 12) ** (1 / 3) / 64) * 64))


def grid_runs(
    name: str = "isoflop-sim",
    budgets=(1e17, 3e17, 1e18, 3e18),
    sizes: int = 5,
    spread: float = 4.0,
    noise: float = 0.005,
    seed: int = 0,
    points: int = 20,
    mult: float = 1.0,
    project: str = "sweeps",
) -> list[RunLogBuilder]:
    """One `RunLogBuilder` per cell (see the module docstring)."""
    rng = np.random.default_rng(seed)
    out = []
    for bi, c in enumerate(budgets):
        n_opt, _ = optimum(c)
        for si, n in enumerate(n_opt * np.geomspace(1 / spread, spread, sizes)):
            d = c / (6 * n)
            width = _width(n)
            run = f"{name}-{c:.0e}-n{si}".replace("+", "")
            steps = 1000
            final = float(law(n, d, mult) + rng.normal(0, noise))
            b = RunLogBuilder(run)
            t0 = T0 + 3600 * (bi * sizes + si)
            b.start(
                t0,
                {
                    "model": {"width": width, "params": round(n)},
                    "budget": c,
                    "optimizer": {"lr": round(3e-3 * (width / 256) ** -0.5, 6)},
                    "seed": seed,
                },
                name=run,
                project=project,
                group=name,
                tags=["isoflop", f"C={c:.0e}"],
                ladder={
                    "name": name,
                    "rung": f"{c:.0e}-d{width}",
                    "budget": c,
                    "flops": c,
                    "tokens": round(d),
                    "params_active": round(n),
                    "steps": steps,
                },
                data={"name": "sim", "tokens": round(d)},
                model={"params_active": round(n), "flops_per_token": 6 * round(n)},
                notes="simulated iso-FLOP cell; ground truth: Chinchilla approach 3 (observatory.interop."
                "simulate_isoflop.TRUTH)",
            )
            for k in range(1, points + 1):
                step = steps * k // points
                dk = d * step / steps
                loss = float(law(n, dk, mult) + rng.normal(0, noise))
                b.add("metrics", {"train/loss": loss, "data/tokens": float(round(dk))}, step, t0 + step)
            b.add("eval", {"dataset": "eval", "loss": final}, steps, t0 + steps + 1)
            b.add("run_end", {"status": "completed", "final_step": steps}, steps, t0 + steps + 2)
            out.append(b)
    return out


def write_grid(runs_dir: str | Path, **kw) -> list[str]:
    """Write `grid_runs(**kw)` into `runs_dir`; the run ids."""
    runs = grid_runs(**kw)
    for b in runs:
        b.write(runs_dir, replace=True)
    return [b.run for b in runs]


# the committed samples (data/samples): a baseline grid and a variant worth 1.4x the compute; named to sort
# after the sample scaling ladder (`ladder-cpu`), which the Ladder page opens on
SAMPLE_GRIDS = (
    {"name": "sweep-isoflop", "seed": 0},
    {"name": "sweep-isoflop-var", "seed": 1, "mult": 1.4, "project": "sweeps-variant"},
)


def pack_samples(out_dir: str | Path) -> list[str]:
    """Write `SAMPLE_GRIDS` as `<out_dir>/<run>/events.0.jsonl.gz` (gzip without a timestamp: the same
    bytes on every machine); the run ids."""
    import gzip

    out = []
    for kw in SAMPLE_GRIDS:
        for b in grid_runs(**kw):
            path = Path(out_dir) / b.run / "events.0.jsonl.gz"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(b.to_bytes(), compresslevel=9, mtime=0))
            out.append(b.run)
    return out


if __name__ == "__main__":  # python -m observatory.interop.simulate_isoflop data/samples
    import sys

    runs = pack_samples(sys.argv[1] if len(sys.argv) > 1 else "data/samples")
    print(f"{len(runs)} runs written")
