"""Alert channels through apprise: any URL it knows (slack://, discord://, mailto://, ntfy://, pagerduty://,
json:// and form:// webhooks, ...). The URL holds the secret, so only a channel's name is ever shown.

An alert's message repeats text a log writer chose (a metric name, a detector's message about it): in a
lab's chat that text must not mention anyone, link anywhere or format anything. A message's body is that
text on its first line and the observatory's own words after it; `send_one` makes the first line inert for
the channel's syntax (`chat_text`):

- Slack: `&`, `<`, `>` are sent as entities and the message as plain text (`mrkdwn: false`), so
  `<!channel>`, `<@U…>`, `<!subteam^…>` and `<url|text>` links are shown as typed, never resolved.
- Discord: the payload's `allowed_mentions` names exactly the mentions the rule asks for (none by default:
  `{"parse": []}`), every `@` of the log's text is followed by a zero-width space, and the text is one
  code span (no masked `[text](url)` links, no Markdown); the title's Markdown is backslash-escaped.
- any other channel: one line, bounded, control characters dropped.

Mentions come from the rules file only (a rule's `mention`, checked when the file is loaded:
`rules.MENTIONS`), never from a log: they are put before the message, outside the log's text, and each
channel gets the tokens of its own kind. Apprise cannot send Discord's `allowed_mentions` (its payload
names a key `allow_mentions` that Discord does not read) nor a literal Slack mention in a plain-text
message, so a Slack or Discord *webhook* is posted by `_post_chat` with a payload built here (apprise still
reads the URL); every other URL (Slack's bot token, email, ntfy, json://, ...) goes through apprise with
a TEXT body and no mention.
"""

from __future__ import annotations

import html
import re
import sys
import unicodedata
from urllib.parse import quote

from observatory.alerts.rules import RANK, Channel, mention_kind

__all__ = ["send", "send_one", "takers", "TIMEOUT_S", "chat_text", "channel_kind", "chat_payload"]

MAX_TEXT = 1000  # characters of a log writer's text in one message
MAX_TITLE = 300  # characters of a title (it holds a run's id): a message stays under Discord's 2,000
ZWSP = "\u200b"


def channel_kind(url: str) -> str:
    """'slack', 'discord' or 'plain': whose syntax a channel's messages are read in."""
    u = url.strip().lower()
    if u.startswith(("slack://", "https://hooks.slack.com/")):
        return "slack"
    if u.startswith(
        ("discord://", "https://discord.com/api/webhooks", "https://discordapp.com/api/webhooks")
    ):
        return "discord"
    return "plain"


def chat_text(text: object, kind: str) -> str:
    """A log writer's `text` for a channel of `kind`: one bounded line that mentions, links and formats
    nothing there (see the module's notes)."""
    s = " ".join(str(text).split())
    s = "".join(c for c in s if not unicodedata.category(c).startswith("C"))  # controls, bidi overrides
    if len(s) > MAX_TEXT:
        s = s[:MAX_TEXT] + "…"
    if kind == "discord":
        s = s.replace("`", "ˋ").replace("@", "@" + ZWSP)  # a backtick would end the code span
        return f"`{s}`"
    return s  # Slack: apprise entity-escapes & < > of a TEXT body


_TYPE = {"info": "info", "warn": "warning", "critical": "failure"}
# seconds a channel may take to connect, and then to answer, before its send counts as failed
TIMEOUT_S = 5.0


def takers(chans: list[Channel], severity: str) -> list[Channel]:
    """The channels that take a message of `severity` (their `min_severity` or above)."""
    return [c for c in chans if RANK.get(severity, 0) >= RANK[c.min_severity]]


_COLOR = {"info": "#3AA3E3", "warning": "#FFAB00", "failure": "#D50000", "success": "#2EB886"}
_DISCORD_MARKUP = re.compile(r"([\\*_~`|\[\]()<>#:@-])")


def discord_mentions(mention: tuple[str, ...] | list[str]) -> dict:
    """Discord's `allowed_mentions` for these tokens (`rules.MENTIONS`): exactly them, nothing parsed."""
    parse = ["everyone"] if {"@here", "@everyone"} & set(mention) else []
    users = [m.strip("<@!>") for m in mention if re.fullmatch(r"<@!?[0-9]+>", m)]
    roles = [m.strip("<@&>") for m in mention if m.startswith("<@&")]
    return {"parse": parse, "users": users, "roles": roles}


