"""The durable state never claims rows that are not durable; the flush bound holds
(writing before analysis, a bounded buffer); a full disk is survived."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pytest

import tracker
from tracker import run as run_mod
from tracker.spool import METRICS_SCHEMA, SegmentInfo, atomic_write_table, list_segments, run_dir

KILL_BEFORE_CHUNK = textwrap.dedent(
    """
    import os, signal, sys, tracker
    from plugins import store_logger
    real = store_logger.atomic_write_table
    def write(path, table):
        seq = int(path.name.split(".")[0].split("-")[2])
        if os.environ.get("KILL_AT") and ".metrics." in path.name and seq >= int(os.environ["KILL_AT"]):
            os.kill(os.getpid(), signal.SIGKILL)  # killed before this chunk is in place
        real(path, table)
    store_logger.atomic_write_table = write
    run = tracker.init("gap", run_id="g", resume="allow", config={"tracker_flush_interval": 30, "analysis": False})
    print(run.start_step, flush=True)
    for s in range(run.start_step, int(sys.argv[1])):
        run.log({"loss": float(s)}, step=s)
        if s % 100 == 99:
            run.flush()
    run.finish()
    """
)


def test_a_kill_before_the_chunk_is_in_place_leaves_no_gap(home: Path, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(KILL_BEFORE_CHUNK)
    env = {**os.environ, "TRACKER_HOME": str(home), "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run([sys.executable, str(script), "1000"], env={**env, "KILL_AT": "3"},
                            capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9, killed.stderr
    seg = list_segments(home, "g")[0]
    assert seg.last_step == 299  # steps 300..399 never reached their chunk: not claimed
    again = subprocess.run([sys.executable, str(script), "1000"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.split()[0] == "300"
    steps = tracker.query("SELECT step FROM curves WHERE run_id = 'g' ORDER BY step")["step"].to_list()
    assert steps == list(range(1000))


def _chunk(home: Path, run_id: str, seq: int, steps: range, segment: int = 0) -> None:
    n = len(steps)
    table = pa.table(
        [[run_id] * n, [0] * n, [segment] * n, list(steps), ["loss"] * n, [float(s) for s in steps], [0.0] * n],
        schema=METRICS_SCHEMA,
    )
    atomic_write_table(run_dir(home, run_id) / f"r0-s{segment:04d}-{seq:06d}.metrics.parquet", table)


def _spool_run(home: Path, run_id: str, **seg: Any) -> None:
    folder = run_dir(home, run_id)
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps({"run_id": run_id, "project": "p", "status": "crashed"}))
    SegmentInfo(run_id=run_id, rank=0, segment=0, start_step=0, reason="start", started_at=time.time(), **seg).save(home)


def test_resume_caps_an_older_segment_json_that_is_ahead_of_its_chunks(home: Path) -> None:
    _spool_run(home, "old", last_step=199)  # written before the chunk of 100..199 (older spools)
    _chunk(home, "old", 0, range(0, 100))
    run = tracker.init("p", run_id="old", resume="allow", config={"analysis": False})
    assert run.start_step == 100
    run.finish()


def test_resume_counts_a_chunk_written_after_the_segment_json(home: Path) -> None:
    _spool_run(home, "late", last_step=99, last_seq=0)
    _chunk(home, "late", 0, range(0, 100))
    _chunk(home, "late", 1, range(100, 150))  # in place, then killed before the JSON caught up
    from tracker.store import Store

    Store(home).ingest()  # the JSON does not claim chunk 1 yet: it stays in the spool, unseen
    assert (run_dir(home, "late") / "r0-s0000-000001.metrics.parquet").exists()
    assert tracker.query("SELECT max(step) AS m FROM curves")["m"][0] == 99
    run = tracker.init("p", run_id="late", resume="allow", config={"analysis": False})
    assert run.start_step == 150  # the resume counts it, and claims it with a new segment
    run.log({"loss": 0.5}, step=150)
    run.finish()
    steps = tracker.query("SELECT step FROM curves ORDER BY step")["step"].to_list()
    assert steps == list(range(151))


def test_resume_after_the_chunks_were_ingested_and_removed(home: Path) -> None:
    run = tracker.init("p", run_id="ing", config={"analysis": False})
    for s in range(250):
        run.log({"loss": 1.0}, step=s)
    run.finish()  # ingests: the chunks leave the spool, the segment JSON stays
    assert not list(run_dir(home, "ing").glob("*.parquet"))
    again = tracker.init("p", run_id="ing", resume="allow", config={"analysis": False})
    assert again.start_step == 250
    again.finish()


def test_a_slow_analysis_warm_up_does_not_delay_writing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tracker.analysis.online import OnlineAnalyzer

    first = tracker.init("p", run_id="warm")
    for s in range(100):
        first.log({"loss": 1.0}, step=s)
    first.finish()
    monkeypatch.setattr(OnlineAnalyzer, "warm_up", lambda self, *a, **k: time.sleep(4.0))
    run = tracker.init("p", run_id="warm", resume="allow", config={"tracker_flush_interval": 0.2})
    assert run._analyzer is not None
    t0 = time.monotonic()
    for s in range(100, 200):
        run.log({"loss": 1.0}, step=s)
    seg = None
    while time.monotonic() - t0 < 10:
        seg = [x for x in list_segments(home, "warm") if x.segment == 1][0]
        if seg.last_step == 199:
            break
        time.sleep(0.02)
    durable_after = time.monotonic() - t0
    run.finish()
    assert seg is not None and seg.last_step == 199
    assert durable_after < 2.0, f"first rows durable after {durable_after:.2f} s (the warm-up takes 4 s)"


def _backlog(run: Any) -> int:
    return run._logged + run._rows - run._flusher.released


def _before_chunk_writes(monkeypatch: pytest.MonkeyPatch, before: Callable[[Path], object]) -> None:
    """Make the store logger call ``before(path)`` ahead of each chunk it writes (to stall or fail it)."""
    from plugins import store_logger

    real = store_logger.atomic_write_table

    def write(path: Path, table: Any) -> None:
        before(path)
        real(path, table)

    monkeypatch.setattr(store_logger, "atomic_write_table", write)


def _failing_chunk_writes(monkeypatch: pytest.MonkeyPatch, error: Callable[[Path], Exception]) -> threading.Event:
    """Make the store logger's chunk writes raise ``error(path)`` while the returned event is set."""
    failing = threading.Event()

    def fail(path: Path) -> None:
        if failing.is_set():
            raise error(path)

    _before_chunk_writes(monkeypatch, fail)
    return failing


