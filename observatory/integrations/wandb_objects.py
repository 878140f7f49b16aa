"""The objects of the wandb-compatible API: its errors, `run.config`, `run.summary`, and value checks.

`Config` and `Summary` hold their values in memory, as wandb's do, and write what
changes to the run's event log: `config.update()` after start writes a `config_diff`
(`{"dotted.key": [old, new]}`, secrets redacted), a summary value set by the script
writes a `summary` event. With no run (wandb's `mode="disabled"`) they only hold values.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any

from observatory.redact import redact

if TYPE_CHECKING:
    from observatory.writer import Run

__all__ = [
    "Error",
    "ConfigError",
    "Settings",
    "PreInit",
    "Config",
    "Summary",
    "flatten_metrics",
    "config_dict",
]


class Error(RuntimeError):
    """wandb's `wandb.Error`: a call that needs an active run before `init`, a resume that cannot be honoured."""


class ConfigError(Error):
    """wandb's ConfigError: a config value changed without `allow_val_change=True`."""


class Settings:
    """wandb's `Settings(...)` for `init(settings=)`: `quiet` or `silent` keep `init` and `finish` from printing
    their line; the other fields are accepted and unused."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{k}={v!r}' for k, v in self.__dict__.items())})"


class PreInit:
    """`wandb.config` / `wandb.summary` while no run is active: any use raises wandb's own error."""

    def __init__(self, name: str):
        object.__setattr__(self, "_name", name)

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):
            raise AttributeError(key)
        raise Error(f"You must call wandb.init() before {self._name}.{key}")

    def __setattr__(self, key: str, value: Any) -> None:
        raise Error(f"You must call wandb.init() before {self._name}.{key}")

    def __getitem__(self, key: str) -> Any:
        raise Error(f"You must call wandb.init() before {self._name}[{key!r}]")

    def __setitem__(self, key: str, value: Any) -> None:
        raise Error(f"You must call wandb.init() before {self._name}[{key!r}]")

    def __repr__(self) -> str:
        return f"<{self._name} before wandb.init()>"


# ----------------------------------------------------------------- values


def flatten_metrics(prefix: str, data: Mapping, out: dict[str, float]) -> None:
    """`data`'s scalars into `out` as floats, nested dicts as `a/b`; raise naming the key of anything else."""
    for name, value in data.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"log: metric names must be non-empty strings, got {name!r}")
        key = prefix + name
        t = type(value)
        if t is float:
            out[key] = value
        elif t is int:
            out[key] = float(value)
        elif isinstance(value, Mapping):
            flatten_metrics(key + "/", value, out)
        else:
            out[key] = _number(key, value)


def _number(key: str, value: Any) -> float:
    """A numpy/jax/torch scalar (or anything with a numeric `.item()`) as a float."""
    if isinstance(value, bool):
        raise TypeError(f"log: metric {key!r} is a bool; log it as 0 or 1")
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(
            f"log: metric {key!r} must be a number, got {type(value).__name__} {value!r:.40}; "
            f"text belongs in run.summary[{key!r}] or run.config"
        )
    try:
        return float(value)  # numpy scalars and 0-d arrays, jax and torch scalars
    except (TypeError, ValueError):
        pass
    item = getattr(value, "item", None)
    if callable(item):
        try:
            v = item()
        except (TypeError, ValueError, RuntimeError):
            v = None
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    shape = getattr(value, "shape", None)
    what = type(value).__name__ + (f" of shape {tuple(shape)}" if shape is not None else "")
    raise TypeError(
        f"log: metric {key!r} must be a number, got {what}; arrays, media and tables "
        "(wandb.Image, wandb.Histogram, wandb.Table) are not stored: log scalars"
    )


def _summary_value(key: str, value: Any) -> float | int | str | bool:
    if isinstance(value, (bool, str, int, float)):
        return value
    try:
        return _number(key, value)
    except TypeError:
        raise TypeError(
            f"summary: {key!r} must be a number, string or bool, got {type(value).__name__} {value!r:.40}"
        ) from None


