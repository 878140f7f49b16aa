"""The training loop: `train(cfg, runs_dir) -> run_id`.

`train_with_status` sets a run up (corpus, mesh, model, optimizer, the event writer, a
resumed or forked checkpoint) and `_Loop` runs it. The loop never waits for a step to
finish before dispatching the next: step N's outputs (`trainer.step.train_step`) are
fetched with `jax.device_get` only after step N+1 is queued, so logging, the progress bar
and the event writer overlap with compute.

A step whose loss or gradient norm is not finite never changes the weights or the
optimizer state (the update is selected away on the device), so by the time the host
sees the NaN one step later, the next step has already run on clean weights; the
configured action (`failure.on_nan`) then halts, just records the skipped batch, or
rolls back to the last checkpoint with a smaller learning rate.
"""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import nnx

import observatory
from observatory import bucket, settings
from observatory.interop.wandb_mirror import WandbMirror
from observatory.writer import log_path, new_run_id
from trainer.checkpoint import Checkpointer, checkpoint_dir, parse_ref
from trainer.config import TrainConfig, diff_configs
from trainer.data import Corpus, bits_per_byte, load_corpus
from trainer.faults import FaultPlan, InjectedCrash
from trainer.flops import flops_per_token, param_counts
from trainer.mesh import batch_sharding, make_mesh
from trainer.model import TRAINABLE, Transformer, moe_layers
from trainer.step import (
    eval_step,
    lr_schedule,
    make_optimizer,
    measure_peak_flops,
    place_on_mesh,
    scalar_names,
    train_step,
)

__all__ = ["train", "train_with_status", "run_name"]


# ------------------------------------------------------------------ setup


def _model_counts(cfg: TrainConfig) -> dict[str, Any]:
    total, active = param_counts(cfg.model)
    fpt = flops_per_token(cfg.model, seq_len=cfg.data.seq_len)  # at the sequence length we train on
    return {"params_total": int(total), "params_active": int(active), "flops_per_token": float(fpt)}


def _git_info() -> dict[str, Any]:
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return {"commit": commit or None, "dirty": bool(dirty)}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def _broadcast_run_id(run_id: str) -> str:
    """Process 0's run id on every process (ids are generated from time and randomness)."""
    if jax.process_count() == 1:
        return run_id
    from jax.experimental import multihost_utils

    buf = np.zeros(128, np.uint8)
    raw = run_id.encode()[:128]
    buf[: len(raw)] = np.frombuffer(raw, np.uint8)
    got = np.asarray(multihost_utils.broadcast_one_to_all(buf))
    return bytes(got[got != 0].astype(np.uint8)).decode()


class _Signals:
    """SIGTERM -> a flag the loop checks between steps (so a checkpoint can be written safely)."""

    def __init__(self):
        self.preempted = False
        self._old = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = signal.signal(signal.SIGTERM, self._on_term)
        return self

    def _on_term(self, signum, frame):
        self.preempted = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGTERM, self._old)
        return False


# -------------------------------------------------------------------- train


def train(cfg: TrainConfig, runs_dir: str | Path | None = None, **options: Any) -> str:
    """Train `cfg`, writing events to `<runs_dir>/<run_id>/`; return the run id.

    The options are `train_with_status`'s keywords. run_id: the run's id (default from the
    config name). resume: "RUN" or "RUN@STEP" -- continue that run (same id, events appended)
    from its latest or the given checkpoint. fork: "RUN@STEP" -- a new run starting from that
    checkpoint, with `parent` set and a `config_diff` event. `cfg` is the config to run with in
    both cases (the CLI builds it from the checkpoint's config plus overrides). ladder:
    `{name, rung, ...}` for run_start. tags: run tags (default the config's).
    Raises on failure after writing `failure` and `run_end(failed)`; returns normally after a halt
    or a preemption (the run_end status says which; `train_with_status` returns it too).
    """
    return train_with_status(cfg, runs_dir, **options)[0]


