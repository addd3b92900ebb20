"""The DuckDB store: migrations, ingestion, spool visibility, corrupt files, the file lock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

import tracker
from tracker import spool
from tracker.errors import StoreError, StoreLockedError
from tracker.schema import MIGRATIONS
from tracker.store import Store, release


def _run(run_id: str = "r", steps: int = 10, finish: bool = True, **kw: object) -> tracker.Run:
    run = tracker.init("p", run_id=run_id, **kw)
    for s in range(steps):
        run.log({"loss": float(s), "aux": 1.0}, step=s)
    if finish:
        run.finish()
    else:
        run.flush()
    return run


def test_migrations_are_recorded(home: Path) -> None:
    store = Store()
    store.query("SELECT 1")
    names = store.query("SELECT name FROM schema_migrations ORDER BY name")["name"].to_list()
    assert names == [n for n, _ in MIGRATIONS]
    release()
    con = duckdb.connect(str(store.path), read_only=True)  # any SQL client sees the views
    assert con.execute("SELECT count(*) FROM curves").fetchone() == (0,)
    con.close()


def test_queries_see_spooled_rows_before_ingestion(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    run = _run(finish=False)
    assert len(spool.data_files(run.home)) >= 1
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 20
    run.finish()
    assert tracker.query("SELECT status FROM runs")["status"][0] == "finished"
    report = Store().ingest()
    assert report.files >= 1 and report.rows == 20
    assert spool.data_files(run.home) == []
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 20


def test_ingestion_is_idempotent_after_a_crash_between_commit_and_delete(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    run = _run()
    files = spool.data_files(run.home)
    saved = tmp_path / "saved"
    saved.mkdir()
    for f in files:
        shutil.copy(f, saved / f.name)
    Store().ingest()
    for f in files:  # as if the process died after COMMIT, before removing the files
        shutil.copy(saved / f.name, f)
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 20  # readers skip them
    report = Store().ingest()
    assert report.files == 0
    assert spool.data_files(run.home) == []
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 20


def test_corrupt_segment_is_moved_aside_and_nothing_else_lost(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    run = _run()
    bad = spool.run_dir(run.home, "r") / "r0-s0000-000099.metrics.parquet"
    bad.write_bytes(b"PAR1 this is not parquet")
    report = Store().ingest()
    assert report.corrupt == 1 and report.rows == 20
    moved = run.home / "corrupt" / "r" / bad.name
    assert moved.read_bytes() == b"PAR1 this is not parquet"
    assert "corrupt spool file" in caplog.text
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 20


def test_stale_temp_files_are_cleaned(monkeypatch: pytest.MonkeyPatch) -> None:
    run = _run()
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(proc.stdout)
    tmp = spool.run_dir(run.home, "r") / f".r0-s0000-000005.metrics.parquet.{dead_pid}.tmp"
    tmp.write_bytes(b"half written")
    live = spool.run_dir(run.home, "r") / f".r0-s0000-000006.metrics.parquet.{os.getpid()}.tmp"
    live.write_bytes(b"being written")
    Store().ingest()
    assert not tmp.exists()
    assert live.exists()  # its writer is alive


def test_lock_is_retried_then_fails_clearly(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    Store().query("SELECT 1")
    release()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         f"import duckdb, time; c = duckdb.connect({str(home / 'tracker.duckdb')!r}); print('held', flush=True); time.sleep(3)"],
        stdout=subprocess.PIPE, text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    monkeypatch.setenv("TRACKER_LOCK_TIMEOUT", "0.3")
    t0 = time.monotonic()
    with pytest.raises(StoreLockedError, match="locked by another process.*TRACKER_LOCK_TIMEOUT"):
        tracker.query("SELECT 1")
    assert time.monotonic() - t0 < 2.5
    monkeypatch.setenv("TRACKER_LOCK_TIMEOUT", "20")
    assert tracker.query("SELECT 42 AS x")["x"][0] == 42  # waits for the holder to go
    holder.wait(timeout=30)


def test_bad_sql_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="query failed"):
        tracker.query("SELECT * FROM no_such_table")


def test_delete_run_removes_rows_and_spool() -> None:
    run = _run("gone")
    _run("kept")
    n = Store().delete_run("gone")
    assert n > 0
    assert not spool.run_dir(run.home, "gone").exists()
    assert tracker.query("SELECT DISTINCT run_id FROM curves")["run_id"].to_list() == ["kept"]


def test_query_params_and_polars_result() -> None:
    _run()
    df = tracker.query("SELECT step FROM curves WHERE key = ? AND step >= ? ORDER BY step", ["loss", 7])
    assert df["step"].to_list() == [7, 8, 9]
    assert type(df).__module__.startswith("polars")


def test_killed_process_run_is_reported_crashed(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    code = (
        "import os, tracker; r = tracker.init('p', run_id='k'); r.log({'loss': 1.0}, step=0); r.flush(); "
        "os._exit(0)"
    )
    env = {**os.environ, "TRACKER_HOME": str(home)}
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'k'")["status"][0] == "crashed"


def test_runs_with_same_chunk_names_are_both_ingested() -> None:
    _run("a")
    _run("b")
    counts = tracker.query("SELECT run_id, count(*) AS n FROM metrics GROUP BY run_id ORDER BY run_id")
    assert counts.rows() == [("a", 20), ("b", 20)]


def test_idle_reader_is_reused_then_released(home: Path) -> None:
    import tracker.store as store_mod

    _run()
    tracker.query("SELECT 1")
    assert store_mod._READERS.entry is not None  # kept for the next query of a burst
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 20
    time.sleep(0.8)
    assert store_mod._READERS.entry is None  # closed after the idle time
    proc = subprocess.run(
        [sys.executable, "-c", f"import duckdb; duckdb.connect({str(home / 'tracker.duckdb')!r}).close()"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr  # another process can now take the write lock


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tracker.store import inline_params  # noqa: E402

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.text(max_size=20),
    st.floats(allow_nan=True, allow_infinity=True),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(_scalars, min_size=1, max_size=4))
def test_inlined_parameters_give_what_binding_gives(values: list[object]) -> None:
    sql = "SELECT " + ", ".join("?" for _ in values) + " -- a ? in a comment\n, '?' AS q"
    inlined, rest = inline_params(sql, values)
    con = duckdb.connect()
    bound = con.execute(sql, values).fetchall()
    if rest is None:
        got = con.execute(inlined).fetchall()
        for a, b in zip(got[0], bound[0]):
            assert (a == b) or (a != a and b != b), (inlined, a, b)
            assert type(a) is type(b)


def test_inline_leaves_what_it_cannot_write() -> None:
    assert inline_params("SELECT ?", [b"bytes"]) == ("SELECT ?", [b"bytes"])
    assert inline_params("SELECT $x", {"x": 1}) == ("SELECT $x", {"x": 1})
    assert inline_params("SELECT ?, ?", [1]) == ("SELECT ?, ?", [1])  # DuckDB reports the mismatch
    sql, rest = inline_params("SELECT * FROM t WHERE k IN (SELECT unnest(?)) AND s = '?'", [["a", "b'c"]])
    assert rest is None and sql == "SELECT * FROM t WHERE k IN (SELECT unnest(['a', 'b''c'])) AND s = '?'"


def test_queries_with_parameters_do_not_import_pandas(home: Path) -> None:
    _run("x", steps=1)
    release()
    code = (
        "import sys, tracker;"
        "print(tracker.query('SELECT count(*) AS n FROM curves WHERE run_id = ? AND step >= ?', ['x', 0])['n'][0],"
        " 'pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TRACKER_HOME": str(home)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["2", "False"]  # two keys at step 0


def test_an_ingest_never_stores_metadata_older_than_the_fingerprint_it_records(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that finishes right after an ingest read the spool's metadata (a rank finishing
    while another ingests) must not be shown ``running`` from then on: the ingest records the
    fingerprint of what it read, not of what the spool became."""
    from tracker.store import local

    monkeypatch.setenv("TRACKER_INGEST_ON_FINISH", "0")
    run = tracker.init("race", run_id="race", loggers=["store"])
    run.log({"loss": 1.0}, step=0)
    assert run.flush(timeout=10)
    real_scan = local.spoolcheck.scan

    def scan_then_finish(root: Path) -> object:
        found = real_scan(root)
        run.finish()  # run.json says finished from here on; the scan above read running
        return found

    monkeypatch.setattr(local.spoolcheck, "scan", scan_then_finish)
    local.Store(home).ingest()
    monkeypatch.setattr(local.spoolcheck, "scan", real_scan)
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'race'").item() == "finished"
    local.Store(home).ingest()
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'race'").item() == "finished"
