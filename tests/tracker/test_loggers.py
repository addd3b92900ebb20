"""The CSV and console loggers (plugins), driven through real runs."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

import tracker


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_csv_new_keys_mid_run_keep_old_rows(home: Path) -> None:
    run = tracker.init("p", run_id="c", loggers=["csv"], config={"tracker_flush_interval": 60})
    for s in range(3):
        run.log({"loss": float(s)}, step=s)
    run.flush()
    run.log({"loss": 3.0, "loss/new": 30.0}, step=3)
    run.log({"loss": float("nan")}, step=4)
    run.finish()
    path = home / "runs" / "c" / "metrics.csv"
    rows = _rows(path)
    assert list(rows[0]) == ["step", "wall_time", "loss", "loss/new"]
    assert [r["step"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r["loss"] for r in rows[:4]] == ["0.0", "1.0", "2.0", "3.0"]
    assert rows[0]["loss/new"] == "" and rows[3]["loss/new"] == "30.0"
    assert rows[4]["loss"] == "nan"


def test_csv_resume_drops_rows_at_or_after_resume_step(home: Path) -> None:
    run = tracker.init("p", run_id="c", loggers=["csv", "store"])
    for s in range(10):
        run.log({"loss": float(s)}, step=s)
    run.finish()
    again = tracker.init("p", run_id="c", resume="allow", resume_step=6, loggers=["csv", "store"])
    for s in range(6, 8):
        again.log({"loss": 100.0 + s}, step=s)
    again.finish()
    rows = _rows(home / "runs" / "c" / "metrics.csv")
    assert [int(r["step"]) for r in rows] == list(range(8))
    assert rows[6]["loss"] == "106.0"
    store_steps = tracker.query("SELECT step FROM curves ORDER BY step")["step"].to_list()
    assert store_steps == [int(r["step"]) for r in rows]  # same rule as the store


def test_csv_torn_last_line_is_dropped_on_resume(home: Path) -> None:
    run = tracker.init("p", run_id="c", loggers=["csv"])
    for s in range(3):
        run.log({"loss": float(s)}, step=s)
    run.finish()
    path = home / "runs" / "c" / "metrics.csv"
    with open(path, "a") as fh:
        fh.write("3,12345.0,0.")  # a crash mid-append
    again = tracker.init("p", run_id="c", resume="allow", resume_step=3, loggers=["csv"])
    again.log({"loss": 9.0}, step=3)
    again.finish()
    assert [r["loss"] for r in _rows(path)] == ["0.0", "1.0", "2.0", "9.0"]


def test_console_logger_prints_progress_and_status(capsys: pytest.CaptureFixture[str]) -> None:
    run = tracker.init("p", run_id="talk", loggers=["console"])
    run.log({"loss/box": 0.5, "loss/cls": float("inf")}, step=0)
    run.event("spike", "loss jumped", key="loss/box")
    run.finish()
    err = capsys.readouterr().err
    assert "talk" in err and "started at step 0" in err
    assert "loss/box=0.5" in err and "spike" in err and "finished" in err


def test_a_failing_logger_is_dropped_not_fatal(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from plugins import csv_logger

    def broken(self, batch):  # noqa: ANN001, ANN202
        raise OSError("disk full")

    monkeypatch.setattr(csv_logger.CsvSession, "write", broken)
    run = tracker.init("p", loggers=["csv", "store"])
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert "disk full" in caplog.text
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 1
