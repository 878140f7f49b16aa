"""`trainer ladder`: train the rungs of a scaling ladder, then (optionally) a pre-registered target.

    trainer ladder --config trainer/configs/ladder_cpu.yaml [--runs-dir DIR] [--db DB]
                   [--plan] [--seeds N] [--target] [--target-override key=value ...] [--target-seed K]
                   [--pack DIR]

A ladder config names a base recipe (a trainer config) and the rungs as overrides of
it. Every rung trains the same number of tokens per active parameter, so each sits at
the same point of its own compute-optimal-ish trade-off and the rungs differ only in
scale; the ladder fit then predicts a larger run trained the same way.

For each rung this module derives, from the model shape (`trainer.flops`):

- `params_active`, `params_total` (active = embeddings, attention, shared experts,
  top_k of the routed experts, router, head);
- `steps` = tokens_per_param * params_active / tokens_per_step, rounded up to a
  multiple of 20 (the nearest) so that evals land exactly on every 5% of the schedule;
- `flops` = C = (6 * N_active + 12 * n_layers * seq_len * n_heads * head_dim) * D.
  6 * N_active * D is the usual forward+backward matmul count; the router's (D, E)
  matrix is part of N_active, so its FLOPs are in the 6N term. What we add is
  attention's score and value products, 12 * L * T * d_attn per token (QK^T and AV,
  2 multiply-adds each, x3 for backward), which is 4-11% of C for these tiny models
  and would otherwise bend the law. The embedding lookup (a gather) is in N_active
  but does no matmul; we keep it in, as Chinchilla does, rather than special-case it.

Each rung is a normal run (`trainer.train.train`) with
`ladder = {name, rung, params_active, params_total, tokens, flops, steps}` in its
run_start. A completed rung (its run id already has run_end `completed`) is skipped,
so an interrupted ladder resumes where it stopped.

`--target` then ingests the rungs, asks the observatory for the target's forecast
(`observatory ladder forecast`, which writes the `forecast` event into the target's
run folder as host 1000, before the target's run_start exists), and trains the target
with `ladder.target = true`. The trainer talks to the observatory only through its
writer and its command line.
"""

from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from observatory import bucket, settings
from trainer.runtime import enable_compile_cache

__all__ = ["LadderSpec", "RungSpec", "RungPlan", "load_ladder_spec", "plan", "run_ladder", "pack", "main"]

EVALS_PER_RUN = 20  # one eval every 5% of the schedule


@dataclass(frozen=True)
class RungSpec:
    rung: str  # short label, e.g. "d32"; the run id is <ladder name>-<rung>
    overrides: tuple[str, ...] = ()  # trainer config overrides, key.sub=value

    def __post_init__(self):
        if not self.rung or not all(c.isalnum() or c in "._-" for c in self.rung):
            raise ValueError(f"ladder rung {self.rung!r}: use letters, digits, '.', '_' or '-'")


