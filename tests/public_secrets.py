"""A corpus of secrets planted in foreign logs, for the tests that check none reaches the public.

`SECRETS` are the needles: each is a credential (or the secret part of one) that must
appear nowhere a visitor can see. `write_foreign_run(runs_dir)` hand-writes a run the way
a foreign trainer would, with the needles in its config, name, tags, notes, project and
group, note and failure texts, a traceback, a decision, a config diff, a checkpoint
path, an artifact, an unknown kind, a metric name and rejected lines.
"""

from __future__ import annotations

import json
from pathlib import Path

# issue 55, round two's leftovers: a shape for each rule of detect-secrets' plugins, in the context the rule
# needs (a name before it, a URL around it): (the secret, its context)
SHAPES = {
    "ds_twilio_ac": ("AC" + "planted0twilio0account0sid012345", "{}"),
    "ds_twilio_sk": ("SK" + "planted0twilio0api0key0sid012345", "{}"),
    "ds_artifactory": ("AKC" + "Planted0Artifactory0Key01234", "artifactory {}"),
    "ds_artifactory_ap": ("AP6" + "Planted0ArtifactoryPw", "X-JFrog-Art-Api: {}"),
    "ds_ibm_iam": ("Planted0IbmCloudIamKey0123456789-abcdefghijk", "ibm_cloud_iam_key = '{}'"),
    "ds_ibm_cos": ("0123456789abcdef" * 2 + "fedcba9876543210", "cos_hmac_secret_access_key: {}"),
    "ds_cloudant": ("planteddcloudantpwabcdef", "https://acct:{}@acct.cloudant.com"),
    "ds_softlayer": (("planted0softlayer0api0key" * 3)[:64], "https://api.softlayer.com/soap/v3/{}"),
    "ds_pypi": ("pypi-AgEIcHlwaS5vcmc" + ("Planted0PypiToken" * 5)[:72], "{}"),
    "ds_square": ("sq0csp-" + ("Planted0SquareSecret" * 3)[:43], "{}"),
    "ds_telegram": ("123456789:AA" + ("Planted0TelegramBot" * 2)[:33], "{}"),
    "ds_discord": ("MTk4NjIyNDgzNDcxOTI1MjQ4.Cl2FMQ.Planted0DiscordBot0Tok0123456", "{}"),
    "ds_slack_hook": ("https://hooks.slack.com/services/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", "{}"),
    "ds_mailchimp": ("0123456789abcdef0123456789abcdef-us12", "{}"),
    "ds_openai": ("sk-Planted0" + "T3BlbkFJ" + "Planted0OpenAiKey01", "{}"),
    "ds_ghs": ("ghs_" + "Planted0GithubServer0Token012345678", "{}"),
    "ds_ec_key": (
        "MHcCAQEEIPlantedEcKeyBody",
        "-----BEGIN EC PRIVATE KEY-----\n{}\n-----END EC PRIVATE KEY-----",
    ),
}
WANDB_HEX = "f00dfeed" * 5  # 40 hex: a W&B key
SECRETS = {
    "wandb_hex": WANDB_HEX,
    "wandb_hex_text": "beefcafe" * 5,
    "hf": "hf_PlantedHfToken0123456789abcdef",
    "hf_tag": "hf_PlantedInATag9876543210zyxwv",
    "hf_metric": "hf_PlantedInAMetricName01234567",
    "ghp": "ghp_PlantedGithubToken0123456789ABCDEF",
    "gpat": "github_pat_11PLANTED0123456789_abcdefghijklmnopqrstuv",
    "sk": "sk-proj-PlantedOpenAiKey0123456789",
    "sk_rejected": "sk-PlantedInARejectedLine012345",
    "akia": "AKIAPLANTEDEXAMPLE12",
    "akia_bad_json": "AKIABADJSONEXAMPLE34",
    "bearer": "eyJPlantedBearer.payload.signature",
    "pem": "MIIEpAIBAAKCAQEAplantedPemBody",
    "password": "hunter2-planted-pw",
    "by_key": "value-hidden-only-by-its-key",
    "by_key_nested": "nested-client-secret-value",
    "diff_old": "old-api-key-in-a-config-diff",
    "diff_new": "new-api-key-in-a-config-diff",
    "unknown_kind": "unknown-kind-auth-token-value",
    "decision": "ghp_PlantedInADecisionText0123456789",
    "ckpt": "hf_PlantedInACheckpointPath0123456",
    "artifact": "sk-PlantedInAnArtifactPath0123456",
    # issue 36: in a query string, after another pair, longer than a word, glued to a word character
    "query": "planted-query-api-key-value",
    "after_pair": "planted-after-a-pair-pw",
    "gs_query": "planted-gs-credential-value",
    "basic": "cGxhbnRlZDpiYXNpYy1hdXRo",
    "multiword": "horse battery staple",
    "glued_ghp": "ghp_PlantedGluedToAWord0123456789",
    "glued_hf": "hf_PlantedAfterAPercent0123456789",
    # issue 55: key names, URLs, token formats (detect-secrets' rules and ours), argv, prose
    "k_pw": "planted-pw-by-key-pw",
    "k_passphrase": "planted-by-key-passphrase",
    "k_jwt": "planted-by-key-jwt-value",
    "k_webhook_url": "planted-webhook-url-path-9f8e7d",
    "k_ssh_key": "planted-by-key-ssh-key-body",
    "url_empty_user": "plantedUrlPwNoUser42",
    "url_sig": "PlantedSasSig%2Bq0Zx9Y8%3D",
    "url_key": "PlantedQueryKey0123456789",
    "stripe": "sk_live_" + "Pl4nted0Str1peKey0123456",
    "google": "AIza" + "PlantedGoogleApiKey_0123456789abcde",
    "slack_bot": "xoxb-123456789012-1234567890123-PlantedSlackBot0Tok",
    "gitlab": "glpat-PlantedGitLab0123456789",
    "npm": "npm_" + "PlantedNpmToken0123456789abcdefghijk",
    "sendgrid": "SG." + "PlantedSendGrid0123456" + "." + "PlantedSendGridSecretPart0123456789abcdefgh",
    "azure": "Pl4ntedAzureAccountKey" + "A" * 64 + "==",
    "argv": "planted-argv-api-key-value",
    "prose": "Planted-Prose-Pw-42!",
    **{k: v for k, (v, _) in SHAPES.items()},
}
PEM = f"-----BEGIN RSA PRIVATE KEY-----\n{SECRETS['pem']}\n-----END RSA PRIVATE KEY-----"
RUN = "foreign"
DECISION = "dec-secret"
T0 = 1.7e9


