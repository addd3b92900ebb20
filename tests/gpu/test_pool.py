"""Unit tests of the memory-pool policy (gpu.pool), its reference policies
(gpu.pool_sim) and the memory-pool benchmark, on a fake device."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu.errors import ClosedError, GpuError
from gpu.pool import Allocation, OutOfMemory, Pool, PoolError, PoolStats, size_class
from gpu.pool_sim import NaivePool, TorchCachingPool, torch_round_size, torch_segment_size

KiB = 1 << 10
MiB = 1 << 20
BENCH = Path(__file__).resolve().parents[2] / "bench" / "memory_pool.py"


class FakeDevice:
    """Hands out numbered handles, remembers what is live, can run out."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.live: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []
        self._ids = itertools.count(1)

    def allocate(self, nbytes: int) -> int:
        if self.capacity is not None and sum(self.live.values()) + nbytes > self.capacity:
            raise OutOfMemory(nbytes)
        handle = next(self._ids)
        self.live[handle] = nbytes
        self.calls.append(("allocate", nbytes))
        return handle

    def release(self, handle: int) -> None:
        assert handle in self.live, f"released unknown handle {handle}"
        self.calls.append(("release", self.live.pop(handle)))

    def pool(self, **kwargs: Any) -> Pool:
        return Pool(self.allocate, self.release, **kwargs)


@pytest.fixture
def device() -> FakeDevice:
    return FakeDevice()


def fixed_blocks(device: FakeDevice, block: int = 8 * MiB, **kwargs: Any) -> Pool:
    """A pool whose shared blocks are all ``block`` bytes, with small_limit 64 KiB."""
    options: dict[str, Any] = dict(block_size=block, max_block=block, granularity=block,
                                   small_limit=64 * KiB)
    options.update(kwargs)
    return device.pool(**options)


# size classes -------------------------------------------------------------

@pytest.mark.parametrize("alignment", [16, 256, 4096])
def test_size_classes_cover_the_request_with_bounded_rounding(alignment: int) -> None:
    sizes = sorted(set(range(1, 5000, 7)) | {1 << k for k in range(10, 21)})
    chunks = [size_class(n, alignment) for n in sizes]
    assert chunks == sorted(chunks), "classes grow with the request"
    for nbytes, chunk in zip(sizes, chunks):
        assert chunk >= nbytes and chunk % alignment == 0
        if nbytes > 4 * alignment:
            assert chunk - nbytes < chunk / 4


def test_size_classes_are_four_per_power_of_two() -> None:
    classes = sorted({size_class(n) for n in range(2049, 4097)})
    assert classes == [2560, 3072, 3584, 4096]


# small requests -----------------------------------------------------------

