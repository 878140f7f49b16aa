"""Secrets never reach the store: redaction by key and by value pattern.

Two rules, applied by every writer we ship and again at ingest, for every writer:

- **By key**, at any depth of a nested value: the value of a key one of whose words is
  a secret word (`hf_token`, `db_password`, `wandb.api_key`, `accessToken`) is replaced
  by `REDACTED`. A word that merely starts like one (`tokenizer`, `max_tokens`,
  `author`) is not secret.
- **By value pattern**, inside any string, glued to other word characters too
  (`k_ghp_…`, `%3Dhf_…`): well-known credential shapes (W&B keys after a
  `WANDB_API_KEY`-like name, Hugging Face `hf_…`, GitHub `ghp_…`/`github_pat_…`, `sk-…`
  API keys, AWS `AKIA…` key ids, `Bearer`/`Basic`/`Digest` credentials, a URL's
  `user:password@`, PEM blocks) and `name=value` / `name: value` pairs whose name is
  secret by the key rule -- in prose, JSON, headers and query strings
  (`https://host/v1?api_key=S`, `user=bob&password=S`). The whole value is hidden: a
  quoted one to its quote, an unquoted one to the line's end or the next pair
  (`password: correct horse battery staple`); a `Cookie`'s or `Authorization`'s to the
  line's end.

`scrub` returns the redacted copy and how many values it hid, so the store can record
that something was hidden (a count per run), not only hide it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["REDACTED", "is_secret_key", "redact", "redacted_note", "scrub", "scrub_event", "scrub_text"]

REDACTED = "<redacted>"

# A key is secret when one of its words is one of these, or its joined words contain a pair.
SECRET_WORDS = frozenset(
    (
        "token secret secrets password passwd pwd pw passphrase passcode credential credentials apikey auth "
        "authorization cookie jwt webhook webhooks dsn sas privkey"
    ).split()
)
SECRET_PAIRS = (
    "api_key",
    "private_key",
    "access_key",
    "secret_key",
    "client_secret",
    "session_token",
    "auth_token",
    "ssh_key",
    "account_key",
    "signing_key",
    "encryption_key",
    "master_key",
    "connection_string",
    "conn_str",
    "pass_phrase",
)


def _words(key: str) -> list[str]:
    snake = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower()
    return [w for w in re.split(r"[^a-z0-9]+", snake) if w]


# "token" in a model's vocabulary, not a credential: flops_per_token, pad_token_id, eos_token, token_count
_VOCAB_BEFORE = frozenset("per pad bos eos unk sep cls mask start end special max min num".split())
_VOCAB_AFTER = frozenset(
    "id ids count counts len length budget limit type types index embedding embeddings".split()
)


def _is_secret_word(words: list[str], i: int) -> bool:
    w = words[i]
    if w not in SECRET_WORDS:
        return False
    if w == "token" and (
        (i > 0 and words[i - 1] in _VOCAB_BEFORE) or (i + 1 < len(words) and words[i + 1] in _VOCAB_AFTER)
    ):
        return False
    return True


@functools.lru_cache(
    maxsize=1 << 14
)  # a lab's runs repeat their config keys: a sweep's 10^5 run_starts, a few names
def is_secret_key(key: str) -> bool:
    """True for keys whose values must not be stored (see SECRET_WORDS and SECRET_PAIRS)."""
    words = _words(key)
    joined = "_".join(words)
    return any(_is_secret_word(words, i) for i in range(len(words))) or any(p in joined for p in SECRET_PAIRS)


# Credential shapes that are secret wherever they appear, glued to other word characters too
# (`k_ghp_...`, `%3Dhf_...`). Each keeps a harmless prefix (group 1).
_PATTERNS = (
    # W&B: 40 hex (or longer, newer keys) right after a WANDB_API_KEY-like name
    re.compile(r"(?i)(wandb[_\-.]?api[_\-.]?key[\"']?\s*[=:]?\s*[\"']?)[0-9a-f]{40,}"),
    re.compile(r"()hf_[A-Za-z0-9]{20,}"),
    re.compile(r"()gh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"()github_pat_[A-Za-z0-9_]{20,}"),
    # sk-...: mixed case and a digit (a run named `task-runner-production` is not a key)
    re.compile(r"()sk-(?=[\w\-]*[0-9])(?=[\w\-]*[A-Z])(?=[\w\-]*[a-z])[A-Za-z0-9_\-]{16,}"),
    re.compile(r"()(?:AKIA|ASIA)[0-9A-Z]{16}(?![A-Z0-9])"),
    re.compile(r"(?i)(\b(?:bearer|token)\s+)[A-Za-z0-9._~+/=\-]{8,}"),
    # Basic/Digest credentials: base64 with a digit, '+', '/' or '=' in it ("basic tokenization" is prose)
    re.compile(r"(?i)(\b(?:basic|digest)\s+)(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}"),
    # a URL's user:password@ (the user may be empty: redis://:pw@host)
    re.compile(r"(://[^/\s:@]{0,256}:)[^@\s/]{1,512}(?=@)"),
    re.compile(r"()-----BEGIN [A-Z0-9 ]+-----[\s\S]*?(?:-----END [A-Z0-9 ]+-----|$)"),
)
# any of them, in one search: a string none of them matches (nearly every name, tag and path) is passed by
# one regex instead of ten substitutions. Exact: a sub that matches nothing changes nothing, and an
# alternation matches somewhere iff one of its branches does (each keeps its own flags, scoped)
_ANY_PATTERN = re.compile(
    "|".join(
        f"(?i:{p.pattern[4:]})" if p.pattern.startswith("(?i)") else f"(?:{p.pattern})" for p in _PATTERNS
    )
)
# the literal each pattern needs, under that pattern's flags: a string without one of them (a run name, a
# tag, a dataset) cannot match any, and this search costs half of `_ANY_PATTERN`'s on a short string
_ANCHORS = re.compile(
    r"(?i:wandb|bearer|token|basic|digest)|hf_|gh[pousr]_|github_pat_|sk-|AKIA|ASIA|://|-----BEGIN"
)
# `name=value` / `name: value` in free text, in a query string (`?api_key=S`, `user=bob&password=S`) or in
# JSON-ish text (`"password": "S"`): the head; the value is found after it when the name is secret
_PAIR_HEAD = re.compile(r"""([A-Za-z_][\w.\-]{0,63})(["']?\s*[=:]\s*)""")
_QUOTED = re.compile(r""""[^"\n]*"?|'[^'\n]*'?""")
# an unquoted secret value runs to the line's end (`password: correct horse battery staple`,
# `Authorization: Basic <base64>`) or to where the next pair begins (`password=S&user=bob`, `S; lr=3`)
_VALUE_END = re.compile(r"""[&;,]\s*["']?[A-Za-z_][\w.\-]{0,63}["']?\s*[=:]|["'}\]]|$""")
_WHOLE_LINE = frozenset(("cookie", "authorization"))  # their values are themselves pairs: hide all of it


def _secret_value_end(text: str, start: int, name: str) -> int:
    """Where the value of the secret `name` that starts at `start` ends."""
    q = _QUOTED.match(text, start)
    if q is not None:
        return q.end()
    nl = text.find("\n", start)
    end = len(text) if nl < 0 else nl
    if not _WHOLE_LINE & set(_words(name)):
        end = _VALUE_END.search(text, start, end).start()
    if text.count("(", 0, start) > text.count(
        ")", 0, start
    ):  # `(password=S) at step 3`: the parenthesis closes it
        close = text.find(")", start, end)
        end = end if close < 0 else close
    return end


def _scrub_pairs(text: str) -> tuple[str, int]:
    spans: list[tuple[int, int, int, str]] = []  # (head start, head end, value end, replacement)
    pos = n = 0
    while (m := _PAIR_HEAD.search(text, pos)) is not None:
        name = m.group(1)
        if not is_secret_key(name):
            pos = m.end()  # a value may hold a pair of its own: `https://host/v1?api_key=S`
            continue
        end = _secret_value_end(text, m.end(), name)
        value = text[m.end() : end]
        bare = value.strip("'\"").strip()
        if bare and bare != REDACTED:
            quote = value[0] if value[:1] in ("'", '"') else ""
            closing = quote if len(value) > 1 and value.endswith(quote) else ""
            spans.append((m.start(), m.end(), end, quote + REDACTED + closing))
            n += REDACTED not in value  # `Basic <redacted>`: counted once, by its pattern
        pos = max(end, m.end() + 1)
    if not spans:
        return text, 0
    parts, last = [], 0
    for _, head_end, end, repl in spans:
        parts += (text[last:head_end], repl)
        last = end
    parts.append(text[last:])
    return "".join(parts), n


def scrub_text(text: str) -> tuple[str, int]:
    """A string with every credential-shaped part replaced; and how many were."""
    return _scrub_short_text(text) if len(text) <= 64 else _scrub_text(text)


def _scrub_text(text: str) -> tuple[str, int]:
    n = 0

    def sub(m: re.Match) -> str:
        nonlocal n
        n += 1
        return m.group(1) + REDACTED

    if _ANCHORS.search(text) is not None and _ANY_PATTERN.search(text) is not None:
        for pat in _PATTERNS:
            text = pat.sub(sub, text)
    text, n_found = hide_detected(text)
    n += n_found
    if "=" in text or ":" in text:
        text, n_pairs = _scrub_pairs(text)
        n += n_pairs
    return text, n


# prose: "my password is S", "the api key was S" (one word after; `name: S` and `name=S` are pairs)
_PROSE = re.compile(
    r"(?i)(\b(?:password|passphrase|passcode|passwd|pw|secret|token|api[ _-]?key)\s+(?:is|was)\s+)"
    r"(?![<(])[^\s\"']{3,512}"
)


# our rules beside detect-secrets', each behind the literals one of which its matches hold
_MORE = (
    # a signed URL's or an API's credential in its query string: ?sig=, &key=, X-Amz-Signature=, ...
    (
        re.compile(r"[?&;][^=\s]{1,40}="),
        re.compile(
            r"(?i)([?&;](?:sig|signature|key|api[_-]?key|apikey|access[_-]?token|token|x-amz-signature|"
            r"x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential)=)[^&#\s\"'<>]{1,2048}"
        ),
    ),
    # token shapes detect-secrets has no rule for: Google API keys, npm tokens, any Slack token
    (re.compile("AIza"), re.compile(r"()AIza[0-9A-Za-z_\-]{35}")),
    (re.compile("npm_"), re.compile(r"()npm_[A-Za-z0-9]{36}")),
    (re.compile("xox"), re.compile(r"()xox[abposr]-[A-Za-z0-9\-]{10,}")),
    (re.compile(r"(?i) (?:is|was) "), _PROSE),
)


def hide_detected(text: str) -> tuple[str, int]:
    """`text` with what detect-secrets' rules find hidden (`_detectors`), and what ours beside them find
    (`_MORE`: signed URLs' query credentials, Google, npm and Slack tokens, a secret told in prose); and
    how many were."""
    n = 0
    for needles, pat in _MORE:
        if needles.search(text) is not None:
            text, k = pat.subn(lambda m: m.group(1) + REDACTED, text)
            n += k
    longest = -1  # the longest run of word characters (of 11 or more), measured when a rule set asks
    for needles, run, rules in _detectors():
        if run and longest < 0:
            longest = max(map(len, _RUNS.findall(text)), default=0)
        if run > longest or needles.search(text) is None:
            continue  # no literal (or no value long enough) the rule needs is there: its searches are skipped
        for pat, whole in rules:
            text, k = _hide_rule(text, pat, whole)
            n += k
    return text, n


def _hide_rule(text: str, pat: re.Pattern, whole: bool) -> tuple[str, int]:
    """`text` with each match of one rule hidden (the whole match, or its first group); and how many were."""
    n = 0

    def hide(m: re.Match) -> str:
        nonlocal n
        if whole or m.lastindex is None:
            # a rule that matches the delimiters around a token (Artifactory's `(?:\s|=|:|"|^)AKC…`) keeps them
            part = m.group(0)
            core = part.strip(' \t\n=:"')
            head, part, tail = part[: part.index(core)] if core else "", core or part, ""
            tail = m.group(0)[len(head) + len(part) :]
        else:
            part, head, tail = m.group(1), text[m.start() : m.start(1)], text[m.end(1) : m.end()]
        if part.strip("<>") == REDACTED.strip("<>"):  # hidden already by our own pattern
            return m.group(0)
        n += 1
        return head + REDACTED + tail

    return pat.sub(hide, text), n


@functools.cache
def _detectors() -> tuple[tuple[re.Pattern, int, tuple[tuple[re.Pattern, bool], ...]], ...]:
    """detect-secrets' token rules (its maintained regexes: Artifactory, AWS, Azure `AccountKey=`, a URL's
    basic auth, Cloudant, Discord, GitHub, GitLab `glpat-`, IBM Cloud IAM and COS HMAC keys, JWT,
    Mailchimp, npm, OpenAI, PyPI, SendGrid `SG.`, Slack `xox…` and webhooks, SoftLayer, Square, Stripe
    `sk_live_`, Telegram, Twilio) with whether the whole match is the secret (else its first group is),
    grouped by rule set behind a search for the literals one of which each match holds (case-blind for a
    case-blind rule set). Loaded on first use; none where detect-secrets is not installed (a training
    script's writer: ingest applies them again). Its keyword and entropy rules are left out (they flag
    prose), and so is its public-IP rule (it flags addresses)."""
    try:
        from detect_secrets.plugins import (
            artifactory,
            aws,
            azure_storage_key,
            basic_auth,
            cloudant,
            discord,
            github_token,
            gitlab_token,
            ibm_cloud_iam,
            ibm_cos_hmac,
            jwt,
            mailchimp,
            npm,
            openai,
            pypi_token,
            sendgrid,
            slack,
            softlayer,
            square_oauth,
            stripe,
            telegram_token,
            twilio,
        )
    except ImportError:
        return ()
    # the rules whose first group is the secret (a URL's password, an npm token, a key after its name)
    in_group = (
        basic_auth.BasicAuthDetector,
        npm.NpmDetector,
        cloudant.CloudantDetector,
        ibm_cloud_iam.IbmCloudIamDetector,
        ibm_cos_hmac.IbmCosHmacDetector,
        softlayer.SoftlayerDetector,
    )
    out = []
    # each rule with the literals one of which any match of it holds (a case-blind rule's in the cases a
    # secret is written in): most text has none of them. The rules that find a value after a name (`key`,
    # `password`, ...: common words) run only where the text also has a run of as many word characters as
    # their shortest value (`_Run`): prose and tracebacks seldom do
    for cls, needles in (
        (artifactory.ArtifactoryDetector, ("AKC", "AP", _Run(11))),
        (cloudant.CloudantDetector, ("key", "pw", "pass", "token", "cloudant.com", _Run(24))),
        (ibm_cloud_iam.IbmCloudIamDetector, ("key", "pwd", "pass", "token", _Run(44))),
        (ibm_cos_hmac.IbmCosHmacDetector, ("secret", _Run(48))),
        (softlayer.SoftlayerDetector, ("key", "pwd", "pass", "token", "softlayer.com", _Run(64))),
        (twilio.TwilioKeyDetector, ("AC", "SK", _Run(34))),
        (aws.AWSKeyDetector, ("A3T", "ABIA", "ACCA", "AKIA", "ASIA", "aws", "AWS", "Aws")),
        (azure_storage_key.AzureStorageKeyDetector, ("AccountKey=",)),
        (basic_auth.BasicAuthDetector, ("://",)),
        (discord.DiscordBotTokenDetector, (".",)),
        (github_token.GitHubTokenDetector, ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
        (
            gitlab_token.GitLabTokenDetector,
            (
                "glpat-",
                "gldt-",
                "glft-",
                "glsoat-",
                "glrt-",
                "GR1348941",
                "glcbt-",
                "glimt-",
                "glptt-",
                "glagent-",
                "gloas-",
            ),
        ),
        (jwt.JwtTokenDetector, ("eyJ",)),
        (mailchimp.MailchimpDetector, ("-us",)),
        (npm.NpmDetector, ("_authToken=",)),
        (openai.OpenAIDetector, ("T3BlbkFJ",)),
        (pypi_token.PypiTokenDetector, ("pypi-",)),
        (sendgrid.SendGridDetector, ("SG.",)),
        (slack.SlackDetector, ("xox", "XOX", "Xox", "hooks.slack.com", "HOOKS.SLACK.COM")),
        (square_oauth.SquareOAuthDetector, ("sq0csp-",)),
        (stripe.StripeDetector, ("k_live_",)),
        (telegram_token.TelegramBotTokenDetector, (":",)),
    ):
        rules = []
        for pat in cls().denylist:
            # the secret is the whole match, but where a rule's group is the secret (a URL's password, an
            # npm token, AWS's quoted secret key); a token is hidden to its last character (`sk_live_` + 99)
            whole = not (cls in in_group or (cls is aws.AWSKeyDetector and pat.groups))
            if whole and not pat.pattern.endswith("|$)"):  # (a rule that ends at its own delimiter: kept)
                end = "\n" if pat.flags & re.VERBOSE else ""  # a verbose rule may end in a comment
                pat = re.compile(f"(?:{pat.pattern}{end})[A-Za-z0-9_\\-]*", pat.flags)
            rules.append((pat, whole))
        words = [n for n in needles if not isinstance(n, _Run)]
        run = max([n for n in needles if isinstance(n, _Run)], default=0)
        # a name rule's literals in any case (its rules are case-blind)
        blind = re.IGNORECASE if run and all(p.flags & re.IGNORECASE for p, _ in rules) else 0
        out.append((re.compile("|".join(map(re.escape, words)), blind), run, tuple(rules)))
    return tuple(out)


class _Run(int):
    """In a rule set's literals (`_detectors`): its value is a run of at least this many word characters."""


_RUNS = re.compile(r"[A-Za-z0-9_\-]{11,}")


# remembered for short strings: a sweep's configs, tags and statuses repeat a few values 10^5 times (16k of
# at most 64 characters each: a bounded few MB)
_scrub_short_text = functools.lru_cache(maxsize=1 << 14)(_scrub_text)


_PLAIN = frozenset((int, float, bool, type(None)))  # what holds no secret: passed as it is


def _key(key: str) -> tuple[str, int, bool]:
    """A mapping key's (`scrub_text`, whether its value is secret: `is_secret_key`)."""
    return (*scrub_text(key), is_secret_key(key))


_short_key = functools.lru_cache(maxsize=1 << 14)(_key)


def _scrub_key(key: str) -> tuple[str, int, bool]:
    """`_key`, remembered when short: a sweep's 10^5 configs repeat a few dozen keys (a long one is not
    kept: 16k hostile keys of a line's length each would fill the memory)."""
    return _short_key(key) if len(key) <= 128 else _key(key)


def scrub(value: Any) -> tuple[Any, int]:
    """A copy of a nested value with secrets hidden by key and by pattern; and how many were.

    Mapping keys that are secret have their whole value replaced (whatever its type; a
    list element by element, so it keeps its length); every string, keys included, is
    scrubbed by pattern. Numbers, bools and None pass.
    """
    if value.__class__ in _PLAIN:
        return value, 0
    if isinstance(value, str):
        return scrub_text(value)
    if value.__class__ is dict or isinstance(value, Mapping):
        out, n = {}, 0
        for k, v in value.items():
            if not isinstance(k, str):
                out[k], nv = scrub(v)
                n += nv
                continue
            k2, nk, secret = _scrub_key(k)
            n += nk
            if secret and isinstance(v, (list, tuple)):
                # a list keeps its shape (a config_diff's [old, new] stays a pair)
                out[k2] = [None if x is None else REDACTED for x in v]
                n += any(x is not None and x != REDACTED for x in v)
            elif secret and v is not None and v != REDACTED:
                out[k2] = REDACTED
                n += 1
            elif v.__class__ in _PLAIN:
                out[k2] = v
            else:
                out[k2], nv = scrub(v)
                n += nv
        return out, n
    if isinstance(value, (list, tuple)):
        out_l, n = [], 0
        flag = False  # the element before was a secret flag (argv's `["--api-key", S]`): this is its value
        for v in value:
            if flag and isinstance(v, str) and v and v != REDACTED:
                out_l.append(REDACTED)
                n += 1
                flag = False
                continue
            v2, nv = scrub(v)
            out_l.append(v2)
            n += nv
            flag = isinstance(v, str) and _is_secret_flag(v)
        return out_l, n
    return value, 0


_FLAG = re.compile(r"^--?([A-Za-z][\w.\-]{0,63})$")


def _is_secret_flag(arg: str) -> bool:
    """`--api-key`, `--hf_token`, `-password`: a command-line flag whose next argument is a secret."""
    m = _FLAG.match(arg) if len(arg) <= 66 else None
    return m is not None and is_secret_key(m.group(1))


def scrub_event(kind: str, data: Any) -> tuple[Any, int]:
    """An event payload with its secrets hidden, as ingest stores it; and how many were.

    A `metrics` payload keeps its values (numbers) and has its names scrubbed by pattern
    only (a metric named `auth/retries` is not a secret); `expert_load` is all numbers;
    every other kind is `scrub`bed by key and by pattern.
    """
    if kind == "expert_load" or not isinstance(data, Mapping):
        return data, 0
    if kind == "metrics":
        out, n = {}, 0
        for k, v in data.items():
            k2, nk = scrub_text(k) if isinstance(k, str) else (k, 0)
            out[k2] = v
            n += nk
        return out, n
    return scrub(data)


def redact(value: Any) -> Any:
    """`scrub` without the count: what writers call before writing a config."""
    return scrub(value)[0]


def redacted_note(n: int) -> str:
    """What pages and reports say of a run whose `runs.redactions` is n: that something was hidden."""
    return f"{n} value{' was' if n == 1 else 's were'} redacted (secrets hidden at ingest)"