def run_name(config_name: str, ladder: dict | None) -> str:
    """The run's readable name in run_start: '<ladder> <rung> seed <k>' for a ladder run, else the config's name.

    A ladder run's config is named after its run id; the readable name says what the id encodes.
    """
    if ladder and ladder.get("name") and ladder.get("rung"):
        kind = " target" if ladder.get("target") else ""
        return f"{ladder['name']} {ladder['rung']}{kind} seed {ladder.get('seed', 0)}"
    return config_name


def train_with_status(
    cfg: TrainConfig,
    runs_dir: str | Path | None = None,
    *,
    run_id: str | None = None,
    resume: str | None = None,
    fork: str | None = None,
    ladder: dict[str, Any] | None = None,
    tags: list[str] | None = None,
) -> tuple[str, str]:
    """`train`, returning (run id, run_end status)."""
    if resume and fork:
        raise ValueError("give either resume or fork, not both")
    runs_dir = bucket.location(runs_dir if runs_dir is not None else settings.get("runs"))  # or s3://, gs://
    pid, nproc = jax.process_index(), jax.process_count()

    src_run, src_step, src_meta = None, None, None
    if resume or fork:
        src_run, src_step = parse_ref(resume or fork, need_step=bool(fork))
        src = Checkpointer(checkpoint_dir(runs_dir, src_run), read_only=True)
        src_step = src.resolve(src_step)
        src_meta = src.meta(src_step)
        src.mgr.close()
    if resume:
        if run_id is not None and run_id != src_run:
            raise ValueError(f"resume continues run {src_run}; do not also give run_id={run_id}")
        run_id = src_run
    elif run_id is None:
        run_id = _broadcast_run_id(new_run_id(cfg.name))

    corpus = load_corpus(cfg.data.path, eval_fraction=cfg.data.eval_fraction, name=cfg.data.name)
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.expert)
    model = Transformer(cfg.model, rngs=nnx.Rngs(cfg.seed), mesh=mesh)
    optimizer = nnx.Optimizer(model, make_optimizer(cfg), wrt=TRAINABLE)
    place_on_mesh((model, optimizer), mesh)

    sinks = []
    if cfg.wandb.mode != "disabled" and pid == 0:
        wandb_dir = log_path(runs_dir, run_id, 0).parent  # W&B's own files next to our event log (or spool)
        wandb_dir.mkdir(parents=True, exist_ok=True)
        sinks.append(
            WandbMirror(
                project=cfg.wandb.project,
                mode=cfg.wandb.mode,
                run_id=run_id,
                config=cfg.to_dict(),
                dir=str(wandb_dir),
            )
        )
    model_info = _model_counts(cfg)
    run = observatory.init(
        run_id=run_id,
        name=run_name(cfg.name, ladder),
        config=cfg.to_dict(),
        runs_dir=runs_dir,
        host=pid,
        parent={"run": src_run, "step": src_step} if fork else None,
        ladder=ladder,
        code=_git_info(),
        data={"name": corpus.name, "fingerprint": corpus.fingerprint, "tokens": corpus.tokens},
        mesh={
            "data": cfg.mesh.data,
            "expert": cfg.mesh.expert,
            "processes": nproc,
            "devices": jax.device_count(),
        },
        model=model_info,
        tags=list(tags if tags is not None else cfg.tags),
        sinks=sinks,
        write_start=(pid == 0 and not resume),
        install_signal_handlers=False,
    )
    # observatory.init said phase "init"; phases and heartbeats tell a hang, a stall and a dead process apart
    status, loop = "failed", None
    try:
        loop = _Loop(cfg, run, corpus, mesh, model, optimizer, runs_dir, model_info)
        with _Signals() as sig:
            loop.signals = sig
            if src_meta is not None:
                loop.start_from(src_run, src_step, src_meta, fork=bool(fork))
            loop.fit()
            status = "preempted" if loop.preempted else ("failed" if loop.halted else "completed")
    except BaseException as e:
        status = "killed" if isinstance(e, KeyboardInterrupt) else "failed"
        run.event(
            "failure",
            {
                "type": "signal" if isinstance(e, KeyboardInterrupt) else "exception",
                "message": f"{type(e).__name__}: {e}"[:2000],
                "traceback": "".join(traceback.format_exception(e))[-20000:],
                "action": "halt",
            },
            step=loop.step if loop else None,
        )
        raise
    finally:
        try:
            if loop is not None:
                loop.close(save=status in ("completed", "preempted") or loop.halted)
        finally:
            run.finish(status, final_step=loop.step if loop else None)
    return run_id, status


