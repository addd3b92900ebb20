"""The plugin author's test setup: tracker's pytest plugin, and a fresh store per test."""

from __future__ import annotations

from pathlib import Path

import pytest

# One conformance test per registered loss term and kernel (this plugin's and every
# other installed one's): test_tracker_loss_term[poly1_bce], test_tracker_kernel[poly1_bce/numpy], ...
pytest_plugins = ["tracker.testing.pytest_plugin"]


@pytest.fixture(autouse=True)
def tracker_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs of a test land in its own store."""
    home = tmp_path / "tracker-home"
    monkeypatch.setenv("TRACKER_HOME", str(home))
    return home
