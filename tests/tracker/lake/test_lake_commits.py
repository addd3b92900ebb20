"""How commits into the lake behave under many hosts: rows first and never held back by
run metadata, progress metadata batched, one shared read attachment, and a clean exit
while a commit is still running."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

import tracker
from tracker import spool
from tracker.store import lake as lake_mod
from tracker.store.lake import STATS, LakeStore, host_meta
from tracker.store.lakespool import Backlog


def _lake(sql: str) -> list[tuple]:  # type: ignore[type-arg]
    """Rows read from the lake alone (a store with an empty spool)."""
    return LakeStore(Path("/nonexistent-spool")).query(sql).rows()


def test_progress_metadata_waits_for_its_interval_but_rows_do_not(lake, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRACKER_LAKE_META_INTERVAL", "3600")
    monkeypatch.setenv("TRACKER_LAKE_COMMITTER", "follow")  # commits only where this test says
    run = tracker.init("p", run_id="m", loggers=["store"])
    store = LakeStore(home)
    for step in range(10):
        run.log({"a": float(step)}, step=step)
    run.flush()
    store.ingest(final=False)  # a new run: its metadata goes at once
    assert _lake("SELECT count(*) FROM lake.main.metrics") == [(10,)]
    assert _lake("SELECT end_step FROM lake.main.segments") == [(9,)]
    for step in range(10, 20):
        run.log({"a": float(step)}, step=step)
    run.flush()
    store.ingest(final=False)  # only progress changed: rows now, metadata later
    assert _lake("SELECT count(*) FROM lake.main.metrics") == [(20,)]
    assert _lake("SELECT end_step FROM lake.main.segments") == [(9,)]
    assert tracker.query("SELECT end_step FROM segments").rows() == [(19,)]  # this host sees its own spool
    store.ingest(final=True)
    assert _lake("SELECT end_step FROM lake.main.segments") == [(19,)]
    run.finish()
    store.ingest(final=False)  # the status changed: not only progress
    assert _lake("SELECT status FROM lake.main.runs") == [("finished",)]


def test_a_metadata_conflict_never_holds_back_rows(lake, home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRACKER_LAKE_COMMITTER", "follow")
    other = tmp_path / "hostB"
    proc = lake.python("import tracker\nr = tracker.init('p', run_id='b')\nr.log({'a': 1.0}, step=0)\nr.finish()",
                       other, TRACKER_LAKE_COMMITTER="follow")
    assert proc.returncode == 0, proc.stderr
    b = LakeStore(other)
    b.ingest()  # host B's run row is in the lake; rewriting it below deletes inlined rows
    run = tracker.init("p", run_id="a", loggers=["store"])
    for step in range(10):
        run.log({"a": float(step)}, step=step)
    run.flush()
    real = LakeStore._commit_meta
    raced = []

    def racing(self, con, tables, left):  # type: ignore[no-untyped-def]
        if not raced:  # host B commits its metadata after this transaction began
            con.execute("SELECT count(*) FROM runs").fetchall()
            with b.connect(write=True) as other_con:
                b._retrying(lambda c: real(b, c, host_meta(other), Backlog(0, 0, 0.0)), other_con)
            raced.append(True)
        return real(self, con, tables, left)

    monkeypatch.setattr(LakeStore, "_commit_meta", racing)
    before = STATS["conflicts_meta"]
    store = LakeStore(home)
    store.ingest(final=False)  # no error: the metadata waits for the next commit
    assert raced and STATS["conflicts_meta"] == before + 1
    assert _lake("SELECT count(*) FROM lake.main.metrics WHERE run_id = 'a'") == [(10,)]
    assert _lake("SELECT count(*) FROM lake.main.runs WHERE run_id = 'a'") == [(0,)]
    store.ingest(final=False)
    assert _lake("SELECT count(*) FROM lake.main.runs WHERE run_id = 'a'") == [(1,)]
    assert _lake("SELECT count(*) FROM lake.main.metrics WHERE run_id = 'a'") == [(10,)]
    run.finish()


def test_readers_share_one_attachment_that_sees_new_commits(lake, home: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    LakeStore().init()
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 0
    assert len(lake_mod._SHARED) == 1
    attached = next(iter(lake_mod._SHARED.values()))
    proc = lake.python("import tracker\nr = tracker.init('p', run_id='w')\n"
                       "[r.log({'a': 1.0}, step=s) for s in range(7)]\nr.finish()", tmp_path / "writer")
    assert proc.returncode == 0, proc.stderr
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 7  # a new snapshot, same attachment
    assert next(iter(lake_mod._SHARED.values())) is attached
    lake.server.stop()
    with pytest.raises(tracker.errors.StoreUnavailableError):
        tracker.query("SELECT count(*) AS n FROM metrics")
    assert not lake_mod._SHARED  # a broken attachment is dropped
    lake.server.start()
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 7


EXIT_MID_COMMIT = textwrap.dedent(
    """
    import time, tracker
    import tracker.store.lake as L
    real = L.LakeStore._commit_rows

    def slow(self, con, todo):  # a commit that would run for minutes inside DuckDB
        con.execute("SELECT count(*) FROM range(1000000000000) t(i) WHERE i % 7 = 3").fetchall()
        return real(self, con, todo)

    L.LakeStore._commit_rows = slow
    run = tracker.init("p", run_id="x", config={"tracker_logger_timeout": 3, "tracker_flush_interval": 0.2})
    for step in range(20):
        run.log({"a": 1.0}, step=step)
    time.sleep(1.5)  # the committer thread is inside DuckDB now
    t = time.monotonic()
    run.finish()
    print("finished in", round(time.monotonic() - t, 1), flush=True)
    """
)


def test_exit_while_a_commit_runs_ends_the_process_cleanly(lake, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    host = tmp_path / "host"
    t = time.monotonic()
    proc = lake.python(EXIT_MID_COMMIT, host, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]  # not -6/-11: no thread is left inside DuckDB
    assert time.monotonic() - t < 60
    assert float(proc.stdout.split()[-1]) < 6.0  # finish() within the logger timeout, plus a flush
    assert "still running" in proc.stderr
    assert spool.data_files(host)  # the rows stay in the spool ...
    LakeStore(host).ingest()  # ... for the next commit
    assert _lake("SELECT count(*) FROM lake.main.metrics WHERE key = 'a'") == [(20,)]


def test_a_lake_with_the_old_views_is_migrated_by_the_next_writer(lake, home: Path) -> None:  # type: ignore[no-untyped-def]
    from tracker.store.lake import LAKE_VIEWS, _MIGRATED

    store = LakeStore()
    store.init()
    with store.connect(write=True) as con:  # the views as the previous release made them
        con.execute("CREATE OR REPLACE VIEW segment_bounds AS SELECT run_id, rank, segment, start_step, "
                    "coalesce(min(start_step) OVER (PARTITION BY run_id, rank ORDER BY segment ROWS BETWEEN "
                    "1 FOLLOWING AND UNBOUNDED FOLLOWING), 9223372036854775807) AS hidden_from FROM segments")
        con.execute(f"DELETE FROM schema_migrations WHERE name = '{LAKE_VIEWS}'")
    _MIGRATED.clear()
    with LakeStore(Path("/nonexistent-spool")).connect() as con:  # a reader leaves them alone
        assert con.execute("SELECT count(*) FROM schema_migrations WHERE name = ?", [LAKE_VIEWS]).fetchone() == (0,)
    run = tracker.init("p", run_id="edge", config={"analysis": False})
    run.log({"loss": 1.0}, step=2**63 - 1)
    run.finish()  # its committer attaches for writing: the views are re-created
    LakeStore(home).ingest()
    assert _lake("SELECT step FROM lake.main.curves") == [(2**63 - 1,)]
    assert _lake("SELECT hidden_from FROM lake.main.segment_bounds") == [(None,)]


def test_a_flush_during_a_commit_never_puts_the_segments_ahead_of_the_rows(lake, home: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("TRACKER_LAKE_COMMITTER", "follow")
    run = tracker.init("p", run_id="race", loggers=["store"])
    for step in range(10):
        run.log({"a": float(step)}, step=step)
    run.flush()
    listed = spool.data_files

    def flush_meanwhile(where: Path) -> list[Path]:  # the flusher lands a chunk and its segment file
        found = listed(where)
        monkeypatch.setattr(spool, "data_files", listed)
        for step in range(10, 20):
            run.log({"a": float(step)}, step=step)
        run.flush()
        return found

    monkeypatch.setattr(spool, "data_files", flush_meanwhile)
    LakeStore(home).ingest(final=True)
    assert _lake("SELECT max(step) FROM lake.main.metrics") == [(9,)]
    assert _lake("SELECT end_step FROM lake.main.segments") == [(9,)]  # not 19: those rows are not in the lake
    LakeStore(home).ingest(final=True)
    assert _lake("SELECT max(step), count(*) FROM lake.main.metrics") == [(19, 20)]
    assert _lake("SELECT end_step FROM lake.main.segments") == [(19,)]
    run.finish()
