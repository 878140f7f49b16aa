"""The training config: frozen dataclasses, loaded from YAML, overridden by `key.sub=value`.

    cfg = load_config("trainer/configs/tiny.yaml", ["optimizer.lr=1e-3", "inject=nan@20"])
    cfg.to_dict()          # nested plain dict, what run_start records
    diff_configs(a, b)     # {"dotted.key": [old, new]} for config_diff events

Every section validates itself in `__post_init__`; a bad value raises `ValueError`
naming the key and how to fix it. An unknown key (in YAML or on the command line)
raises `ValueError` naming it, the file and line when there is one, and the closest
known keys.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from trainer.faults import parse_faults
from trainer.model import ModelConfig

__all__ = [
    "TrainConfig",
    "OptimizerConfig",
    "ScheduleConfig",
    "DataConfig",
    "MeshConfig",
    "CheckpointConfig",
    "EvalConfig",
    "TelemetryConfig",
    "FailureConfig",
    "WandbConfig",
    "load_config",
    "from_dict",
    "apply_overrides",
    "diff_configs",
    "flatten",
]


def _require(ok: bool, key: str, msg: str) -> None:
    if not ok:
        raise ValueError(f"{key}: {msg}")


@dataclass(frozen=True)
class OptimizerConfig:
    """AdamW with global-norm gradient clipping."""

    lr: float = 3e-3  # peak learning rate (after warmup)
    weight_decay: float = 0.1  # decoupled; not applied to norms, biases or the router bias
    b1: float = 0.9
    b2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # max global grad norm; 0 turns clipping off

    def __post_init__(self):
        _require(self.lr > 0, "optimizer.lr", f"must be > 0, got {self.lr}")
        _require(self.weight_decay >= 0, "optimizer.weight_decay", f"must be >= 0, got {self.weight_decay}")
        _require(0 <= self.b1 < 1 and 0 <= self.b2 < 1, "optimizer.b1/b2", "must be in [0, 1)")
        _require(self.grad_clip >= 0, "optimizer.grad_clip", f"must be >= 0 (0 = off), got {self.grad_clip}")


@dataclass(frozen=True)
class ScheduleConfig:
    """Learning-rate schedule. Both kinds warm up linearly from 0 over `warmup_steps`.

    cosine: cosine decay from lr to lr * min_lr_ratio at the last step.
    wsd:    warmup, stable at lr, then linear decay to lr * min_lr_ratio over the last
            `decay_fraction` of the steps (warmup-stable-decay).
    """

    kind: Literal["cosine", "wsd", "constant"] = "cosine"
    warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    decay_fraction: float = 0.2  # wsd only

    def __post_init__(self):
        _require(
            self.kind in ("cosine", "wsd", "constant"), "schedule.kind", "must be cosine, wsd or constant"
        )
        _require(self.warmup_steps >= 0, "schedule.warmup_steps", "must be >= 0")
        _require(0 <= self.min_lr_ratio <= 1, "schedule.min_lr_ratio", "must be in [0, 1]")
        _require(0 < self.decay_fraction <= 1, "schedule.decay_fraction", "must be in (0, 1]")


@dataclass(frozen=True)
class DataConfig:
    path: str | None = None  # directory of text / JSONL files; None = this Python's stdlib sources
    name: str | None = None  # dataset name in run_start; default derived from the path
    seq_len: int = 128  # T: tokens (bytes) per sequence
    batch_size: int = 16  # global batch B (sequences per step, all processes together)
    seed: int = 0  # batch order: batch(step) is a function of (seed, step)
    eval_fraction: float = 0.01  # share of documents held out for eval

    def __post_init__(self):
        _require(self.seq_len >= 2, "data.seq_len", f"must be >= 2, got {self.seq_len}")
        _require(self.batch_size >= 1, "data.batch_size", f"must be >= 1, got {self.batch_size}")
        _require(0 < self.eval_fraction < 0.5, "data.eval_fraction", "must be in (0, 0.5)")


@dataclass(frozen=True)
class MeshConfig:
    """Device mesh: data * expert devices (over all processes)."""

    data: int = 1
    expert: int = 1

    def __post_init__(self):
        _require(self.data >= 1 and self.expert >= 1, "mesh", "data and expert must be >= 1")


@dataclass(frozen=True)
class CheckpointConfig:
    every: int = 0  # save every N steps; 0 = only at exit
    keep: int = 3  # checkpoints kept on disk (oldest deleted first)
    at_exit: bool = True  # also save when the run ends (completed, halted or preempted)
    async_save: bool = True  # write in the background while training continues

    def __post_init__(self):
        _require(self.every >= 0, "checkpoint.every", "must be >= 0 (0 = only at exit)")
        _require(self.keep >= 1, "checkpoint.keep", "must be >= 1")


@dataclass(frozen=True)
class EvalConfig:
    every: int = 50  # held-out eval every N steps (and at the last step); 0 = never
    batches: int = 4  # eval batches of data.batch_size sequences each

    def __post_init__(self):
        _require(self.every >= 0, "eval.every", "must be >= 0 (0 = never)")
        _require(self.batches >= 1, "eval.batches", "must be >= 1")


@dataclass(frozen=True)
class TelemetryConfig:
    enabled: bool = True  # False: only train/loss leaves the device (for overhead benchmarks)
    expert_load_every: int = 1  # expert_load events every N steps; 0 = never
    peak_flops: float = 0.0  # FLOP/s of this process's devices for MFU; 0 = measure at start
    progress: bool = True  # tqdm progress bar on process 0

    def __post_init__(self):
        _require(self.expert_load_every >= 0, "telemetry.expert_load_every", "must be >= 0 (0 = never)")
        _require(self.peak_flops >= 0, "telemetry.peak_flops", "must be >= 0 (0 = measure)")


@dataclass(frozen=True)
class FailureConfig:
    """What a non-finite loss does. The step that produced it never updates the weights."""

    on_nan: Literal["halt", "skip_batch", "rollback"] = "halt"
    rollback_lr_scale: float = 0.5  # rollback: LR multiplier applied after each rollback
    max_rollbacks: int = 3  # then halt

    def __post_init__(self):
        _require(
            self.on_nan in ("halt", "skip_batch", "rollback"),
            "failure.on_nan",
            f"must be halt, skip_batch or rollback, got {self.on_nan!r}",
        )
        _require(0 < self.rollback_lr_scale <= 1, "failure.rollback_lr_scale", "must be in (0, 1]")
        _require(self.max_rollbacks >= 0, "failure.max_rollbacks", "must be >= 0")


@dataclass(frozen=True)
class WandbConfig:
    mode: Literal["disabled", "offline", "online"] = "disabled"
    project: str = "observatory"

    def __post_init__(self):
        _require(
            self.mode in ("disabled", "offline", "online"),
            "wandb.mode",
            f"must be disabled, offline or online, got {self.mode!r}",
        )


@dataclass(frozen=True)
class TrainConfig:
    name: str = "run"  # run name; the run id is <name>-<time>-<random> unless given
    steps: int = 100  # optimizer steps
    seed: int = 0  # model init
    tags: tuple[str, ...] = ()
    inject: tuple[
        str, ...
    ] = ()  # faults: lr_spike@STEP:xFACTOR, bad_batch@STEP, nan@STEP, crash@STEP, lr_drift@STEP:xFACTOR
    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    failure: FailureConfig = field(default_factory=FailureConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)

    def __post_init__(self):
        _require(self.steps >= 1, "steps", f"must be >= 1, got {self.steps}")
        n = self.mesh.data * self.mesh.expert
        _require(
            self.data.batch_size % n == 0,
            "data.batch_size",
            f"{self.data.batch_size} must be a multiple of mesh.data * mesh.expert = {n}",
        )
        parse_faults(self.inject)  # raises ValueError naming the bad entry

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (tuples as lists): what run_start records and YAML round-trips."""
        return _plain(dataclasses.asdict(self))

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x


