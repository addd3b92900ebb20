"""The memory-growth detector's sequential rule: fast leaks within a minute, the limit it projects
against, the planned length from ``batches_per_epoch``, and chunking."""

from __future__ import annotations

import numpy as np
import pytest

from tracker.analysis.builtin import builtin_detectors
from tracker.analysis.online import OnlineAnalyzer
from tracker.analysis.system import planned_steps

GiB = float(1 << 30)
INTERVAL = 2.0  # the sampler's default
STEPS_PER_SAMPLE = 10


def _rss_run(samples: int, onset: int | None, per_second: float, *, level: float = 2 * GiB,
             available: float = 10 * GiB, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A process sampled every 2 s: a fill in the first samples, noise, an allocator step, and a leak."""
    rng = np.random.default_rng(seed)
    t = np.arange(samples)
    steps = (t + 1) * STEPS_PER_SAMPLE
    rss = level * np.minimum(1.0, 0.5 + t / 8) * np.exp(rng.normal(0, 0.003, samples))
    rss[samples // 3:] += 64e6  # one step of the allocator: not growth
    if onset is not None:
        rss += np.clip(t - onset, 0, None) * per_second * INTERVAL
    total = np.full(samples, 24 * GiB)
    used = total - available + (rss - rss[0])  # what this process takes is gone from the host too
    return {"sys/proc/rss": (steps, rss), "sys/host/mem_total": (steps, total), "sys/host/mem_used": (steps, used),
            "sys/step_time": (steps, np.full(samples, INTERVAL / STEPS_PER_SAMPLE))}


def _growth(series: dict, config: dict | None = None) -> list:
    analyzer = OnlineAnalyzer(builtin_detectors(), config=config or {}, strict=True)
    return [e for e in analyzer.feed_system(series) if e.kind == "memory_growth"]


def test_a_leak_minutes_from_the_limit_fires_within_a_minute() -> None:
    """1.1 GB in 45 s with 10 GB available: out of memory in about 7 minutes."""
    onset = 60
    (event,) = _growth(_rss_run(300, onset, 1.1e9 / 45), {"planned_steps": 300 * STEPS_PER_SAMPLE})
    waited = (event.step / STEPS_PER_SAMPLE - 1 - onset) * INTERVAL
    assert 0 < waited <= 60, waited
    assert event.severity == "error" and event.data["rule"] == "headroom"
    assert 4 <= event.data["minutes_to_limit"] <= 10, event.data
    assert "minutes" in event.message and "out-of-memory" in event.message


@pytest.mark.parametrize("seed", range(5))
def test_its_healthy_twin_gets_nothing(seed: int) -> None:
    assert _growth(_rss_run(300, None, 0.0, seed=seed), {"planned_steps": 3000}) == []


def test_a_slow_leak_far_from_the_limit_is_a_warning_on_its_level() -> None:
    """2 MB/s on a 2 GiB process with 10 GB free: hours from the limit, found by min_growth."""
    onset = 30
    (event,) = _growth(_rss_run(400, onset, 2e6), {"planned_steps": 4000})
    assert event.severity == "warning" and event.data["rule"] == "min_growth"
    assert event.data["window_samples"] >= 24  # long_window
    assert event.data["projected_step"] > 4000
    assert event.step / STEPS_PER_SAMPLE - onset <= 200  # under 7 minutes at 2 s


def test_the_process_limit_is_its_rss_plus_the_host_memory_available() -> None:
    (event,) = _growth(_rss_run(300, 60, 1.1e9 / 45, available=10 * GiB))
    # the rss at the event plus what the host still had then: 10 GiB above the first sample (1 GiB)
    assert event.data["limit_key"].startswith("sys/host/mem_total - sys/host/mem_used")
    assert event.data["limit"] == pytest.approx(1 * GiB + 10 * GiB, rel=0.01)
    without_used = {k: v for k, v in _rss_run(300, 60, 1.1e9 / 45).items() if k != "sys/host/mem_used"}
    (event,) = _growth(without_used)
    assert event.data["limit"] == 24 * GiB and event.data["limit_key"] == "sys/host/mem_total"


def test_the_gpu_limit_leaves_out_what_other_processes_hold() -> None:
    samples = 200
    steps = np.arange(1, samples + 1) * STEPS_PER_SAMPLE
    reserved = 20 * GiB + np.clip(np.arange(samples) - 40, 0, None) * 0.05 * GiB
    series = {"sys/gpu0/reserved": (steps, reserved), "sys/gpu0/total": (steps, np.full(samples, 80 * GiB)),
              "sys/gpu0/mem_used": (steps, reserved + 30 * GiB)}  # another process holds 30 GiB
    (event,) = _growth(series)
    assert event.data["limit"] == pytest.approx(50 * GiB)


def test_batches_per_epoch_gives_the_planned_length() -> None:
    assert planned_steps({"epochs": 3, "batches_per_epoch": 100}) == 300
    assert planned_steps({"epochs": 3, "steps_per_epoch": 50, "batches_per_epoch": 100}) == 150
    assert planned_steps({"epochs": 3, "batches_per_epoch": True}) is None
    series = _rss_run(300, 60, 1.1e9 / 45)
    (event,) = _growth(series, {"epochs": 30, "batches_per_epoch": 100})  # an Ultralytics run's config
    assert event.severity == "error" and event.data["planned_steps"] == 3000


@pytest.mark.parametrize("chunk", [1, 7, 50])
def test_same_event_whatever_the_chunking(chunk: int) -> None:
    series = _rss_run(300, 60, 1.1e9 / 45)
    whole = _growth(series)
    analyzer = OnlineAnalyzer(builtin_detectors(), strict=True)
    parts = []
    for lo in range(0, 300, chunk):
        parts.extend(analyzer.feed_system({k: (s[lo:lo + chunk], v[lo:lo + chunk]) for k, (s, v) in series.items()}))
    got = [e for e in parts if e.kind == "memory_growth"]
    assert [(e.step, e.message, e.severity) for e in got] == [(e.step, e.message, e.severity) for e in whole]
