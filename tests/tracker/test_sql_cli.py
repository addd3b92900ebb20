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
