"""A host that dies leaves its run ``crashed`` for readers on every other host: the
heartbeat reaches the lake with the run's metadata, and a run whose heartbeat there
is stale reads as crashed (docs/alerts.md); a resume elsewhere turns it back to running."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tracker
from tracker.store.lake import LakeStore, stale_after_s

HEARTBEAT_S = "2"  # stale after 2 x 2 s + the metadata interval
META_INTERVAL_S = "0.2"

WRITER = textwrap.dedent(
    """
    import time
    import tracker
    run = tracker.init("p", run_id="hb", config={"analysis": False}, system=False)
    for step in range(10):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    assert run.flush()
    print("ready", flush=True)
    time.sleep(600)  # idle: only the heartbeat moves
    """
)


def _status(home: Path) -> tuple[str | None, str | None]:
    """(status as readers see it, status as committed) of run hb, from a host whose spool lacks it."""
    found = LakeStore(home).query("SELECT (SELECT status FROM runs WHERE run_id = 'hb') AS seen, "
                                  "(SELECT status FROM lake.main.runs WHERE run_id = 'hb') AS row")
    return found["seen"][0], found["row"][0]


def _wait_for(home: Path, seen: str, within: float) -> float:
    start = time.monotonic()
    while _status(home)[0] != seen:
        assert time.monotonic() - start < within, f"run hb never read {seen!r}: {_status(home)}"
        time.sleep(0.1)
    return time.monotonic() - start


def test_a_dead_host_reads_crashed_everywhere_and_a_resume_runs_again(  # type: ignore[no-untyped-def]
        lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = tmp_path / "hostA", tmp_path / "hostB", tmp_path / "hostC"
    for name, value in (("TRACKER_HEARTBEAT_S", HEARTBEAT_S), ("TRACKER_LAKE_META_INTERVAL", META_INTERVAL_S)):
        monkeypatch.setenv(name, value)
    env = {**lake.env(a), "TRACKER_HEARTBEAT_S": HEARTBEAT_S, "TRACKER_LAKE_META_INTERVAL": META_INTERVAL_S,
           "TRACKER_COMMIT_INTERVAL": "0.2"}
    writer = subprocess.Popen([sys.executable, "-c", WRITER], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "ready", writer.stderr
        _wait_for(c, "running", within=60)
        time.sleep(stale_after_s() + 1)  # longer than the rule: an idle live run's heartbeat keeps moving
        assert _status(c) == ("running", "running")
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
    after = _wait_for(c, "crashed", within=stale_after_s() + 30)
    assert _status(c) == ("crashed", "running")  # derived by the reader: the dead host committed nothing more
    print(f"\nrun of a killed host read crashed {after:.1f} s after the kill (rule: {stale_after_s():g} s)")

    monkeypatch.setenv("TRACKER_HOME", str(b))  # host B (this process) resumes it
    run = tracker.init("p", run_id="hb", resume="must", config={"analysis": False}, system=False)
    assert run.segment == 1
    run.log({"loss": 0.01}, step=run.start_step)
    _wait_for(c, "running", within=30)
    run.finish()
    _wait_for(c, "finished", within=30)