class _Loop:
    """State of one training process: step counter, LR scale, fault plan, pending device outputs."""

    def __init__(self, cfg, run, corpus: Corpus, mesh, model, optimizer, runs_dir: Path, model_info):
        self.cfg, self.run, self.corpus, self.mesh = cfg, run, corpus, mesh
        self.model, self.optimizer = model, optimizer
        self.pid, self.nproc = jax.process_index(), jax.process_count()
        self.step = 0  # optimizer steps taken (and the step label of the last one)
        self.lr_scale = 1.0
        self.rollbacks = 0
        self.plan = FaultPlan(cfg.inject)
        self.lrs = lr_schedule(cfg)
        self.flops_per_token = model_info["flops_per_token"]
        self.preempted = self.halted = False
        self.compiling = False  # between the first dispatch and its values (`_fit`, `_finish_step`)
        self.signals: _Signals | None = None
        self.ckpt = Checkpointer(
            checkpoint_dir(runs_dir, run.id), keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save
        )
        self.sharding = batch_sharding(mesh)
        self.tokens_per_step = cfg.data.batch_size * cfg.data.seq_len
        self.moe_layer_ids = moe_layers(cfg.model)
        self.bar = None
        self.peak = None
        self._pending = None
        self.t_last = None  # when the previous step's values reached the host
        self.t_skip_next = False  # the next step's wall time includes eval/checkpoint work

    # ------------------------------------------------------------ plumbing

    def _global(self, local: np.ndarray) -> jax.Array:
        b = self.cfg.data.batch_size
        return jax.make_array_from_process_local_data(self.sharding, local, (b, local.shape[1]))

    def _batch(self, step: int, bad: bool) -> jax.Array:
        d = self.cfg.data
        local = self.corpus.batch(
            step, d.batch_size, d.seq_len, d.seed, process_index=self.pid, process_count=self.nproc
        )
        if bad:  # inject=bad_batch: one repeated byte, the degenerate batch real pipelines sometimes emit
            local = np.full_like(local, ord(" "))
        return self._global(local)

    def _meta(self) -> dict[str, Any]:
        return {
            "config": self.cfg.to_dict(),
            "lr_scale": self.lr_scale,
            "fired": sorted(self.plan.fired),
            "rollbacks": self.rollbacks,
            "tokens": self.step * self.tokens_per_step,
            "run": self.run.id,
        }

    def _emit_checkpoints(self, wait: bool = False) -> None:
        for step, path, nbytes in self.ckpt.completed(wait=wait):
            if self.pid == 0:
                self.run.event("checkpoint", {"path": str(path), "bytes": nbytes}, step=step)

    def save(self, wait: bool = False) -> None:
        self.ckpt.save(self.step, self.model, self.optimizer, self._meta())
        self._emit_checkpoints(wait=wait)

    def start_from(self, src_run: str, src_step: int, meta: dict[str, Any], *, fork: bool) -> None:
        """Load a checkpoint (resume or fork) and record what changed against its config."""
        src = Checkpointer(checkpoint_dir(self.ckpt.directory.parent.parent, src_run), read_only=True)
        src.restore(src_step, self.model, self.optimizer)
        src.mgr.close()
        self.step = src_step
        self.lr_scale = float(meta.get("lr_scale", 1.0))
        self.rollbacks = int(meta.get("rollbacks", 0))
        self.plan.fired = set(meta.get("fired", []))
        changes = diff_configs(meta.get("config", {}), self.cfg.to_dict())
        if self.pid == 0 and (fork or changes):
            self.run.event(
                "config_diff",
                {"against": {"run": src_run, "step": src_step}, "changes": changes},
                step=src_step,
            )
        if self.pid == 0 and not fork:
            self.run.note(f"resumed from checkpoint at step {src_step}", author="trainer", step=src_step)

    # ----------------------------------------------------------------- loop

    def fit(self) -> None:
        try:
            self._fit()
        except BaseException:
            # An exception between dispatching and reading a step: log what already ran, if we can.
            if self._pending is not None:
                try:
                    self._finish_step(*self._pending)
                except Exception:
                    pass
            raise

    def _fit(self) -> None:
        cfg = self.cfg
        tel = cfg.telemetry
        if tel.enabled:
            self.peak = tel.peak_flops or measure_peak_flops()
        if self.pid == 0 and tel.progress:
            from tqdm.auto import tqdm

            self.bar = tqdm(
                total=cfg.steps, initial=self.step, desc=self.run.id[:40], unit="step", dynamic_ncols=True
            )
        if cfg.failure.on_nan == "rollback" and not self.ckpt.steps():
            self.save(wait=True)  # something to roll back to before the first periodic checkpoint
        self._pending = pending = None  # (step, outputs, lr, faults) of the dispatched step not yet read
        self.run.phase("compile")  # the first step jits; `_finish_step` says "train" once it has run
        self.compiling = True
        self.t_last = None
        self.t_skip_next = False
        step = self.step
        while step < cfg.steps or pending is not None:
            out = None
            if step < cfg.steps and not (self.signals and self.signals.preempted):
                step += 1
                due = self.plan.at(step)
                if any(f.kind == "crash" for f in due):
                    raise InjectedCrash(f"inject=crash@{step}")
                batch = self._batch(step, bad=any(f.kind == "bad_batch" for f in due))
                lr = (
                    self.lrs[min(step, cfg.steps)] * self.lr_scale * self.plan.lr_factor(due, step, cfg.steps)
                )
                poison = np.float32(np.nan if any(f.kind == "nan" for f in due) else 0.0)
                out = (
                    step,
                    train_step(
                        self.model, self.optimizer, batch, np.float32(lr), poison, telemetry=tel.enabled
                    ),
                    float(lr),
                    due,
                )
            if pending is not None:
                action = self._finish_step(*pending)  # step N's values, while step N+1 runs
                if action == "rollback":
                    if out is not None:
                        jax.block_until_ready(out[1])  # let the in-flight step land, then discard it
                    step = self._rollback()
                    self._pending = pending = None
                    continue
                if action == "halt":
                    self._pending = None
                    if out is not None:
                        self._finish_step(*out)
                    self.halted = True
                    return
            self._pending = pending = out
            if pending is None and self.signals and self.signals.preempted:
                self.preempted = True
                return
            if pending is not None:
                self._periodic(pending[0])

    def _periodic(self, step: int) -> None:
        """Eval and checkpoint work due after dispatching `step` (uses the weights after it)."""
        cfg = self.cfg
        busy = False
        if cfg.eval.every and (step % cfg.eval.every == 0 or step == cfg.steps):
            self.run.phase("eval", step=step)
            self.evaluate(step)
            busy = True
        if cfg.checkpoint.every and step % cfg.checkpoint.every == 0 and step < cfg.steps:
            self.step = step
            self.run.phase("checkpoint", step=step)
            self.save()
            busy = True
        else:
            self._emit_checkpoints()
        if busy:  # the next step's wall time includes this host work: do not report it as throughput
            self.t_skip_next = True
            self.run.phase("train", step=step)

    def _finish_step(self, step: int, out: dict, lr: float, due) -> str | None:
        """Bring step `step`'s values to the host, log them, and decide what a NaN means."""
        every = self.cfg.telemetry.expert_load_every
        want_loads = self.pid == 0 and every and step % every == 0 and "loads" in out
        # per-expert counts cross to the host only on the steps that log them
        fetched = jax.device_get((out["scalars"], out["loads"] if want_loads else None))
        names = scalar_names(self.cfg.model, self.cfg.telemetry.enabled)
        vals = dict(zip(names, fetched[0].tolist(), strict=True))
        now = time.perf_counter()
        self.step = step
        cfg, run = self.cfg, self.run
        if self.compiling:
            run.phase("train", step=step)
            self.compiling = False
        loss = float(vals["train/loss"])
        for f in due:
            if f.kind != "crash" and self.pid == 0:
                run.note(f"fault injected: {f}", author="trainer", step=step)
        metrics: dict[str, float] = {}
        if self.t_last is not None and not self.t_skip_next:
            dt = max(now - self.t_last, 1e-9)
            tps = self.tokens_per_step / dt
            metrics["throughput/tokens_per_s"] = tps
            metrics["throughput/step_time_s"] = dt
            if self.peak:
                metrics["throughput/mfu"] = self.flops_per_token * tps / (self.peak * self.nproc)
        self.t_last, self.t_skip_next = now, False
        if self.pid == 0:
            if cfg.telemetry.enabled:
                metrics.update((k, v) for k, v in vals.items() if k != "ok")
            if want_loads:
                routed, dropped = fetched[1]  # (L_moe, E) each
                for j, layer in enumerate(self.moe_layer_ids):
                    run.log_expert_load(step, layer, routed[j].tolist(), dropped[j].tolist())
            metrics["train/loss"] = loss
            metrics["opt/lr"] = lr
            metrics["data/tokens"] = float(step * self.tokens_per_step)
            run.log(metrics, step=step)
        elif metrics:  # host-local: this process's throughput
            local = {k: v for k, v in metrics.items() if k.startswith("throughput/")}
            local["throughput/tokens_per_s"] = local.get("throughput/tokens_per_s", 0.0) / self.nproc
            run.log(local, step=step)
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            post = {"loss": f"{loss:.3f}"}
            if "throughput/tokens_per_s" in metrics:
                post["tok/s"] = f"{metrics['throughput/tokens_per_s']:.0f}"
            self.bar.set_postfix(post, refresh=False)
        if vals["ok"] == 1.0 and math.isfinite(loss):
            return None
        return self._on_nan(step, loss)

    def _on_nan(self, step: int, loss: float) -> str:
        policy = self.cfg.failure.on_nan
        if policy == "rollback" and self.rollbacks >= self.cfg.failure.max_rollbacks:
            policy = "halt"
        msg = f"non-finite loss {loss} at step {step}; the update was not applied"
        if policy == "rollback":
            msg += f"; rolling back to the last checkpoint with LR x{self.cfg.failure.rollback_lr_scale:g}"
        self.run.event("failure", {"type": "nan_loss", "message": msg, "action": policy}, step=step)
        return None if policy == "skip_batch" else policy

    def _rollback(self) -> int:
        self.ckpt.mgr.wait_until_finished()
        self._emit_checkpoints(wait=True)
        target = self.ckpt.latest()
        meta = self.ckpt.restore(target, self.model, self.optimizer)
        self.rollbacks += 1
        self.lr_scale = float(meta.get("lr_scale", 1.0)) * self.cfg.failure.rollback_lr_scale
        self.step = target
        if self.pid == 0:
            self.run.note(
                f"rolled back to step {target}; LR scale now {self.lr_scale:g}", author="trainer", step=target
            )
        self.t_last = None
        if self.bar is not None:
            self.bar.reset(total=self.cfg.steps)
            self.bar.update(target)
        return target

    def evaluate(self, step: int) -> None:
        d = self.cfg.data
        batches = self.corpus.eval_batches(
            self.cfg.eval.batches, d.batch_size, d.seq_len, process_index=self.pid, process_count=self.nproc
        )
        losses = [eval_step(self.model, self._global(b)) for b in batches]
        loss = float(np.mean(jax.device_get(losses)))
        if self.pid == 0:
            self.run.event(
                "eval",
                {"dataset": f"{self.corpus.name}/heldout", "loss": loss, "bpb": bits_per_byte(loss)},
                step=step,
            )

    def close(self, save: bool) -> None:
        self.run.phase("shutdown")
        try:
            if save and self.cfg.checkpoint.at_exit and self.step > 0:
                self.save()
            self._emit_checkpoints(wait=True)
        finally:
            self.ckpt.close()
            if self.bar is not None:
                self.bar.close()
