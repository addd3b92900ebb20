"""Stagnant classes and rank disagreement, on hand-made inputs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import tracker
from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.classes import ClassChunk, StagnantClasses
from tracker.analysis.detectors import StreamContext
from tracker.analysis.online import OnlineAnalyzer, pivot_classes
from tracker.analysis.ranks import RankDisagreement
from tracker.errors import ConfigError

PARAMS = {"window": 50, "every": 50, "total_drop": 0.2, "class_drop": 0.05, "lag": 30.0, "min_rows": 3}


def class_matrix(rows: int = 300, classes: int = 8, stuck: tuple[int, ...] = (6, 7), seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(rows)[:, None]
    m = np.ones((rows, classes)) * (1 + t / 10.0) ** -1.0
    m[:, list(stuck)] = 1.0
    return m * rng.lognormal(0, 0.1, m.shape)


def test_stagnant_classes_are_named_once() -> None:
    stream = StagnantClasses(StreamContext("loss/cls", PARAMS, class_names={6: "toaster", 7: "hair drier"}))
    events = stream.feed(ClassChunk(np.arange(300) * 10, class_matrix()))
    (event,) = events
    assert event.kind == "stagnant_classes" and event.step == 990 and event.data["classes"] == [6, 7]
    assert "toaster, hair drier" in event.message and "2 classes have not learned" in event.message
    final = stream.final()
    assert final is not None and final.classes == [6, 7] and final.step == 2990


def test_no_stagnant_classes_when_all_learn_or_the_total_does_not_fall() -> None:
    learning = StagnantClasses(StreamContext("k", PARAMS))
    assert learning.feed(ClassChunk(np.arange(300), class_matrix(stuck=()))) == []
    flat = StagnantClasses(StreamContext("k", PARAMS))
    assert flat.feed(ClassChunk(np.arange(300), np.ones((300, 4)))) == []
    assert flat.final() is None


def test_stagnant_classes_chunked_equals_one_shot() -> None:
    m = class_matrix(seed=3)
    one = StagnantClasses(StreamContext("k", PARAMS)).feed(ClassChunk(np.arange(300), m))
    stream = StagnantClasses(StreamContext("k", PARAMS))
    many = []
    for lo in range(0, 300, 37):
        many += stream.feed(ClassChunk(np.arange(lo, min(lo + 37, 300)), m[lo : lo + 37]))
    assert [(e.step, e.data) for e in many] == [(e.step, e.data) for e in one]


def test_observe_pivots_class_rows_and_names_them() -> None:
    m = class_matrix(rows=600)
    steps = np.repeat(np.arange(600), 8)
    table = pa.table(
        {
            "step": steps,
            "key": ["loss/cls"] * steps.size,
            "class_index": np.tile(np.arange(8, dtype=np.int32), 600),
            "value": m.ravel(),
            "wall_time": np.zeros(steps.size),
        }
    )
    analyzer = OnlineAnalyzer(builtin_detectors(), config={"analysis": {"stagnant_classes": PARAMS}}, strict=True)
    analyzer.set_class_names([f"n{i}" for i in range(8)])
    events = analyzer.observe(None, table.slice(0, 1000)) + analyzer.observe(None, table.slice(1000))
    (event,) = events
    assert event.data["names"] == ["n6", "n7"]
    row_steps, matrix = pivot_classes(np.array([5, 5, 7]), np.array([0, 2, 1]), np.array([1.0, 2.0, 3.0]))
    assert row_steps.tolist() == [5, 7] and np.isnan(matrix[0, 1]) and matrix[1, 1] == 3.0
    with pytest.raises(ConfigError, match="negative"):
        pivot_classes(np.array([1]), np.array([-1]), np.array([1.0]))


def series(fps: list[list[float]]) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    epochs = np.arange(len(fps[0]), dtype=float)
    return {r: (np.arange(len(f)) * 100, np.array(f), epochs) for r, f in enumerate(fps)}


def test_rank_disagreement_names_the_odd_ranks_once_per_grouping() -> None:
    detector = RankDisagreement(StreamContext("rng/fingerprint", {}))
    same = [[1.0, 2.0, 3.0, 4.0]] * 4
    assert detector.detect(series(same)) == []
    odd = [list(f) for f in same]
    odd[2][1:] = [9.0, 8.0, 7.0]
    (event,) = detector.detect(series(odd))
    assert event.step == 100 and event.data["ranks"] == [2] and event.data["reference_ranks"] == [0, 1, 3]
    assert event.data["epochs"] == [1, 2, 3]
    assert "ranks 2 drew a different RNG fingerprint from ranks 0, 1, 3" in event.message
    two = [list(f) for f in same]
    two[1][0] = two[3][0] = 5.0
    two[2][3] = 6.0
    events = detector.detect(series(two))
    assert [(e.step, e.data["ranks"]) for e in events] == [(0, [1, 3]), (300, [2])]


def test_a_rare_class_is_judged_where_it_occurs() -> None:
    """A class in one batch of 15 (0 elsewhere) whose loss falls 1000x while the others fall 1e5x lags; the
    same column with the others falling alike does not, and a class that is not there at all is not judged."""
    rng = np.random.default_rng(4)
    rows, t = 600, np.arange(600)[:, None]
    m = (1 + t / 5.0) ** -2.0 * rng.lognormal(0, 0.3, (rows, 6))
    rare = (1 + t[:, 0] / 5.0) ** -1.0 * rng.lognormal(0, 0.3, rows)
    present = rng.random(rows) < 1 / 15
    lagging = m.copy()
    lagging[:, 5] = np.where(present, rare, 0.0)
    (event,) = StagnantClasses(StreamContext("k", PARAMS)).feed(ClassChunk(np.arange(rows), lagging))
    assert event.data["classes"] == [5] and event.data["lag"][0] >= 30 and "lagging: class 5" in event.message
    alike = m.copy()
    alike[:, 5] = np.where(present, m[:, 5], 0.0)
    assert StagnantClasses(StreamContext("k", PARAMS)).feed(ClassChunk(np.arange(rows), alike)) == []
    absent = m.copy()
    absent[:, 5] = 0.0
    assert StagnantClasses(StreamContext("k", PARAMS)).feed(ClassChunk(np.arange(rows), absent)) == []


RANK_LOOP = """
import sys, numpy as np, tracker
project, mode = sys.argv[1], sys.argv[2]
run = tracker.init(project, system=False)
shared = np.random.default_rng(7).lognormal(0, 0.2, 60) * np.exp(-np.arange(60) / 30)
for step in range(60):
    own = float(np.random.default_rng([run.rank, step]).lognormal(0, 0.2)) * np.exp(-step / 30)
    value = own if mode == "shift" and step < 30 else float(shared[step])
    run.log({"train/loss": value, "lr": 0.01}, step=step)
