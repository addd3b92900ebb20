"""A host's backlog: commits slower than the training process apply backpressure (one
warning, nothing dropped), and ``tracker lake status`` shows each host's backlog."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

import tracker
from tracker.store.lake import LakeStore
from tracker.store.lakespool import backlog


def test_commits_slower_than_logging_slow_the_logger_and_say_so_once(lake, home: Path, monkeypatch: pytest.MonkeyPatch,  # type: ignore[no-untyped-def]
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TRACKER_LAKE_BACKLOG_ROWS", "1500")
    monkeypatch.setenv("TRACKER_COMMIT_INTERVAL", "0.1")
    real = LakeStore._commit_rows
    sizes: list[int] = []

    def slow(self, con, todo):  # type: ignore[no-untyped-def]
        sizes.append(sum(n for p, n in todo.items() if "metrics" in p.name))
        time.sleep(0.3)  # a commit far slower than the logging below
        return real(self, con, todo)

    monkeypatch.setattr(LakeStore, "_commit_rows", slow)
    caplog.set_level(logging.INFO)
    run = tracker.init("p", run_id="bp", config={"analysis": False})
    committer = next(s for n, s in run._sessions if n == "store").committer
    start = time.monotonic()
    for batch in range(10):  # ten batches of 1000 values, each handed to the store logger at once
        for step in range(batch * 500, batch * 500 + 500):
            run.log({"a": 1.0, "b": 2.0}, step=step)
        assert run.flush(timeout=10)
    spent = time.monotonic() - start
    run.finish()
    warned = [r.getMessage() for r in caplog.records if "backpressure" in r.getMessage()]
    assert len(warned) == 1 and "1500 rows behind" in warned[0], warned
    assert committer.waited_s > 0.5 and spent > 0.5  # the logger waited for the commits
    assert max(sizes) <= 1500 + 2 * 1000, sizes  # the backlog stayed near its bound
    assert not run.dropped_rows
    assert LakeStore(Path("/nonexistent-spool")).query(
        "SELECT count(*) AS n, count(DISTINCT (key, step)) AS d FROM lake.main.metrics WHERE run_id = 'bp'").row(0) \
        == (10_000, 10_000)


def test_lake_status_shows_each_hosts_backlog_in_rows_and_seconds(lake, home: Path, tmp_path: Path,  # type: ignore[no-untyped-def]
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_LAKE_COMMITTER", "follow")  # nothing commits until this test does
    run = tracker.init("p", run_id="st", config={"analysis": False})
    for step in range(100):
        run.log({"a": 1.0}, step=step)
    assert run.flush(timeout=10)
    run.log({"a": 1.0}, step=100)
    time.sleep(0.3)
    assert run.flush(timeout=10)  # its segment file now claims the first chunk
    pending = backlog(home)
    assert pending.rows >= 100 and pending.oldest_s >= 0.3
    LakeStore(home).ingest(final=True)
    assert backlog(home).rows == 0
    for step in range(101, 131):
        run.log({"a": 1.0}, step=step)
    assert run.flush(timeout=10)
    out = lake.cli("lake", "status", "--format", "csv", home=home)
    assert out.returncode == 0, out.stderr
    assert "this host: 1 chunks, 30 rows pending" in out.stdout, out.stdout
    lines = out.stdout.splitlines()
    header, row = lines[lines.index(next(x for x in lines if x.startswith("host,"))):][:2]
    assert header.split(",")[:5] == ["host", "home", "backlog_chunks", "backlog_rows", "backlog_s"]
    assert row.split(",")[1:4] == [str(home), "0", "0"]  # all it held at its last commit went in
    run.finish()
