"""``run.flush()``: a durability barrier. True once every row logged before it is in the
spool's chunk files; False with a warning past its timeout or when rows were lost; safe
from several threads and ranks while the flusher runs; cheap when nothing is pending."""

from __future__ import annotations

import os
import threading
import time
import types
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

import tracker
from tracker.errors import ConfigError
from tracker.spool import DATA_RE, durable_segments, run_dir

from .test_run_isolation import use_logger

SLOW = {"tracker_flush_interval": 60, "analysis": False}  # only flush() writes


def _spooled_steps(home: Path, run_id: str, rank: int = 0) -> list[int]:
    """Steps of the metric rows in the run's chunk files (what a kill -9 leaves)."""
    steps: list[int] = []
    for path in sorted(run_dir(home, run_id).iterdir()):
        m = DATA_RE.match(path.name)
        if m and m.group("table") == "metrics" and int(m.group("rank")) == rank:
            steps += pq.read_table(path, columns=["step"]).column("step").to_pylist()
    return sorted(steps)


def _chunks(home: Path, run_id: str) -> list[str]:
    return sorted(p.name for p in run_dir(home, run_id).iterdir() if DATA_RE.match(p.name))


def test_flush_returns_true_once_every_row_is_in_the_spool(home: Path) -> None:
    run = tracker.init("p", run_id="f", config=SLOW)
    for s in range(500):
        run.log({"loss": float(s), "lr": 0.1}, step=s)
    run.log_classes("loss/cls", [1.0, 2.0, 3.0], step=499)
    assert _chunks(home, "f") == []  # the background flusher has not written yet (60 s interval)
    assert run.flush() is True
    assert _spooled_steps(home, "f") == sorted(list(range(500)) * 2)
    assert [s.last_step for s in durable_segments(home, "f")] == [499]
    assert any(".class_metrics." in name for name in _chunks(home, "f"))
    run.finish()


def test_flush_is_cheap_when_nothing_is_pending_and_true_after_finish(home: Path) -> None:
    run = tracker.init("p", run_id="c", config=SLOW)
    assert run.flush() is True  # nothing logged yet
    run.log({"loss": 1.0}, step=0)
    assert run.flush() is True
    chunks = _chunks(home, "c")
    t0 = time.perf_counter()
    for _ in range(1000):
        assert run.flush() is True
    took = time.perf_counter() - t0
    assert _chunks(home, "c") == chunks  # no empty chunk was written
    assert took < 1.0, f"1000 flushes with nothing pending took {took:.2f} s"
    run.finish()
    t0 = time.perf_counter()
    assert run.flush() is True
    assert time.perf_counter() - t0 < 0.1


def test_flush_past_its_timeout_warns_and_returns_false(home: Path, caplog: pytest.LogCaptureFixture) -> None:
    gate, wrote = threading.Event(), []

    def write(batch: Any) -> None:
        gate.wait(30)
        wrote.append(batch.rows)

    use_logger("slowdisk", lambda run: types.SimpleNamespace(write=write, close=lambda status: None, durable=True))
    run = tracker.init("p", run_id="t", loggers=["store", "slowdisk"], config=SLOW)
    try:
        run.log({"loss": 1.0}, step=0)
        t0 = time.monotonic()
        assert run.flush(timeout=0.3) is False
        assert 0.25 < time.monotonic() - t0 < 3.0
        assert "flush() gave up after 0.3 s" in caplog.text and "'slowdisk'" in caplog.text
    finally:
        gate.set()
    assert run.flush(timeout=10) is True  # written now: the barrier holds again
    assert wrote == [1]
    run.finish()


def test_a_hung_logger_is_disabled_at_the_logger_timeout_and_flush_says_so(
    home: Path, caplog: pytest.LogCaptureFixture
) -> None:
    gate = threading.Event()
    use_logger("hung", lambda run: types.SimpleNamespace(write=lambda b: gate.wait(30), close=lambda s: None,
                                                          durable=True))
    run = tracker.init("p", run_id="h", loggers=["store", "hung"],
                       config={"tracker_flush_interval": 0.1, "tracker_logger_timeout": 0.5, "analysis": False})
    try:
        run.log({"loss": 1.0}, step=0)
        t0 = time.monotonic()
        assert run.flush(timeout=20) is False  # the hung logger is disabled (logger timeout 0.5 s): rows lost to it
        assert time.monotonic() - t0 < 5.0
        assert "'hung'" in caplog.text and "disabled" in caplog.text
        assert "could not be written" in caplog.text
        run.log({"loss": 2.0}, step=1)
        assert run.flush(timeout=5) is True  # the store alone is the record now, and it wrote step 1
        assert _spooled_steps(home, "h") == [0, 1]
    finally:
        gate.set()
        run.finish()


def test_flush_from_many_threads_and_two_ranks_while_logging(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    runs = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        runs.append(tracker.init("p", run_id="ranks", resume="allow",
                                 config={"tracker_flush_interval": 0.01, "analysis": False}))
    results: list[bool] = []
    marks: dict[int, list[int]] = {0: [], 1: []}
    behind: list[str] = []

    def train(run: Any) -> None:
        for s in range(20_000):
            run.log({"loss": float(s)}, step=s)
            if s % 2000 == 1999:
                ok = run.flush()
                results.append(ok)
                marks[run.rank].append(s + 1)  # a checkpoint at s + 1: every step before it is durable now
                last = [g.last_step for g in durable_segments(home, "ranks") if g.rank == run.rank]
                if not last or last[0] is None or last[0] < s:
                    behind.append(f"rank {run.rank}: durable up to {last} after flush() at step {s}")

    def poke(run: Any, stop: threading.Event) -> None:
        while not stop.is_set():
            results.append(run.flush())
            time.sleep(0.002)

    stop = threading.Event()
    threads = [threading.Thread(target=train, args=(r,)) for r in runs]
    threads += [threading.Thread(target=poke, args=(r, stop)) for r in runs for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(120)
    stop.set()
    for t in threads[2:]:
        t.join(30)
    assert results and all(results) and behind == []
    assert marks == {0: list(range(2000, 20_001, 2000)), 1: list(range(2000, 20_001, 2000))}
    for run in runs:
        run.finish()
    for rank in (0, 1):
        steps = tracker.query("SELECT step FROM curves WHERE run_id = 'ranks' AND rank = ? ORDER BY step", [rank])
        assert steps["step"].to_list() == list(range(20_000))


def test_bad_timeouts_are_refused_naming_the_value(home: Path) -> None:
    run = tracker.init("p", run_id="b", config=SLOW)
    for bad in (-1, float("nan"), float("inf"), "5", True):
        with pytest.raises(ConfigError, match=r"run.flush: timeout is .*expected seconds >= 0"):
            run.flush(timeout=bad)  # type: ignore[arg-type]
    run.finish()


def test_a_kill_right_after_flush_keeps_every_row(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, signal, tracker\n"
        "run = tracker.init('p', run_id='k', config={'tracker_flush_interval': 60, 'analysis': False})\n"
        "for s in range(300):\n"
        "    run.log({'loss': float(s)}, step=s)\n"
        "assert run.flush()\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    import subprocess
    import sys

    env = {**os.environ, "TRACKER_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr[-2000:]
    assert [s.last_step for s in durable_segments(home, "k")] == [299]
    steps = tracker.query("SELECT step FROM curves WHERE run_id = 'k' ORDER BY step")["step"].to_list()
    assert steps == list(range(300))
