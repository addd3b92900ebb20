"""CLI tables: fitted to the terminal, plain text in a pipe, CSV of list columns, summarised configs."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console

import tracker
from tracker.cli import build_cli
from tracker.commands._output import plan_layout, print_rows
from tracker.commands.summary import run_fields, summarise

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
BOX = set("┏┃━┡│└┘┓╇┩┳┴┼")


def _seed(n_classes: int = 80) -> list[str]:
    ids = []
    for name in ("baseline-with-a-long-descriptive-name", None):
        run = tracker.init(
            "proj", name=name, tags=["t1", "coco"],
            config={"lr": 0.01, "class_counts": list(range(1000, 1000 + n_classes)),
                    "names": {str(i): f"class {i}" for i in range(n_classes)}, "analysis": {"spike": {"threshold": 5}}},
        )
        for s in range(5):
            run.log({"loss/cls": float(s)}, step=s)
        run.finish()
        ids.append(run.run_id)
    return ids


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tracker.cli", *args]


def _env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), **extra}


def _in_terminal(args: list[str], columns: int) -> list[str]:
    """Run the CLI with stdout on a pseudo-terminal ``columns`` wide; the lines it drew, colours removed."""
    master, slave = pty.openpty()
    env = _env(COLUMNS=str(columns), LINES="50")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(args, stdout=slave, stderr=subprocess.PIPE, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=120) == 0, proc.stderr.read().decode() if proc.stderr else ""
    text = ANSI.sub("", b"".join(chunks).decode())
    return [line.rstrip() for line in text.replace("\r\n", "\n").split("\n") if line.strip()]


@pytest.mark.parametrize("columns", [80, 150])
def test_runs_list_in_a_terminal_keeps_ids_and_names_whole(columns: int) -> None:
    ids = _seed()
    lines = _in_terminal(_cli("runs", "list"), columns)
    assert max(len(line) for line in lines) <= columns, "\n".join(lines)
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2, "\n".join(lines)  # one line per run: nothing wrapped
    for run_id in ids:
        assert any(run_id in row for row in rows), "\n".join(lines)
    assert any("baseline-with-a-long-descriptive-name" in row for row in rows)
    assert all("finished" in row for row in rows), "\n".join(lines)  # status outlives less useful columns
    if columns == 80:
        assert any("columns left out at this width" in line for line in lines)
    else:
        assert all(re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", row) for row in rows)  # dates whole, not cut


def test_runs_list_through_a_pipe_is_plain_tab_separated_text() -> None:
    ids = _seed()
    out = subprocess.run(_cli("runs", "list"), env=_env(COLUMNS="40"), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert not BOX & set(out.stdout) and "\x1b" not in out.stdout
    header = lines[0].split("\t")
    assert header[:4] == ["run_id", "project", "name", "status"] and "tags" in header
    rows = [dict(zip(header, line.split("\t"))) for line in lines[1:]]
    assert sorted(r["run_id"] for r in rows) == sorted(ids)
    assert {r["status"] for r in rows} == {"finished"} and {r["tags"] for r in rows} == {"t1, coco"}
    assert "runs in" in out.stderr  # the title, kept out of the data


def test_runs_show_summarises_long_config_values_and_full_shows_them() -> None:
    run_id = _seed()[0]
    lines = _in_terminal(_cli("runs", "show", run_id), 80)
    assert len(lines) < 50, f"{len(lines)} lines:\n" + "\n".join(lines)
    assert max(len(line) for line in lines) <= 80
    text = "\n".join(lines)
    assert "config.class_counts" in text and "[80 values: 1000, 1001" in text
    assert "config.names" in text and "{80 keys: '0', '1'" in text
    assert "config.analysis.spike.threshold" in text and "config.lr" in text
    assert any(run_id in line for line in lines)

    piped = CliRunner().invoke(build_cli(), ["runs", "show", run_id])
    assert piped.exit_code == 0, piped.output
    fields = dict(line.split("\t", 1) for line in piped.output.splitlines() if "\t" in line)
    assert fields["config.class_counts"].startswith("[80 values: 1000, 1001")
    assert "# segments" in piped.output and "# keys" in piped.output
    full = CliRunner().invoke(build_cli(), ["runs", "show", run_id, "--full"])
    fields = dict(line.split("\t", 1) for line in full.output.splitlines() if "\t" in line)
    assert json.loads(fields["config.class_counts"]) == list(range(1000, 1080))
    assert fields["config.names.79"] == "class 79"


def test_summaries_fit_the_width() -> None:
    assert summarise(list(range(80)), 30) == "[80 values: 0, 1, 2, 3, 4, …]"
    assert len(summarise("x" * 500, 40)) == 40 and summarise("x" * 500, 40).endswith("(500 chars)")
    assert summarise({"a": 1}, 60) == '{"a": 1}'
    assert run_fields({"config": '{"a": {"b": 2}}'}) == [("config.a.b", "2")]


def test_key_columns_are_never_cut_and_others_shrink_or_drop() -> None:
    columns = ("term", "backend", "plugin", "checks", "status")
    long_term = "class_weighted_bce_long_name"
    rows = [[long_term, "vulkan", "third_party_losses", "9", "skipped: no Vulkan device on this machine"]]
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=True, color_system=None)
    print_rows(columns, rows, keys=("term", "backend", "plugin"), drop_order=("checks",), console=console,
               terminal=True)
    lines = out.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert any(long_term in line and "third_party_losses" in line for line in lines), out.getvalue()
    assert "checks" not in out.getvalue().split("columns left out")[0]
    assert "columns left out at this width: checks" in out.getvalue()
    layout = plan_layout(columns, rows, ("term",), 40)
    assert layout.widths == {0: len(long_term)}  # wider than the terminal: the name still whole


def test_csv_of_list_columns() -> None:
    ids = _seed()
    res = CliRunner().invoke(build_cli(), ["runs", "list", "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert sorted(r["run_id"] for r in rows) == sorted(ids)
    assert {r["tags"] for r in rows} == {'["t1", "coco"]'}
    res = CliRunner().invoke(build_cli(), ["sql", "SELECT * FROM run_summary", "--format", "csv"])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(io.StringIO(res.output)))
    assert json.loads(rows[0]["tags"]) == ["t1", "coco"]
    assert json.loads(rows[0]["config"])["lr"] == 0.01


def test_export_parquet_says_where_it_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _seed()[0]
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(build_cli(), ["export", run_id, "--format", "parquet"])
    assert res.exit_code == 0, res.output
    written = tmp_path / f"{run_id}.parquet"
    assert written.exists()
    assert f"wrote 5 rows to {written}" in res.output


def test_a_query_of_one_long_text_column_still_shows_it() -> None:
    _seed()
    lines = _in_terminal(_cli("sql", "SELECT config FROM runs"), 80)
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2 and all('{"lr": 0.01' in row and row.endswith("… │") for row in rows), "\n".join(lines)
    assert max(len(line) for line in lines) <= 80


def test_runs_show_csv_keeps_config_values_whole() -> None:
    run_id = _seed()[0]
    res = CliRunner().invoke(build_cli(), ["runs", "show", run_id, "--format", "csv"])
    assert res.exit_code == 0, res.output
    line = next(line for line in res.output.splitlines() if line.startswith("config.class_counts,"))
    assert json.loads(next(csv.reader([line]))[1]) == list(range(1000, 1080))
