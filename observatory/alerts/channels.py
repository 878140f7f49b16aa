"""Alert channels through apprise: any URL it knows (slack://, discord://, mailto://, ntfy://, pagerduty://,
json:// and form:// webhooks, ...). The URL holds the secret, so only a channel's name is ever shown."""

from __future__ import annotations

import sys

from observatory.alerts.rules import RANK, Channel

__all__ = ["send"]

_TYPE = {"info": "info", "warn": "warning", "critical": "failure"}


def send(chans: list[Channel], severity: str, title: str, body: str) -> list[str]:
    """Send to each channel that takes `severity`; the names of those that took it."""
    import apprise  # lazy: only a run with channels and something to say pays its import

    sent = []
    for c in chans:
        if RANK.get(severity, 0) < RANK[c.min_severity]:
            continue
        a = apprise.Apprise()
        if not a.add(c.url):
            print(f"observatory alerts: channel {c.name}: apprise does not know this URL", file=sys.stderr)
            continue
        ntype = _TYPE.get(severity, "info") if not title.startswith("[RESOLVED]") else "success"
        if a.notify(title=title, body=body, notify_type=ntype):
            sent.append(c.name)
        else:
            print(f"observatory alerts: channel {c.name}: sending failed", file=sys.stderr)
    return sent
