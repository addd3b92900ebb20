"""A plain PyTorch-style loop with two ranks that calls ``run.flush()`` before each
checkpoint, killed with SIGKILL right after a save 20 times and resumed from the
checkpoint each time: after every round each rank's curve holds every step before the
checkpoint, with no gap and no duplicate. Without the barrier the same kills lose rows."""

from __future__ import annotations

from pathlib import Path

from tests.harness.ckpt_kill import EVERY, plain_rounds


def test_twenty_kills_right_after_a_checkpoint_lose_nothing_before_it(home: Path, tmp_path: Path) -> None:
    report = plain_rounds(tmp_path / "loop", home, 20, world=2, seed=7)
    assert report.problems == []
    assert report.rounds == 20
    checkpoints = report.checkpoints
    assert checkpoints == sorted(checkpoints) and len(set(checkpoints)) == 20  # every round saved and moved on
    assert all(c % EVERY == 0 for c in checkpoints)
    assert report.final_steps == checkpoints[-1] + 2 * EVERY


def test_without_the_barrier_a_kill_after_the_checkpoint_loses_rows(home: Path, tmp_path: Path) -> None:
    report = plain_rounds(tmp_path / "loop", home, 1, world=1, seed=7, barrier=False, flush_interval_s=60)
    assert report.rounds == 1
    assert any("rows logged before it were lost" in p for p in report.problems), report.problems
