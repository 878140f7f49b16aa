"""A tiny Levanter training run on CPU, for tests/test_levanter.py (runs in the `.venv-levanter` venv).

Nothing can be downloaded, so everything the run needs is made here: a byte-level BPE
tokenizer trained with `tokenizers` on a small generated corpus, the corpus as JSONL
shards, and a `train_lm` YAML config whose tracker list is
`[{type: observatory}, {type: wandb, mode: offline}]`. Then the launcher
(`python -m observatory.integrations.levanter.train_lm`) trains on it.

    .venv-levanter/bin/python tests/levanter_fixture.py OUT_DIR [--model llama|mixtral] [--steps 20]

OUT_DIR gets `runs/` (our event logs), `wandb/` (W&B offline files), `config.yaml` and `run.json`
({run_id, runs_dir, wandb_dir}).

    .venv-levanter/bin/python tests/levanter_fixture.py OUT_DIR --model calls

drives the tracker directly, through Levanter's own tracker config and value types, with
every kind of value and call it gets (odd config values, SummaryStats, `step=None`,
summaries, artifacts, grug MoE router statistics), and ends with an uncaught exception, so
that the event log shows what `failure` handling writes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import yaml

WORDS = (
    "the expert router sends each token to two experts and the load stays balanced while "
    "loss falls slowly over steps as the model learns simple patterns of text data"
).split()


def write_corpus(folder: Path, shards: int = 3, docs: int = 60, seed: int = 0) -> list[Path]:
    """JSONL shards of {"text": ...} documents made of a small vocabulary (learnable, repetitive)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(shards):
        path = folder / f"shard-{s}.jsonl"
        with open(path, "w") as f:
            for _ in range(docs):
                n = rng.randint(40, 120)
                f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(n))}) + "\n")
        paths.append(path)
    return paths