def _webhook(plugin, kind: str) -> str | None:
    """The HTTPS address of a Slack or Discord webhook that apprise read from a channel's URL; None for any
    other URL (a Slack bot token, ...: apprise sends it)."""
    if kind == "discord" and getattr(plugin, "webhook_id", None) and getattr(plugin, "webhook_token", None):
        thread = f"?thread_id={quote(str(plugin.thread_id))}" if getattr(plugin, "thread_id", None) else ""
        return f"{plugin.notify_url}/{plugin.webhook_id}/{plugin.webhook_token}{thread}"
    if kind == "slack" and getattr(plugin, "mode", None) in ("hook", "gov-hook") and plugin.token_c:
        base = plugin.webhook_gov_url if plugin.mode == "gov-hook" else plugin.webhook_url
        return f"{base}/{plugin.token_a}/{plugin.token_b}/{plugin.token_c}"
    return None


def chat_payload(kind: str, ntype: str, title: str, body: str, mention: tuple[str, ...] = ()) -> dict:
    """The JSON a Slack or Discord webhook is posted: the rule's mentions of `kind` first, then the title and
    the body (its first line a log's text, made inert by `chat_text`; the rest the observatory's own)."""
    mine = [m for m in mention if mention_kind(m) == kind]
    title = " ".join(title.split())[:MAX_TITLE]
    text, nl, ours = body.partition("\n")
    if kind == "discord":
        inert = lambda line: line if line.startswith("http") else _DISCORD_MARKUP.sub(r"\\\1", line)  # noqa: E731
        ours = "\n".join(inert(line) for line in ours.split("\n"))  # a run's id: no Markdown, our link live
        content = f"{' '.join([*mine, inert(title)])}\n{chat_text(text, kind)}{nl}{ours}"
        return {"content": content, "allowed_mentions": discord_mentions(mine)}
    esc = html.escape  # Slack reads `&`, `<`, `>` as entities and nothing else
    head = " ".join(mine + [esc(title, quote=False)])
    text = esc(chat_text(text, kind), quote=False) + nl + esc(ours, quote=False)
    return {"mrkdwn": False, "text": head, "attachments": [{"text": text, "color": _COLOR[ntype]}]}


def _post_chat(c: Channel, url: str, payload: dict, timeout_s: float) -> bool:
    import requests  # apprise's own HTTP client

    try:
        r = requests.post(url, json=payload, timeout=(timeout_s, timeout_s))
    except requests.RequestException as e:
        print(f"observatory alerts: channel {c.name}: sending failed: {type(e).__name__}", file=sys.stderr)
        return False
    if r.ok:
        return True
    print(f"observatory alerts: channel {c.name}: sending failed: HTTP {r.status_code}", file=sys.stderr)
    return False


def send_one(
    c: Channel,
    severity: str,
    title: str,
    body: str,
    timeout_s: float = TIMEOUT_S,
    mention: tuple[str, ...] = (),
) -> bool:
    """Send one message to one channel, waiting at most about `timeout_s` to connect and as long for its
    answer; whether it took it (a failure is said on stderr). `mention`: the rule's mentions (the rules
    file's), sent to the Slack or Discord webhooks of their kind."""
    import apprise  # lazy: only a run with channels and something to say pays its import

    plugin = apprise.Apprise.instantiate(c.url)
    if plugin is None:
        print(f"observatory alerts: channel {c.name}: apprise does not know this URL", file=sys.stderr)
        return False
    ntype = _TYPE.get(severity, "info") if not title.startswith("[RESOLVED]") else "success"
    kind = channel_kind(c.url)
    hook = _webhook(plugin, kind)
    if hook is not None:
        return _post_chat(c, hook, chat_payload(kind, ntype, title, body, mention), timeout_s)
    plugin.socket_connect_timeout = plugin.socket_read_timeout = timeout_s
    a = apprise.Apprise()
    a.add(plugin)
    text, nl, ours = body.partition("\n")  # the log's text, then the observatory's own lines
    body = chat_text(text, kind) + nl + ours
    if a.notify(title=title, body=body, notify_type=ntype, body_format=apprise.NotifyFormat.TEXT):
        return True
    print(f"observatory alerts: channel {c.name}: sending failed", file=sys.stderr)
    return False


def send(
    chans: list[Channel], severity: str, title: str, body: str, mention: tuple[str, ...] = ()
) -> list[str]:
    """Send to each channel that takes `severity`, now, on this thread; the names of those that took it."""
    return [c.name for c in takers(chans, severity) if send_one(c, severity, title, body, mention=mention)]
