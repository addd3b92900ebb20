"""`tracker demo` trains three real runs: plain, weighted (interrupted and resumed with a new seed),
and one with the gradient-overwrite bug that the divergence detector catches."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import tracker
from tracker.cli import build_cli


def _run(home: Path, steps: int) -> str:
    res = CliRunner().invoke(build_cli(), ["demo", "--quick", "--no-ui", "--steps", str(steps), "--home", str(home)],
                             catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.output


def _ids() -> dict[str, str]:
    ids = tracker.query("SELECT run_id FROM runs")["run_id"].to_list()
    return {r.rsplit("-", 1)[1]: r for r in ids}


def test_demo_trains_interrupts_and_resumes(home: Path) -> None:
    output = _run(home, 120)
    assert "interrupted" in output and "resuming from the checkpoint of step 50 with sampler seed 1" in output
    assert ("Vulkan compute" in output) or ("numpy" in output)
    assert "grad[...] = g, not grad += g" in output
    runs = tracker.query("SELECT run_id, status, segments, last_step FROM run_summary ORDER BY run_id")
    assert len(runs) == 3 and set(runs["status"].to_list()) <= {"finished", "diverged"}
    assert sorted(runs["segments"].to_list()) == [1, 1, 2]
    assert runs["last_step"].to_list() == [119, 119, 119]
    weighted = _ids()["weighted"]
    steps = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'loss/total' ORDER BY step", [weighted])
    assert steps["step"].to_list() == list(range(120))  # no gap, no duplicate across the resume
    hidden = tracker.query("SELECT step, value FROM hidden_metrics WHERE run_id = ? AND key = 'loss/total' "
                           "ORDER BY step", [weighted])
    assert hidden["step"].to_list() == list(range(50, 55))  # interrupted at 54 (45% of 120), resumed at 50
    replay = tracker.query("SELECT step, value FROM curves WHERE run_id = ? AND key = 'loss/total' "
                           "AND step BETWEEN 50 AND 54 ORDER BY step", [weighted])
    # the resumed segment draws other batches (sampler seed 1): its rows differ from the ones it supersedes
    assert not np.allclose(hidden["value"].to_numpy(), replay["value"].to_numpy())
    fingerprints = tracker.query("SELECT step, value FROM curves WHERE run_id = ? AND key = 'rng/fingerprint' "
                                 "AND step IN (0, 50) ORDER BY step", [weighted])
    assert fingerprints["step"].to_list() == [0, 50]  # both in epoch 0: equal only if the seed were the same
    assert fingerprints["value"][0] != fingerprints["value"][1]
    per_class = tracker.query("SELECT count(DISTINCT class_index) AS c FROM class_curves WHERE run_id = ?", [weighted])
    assert per_class["c"][0] == 80
    first, last = tracker.query(
        "SELECT avg(value) FILTER (WHERE step < 20) AS a, avg(value) FILTER (WHERE step >= 100) AS b "
        "FROM curves WHERE run_id = ? AND key = 'loss/total'", [weighted]).row(0)
    assert last < first  # it learns


@pytest.mark.slow
def test_the_overwrite_bug_diverges_and_the_detector_says_so(home: Path) -> None:
    _run(home, 300)
    ids = _ids()
    events = tracker.query("SELECT run_id, step, key, kind FROM events")
    assert events.filter(events["run_id"] != ids["overwrite"]).is_empty()  # the healthy runs raise nothing
    found = events.filter((events["run_id"] == ids["overwrite"]) & (events["kind"] == "divergence"))
    assert "loss/total" in found["key"].to_list()
    start = 120  # the penalty, with its overwriting kernel, starts at 40% of the steps
    assert all(start < s < 300 for s in found["step"].to_list())
    status = tracker.query("SELECT status FROM runs WHERE run_id = ?", [ids["overwrite"]])["status"][0]
    assert status == "diverged"
    best, end = tracker.query(
        "SELECT min(value) FILTER (WHERE step < 120), avg(value) FILTER (WHERE step >= 280) FROM curves "
        "WHERE run_id = ? AND key = 'loss/total'", [ids["overwrite"]]).row(0)
    assert end > 1.5 * best
    config = tracker.query("SELECT CAST(config AS VARCHAR) AS c FROM runs WHERE run_id = ?", [ids["overwrite"]])
    assert json.loads(config["c"][0])["logit_penalty"] == {"weight": 0.03, "from_step": 120,
                                                           "kernel": "overwrites grad"}


def test_the_penalty_added_correctly_raises_no_event(home: Path) -> None:
    from tracker import demo as d

    data = d.make_dataset()
    params = {"scheme": "effective_number", "beta": 0.999, "counts": data.counts.tolist()}
    d.train(data, run_id="correct", name="penalty added", loss_params=params, threshold=0.02, steps=300,
            backend="numpy", home=str(home), penalty=d.Penalty(d.PENALTY_WEIGHT, start=120))
    assert tracker.query("SELECT count(*) AS n FROM events WHERE run_id = 'correct'")["n"][0] == 0
    assert tracker.query("SELECT status FROM runs WHERE run_id = 'correct'")["status"][0] == "finished"


def test_the_penalty_kernel_adds_or_overwrites() -> None:
    from tracker import demo as d

    logits = np.array([[1.0, -2.0]], np.float32)
    grad = np.full((1, 2), 5.0, np.float32)
    d.Penalty(0.5, start=0)(logits, grad)
    assert grad.tolist() == [[5.5, 4.0]]  # 5 + 2 * 0.5 * z / 2
    d.Penalty(0.5, start=0, overwrite=True)(logits, grad)
    assert grad.tolist() == [[0.5, -1.0]]
