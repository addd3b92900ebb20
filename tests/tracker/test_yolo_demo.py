"""`tracker demo` (without --quick) trains YOLO11n twice, kills one run mid-epoch and resumes it."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import tracker
from tracker.cli import build_cli

pytestmark = pytest.mark.slow


def test_yolo_demo_trains_both_runs_and_resumes_the_killed_one(home: Path) -> None:
    res = CliRunner().invoke(build_cli(), ["demo", "--no-ui", "--epochs", "2", "--images", "32", "--home", str(home)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "killed with SIGKILL in epoch 2" in res.output and "training took" in res.output
    runs = tracker.query("SELECT run_id, name, status, segments, last_step FROM run_summary ORDER BY name")
    assert runs["status"].to_list() == ["finished", "finished"]
    assert runs["segments"].to_list() == [1, 2]  # plain: one segment; weighted: one resume boundary
    weighted = runs.filter(runs["name"].str.starts_with("weighted"))["run_id"][0]
    steps = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'train/cls_loss' ORDER BY step",
                          [weighted])["step"].to_list()
    assert steps == list(range(len(steps))) and steps[-1] == runs["last_step"].to_list()[1]
    per_class = tracker.query("SELECT count(DISTINCT class_index) AS c FROM class_curves WHERE run_id = ?", [weighted])
    assert per_class["c"][0] == 80
    assert list((home / "yolo-demo").iterdir())  # everything it wrote is under TRACKER_HOME
