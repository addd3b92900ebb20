"""The core CLI: runs list/show/rm, sql, export, ingest, plugins; errors as one line."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from click.testing import CliRunner

import tracker
from tracker.cli import build_cli


def _seed() -> None:
    for rid in ("a", "b"):
        run = tracker.init("proj", run_id=rid, tags=["t1"])
        for s in range(5):
            run.log({"loss": float(s)}, step=s)
        run.finish()


def invoke(*args: str) -> object:
    return CliRunner().invoke(build_cli(), list(args), catch_exceptions=False)


def test_runs_list_and_show() -> None:
    _seed()
    res = invoke("runs", "list", "--format", "json")
    assert res.exit_code == 0
    rows = json.loads(res.output)
    assert sorted(r["run_id"] for r in rows) == ["a", "b"]
    assert all(r["last_step"] == 4 for r in rows)
    res = invoke("runs", "show", "a", "--format", "json")
    data = json.loads(res.output)
    assert data["keys"][0]["key"] == "loss" and data["keys"][0]["points"] == 5
    assert invoke("runs", "list").exit_code == 0


def test_unknown_run_is_one_clear_line() -> None:
    _seed()
    res = CliRunner().invoke(build_cli(), ["runs", "show", "zzz"])
    assert res.exit_code == 1
    assert "Unknown run 'zzz'" in res.output and "Traceback" not in res.output


def test_sql_formats() -> None:
    _seed()
    res = invoke("sql", "SELECT run_id, count(*) AS n FROM curves GROUP BY run_id ORDER BY run_id", "--format", "csv")
    assert res.output.splitlines() == ["run_id,n", "a,5", "b,5"]
    res = invoke("sql", "SELECT 1 AS x", "--format", "json")
    assert json.loads(res.output) == [{"x": 1}]
    bad = CliRunner().invoke(build_cli(), ["sql", "SELECT * FROM nope"])
    assert bad.exit_code == 1 and "query failed" in bad.output


def test_export_csv_and_parquet(tmp_path: Path) -> None:
    _seed()
    res = invoke("export", "a", "--format", "csv")
    assert res.output.splitlines()[0] == "step,key,value,wall_time,rank,segment"
    assert len(res.output.splitlines()) == 6
    out = tmp_path / "a.parquet"
    invoke("export", "a", "--format", "parquet", "-o", str(out))
    assert pl.read_parquet(out)["step"].to_list() == [0, 1, 2, 3, 4]


def test_runs_rm() -> None:
    _seed()
    res = invoke("runs", "rm", "a", "--yes")
    assert "removed run a" in res.output
    assert tracker.query("SELECT run_id FROM runs")["run_id"].to_list() == ["b"]


def test_no_store_is_a_clear_error(tmp_path: Path) -> None:
    res = CliRunner().invoke(build_cli(), ["runs", "list", "--home", str(tmp_path / "nothing")])
    assert res.exit_code == 1 and "No store found" in res.output


def test_plugins_listing() -> None:
    res = invoke("plugins", "--format", "json")
    rows = {r["name"]: r for r in json.loads(res.output)}
    assert rows["store_logger"]["registered"] == {"loggers": ["store"]}
    assert rows["store_logger"]["status"] is None
    assert rows["coco"]["registered"]["commands"] == ["coco"]
    table = invoke("plugins")
    assert "store_logger" in table.output


def test_ingest_command() -> None:
    _seed()
    res = invoke("ingest")
    assert res.exit_code == 0 and "ingested" in res.output


def test_lazy_command_map_matches_what_the_modules_register() -> None:
    import importlib

    import click

    from tracker.cli import CORE_COMMANDS, core_command_modules

    found = {}
    for module in core_command_modules():
        group = click.Group()
        importlib.import_module(f"tracker.commands.{module}").register(group)
        found.update({name: module for name in group.commands})
    assert found == CORE_COMMANDS


def test_help_lists_core_and_plugin_commands() -> None:
    res = invoke("--help")
    for name in ("analyze", "runs", "sql", "demo", "weights", "coco"):
        assert f"  {name}" in res.output
