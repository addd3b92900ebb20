"""Built-in notifiers: console, file (JSON lines), webhook (Slack, Discord, Teams, ntfy), email.

Targets (see docs/alerts.md)::

    console:                              the tracker's log (stderr)
    file:alerts.jsonl                     one JSON object per line, appended
    webhook:https://example.com/hook      HTTP POST of the message as JSON
    webhook+slack:${SLACK_WEBHOOK_URL}    a Slack incoming webhook body ({"text": ...})
    webhook+discord:URL                   a Discord webhook body ({"content": ..., "embeds": [...]})
    webhook+teams:URL                     a Teams Workflows webhook body (an Adaptive Card)
    webhook+ntfy:https://ntfy.sh/TOPIC    ntfy's JSON publish ({"topic", "title", "message", ...})
    email:ops@example.com                 SMTP with STARTTLS (TRACKER_SMTP_* below)

``webhook:`` without a flavor picks one from a well-known host (hooks.slack.com,
discord.com, ntfy.sh, *.webhook.office.com / *.logic.azure.com), else posts the
message as it is. ``TRACKER_WEBHOOK_TOKEN``, when set, goes out as a bearer token.
Email reads ``TRACKER_SMTP_HOST`` (required), ``TRACKER_SMTP_PORT`` (587),
``TRACKER_SMTP_USER`` / ``TRACKER_SMTP_PASSWORD`` (login when set),
``TRACKER_SMTP_FROM`` (default ``tracker@<host>``), ``TRACKER_SMTP_STARTTLS`` (1;
0 only for a server on this machine) and ``TRACKER_SMTP_CAFILE`` (a CA bundle to
trust, for a server with its own certificate). Every secret comes from the
environment of the sending process, never from the run's stored configuration.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import sys
import urllib.parse
from typing import Any

from tracker import hookimpl
from tracker.errors import ConfigError
from tracker.notify.config import Target, expand, mask

log = logging.getLogger("tracker.notify")

TIMEOUT_S = 10.0
FLAVORS = ("json", "slack", "discord", "teams", "ntfy")
_NTFY_PRIORITY = {"info": 3, "warning": 4, "error": 5}
_EMOJI = {"info": "information_source", "warning": "warning", "error": "rotating_light"}


def _line(msg: dict[str, Any]) -> str:
    held = f" ({msg['held_back']} more held back by the rate limit)" if msg.get("held_back") else ""
    step = f" at step {msg['step']}" if msg.get("step") is not None else ""
    return f"{msg['title']}{step}: {msg['text']}{held}"


class Console:
    name = "console"
    help = "the tracker's log on stderr: console:"

    def check(self, target: Target) -> None:
        return None

    def send(self, target: Target, message: dict[str, Any]) -> None:
        print(f"tracker alert: {_line(message)}", file=sys.stderr, flush=True)


class File:
    name = "file"
    help = "append one JSON object per line: file:PATH"

    def check(self, target: Target) -> None:
        if not target.arg:
            raise ConfigError("notify target 'file:' needs a path; write e.g. file:alerts.jsonl")

    def send(self, target: Target, message: dict[str, Any]) -> None:
        path = os.path.expanduser(expand(target.arg))
        data = (json.dumps(message, default=str, allow_nan=False) + "\n").encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, data)  # one write of an O_APPEND file: lines of two processes never mix
            os.fsync(fd)
        finally:
            os.close(fd)


def flavor_of(target: Target, url: str) -> str:
    """The body format: the target's ``+flavor``, else from a well-known host, else plain JSON."""
    if target.flavor:
        return target.flavor
    host = (urllib.parse.urlsplit(url).hostname or "").lower()
    if host == "hooks.slack.com":
        return "slack"
    if host in ("discord.com", "discordapp.com"):
        return "discord"
    if host == "ntfy.sh":
        return "ntfy"
    if host.endswith(".webhook.office.com") or host.endswith(".logic.azure.com"):
        return "teams"
    return "json"