@dataclass(frozen=True)
class LadderSpec:
    """A ladder: one recipe (base config + shared overrides), rungs that change only its scale."""

    name: str
    base: Path  # trainer config the rungs start from
    tokens_per_param: float  # D / N_active, the same for every rung and the target
    rungs: tuple[RungSpec, ...]
    overrides: tuple[str, ...] = ()  # applied to every rung and the target, before their own
    warmup_fraction: float = 0.05  # warmup as a share of each rung's steps (the schedule scales with it)
    target: RungSpec | None = None
    # Seeds every rung is trained with (model init and batch order, `seed` and `data.seed`); the
    # fit averages a rung's seeds at every schedule fraction. Seed 0 keeps the run id
    # <name>-<rung>, seed k > 0 is <name>-<rung>-s<k>. The target is trained once, with the first.
    seeds: tuple[int, ...] = (0,)
    source: str = ""  # the YAML file, for error messages

    def __post_init__(self):
        where = f"{self.source}: " if self.source else ""
        if not self.name or not all(c.isalnum() or c in "._-" for c in self.name):
            raise ValueError(f"{where}name {self.name!r}: use letters, digits, '.', '_' or '-'")
        if not (self.tokens_per_param > 0):
            raise ValueError(f"{where}tokens_per_param must be > 0, got {self.tokens_per_param}")
        if len(self.rungs) < 2:
            raise ValueError(f"{where}a ladder needs >= 2 rungs (3+ to fit E), got {len(self.rungs)}")
        labels = [r.rung for r in self.rungs] + ([self.target.rung] if self.target else [])
        if len(set(labels)) != len(labels):
            raise ValueError(f"{where}rung labels must be unique, got {labels}")
        if not (0 <= self.warmup_fraction < 0.5):
            raise ValueError(f"{where}warmup_fraction must be in [0, 0.5), got {self.warmup_fraction}")
        if not self.base.exists():
            raise ValueError(f"{where}base config {self.base} does not exist")
        if (
            not self.seeds
            or len(set(self.seeds)) != len(self.seeds)
            or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds)
        ):
            raise ValueError(
                f"{where}seeds must be distinct integers >= 0 (or a count), got {list(self.seeds)}"
            )
        ids = [_run_id(self.name, r.rung, s) for r in self.rungs for s in self.seeds]
        if len(set(ids)) != len(ids):
            raise ValueError(f"{where}rung labels collide with seed run ids (<rung>-s<k>): {sorted(ids)}")


def _run_id(name: str, rung: str, seed: int) -> str:
    return f"{name}-{rung}" if seed == 0 else f"{name}-{rung}-s{seed}"


def _seeds(v: Any, where: str) -> tuple[int, ...]:
    """`seeds: 3` (seeds 0, 1, 2) or `seeds: [0, 5, 9]`."""
    if isinstance(v, int) and not isinstance(v, bool):
        if v < 1:
            raise ValueError(f"{where}: seeds: a count must be >= 1, got {v}")
        return tuple(range(v))
    if isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        return tuple(v)
    raise ValueError(f"{where}: seeds: expected a count (e.g. 3) or a list of integers, got {v!r:.80}")


def _rung(d: Any, where: str) -> RungSpec:
    if not isinstance(d, dict) or "rung" not in d:
        raise ValueError(f"{where}: expected a mapping with `rung` and `overrides`, got {d!r:.80}")
    unknown = set(d) - {"rung", "overrides"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)}; a rung has `rung` and `overrides`")
    return RungSpec(str(d["rung"]), _overrides(d.get("overrides"), f"{where}.overrides"))


def _overrides(v: Any, where: str) -> tuple[str, ...]:
    """An `overrides:` entry: a list of key.sub=value strings (None or empty: none)."""
    ov = v or []
    if not isinstance(ov, list) or not all(isinstance(o, str) and "=" in o for o in ov):
        raise ValueError(f"{where}: expected a list of key.sub=value strings")
    return tuple(ov)