run.finish()
"""


def _two_ranks(home: Path, tmp_path: Path, runs: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Start every (project, mode) run as two rank processes at once; returns name -> run id."""
    script = tmp_path / "rank_loop.py"
    script.write_text(RANK_LOOP)
    procs = []
    for name, (project, mode) in runs.items():
        env = {**os.environ, "TRACKER_HOME": str(home), "WORLD_SIZE": "2", "TRACKER_RUN_ID": f"ddp-{name}"}
        procs += [subprocess.Popen([sys.executable, str(script), project, mode], env={**env, "RANK": str(r)},
                                   stderr=subprocess.PIPE, text=True) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    return {name: f"ddp-{name}" for name in runs}


def test_identical_batches_reads_per_rank_losses_only(home: Path, tmp_path: Path) -> None:
    """Same batches on every rank: flagged once the key is shown to be per-rank (its ranks differ earlier in
    this run, or in a run of the project, or the setting says so); an all-reduced-looking key alone is not, nor
    a single rank. Before the ranks of ``shift`` converge (step 30) nothing is flagged."""
    ids = _two_ranks(home, tmp_path, {"shift": ("p1", "shift"), "same": ("p1", "same"), "alone": ("p2", "same")})

    def found(name: str, **overrides: Any) -> list[tuple[int, Any, Any]]:
        events = tracker.analyze(ids[name], home=home, **overrides).events
        return [(e.event.step, e.event.data["onset"], e.event.data["groups"]) for e in events
                if e.event.kind == "identical_batches"]

    assert found("same") == [(19, 0, [[0, 1]])]
    assert found("alone") == []
    assert found("alone", identical_batches={"per_rank": 1}) == [(19, 0, [[0, 1]])]
    assert found("shift") == [(49, 30, [[0, 1]])]
    event = next(e.event for e in tracker.analyze(ids["same"], home=home).events if e.event.kind == "identical_batches")
    assert "DistributedSampler" in event.message and "set_epoch" in event.message
    assert "differ in run ddp-shift" in event.data["evidence"]
    single = tracker.init("p1", system=False)
    for step in range(60):
        single.log({"train/loss": 1.0}, step=step)
    single.finish()
    assert [e for e in tracker.analyze(single.run_id, home=home).events if e.event.kind == "identical_batches"] == []
