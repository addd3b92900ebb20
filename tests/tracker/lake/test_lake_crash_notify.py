"""A host that dies is notified once, from another host: two watches on two other hosts
race for the claim in the lake's catalog, and one webhook message arrives per dead segment
(docs/alerts.md, "Heartbeat and crashed runs")."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.tracker.notify_servers import Hook

HEARTBEAT_S = "2"  # the lake reads it crashed 2 x 2 s + 0.2 s after its last heartbeat
META_INTERVAL_S = "0.2"

WRITER = textwrap.dedent(
    """
    import sys, time
    import tracker
    resume = sys.argv[1]
    run = tracker.init("p", run_id="dead", name="dead-host", resume=resume, config={"analysis": False},
                       system=False, notify=[])
    for step in range(run.start_step, run.start_step + 5):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.flush()
    print("ready", run.segment, flush=True)
    time.sleep(600)
    """
)


def _crash_messages(hook: Hook) -> list[dict[str, Any]]:
    return [body for _, body in hook.received if body.get("kind") == "run_crashed"]


def _write_and_kill(env: dict[str, str], resume: str, lake: Any, home: Path) -> int:
    """Start a writer on "host A", wait until the lake shows its run running, kill -9 it; its segment."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, resume], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None
        line = writer.stdout.readline().split()
        assert line[:1] == ["ready"], writer.stderr.read() if writer.stderr else ""
        from tracker.store.lake import LakeStore

        deadline = time.monotonic() + 30
        while LakeStore(home).query("SELECT status FROM runs WHERE run_id = 'dead'")["status"].to_list() \
                != ["running"]:
            assert time.monotonic() < deadline, "the writer's run never reached the lake"
            time.sleep(0.1)
        return int(line[1])
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)


def _wait_for_messages(hook: Hook, n: int, within: float) -> float:
    start = time.monotonic()
    while len(_crash_messages(hook)) < n:
        assert time.monotonic() - start < within, f"{len(_crash_messages(hook))} crash message(s), wanted {n}"
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_dead_host_is_notified_once_by_one_of_two_watching_hosts(  # type: ignore[no-untyped-def]
        lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = tmp_path / "hostA", tmp_path / "hostB", tmp_path / "hostC"
    settings = {"TRACKER_HEARTBEAT_S": HEARTBEAT_S, "TRACKER_LAKE_META_INTERVAL": META_INTERVAL_S}
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TRACKER_HOME", str(c))
    hook = Hook()
    watches: list[subprocess.Popen[str]] = []
    try:
        for home in (b, c):  # both check every 0.2 s: they race for every crash
            watches.append(subprocess.Popen(
                [sys.executable, "-m", "tracker.cli", "notify", "watch", "--every", "0.2",
                 "--to", f"webhook:{hook.url}/hook"],
                env={**lake.env(home), **settings, "TRACKER_NOTIFY": ""}, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        env = {**lake.env(a), **settings, "TRACKER_COMMIT_INTERVAL": "0.2", "TRACKER_NOTIFY": ""}

        started = time.monotonic()
        assert _write_and_kill(env, "never", lake, c) == 0
        print(f"\nwriter up and killed after {time.monotonic() - started:.1f} s")
        took = _wait_for_messages(hook, 1, within=30)
        first = _crash_messages(hook)[0]
        assert first["run_id"] == "dead" and first["name"] == "dead-host" and first["severity"] == "error"
        assert first["data"]["segment"] == 0 and "committed nothing more" in first["text"]
        print(f"\ncrash of a killed host notified {took:.1f} s after the kill")

        assert _write_and_kill(env, "must", lake, c) == 1  # a resume on host A, killed again
        took = _wait_for_messages(hook, 2, within=30)
        second = _crash_messages(hook)[1]
        assert second["run_id"] == "dead" and second["data"]["segment"] == 1
        print(f"crash of the resumed run notified {took:.1f} s after the kill")

        from tracker.notify.config import NotifyConfig, parse_target
        from tracker.notify.recovery import recover

        # host A itself comes back: its spool shows the run crashed too (its process is gone),
        # and it wins its own O_EXCL marker, but the lake's claim is taken: nothing more is sent
        found = recover(a, fallback=NotifyConfig(targets=[parse_target(f"webhook:{hook.url}/hook")]))
        assert found["crashed"] == 0 and list((a / "runs" / "dead" / "notify").glob("crashed-r0-s*")), found
        assert len(_crash_messages(hook)) == 2, _crash_messages(hook)  # and both watches kept checking meanwhile
    finally:
        for watch in watches:
            watch.terminate()
        outputs = [watch.communicate(timeout=30) for watch in watches]
        hook.stop()
    reported = [sum(int(line.split("\t")[1].split()[1]) for line in out.splitlines() if "\tcrashed " in line)
                for out, _ in outputs]
    assert sorted(reported) in ([0, 2], [1, 1]), outputs  # each crash counted by the one watch that claimed it
    from tracker.notify.lakecrash import TABLE

    claims = lake.server.psql(f"SELECT run_id, rank, segment FROM {TABLE} ORDER BY segment;",
                              database=lake.database)
    assert claims.split() == ["dead|0|0", "dead|0|1"]  # one claim per dead segment, made by one process