def test_small_requests_share_a_slab_carved_from_one_block(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    first, second = pool.alloc(1000), pool.alloc(900)
    assert first.block == second.block
    assert abs(first.offset - second.offset) == size_class(1000) == first.span
    assert pool.stats().device_allocations == 1


def test_different_classes_use_different_slabs(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    small, larger = pool.alloc(300), pool.alloc(3000)
    assert small.span == size_class(300) and larger.span == size_class(3000)
    assert not (small.offset <= larger.offset < small.offset + small.span)


def test_an_emptied_slab_goes_back_to_its_block(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    allocations = [pool.alloc(700) for _ in range(10)]
    for allocation in allocations:
        pool.free(allocation)
    (block,) = pool.blocks()
    assert block.used == 0 and block.free_extents == ((0, block.size),)


# large requests: split, best fit, coalesce -----------------------------------

def test_a_large_request_splits_the_front_of_a_free_extent(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    allocation = pool.alloc(3 * MiB)
    (block,) = pool.blocks()
    assert allocation.offset == 0
    assert block.free_extents == ((3 * MiB, 5 * MiB),)
    assert block.used == 3 * MiB


def _layout(pool: Pool, sizes: list[int]) -> list[Allocation]:
    return [pool.alloc(size) for size in sizes]


def test_best_fit_takes_the_smallest_hole_that_fits(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    a, big_hole, b, small_hole, c = _layout(pool, [MiB, 3 * MiB, MiB, 2 * MiB, MiB])
    pool.free(big_hole)
    pool.free(small_hole)
    assert pool.alloc(2 * MiB).offset == small_hole.offset
    assert pool.alloc(3 * MiB).offset == big_hole.offset
    assert pool.stats().device_allocations == 1


def test_a_request_no_hole_fits_goes_to_a_new_block(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    first, middle, last = _layout(pool, [3 * MiB, 2 * MiB, 3 * MiB])
    pool.free(middle)
    third = pool.alloc(3 * MiB)
    assert third.block != first.block and third.offset == 0
    assert pool.stats().device_allocations == 2


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_freed_neighbours_coalesce_in_any_order(device: FakeDevice, order: tuple[int, ...]) -> None:
    pool = fixed_blocks(device)
    allocations = _layout(pool, [MiB, 2 * MiB, 3 * MiB])
    keep = pool.alloc(MiB)
    for i in order:
        pool.free(allocations[i])
    block = next(b for b in pool.blocks() if b.id == keep.block)
    assert block.free_extents == ((0, 6 * MiB), (7 * MiB, MiB))
    pool.free(keep)
    assert pool.blocks()[0].free_extents == ((0, 8 * MiB),)


def test_fragmentation_is_one_minus_largest_over_total_free(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    a, b, c, d = _layout(pool, [2 * MiB, MiB, 2 * MiB, MiB])
    pool.free(a)
    pool.free(c)
    assert pool.stats().fragmentation == pytest.approx(1 - 2 / 6)
    pool.free(b)
    assert pool.stats().fragmentation == pytest.approx(1 - 5 / 7)
    pool.free(d)
    assert pool.stats().fragmentation == 0.0


# alignment ------------------------------------------------------------------

def test_offsets_honour_the_pool_and_the_requested_alignment(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    odd = pool.alloc(100 * KiB + 3)
    assert odd.offset % 256 == 0
    aligned = pool.alloc(200 * KiB, alignment=64 * KiB)
    assert aligned.offset % (64 * KiB) == 0 and aligned.offset >= odd.offset + odd.span
    block = pool.blocks()[0]
    pad = (odd.offset + odd.span, aligned.offset - odd.offset - odd.span)
    assert pad in block.free_extents


def test_a_small_request_with_a_large_alignment_is_aligned(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    pool.alloc(300)
    allocation = pool.alloc(300, alignment=8 * KiB)
    assert allocation.offset % (8 * KiB) == 0


def test_an_alignment_below_the_pool_minimum_is_raised_to_it(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    allocations = [pool.alloc(100 * KiB + 1, alignment=4) for _ in range(3)]
    assert all(a.offset % 256 == 0 for a in allocations)


# block sizing and dedicated allocations --------------------------------------

def test_new_blocks_grow_with_the_pool(device: FakeDevice) -> None:
    pool = device.pool()
    pool.alloc(40 * MiB)
    pool.alloc(3 * MiB)
    sizes = [size for kind, size in device.calls if kind == "allocate"]
    assert sizes == [40 * MiB, 10 * MiB], "second block: a quarter of the 40 MiB held"
    for _ in range(20):
        pool.alloc(30 * MiB)
    assert max(b.size for b in pool.blocks()) == pool.block_size


def test_a_request_above_block_size_gets_a_shared_block_that_fits_it(device: FakeDevice) -> None:
    pool = device.pool()
    big = pool.alloc(100 * MiB)
    (block,) = pool.blocks()
    assert not block.dedicated and block.size == 100 * MiB
    pool.free(big)
    halves = [pool.alloc(50 * MiB), pool.alloc(50 * MiB)]
    assert {a.block for a in halves} == {block.id}
    assert pool.stats().device_allocations == 1


def test_a_request_above_max_block_is_dedicated_and_cached(device: FakeDevice) -> None:
    pool = fixed_blocks(device, block=4 * MiB, granularity=MiB)
    huge = pool.alloc(10 * MiB)
    (block,) = pool.blocks()
    assert block.dedicated and huge.offset == 0 and block.size >= 10 * MiB
    pool.free(huge)
    assert pool.stats().bytes_reserved == block.size
    again = pool.alloc(10 * MiB - 512 * KiB)
    assert again.block == block.id and pool.stats().device_allocations == 1
    pool.free(again)
    smaller = pool.alloc(5 * MiB)
    assert smaller.block != block.id and pool.stats().device_allocations == 2


def test_shared_blocks_never_exceed_max_block(device: FakeDevice) -> None:
    pool = device.pool(block_size=4 * MiB, max_block=8 * MiB, granularity=4 * MiB,
                       small_limit=64 * KiB)
    for size in (7 * MiB, 8 * MiB, 3 * MiB, 8 * MiB - 256):
        pool.alloc(size)
    assert all(b.size <= 8 * MiB for b in pool.blocks() if not b.dedicated)
    assert pool.alloc(8 * MiB + 256).offset == 0
    assert pool.blocks()[-1].dedicated


def test_max_block_defaults_to_the_vulkan_binding_minimum(device: FakeDevice) -> None:
    assert device.pool().max_block == 128 * MiB
    assert device.pool(block_size=256 * MiB).max_block == 256 * MiB
    assert device.pool(max_block=4 << 30).max_block == 4 << 30


# trim, stats, close ------------------------------------------------------------

def test_trim_gives_back_idle_blocks_only(device: FakeDevice) -> None:
    pool = fixed_blocks(device, block=4 * MiB)
    kept = pool.alloc(3 * MiB)
    gone = [pool.alloc(3 * MiB), pool.alloc(10 * MiB)]
    for allocation in gone:
        pool.free(allocation)
    idle = sum(b.size for b in pool.blocks() if b.id != kept.block)
    assert pool.trim() == idle > 0
    assert [b.id for b in pool.blocks()] == [kept.block]
    assert pool.stats().bytes_reserved == sum(device.live.values()) == 4 * MiB
    assert pool.trim() == 0


def test_stats_track_live_reserved_and_peaks(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    a, b = pool.alloc(3 * MiB + 5), pool.alloc(700)
    stats = pool.stats()
    assert stats.bytes_live == 3 * MiB + 5 + 700 and stats.live_allocations == 2
    assert stats.bytes_reserved == stats.peak_reserved == sum(device.live.values())
    pool.free(a)
    stats = pool.stats()
    assert stats.bytes_live == 700 and stats.peak_live == 3 * MiB + 705
    pool.reset_peaks()
    assert pool.stats().peak_live == 700
    pool.free(b)
    pool.trim()
    stats = pool.stats()
    assert stats.bytes_reserved == 0 and stats.peak_reserved == 8 * MiB
    assert stats.device_allocations == stats.device_frees == 1


def test_stats_as_dict_is_flat_and_complete(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    pool.alloc(MiB)
    figures = pool.stats().as_dict()
    assert set(figures) == {f.name for f in dataclasses.fields(PoolStats)}
    assert all(isinstance(v, (int, float)) for v in figures.values())
    assert figures["bytes_live"] == MiB


def test_close_releases_everything_once_and_is_idempotent(device: FakeDevice) -> None:
    with fixed_blocks(device) as pool:
        live = pool.alloc(MiB)
        pool.alloc(20 * MiB)
    assert pool.closed and device.live == {}
    released = len(device.calls)
    pool.close()
    pool.free(live)
    assert len(device.calls) == released and pool.trim() == 0
    with pytest.raises(ClosedError, match="closed"):
        pool.alloc(1)


# errors ------------------------------------------------------------------------

@pytest.mark.parametrize("nbytes", [0, -1, 1.5, True, "8"])
def test_bad_sizes_are_refused(device: FakeDevice, nbytes: Any) -> None:
    with pytest.raises(PoolError, match="positive int"):
        device.pool().alloc(nbytes)


@pytest.mark.parametrize("alignment", [0, 3, 96, -256])
def test_bad_alignments_are_refused(device: FakeDevice, alignment: int) -> None:
    with pytest.raises(PoolError, match="power of two"):
        device.pool().alloc(64, alignment=alignment)


@pytest.mark.parametrize("options", [
    {"alignment": 384}, {"block_size": 0}, {"small_limit": 40 * MiB},
    {"block_size": 256 * MiB, "max_block": 128 * MiB}, {"max_block": 100 * MiB + 1},
    {"limit": -1},
])
def test_bad_pool_options_are_refused(device: FakeDevice, options: dict[str, int]) -> None:
    with pytest.raises(PoolError):
        device.pool(**options)


def test_double_free_is_refused_with_a_clear_message(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    allocation = pool.alloc(2 * MiB)
    pool.free(allocation)
    with pytest.raises(PoolError, match="freed already or belongs to another pool"):
        pool.free(allocation)
    small = pool.alloc(100)
    pool.free(small)
    with pytest.raises(PoolError):
        pool.free(small)


def test_a_stale_allocation_cannot_free_its_successor(device: FakeDevice) -> None:
    pool = fixed_blocks(device)
    stale = pool.alloc(2 * MiB)
    pool.free(stale)
    successor = pool.alloc(2 * MiB)
    assert (successor.block, successor.offset) == (stale.block, stale.offset)
    with pytest.raises(PoolError, match="freed already"):
        pool.free(stale)
    assert pool.stats().bytes_live == 2 * MiB
    pool.free(successor)


def test_a_foreign_allocation_is_refused(device: FakeDevice) -> None:
    mine, theirs = fixed_blocks(device), fixed_blocks(device)
    mine.alloc(MiB)
    foreign = theirs.alloc(MiB)
    with pytest.raises(PoolError, match="another pool"):
        mine.free(foreign)
    assert mine.stats().bytes_live == MiB


def test_allocations_are_frozen_records(device: FakeDevice) -> None:
    allocation = device.pool().alloc(MiB)
    with pytest.raises(dataclasses.FrozenInstanceError):
        allocation.offset = 4096  # type: ignore[misc]


def test_the_limit_raises_out_of_memory_with_the_size(device: FakeDevice) -> None:
    pool = fixed_blocks(device, block=4 * MiB, limit=8 * MiB)
    pool.alloc(3 * MiB)
    pool.alloc(3 * MiB)
    with pytest.raises(OutOfMemory) as caught:
        pool.alloc(3 * MiB)
    assert caught.value.size_hint == 4 * MiB and isinstance(caught.value, GpuError)
    assert "limit" in str(caught.value)
    assert pool.stats().bytes_reserved == 8 * MiB


def test_out_of_memory_gives_back_idle_blocks_and_retries() -> None:
    device = FakeDevice(capacity=24 * MiB)
    pool = device.pool(block_size=8 * MiB, max_block=8 * MiB, small_limit=64 * KiB)
    pool.free(pool.alloc(20 * MiB))
    assert pool.stats().bytes_reserved == 20 * MiB
    big = pool.alloc(22 * MiB)
    assert big.offset == 0 and device.live == {big.handle: 22 * MiB}
    assert pool.stats().device_frees == 1


def test_out_of_memory_when_nothing_can_be_given_back() -> None:
    device = FakeDevice(capacity=8 * MiB)
    pool = device.pool(block_size=8 * MiB, max_block=8 * MiB, granularity=8 * MiB,
                       small_limit=64 * KiB)
    pool.alloc(5 * MiB)
    pool.alloc(3 * MiB)
    with pytest.raises(OutOfMemory):
        pool.alloc(MiB)
    assert pool.stats().bytes_live == 8 * MiB


def test_other_device_errors_propagate() -> None:
    def broken(nbytes: int) -> Any:
        raise RuntimeError("driver lost")

    with pytest.raises(RuntimeError, match="driver lost"):
        Pool(broken, lambda handle: None).alloc(MiB)


# reference policies ---------------------------------------------------------------

def test_naive_pool_reuses_exact_sizes_only() -> None:
    naive = NaivePool()
    naive.free(naive.alloc(1000))
    naive.alloc(1000)
    assert naive.stats().device_allocations == 1
    naive.free(naive.alloc(999))
    assert naive.stats().device_allocations == 2
    assert naive.stats().bytes_reserved == 1999


@pytest.mark.parametrize("nbytes, rounded, segment", [
    (1, 512, 2 * MiB), (513, 1024, 2 * MiB), (MiB, MiB, 2 * MiB),
    (MiB + 1, MiB + 512, 20 * MiB), (10 * MiB - 513, 10 * MiB - 512, 20 * MiB),
    (10 * MiB - 1, 10 * MiB, 10 * MiB),
    (10 * MiB + 1, 10 * MiB + 512, 12 * MiB),
])
def test_torch_policy_rounding(nbytes: int, rounded: int, segment: int) -> None:
    assert torch_round_size(nbytes) == rounded
    assert torch_segment_size(rounded) == segment


def test_torch_policy_splits_segments_and_merges_within_them() -> None:
    torch = TorchCachingPool()
    first, second = torch.alloc(5 * MiB), torch.alloc(5 * MiB)
    assert torch.stats().device_allocations == 1 and first[0] == second[0]
    torch.free(first)
    torch.free(second)
    torch.alloc(19 * MiB)
    assert torch.stats().device_allocations == 1
    torch.alloc(15 * MiB)
    assert torch.stats().bytes_reserved == 20 * MiB + 16 * MiB


def test_torch_policy_keeps_small_and_large_pools_apart() -> None:
    torch = TorchCachingPool()
    torch.free(torch.alloc(3 * MiB))
    torch.alloc(1000)
    assert torch.stats().device_allocations == 2
    assert torch.stats().bytes_reserved == 22 * MiB


# benchmark ---------------------------------------------------------------------------

def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_memory_pool", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_benchmark_trace_is_seeded_and_balanced() -> None:
    bench = _bench()
    trace = bench.build_trace(steps=5, batch=4, seed=3)
    assert trace == bench.build_trace(steps=5, batch=4, seed=3)
    assert trace != bench.build_trace(steps=5, batch=4, seed=4)
    allocated = {tid for tid, size in trace if size}
    freed = [tid for tid, size in trace if not size]
    assert sorted(freed) == sorted(allocated)


def test_benchmark_prints_one_row_per_pool(capsys: pytest.CaptureFixture[str]) -> None:
    assert _bench().main(["--steps", "20", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    for name in ("gpu.pool.Pool", "PyTorch caching policy", "naive exact-size"):
        assert name in out
    assert "peak reserved / peak live" in out


def test_pool_beats_the_naive_policy_on_a_short_trace() -> None:
    bench = _bench()
    ours, torch, naive = bench.run(bench.build_trace(steps=60, batch=16, seed=1))
    assert ours.stats.peak_live == torch.stats.peak_live == naive.stats.peak_live
    assert ours.ratio < naive.ratio
    assert ours.stats.device_allocations < naive.stats.device_allocations

