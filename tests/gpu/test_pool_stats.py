"""The pool's public statistics (gpu.pool.memory_stats) and step-by-step replays of a training trace."""

from __future__ import annotations

import itertools
import threading

import numpy as np

from gpu.pool import MemoryStats, Pool, memory_stats
from gpu.pool_sim import NaivePool, TorchCachingPool, replay_steps

MiB = 1 << 20


def _pool(limit: int | None = None) -> tuple[Pool, dict[int, int]]:
    ids = itertools.count(1)
    held: dict[int, int] = {}

    def allocate(nbytes: int) -> int:
        handle = next(ids)
        held[handle] = nbytes
        return handle

    return Pool(allocate, lambda h: held.pop(h), block_size=8 * MiB, limit=limit), held


def test_memory_stats_match_the_pool_figures() -> None:
    pool, held = _pool(limit=512 * MiB)
    allocs = [pool.alloc(size) for size in (100, 3 * MiB, 5 * MiB, 20 * MiB, 700)]
    pool.free(allocs[1])
    pool.free(allocs[3])
    stats, mem = pool.stats(), memory_stats(pool)
    assert isinstance(mem, MemoryStats)
    assert (mem.reserved, mem.live, mem.peak_live, mem.peak_reserved) == (
        stats.bytes_reserved, stats.bytes_live, stats.peak_live, stats.peak_reserved)
    assert mem.reserved == sum(held.values())
    assert mem.live == 100 + 5 * MiB + 700 and mem.peak_live == mem.live + 23 * MiB
    assert (mem.allocations, mem.frees, mem.live_allocations) == (
        stats.device_allocations, stats.device_frees, stats.live_allocations)
    assert mem.live_allocations == 3 and mem.limit == 512 * MiB
    pool.trim()
    after = memory_stats(pool)
    assert after.frees > 0 and after.reserved == sum(held.values()) < mem.reserved
    assert set(after.as_dict()) == {"reserved", "live", "peak_live", "peak_reserved", "allocations", "frees",
                                    "live_allocations", "limit"}


def test_memory_stats_can_be_read_from_another_thread_while_the_owner_allocates() -> None:
    pool, _ = _pool()
    seen: list[MemoryStats] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def monitor() -> None:
        try:
            while not stop.is_set():
                seen.append(memory_stats(pool))
        except BaseException as exc:  # pragma: no cover - the failure the test looks for
            errors.append(exc)

    thread = threading.Thread(target=monitor)
    thread.start()
    rng = np.random.default_rng(0)
    live = []
    for size in rng.integers(1, 4 * MiB, 20_000).tolist():
        live.append(pool.alloc(size))
        if len(live) > 50:
            pool.free(live.pop(int(rng.integers(0, len(live)))))
    stop.set()
    thread.join()
    assert not errors and len(seen) > 10
    assert all(s.live >= 0 and s.reserved >= 0 and s.peak_live >= s.live for s in seen)


def _steps(count: int, seed: int) -> list[list[tuple[int, int]]]:
    """Steps whose tensors are sized by the data (0-60 boxes per image x 8400 anchors)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        events: list[tuple[int, int]] = [(i, 6 * MiB) for i in range(8)]
        tid = 8
        kept = list(range(8))
        for boxes in rng.integers(0, 61, size=16).tolist():
            if boxes:
                events += [(tid, boxes * 8400 * 4), (tid + 1, boxes * 8400 * 12), (tid, 0)]
                kept.append(tid + 1)
                tid += 2
        events += [(t, 0) for t in reversed(kept)]
        out.append(events)
    return out


def _peak(events: list[tuple[int, int]]) -> int:
    live, now, top = {}, 0, 0
    for tid, nbytes in events:
        if nbytes:
            live[tid] = nbytes
            now += nbytes
            top = max(top, now)
        else:
            now -= live.pop(tid)
    return top


def test_replay_steps_yields_each_step_with_its_peak_live() -> None:
    steps = _steps(40, seed=1)
    pool, _ = _pool()
    figures = list(replay_steps(steps, pool))
    assert len(figures) == 40
    assert [f.live for f in figures] == [_peak(s) for s in steps]
    assert all(f.live_allocations == 0 for f in figures)  # every step frees what it took
    assert figures[-1].peak_live == max(f.live for f in figures)


def test_replay_keeps_a_leaking_step_live() -> None:
    steps = [[(0, MiB), (1, 2 * MiB), (1, 0)] for _ in range(5)]  # id 0 is never freed
    figures = list(replay_steps(steps, NaivePool()))
    assert [f.live_allocations for f in figures] == [1, 2, 3, 4, 5]
    assert figures[-1].live == 5 * MiB + 2 * MiB


def test_variable_lengths_bloat_an_exact_size_cache_not_our_pool() -> None:
    steps = _steps(150, seed=0)
    ours, _ = _pool()
    final = {name: list(replay_steps(steps, pool))[-1]
             for name, pool in (("ours", ours), ("torch", TorchCachingPool()), ("naive", NaivePool()))}
    peak = max(_peak(s) for s in steps)
    assert all(f.peak_live == peak for f in final.values())
    assert final["ours"].reserved <= 1.3 * peak
    assert final["naive"].reserved > 2 * final["ours"].reserved
    assert final["torch"].reserved >= peak