def load_ladder_spec(path: str | Path) -> LadderSpec:
    """Read a ladder YAML (see trainer/configs/ladder_cpu.yaml); errors name the file and key."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"ladder config {p} does not exist")
    try:
        d = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{p}: not valid YAML: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"{p}: the top level must be a mapping")
    known = {"name", "base", "tokens_per_param", "rungs", "overrides", "warmup_fraction", "target", "seeds"}
    unknown = set(d) - known
    if unknown:
        raise ValueError(f"{p}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    for key in ("name", "base", "tokens_per_param", "rungs"):
        if key not in d:
            raise ValueError(f"{p}: missing `{key}`")
    if not isinstance(d["rungs"], list):
        raise ValueError(f"{p}: rungs: expected a list")
    ov = _overrides(d.get("overrides"), f"{p}: overrides")
    return LadderSpec(
        name=str(d["name"]),
        base=(p.parent / str(d["base"])).resolve(),
        tokens_per_param=float(d["tokens_per_param"]),
        rungs=tuple(_rung(r, f"{p}: rungs[{i}]") for i, r in enumerate(d["rungs"])),
        overrides=ov,
        warmup_fraction=float(d.get("warmup_fraction", 0.05)),
        target=_rung(d["target"], f"{p}: target") if d.get("target") else None,
        seeds=_seeds(d.get("seeds", 1), str(p)),
        source=str(p),
    )


@dataclass(frozen=True)
class RungPlan:
    rung: str
    run_id: str
    cfg: Any  # trainer.config.TrainConfig, steps and evals set
    ladder: dict[str, Any] = field(default_factory=dict)  # what goes into run_start.ladder
    seed: int = 0


def _plan_one(
    spec: LadderSpec, r: RungSpec, extra: tuple[str, ...] = (), target: bool = False, seed: int = 0
) -> RungPlan:
    # lazy for start-up time: trainer.config and trainer.flops load JAX, and `trainer --help` imports this module
    from trainer.config import load_config
    from trainer.flops import param_counts

    run_id = _run_id(spec.name, r.rung, seed)
    # the seed sets both model init and batch order; the target's own overrides may still change it
    seeded = (f"seed={seed}", f"data.seed={seed}")
    cfg = load_config(spec.base, [*spec.overrides, *r.overrides, *seeded, *extra])
    m = cfg.model
    total, active = param_counts(m)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
    want = spec.tokens_per_param * active / tokens_per_step
    steps = max(EVALS_PER_RUN, EVALS_PER_RUN * round(want / EVALS_PER_RUN))
    tokens = steps * tokens_per_step
    attn_per_token = 12 * m.n_layers * cfg.data.seq_len * m.n_heads * m.head_dim
    flops = float((6 * active + attn_per_token) * tokens)
    cfg = dataclasses.replace(
        cfg,
        name=run_id,
        steps=steps,
        eval=dataclasses.replace(cfg.eval, every=steps // EVALS_PER_RUN),
        schedule=dataclasses.replace(cfg.schedule, warmup_steps=round(spec.warmup_fraction * steps)),
    )
    ladder = {
        "name": spec.name,
        "rung": r.rung,
        "seed": seed,
        "params_active": int(active),
        "params_total": int(total),
        "tokens": int(tokens),
        "flops": flops,
        "steps": steps,
        "tokens_per_param": spec.tokens_per_param,
    }
    if target:
        ladder["target"] = True
    return RungPlan(r.rung, run_id, cfg, ladder, seed)


def plan(
    spec: LadderSpec, target_overrides: tuple[str, ...] = (), target_seed: int | None = None
) -> tuple[list[RungPlan], RungPlan | None]:
    """The rungs' (every rung x seed, seed-major: all rungs of the first seed come first) and the
    target's configs, with steps, evals and compute derived from the recipe. The target is trained
    with the first seed unless `target_seed` (another, independent target run: <name>-<rung>-s<k>)."""
    rungs = [_plan_one(spec, r, seed=s) for s in spec.seeds for r in spec.rungs]
    seed = spec.seeds[0] if target_seed is None else target_seed
    tgt = _plan_one(spec, spec.target, target_overrides, target=True, seed=seed) if spec.target else None
    return rungs, tgt


def _completed(runs_dir: Path, run_id: str) -> bool:
    """Whether the run's host-0 log ends with run_end completed (then the rung is not retrained)."""
    path = runs_dir / run_id / "events.0.jsonl"
    if not path.exists():
        return False
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4096))
        tail = f.read().splitlines()
    for raw in reversed(tail):
        try:
            ev = json.loads(raw)
        except ValueError:
            continue
        return ev.get("kind") == "run_end" and ev.get("data", {}).get("status") == "completed"
    return False


def _observatory(*args: str) -> None:
    exe = Path(sys.executable).parent / "observatory"
    cmd = [str(exe) if exe.exists() else "observatory", *args]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)


