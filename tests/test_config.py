"""Config loading: YAML + typed `key.sub=value` overrides, clear errors, diffs."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config import TrainConfig, diff_configs, flatten, load_config
from trainer.faults import FaultPlan, parse_faults

CONFIGS = Path(__file__).resolve().parents[1] / "trainer" / "configs"


@pytest.mark.parametrize("name", ["tiny.yaml", "default.yaml"])
def test_shipped_configs_load(name):
    cfg = load_config(CONFIGS / name)
    assert isinstance(cfg, TrainConfig)
    assert cfg.data.seq_len <= cfg.model.seq_len
    # to_dict round-trips through the loader unchanged (what resume/fork rebuild from)
    assert load_config(None, base=cfg.to_dict()) == cfg


def test_overrides_are_parsed_by_field_type():
    cfg = load_config(
        CONFIGS / "tiny.yaml",
        [
            "optimizer.lr=1e-3",
            "steps=2e3",
            "model.qk_norm=false",
            "data.path=none",
            "data.name=corpus",
            "schedule.kind=wsd",
            "tags=a,b",
            "inject=nan@5",
            "inject=lr_spike@3:x10",
            "mesh.expert=2",
        ],
    )
    assert cfg.optimizer.lr == 1e-3 and isinstance(cfg.optimizer.lr, float)
    assert cfg.steps == 2000 and isinstance(cfg.steps, int)
    assert cfg.model.qk_norm is False and cfg.data.path is None and cfg.data.name == "corpus"
    assert cfg.schedule.kind == "wsd" and cfg.tags == ("a", "b")
    assert cfg.inject == ("nan@5", "lr_spike@3:x10")  # a list key given twice collects both
    assert cfg.mesh.expert == 2


@pytest.mark.parametrize(
    "override, message",
    [
        ("optimizer.lrr=1", "unknown config key 'optimizer.lrr'; did you mean optimizer.lr"),
        ("optimiser.lr=1", "did you mean optimizer.lr"),
        ("model.d_modle=64", "did you mean model.d_model"),
        ("steps=ten", "steps: expected an integer, got 'ten'"),
        ("steps=1.5", "steps: expected an integer"),
        ("model.qk_norm=maybe", "model.qk_norm: expected true or false"),
        ("failure.on_nan=retry", "failure.on_nan: must be one of halt, skip_batch, rollback"),
        ("optimizer.lr=-1", "optimizer.lr: must be > 0"),
        ("mesh=2", "'mesh' is a section"),
        ("inject=nan@", "inject: cannot parse 'nan@'"),
        ("inject=lr_spike@3", "needs a factor"),
        ("data.batch_size=10", "must be a multiple of mesh.data * mesh.expert"),
        ("model.n_heads=3", "model.n_heads=3"),
        ("nonsense", "expected key.sub=value"),
    ],
)
def test_bad_overrides_name_the_key(override, message):
    extra = ["mesh.expert=4"] if "batch_size" in override else []
    with pytest.raises(ValueError) as e:
        load_config(CONFIGS / "tiny.yaml", [*extra, override])
    assert message in str(e.value)


def test_yaml_errors_name_file_and_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("steps: 10\noptimizer:\n  lr: 0.1\n  warmup: 5\n")
    with pytest.raises(ValueError) as e:
        load_config(p)
    msg = str(e.value)
    assert f"{p}:4:" in msg and "'optimizer.warmup'" in msg
    p.write_text("steps: 10\ndata:\n  seq_len: long\n")
    with pytest.raises(ValueError, match=r"bad.yaml:3: data.seq_len: expected an integer"):
        load_config(p)
    p.write_text("steps: [1,\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_config(p)
    with pytest.raises(ValueError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")


def test_diff_lists_every_changed_dotted_key():
    a = load_config(CONFIGS / "tiny.yaml")
    b = load_config(CONFIGS / "tiny.yaml", ["optimizer.lr=0.005", "inject=nan@3", "wandb.mode=offline"])
    assert diff_configs(a, b) == {
        "inject": [[], ["nan@3"]],
        "optimizer.lr": [0.01, 0.005],
        "wandb.mode": ["disabled", "offline"],
    }
    assert diff_configs(a, a) == {}
    assert "model.d_model" in flatten(a.to_dict())


def test_fault_plan_fires_each_fault_once():
    plan = FaultPlan(["nan@3", "lr_spike@3:x10", "bad_batch@5"])
    due = plan.at(3)
    assert sorted(str(f) for f in due) == ["lr_spike@3:x10", "nan@3"] and plan.lr_factor(due) == 10
    assert plan.at(3) == []  # replayed after a rollback: a transient fault does not recur
    assert [f.kind for f in plan.at(5)] == ["bad_batch"]
    assert parse_faults([]) == []
    with pytest.raises(ValueError, match="only lr_spike takes"):
        parse_faults(["nan@3:x2"])