def _flatten_summary(prefix: str, data: Mapping, out: dict) -> None:
    for name, value in data.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"summary: names must be non-empty strings, got {name!r}")
        if isinstance(value, Mapping):
            _flatten_summary(prefix + name + "/", value, out)
        else:
            out[prefix + name] = _summary_value(prefix + name, value)


def config_dict(config: Any) -> dict:
    """What wandb accepts as a config: a mapping, an argparse Namespace (any object's vars), a YAML path."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        return dict(config)
    if isinstance(config, (str, os.PathLike)):
        import yaml  # lazy for start-up time: only a YAML config file needs it

        with open(config) as f:
            loaded = yaml.safe_load(f) or {}
        if not isinstance(loaded, Mapping):
            raise TypeError(f"config file {config} must hold a mapping, got {type(loaded).__name__}")
        return dict(loaded)
    if hasattr(config, "__dict__"):
        return {k: v for k, v in vars(config).items() if not k.startswith("_")}
    raise TypeError(f"config must be a dict, a Namespace or a YAML path, got {type(config).__name__}")


def _leaves(prefix: str, value: Any, out: dict) -> None:
    if isinstance(value, Mapping) and value:
        for k, v in value.items():
            _leaves(f"{prefix}.{k}", v, out)
    else:
        out[prefix] = value


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # arrays compare elementwise
        return a is b


def config_changes(old: Mapping, new: Mapping) -> dict[str, list]:
    """`{"dotted.key": [old, new]}` for the keys of `new` whose value differs from `old`'s (None: absent)."""
    changes: dict[str, list] = {}
    for key, value in new.items():
        before: dict = {}
        after: dict = {}
        if key in old:
            _leaves(str(key), old[key], before)
        _leaves(str(key), value, after)
        for leaf in {**before, **after}:
            a, b = before.get(leaf), after.get(leaf)
            if leaf not in before or leaf not in after or not _same(a, b):
                changes[leaf] = [a, b]
    return changes


# ------------------------------------------------------ config and summary


class _Values(MutableMapping):
    """A dict with attribute access whose every change goes through `update` (which writes it)."""

    _what = "values"

    def __init__(self, run: Run | None, data: Mapping[str, Any] | None):
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_data", dict(data or {}))

    def update(self, d: Any = None, **kwargs: Any) -> None:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __getattr__(self, key: str) -> Any:
        if key.startswith("__"):
            raise AttributeError(key)
        try:
            return self._data[key]
        except KeyError:
            raise AttributeError(f"{self._what} has no key {key!r}") from None

    def __setitem__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __setattr__(self, key: str, value: Any) -> None:
        self.update({key: value})

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._data!r})"

    def as_dict(self) -> dict:
        return dict(self._data)


class Config(_Values):
    """`run.config`: item and attribute access; changes after start are written as `config_diff` events."""

    _what = "config"

    def __init__(self, run: Run | None = None, items: Mapping[str, Any] | None = None, allow_val_change=None):
        super().__init__(run, items)
        object.__setattr__(self, "_allow", allow_val_change)

    def __delitem__(self, key: str) -> None:
        old = self._data.pop(key)
        before: dict = {}
        _leaves(key, old, before)
        self._write({leaf: [v, None] for leaf, v in before.items()})

    def update(self, d: Any = None, allow_val_change: bool | None = None, **kwargs: Any) -> None:
        """Add keys, or change them with `allow_val_change=True` (wandb's rule); a `config_diff` records it."""
        new = {**config_dict(d), **kwargs}
        allow = self._allow if allow_val_change is None else allow_val_change
        if not allow:
            for key, value in new.items():
                if key in self._data and not _same(self._data[key], value):
                    raise ConfigError(
                        f'Attempted to change value of key "{key}" from {self._data[key]} to {value}\n'
                        "If you really want to do this, pass allow_val_change=True to config.update()"
                    )
        changes = config_changes(self._data, new)
        self._data.update(new)
        self._write(changes)

    def setdefaults(self, d: Any) -> None:
        """Add the keys of `d` that the config does not have yet."""
        self.update({k: v for k, v in config_dict(d).items() if k not in self._data})

    def _write(self, changes: dict[str, list]) -> None:
        run = self._run
        if changes and run is not None:
            step = getattr(run, "step", None)
            run.event(
                "config_diff",
                {"against": {"run": run.id, "step": step}, "changes": redact(changes)},
                step=step,
            )


