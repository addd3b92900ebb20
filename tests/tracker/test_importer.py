"""tracker.importer: the resume rule over imported points, idempotency, all-or-nothing writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tracker
from tracker.errors import DataError
from tracker.importer import SourceRun, assign_segments, import_runs, make_run_id, points_table


def segs(steps: list[int], keys: list[int]) -> tuple[list[int], list[int]]:
    seg, starts = assign_segments(np.asarray(steps, np.int64), np.asarray(keys, np.int64))
    return seg.tolist(), starts


def test_resume_rule() -> None:
    assert segs([0, 1, 2], [0, 0, 0]) == ([0, 0, 0], [0])
    # a key repeating a step restarts; the other key's first repeat joins the same segment
    assert segs([0, 0, 1, 1, 1, 1, 2], [0, 1, 0, 1, 0, 1, 0]) == ([0, 0, 0, 0, 1, 1, 1], [0, 1])
    # two rows at one step with different keys (a CSV logger flushing mid-step) are no restart
    assert segs([5, 5, 6], [0, 1, 0]) == ([0, 0, 0], [5])
    # restarts at earlier and earlier steps
    assert segs([0, 1, 2, 3, 1, 2, 0], [0] * 7) == ([0, 0, 0, 0, 1, 1, 2], [0, 1, 0])


def ramp(n: int, run_id: str = "ramp-1", values: float = 0.0) -> SourceRun:
    return SourceRun(kind="test", source="ramp", run_id=run_id, name="r", project="p",
                     points=points_table(np.arange(n), ["loss"] * n, np.arange(n) + values, np.arange(n) + 1e9))


def test_interrupted_import_leaves_nothing(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tracker.importer as imp

    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patch, pytest.raises(KeyboardInterrupt):
        patch.setattr(imp.os, "rename", interrupted)
        import_runs([ramp(10)], home)
    assert not (home / "runs" / "ramp-1").exists()
    assert not any((home / imp.STAGING).iterdir())
    stale = home / imp.STAGING / "ramp-1.999999999"  # left by a process that died
    stale.mkdir()
    assert [p.action for p in import_runs([ramp(10)], home)] == ["new"]
    assert not stale.exists()
    assert tracker.query("SELECT count(*) AS n FROM curves")["n"][0] == 10


def test_a_source_that_changed_otherwise_than_growing_is_refused(home: Path) -> None:
    import_runs([ramp(10)], home)
    assert [p.action for p in import_runs([ramp(10)], home)] == ["unchanged"]
    assert [(p.action, p.new_points) for p in import_runs([ramp(15)], home)] == [("add", 5)]
    with pytest.raises(DataError, match=r"tracker runs rm ramp-1"):
        import_runs([ramp(12)], home)  # shrank
    with pytest.raises(DataError, match="two sources map to the same run id"):
        import_runs([ramp(3), ramp(4)], home)
    assert tracker.query("SELECT count(*) AS n FROM metrics")["n"][0] == 15


def test_run_ids_are_deterministic_and_valid() -> None:
    a = make_run_id("tb", "train/exp 1 (copy)", "/logs", "train/exp 1 (copy)")
    assert a == make_run_id("tb", "train/exp 1 (copy)", "/logs", "train/exp 1 (copy)")
    assert a != make_run_id("tb", "train/exp 1 (copy)", "/other", "train/exp 1 (copy)")
    assert a.startswith("tb-train-exp-1-copy-")
