"""Property tests of the memory pool: random alloc/free/trim sequences on a fake
device keep every invariant of the policy (gpu.pool)."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from gpu.pool import Allocation, OutOfMemory, Pool

KiB = 1 << 10
BLOCK = 64 * KiB
MAX_BLOCK = 128 * KiB
SMALL = 4 * KiB

sizes = st.one_of(
    st.integers(1, SMALL),
    st.integers(SMALL + 1, BLOCK),
    st.integers(BLOCK + 1, MAX_BLOCK),
    st.integers(MAX_BLOCK + 1, 3 * MAX_BLOCK),
)
alignments = st.one_of(st.none(), st.sampled_from([1, 64, 256, 1024, 8 * KiB]))


class FakeDevice:
    """Numbered handles with their sizes; refuses past an optional capacity."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity
        self.live: dict[int, int] = {}
        self.ids = itertools.count(1)

    def allocate(self, nbytes: int) -> int:
        if self.capacity is not None and sum(self.live.values()) + nbytes > self.capacity:
            raise OutOfMemory(nbytes)
        handle = next(self.ids)
        self.live[handle] = nbytes
        return handle

    def release(self, handle: int) -> None:
        assert handle in self.live
        del self.live[handle]


def check_pool(pool: Pool, device: FakeDevice, live: list[tuple[Allocation, int]]) -> None:
    """Every invariant of a pool holding exactly ``live`` (allocation, alignment)."""
    blocks = {b.id: b for b in pool.blocks()}
    assert pool.stats().bytes_reserved == sum(device.live.values()) == sum(
        b.size for b in blocks.values()
    )
    spans: dict[int, list[tuple[int, int]]] = {bid: [] for bid in blocks}
    for allocation, alignment in live:
        block = blocks[allocation.block]
        assert allocation.offset % alignment == 0
        assert allocation.offset % pool.alignment == 0
        assert allocation.size <= allocation.span
        assert 0 <= allocation.offset and allocation.offset + allocation.span <= block.size
        assert device.live[allocation.handle] == block.size
        spans[allocation.block].append((allocation.offset, allocation.offset + allocation.span))
    for bid, ranges in spans.items():
        ranges.sort()
        for (_, end), (start, _) in zip(ranges, ranges[1:]):
            assert end <= start, f"overlapping allocations in block {bid}"
        free = sorted(blocks[bid].free_extents)
        for (start, size), (next_start, _) in zip(free, free[1:]):
            assert start + size < next_start, "adjacent free extents were not merged"
        for start, size in free:
            assert not any(s < start + size and start < e for s, e in ranges)
    stats = pool.stats()
    assert stats.bytes_live == sum(a.size for a, _ in live)
    assert stats.live_allocations == len(live)
    assert stats.peak_live >= stats.bytes_live and stats.peak_reserved >= stats.bytes_reserved
    assert 0.0 <= stats.fragmentation < 1.0


def drain(pool: Pool, device: FakeDevice, live: list[tuple[Allocation, int]]) -> None:
    """Free everything: each shared block is one free extent; trim empties the device."""
    for allocation, _ in live:
        pool.free(allocation)
    live.clear()
    for block in pool.blocks():
        assert block.used == 0
        if not block.dedicated:
            assert block.free_extents == ((0, block.size),)
    reserved = pool.stats().bytes_reserved
    assert pool.trim() == reserved
    assert device.live == {} and pool.blocks() == []
    stats = pool.stats()
    assert stats.bytes_live == stats.bytes_reserved == 0
    assert stats.device_allocations == stats.device_frees


class PoolMachine(RuleBasedStateMachine):
    """Random allocations, frees and trims against one pool."""

    allocations = Bundle("allocations")

    def __init__(self) -> None:
        super().__init__()
        self.device = FakeDevice()
        self.pool = Pool(self.device.allocate, self.device.release, block_size=BLOCK,
                         max_block=MAX_BLOCK, small_limit=SMALL, granularity=8 * KiB)
        self.live: dict[tuple[int, int], tuple[Allocation, int]] = {}

    @rule(target=allocations, nbytes=sizes, alignment=alignments)
    def alloc(self, nbytes: int, alignment: int | None) -> Allocation:
        allocation = self.pool.alloc(nbytes, alignment)
        assert allocation.size == nbytes
        key = (allocation.block, allocation.offset)
        assert key not in self.live
        self.live[key] = (allocation, max(alignment or 1, self.pool.alignment))
        return allocation

    @rule(allocation=consumes(allocations))
    def free(self, allocation: Allocation) -> None:
        self.pool.free(allocation)
        del self.live[(allocation.block, allocation.offset)]

    @rule()
    def trim(self) -> None:
        before = self.pool.stats().bytes_reserved
        given_back = self.pool.trim()
        assert self.pool.stats().bytes_reserved == before - given_back
        assert all(b.used > 0 for b in self.pool.blocks())

    @precondition(lambda self: bool(self.live))
    @rule()
    def reset_peaks(self) -> None:
        self.pool.reset_peaks()
        stats = self.pool.stats()
        assert stats.peak_live == stats.bytes_live

    @invariant()
    def consistent(self) -> None:
        check_pool(self.pool, self.device, list(self.live.values()))

    def teardown(self) -> None:
        drain(self.pool, self.device, list(self.live.values()))
        self.pool.close()


PoolMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50,
                                         deadline=None)
TestPoolMachine = pytest.mark.slow(PoolMachine.TestCase)


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(sizes, alignments, st.booleans()), min_size=1, max_size=80),
    capacity=st.integers(MAX_BLOCK, 8 * MAX_BLOCK),
)
def test_running_out_of_device_memory_keeps_the_pool_consistent(
    requests: list[tuple[int, int | None, bool]], capacity: int
) -> None:
    device = FakeDevice(capacity)
    pool = Pool(device.allocate, device.release, block_size=BLOCK, max_block=MAX_BLOCK,
                small_limit=SMALL, granularity=8 * KiB)
    live: list[tuple[Allocation, int]] = []
    for nbytes, alignment, free_one in requests:
        try:
            allocation = pool.alloc(nbytes, alignment)
        except OutOfMemory as error:
            assert error.size_hint >= nbytes
        else:
            live.append((allocation, max(alignment or 1, pool.alignment)))
        if free_one and live:
            pool.free(live.pop(len(live) // 2)[0])
        assert sum(device.live.values()) <= capacity
        check_pool(pool, device, live)
    drain(pool, device, live)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 3 * BLOCK), min_size=1, max_size=60), st.randoms())
def test_freeing_everything_in_any_order_coalesces_every_block(
    requests: list[int], order: random.Random
) -> None:
    device = FakeDevice()
    pool = Pool(device.allocate, device.release, block_size=BLOCK, max_block=MAX_BLOCK,
                small_limit=SMALL, granularity=8 * KiB)
    live = [(pool.alloc(n), pool.alignment) for n in requests]
    order.shuffle(live)
    check_pool(pool, device, live)
    drain(pool, device, live)
