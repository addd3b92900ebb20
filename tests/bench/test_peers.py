"""The peers benchmark's own code, on a tiny workload and ours alone (the full run takes minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench import peers


def test_one_run_of_ours_in_a_child_process() -> None:
    result = peers.run_peer(sys.executable, "tracker", keys=3, steps=300, timeout=120)
    assert "error" not in result, result
    assert result["points"] == result["points_logged"] == 900  # every point queryable
    assert result["read_points"] == 300  # one key, every step
    assert result["us_per_point"] > 0 and result["disk_bytes"] > 0
    assert 0 <= result["durable_s"] <= result["queryable_s"]


def test_the_table_of_a_tiny_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    peers.main(["--peers", "tracker", "--steps", "200", "--keys", "2", "--rounds", "2", "--cache", str(tmp_path)])
    out = capsys.readouterr()
    assert out.err.count("tracker:") == 2  # two rounds
    lines = out.out.splitlines()
    assert lines[0].startswith("400 points (2 keys x 200 steps), median of 2 round(s)")
    ours = lines[2].split()
    assert ours[0] == "tracker" and ours[-2:] == ["1.0", "1.0"]  # ours against ours
    assert all(float(c) >= 0 for c in ours[1:6])


def test_ratios_and_peers_that_could_not_run() -> None:
    def run(us: float, read: float) -> dict[str, float]:
        return {"us_per_point": us, "durable_s": 1.0, "queryable_s": 1.0, "disk_mb": 1.0, "read_s": read}

    outcomes = [
        peers.Outcome("tracker", [run(1.0, 0.01), run(3.0, 0.03)]),  # medians 2.0 and 0.02
        peers.Outcome("mlflow", [run(50.0, 1.0)]),
        peers.Outcome("aim", error="pip install aim==3.29.1 failed"),
    ]
    text = peers.table(outcomes, keys=1, steps=10, rounds=2)
    mlflow = next(ln for ln in text.splitlines() if ln.startswith("mlflow")).split()
    assert mlflow[-2:] == ["25.0", "50.0"]
    assert "aim" in text and "not measured: pip install aim==3.29.1 failed" in text


def test_unknown_peer_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        peers.main(["--peers", "tracker,comet"])
    assert "unknown peer(s) comet" in capsys.readouterr().err
