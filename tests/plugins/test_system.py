"""The system sampler: settings, the sys/* rows it logs, step time, and logging from its thread."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import tracker
from plugins.system import CudaSource, SystemSampler, log_pool_replay, sampler_for, vulkan_pool_source
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
    # a sample that races with finish() (logged after its last flush) is the only one that may be lost
    assert sampler.samples - 1 <= rss.len() <= sampler.samples and rss.len() >= 2
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


def _trace(count: int, seed: int) -> list[list[tuple[int, int]]]:
    """Training steps whose tensors are sized by the data (0-60 boxes per image x 8400 anchors)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        events: list[tuple[int, int]] = [(i, 6 << 20) for i in range(8)]
        kept, tid = list(range(8)), 8
        for boxes in rng.integers(0, 61, size=16).tolist():
            if boxes:
                events += [(tid, boxes * 8400 * 4), (tid + 1, boxes * 8400 * 12), (tid, 0)]
                kept.append(tid + 1)
                tid += 2
        out.append(events + [(t, 0) for t in reversed(kept)])
    return out


def test_simulated_trace_logged_as_runs_shows_the_pools_apart() -> None:
    from gpu.pool import Pool
    from gpu.pool_sim import NaivePool, TorchCachingPool

    handles = iter(range(1, 1 << 40))
    trace = _trace(300, seed=0)
    runs = {}
    for name, pool in (("ours", Pool(lambda n: next(handles), lambda h: None)),
                       ("torch-like", TorchCachingPool()), ("exact-size", NaivePool())):
        run = tracker.init("pool-trace", name=name, system=False)
        assert log_pool_replay(run, trace, pool) == 300
        run.finish()
        runs[name] = run.run_id
    final = tracker.query(
        "SELECT run_id, max_by(value, step) AS reserved FROM curves WHERE key = 'sys/pool/reserved' GROUP BY run_id"
    )
    reserved = dict(zip(final["run_id"].to_list(), final["reserved"].to_list()))
    live = tracker.query("SELECT max(value) AS v FROM curves WHERE key = 'sys/pool/live' AND run_id = ?",
                         [runs["ours"]])["v"][0]
    assert reserved[runs["ours"]] <= 1.3 * live < reserved[runs["exact-size"]] / 2
    events = tracker.query("SELECT run_id, kind FROM events WHERE kind = 'fragmentation'")
    assert set(events["run_id"].to_list()) == {runs["exact-size"]}


@pytest.mark.gpu
def test_vulkan_pool_figures_are_sampled_while_the_backend_is_live() -> None:
    import plugins.vulkan_exec as vulkan

    vulkan.close()
    assert vulkan_pool_source() == {}  # never opens a device
    dev = vulkan.device()
    try:
        allocation = dev.pools["device"].alloc(3 << 20)
        values = vulkan_pool_source()
        assert values["sys/pool/live"] == 3 << 20
        assert values["sys/pool/reserved"] >= 3 << 20 and values["sys/pool/allocations"] >= 1
        assert values["sys/pool/live_allocations"] == 1
        assert "sys/pool/limit" not in values and "sys/pool/peak_reserved" not in values  # no cap on this pool
        dev.pools["device"].free(allocation)
        assert vulkan_pool_source()["sys/pool/live"] == 0
    finally:
        vulkan.close()


def test_a_capped_pool_logs_its_limit() -> None:
    from gpu.pool import Pool

    handles = iter(range(1, 1 << 40))
    run = tracker.init("pool-trace", system=False)
    pool = Pool(lambda n: next(handles), lambda h: None, block_size=8 << 20, limit=512 << 20)
    log_pool_replay(run, _trace(3, seed=1), pool)
    run.finish()
    limits = tracker.query("SELECT value FROM curves WHERE run_id = ? AND key = 'sys/pool/limit'", [run.run_id])
    assert limits["value"].to_list() == [float(512 << 20)] * 3
