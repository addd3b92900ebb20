"""`tracker demo` trains two real runs, interrupts and resumes one, and reports where they are."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

import tracker
from tracker.cli import build_cli


def test_demo_trains_interrupts_and_resumes(home: Path) -> None:
    res = CliRunner().invoke(build_cli(), ["demo", "--quick", "--no-ui", "--steps", "120", "--home", str(home)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "interrupted" in res.output and "resuming from the checkpoint of step 50" in res.output
    assert ("Vulkan compute" in res.output) or ("numpy" in res.output)
    runs = tracker.query("SELECT run_id, status, segments, last_step FROM run_summary ORDER BY run_id")
    assert runs["status"].to_list() == ["finished", "finished"]
    assert sorted(runs["segments"].to_list()) == [1, 2]
    assert runs["last_step"].to_list() == [119, 119]
    weighted = [r for r in runs["run_id"].to_list() if r.endswith("weighted")][0]
    steps = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'loss/total' ORDER BY step", [weighted])
    assert steps["step"].to_list() == list(range(120))  # no gap, no duplicate across the resume
    hidden = tracker.query("SELECT min(step) AS lo, max(step) AS hi FROM hidden_metrics WHERE run_id = ? AND key = 'loss/total'", [weighted])
    assert hidden.row(0) == (50, 54)  # interrupted at 54 (45% of 120), resumed at checkpoint 50
    per_class = tracker.query("SELECT count(DISTINCT class_index) AS c FROM class_curves WHERE run_id = ?", [weighted])
    assert per_class["c"][0] == 80
    first, last = tracker.query(
        "SELECT avg(value) FILTER (WHERE step < 20) AS a, avg(value) FILTER (WHERE step >= 100) AS b "
        "FROM curves WHERE run_id = ? AND key = 'loss/total'", [weighted]).row(0)
    assert last < first  # it learns
