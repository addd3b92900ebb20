"""kill -9 at random moments (while starting, resuming, logging and ingesting), then
resume: no duplicate, no gap, nothing durable lost. ``bench/chaos.py`` runs many more."""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.chaos import run_rounds


def test_random_kills_during_start_resume_logging_and_ingestion(home: Path) -> None:
    rounds = int(os.environ.get("TRACKER_CHAOS_ROUNDS", "8"))
    report = run_rounds(home, rounds, seed=13, max_kill_s=1.0, then_steps=500)
    assert report.rounds == rounds
    assert report.killed_while_logging >= 1  # the seed puts kills in every phase
    assert report.killed_before_init >= 1
    assert report.ingester_kills >= 1
    assert report.waited_for_flush >= 1  # some kills have durable rows behind them
    assert report.final_steps > 500
    durable = report.durable_steps
    assert durable == sorted(durable) and durable[-1] > 0
