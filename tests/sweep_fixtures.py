"""A small real store for the sweep tests: a simulated iso-FLOP grid, a variant grid, a restart chain.

`make_sweep_store(tmp)` writes into `tmp/runs` and ingests into `tmp/store.duckdb`:

- `isoflop-sim-*`: 4 budgets x 5 sizes (observatory.interop.simulate_isoflop, ground truth stated there);
- `isoflop-var-*`: the same grid for a variant worth 1.4x the compute (`mult=1.4`);
- `lr-a` (preempted at step 50) resumed as `lr-a-r1` (same name: a restart, folded into lr-a), and
  `lr-a-fork` forked from `lr-a` under another name (a run of its own); `lr-b` failed; all with
  `config.optimizer.lr` and a tag.
"""

from __future__ import annotations

from pathlib import Path

from observatory.interop import RunLogBuilder, ingest_runs
from observatory.interop.simulate_isoflop import write_grid

T0 = 1_790_000_000.0


def _lr_run(runs_dir: Path, run: str, name: str, lr: float, steps: range, status: str, parent=None, tags=()):
    b = RunLogBuilder(run)
    b.start(
        T0 + steps.start,
        {"optimizer": {"lr": lr}, "model": {"width": 256}},
        name=name,
        project="lr",
        group="lr-sweep",
        tags=list(tags),
        parent=parent,
    )
    for s in steps:
        b.add("metrics", {"train/loss": 3.0 - 0.01 * s, "data/tokens": float(1000 * s)}, s, T0 + s)
    b.add("run_end", {"status": status, "final_step": steps.stop - 1}, steps.stop - 1, T0 + steps.stop)
    b.write(runs_dir)


def make_sweep_store(tmp: Path) -> tuple[Path, Path]:
    runs_dir, db = tmp / "runs", tmp / "store.duckdb"
    runs_dir.mkdir(parents=True, exist_ok=True)
    write_grid(runs_dir, name="isoflop-sim", seed=0)
    write_grid(runs_dir, name="isoflop-var", seed=1, mult=1.4, project="variant")
    _lr_run(runs_dir, "lr-a", "lr-a", 1e-3, range(1, 51), "preempted", tags=["seed0"])
    _lr_run(runs_dir, "lr-a-r1", "lr-a", 1e-3, range(50, 101), "completed", {"run": "lr-a", "step": 50})
    _lr_run(runs_dir, "lr-a-fork", "lr-a-fork", 5e-4, range(50, 81), "completed", {"run": "lr-a", "step": 50})
    _lr_run(runs_dir, "lr-b", "lr-b", 3e-3, range(1, 31), "failed", tags=["seed1", "hot lr"])
    ingest_runs(runs_dir, db)
    return runs_dir, db
