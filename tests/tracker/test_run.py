"""Runs: the logging API, validation, resume semantics, metadata."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

import tracker
from tracker.errors import ConfigError, RunError


def test_log_auto_step_and_query(home: Path) -> None:
    run = tracker.init("p", config={"lr": 0.1, "seed": 7})
    for i in range(5):
        run.log({"loss/box": 1.0 / (i + 1), "loss/cls": np.float32(2.0)})
    run.log({"loss/box": 0.1}, step=10)
    run.log({"loss/box": 0.05})  # auto-continues after 10
    run.finish()
    df = tracker.query("SELECT step, value FROM curves WHERE key = 'loss/box' ORDER BY step")
    assert df["step"].to_list() == [0, 1, 2, 3, 4, 10, 11]
    assert df["value"][0] == 1.0
    meta = tracker.query("SELECT status, config, seed, python, packages FROM runs").row(0, named=True)
    assert meta["status"] == "finished"
    assert json.loads(meta["config"])["lr"] == 0.1
    assert meta["seed"] == 7
    assert meta["python"].count(".") == 2
    assert "numpy" in json.loads(meta["packages"])


def test_nan_and_inf_are_kept() -> None:
    run = tracker.init("p")
    run.log({"loss": float("nan")}, step=0)
    run.log({"loss": float("inf")}, step=1)
    run.log({"loss": -math.inf}, step=2)
    run.finish()
    vals = tracker.query("SELECT value FROM curves ORDER BY step")["value"].to_list()
    assert math.isnan(vals[0]) and vals[1] == math.inf and vals[2] == -math.inf
    assert tracker.query("SELECT count(*) AS n FROM curves WHERE isnan(value)")["n"][0] == 1


@pytest.mark.parametrize("bad", ["1.5", None, [1.0], {"a": 1}, object()])
def test_non_numeric_value_names_the_key(bad: object) -> None:
    run = tracker.init("p")
    with pytest.raises(TypeError, match="'loss/cls'"):
        run.log({"loss/box": 1.0, "loss/cls": bad})
    run.finish()


def test_bad_keys_and_steps() -> None:
    run = tracker.init("p")
    with pytest.raises(TypeError, match="keys must be non-empty str"):
        run.log({1: 2.0})
    with pytest.raises(TypeError, match="step must be a non-negative int"):
        run.log({"a": 1.0}, step=-1)
    run.finish()
    with pytest.raises(RunError, match="is finished"):
        run.log({"a": 1.0})


def test_log_classes_and_set_classes() -> None:
    run = tracker.init("p")
    run.set_classes(["person", "car", "hair drier"])
    run.log_classes("loss/cls", [3.0, 2.0, 1.0], step=0)
    run.log_classes("loss/cls", np.array([2.0, 1.0, 0.5]), step=1)
    with pytest.raises(ConfigError, match="expected 3"):
        run.log_classes("loss/cls", [1.0, 2.0], step=2)
    run.finish()
    df = tracker.query("SELECT step, class_name, value FROM class_curves ORDER BY step, class_index")
    assert df.height == 6
    assert df["class_name"].to_list()[:3] == ["person", "car", "hair drier"]
    assert df["value"].to_list()[3:] == [2.0, 1.0, 0.5]


def test_events_are_stored() -> None:
    run = tracker.init("p")
    run.log({"loss": 1.0}, step=3)
    run.event("note", "lr dropped", key="loss", severity="info", data={"lr": 0.01})
    run.finish()
    ev = tracker.query("SELECT step, kind, severity, message, data FROM events").row(0, named=True)
    assert ev["step"] == 3 and ev["kind"] == "note" and ev["severity"] == "info"
    assert json.loads(ev["data"]) == {"lr": 0.01}


def test_with_block_marks_crashed() -> None:
    with pytest.raises(ValueError):
        with tracker.init("p", run_id="boom") as run:
            run.log({"loss": 1.0})
            raise ValueError("training blew up")
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'boom'")["status"][0] == "crashed"


def test_resume_hides_superseded_rows_without_gap_or_duplicate() -> None:
    run = tracker.init("p", run_id="r")
    for s in range(100):
        run.log({"loss": float(s)}, step=s)
    run.finish()
    again = tracker.init("p", run_id="r", resume="allow", resume_step=60)
    assert again.segment == 1 and again.start_step == 60
    for s in range(60, 120):
        again.log({"loss": 1000.0 + s})
    again.finish()
    df = tracker.query("SELECT step, value, segment FROM curves WHERE run_id = 'r' ORDER BY step")
    assert df["step"].to_list() == list(range(120))
    assert df.filter(df["step"] >= 60)["segment"].unique().to_list() == [1]
    hidden = tracker.query("SELECT count(*) AS n FROM hidden_metrics")["n"][0]
    assert hidden == 40  # kept, not deleted
    segs = tracker.query("SELECT segment, start_step, end_step, reason FROM segments ORDER BY segment")
    assert segs.rows() == [(0, 0, 99, "start"), (1, 60, 119, "resume")]


def test_resume_step_defaults_to_last_step_plus_one() -> None:
    run = tracker.init("p", run_id="r")
    for s in range(0, 50, 5):
        run.log({"loss": 1.0}, step=s)
    run.finish()
    again = tracker.init("p", run_id="r", resume="must")
    assert again.start_step == 46
    again.log({"loss": 2.0})
    assert again.step == 46
    again.finish()


def test_resume_must_on_unknown_run_fails_clearly() -> None:
    with pytest.raises(RunError, match="cannot resume run 'ghost'.*tracker runs list"):
        tracker.init("p", run_id="ghost", resume="must")


def test_existing_run_without_resume_is_refused() -> None:
    tracker.init("p", run_id="dup").finish()
    with pytest.raises(RunError, match="already exists.*resume='allow'"):
        tracker.init("p", run_id="dup")


def test_logging_before_resume_step_is_refused() -> None:
    tracker.init("p", run_id="r").finish()
    again = tracker.init("p", run_id="r", resume="allow", resume_step=10)
    with pytest.raises(RunError, match="before this segment's start step 10"):
        again.log({"loss": 1.0}, step=5)
    again.finish()


def test_rank_and_world_size_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ConfigError, match="world_size=4 but no run_id"):
        tracker.init("p")
    run = tracker.init("p", run_id="ddp")
    assert (run.rank, run.world_size) == (2, 4)
    run.log({"loss": 1.0}, step=0)
    run.finish()
    assert tracker.query("SELECT rank FROM curves")["rank"].to_list() == [2]


def test_invalid_arguments() -> None:
    with pytest.raises(ConfigError, match="project"):
        tracker.init("")
    with pytest.raises(ConfigError, match="run_id"):
        tracker.init("p", run_id="../escape")
    with pytest.raises(ConfigError, match="resume="):
        tracker.init("p", run_id="x", resume="sometimes")
    with pytest.raises(ConfigError, match="Unknown logger 'nope'"):
        tracker.init("p", loggers=["nope"])


def test_background_flush_makes_rows_queryable_without_finish() -> None:
    import time

    run = tracker.init("p", config={"tracker_flush_interval": 0.1})
    run.log({"loss": 1.0}, step=0)
    deadline = time.time() + 5
    while time.time() < deadline:
        if tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 1:
            break
        time.sleep(0.05)
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 1
    assert tracker.query("SELECT status FROM runs")["status"][0] == "running"
    run.finish()


def test_no_row_is_lost_while_the_flusher_drains() -> None:
    run = tracker.init("p", config={"tracker_flush_interval": 0.001, "analysis": False})
    for s in range(60_000):
        run.log({"loss": 1.0}, step=s)
    run.finish()
    assert tracker.query("SELECT count(*) AS n, count(DISTINCT step) AS d FROM curves").row(0) == (60_000, 60_000)