def _line(seq: int, kind: str, data: dict, step: int | None = None) -> str:
    return json.dumps(
        {"v": 1, "run": RUN, "kind": kind, "step": step, "t": T0 + seq, "host": 0, "seq": seq, "data": data}
    )


def foreign_config() -> dict:
    """The foreign run's config: the needles a config holds, by key and by shape (and an argv)."""
    s = SECRETS
    return {
        "wandb": {"api_key": s["wandb_hex"], "project": "p"},
        "optimizer": {"lr": 3e-4, "client_secret": s["by_key_nested"]},
        "db": {"password": s["by_key"]},
        "env": f"WANDB_API_KEY={s['wandb_hex_text']} HF_TOKEN={s['hf']}",
        "steps": 20,
        "service": {
            "pw": s["k_pw"],
            "passphrase": s["k_passphrase"],
            "jwt": s["k_jwt"],
            "webhook_url": f"https://hooks.example.com/{s['k_webhook_url']}",
            "ssh_key": s["k_ssh_key"],
        },
        "urls": [
            f"redis://:{s['url_empty_user']}@cache:6379/0",
            f"https://acct.blob.core.windows.net/c/x.bin?sv=2020-08-04&se=2030&sig={s['url_sig']}",
            f"https://maps.example.com/api?q=1&key={s['url_key']}",
        ],
        "t1": s["stripe"],
        "t2": s["google"],
        "t3": s["slack_bot"],
        "t4": s["gitlab"],
        "t5": s["npm"],
        "t6": s["sendgrid"],
        "t7": f"DefaultEndpointsProtocol=https;AccountName=a;AccountKey={s['azure']};EndpointSuffix=x",
        "argv": ["train.py", "--api-key", s["argv"], "--lr", "3e-4"],
        "more": [f"note: {ctx.format(s[k])} and more" for k, (_, ctx) in SHAPES.items()],
    }


