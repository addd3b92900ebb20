"""The SQL page's engine refuses writes, ATTACH, INSTALL/LOAD, COPY, file access and SET.

Each refusal is checked on both layers: the statement check of ``webui.sql`` and, with
that check bypassed, the sandboxed DuckDB connection of ``Store.reader(safe=True)``.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tracker.errors import ConfigError, StoreError
from webui.sql import check_sql, run_sql

REFUSED_BY_CHECK = {
    "insert": ("INSERT INTO runs (run_id) VALUES ('x')", "INSERT"),
    "update": ("UPDATE runs SET name = 'x'", "UPDATE"),
    "delete": ("DELETE FROM metrics", "DELETE"),
    "create": ("CREATE TABLE t AS SELECT 1", "CREATE"),
    "create temp": ("CREATE TEMP TABLE t AS SELECT 1", "CREATE"),
    "drop": ("DROP TABLE runs", "DROP"),
    "with insert": ("WITH t AS (SELECT 1) INSERT INTO runs (run_id) SELECT * FROM t", "INSERT"),
    "attach": ("ATTACH '/tmp/other.db' AS other", "ATTACH"),
    "detach": ("DETACH tracker", "DETACH"),
    "install": ("INSTALL httpfs", "INSTALL"),
    "force install": ("FORCE INSTALL httpfs", "FORCE"),
    "load": ("LOAD httpfs", "LOAD"),
    "copy to": ("COPY runs TO '/tmp/runs.csv'", "COPY"),
    "copy from": ("COPY runs FROM '/tmp/runs.csv'", "COPY"),
    "export": ("EXPORT DATABASE '/tmp/dump'", "EXPORT"),
    "set": ("SET threads = 1", "SET"),
    "set external": ("SET enable_external_access = true", "SET"),
    "reset": ("RESET threads", "RESET"),
    "use": ("USE memory", "USE"),
    "pragma set": ("PRAGMA threads = 1", "PRAGMA threads"),
    "pragma other": ("PRAGMA enable_profiling", "PRAGMA enable_profiling"),
    "call": ("CALL pragma_version()", "CALL"),
    "checkpoint": ("CHECKPOINT", "CHECKPOINT"),
    "explain analyze copy": ("EXPLAIN ANALYZE COPY (SELECT 1) TO '/tmp/x.csv'", "COPY"),
    "two statements": ("SELECT 1; DROP TABLE runs", "one statement at a time"),
    "empty": ("  -- nothing\n ;", "empty"),
}

FILE_READS = {
    "read_csv": "SELECT * FROM read_csv('{outside}')",
    "read_parquet": "SELECT * FROM read_parquet('{outside}')",
    "read_text": "SELECT * FROM read_text('{outside}')",
    "glob": "SELECT * FROM glob('{outside_dir}/*')",
    "read_json": "SELECT * FROM read_json_auto('{outside}')",
}

REFUSED_BY_DUCKDB = {
    "insert": "INSERT INTO runs (run_id) VALUES ('x')",
    "delete": "DELETE FROM metrics",
    "create in the store": "CREATE TABLE main.t AS SELECT 1",
    "attach": "ATTACH '{outside_dir}/other.db' AS other",
    "install": "INSTALL httpfs",
    "load": "LOAD httpfs",
    "copy": "COPY (SELECT 1) TO '{outside_dir}/x.csv'",
    "export": "EXPORT DATABASE '{outside_dir}/dump'",
    "set": "SET threads = 1",
    "set external": "SET enable_external_access = true",
    "read_csv": "SELECT * FROM read_csv('{outside}')",
}


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A readable file outside the store."""
    path = tmp_path / "outside" / "secret.csv"
    path.parent.mkdir()
    path.write_text("a,b\n1,2\n")
    return path


@pytest.mark.parametrize("name", sorted(REFUSED_BY_CHECK))
def test_check_refuses_with_a_clear_message(name: str, store) -> None:
    sql, words = REFUSED_BY_CHECK[name]
    with pytest.raises(ConfigError, match=words):
        run_sql(store, sql)


@pytest.mark.parametrize("name", sorted(FILE_READS))
def test_reading_files_outside_the_store_is_refused(name: str, store, outside: Path) -> None:
    sql = FILE_READS[name].format(outside=outside, outside_dir=outside.parent)
    assert check_sql(sql)  # a SELECT: it is DuckDB's sandbox that refuses it
    with pytest.raises(StoreError, match="query refused: file access and settings are switched off"):
        run_sql(store, sql)


@pytest.mark.parametrize("name", sorted(REFUSED_BY_DUCKDB))
def test_the_sandboxed_connection_refuses_on_its_own(name: str, store, outside: Path) -> None:
    sql = REFUSED_BY_DUCKDB[name].format(outside=outside, outside_dir=outside.parent)
    with store.reader(safe=True) as con:
        with pytest.raises(duckdb.Error, match="read-only|disabled|locked|Permission"):
            con.execute(sql)
    assert not (outside.parent / "x.csv").exists() and not (outside.parent / "other.db").exists()
    assert set(store.query("SELECT run_id FROM runs")["run_id"]) == {"run-bce", "run-w", "run-detr"}


