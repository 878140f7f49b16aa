"""Secrets are hidden by key at any depth and by value pattern in any string, and counted."""

from __future__ import annotations

import random

import pytest

from observatory import redact as redact_module
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


@pytest.mark.parametrize(
    "key",
    [
        "api_key",
        "hf_token",
        "wandb.api_key",
        "accessToken",
        "DB_PASSWORD",
        "private_key",
        "aws_secret_access_key",
        "client_secret",
        "auth",
        "credentials",
    ],
)
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key",
    [
        "tokenizer",
        "max_tokens",
        "author",
        "tokens_per_s",
        "lr",
        "passage",
        "keys",
        "flops_per_token",
        "model.flops_per_token",
        "pad_token_id",
        "eos_token",
        "token_count",
    ],
)
def test_ordinary_keys(key):
    assert not is_secret_key(key)


@pytest.mark.parametrize("text", SECRET_VALUES)
def test_every_secret_shape_is_hidden_in_text(text):
    out, n = scrub_text(f"the run failed ({text}) at step 3")
    assert n >= 1 and REDACTED in out
    for part in (
        "hunter2",
        WANDB_KEY,
        "AbCdEfGh",
        "0123456789ABCDEF",
        "abcdefghijklmnop",
        "Abc123Def",
        "IOSFODNN7",
        "eyJhbGci",
        "MIIEow",
        "horse",
    ):
        assert part not in out
    assert out.startswith("the run failed (") and out.endswith("at step 3")


def test_nested_config_by_key_and_pattern_counted():
    cfg = {
        "wandb": {"api_key": WANDB_KEY, "project": "p"},
        "hf_token": None,
        "model": {"tokenizer": "gpt2"},
        "list": [{"secret": "s", "ok": 1}],
        "notes": "used hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345 to pull",
        "n": 3,
        "db_password": 123456,  # a number under a secret key is hidden too
        "ghp_" + "K" * 36: 1.5,  # a key that is a token: hidden, its value kept
        "x" * 200 + " ghp_" + "L" * 36: True,  # a long one too (not remembered)
    }
    out, n = scrub(cfg)
    assert out["db_password"] == REDACTED
    assert {v for k, v in out.items() if "<redacted>" in k} == {1.5, True}
    assert redact(cfg) == out
    del out["db_password"]
    out = {k: v for k, v in out.items() if "<redacted>" not in k}
    assert out["wandb"] == {"api_key": REDACTED, "project": "p"}
    assert out["hf_token"] is None  # nothing to hide
    assert out["model"] == {"tokenizer": "gpt2"} and out["n"] == 3
    assert out["list"] == [{"secret": REDACTED, "ok": 1}]
    assert "hf_" not in out["notes"]
    assert n == 6
    assert scrub(out) == (out, 0), "redacting twice hides nothing more and counts nothing more"


def test_git_commit_hashes_and_numbers_survive():
    commit = "a" * 40
    assert scrub({"code": {"commit": commit, "dirty": False}, "lr": 3e-4}) == (
        {"code": {"commit": commit, "dirty": False}, "lr": 3e-4},
        0,
    )


# issue 36: the class of "a secret the pair rule saw only the first word of, or did not see at all".
# Every secret key, in every context a log writes one in, with every value shape: nothing of the value is left.
_KEYS = [
    "password",
    "api_key",
    "credential",
    "token",
    "client_secret",
    "X-Api-Key",
    "db.passwd",
    "accessToken",
]
_VALUES = ["S3cretValue9", "correct horse battery staple", "a&b=c", "dXNlcjpwYXNzd29yZA=="]
_CONTEXTS = [
    "https://host/v1?{k}={v}",  # in a query string
    "gs://b/x?page=2&{k}={v}",  # after another pair in a query string
    "user=bob&{k}={v}",  # after another pair
    "user=bob; {k}={v}",
    "{k}: {v}",  # a header, or YAML
    "ran with {k} = {v}",
    '{{"{k}": "{v}"}}',  # JSON
    "({k}={v})",
]


def _value_parts(v: str) -> list[str]:
    return [p for p in v.replace("&", " ").replace("=", " ").split() if len(p) > 1]


@pytest.mark.parametrize("context", _CONTEXTS)
@pytest.mark.parametrize("key", _KEYS)
def test_a_secret_value_is_hidden_whole_in_every_context(context, key):
    for v in _VALUES:
        if '"' in context and "&" in v:
            continue
        out, n = scrub_text(f"before {context.format(k=key, v=v)}\nafter")
        assert n == 1, (context, key, v, out)
        assert not [p for p in _value_parts(v) if p in out], (context, key, v, out)
        assert out.startswith("before ") and out.endswith("\nafter")
        assert scrub_text(out) == (out, 0)


