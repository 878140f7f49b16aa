"""The `trainer` command.

    trainer train --config trainer/configs/tiny.yaml [--runs-dir DIR] [--run-id ID]
                  [--resume RUN[@STEP]] [--fork RUN@STEP] [key.sub=value ...]
    trainer ladder ...            (trainer.ladder:main)

Multi-host: give every process the same command plus --coordinator HOST:PORT
--num-processes N --process-id I (or env TRAINER_COORDINATOR, TRAINER_NUM_PROCESSES,
TRAINER_PROCESS_ID); processes meet through `jax.distributed.initialize` (gloo on CPU).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from observatory import bucket, settings
from trainer import ladder
from trainer.runtime import enable_compile_cache, init_distributed

__all__ = ["main", "resolve_config"]


def _top_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trainer", description="JAX MoE trainer that writes observatory event logs."
    )
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("train", help="train a model (see `trainer train --help`)", add_help=False)
    sub.add_parser("ladder", help="run a scaling ladder (see `trainer ladder --help`)", add_help=False)
    return p


def _train_parser() -> argparse.ArgumentParser:
    t = argparse.ArgumentParser(
        prog="trainer train",
        description="Train a model. Overrides are key.sub=value (e.g. optimizer.lr=1e-3 inject=nan@20).",
    )
    t.add_argument("--config", help="YAML config (trainer/configs/*.yaml); optional with --resume/--fork")
    t.add_argument(
        "--runs-dir",
        default=None,
        help="where event logs go (default: the `runs` setting: env OBSERVATORY_RUNS, else ~/.local/share/observatory/runs)",
    )
    t.add_argument("--run-id", default=None, help="run id (default: <name>-<time>-<random>)")
    g = t.add_mutually_exclusive_group()
    g.add_argument(
        "--resume", metavar="RUN[@STEP]", help="continue RUN from its latest (or STEP's) checkpoint"
    )
    g.add_argument("--fork", metavar="RUN@STEP", help="start a new run from RUN's checkpoint at STEP")
    t.add_argument(
        "--coordinator",
        default=os.environ.get("TRAINER_COORDINATOR"),
        help="multi-host: HOST:PORT of process 0",
    )
    t.add_argument("--num-processes", type=int, default=int(os.environ.get("TRAINER_NUM_PROCESSES", "1")))
    t.add_argument("--process-id", type=int, default=int(os.environ.get("TRAINER_PROCESS_ID", "0")))
    t.add_argument("--tag", action="append", default=None, help="run tag (repeatable)")
    t.add_argument("overrides", nargs="*", metavar="key.sub=value")
    return t


def resolve_config(
    config: str | None,
    overrides: list[str],
    *,
    runs_dir: Path,
    resume: str | None = None,
    fork: str | None = None,
):
    """The config a command runs with: the YAML file, else (resume/fork) the checkpoint's config,
    then the overrides."""
    # lazy for start-up time: trainer.config and trainer.checkpoint load JAX
    from trainer.config import load_config

    if config is not None or not (resume or fork):
        if config is None:
            raise ValueError("trainer train: --config PATH is required (unless --resume or --fork)")
        return load_config(config, overrides)
    from trainer.checkpoint import Checkpointer, checkpoint_dir, parse_ref

    run, step = parse_ref(resume or fork, need_step=bool(fork))
    ck = Checkpointer(checkpoint_dir(runs_dir, run), read_only=True)
    try:
        meta = ck.meta(ck.resolve(step))
    finally:
        ck.mgr.close()
    return load_config(None, overrides, base=meta["config"])


def cmd_train(args) -> int:
    runs_dir = bucket.location(args.runs_dir or settings.get("runs"))  # a folder, or s3:// or gs://
    try:
        cfg = resolve_config(
            args.config, args.overrides, runs_dir=runs_dir, resume=args.resume, fork=args.fork
        )
    except ValueError as e:
        print(f"trainer train: {e}", file=sys.stderr)
        return 2
    init_distributed(args.coordinator, args.num_processes, args.process_id)
    enable_compile_cache()
    from trainer.train import train_with_status  # lazy for start-up time (JAX)

    run_id, status = train_with_status(
        cfg, runs_dir, run_id=args.run_id, resume=args.resume, fork=args.fork, tags=args.tag
    )
    print(f"run {run_id}: {status}; events in {bucket.safe(str(runs_dir))}/{run_id}", file=sys.stderr)
    return 0 if status in ("completed", "preempted") else 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "ladder":
        return ladder.main(argv[1:]) or 0
    if argv and argv[0] == "train":
        return cmd_train(_train_parser().parse_intermixed_args(argv[1:]))
    _top_parser().parse_args(argv)  # prints usage / help and exits
    return 2


if __name__ == "__main__":
    sys.exit(main())
