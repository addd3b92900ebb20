"""Stagnant classes and rank disagreement, on hand-made inputs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

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