# the needles `foreign_config` holds
IN_CONFIG = (
    "wandb_hex wandb_hex_text hf by_key by_key_nested k_pw k_passphrase k_jwt k_webhook_url k_ssh_key "
    "url_empty_user url_sig url_key stripe google slack_bot gitlab npm sendgrid azure argv"
).split() + list(SHAPES)


def write_foreign_run(runs_dir: Path) -> Path:
    """`<runs_dir>/foreign/events.0.jsonl`, every needle in it; returns the file."""
    s = SECRETS
    config = foreign_config()
    lines = [
        _line(
            0,
            "run_start",
            {
                "config": config,
                "name": f"run with {s['ghp']}",
                "tags": ["ok", s["hf_tag"], f"q%3D{s['glued_hf']}"],
                "notes": f"launched with {s['sk']}; my password is {s['prose']} for now",
                "project": f"Bearer {s['bearer']}",
                "group": s["akia"],
            },
        ),
    ]
    seq = 1
    for step in range(20):
        metrics = {"train/loss": 3.0 - 0.1 * step, f"debug/{s['hf_metric']}": 1.0, f"k_{s['glued_ghp']}": 2.0}
        lines.append(_line(seq, "metrics", metrics, step))
        seq += 1
    events = [
        ("note", {"text": f"rotated password={s['password']} today", "author": f"ci {s['gpat']}"}, 3),
        (
            "note",
            {
                "text": f"GET https://host/v1?api_key={s['query']}&page=2 then user=bob&password={s['after_pair']}",
                "author": f"password: correct {s['multiword']}",
            },
            3,
        ),
        ("checkpoint", {"path": f"gs://b/x?credential={s['gs_query']}"}, 4),
        (
            "failure",
            {
                "type": "exception",
                "message": f"401 for Authorization: Bearer {s['bearer']} / Authorization: Basic {s['basic']}",
                "traceback": f"Traceback:\n  key = load()\n{PEM}",
            },
            5,
        ),
        (
            "config_diff",
            {
                "against": {"run": RUN, "step": 0},
                "changes": {"wandb.api_key": [s["diff_old"], s["diff_new"]], "optimizer.lr": [3e-4, 1e-4]},
            },
            6,
        ),
        ("checkpoint", {"path": f"/ckpt/{s['ckpt']}/step6"}, 6),
        ("artifact", {"name": "weights", "type": "model", "path": f"s3://bucket/{s['artifact']}"}, 7),
        ("weird_kind", {"nested": {"auth_token": s["unknown_kind"]}}, 7),
        (
            "decision",
            {
                "id": DECISION,
                "title": f"Rotate {s['decision']} after the leak",
                "kind": "intervention",
                "status": "running",
                "hypothesis": f"the key {s['decision']} leaked",
                "runs": [{"run": RUN, "step": 7}],
            },
            7,
        ),
        ("run_end", {"status": "failed", "final_step": 19}, 19),
    ]
    for kind, data, step in events:
        lines.append(_line(seq, kind, data, step))
        seq += 1
    # rejected lines: the raw line is stored (capped), so it must be scrubbed too
    lines.append(
        _line(seq, "note", {"text": f"bad seq {s['sk_rejected']}"}).replace(f'"seq": {seq}', '"seq": "x"')
    )
    lines.append('{"v": 1, "run": "foreign", "kind": "note", "data": {"text": "' + s["akia_bad_json"] + '"')
    path = runs_dir / RUN / "events.0.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def leaks(text: str, needles: dict[str, str] = SECRETS) -> list[str]:
    """The names of the needles that appear in `text`."""
    return [name for name, v in needles.items() if v in text]
