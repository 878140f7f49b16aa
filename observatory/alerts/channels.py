"""Alert channels through apprise: any URL it knows (slack://, discord://, mailto://, ntfy://, pagerduty://,
json:// and form:// webhooks, ...). The URL holds the secret, so only a channel's name is ever shown."""

from __future__ import annotations

import sys

from observatory.alerts.rules import RANK, Channel

__all__ = ["send", "send_one", "takers", "TIMEOUT_S"]

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
    if a.notify(title=title, body=body, notify_type=ntype):
        return True
    print(f"observatory alerts: channel {c.name}: sending failed", file=sys.stderr)
    return False


def send(chans: list[Channel], severity: str, title: str, body: str) -> list[str]:
    """Send to each channel that takes `severity`, now, on this thread; the names of those that took it."""
    return [c.name for c in takers(chans, severity) if send_one(c, severity, title, body)]
