"""Catalog faults: PostgreSQL down at start, restarted mid-run. Training goes on, nothing is
lost or duplicated, one warning says what is happening."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import tracker
from tracker import spool
from tracker.store.lake import LakeStore


def _lake_rows() -> tuple[int, int]:
    df = LakeStore(Path("/nonexistent-spool")).query(
        "SELECT count(*) AS n, count(DISTINCT (step, key)) AS d FROM lake.main.metrics")
    return int(df["n"][0]), int(df["d"][0])


def _wait_rows(n: int, within: float) -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            if _lake_rows()[0] >= n:
                return
        except tracker.errors.StoreError:
            pass
        assert time.monotonic() < deadline, f"{n} rows not in the lake within {within} s"
        time.sleep(0.3)


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


def test_catalog_down_when_training_starts(lake, home: Path, caplog: pytest.LogCaptureFixture, log_timed) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    LakeStore().init()
    lake.server.stop()
    run = tracker.init("p", run_id="down", config={"tracker_flush_interval": 0.2})
    worst = log_timed(run, 100)
    time.sleep(3.0)  # several commit attempts fail meanwhile
    assert worst < 0.05
    assert spool.data_files(home)  # the spool keeps the rows
    lake.server.start()
    _wait_rows(100, within=30)
    run.finish()
    assert _lake_rows() == (100, 100)
    unreachable = _warnings(caplog, "cannot be reached")
    assert len(unreachable) == 2  # one at init, one from the committer; not one per attempt
    assert len(_warnings(caplog, "reachable again")) == 1
    assert all(lake.server.password not in m for m in unreachable)
    assert "password=***" in unreachable[0]


def test_catalog_restarted_mid_run(lake, home: Path, caplog: pytest.LogCaptureFixture) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.INFO)
    run = tracker.init("p", run_id="restart", config={"tracker_flush_interval": 0.2})
    for step in range(50):
        run.log({"loss": 1.0 / (step + 1), "aux": 1.0}, step=step)
    _wait_rows(100, within=20)
    lake.server.stop()
    for step in range(50, 100):
        run.log({"loss": 1.0 / (step + 1), "aux": 1.0}, step=step)
        time.sleep(0.02)
    time.sleep(2.0)
    lake.server.start()
    for step in range(100, 150):
        run.log({"loss": 1.0 / (step + 1), "aux": 1.0}, step=step)
    _wait_rows(300, within=30)
    run.finish()
    assert _lake_rows() == (300, 300)
    assert len(_warnings(caplog, "cannot be reached")) == 1
    assert len(_warnings(caplog, "reachable again")) == 1
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 300