@pytest.mark.parametrize(
    "sql, columns",
    [
        ("SELECT run_id, status FROM run_summary ORDER BY run_id", ["run_id", "status"]),
        ("WITH t AS (SELECT key FROM curves) SELECT DISTINCT key FROM t ORDER BY key", ["key"]),
        ("FROM runs SELECT run_id ORDER BY run_id", ["run_id"]),
        ("DESCRIBE metrics", None),
        ("SHOW TABLES", None),
        ("PRAGMA table_info('runs')", None),
        ("EXPLAIN SELECT * FROM curves", None),
        ("SUMMARIZE runs", None),
        ("/* note */ SELECT 1 AS one; ", ["one"]),
    ],
)
def test_reads_are_allowed(sql: str, columns: list[str] | None, store) -> None:
    result = run_sql(store, sql)
    assert result.frame.height > 0
    if columns:
        assert result.frame.columns == columns


def test_results_are_cut_at_max_rows(store) -> None:
    result = run_sql(store, "SELECT * FROM curves", max_rows=100)
    assert result.truncated and result.frame.height == 100
    whole = run_sql(store, "SELECT * FROM runs", max_rows=100)
    assert not whole.truncated and whole.frame.height == 3


def test_a_runaway_query_is_interrupted(store) -> None:
    sql = "SELECT count(*) FROM range(100000000000) a"
    with pytest.raises(StoreError, match="time limit"):
        run_sql(store, sql, timeout=0.3)


def test_the_sandbox_sees_rows_still_in_the_spool(store) -> None:
    import tracker

    run = tracker.init("yolo", name="live", run_id="run-live", home=store.home, loggers=["store"])
    try:
        run.log({"loss/total": 0.5}, step=7)
        run.flush()
        result = run_sql(store, "SELECT run_id, step, value FROM curves WHERE run_id = 'run-live'")
        assert result.frame.rows() == [("run-live", 7, 0.5)]
    finally:
        run.finish()


HIDDEN_SECOND_STATEMENTS = {
    "drop after a carriage-return comment": "SELECT 1; --\r DROP TABLE runs",
    "delete after a carriage-return comment": "SELECT run_id FROM runs --\r; DELETE FROM metrics",
    "create temp after a block comment": "SELECT 1; /* x */ CREATE TEMP TABLE t AS SELECT 1",
    "update in a second line": "SELECT 1;\r\nUPDATE runs SET name = 'x'",
}


@pytest.mark.parametrize("name", sorted(HIDDEN_SECOND_STATEMENTS))
def test_a_second_statement_hidden_after_a_comment_is_refused(name: str, store) -> None:
    with pytest.raises(ConfigError, match="one statement at a time; got 2"):
        run_sql(store, HIDDEN_SECOND_STATEMENTS[name])
    assert store.query("SELECT count(*) AS n FROM runs")["n"][0] == 3


@pytest.mark.parametrize(
    "sql",
    [
        "CALL enable_logging(storage='file', storage_path='/tmp/x')",
        "SELECT * FROM enable_logging(storage='file')",
        "COPY runs TO '/tmp/runs-copy.csv'",
        "COPY runs FROM '/etc/hostname'",
        "EXPLAIN COPY (SELECT 1) TO '/tmp/x.csv'",
        "EXPLAIN ANALYZE CALL enable_logging()",
    ],
)
def test_calls_and_copies_are_refused_by_the_parser(sql: str, store) -> None:
    with pytest.raises(ConfigError, match="refused"):
        check_sql(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM duckdb_databases()",
        "SELECT path FROM duckdb_databases() WHERE database_name = current_database()",
        "FROM duckdb_settings()",
        "SELECT current_setting('memory_limit')",
        "WITH s AS (SELECT * FROM duckdb_settings()) SELECT name FROM s",
        "SELECT * FROM runs WHERE run_id IN (SELECT database_name FROM duckdb_databases())",
        "PRAGMA database_list",
        "FROM duckdb_settings",
        "SELECT * FROM pragma_database_size()",
        "EXPLAIN SELECT * FROM DUCKDB_EXTENSIONS()",
    ],
)
def test_the_store_path_and_settings_are_hidden(sql: str, store) -> None:
    with pytest.raises(ConfigError, match=r"refused on the SQL page"):
        run_sql(store, sql)


def test_check_returns_the_statement_duckdb_parsed() -> None:
    assert check_sql("SELECT 1 AS one;;") == "SELECT 1 AS one"
    assert "pragma_table_info" in check_sql("PRAGMA table_info('runs')")
    assert check_sql("EXPLAIN ANALYZE SELECT 1") == "EXPLAIN ANALYZE SELECT 1"


_HUGE = """
import resource, sys, time
from tracker.errors import StoreError
from tracker.store import Store
from webui.sql import run_sql

t0 = time.monotonic()
try:
    run_sql(Store(sys.argv[1]), "SELECT repeat('x', 10000000) FROM range(100000)", timeout=20, memory_mb=256)
    print("no error")
except StoreError as exc:
    print(f"{time.monotonic() - t0:.1f}", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, str(exc))
"""


def test_a_huge_result_is_stopped_in_time_with_bounded_memory(store) -> None:
    import os
    import subprocess
    import sys

    # in a process of its own, so that the peak of its children is the query process's alone
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _HUGE, str(store.home)], capture_output=True, text=True,
                         timeout=120, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert out.returncode == 0, out.stderr
    seconds, peak_kib, message = out.stdout.split(" ", 2)
    assert "more memory than the SQL page allows" in message or "time limit" in message, message
    assert float(seconds) < 21
    assert int(peak_kib) < 2 * 2**20, f"the query process reached {int(peak_kib) / 2**20:.1f} GiB"


def test_results_are_cut_at_max_bytes(store) -> None:
    result = run_sql(store, "SELECT repeat('x', 1000) AS s FROM range(10000)", max_bytes=2**20)
    assert result.truncated and 0 < result.frame.height < 1100
    assert result.frame["s"].str.len_bytes().max() == 1000
