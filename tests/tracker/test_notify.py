"""Alerts against real servers on 127.0.0.1: an HTTP server receives the webhook JSON, an
SMTP server (aiosmtpd, STARTTLS required) receives the email; dead endpoints, kill -9 with
a queued message, a run that stops beating, rules, rate limit, masking, the CLI."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from click.testing import CliRunner

import tracker
from tracker.errors import ConfigError
from tracker.notify import config as nconfig
from tracker.notify import outbox

from .notify_servers import Blackhole, Hook, MailBox, free_port, smtp_server, wait_for

TOKEN = "T0AAA/B0BBB/sEcReTtOkEn42"


@pytest.fixture
def hook() -> Iterator[Hook]:
    server = Hook()
    yield server
    server.stop()


@pytest.fixture
def smtp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[MailBox]:
    for box, env in smtp_server(tmp_path):
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        yield box


def _steps(run: Any, n: int, nan_at: int | None = None) -> None:
    for i in range(n):
        run.log({"loss": float("nan") if i == nan_at else 1.0 / (i + 1)}, step=i)


def test_a_nan_reaches_the_webhook_and_the_mailbox_within_10_s(hook: Hook, smtp: MailBox) -> None:
    run = tracker.init("alerts", run_id="nan-run", notify=[f"webhook+slack:{hook.url}/services/{TOKEN}",
                                                           "email:ops@example.com"])
    _steps(run, 20)
    started = time.monotonic()
    _steps(run, 25, nan_at=20)
    got = wait_for(lambda: hook.received and smtp.messages, 10.0)
    elapsed = time.monotonic() - started
    run.finish()
    assert got, f"webhook {hook.received}, mail {smtp.messages}"
    assert elapsed < 10.0
    path, body = hook.received[0]
    print("\nwebhook body as received:", path, json.dumps(body, indent=1))
    assert path == f"/services/{TOKEN}"
    assert set(body) == {"text", "blocks"} and "non_finite on loss in run nan-run at step 20" in body["text"]
    assert body["blocks"][0]["type"] == "header"
    mail = smtp.messages[0]
    print("email as received:", mail.sender, mail.to, "STARTTLS" if mail.tls else "plain", "\n" + mail.data)
    assert mail.tls and mail.to == ["ops@example.com"] and mail.sender == "tracker@test.invalid"
    assert "Subject: [error] non_finite on loss in run nan-run" in mail.data
    assert "loss is NaN at step 20" in mail.data
    assert len(hook.received) == 1 and len(smtp.messages) == 1  # one event, one message each


def test_each_flavor_posts_its_services_body(hook: Hook) -> None:
    from plugins.notifiers import Webhook

    message = {"title": "[error] non_finite on loss in run r", "text": "loss is NaN", "severity": "error",
               "kind": "non_finite", "step": 3, "held_back": 2, "run_id": "r"}
    for flavor in ("discord", "teams", "ntfy", "json"):
        Webhook().send(nconfig.parse_target(f"webhook+{flavor}:{hook.url}/topic-{flavor}"), message)
    bodies = {path: body for path, body in hook.received}
    discord = bodies["/topic-discord"]
    assert discord["content"].startswith("[error] non_finite") and "2 more held back" in discord["content"]
    assert discord["embeds"][0]["description"] == "loss is NaN"
    card = bodies["/topic-teams"]["attachments"][0]
    assert bodies["/topic-teams"]["type"] == "message"
    assert card["contentType"] == "application/vnd.microsoft.card.adaptive"
    assert card["content"]["type"] == "AdaptiveCard" and card["content"]["body"][0]["text"] == message["title"]
    assert bodies["/"] == {"topic": "topic-ntfy", "title": message["title"], "priority": 5,
                           "message": bodies["/"]["message"], "tags": ["rotating_light", "non_finite"]}
    assert bodies["/topic-json"] == message


def test_a_dead_endpoint_never_slows_log_and_warns_once(caplog: pytest.LogCaptureFixture,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_NOTIFY_RETRY_S", "0.05")
    monkeypatch.setenv("TRACKER_NOTIFY_RATE_S", "0")
    monkeypatch.setenv("TRACKER_NOTIFY_CLOSE_S", "1")
    caplog.set_level(logging.WARNING, logger="tracker")
    hole = Blackhole()  # accepts, never answers: each send hangs until its 10 s timeout
    try:
        for target in (f"webhook:{hole.url}/{TOKEN}", f"webhook:http://127.0.0.1:{free_port()}/{TOKEN}"):
            run = tracker.init("alerts", notify=[target])
            worst, t0 = 0.0, time.perf_counter()
            for i in range(3000):
                t = time.perf_counter()
                run.log({"loss": float("nan") if i % 500 == 1 else 1.0}, step=i)
                if i % 500 == 1:
                    run.event("custom", f"boom {i}", severity="error")
                worst = max(worst, time.perf_counter() - t)
            logging_s = time.perf_counter() - t0
            time.sleep(1.0)  # the refused endpoint is retried many times meanwhile
            t = time.perf_counter()
            run.finish()
            finish_s = time.perf_counter() - t
            assert worst < 0.5 and logging_s < 5.0, (target, worst, logging_s)
            assert finish_s < 4.0, target  # bounded by TRACKER_NOTIFY_CLOSE_S, not the endpoint
            left = outbox.pending(run.home, run.run_id)
            assert left, target  # kept for the next process
    finally:
        hole.close()
    warnings = [r.getMessage() for r in caplog.records if "notification to" in r.getMessage()]
    refused = [w for w in warnings if "Connection refused" in w]
    tries = max(json.loads(p.read_text())["attempts"] for p in left)
    assert len(refused) == 1 and tries > 1, (warnings, tries)  # one warning however many retries
    assert TOKEN not in caplog.text and all("/***" in w for w in warnings)  # the URL's token masked


CHILD = textwrap.dedent(
    """
    import os, sys, time, tracker
    from tracker.notify import outbox
    run = tracker.init("alerts", run_id=sys.argv[1], notify=["webhook:${HOOK_URL}/queued"])
    run.log({"loss": 1.0}, step=0)
    if sys.argv[2] == "queue":
        run.event("custom", "queued before the kill", severity="error")
        while not any(json.loads(p.read_text())["attempts"] for p in outbox.pending(run.home, run.run_id)):
            time.sleep(0.02)
        os.kill(os.getpid(), 9)
    run.flush()
    print("ready", flush=True)
    time.sleep(600)
    """
).replace("import os,", "import json, os,")


def _child(tmp_path: Path, home: Path, run_id: str, mode: str, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    full = {**os.environ, "TRACKER_HOME": str(home), **env}
    return subprocess.Popen([sys.executable, str(script), run_id, mode], env=full, stdout=subprocess.PIPE, text=True)


def test_a_message_queued_at_a_kill_9_is_sent_by_the_next_process(hook: Hook, home: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    proc = _child(tmp_path, home, "queued", "queue", {"HOOK_URL": dead, "TRACKER_NOTIFY_RETRY_S": "60"})
    assert proc.wait(timeout=60) == -signal.SIGKILL
    assert not hook.received and len(outbox.pending(home, "queued")) == 1
    assert "HOOK_URL" in (home / "runs/queued/notify/targets.json").read_text()  # the URL itself is not kept
    assert dead not in (home / "runs/queued/run.json").read_text()
    monkeypatch.setenv("HOOK_URL", hook.url)  # the next process reads the secret from its own environment
    tracker.open_store()  # opening the store sends what the dead run left
    assert wait_for(lambda: len(hook.received) == 2, 10.0), hook.received
    kinds = sorted((b["kind"], b["text"].split(":")[0]) for _, b in hook.received)
    assert kinds[0] == ("custom", "queued before the kill")  # the message the killed run had queued
    assert kinds[1][0] == "run_crashed"  # and its process is gone: shown crashed, notified
    assert {p for p, _ in hook.received} == {"/queued"} and not outbox.pending(home, "queued")
    from tracker.notify.recovery import recover

    recover(home)  # each sent once: the idempotency keys and the crash marker are recorded
    assert len(hook.received) == 2


def test_a_run_that_stops_beating_is_crashed_and_notified_once(hook: Hook, home: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker import cli

    monkeypatch.setenv("TRACKER_HEARTBEAT_S", "1")  # stale after 2 s, here and in the child
    monkeypatch.setenv("HOOK_URL", hook.url)
    proc = _child(tmp_path, home, "beat", "wait", {"TRACKER_HEARTBEAT_S": "1"})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(2.5)
        assert tracker.query("SELECT status FROM runs")["status"][0] == "running"  # idle, yet beating
        os.kill(proc.pid, signal.SIGSTOP)  # alive on this host but silent: the heartbeat rule decides
        time.sleep(2.6)
        assert tracker.query("SELECT status FROM runs")["status"][0] == "crashed"
        watch = [CliRunner().invoke(cli.cli, ["notify", "watch", "--once"]) for _ in range(2)]
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert [w.exit_code for w in watch] == [0, 0], watch[0].output
    assert "crashed 0" in watch[1].output  # seen once, by whichever process came first
    CliRunner().invoke(cli.cli, ["notify", "watch", "--once"])  # the kill -9 after it: no second message
    tracker.open_store()
    time.sleep(0.5)
    crashed = [b for _, b in hook.received if b["kind"] == "run_crashed"]
    print("\nkilled-run notification:", json.dumps(crashed, indent=1))
    assert len(crashed) == 1 and "no heartbeat for" in crashed[0]["text"] and crashed[0]["run_id"] == "beat"
    run = tracker.init("alerts", run_id="beat", resume="allow", notify=[])
    assert tracker.query("SELECT status FROM runs")["status"][0] == "running"  # a resume runs again
    run.finish()


def test_rules_pick_events_and_the_rate_limit_counts_what_it_held_back(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_NOTIFY_RATE_S", "0.6")
    out, val = tmp_path / "all.jsonl", tmp_path / "val.jsonl"
    run = tracker.init("alerts", run_id="rules", notify=[
        f"file:{out}", f"file:{val}",
        {"name": "val-warnings", "to": f"file:{val}", "severity": "warning", "keys": "val/*"},
        {"name": "errors", "to": ["file"], "severity": "error"},
    ])
    run.log({"loss": 1.0}, step=0)
    run.event("spike", "val spike", key="val/loss", severity="warning")  # val only
    run.event("spike", "train spike", key="train/loss", severity="warning")  # nowhere
    for i in range(3):  # errors: the first goes out, two are held back
        run.event("custom", f"error {i}", severity="error", step=0)
    run.flush()
    time.sleep(1.0)
    run.event("custom", "error after the window", severity="error", step=0)
    run.event("custom", "error after the window", severity="error", step=0)  # identical: sent once
    run.finish()
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(m["text"], m["held_back"], m["rule"]) for m in got] == [
        ("error 0", 0, "errors"), ("error after the window", 2, "errors")]
    assert [m["text"] for m in map(json.loads, val.read_text().splitlines())][0] == "val spike"


def test_targets_from_the_environment_and_pyproject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent("""
        [tool.tracker.notify]
        targets = ["webhook+slack:${SLACK_URL}", "email:ops@example.com"]
        rules = [{kinds = ["non_finite"], severity = "warning"}]
        """))
    (tmp_path / "sub").mkdir()
    cfg = nconfig.load(cwd=tmp_path / "sub")
    assert cfg.specs() == ["webhook+slack:${SLACK_URL}", "email:ops@example.com"]
    assert cfg.rules[0].matches("non_finite", "warning", "loss") and not cfg.rules[0].matches("spike", "error", None)
    monkeypatch.setenv("TRACKER_NOTIFY", "console:, file:a.jsonl")
    assert nconfig.load(cwd=tmp_path).specs() == ["console:", "file:a.jsonl"]
    assert nconfig.load([], cwd=tmp_path).targets == []  # notify=[]: off
    with pytest.raises(ConfigError, match="unknown notifier 'pager'; available: console, email, file, webhook"):
        tracker.init("p", run_id="bad", notify=["pager:me"])
    with pytest.raises(ConfigError, match="needs environment variable SLACK_URL"):
        nconfig.expand("${SLACK_URL}")
    assert not (Path(os.environ["TRACKER_HOME"]) / "runs" / "bad").exists()


def test_tokens_are_masked() -> None:
    spec = f"webhook+slack:https://user:pw@hooks.slack.com/services/{TOKEN}?x=1"
    assert nconfig.parse_target(spec).shown == "webhook+slack:https://***@hooks.slack.com/***"
    assert nconfig.mask(f"POST to https://ntfy.sh/{TOKEN} failed") == "POST to https://ntfy.sh/*** failed"


def test_notify_test_reports_each_target(hook: Hook) -> None:
    from tracker import cli

    dead = f"http://127.0.0.1:{free_port()}/services/{TOKEN}"
    res = CliRunner().invoke(cli.cli, ["notify", "test", "--to", f"webhook:{hook.url}/ok", "--to", f"webhook:{dead}"])
    assert res.exit_code == 1, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith(f"ok\twebhook:{hook.url}/***\t")
    assert lines[1].startswith("FAIL\twebhook:http://127.0.0.1:") and TOKEN not in res.output
    assert hook.received[0][1]["kind"] == "test"
    res = CliRunner().invoke(cli.cli, ["notify", "test"], env={"TRACKER_NOTIFY": ""})
    assert res.exit_code == 2


def test_a_run_on_another_host_is_crashed_by_the_same_heartbeat_rule(home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker import spool
    from tracker.store.spoolmeta import run_row

    monkeypatch.setenv("TRACKER_HEARTBEAT_S", "30")  # dead after 60 s without a heartbeat
    run = tracker.init("alerts", run_id="remote", notify=["console:"])
    run.log({"loss": 1.0}, step=0)
    run.flush()
    meta = {**spool.read_json(home / "runs/remote/run.json"), "host": "another-host"}  # as a reader elsewhere sees it
    (seg,) = spool.list_segments(home, "remote")
    assert run_row(meta, [seg])["status"] == "running"
    seg.heartbeat -= 59
    assert run_row(meta, [seg])["status"] == "running"
    seg.heartbeat -= 2
    assert run_row(meta, [seg])["status"] == "crashed"
    monkeypatch.setenv("TRACKER_HEARTBEAT_S", "0")
    with pytest.raises(ConfigError, match="TRACKER_HEARTBEAT_S='0' is not a positive number of seconds"):
        tracker.init("alerts", run_id="bad-beat")
    monkeypatch.setenv("TRACKER_HEARTBEAT_S", "30")
    run.finish()


def test_on_event_calls_back_off_the_training_thread(caplog: pytest.LogCaptureFixture) -> None:
    import threading

    seen: list[tuple[str, str, str]] = []
    stop = threading.Event()

    def broken(ev: Any) -> None:
        raise RuntimeError("a bug in the callback")

    def act(ev: Any) -> None:
        seen.append((ev.kind, ev.severity, threading.current_thread().name))
        if ev.severity == "error":
            stop.set()

    run = tracker.init("alerts", run_id="loop", notify=[])
    run.on_event(broken)
    run.on_event(act)
    step = 0
    for step in range(100_000):  # a plain loop that stops itself on the first error
        run.log({"loss": float("nan") if step == 30 else 1.0}, step=step)
        if stop.is_set():
            break
        time.sleep(0.001)
    run.finish()
    assert stop.is_set() and 30 < step < 100_000
    assert ("non_finite", "error") in [(k, s) for k, s, _ in seen]
    assert {t for _, _, t in seen} == {"tracker-notify-loop"}  # never the training thread
    assert "on_event callback 'broken' raised RuntimeError: a bug in the callback" in caplog.text
    with pytest.raises(ConfigError, match="is not callable"):
        run.on_event("nope")
    with pytest.raises(tracker.errors.RunError, match="is finished; call on_event before finish"):
        run.on_event(act)


def test_notify_watch_reports_crashes_of_runs_without_targets_to_its_own(tmp_path: Path, home: Path) -> None:
    from tracker import cli

    script = tmp_path / "quiet.py"
    script.write_text("import os, tracker\nr = tracker.init('p', run_id=os.environ['RID'], notify=[])\n"
                      "r.log({'loss': 1.0}, step=0); r.flush(); os.kill(os.getpid(), 9)\n")
    env = {**os.environ, "TRACKER_HOME": str(home)}
    assert subprocess.run([sys.executable, str(script)], env={**env, "RID": "old"}, timeout=120).returncode == -9
    (seg,) = (home / "runs/old").glob("seg-r0-s*.json")
    meta = json.loads(seg.read_text())
    seg.write_text(json.dumps({**meta, "heartbeat": meta["heartbeat"] - 3600}))  # died an hour ago
    assert subprocess.run([sys.executable, str(script)], env={**env, "RID": "new"}, timeout=120).returncode == -9
    out = tmp_path / "watch.jsonl"
    runs = [CliRunner().invoke(cli.cli, ["notify", "watch", "--once", "--to", f"file:{out}"]) for _ in range(2)]
    assert [r.exit_code for r in runs] == [0, 0], runs[0].output
    got = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(m["run_id"], m["kind"]) for m in got] == [("new", "run_crashed")]  # once; not the hour-old crash
