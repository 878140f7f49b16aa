"""Alert text is no injection channel into the lab's chat (issue 55, class 2).

A detector's message repeats a metric name a log writer chose. The alerts it raises go out through apprise
to Slack, Discord and JSON webhooks; here each channel's real outgoing HTTP request is captured by a
receiver on 127.0.0.1: the json:// channel posts there itself, and the slack:// and discord:// channels'
requests (built by apprise's own Slack and Discord plugins, headers and payload as they would leave) are
sent there instead of hooks.slack.com / discord.com (only the URL's host is rewritten, in `requests`).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import urlsplit

import pytest
import requests
from conftest import event, write_lines

from observatory import findings
from observatory.alerts import channels
from observatory.pipeline import ingest

HOSTILE = (
    "train/loss <!channel> <!here> <@U024BE7LH> <!subteam^S0123|team> <https://evil.example/reset|Reset your "
    "password> @everyone @here <@123456789012> <@&987654321> [Reset](https://evil.example) & &lt;!channel&gt; "
    "`code` **bold** ![i](https://evil.example/i.png)\u202e\x1b[31m"
)


class Receiver(BaseHTTPRequestHandler):
    got: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).got.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"ok" if "slack" in self.path else b"{}")  # what each service answers

    def log_message(self, *a):
        pass


@pytest.fixture
def receiver(monkeypatch):
    Receiver.got = []
    srv = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    real = requests.sessions.Session.request

    def to_receiver(self, method, url, *a, **k):
        parts = urlsplit(url)
        if parts.hostname in ("hooks.slack.com", "discord.com"):
            url = f"http://127.0.0.1:{srv.server_port}/{parts.hostname}{parts.path}"
        return real(self, method, url, *a, **k)

    monkeypatch.setattr(requests.sessions.Session, "request", to_receiver)
    yield srv.server_port, Receiver.got
    srv.shutdown()


def _payloads(got) -> dict[str, dict]:
    out = {}
    for path, body in got:
        name = "slack" if "slack" in path else "discord" if "discord" in path else "json"
        out[name] = json.loads(body)
    return out


def _slack_text(p: dict) -> str:
    return " ".join(a.get("text", "") for a in p.get("attachments", [])) + p.get("text", "")


def _assert_inert(p: dict[str, dict]) -> None:
    slack = _slack_text(p["slack"])
    assert p["slack"].get("mrkdwn") is False or "mrkdwn" not in p["slack"]
    # Slack resolves `<!channel>`, `<@U…>`, `<url|text>` only from a literal `<`: every one is an entity
    assert "<" not in slack and ">" not in slack and "&lt;!channel&gt;" in slack, slack
    assert "&amp;lt;!channel&amp;gt;" in slack  # the typed entity is shown as typed, not as `<!channel>`
    d = p["discord"]
    content = d.get("content", "") + json.dumps(d.get("embeds", []))
    assert "allow_mentions" not in d
    for live in ("@everyone", "@here", "<@123456789012>", "<@&987654321>"):
        assert live not in content, (live, content)
    assert "`" in content and "[Reset](https://evil.example)" in content  # inside the one code span
    assert content.count("`") == 2 + content.count("\\`"), content
    assert "\x1b" not in json.dumps(p) and "\u202e" not in json.dumps(p, ensure_ascii=False)
    assert "train/loss" in p["json"]["message"]


# what an operator may ask a rule to mention: two of Slack's, three of Discord's
MENTION = ["<!here>", "<@U024BE7LH>", "@here", "<@&223456789012345678>", "<@123456789012345678>"]


def _rules(tmp_path, monkeypatch, port, mention: list[str] | None = None) -> None:
    p = tmp_path / "alerts.yaml"
    p.write_text(
        "channels:\n"
        f"  - {{url: 'json://127.0.0.1:{port}/hook', name: hook}}\n"
        "  - {url: 'slack://T1JJ3T3L2/A1BRTD4JD/TIiajkdnlazkcOXrIdevi7FQ', name: slack}\n"
        "  - {url: 'discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js', name: discord}\n"
        + (f"rules:\n  - {{name: findings, mention: {json.dumps(mention)}}}\n" if mention else "")
    )
    monkeypatch.setenv("OBSERVATORY_ALERTS_FILE", str(p))


def _strip_mentions(p: dict[str, dict]) -> dict[str, dict]:
    """The payloads less the opted-in mentions at the head of Slack's text and Discord's content."""
    p = json.loads(json.dumps(p))
    slack = p["slack"]["text"]
    assert slack.startswith("<!here> <@U024BE7LH> "), slack
    p["slack"]["text"] = slack.removeprefix("<!here> <@U024BE7LH> ")
    d = p["discord"]
    assert d["content"].startswith("@here <@&223456789012345678> <@123456789012345678> "), d["content"]
    d["content"] = d["content"].removeprefix("@here <@&223456789012345678> <@123456789012345678> ")
    assert d.pop("allowed_mentions") == {
        "parse": ["everyone"],
        "users": ["123456789012345678"],
        "roles": ["223456789012345678"],
    }
    return p


@pytest.mark.slow  # (several seconds: an ingest with its analyses, a page under AppTest)
@pytest.mark.parametrize("opt_in", [False, True], ids=["no-mention", "rule-mentions"])
def test_an_alert_about_a_hostile_metric_name_mentions_and_links_nobody(
    runs_dir, db_path, tmp_path, monkeypatch, receiver, opt_in
):
    """Fails before the fix: `<!channel>`, `@everyone`, `<@…>` and `<url|text>` went out as typed; and no rule
    could mention anyone (Discord got no `allowed_mentions`: apprise names it `allow_mentions`). With the
    opt-in, exactly the rule's mentions go out, each to its own chat, outside the log's text."""
    _rules(tmp_path, monkeypatch, receiver[0], MENTION if opt_in else None)
    now = time.time()
    write_lines(
        runs_dir / "r" / "events.0.jsonl",
        [event("r", "run_start", {"config": {}}, 0, step=0, t=now - 60)]
        + [event("r", "metrics", {"train/loss": 3.0}, i, step=i, t=now - 10 + i) for i in range(1, 5)],
    )
    ingest(runs_dir, db_path, emit=None)
    f = {
        "detector": "loss_spike",
        "metric": HOSTILE,
        "severity": "critical",
        "message": f"a spike in {HOSTILE}",
    }
    findings.write(runs_dir, "r", "anomaly", [({**f, "window": [3, 3]}, 3)])
    ingest(runs_dir, db_path, emit=None)
    p = _payloads(receiver[1])
    assert sorted(p) == ["discord", "json", "slack"], receiver[1]
    if opt_in:
        p = _strip_mentions(p)
    else:
        assert p["discord"]["allowed_mentions"] == {"parse": [], "users": [], "roles": []}
        assert not p["slack"]["text"].startswith(("<", "@"))
    _assert_inert(p)
    assert p["json"]["message"].startswith("loss_spike on train/loss")  # no mention token added for json://


def test_chat_text_keeps_the_words_and_bounds_them():
    s = channels.chat_text("x" * 5000 + "\n#heading", "plain")
    assert len(s) <= channels.MAX_TEXT + 1 and "\n" not in s
    assert channels.chat_text("a @everyone b", "discord") == "`a @\u200beveryone b`"
    assert channels.channel_kind("https://hooks.slack.com/services/a/b/c") == "slack"
    assert channels.channel_kind("json://127.0.0.1/x") == "plain"


def test_a_discord_thread_is_kept_when_we_post_the_webhook():
    import apprise

    plugin = apprise.Apprise.instantiate("discord://4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js?thread=12345")
    assert channels._webhook(plugin, "discord") == (
        "https://discord.com/api/webhooks/4174216298/JHMHI8qBe7bk2ZwO5U711o3dV_js?thread_id=12345"
    )
    bot = apprise.Apprise.instantiate("slack://xoxb-1234-1234-abc4321/#general")
    assert channels._webhook(bot, "slack") is None  # a bot token: apprise sends it (no mention)


def test_a_rule_mentions_only_well_formed_tokens(tmp_path):
    from observatory.alerts import rules

    p = tmp_path / "alerts.yaml"
    p.write_text(
        "rules:\n  - {name: findings, mention: ['@everyone', '<!channel>']}\n"
        "  - {name: hot, metric: train/loss, above: 9, mention: '<@W0ABC123>'}\n"
    )
    got = {r.name: r.mention for r in rules.load(p).rules}
    assert got["findings"] == ("@everyone", "<!channel>") and got["hot"] == ("<@W0ABC123>",)
    assert got["stalled"] == ()
    for bad in ("everyone", "<!channel|x>", "<https://evil.example|x>", "@here now", "<@U1> <@U2>", 5):
        p.write_text(f"rules:\n  - {{name: stalled, mention: [{json.dumps(bad)}]}}\n")
        with pytest.raises(rules.RulesError, match=r"rules\[0\]\.mention\[0\]"):
            rules.load(p)


def test_chat_payloads_give_each_chat_its_own_mentions_and_the_title_no_markup():
    title = "[CRITICAL] [x](https://evil.example) @everyone: findings"
    body = "a spike in @here <!channel>\nrun [x](https://evil.example), step 3\nhttps://obs.example/live?run=x&step=3"
    d = channels.chat_payload("discord", "failure", title, body, tuple(MENTION))
    first, log, where, link = d["content"].split("\n")
    assert first.startswith("@here <@&223456789012345678> <@123456789012345678> ")
    assert "](" not in first + where and link.startswith("https://")  # `\\]\\(`: no masked link
    assert "\\@everyone" in first and "\\[x\\]\\(https" in where
    assert log == "`a spike in @\u200bhere <!channel>`"
    s = channels.chat_payload("slack", "failure", title, body, tuple(MENTION))
    assert s["text"].startswith("<!here> <@U024BE7LH> [CRITICAL]") and s["text"].count("<") == 2
    assert "<" not in s["attachments"][0]["text"] and "&amp;step=3" in s["attachments"][0]["text"]
    assert channels.chat_payload("discord", "info", title, body)["allowed_mentions"] == {
        "parse": [],
        "users": [],
        "roles": [],
    }
