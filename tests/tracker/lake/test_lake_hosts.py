"""Three hosts on one lake: A logs as fast as it can and is killed -9, B (this process)
resumes the run, C only reads. The lake's segments never claim steps whose rows it lacks, so B resumes
right after the last step the lake holds and C sees no gap, before and after A's spool
reaches the lake."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import tracker
from tracker import spool
from tracker.store.lake import LakeStore

KILL_AFTER_S = float(os.environ.get("TRACKER_TEST_KILL_AFTER_S", "1"))  # after A's first commit

WRITER = textwrap.dedent(
    """
    import tracker
    run = tracker.init("p", run_id="k")
    print("logging", flush=True)
    step = 0
    while True:
        run.log({"loss/box": 1.0 / (step + 1), "loss/cls": 2.0}, step=step)
        step += 1
    """
)


def _in_lake(home: Path) -> bool:
    found = LakeStore(home).query("SELECT (SELECT count(*) FROM lake.main.segments WHERE run_id = 'k') AS s, "
                                  "(SELECT count(*) FROM lake.main.metrics WHERE run_id = 'k') AS n")
    return bool(found["s"][0] and found["n"][0])


def _seen_from(home: Path) -> dict[str, object]:
    """What a host with spool ``home`` (and nothing of run k in it) sees of run k."""
    store = LakeStore(home)
    segs = store.query("SELECT segment, start_step, end_step FROM segments WHERE run_id = 'k' ORDER BY segment")
    curves = store.query(
        "SELECT key, count(*) AS n, count(DISTINCT step) AS d, min(step) AS lo, max(step) AS hi "
        "FROM curves WHERE run_id = 'k' GROUP BY key ORDER BY key")
    stored = store.query("SELECT segment, count(*) AS n, max(step) AS hi FROM lake.main.metrics "
                         "WHERE run_id = 'k' GROUP BY segment ORDER BY segment")
    return {"segments": segs.rows(), "curves": curves.rows(), "stored": stored.rows()}


def _no_gap(seen: dict[str, object], last: int) -> None:
    for key, n, distinct, lo, hi in seen["curves"]:  # type: ignore[attr-defined]
        assert (n, distinct, lo, hi) == (last + 1, last + 1, 0, last), f"{key}: gap or duplicate in {seen}"


def test_a_host_killed_mid_run_resumed_on_another_leaves_no_gap(lake, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    a, b, c = tmp_path / "hostA", tmp_path / "hostB", tmp_path / "hostC"
    writer = subprocess.Popen([sys.executable, "-c", WRITER], env=lake.env(a), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert writer.stdout is not None and writer.stdout.readline().strip() == "logging", writer.stderr
        deadline = time.monotonic() + 60
        while not _in_lake(c):  # the run and some of its rows are in the lake
            assert time.monotonic() < deadline and writer.poll() is None, "A never committed into the lake"
            time.sleep(0.1)
        time.sleep(KILL_AFTER_S)
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.communicate(timeout=30)
    durable = [s for s in spool.durable_segments(a, "k") if s.rank == 0]
    assert durable and durable[0].last_step is not None and durable[0].last_step > 1000  # it logged unthrottled
    a_last = durable[0].last_step

    with LakeStore(c).connect() as con:  # what the lake holds of A's segment when B starts
        in_lake = con.execute("SELECT max(step) FROM metrics WHERE run_id = 'k'").fetchone()[0]
    monkeypatch.setenv("TRACKER_HOME", str(b))  # host B (this process) resumes the run
    run = tracker.init("p", run_id="k", resume="must")
    assert (run.segment, run.start_step) == (1, in_lake + 1)  # right after the last step the lake holds
    for step in range(run.start_step, run.start_step + 50):
        run.log({"loss/box": 1.0 / (step + 1), "loss/cls": 2.0}, step=step)
    run.finish()
    last = in_lake + 50

    before = _seen_from(c)
    assert [s[:2] for s in before["segments"]] == [(0, 0), (1, in_lake + 1)], before
    assert before["segments"][0][2] <= in_lake, before  # the metadata never claims rows the lake lacks
    _no_gap(before, last)

    pushed = lake.cli("lake", "push", home=a)  # host A is back: its spool goes to the lake
    assert pushed.returncode == 0, pushed.stderr[-2000:]
    assert not spool.data_files(a), "A's spool kept chunks after the push"
    after = _seen_from(c)
    _no_gap(after, last)
    assert after["segments"][1][:2] == (1, in_lake + 1), after
    # every row durable on A is in the lake now (those at or after B's start are hidden)
    assert after["stored"][0] == (0, 2 * (a_last + 1), a_last), after
    print(f"\nkilled after {KILL_AFTER_S:g} s: A durable to step {a_last}, lake held {in_lake} when B resumed; "
          f"C before the push {before}; after {after}")