@pytest.mark.parametrize(
    "token",
    [
        "ghp_0123456789ABCDEFGHIJKLMNOPQRSTUVWXyz",
        "hf_AbCdEfGhIjKlMnOpQrStUvWxYz012345",
        "sk-proj-Abc123Def456Ghi789Jkl012",
        "AKIAIOSFODNN7EXAMPLE",
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCDEFG",
    ],
)
@pytest.mark.parametrize("glue", ["k_", "%3D", "x", "9", "/", "-"])
def test_a_token_glued_to_a_word_character_is_hidden(token, glue):
    out, n = scrub_text(f"name {glue}{token} end")
    assert n == 1 and token[6:16] not in out, out


@pytest.mark.parametrize(
    "text",
    [
        "Authorization: Basic dXNlcjpwYXNzd29yZA==",
        "Cookie: session=abc123; theme=dark",
        "see https://bob:hunter2pw@host/x",
        "Proxy-Authorization: Digest dXNlcjpwYXNz",
    ],
)
def test_multi_part_credentials(text):
    out, n = scrub_text(text)
    assert n == 1 and not [p for p in ("dXNlcjpw", "abc123", "theme", "hunter2pw", "dark") if p in out], out


@pytest.mark.parametrize(
    "text",
    [
        "task-runner-production-01",
        "basic tokenization works",
        "tokenizer: gpt2, lr=3",
        "https://host/v1?page=2&sort=asc",
        "see https://example.com/a:b@c",
    ],
)
def test_ordinary_text_survives(text):
    assert scrub_text(text) == (text, 0)


def _each_pattern(text: str) -> tuple[str, int]:
    """The oracle: every credential pattern's substitution in turn, none skipped."""
    n = 0
    for pat in redact_module._PATTERNS:
        text, k = pat.subn(lambda m: m.group(1) + REDACTED, text)
        n += k
    return text, n


def _every_rule(text: str) -> tuple[str, int]:
    """`_each_pattern`, then detect-secrets' rules (`hide_detected`): what `scrub_text` hides without pairs."""
    text, n = _each_pattern(text)
    text, k = redact_module.hide_detected(text)
    return text, n + k


_FRAGMENTS = [
    *SECRET_VALUES,
    "WANDB-API.KEY ",
    "wandb_api_key=",
    "HF_",
    "hf_",
    "ghs_",
    "GITHUB_PAT_",
    "sk-",
    "SK-",
    "AKIA",
    "asia",
    "ASIA",
    "Bearer ",
    "TOKEN ",
    "basic ",
    "DIGEST ",
    "://",
    "u:p@",
    "-----BEGIN X-----",
    "-----END X-----",
    "0123456789abcdef",
    "ABCDEFGHIJKLMNOP",
    "Ab1",
    "=",
    "+/",
    " ",
    "\n",
    "é",
    "baſic ",  # a long s: the patterns' (?i) takes it for "s"
    "to\u212aen ",  # the Kelvin sign, for "k"
    "bearer\u0131",  # a dotless i
]


def test_the_one_search_finds_what_any_pattern_would_hide():
    """`scrub_text` skips the ten substitutions when one combined search finds none of the patterns: over
    4,000 strings glued from the patterns' parts (either case) it gives what the ten substitutions do."""
    rnd = random.Random(7)
    texts = ["".join(rnd.choices(_FRAGMENTS, k=rnd.randint(1, 6))) for _ in range(4000)]
    hits = 0
    for text in texts:
        found = redact_module._ANY_PATTERN.search(text) is not None
        assert found == (_each_pattern(text)[1] > 0), text
        assert not found or redact_module._ANCHORS.search(text) is not None, text  # the cheaper search first
        hits += found
        if "=" not in text and ":" not in text:
            assert scrub_text(text) == _every_rule(text), text
    assert 0 < hits < len(texts)  # both kinds of string were tried


def test_the_writer_hides_every_shape_of_the_corpus_at_write_time(tmp_path):
    """`init(config=…)` and its notes: no needle of the corpus reaches the log on disk (issue 55: 29 of 42
    shapes did). The writer applies detect-secrets' rules where it is installed (the `server` extra)."""
    from public_secrets import IN_CONFIG, SECRETS, foreign_config, leaks

    from observatory.writer import init

    run = init(
        run_id="w",
        runs_dir=tmp_path,
        config=foreign_config(),
        notes=f"my password is {SECRETS['prose']} for now",
        install_signal_handlers=False,
    )
    run.finish()
    text = (tmp_path / "w" / "events.0.jsonl").read_text()
    assert leaks(text, {k: SECRETS[k] for k in [*IN_CONFIG, "prose"]}) == []
    assert "--api-key" in text and "3e-4" in text and "cache:6379" in text  # the rest is kept