_STATS = ("min", "max", "mean", "first", "last", "best", "none")


class Summary(_Values):
    """`run.summary`: the last logged value of each metric, overridden by values the script sets.

    A value the script sets is written at once as a `summary` event. `final()` is what the
    run's last `summary` event holds: what the metrics alone do not already say (define_metric
    aggregates, a set value that a later `log` replaced), so that readers can take a run's
    summary as its latest metric values overridden by its `summary` events, key by key.
    """

    _what = "summary"

    def __init__(self, run: Run | None = None):
        super().__init__(run, None)  # _data: the summary as the script sees it
        object.__setattr__(self, "_written", {})  # what summary events already say, by key
        object.__setattr__(self, "_derived", set())  # keys made by define_metric aggregates

    def __delitem__(self, key: str) -> None:
        raise Error("summary keys cannot be deleted: summary events only add or override keys")

    def update(self, d: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Set summary values (nested dicts as `a/b`); written now as one `summary` event."""
        flat: dict = {}
        _flatten_summary("", {**(d or {}), **kwargs}, flat)
        if not flat:
            return
        self._data.update(flat)
        self._written.update(flat)
        if self._run is not None:
            self._run.event("summary", redact(flat))

    def final(self) -> dict:
        """The keys a last `summary` event must hold (see the class docstring)."""
        vals, out = self._data, {}
        for key, v in self._written.items():
            if key in vals and not _same(vals[key], v):
                out[key] = vals[key]
        for key in self._derived:
            if key in vals:
                out[key] = vals[key]
        return out


class MetricRule:
    """One define_metric's summary statistics, kept as running values for each metric it names."""

    def __init__(self, name: str, summary: str | None, goal: str | None):
        stats = [s.strip() for s in (summary or "").split(",") if s.strip()]
        bad = [s for s in stats if s not in _STATS]
        if bad:
            raise ValueError(
                f"define_metric: summary must be among {', '.join(_STATS)}, got {', '.join(bad)}"
            )
        if goal not in (None, "minimize", "maximize", "min", "max"):
            raise ValueError(f"define_metric: goal must be 'minimize' or 'maximize', got {goal!r}")
        if "best" in stats and goal is None:
            raise ValueError("define_metric: summary='best' needs goal='minimize' or 'maximize'")
        self.name = name
        self.stats = tuple(s for s in stats if s != "none")
        self.hide = bool(stats) and "last" not in stats  # wandb: a defined summary replaces the last value
        self.minimize = goal in ("minimize", "min")
        self._n: dict[str, int] = {}
        self._sum: dict[str, float] = {}

    def matches(self, key: str) -> bool:
        if self.name.endswith("*"):
            return key.startswith(self.name[:-1])
        return key == self.name

    def add(self, key: str, value: float, summary: Summary) -> None:
        vals = summary._data
        if self.hide:
            vals.pop(key, None)
        n = self._n.get(key, 0) + 1
        self._n[key] = n
        for stat in self.stats:
            if stat == "last":  # the metric's own key keeps its last value
                continue
            name = f"{key}/{stat}"
            old = vals.get(name)
            if stat == "min" or (stat == "best" and self.minimize):
                v = value if old is None or value < old else old
            elif stat == "max" or stat == "best":
                v = value if old is None or value > old else old
            elif stat == "mean":
                self._sum[key] = self._sum.get(key, 0.0) + value
                v = self._sum[key] / n
            else:  # first
                v = value if old is None else old
            vals[name] = v
            summary._derived.add(name)