def run_ladder(
    spec: LadderSpec,
    runs_dir: Path,
    db: Path,
    *,
    target: bool = False,
    target_overrides: tuple[str, ...] = (),
    target_run_id: str | None = None,
    target_seed: int | None = None,
) -> list[str]:
    """Train every rung (skipping completed ones) and, with `target`, forecast then train the target."""
    from trainer.train import train  # lazy for start-up time (JAX)

    rungs, tgt = plan(spec, target_overrides, target_seed)
    done = []
    for p in rungs:
        if _completed(runs_dir, p.run_id):
            print(
                f"ladder {spec.name}: rung {p.rung} already completed ({p.run_id}); skipping", file=sys.stderr
            )
        elif (runs_dir / p.run_id).exists():
            raise RuntimeError(
                f"ladder {spec.name}: {runs_dir / p.run_id} exists but did not complete; "
                "remove it to retrain that rung"
            )
        else:
            print(
                f"ladder {spec.name}: rung {p.rung}: {p.ladder['params_active']:,} active params, "
                f"{p.cfg.steps} steps, C={p.ladder['flops']:.3g}",
                file=sys.stderr,
                flush=True,
            )
            train(p.cfg, runs_dir, run_id=p.run_id, ladder=p.ladder, tags=["ladder", spec.name])
        done.append(p.run_id)
    if target:
        if tgt is None:
            raise ValueError(f"{spec.source}: --target needs a `target:` entry in the ladder config")
        run_id = target_run_id or tgt.run_id
        if (runs_dir / run_id).exists():
            raise RuntimeError(
                f"target run folder {runs_dir / run_id} exists; a pre-registered forecast needs "
                "a fresh run id (--target-run-id)"
            )
        _observatory("ingest", "--quiet", "--runs-dir", str(runs_dir), "--db", str(db))
        _observatory(
            "ladder",
            "forecast",
            spec.name,
            "--target",
            run_id,
            "--flops",
            repr(tgt.ladder["flops"]),
            "--steps",
            str(tgt.cfg.steps),
            "--runs-dir",
            str(runs_dir),
            "--db",
            str(db),
        )
        print(
            f"ladder {spec.name}: target {run_id}: {tgt.ladder['params_active']:,} active params, "
            f"{tgt.cfg.steps} steps, C={tgt.ladder['flops']:.3g}",
            file=sys.stderr,
            flush=True,
        )
        train(tgt.cfg, runs_dir, run_id=run_id, ladder=tgt.ladder, tags=["ladder-target", spec.name])
        _observatory("ingest", "--quiet", "--runs-dir", str(runs_dir), "--db", str(db))
        # compare the finished target with its band (ingest's hook does this live); idempotent
        _observatory("ladder", "check", run_id, "--runs-dir", str(runs_dir), "--db", str(db))
        _observatory("ingest", "--quiet", "--runs-dir", str(runs_dir), "--db", str(db))
        done.append(run_id)
    return done


def pack(runs_dir: Path, run_ids: list[str], dest: Path) -> list[Path]:
    """gzip each run's event logs into dest/<run>/events.<host>.jsonl.gz (the committed samples)."""
    out = []
    for run in run_ids:
        (dest / run).mkdir(parents=True, exist_ok=True)
        for f in sorted((runs_dir / run).glob("events.*.jsonl")):
            target = dest / run / (f.name + ".gz")
            with open(f, "rb") as src, gzip.GzipFile(target, "wb", mtime=0) as gz:
                shutil.copyfileobj(src, gz)
            out.append(target)
    return out


