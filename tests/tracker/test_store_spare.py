"""The spare DuckDB engine made at import for the first read-only open of the store."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import tracker

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "TRACKER_HOME": str(home), "PYTHONPATH": str(ROOT), **env})


@pytest.fixture
def stored(home: Path) -> Path:
    run = tracker.init("p", run_id="r", loggers=["store"], system=False)
    for step in range(50):
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
    tracker.store.Store(home).ingest()
    tracker.store.release()
    return home


def test_the_first_read_attaches_the_file_to_the_spare_engine(stored: Path) -> None:
    out = _python("""
        import tracker.store.local as L
        L._SPARE._thread.join()
        spare = L._SPARE._made[1]
        with L.Store().reader() as con:
            print(con is spare, con.execute("SELECT current_database()").fetchone()[0])
            print(con.execute("SELECT count(*) FROM curves").fetchone()[0])
        print(L._SPARE._made is None and L._SPARE._thread is None)
        L.release()  # drop the cached reader
        with L.Store().reader() as con:  # the spare is spent: a plain open
            print(con is spare)
    """, stored)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "tracker", "50", "True", "False"]


def test_writes_never_use_the_spare_and_prewarm_can_be_switched_off(stored: Path) -> None:
    out = _python("""
        import tracker.store.local as L
        L._SPARE._thread.join()
        spare = L._SPARE._made[1]
        with L.Store().connect(write=True) as con:
            print(con is spare)
        print(L._SPARE._made is not None)
    """, stored)
    assert out.stdout.split() == ["False", "True"], out.stderr
    out = _python("import tracker.store.local as L; print(L._SPARE._thread is None)", stored, TRACKER_PREWARM="0")
    assert out.stdout.split() == ["True"], out.stderr


def test_a_forked_child_does_not_use_the_parents_spare(stored: Path) -> None:
    out = _python("""
        import os, tracker.store.local as L
        L._SPARE._thread.join()
        pid = os.fork()
        if pid == 0:
            try:
                n = L.Store().query("SELECT count(*) AS n FROM curves")["n"][0]
                os._exit(0 if n == 50 and L._SPARE._made is None else 3)
            except BaseException:
                os._exit(4)
        print(os.waitpid(pid, 0)[1] >> 8)
        print(L.Store().query("SELECT count(*) AS n FROM curves")["n"][0])  # the parent still has it
    """, stored)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["0", "50"]


def test_exiting_while_the_spare_is_being_made_is_clean(tmp_path: Path) -> None:
    for _ in range(10):
        out = _python("import tracker.store.local", tmp_path)
        assert out.returncode == 0, out.stderr


def test_a_migration_on_the_read_path_leaves_no_write_ahead_log(stored: Path) -> None:
    import duckdb

    with duckdb.connect(str(stored / "tracker.duckdb")) as con:  # as if the file were older
        con.execute("DELETE FROM schema_migrations WHERE name = 'm003_views_without_a_step_sentinel'")
    assert not (stored / "tracker.duckdb.wal").exists()
    out = _python("import tracker; print(tracker.query('SELECT count(*) AS n FROM curves')['n'][0])", stored)
    assert out.stdout.split() == ["50"], out.stderr  # the process exits with its reader still cached
    assert not (stored / "tracker.duckdb.wal").exists()  # else every later read-only open replays it