def build_tokenizer(folder: Path, corpus: list[Path], vocab_size: int = 512) -> Path:
    """A byte-level BPE tokenizer trained on the corpus, saved as a Hugging Face tokenizer folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [json.loads(line)["text"] for p in corpus for line in open(p)]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"
    )
    folder.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(folder)
    return folder


def model_config(kind: str, tokenizer: Path) -> dict:
    common = {
        "max_seq_len": 64,
        "hidden_dim": 32,
        "intermediate_dim": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 2,
        "tokenizer": str(tokenizer),
        "reference_checkpoint": str(tokenizer),
        "gradient_checkpointing": False,
    }
    if kind == "llama":
        return {"type": "llama", **common}
    if kind == "mixtral":
        return {
            "type": "mixtral",
            **common,
            "n_routed_experts": 4,
            "num_experts_per_tok": 2,
            "use_flash_attention": False,
        }
    raise ValueError(f"unknown model {kind!r}")


def write_config(out: Path, kind: str, steps: int, run_id: str, runs_dir: str) -> Path:
    corpus = write_corpus(out / "corpus")
    tokenizer = build_tokenizer(out / "tokenizer", corpus)
    val = write_corpus(out / "corpus-val", shards=1, docs=20, seed=1)
    config = {
        "data": {
            "tokenizer": str(tokenizer),
            "cache_dir": str(out / "cache"),
            "components": {
                "text": {
                    "source": {
                        "type": "url",
                        "train_urls": [str(p) for p in corpus],
                        "validation_urls": [str(p) for p in val],
                    },
                },
            },
        },
        "model": model_config(kind, tokenizer),
        "trainer": {
            "id": run_id,
            "num_train_steps": steps,
            "train_batch_size": 4,
            "per_device_parallelism": -1,
            "steps_per_eval": 5,
            "max_eval_batches": 2,
            "require_accelerator": False,
            "log_jaxprs": False,  # each costs a second trace of the step; the config.yaml artifact remains
            "log_xla_hlo": False,
            "log_dir": str(out / "logs"),
            "checkpointer": {"base_path": str(out / "checkpoints"), "save_interval": "1h"},
            "watch": {"interval": 2, "include_histograms": True},
            "tracker": [
                {"type": "observatory", "runs_dir": runs_dir, "tags": ["levanter", kind]},
                {"type": "wandb", "mode": "offline", "project": "observatory-test", "save_code": False},
            ],
        },
        "optimizer": {"learning_rate": 3e-3, "warmup": 0.1},
    }
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def drive_tracker(out: Path, runs_dir: str) -> None:
    """Every Tracker call with the values Levanter sends; then an uncaught exception."""
    import dataclasses
    import datetime
    import enum

    import draccus
    import jax.numpy as jnp
    import numpy as np
    from levanter.tracker import TrackerConfig
    from levanter.tracker.histogram import Histogram, SummaryStats

    import observatory.integrations.levanter  # noqa: F401  (registers `type: observatory`)
    from observatory.integrations.levanter.names import markdown_table

    (out / "names.md").write_text(markdown_table() + "\n")  # docs/levanter.md's copy is checked against it

    class Mode(str, enum.Enum):  # noqa: UP042  (the str-subclass enums Levanter configs use)
        fast = "fast"

    @dataclasses.dataclass
    class Inner:
        path: Path = Path("/data/x")

    cfg = draccus.decode(TrackerConfig, {"type": "observatory", "runs_dir": runs_dir, "tags": ["unit"]})
    tracker = cfg.init("levanter-calls")
    tracker.log_hyperparameters(
        {
            "dtype": jnp.bfloat16,
            "np_dtype": np.dtype("float32"),
            "path": Path("/tmp/ckpt"),
            "every": datetime.timedelta(minutes=10),
            "mode": Mode.fast,
            "inner": Inner(),
            "fn": len,
            "wandb": {"api_key": "0123456789abcdef0123456789abcdef01234567"},
            "steps": (1, 2, 3),
        }
    )
    tracker.log(
        {"train/loss": jnp.asarray(3.5), "np": np.asarray(2.0), "py": 1, "nested": {"a": 0.5}}, step=0
    )
    tracker.log({"from_jit": 7.0}, step=None)  # what jit_log sends from inside jit
    grad = SummaryStats.from_array(jnp.linspace(-1.0, 1.0, 101), num_bins=10)
    tracker.log({"train/loss": 3.0, "grad/hist/w": grad, "note_text": "hello"}, step=1)
    # Marin's grug MoE router statistics, built as grug builds them (a histogram over expert ids)
    counts = jnp.asarray([10.0, 30.0, 0.0, 24.0])
    ids = jnp.arange(4, dtype=jnp.float32)
    hist = SummaryStats.from_reduced_values(
        min=jnp.asarray(0.0),
        max=jnp.asarray(3.0),
        num=counts.sum(),
        nonzero_count=jnp.sum(counts > 0),
        sum=jnp.sum(counts * ids),
        sum_squares=jnp.sum(counts * ids * ids),
        histogram=Histogram(bucket_limits=jnp.arange(5, dtype=jnp.float32), bucket_counts=counts),
    )
    tracker.log(
        {
            "train/router/layer_0/routing_hist": hist,
            "train/router/routing_counts_per_layer": jnp.stack([counts, counts[::-1]]),
            "train/router/layer_0/capacity_overflow_rate": jnp.asarray(0.125),
            "train/router/load_balancing_loss": 1.01,
            "moe/drop_fraction": 0.05,
        },
        step=2,
    )
    tracker.log_summary({"parameter_count": 44192, "backend": "cpu", "ok": True})
    artifact = out / "config.yaml"
    artifact.write_text("a: 1\n")
    tracker.log_artifact(artifact, name="config.yaml", type="config")
    tracker.log_hyperparameters({"optimizer": {"lr": 0.1}})
    raise RuntimeError("boom in the training loop")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--model", default="llama", choices=("llama", "mixtral", "calls"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--launcher", default="observatory.integrations.levanter.train_lm")
    ap.add_argument("--runs-dir", help="the tracker's runs_dir (default OUT_DIR/runs; a bucket URL too)")
    args = ap.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = args.runs_dir or str(out / "runs")
    if args.model == "calls":
        drive_tracker(out, runs_dir)
    run_id = f"levanter-{args.model}"
    cfg = write_config(out, args.model, args.steps, run_id, runs_dir)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(out),
        "WANDB_SILENT": "true",
        "JAX_PLATFORMS": "cpu",
        "GIT_PYTHON_REFRESH": "quiet",
    }
    subprocess.run(
        [sys.executable, "-m", args.launcher, "--config_path", str(cfg)], env=env, cwd=out, check=True
    )
    (out / "run.json").write_text(
        json.dumps({"run_id": run_id, "runs_dir": runs_dir, "wandb_dir": str(out / "wandb")})
    )


if __name__ == "__main__":
    main()
