"""Alert channels through apprise: any URL it knows (slack://, discord://, mailto://, ntfy://, pagerduty://,
json:// and form:// webhooks, ...). The URL holds the secret, so only a channel's name is ever shown.

An alert's message repeats text a log writer chose (a metric name, a detector's message about it): in a
lab's chat that text must not mention anyone, link anywhere or format anything. A message's body is that
text on its first line and the observatory's own words after it; `send_one` makes the first line inert for
the channel's syntax (`chat_text`) and sends the body as plain text (apprise's TEXT body):

- Slack: `&`, `<`, `>` are sent as entities (apprise does that for a TEXT body in `mrkdwn: false`), so
  `<!channel>`, `<@U…>`, `<!subteam^…>` and `<url|text>` links are shown as typed, never resolved.
- Discord: every `@` is followed by a zero-width space (no `@everyone`, `@here`, `<@id>`, `<@&role>`,
  which Discord resolves in a webhook's content when the payload names no `allowed_mentions`, and which
  apprise's ping detection would turn into `allow_mentions`), and the text is one code span (no masked
  `[text](url)` links, no Markdown). Mentions a lab wants come from its own channel URL (apprise's
  `?ping=`), never from a log.
- any other channel: one line, bounded, control characters dropped.
"""

from __future__ import annotations

import sys
import unicodedata

from observatory.alerts.rules import RANK, Channel

__all__ = ["send", "send_one", "takers", "TIMEOUT_S", "chat_text", "channel_kind"]

MAX_TEXT = 1000  # characters of a log writer's text in one message
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


def send_one(c: Channel, severity: str, title: str, body: str, timeout_s: float = TIMEOUT_S) -> bool:
    """Send one message to one channel, waiting at most about `timeout_s` to connect and as long for its
    answer; whether it took it (a failure is said on stderr)."""
    import apprise  # lazy: only a run with channels and something to say pays its import

    plugin = apprise.Apprise.instantiate(c.url)
    if plugin is None:
        print(f"observatory alerts: channel {c.name}: apprise does not know this URL", file=sys.stderr)
        return False
    plugin.socket_connect_timeout = plugin.socket_read_timeout = timeout_s
    a = apprise.Apprise()
    a.add(plugin)
    ntype = _TYPE.get(severity, "info") if not title.startswith("[RESOLVED]") else "success"
    text, nl, ours = body.partition("\n")  # the log's text, then the observatory's own lines
    body = chat_text(text, channel_kind(c.url)) + nl + ours
    if a.notify(title=title, body=body, notify_type=ntype, body_format=apprise.NotifyFormat.TEXT):
        return True
    print(f"observatory alerts: channel {c.name}: sending failed", file=sys.stderr)
    return False


def send(chans: list[Channel], severity: str, title: str, body: str) -> list[str]:
    """Send to each channel that takes `severity`, now, on this thread; the names of those that took it."""
    return [c.name for c in takers(chans, severity) if send_one(c, severity, title, body)]
