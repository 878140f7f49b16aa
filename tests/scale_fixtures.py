"""A run of the reference shape (48 MoE layers x 384 experts), few steps, through the real writer and ingester.

`make_scale_store(tmp)` writes `moe-48x384` (80 steps, expert_load every 4 steps,
so the expert detectors see 20 logged steps: their default `anomaly_expert_steps`)
into `tmp/runs` and ingests it into `tmp/store.duckdb` twice (the second pass
stores the findings the first pass's detectors wrote):

- layer 7: expert HOT_EXPERT takes 8x the mean load (a `hot_expert` finding);
  experts DEAD_EXPERTS get no tokens (`dead_expert` findings);
- layer WORST_DROP_LAYER has the lowest capacity, so the highest drop fraction;
- per-layer metrics `router/layer_<i>/{z_loss,lb_loss,entropy}` and
  `moe/layer_<i>/drop_fraction` (the drop fraction from the same loads), plus the
  run-level health metrics the Live page draws.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import observatory
from observatory.pipeline import ingest

RUN = "moe-48x384"
LAYERS, EXPERTS, STEPS, EVERY = 48, 384, 80, 4
HOT_LAYER, HOT_EXPERT = 7, 42
DEAD_EXPERTS = (300, 301, 302)
WORST_DROP_LAYER = 33
WORST_LB_LAYER = 19


def loads(step: int, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """Routed and dropped assignments of one layer at one step: (E,) ints each."""
    e = np.arange(EXPERTS)
    routed = 60 + (e * 37 + layer * 11 + step) % 80
    if layer == HOT_LAYER:
        routed[HOT_EXPERT] = 800
        routed[list(DEAD_EXPERTS)] = 0
    cap = 95 if layer == WORST_DROP_LAYER else 125
    return routed, np.maximum(routed - cap, 0)


def layer_metrics(step: int) -> dict[str, float]:
    out = {
        "train/loss": 2.0 + 6.0 * (step + 10) ** -0.5,
        "train/z_loss": 1e-3,
        "router/z_loss": 2e-3,
        "router/lb_loss": 1.05,
        "grad/norm/total": 1.0,
        "opt/lr": 3e-4,
        "throughput/tokens_per_s": 5000.0,
    }
    total_r = total_d = 0
    for layer in range(LAYERS):
        r, d = loads(step, layer)
        total_r, total_d = total_r + int(r.sum()), total_d + int(d.sum())
        out[f"router/layer_{layer}/z_loss"] = 2e-3 + 1e-5 * layer
        out[f"router/layer_{layer}/lb_loss"] = 1.0 + (0.5 if layer == WORST_LB_LAYER else 0.002 * layer)
        out[f"router/layer_{layer}/entropy"] = 5.9
        out[f"moe/layer_{layer}/drop_fraction"] = float(d.sum() / r.sum())
    out["moe/drop_fraction"] = total_d / total_r
    return out


def make_scale_store(tmp: Path) -> tuple[Path, Path]:
    """(runs_dir, db) with `moe-48x384` ingested (findings included)."""
    runs_dir, db = tmp / "runs", tmp / "store.duckdb"
    run = observatory.init(
        run_id=RUN,
        config={"steps": STEPS, "model": {"layers": LAYERS, "experts": EXPERTS, "top_k": 8}},
        runs_dir=runs_dir,
        model={"params_total": 5.35e11, "params_active": 3.2e10, "flops_per_token": 2e11},
        install_signal_handlers=False,
    )
    for s in range(STEPS):
        run.log(layer_metrics(s), step=s)
        if s % EVERY == 0:
            for layer in range(LAYERS):
                r, d = loads(s, layer)
                run.log_expert_load(s, layer, r.tolist(), d.tolist())
    run.finish("completed", final_step=STEPS - 1)
    ingest(runs_dir, db, emit=None)
    ingest(runs_dir, db, emit=None)  # the anomaly events the first pass's detectors wrote
    return runs_dir, db