def body(flavor: str, url: str, msg: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL to post to and the JSON body of ``msg`` for ``flavor``."""
    text = _line(msg)
    if flavor == "slack":  # Slack incoming webhooks: "text" is required, "blocks" optional
        return url, {"text": text, "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": msg["title"][:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}}]}
    if flavor == "discord":  # Discord webhooks: "content" up to 2000 characters, embeds optional
        color = {"error": 0xE01E5A, "warning": 0xECB22E}.get(msg.get("severity", ""), 0x2EB67D)
        return url, {"content": text[:2000], "embeds": [
            {"title": msg["title"][:256], "description": msg["text"][:4096], "color": color}]}
    if flavor == "teams":  # Teams Workflows webhooks take an Adaptive Card as a message attachment
        card = {"$schema": "http://adaptivecards.io/schemas/adaptive-card.json", "type": "AdaptiveCard",
                "version": "1.2", "body": [
                    {"type": "TextBlock", "size": "Medium", "weight": "Bolder", "text": msg["title"], "wrap": True},
                    {"type": "TextBlock", "text": text, "wrap": True}]}
        return url, {"type": "message", "attachments": [
            {"contentType": "application/vnd.microsoft.card.adaptive", "contentUrl": None, "content": card}]}
    if flavor == "ntfy":  # ntfy's JSON publishing: POST to the server root with the topic in the body
        parts = urllib.parse.urlsplit(url)
        topic = parts.path.strip("/")
        root = urllib.parse.urlunsplit((parts.scheme, parts.netloc, "/", "", ""))
        return root, {"topic": topic, "title": msg["title"], "message": text,
                      "priority": _NTFY_PRIORITY.get(msg.get("severity", ""), 3),
                      "tags": [_EMOJI.get(msg.get("severity", ""), "bell"), str(msg.get("kind", ""))]}
    return url, msg


class Webhook:
    name = "webhook"
    help = "HTTP POST of JSON: webhook[+slack|+discord|+teams|+ntfy]:URL"

    def check(self, target: Target) -> None:
        if target.flavor and target.flavor not in FLAVORS:
            raise ConfigError(f"notify target {target.shown!r}: unknown webhook flavor {target.flavor!r}; "
                              f"available: {', '.join(FLAVORS)}")
        if "${" in target.arg:
            return  # read from the environment when sending
        scheme = urllib.parse.urlsplit(target.arg).scheme
        if scheme not in ("http", "https"):
            raise ConfigError(f"notify target {target.shown!r} needs an http(s) URL; write "
                              "webhook:https://example.com/hook or webhook:${MY_WEBHOOK_URL}")
        if ntfy_topic_missing(target):
            raise ConfigError(f"notify target {target.shown!r}: name the ntfy topic, e.g. https://ntfy.sh/my-topic")

    def send(self, target: Target, message: dict[str, Any]) -> None:
        import urllib.request

        url = expand(target.arg)
        post_to, payload = body(flavor_of(target, url), url, message)
        headers = {"Content-Type": "application/json", "User-Agent": "tracker-notify"}
        token = os.environ.get("TRACKER_WEBHOOK_TOKEN")
        if token:
            headers["Authorization"] = f"Bearer {token}"
        request = urllib.request.Request(post_to, data=json.dumps(payload, default=str).encode(), headers=headers,
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                response.read(4096)
        except Exception as exc:  # the URL (and its token) never leaves in an error
            raise RuntimeError(f"POST to {mask(post_to)} failed: {mask(str(exc))}") from None


def ntfy_topic_missing(target: Target) -> bool:
    return target.flavor == "ntfy" and not urllib.parse.urlsplit(target.arg).path.strip("/")


class Email:
    name = "email"
    help = "SMTP with STARTTLS: email:ADDRESS[;ADDRESS] (server from TRACKER_SMTP_*)"

    def check(self, target: Target) -> None:
        addresses = [a.strip() for a in target.arg.split(";") if a.strip()]
        if not addresses or not all(re.fullmatch(r"[^@\s]+@[^@\s]+", a) for a in addresses):
            raise ConfigError(f"notify target {target.shown!r} needs an email address; write email:ops@example.com")

    def send(self, target: Target, message: dict[str, Any]) -> None:
        import smtplib
        import ssl
        from email.message import EmailMessage

        host = os.environ.get("TRACKER_SMTP_HOST")
        if not host:
            raise ConfigError("email notifications need TRACKER_SMTP_HOST (and TRACKER_SMTP_PORT, default 587) "
                              "in the environment of the sending process")
        port = int(os.environ.get("TRACKER_SMTP_PORT", "587"))
        sender = os.environ.get("TRACKER_SMTP_FROM") or f"tracker@{socket.gethostname()}"
        mail = EmailMessage()
        mail["Subject"] = message["title"]
        mail["From"] = sender
        mail["To"] = ", ".join(a.strip() for a in expand(target.arg).split(";") if a.strip())
        mail["X-Tracker-Run"] = str(message.get("run_id"))
        mail.set_content(_line(message) + "\n\n" + json.dumps(message, indent=2, default=str) + "\n")
        with smtplib.SMTP(host, port, local_hostname=socket.gethostname(), timeout=TIMEOUT_S) as smtp:
            if os.environ.get("TRACKER_SMTP_STARTTLS", "1") != "0":
                context = ssl.create_default_context(cafile=os.environ.get("TRACKER_SMTP_CAFILE") or None)
                smtp.starttls(context=context)
            elif host not in ("localhost", "127.0.0.1", "::1"):
                raise ConfigError(f"TRACKER_SMTP_STARTTLS=0 is only for a relay on this machine, not {host!r}; "
                                  "unset it to send over STARTTLS")
            user = os.environ.get("TRACKER_SMTP_USER")
            if user:
                smtp.login(user, os.environ.get("TRACKER_SMTP_PASSWORD", ""))
            smtp.send_message(mail)


@hookimpl
def tracker_register_notifiers(register: Any) -> None:
    for notifier in (Console(), File(), Webhook(), Email()):
        register(notifier)
