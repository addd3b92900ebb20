"""Reference allocator policies that :class:`gpu.pool.Pool` is measured against.

Both are simulations: they track sizes and offsets only and never touch a
device. Each has the same ``alloc(nbytes)`` / ``free(token)`` / ``stats()``
surface as :class:`~gpu.pool.Pool`, so one trace can be replayed on all three.

* :class:`NaivePool` caches freed buffers by exact size and asks the device for
  a new buffer whenever no cached one has exactly the size asked for. This is
  the fixed-size policy that bloats on variable-length tensors.
* :class:`TorchCachingPool` follows the policy of PyTorch's CUDA caching
  allocator (``c10/cuda/CUDACachingAllocator.cpp``) with its default settings:
  sizes rounded up to 512 bytes; requests up to 1 MiB served from a small pool
  of 2 MiB segments; larger ones from a large pool whose segments are 20 MiB
  for requests under 10 MiB and the request rounded up to 2 MiB otherwise;
  best fit over the cached free blocks of the pool (by size, then address); a
  block is split when the rest is at least 512 bytes (small pool) or more than
  1 MiB (large pool); a freed block merges with free neighbours of its own
  segment only; segments are never given back (no ``empty_cache``).

``bytes_live`` counts the sizes asked for, as in :class:`~gpu.pool.Pool`, so
peak reserved / peak live compares the pools on the same footing.

:func:`replay_steps` replays a training trace step by step on any of the pools
and yields each step's :class:`~gpu.pool.MemoryStats`, the curves a run logs.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Iterator

from gpu.pool import MemoryStats, PoolError, PoolStats

__all__ = ["NaivePool", "TorchCachingPool", "replay_steps", "torch_round_size", "torch_segment_size"]

MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def torch_round_size(nbytes: int) -> int:
    """PyTorch's block size for a request: at least 512, a multiple of 512."""
    return max(MIN_BLOCK, -(-nbytes // MIN_BLOCK) * MIN_BLOCK)


def torch_segment_size(size: int) -> int:
    """PyTorch's device allocation for a rounded ``size`` that no cached block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


@dataclass
class _Counters:
    bytes_live: int = 0
    bytes_reserved: int = 0
    peak_live: int = 0
    peak_reserved: int = 0
    device_allocations: int = 0
    live: int = 0

    def on_alloc(self, nbytes: int) -> None:
        self.bytes_live += nbytes
        self.live += 1
        self.peak_live = max(self.peak_live, self.bytes_live)

    def on_free(self, nbytes: int) -> None:
        self.bytes_live -= nbytes
        self.live -= 1

    def on_device(self, nbytes: int) -> None:
        self.bytes_reserved += nbytes
        self.device_allocations += 1
        self.peak_reserved = max(self.peak_reserved, self.bytes_reserved)

    def stats(self, free_sizes: list[int], blocks: int) -> PoolStats:
        total = sum(free_sizes)
        fragmentation = 1.0 - max(free_sizes) / total if total else 0.0
        return PoolStats(self.bytes_live, self.bytes_reserved, self.peak_live,
                         self.peak_reserved, fragmentation, self.device_allocations,
                         0, blocks, self.live)

    def memory_stats(self) -> MemoryStats:
        """The counters as :class:`~gpu.pool.MemoryStats` (nothing is ever given back)."""
        return MemoryStats(self.bytes_reserved, self.bytes_live,
                           self.peak_live, self.peak_reserved, self.device_allocations, 0, self.live, 0)


class NaivePool:
    """Exact-size free lists: a freed buffer only serves a request of its size."""

    def __init__(self) -> None:
        self._cached: dict[int, int] = {}
        self._counters = _Counters()

    def alloc(self, nbytes: int) -> int:
        """Take a cached buffer of exactly ``nbytes``, or a new device buffer."""
        if nbytes <= 0:
            raise PoolError(f"Allocation size must be positive, got {nbytes}")
        if self._cached.get(nbytes, 0):
            self._cached[nbytes] -= 1
        else:
            self._counters.on_device(nbytes)
        self._counters.on_alloc(nbytes)
        return nbytes

    def free(self, token: int) -> None:
        """Cache the buffer for a later request of the same size."""
        self._cached[token] = self._cached.get(token, 0) + 1
        self._counters.on_free(token)

    def stats(self) -> PoolStats:
        """Figures in the shape of :class:`~gpu.pool.PoolStats`."""
        sizes = [size for size, count in self._cached.items() for _ in range(count)]
        return self._counters.stats(sizes, self._counters.device_allocations)

    def memory_stats(self) -> MemoryStats:
        """Counters in the shape of :class:`~gpu.pool.MemoryStats`."""
        return self._counters.memory_stats()


@dataclass(eq=False)
class _Segment:
    id: int
    size: int
    small: bool
    starts: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)


class TorchCachingPool:
    """PyTorch's CUDA caching-allocator policy; a token is (segment, offset, size)."""

    def __init__(self) -> None:
        self._segments: list[_Segment] = []
        self._small: list[tuple[int, int, int]] = []
        self._large: list[tuple[int, int, int]] = []
        self._counters = _Counters()

    def alloc(self, nbytes: int) -> tuple[int, int, int, int]:
        """Best-fit a cached block, splitting it, or map a new segment."""
        if nbytes <= 0:
            raise PoolError(f"Allocation size must be positive, got {nbytes}")
        size = torch_round_size(nbytes)
        small = size <= SMALL_SIZE
        free = self._small if small else self._large
        i = bisect_left(free, (size,))
        if i == len(free):
            segment = _Segment(len(self._segments), torch_segment_size(size), small)
            self._segments.append(segment)
            self._counters.on_device(segment.size)
            self._add(segment, 0, segment.size)
            i = bisect_left(free, (size,))
        block, seg_id, offset = free[i]
        segment = self._segments[seg_id]
        self._drop(segment, offset, block)
        rest = block - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            self._add(segment, offset + size, rest)
            block = size
        self._counters.on_alloc(nbytes)
        return seg_id, offset, block, nbytes

    def free(self, token: tuple[int, int, int, int]) -> None:
        """Cache the block, merged with free neighbours of its segment."""
        seg_id, start, size, nbytes = token
        segment = self._segments[seg_id]
        end = start + size
        before = segment.ends.get(start)
        if before is not None:
            self._drop(segment, before, start - before)
            start = before
        after = segment.starts.get(end)
        if after is not None:
            self._drop(segment, end, after)
            end += after
        self._add(segment, start, end - start)
        self._counters.on_free(nbytes)

    def stats(self) -> PoolStats:
        """Figures in the shape of :class:`~gpu.pool.PoolStats`."""
        sizes = [size for size, _, _ in self._small + self._large]
        return self._counters.stats(sizes, len(self._segments))

    def memory_stats(self) -> MemoryStats:
        """Counters in the shape of :class:`~gpu.pool.MemoryStats` (segments are never freed)."""
        return self._counters.memory_stats()

    def _add(self, segment: _Segment, start: int, size: int) -> None:
        segment.starts[start] = size
        segment.ends[start + size] = start
        insort(self._small if segment.small else self._large, (size, segment.id, start))

    def _drop(self, segment: _Segment, start: int, size: int) -> None:
        del segment.starts[start]
        del segment.ends[start + size]
        free = self._small if segment.small else self._large
        del free[bisect_left(free, (size, segment.id, start))]


def replay_steps(steps: Iterable[list[tuple[int, int]]], pool: Any) -> Iterator[MemoryStats]:
    """Replay a trace on ``pool`` one step at a time; yields the pool's figures for each step.

    Each step is a list of events: ``(id, nbytes)`` allocates ``nbytes`` under ``id``,
    ``(id, 0)`` frees it; ids are per step. Whatever a step leaves live stays
    live (a leak). The figures are taken at the end of the step, except ``live``:
    the most bytes live at once during the step (at its end a training step
    holds little, so a sample between steps would see none of it).
    """
    kept: list[Any] = []
    for events in steps:
        live: dict[int, Any] = {}
        sizes: dict[int, int] = {}
        now = top = pool.memory_stats().live
        for tid, nbytes in events:
            if nbytes:
                live[tid] = pool.alloc(nbytes)
                sizes[tid] = nbytes
                now += nbytes
                top = max(top, now)
            else:
                pool.free(live.pop(tid))
                now -= sizes.pop(tid)
        kept.extend(live.values())
        yield replace(pool.memory_stats(), live=top)
