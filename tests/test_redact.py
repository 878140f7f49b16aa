"""Secrets are hidden by key at any depth and by value pattern in any string, and counted."""

from __future__ import annotations

import pytest

from observatory.redact import REDACTED, is_secret_key, redact, scrub, scrub_text

WANDB_KEY = "0123456789abcdef0123456789abcdef01234567"
SECRET_VALUES = [
    f"WANDB_API_KEY={WANDB_KEY}",
    f"export wandb_api_key: '{WANDB_KEY}'",
    "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
    "ghp_0123456789ABCDEFGHIJKLMNOPQRSTUVWXyz",
    "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFG",
    "sk-proj-Abc123Def456Ghi789Jkl012",
    "AKIAIOSFODNN7EXAMPLE",
    "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig",
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7\n-----END RSA PRIVATE KEY-----",
    "password=hunter2hunter2",
    "db_password: 'correct horse'",
]


@pytest.mark.parametrize("key", ["api_key", "hf_token", "wandb.api_key", "accessToken", "DB_PASSWORD", "private_key",
                                 "aws_secret_access_key", "client_secret", "auth", "credentials"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["tokenizer", "max_tokens", "author", "tokens_per_s", "lr", "passage", "keys",
                                 "flops_per_token", "model.flops_per_token", "pad_token_id", "eos_token", "token_count"])
def test_ordinary_keys(key):
    assert not is_secret_key(key)


@pytest.mark.parametrize("text", SECRET_VALUES)
def test_every_secret_shape_is_hidden_in_text(text):
    out, n = scrub_text(f"the run failed ({text}) at step 3")
    assert n >= 1 and REDACTED in out
    for part in ("hunter2", WANDB_KEY, "AbCdEfGh", "0123456789ABCDEF", "abcdefghijklmnop", "Abc123Def",
                 "IOSFODNN7", "eyJhbGci", "MIIEow", "horse"):  # fmt: skip
        assert part not in out
    assert out.startswith("the run failed (") and out.endswith("at step 3")


def test_nested_config_by_key_and_pattern_counted():
    cfg = {"wandb": {"api_key": WANDB_KEY, "project": "p"}, "hf_token": None, "model": {"tokenizer": "gpt2"},
           "list": [{"secret": "s", "ok": 1}], "notes": "used hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 to pull", "n": 3}
    out, n = scrub(cfg)
    assert out["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["hf_token"] is None  # nothing to hide
    assert out["model"] == {"tokenizer": "gpt2"} and out["n"] == 3
    assert out["list"] == [{"secret": REDACTED, "ok": 1}]
    assert "hf_" not in out["notes"]
    assert n == 3
    assert scrub(out) == (out, 0), "redacting twice hides nothing more and counts nothing more"
    assert redact(cfg) == out


def test_git_commit_hashes_and_numbers_survive():
    commit = "a" * 40
    assert scrub({"code": {"commit": commit, "dirty": False}, "lr": 3e-4}) == ({"code": {"commit": commit, "dirty": False}, "lr": 3e-4}, 0)
