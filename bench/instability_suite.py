"""The instability suite: runs with induced instabilities and clean runs, with their truth.

Real (default): trained by our trainer on the tiny config, cached under
`tmp/artifacts/instability_suite/` so a second bench run costs nothing:

    clean-s0, clean-s1, clean-s2    the tiny config as is, three data/init seeds
    lr-spike                        inject=lr_spike@STEP:x30
    bad-batch                       inject=bad_batch@STEP
    high-lr                         LR x10, logit/router z-loss off, no grad clipping

Synthetic (`--synthetic`, or when the trainer cannot run): event logs written with
`observatory.init` from realistic series (BLOOM 176B's grad norm 0.24 -> 0.95 ->
2.39 -> 15.9 -> 145 -> 960 leading the loss by ~3 steps; a slow grad-norm growth
like the 535B run's before z-loss; clean decays with minibatch noise).

`suite.json` in the suite folder records each run's truth:
{"run": {"kind": "clean" | "induced", "inject_step": int | null, "case": str}}.

    python bench/instability_suite.py [--synthetic] [--steps N] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import observatory

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "tmp" / "artifacts" / "instability_suite"
TINY = ROOT / "trainer" / "configs" / "tiny.yaml"

# case -> (kind, overrides, inject step as a fraction of the run)
REAL_CASES = {
    "clean-s0": ("clean", ["seed=0", "data.seed=0"], None),
    "clean-s1": ("clean", ["seed=1", "data.seed=1"], None),
    "clean-s2": ("clean", ["seed=2", "data.seed=2"], None),
    "lr-spike": ("induced", ["seed=3", "data.seed=3", "inject=lr_spike@{s}:x30"], 0.5),
    "bad-batch": ("induced", ["seed=4", "data.seed=4", "inject=bad_batch@{s}"], 0.5),
    "high-lr": (
        "induced",
        [
            "seed=5",
            "data.seed=5",
            "optimizer.lr={lr10}",
            "model.logit_z_coef=0",
            "model.router_z_coef=0",
            "optimizer.grad_clip=0",
        ],
        None,
    ),
}


def _truth_path(out: Path) -> Path:
    return out / "suite.json"


def load_truth(out: Path) -> dict[str, dict]:
    p = _truth_path(out)
    return json.loads(p.read_text()) if p.exists() else {}


def _save_truth(out: Path, truth: dict) -> None:
    _truth_path(out).write_text(json.dumps(truth, indent=1, sort_keys=True))


def build_real(out: Path = DEFAULT_OUT, steps: int = 300, cases=None, log=print) -> dict[str, dict]:
    """Train the suite with the trainer (only the runs not already cached). Returns the truth table."""
    from trainer.config import load_config  # lazy for start-up time: the trainer loads jax
    from trainer.train import train

    runs_dir = out / "runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    truth = load_truth(out)
    base = load_config(str(TINY), [f"steps={steps}"])
    for case, (kind, overrides, frac) in REAL_CASES.items():
        if cases is not None and case not in cases:
            continue
        run = f"{case}-n{steps}"
        if run in truth and (runs_dir / run).is_dir():
            continue
        s = int(steps * frac) if frac is not None else None
        ov = [o.format(s=s, lr10=base.optimizer.lr * 10) for o in overrides]
        cfg = load_config(str(TINY), [f"steps={steps}", f"name={case}", "telemetry.progress=false", *ov])
        t0 = time.monotonic()
        train(cfg, runs_dir, run_id=run)
        log(f"trained {run} ({' '.join(ov)}) in {time.monotonic() - t0:.0f}s")
        truth[run] = {"kind": kind, "inject_step": s, "case": case, "overrides": ov, "steps": steps}
        _save_truth(out, truth)
    return {
        r: t for r, t in truth.items() if t.get("steps") == steps and (cases is None or t["case"] in cases)
    }


# ---------------------------------------------------------------- synthetic

BLOOM_GRAD = [0.24, 0.95, 2.39, 15.9, 145.0, 960.0]


def _clean_series(n: int, rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps = np.arange(n)
    loss = 2.3 + 3.2 * np.exp(-steps / 120) + 0.03 * rng.standard_normal(n)
    grad = (0.25 + 2.0 * np.exp(-steps / 30)) * np.exp(0.12 * rng.standard_normal(n))
    tps = 4e4 * (1 + 0.04 * rng.standard_normal(n))
    tps[0] = 300.0
    return loss, grad, tps


def synthetic_cases(n: int, seed: int = 0) -> dict[str, tuple[str, int | None, dict[str, np.ndarray]]]:
    """case -> (kind, inject step, {metric: (n,) series})."""
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(3):
        loss, grad, tps = _clean_series(n, rng)
        out[f"syn-clean-{i}"] = (
            "clean",
            None,
            {"train/loss": loss, "grad/norm/total": grad, "throughput/tokens_per_s": tps},
        )
    # BLOOM 176B: grad norm explodes over 5 steps; loss 2.2 -> 5.1 about 3 steps later; back in ~30
    loss, grad, tps = _clean_series(n, rng)
    s = n // 2
    grad[s : s + 6] = BLOOM_GRAD
    grad[s + 6 : s + 30] = np.geomspace(200, 0.3, 24)
    bump = np.array([0.02, 0.2, 0.9, 2.9, 2.5, 1.9, 1.4, 1.0, 0.7, 0.5, 0.35, 0.25, 0.15, 0.1, 0.05])
    loss[s + 3 : s + 3 + bump.size] += bump
    out["syn-bloom"] = (
        "induced",
        s,
        {"train/loss": loss, "grad/norm/total": grad, "throughput/tokens_per_s": tps},
    )
    # a one-step bad batch: grad norm and loss jump at the same step
    loss, grad, tps = _clean_series(n, rng)
    grad[s] *= 30
    loss[s] += 2.5
    loss[s + 1 : s + 6] += np.array([0.4, 0.2, 0.1, 0.05, 0.02])
    out["syn-bad-batch"] = (
        "induced",
        s,
        {"train/loss": loss, "grad/norm/total": grad, "throughput/tokens_per_s": tps},
    )
    # slow grad-norm growth (the 535B run before z-loss), then divergence
    loss, grad, tps = _clean_series(n, rng)
    g = np.clip((np.arange(n) - s) / (n // 4), 0, None)
    grad *= 1 + 15 * g**2
    d = np.clip(np.arange(n) - (s + n // 12), 0, None)
    loss += 0.02 * d
    out["syn-growth"] = (
        "induced",
        s,
        {"train/loss": loss, "grad/norm/total": grad, "throughput/tokens_per_s": tps},
    )
    return out


def build_synthetic(out: Path, steps: int = 600, seed: int = 0) -> dict[str, dict]:
    runs_dir = out / "runs"
    truth = {}
    for case, (kind, s, series) in synthetic_cases(steps, seed).items():
        run = f"{case}-n{steps}"
        truth[run] = {"kind": kind, "inject_step": s, "case": case, "steps": steps, "synthetic": True}
        if (runs_dir / run).is_dir():
            continue
        r = observatory.init(
            run_id=run, runs_dir=runs_dir, config={"synthetic": case}, install_signal_handlers=False
        )
        names = list(series)
        for i in range(steps):
            r.log({k: float(series[k][i]) for k in names}, step=i)
        r.finish()
    prev = load_truth(out)
    prev.update(truth)
    out.mkdir(parents=True, exist_ok=True)
    _save_truth(out, prev)
    return truth


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--synthetic", action="store_true")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    a = ap.parse_args(argv)
    truth = build_synthetic(a.out, a.steps) if a.synthetic else build_real(a.out, a.steps)
    json.dump(truth, sys.stdout, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
