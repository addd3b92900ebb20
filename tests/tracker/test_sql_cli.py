"""``tracker sql``: one statement per call, the store read-only, files only with --allow-files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import tracker
from tracker.cli import build_cli


@pytest.fixture(autouse=True)
def _runs() -> None:
    for rid in ("a", "b"):
        run = tracker.init("proj", run_id=rid)
        run.log({"loss": 1.0}, step=0)
        run.finish()


def sql(*args: str) -> object:
    return CliRunner().invoke(build_cli(), ["sql", *args])


@pytest.mark.parametrize("query", ["select 1; select 2", "SELECT 1 AS x; --\r SELECT 2 AS y", "SELECT 1;\nDELETE FROM runs"])
def test_a_second_statement_is_refused_not_dropped(query: str) -> None:
    res = sql(query, "--format", "json")
    assert res.exit_code == 1
    assert "one statement per call; got 2" in res.output and "Traceback" not in res.output
    assert json.loads(sql("SELECT count(*) AS n FROM runs", "--format", "json").output) == [{"n": 2}]


def test_one_statement_runs() -> None:
    res = sql("SELECT run_id FROM runs ORDER BY run_id; ", "--format", "json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == [{"run_id": "a"}, {"run_id": "b"}]


@pytest.mark.parametrize(
    "query, why",
    [
        ("COPY (SELECT 1) TO '{out}'", "--allow-files"),
        ("COPY runs FROM '{src}'", "--allow-files|read-only"),
        ("SELECT * FROM read_text('{src}')", "--allow-files"),
        ("ATTACH '{out}.db' AS other", "--allow-files"),
        ("SET enable_external_access = true", "settings cannot be changed"),
        ("DELETE FROM metrics", "read-only"),
    ],
)
def test_files_and_writes_are_refused(query: str, why: str, tmp_path: Path) -> None:
    src = tmp_path / "hostname"
    src.write_text("secret-host\n")
    out = tmp_path / "out.csv"
    res = sql(query.format(out=out, src=src))
    assert res.exit_code == 1, res.output
    assert "query refused" in res.output
    assert re.search(why, res.output), res.output
    assert "secret-host" not in res.output
    assert not out.exists() and not Path(f"{out}.db").exists()
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 2


def test_allow_files_lets_a_statement_write_a_file(tmp_path: Path) -> None:
    out = tmp_path / "runs.csv"
    res = sql("--allow-files", f"COPY (SELECT run_id FROM runs ORDER BY run_id) TO '{out}'")
    assert res.exit_code == 0, res.output
    assert out.read_text().split() == ["run_id", "a", "b"]


_FLAT = ("SELECT 1::BIGINT AS a, 2.5::DOUBLE AS b, 'x' AS c, TIMESTAMP '2026-01-02 03:04:05.123456' AS d, "
         "TIMESTAMPTZ '2026-01-02 03:04:05+00' AS e, DATE '2026-01-02' AS f, 1.25::DECIMAL(5, 2) AS g, "
         "true AS h, NULL::DOUBLE AS i, 'nan'::DOUBLE AS j, 'ab'::BLOB AS k, 7::UTINYINT AS l")


@pytest.mark.parametrize("query", [
    _FLAT,                                                               # streamed, no pyarrow
    "SELECT INTERVAL 3 DAY AS i, 1 AS n",                                # INTERVAL: through .pl()
    "SELECT [1, 2] AS l, {'a': 1} AS s",                                 # nested: through .pl()
    "PRAGMA database_list",                                              # not a SELECT
    "SELECT 1 AS x; SELECT 2 AS y",                                      # two statements: the last one's rows
    "SELECT * FROM range(0) t(n)",                                       # no rows, typed columns
])
def test_result_frame_equals_duckdbs_own_conversion(query: str) -> None:
    import duckdb

    from tracker.store.local import result_frame

    con = duckdb.connect()
    try:
        expected = con.execute(query).pl()
    except Exception as exc:  # polars cannot take this type at all: the same error, never a panic
        with pytest.raises(type(exc)):
            result_frame(con, query)
        return
    got = result_frame(con, query)
    assert got.schema == expected.schema and got.equals(expected)


def test_result_frame_runs_a_parameterised_query_once() -> None:
    import duckdb

    from tracker.store.local import result_frame

    con = duckdb.connect()
    con.execute("CREATE TABLE t (n INTEGER)")
    assert result_frame(con, "INSERT INTO t VALUES (?)", [5]).to_dicts() == [{"Count": 1}]
    assert result_frame(con, "SELECT n FROM t WHERE n = ?", [5]).to_dicts() == [{"n": 5}]
    assert result_frame(con, "SELECT count(*) AS c FROM t").to_dicts() == [{"c": 1}]  # the INSERT ran once


def test_a_query_of_a_store_without_live_runs_loads_neither_pyarrow_nor_numpy(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys\n"
        "from tracker.cli import main\n"
        "try:\n"
        "    main(['sql', 'SELECT run_id, status FROM runs ORDER BY run_id', '--format', 'csv'])\n"
        "except SystemExit as exc:\n"
        "    assert not exc.code, exc.code\n"
        "print(sorted(m for m in ('pyarrow', 'numpy') if m in sys.modules))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(root)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    # the autouse fixture's runs were ingested by that first call (a write); this one only reads
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["run_id,status", "a,finished", "b,finished", "[]"]