def _no_space(path: Path) -> OSError:
    return OSError(errno.ENOSPC, "No space left on device", str(path))


def test_memory_stays_bounded_when_the_store_is_stuck(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()
    _before_chunk_writes(monkeypatch, lambda path: gate.wait(60))
    run = tracker.init("p", run_id="stuck", config={"tracker_flush_interval": 0.05, "analysis": False})
    keys = [f"k{i}" for i in range(10)]
    peak_backlog = peak_deque = 0
    try:
        for s in range(250_000):  # 2.5M values
            run.log(dict.fromkeys(keys, 1.0), step=s)
            if s % 5_000 == 0:
                peak_backlog = max(peak_backlog, _backlog(run))
                peak_deque = max(peak_deque, len(run._buf))
    finally:
        gate.set()
    run.finish()
    assert peak_deque * 10 <= run_mod.MAX_BUFFERED_ROWS + 2 * run_mod.FLUSH_ROWS, f"{peak_deque} rows buffered"
    assert peak_backlog <= run_mod.MAX_HELD_ROWS
    dropped = run.dropped_rows["store"]
    assert dropped > 0
    meta = json.loads((run_dir(home, "stuck") / "run.json").read_text())
    assert meta["dropped_rows"] == dropped and meta["dropped_by_logger"] == {"store": dropped}
    stored = tracker.query("SELECT count(*) AS n FROM metrics")["n"][0]
    assert stored == 2_500_000 - dropped
    ev = tracker.query("SELECT kind, data FROM events WHERE kind = 'rows_dropped'")
    assert ev.height >= 1 and 0 < sum(json.loads(d)["rows"] for d in ev["data"]) <= dropped


def test_a_slow_disk_slows_log_instead_of_dropping(monkeypatch: pytest.MonkeyPatch) -> None:
    _before_chunk_writes(monkeypatch, lambda path: time.sleep(0.1))
    run = tracker.init("p", run_id="slow", config={"tracker_flush_interval": 0.05, "analysis": False})
    keys = [f"k{i}" for i in range(10)]
    peak = 0
    for s in range(120_000):
        run.log(dict.fromkeys(keys, 1.0), step=s)
        if s % 5_000 == 0:
            peak = max(peak, _backlog(run))
    run.finish()
    assert run.dropped_rows == {}
    assert peak <= run_mod.MAX_BUFFERED_ROWS + 2 * run_mod.FLUSH_ROWS
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 1_200_000


def test_disk_full_is_retried_until_space_returns(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    full = _failing_chunk_writes(monkeypatch, _no_space)
    run = tracker.init("p", run_id="full", config={"tracker_flush_interval": 0.05, "analysis": False})
    for s in range(1000):
        run.log({"loss": float(s)}, step=s)
    run.flush()
    full.set()
    for s in range(1000, 3000):
        run.log({"loss": float(s)}, step=s)
        if s % 200 == 0:
            time.sleep(0.1)
    full.clear()
    for s in range(3000, 4000):
        run.log({"loss": float(s)}, step=s)
    run.finish()
    assert run.status == "finished" and run.dropped_rows == {}
    steps = tracker.query("SELECT step FROM curves WHERE run_id = 'full' ORDER BY step")["step"].to_list()
    assert steps == list(range(4000))
    warned = [r for r in caplog.records if "No space left" in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warned) == 1 and "'store'" in warned[0].getMessage()


def test_a_real_full_filesystem_is_survived(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mnt = tmp_path / "small"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=6m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if out.returncode != 0:
        pytest.skip(f"mounting a small tmpfs needs CAP_SYS_ADMIN: {out.stderr.strip()}")
    try:
        home = mnt / "home"
        monkeypatch.setenv("TRACKER_HOME", str(home))
        run = tracker.init("p", run_id="tiny", config={"tracker_flush_interval": 0.05, "analysis": False})
        for s in range(500):
            run.log({"loss": float(s)}, step=s)
        run.flush()
        filler = mnt / "filler"
        with open(filler, "wb") as fh:  # fill the filesystem to the last byte
            try:
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC
        for s in range(500, 1500):
            run.log({"loss": float(s)}, step=s)
            if s % 100 == 0:
                time.sleep(0.05)
        filler.unlink()  # space returns
        for s in range(1500, 2000):
            run.log({"loss": float(s)}, step=s)
        run.finish()
        assert run.dropped_rows == {}
        steps = tracker.query("SELECT step FROM curves WHERE run_id = 'tiny' ORDER BY step")["step"].to_list()
        assert steps == list(range(2000))
    finally:
        from tracker.store import release

        release()
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_failed_store_stops_the_durable_claim_even_with_other_loggers(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broken = _failing_chunk_writes(monkeypatch, lambda path: RuntimeError("bad storage driver"))
    run = tracker.init("p", run_id="claim", loggers=["store", "csv"], config={"analysis": False})
    for s in range(100):
        run.log({"loss": 1.0}, step=s)
    run.flush()
    broken.set()
    for s in range(100, 200):
        run.log({"loss": 1.0}, step=s)
    run.finish()
    assert list_segments(home, "claim")[0].last_step == 99  # the CSV has 199; the store does not
    assert run.dropped_rows == {"store": 100}
    again = tracker.init("p", run_id="claim", resume="allow", loggers=["store", "csv"], config={"analysis": False})
    assert again.start_step == 100
    again.finish()


def test_a_disk_that_stays_full_bounds_finish_and_records_the_loss(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = _failing_chunk_writes(monkeypatch, _no_space)
    run = tracker.init("p", run_id="never", config={"tracker_logger_timeout": 1.0, "analysis": False})
    for s in range(100):
        run.log({"loss": 1.0}, step=s)
    run.flush()
    full.set()
    for s in range(100, 300):
        run.log({"loss": 1.0}, step=s)
    t0 = time.monotonic()
    run.finish()
    assert time.monotonic() - t0 < 1.0 + 2.0
    assert run.dropped_rows == {"store": 200}
    meta = json.loads((run_dir(home, "never") / "run.json").read_text())
    assert meta["dropped_rows"] == 200 and meta["status"] == "finished"
    assert list_segments(home, "never")[0].last_step == 99
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 100
