"""The system sampler: settings, the sys/* rows it logs, step time, and logging from its thread."""

from __future__ import annotations

import threading
import time

import pytest

import tracker
from plugins.system import CudaSource, SystemSampler, sampler_for
from tracker.errors import ConfigError
from tracker.system import DEFAULT_INTERVAL_S, SystemOptions, system_options


def test_options_from_keyword_and_environment() -> None:
    assert system_options(None, {}) == SystemOptions(True, DEFAULT_INTERVAL_S)
    assert system_options(False, {}) == SystemOptions(False, DEFAULT_INTERVAL_S)
    assert system_options(None, {"TRACKER_SYSTEM": "0"}).enabled is False
    assert system_options(None, {"TRACKER_SYSTEM": "off"}).enabled is False
    assert system_options(None, {"TRACKER_SYSTEM_INTERVAL": "5"}) == SystemOptions(True, 5.0)
    assert system_options(0.5, {"TRACKER_SYSTEM": "0"}) == SystemOptions(True, 0.5)
    assert system_options(True, {"TRACKER_SYSTEM": "0"}).enabled is True
    with pytest.raises(ConfigError, match="TRACKER_SYSTEM_INTERVAL = 'fast'.*seconds >= "):
        system_options(None, {"TRACKER_SYSTEM_INTERVAL": "fast"})
    with pytest.raises(ConfigError, match="system = -1"):
        system_options(-1, {})
    with pytest.raises(ConfigError, match="TRACKER_SYSTEM='maybe'"):
        system_options(None, {"TRACKER_SYSTEM": "maybe"})


def test_bad_keyword_fails_init_before_anything_is_written(home) -> None:
    with pytest.raises(ConfigError, match="system = 'often'"):
        tracker.init("p", system="often")
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def _sys_rows(run_id: str):
    return tracker.query(
        "SELECT key, step, value FROM curves WHERE run_id = ? AND key LIKE 'sys/%' ORDER BY step, key", [run_id]
    )


def test_sampler_is_on_by_default_and_logs_sys_keys_at_the_current_step(monkeypatch) -> None:
    monkeypatch.delenv("TRACKER_SYSTEM")
    monkeypatch.setenv("TRACKER_SYSTEM_INTERVAL", "0.05")
    run = tracker.init("p")
    sampler = sampler_for(run)
    assert sampler is not None and sampler.interval == 0.05
    assert sampler._thread is not None and sampler._thread is not threading.current_thread()
    time.sleep(0.2)
    assert sampler.samples == 0  # nothing before the first step
    for step in range(40):
        run.log({"loss": 1.0}, step=step)
        time.sleep(0.01)
    run.finish()
    assert sampler_for(run) is None and not sampler._thread.is_alive()
    rows = _sys_rows(run.run_id)
    keys = set(rows["key"].to_list())
    assert {"sys/proc/rss", "sys/proc/cpu", "sys/host/mem_used", "sys/host/mem_total", "sys/host/cpu"} <= keys
    assert rows["step"].min() >= 0 and rows["step"].max() <= 39
    rss = rows.filter(rows["key"] == "sys/proc/rss")["value"]
    assert rss.min() > 10 << 20  # a Python process with numpy and duckdb loaded
    assert rss.len() == sampler.samples
    # the training thread's steps are untouched: every loss row is where it was logged
    loss = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'loss' ORDER BY step", [run.run_id])
    assert loss["step"].to_list() == list(range(40))


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_sampler_off(monkeypatch, how: str) -> None:
    monkeypatch.setenv("TRACKER_SYSTEM_INTERVAL", "0.05")
    if how == "keyword":
        monkeypatch.delenv("TRACKER_SYSTEM")
        run = tracker.init("p", system=False)
    else:
        run = tracker.init("p")
    assert sampler_for(run) is None
    for step in range(10):
        run.log({"loss": 1.0}, step=step)
        time.sleep(0.02)
    run.finish()
    assert _sys_rows(run.run_id).height == 0


def test_step_time_is_the_interval_over_the_steps_advanced() -> None:
    run = tracker.init("p", system=False)
    sampler = SystemSampler(run, 1.0, sources=[])
    assert sampler.sample() == {}  # no step yet
    run.log({"loss": 1.0}, step=0)
    assert "sys/step_time" not in sampler.sample()  # the first sample only starts the clock
    t0 = time.time()
    for step in range(1, 11):
        time.sleep(0.02)
        run.log({"loss": 1.0}, step=step)
    values = sampler.sample()
    elapsed = time.time() - t0
    assert values["sys/step_time"] == pytest.approx(elapsed / 10, rel=0.2)
    assert values["sys/step_time"] >= 0.02
    assert "sys/step_time" not in sampler.sample()  # no step since: no row
    run.finish()


def test_logging_from_the_sampler_thread_loses_nothing() -> None:
    run = tracker.init("p", system=False, config={"tracker_flush_interval": 0.01})
    sampler = SystemSampler(run, 0.001, sources=[lambda: {"sys/probe": 1.0}])
    run.log({"loss": 0.0}, step=0)
    sampler.start()
    steps = 30_000
    for step in range(1, steps):
        run.log({"loss": float(step)}, step=step)
    time.sleep(0.05)
    sampler.stop()
    run.finish()
    loss = tracker.query("SELECT step, value FROM curves WHERE run_id = ? AND key = 'loss' ORDER BY step",
                         [run.run_id])
    assert loss["step"].to_list() == list(range(steps))
    assert loss["value"].to_list() == [float(s) for s in range(steps)]
    probes = tracker.query("SELECT step FROM curves WHERE run_id = ? AND key = 'sys/probe'", [run.run_id])
    assert sampler.samples > 5 and probes.height == sampler.samples
    assert probes["step"].max() <= steps - 1


def test_a_failing_source_is_dropped_and_the_others_continue() -> None:
    run = tracker.init("p", system=False)
    run.log({"loss": 1.0}, step=0)

    def broken() -> dict[str, float]:
        raise OSError("sensor gone")

    sampler = SystemSampler(run, 1.0, sources=[broken, lambda: {"sys/ok": 2.0}])
    assert sampler.sample() == {"sys/ok": 2.0}
    assert len(sampler.sources) == 1
    run.finish()
    assert sampler.tick() is False  # a finished run takes no rows


def test_cuda_source_never_initialises_cuda() -> None:
    import torch
    source = CudaSource()
    if not torch.cuda.is_initialized():
        assert source() == {}
        assert not torch.cuda.is_initialized()
    else:  # a CUDA machine where an earlier test used the device
        values = source()
        assert all(k.startswith("sys/gpu") for k in values)