# --------------------------------------------------------------- typed parsing


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_dataclass_type(tp) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def all_keys(cls=TrainConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a config class."""
    out = []
    for name, tp in _hints(cls).items():
        if name.startswith("_") or name not in {f.name for f in dataclasses.fields(cls)}:
            continue
        if _is_dataclass_type(tp):
            out.extend(all_keys(tp, f"{prefix}{name}."))
        else:
            out.append(prefix + name)
    return out


def _unknown(key: str, where: str = "") -> ValueError:
    close = difflib.get_close_matches(key, all_keys(), n=3, cutoff=0.5)
    if not close:  # a misspelled section or leaf: also try matching the leaf name alone
        leaf = key.rsplit(".", 1)[-1]
        close = [
            k
            for k in all_keys()
            if k.rsplit(".", 1)[-1]
            in difflib.get_close_matches(leaf, [x.rsplit(".", 1)[-1] for x in all_keys()], n=3, cutoff=0.6)
        ][:3]
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    return ValueError(f"{where}unknown config key {key!r}{hint}")


_BOOL = {
    "true": True,
    "yes": True,
    "on": True,
    "1": True,
    "false": False,
    "no": False,
    "off": False,
    "0": False,
}


def coerce(key: str, tp: Any, value: Any) -> Any:
    """`value` (from YAML or a CLI string) as type `tp`, or ValueError naming `key`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.strip().lower() in ("none", "null", "~")):
            if type(None) in args:
                return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return coerce(key, a, value)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if errors else f"{key}: cannot parse {value!r}")
    if origin is Literal:
        if value not in args:
            raise ValueError(f"{key}: must be one of {', '.join(map(str, args))}, got {value!r}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            s = value.strip()
            if s.startswith("["):
                value = yaml.safe_load(s)
            else:
                value = [v.strip() for v in s.split(",") if v.strip()]
        if value is None:
            value = []
        if not isinstance(value, (list, tuple)):
            value = [value]
        inner = args[0] if args else Any
        items = [coerce(f"{key}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOL:
            return _BOOL[value.strip().lower()]
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, bool):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
        if isinstance(value, int):
            return value
        try:
            f = float(value) if isinstance(value, (str, float)) else None
        except ValueError:
            f = None
        if f is not None and f.is_integer():
            return int(f)  # "1e3" and 1000.0 are fine for an int field
        raise ValueError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, bool):
            raise ValueError(f"{key}: expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ValueError(f"{key}: expected a number, got {value!r}") from None
    if tp is str:
        if isinstance(value, (dict, list)):
            raise ValueError(f"{key}: expected a string, got {type(value).__name__}")
        return str(value)
    return value


def from_dict(d: dict[str, Any], cls=TrainConfig, *, prefix: str = "", lines: dict | None = None, source=""):
    """Build `cls` from a nested dict, checking every key and value type."""
    if not isinstance(d, dict):
        raise ValueError(
            f"{source}{prefix.rstrip('.') or 'config'}: expected a mapping, got {type(d).__name__}"
        )
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for k, v in d.items():
        key = prefix + str(k)
        where = source
        if lines and key in lines:
            where = f"{source.rstrip(': ')}:{lines[key]}: "
        if k not in names:
            raise _unknown(key, where)
        tp = hints[k]
        if _is_dataclass_type(tp):
            kwargs[k] = from_dict(v or {}, tp, prefix=key + ".", lines=lines, source=source)
        else:
            try:
                kwargs[k] = coerce(key, tp, v)
            except ValueError as e:
                raise ValueError(f"{where}{e}") from None
    try:
        return cls(**kwargs)
    except ValueError as e:
        raise ValueError(f"{source}{e}") from None
    except TypeError as e:
        raise ValueError(f"{source}{prefix.rstrip('.') or 'config'}: {e}") from None


def _yaml_lines(text: str) -> dict[str, int]:
    """dotted key -> line number (1-based) of every mapping key in a YAML document."""
    out: dict[str, int] = {}

    def walk(node, prefix):
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = f"{prefix}{k.value}"
                out[key] = k.start_mark.line + 1
                walk(v, key + ".")

    node = yaml.compose(text)
    if node is not None:
        walk(node, "")
    return out


def _set_dotted(d: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    for p in parts[:-1]:
        nxt = d.get(p)
        if not isinstance(nxt, dict):
            nxt = {}
            d[p] = nxt
        d = nxt
    d[parts[-1]] = value


def _leaf_type(key: str) -> Any:
    cls: Any = TrainConfig
    parts = key.split(".")
    for i, p in enumerate(parts):
        hints = _hints(cls) if _is_dataclass_type(cls) else {}
        names = {f.name for f in dataclasses.fields(cls)} if _is_dataclass_type(cls) else set()
        if p not in names:
            raise _unknown(key)
        cls = hints[p]
        if i < len(parts) - 1 and not _is_dataclass_type(cls):
            raise _unknown(key)
    if _is_dataclass_type(cls):
        raise ValueError(f"{key!r} is a section; set one of its keys, e.g. {all_keys(cls, key + '.')[0]}=...")
    return cls


def apply_overrides(base: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key.sub=value` strings to a nested dict (a copy), parsing each value by its field type.

    A list key given several times (`inject=nan@5 inject=bad_batch@9`) collects every value.
    """
    out = copy.deepcopy(base)
    lists: dict[str, list] = {}
    for item in overrides:
        if "=" not in item:
            raise ValueError(f"override {item!r}: expected key.sub=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        tp = _leaf_type(key)
        value = coerce(key, tp, raw)
        if typing.get_origin(tp) in (tuple, list):
            lists.setdefault(key, []).extend(value)
            value = list(lists[key])
        elif isinstance(value, tuple):
            value = list(value)
        _set_dotted(out, key, value)
    return out


def load_config(
    path: str | Path | None = None, overrides: list[str] | None = None, base: dict[str, Any] | None = None
) -> TrainConfig:
    """TrainConfig from a YAML file (or `base` dict, or defaults) plus `key.sub=value` overrides."""
    lines: dict[str, int] = {}
    source = ""
    d: dict[str, Any] = dict(base or {})
    if path is not None:
        p = Path(path)
        if not p.exists():
            raise ValueError(f"config file {p} does not exist")
        text = p.read_text()
        try:
            loaded = yaml.safe_load(text) or {}
            lines = _yaml_lines(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{p}: not valid YAML: {e}") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"{p}: the top level must be a mapping of config sections")
        d = loaded
        source = f"{p}: "
    # the file is checked on its own first, so a bad key in it is reported with its line
    from_dict(d, lines=lines, source=source)
    return from_dict(apply_overrides(d, list(overrides or [])))


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def diff_configs(old: dict[str, Any] | TrainConfig, new: dict[str, Any] | TrainConfig) -> dict[str, list]:
    """Every changed leaf as {"dotted.key": [old, new]} (missing on one side = None)."""
    a = flatten(old.to_dict() if isinstance(old, TrainConfig) else old)
    b = flatten(new.to_dict() if isinstance(new, TrainConfig) else new)
    return {k: [a.get(k), b.get(k)] for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}