def _print_plan(spec: LadderSpec, rungs: list[RungPlan], tgt: RungPlan | None) -> None:
    print(
        f"ladder {spec.name}: {spec.tokens_per_param:g} tokens per active parameter, base {spec.base}, "
        f"seeds {list(spec.seeds)} (the fit averages a rung's seeds)"
    )
    print(
        f"{'rung':>8} {'seed':>4} {'run id':>24} {'active':>10} {'total':>10} {'steps':>6} {'tokens':>10} "
        f"{'FLOPs':>10}"
    )
    for p in rungs + ([tgt] if tgt else []):
        lad = p.ladder
        print(
            f"{p.rung + ('*' if lad.get('target') else ''):>8} {p.seed:>4} {p.run_id:>24} {lad['params_active']:>10,} "
            f"{lad['params_total']:>10,} {p.cfg.steps:>6} {lad['tokens']:>10,} {lad['flops']:>10.3g}"
        )
    total = sum(p.ladder["flops"] for p in rungs)
    biggest = max(p.ladder["flops"] for p in rungs)
    print(
        f"all rung runs: C={total:.3g}"
        + (f"; target / largest rung: {tgt.ladder['flops'] / biggest:.2f}x" if tgt else "")
    )
    if tgt:
        print("* target; spec for `observatory ladder fit --target FILE`:")
        print(
            json.dumps({"target": {"run": tgt.run_id, "flops": tgt.ladder["flops"], "steps": tgt.cfg.steps}})
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainer ladder", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True, help="ladder YAML (trainer/configs/ladder*.yaml)")
    ap.add_argument("--runs-dir", default=None, help="where event logs go (default: env OBSERVATORY_RUNS)")
    ap.add_argument("--db", default=None, help="the store, for --target (default: env OBSERVATORY_DB)")
    ap.add_argument("--plan", action="store_true", help="print rungs, steps and compute; train nothing")
    ap.add_argument("--target", action="store_true", help="after the rungs: forecast, then train the target")
    ap.add_argument(
        "--target-override",
        action="append",
        default=[],
        metavar="key.sub=value",
        help="extra override for the target only, e.g. inject=lr_spike@400:x30 (repeatable)",
    )
    ap.add_argument("--target-run-id", default=None, help="run id of the target (default <ladder>-<rung>)")
    ap.add_argument(
        "--seeds",
        type=int,
        default=None,
        metavar="N",
        help="train seeds 0..N-1 of every rung instead of the config's `seeds:` (e.g. 2 for a quick pass)",
    )
    ap.add_argument(
        "--target-seed",
        type=int,
        default=None,
        metavar="K",
        help="train the target with seed K (run id <ladder>-<rung>-sK): another independent target "
        "run, with its own pre-registered forecast (default: the ladder's first seed)",
    )
    ap.add_argument(
        "--pack",
        type=Path,
        default=None,
        metavar="DIR",
        help="afterwards gzip the runs' event logs into DIR/<run>/ (how data/samples is made)",
    )
    args = ap.parse_args(argv)
    if bucket.is_url(args.runs_dir or settings.get("runs")):  # it reads its rungs' logs back from the folder
        ap.error(
            "trainer ladder needs a local runs dir (--runs-dir DIR); a bucket runs dir works with trainer train"
        )
    runs_dir = Path(args.runs_dir or settings.get("runs"))
    db = Path(args.db or settings.get("db"))
    try:
        spec = load_ladder_spec(args.config)
        if args.seeds is not None:
            if args.seeds < 1:
                raise ValueError(f"--seeds must be >= 1, got {args.seeds}")
            spec = dataclasses.replace(spec, seeds=tuple(range(args.seeds)))
        if args.target_seed is not None and args.target_seed < 0:
            raise ValueError(f"--target-seed must be >= 0, got {args.target_seed}")
        rungs, tgt = plan(spec, tuple(args.target_override), args.target_seed)
    except ValueError as e:
        print(f"trainer ladder: {e}", file=sys.stderr)
        return 2
    if args.plan:
        _print_plan(spec, rungs, tgt)
        return 0
    enable_compile_cache()
    if args.pack:  # the forecasts and findings beside each run's own logs, where pack() gzips them from
        os.environ["OBSERVATORY_FINDINGS_IN_RUN_FOLDERS"] = "1"
    try:
        done = run_ladder(
            spec,
            runs_dir,
            db,
            target=args.target,
            target_overrides=tuple(args.target_override),
            target_run_id=args.target_run_id,
            target_seed=args.target_seed,
        )
    except (ValueError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"trainer ladder: {e}", file=sys.stderr)
        return 1
    if args.pack:
        files = pack(runs_dir, done, args.pack)
        print(f"trainer ladder: packed {len(files)} logs into {args.pack}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
