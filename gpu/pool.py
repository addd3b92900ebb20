"""Sub-allocating GPU memory pool: the policy, with the device calls passed in.

The pool never touches a device API. It is built with two callables,
``allocate(nbytes) -> handle`` and ``release(handle)``, and hands out
:class:`Allocation` records (handle, offset, size) carved out of the device
blocks those calls return, so the whole policy runs and is tested on a CPU.

Why a fixed-size pool bloats on YOLO training
---------------------------------------------
A detector's loss builds tensors sized by the data: the assigner's
``(batch, max_targets, anchors)`` matrices and the per-image
``(targets, anchors)`` cost and IoU matrices change with the number of boxes
in every image, so nearly every step asks for sizes the step before did not.
A pool that caches freed buffers by exact size (or a few fixed classes)
misses on each new size, asks the device for another buffer and keeps the old
one idle: it ends up holding a buffer per size ever seen, several times the
memory that is ever live at once (``bench/memory_pool.py`` measures it).

The policy
----------
* Small requests (``<= small_limit``) are rounded up to a size class (four
  per power of two: at most 25 %, on average about 10 %, lost to rounding)
  and served from per-class slabs, extents of shared blocks cut into chunks
  of one class. A slab goes back to its block when its last chunk is freed.
* Larger requests, up to ``max_block``, are served best-fit from the free
  extents of all shared blocks (one list sorted by size, then block, then
  offset, searched with ``bisect``) and split at the front. A freed extent
  merges at once with its free neighbours, so a block whose allocations are
  all freed is one extent again and one step's freed memory serves the next
  step's tensors whatever their sizes: the pool stops growing once it holds
  one step's worst case.
* Shared blocks are sized to demand: when no free extent fits, the new block
  holds at least the request and at least a quarter of what the shared
  blocks already hold, rounded up to ``granularity``, and at most
  ``block_size`` unless the request alone is larger. Growth takes few device
  calls, and the last block overshoots by at most a quarter of the pool.
* No shared block exceeds ``max_block``, so one binding can address any of
  them: pass the device's maxStorageBufferRange. The default is the larger of
  ``block_size`` and 128 MiB, the least maxStorageBufferRange Vulkan allows
  (and lavapipe's). Larger requests get a dedicated device allocation of
  their size rounded to ``granularity``; a freed one is cached and serves a
  later request that it fits with at most 1/8 of its size to spare.
* Idle memory (wholly free shared blocks, cached dedicated blocks) is kept
  until ``trim()`` gives it back, or until the device or the optional
  ``limit`` on reserved bytes refuses a new block: then the pool gives back
  every idle block and retries with the smallest block that fits.
* Offsets are multiples of the requested alignment (a power of two, at least
  the pool's ``alignment``); device allocations are taken to start aligned
  to any alignment, as Vulkan's do. A dedicated allocation is at offset 0.
* A pool is not thread-safe and not re-entrant: its owner serializes calls
  (and frees from finalizers only through that owner).

Accounting: ``bytes_live`` is the sum of the sizes asked for by live
allocations (rounding is not live memory); ``bytes_reserved`` is the sum of
device blocks held. ``fragmentation`` is ``1 - largest free extent / total
free bytes`` over the free extents of shared blocks (0 when none is free).

Errors: misuse (a bad size or alignment, a double or foreign free) raises
:class:`PoolError`, allocating from a closed pool :class:`gpu.errors.ClosedError`;
running out of device memory, or of ``limit``, raises :class:`OutOfMemory`.
The ``allocate`` callable signals exhaustion by raising :class:`OutOfMemory`.
Freeing on a closed pool does nothing: closing gave every block back.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, insort
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from gpu.errors import ClosedError, GpuError

__all__ = ["Allocation", "BlockInfo", "GpuError", "MemoryStats", "OutOfMemory", "Pool", "PoolError",
           "PoolStats", "memory_stats", "size_class"]

CLASS_BITS = 2
SLAB_BYTES = 256 << 10
SLAB_MAX_CHUNKS = 64
REUSE_SLACK = 8
GROWTH_DIVISOR = 4
MAX_BINDING = 128 << 20

_serials = itertools.count(1)
_NO_HANDLE = object()


class PoolError(GpuError):
    """A pool was used wrongly: a bad size or alignment, a double or foreign free."""


class OutOfMemory(GpuError):
    """The device (or the pool's limit) could not provide ``size_hint`` bytes."""

    def __init__(self, size_hint: int, detail: str = "") -> None:
        self.size_hint = size_hint
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"Out of GPU memory allocating {size_hint} bytes{extra}; free buffers, "
            "call Pool.trim(), or use smaller batches"
        )


@dataclass(frozen=True, slots=True)
class Allocation:
    """A live piece of device memory: ``size`` bytes at ``offset`` in ``handle``.

    ``span`` is what the pool holds for it (``size`` rounded up); ``block`` is
    the id of the device block and ``pool`` the serial of the pool that made it.
    """

    handle: Any = field(compare=False)
    offset: int
    size: int
    block: int
    span: int
    pool: int


@dataclass(frozen=True, slots=True)
class BlockInfo:
    """A snapshot of one device block: its free extents as (offset, size) pairs."""

    id: int
    size: int
    dedicated: bool
    used: int
    free_extents: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class PoolStats:
    """Memory figures of a pool; byte counts are plain ints."""

    bytes_live: int
    bytes_reserved: int
    peak_live: int
    peak_reserved: int
    fragmentation: float
    device_allocations: int
    device_frees: int
    blocks: int
    live_allocations: int

    def as_dict(self) -> dict[str, int | float]:
        """The figures as a flat dict, e.g. for logging under ``gpu/pool/*``."""
        return asdict(self)


@dataclass(frozen=True, slots=True)
class MemoryStats:
    """The figures a memory monitor samples: byte counts and call counts, all plain ints.

    ``reserved`` bytes held from the device, ``live`` bytes asked for by live
    allocations, ``peak_live`` / ``peak_reserved`` their highs, ``allocations`` /
    ``frees`` the device allocations made and given back, ``live_allocations``
    the allocations handed out and not yet freed, ``limit`` the cap on reserved
    bytes (0: none).
    """

    reserved: int
    live: int
    peak_live: int
    peak_reserved: int
    allocations: int
    frees: int
    live_allocations: int
    limit: int

    def as_dict(self) -> dict[str, int]:
        """The figures as a flat dict."""
        return asdict(self)


def memory_stats(pool: Any) -> MemoryStats:
    """The :class:`MemoryStats` of ``pool`` (a :class:`Pool` or a :mod:`gpu.pool_sim` policy).

    Reads counters only (no walk over the pool's lists), so another thread may
    call it while the owner allocates: each figure is one consistent read, the
    set of figures may straddle one allocation.
    """
    return pool.memory_stats()


@dataclass(eq=False, slots=True)
class _Block:
    id: int
    handle: Any
    size: int
    dedicated: bool
    used: int = 0
    starts: dict[int, int] = field(default_factory=dict)
    ends: dict[int, int] = field(default_factory=dict)


@dataclass(eq=False, slots=True)
class _Slab:
    block: _Block
    offset: int
    chunk: int
    nbytes: int
    free: list[int]
    live: int = 0


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _is_power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def size_class(nbytes: int, alignment: int = 256) -> int:
    """The chunk size a small request of ``nbytes`` is served from.

    Multiples of ``alignment`` up to four of them, then four classes per power
    of two (1280, 1536, 1792, 2048, 2560, ...), each a multiple of ``alignment``.
    """
    if nbytes <= alignment << CLASS_BITS:
        return _round_up(max(nbytes, 1), alignment)
    step = max(1 << ((nbytes - 1).bit_length() - 1 - CLASS_BITS), alignment)
    return _round_up(nbytes, step)


def _check_positive(name: str, value: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise PoolError(f"Pool {name} must be a positive int, got {value!r}")


def _check_options(sizes: dict[str, int], limit: int | None) -> None:
    for name, value in sizes.items():
        _check_positive(name, value)
    alignment = sizes["alignment"]
    if not _is_power_of_two(alignment):
        raise PoolError(f"Pool alignment must be a power of two, got {alignment}")
    for name in ("block_size", "max_block", "granularity"):
        if sizes[name] % alignment:
            raise PoolError(f"Pool {name} {sizes[name]} is not a multiple of the alignment "
                            f"{alignment}; round it up to {_round_up(sizes[name], alignment)}")
    small, block, most = sizes["small_limit"], sizes["block_size"], sizes["max_block"]
    if not 2 * small <= block <= most:
        raise PoolError(
            "Pool sizes must satisfy 2 * small_limit <= block_size <= max_block, got "
            f"{small}, {block}, {most}; raise block_size or max_block"
        )
    if limit is not None:
        _check_positive("limit", limit)


class Pool:
    """Sub-allocates device memory; see the module docstring for the policy.

    ``allocate(nbytes)`` returns an opaque device handle (raising
    :class:`OutOfMemory` when the device is full) and ``release(handle)`` frees
    it. ``block_size`` caps the blocks the pool grows by, ``max_block`` any
    shared block, ``small_limit`` the requests served from size classes;
    ``alignment`` is the least offset alignment (minStorageBufferOffsetAlignment),
    ``granularity`` what block sizes are rounded to, ``limit`` an optional cap
    on reserved bytes.
    """

    def __init__(
        self,
        allocate: Callable[[int], Any],
        release: Callable[[Any], None],
        *,
        block_size: int = 64 << 20,
        alignment: int = 256,
        small_limit: int = 1 << 20,
        max_block: int | None = None,
        granularity: int = 2 << 20,
        limit: int | None = None,
    ) -> None:
        _check_positive("block_size", block_size)
        if max_block is None:
            max_block = max(block_size, MAX_BINDING)
        _check_options({"block_size": block_size, "alignment": alignment,
                        "small_limit": small_limit, "max_block": max_block,
                        "granularity": granularity}, limit)
        self._allocate = allocate
        self._release = release
        self.block_size = block_size
        self.alignment = alignment
        self.small_limit = small_limit
        self.max_block = max_block
        self.granularity = min(granularity, block_size)
        self.limit = limit
        self._serial = next(_serials)
        self._block_ids = itertools.count(1)
        self._blocks: dict[int, _Block] = {}
        self._extents: list[tuple[int, int, int]] = []
        self._partial: dict[int, dict[_Slab, None]] = {}
        self._cached: dict[int, _Block] = {}
        self._live: dict[tuple[int, int], tuple[Allocation, _Slab | None]] = {}
        self._bytes_live = 0
        self._bytes_reserved = 0
        self._peak_live = 0
        self._peak_reserved = 0
        self._device_allocations = 0
        self._device_frees = 0
        self._closed = False

    # public API ---------------------------------------------------------

    def alloc(self, nbytes: int, alignment: int | None = None) -> Allocation:
        """Reserve ``nbytes`` at an offset that is a multiple of ``alignment``."""
        if self._closed:
            raise ClosedError("Pool is closed; create a new Pool to allocate")
        align = self._check_request(nbytes, alignment)
        span = _round_up(nbytes, self.alignment)
        slab: _Slab | None = None
        if span > self.max_block:
            block, offset = self._take_dedicated(span), 0
            span = block.size
        elif span <= self.small_limit and align == self.alignment:
            slab, offset = self._take_chunk(span)
            block, span = slab.block, slab.chunk
        else:
            block, offset = self._take_extent(span, align)
        allocation = Allocation(block.handle, offset, nbytes, block.id, span, self._serial)
        self._live[(block.id, offset)] = (allocation, slab)
        self._bytes_live += nbytes
        if self._bytes_live > self._peak_live:
            self._peak_live = self._bytes_live
        return allocation

    def free(self, allocation: Allocation) -> None:
        """Give ``allocation`` (the object :meth:`alloc` returned) back, once."""
        if self._closed:
            return
        key = (allocation.block, allocation.offset)
        entry = self._live.get(key)
        if entry is None or entry[0] is not allocation:
            raise PoolError(
                f"Allocation of {allocation.size} bytes at block {allocation.block} offset "
                f"{allocation.offset} is not live in this pool: it was freed already or "
                "belongs to another pool; free each allocation once, on its own pool"
            )
        del self._live[key]
        self._bytes_live -= allocation.size
        slab = entry[1]
        block = self._blocks[allocation.block]
        if slab is not None:
            self._put_chunk(slab, allocation.offset)
        elif block.dedicated:
            block.used = 0
            self._cached[block.id] = block
        else:
            self._put_extent(block, allocation.offset, allocation.span)

    def trim(self) -> int:
        """Give every idle block back to the device; returns the bytes given back."""
        if self._closed:
            return 0
        return self._release_idle()

    def stats(self) -> PoolStats:
        """Current figures: live, reserved, peaks, fragmentation, device calls."""
        total_free = sum(size for size, _, _ in self._extents)
        largest = self._extents[-1][0] if self._extents else 0
        fragmentation = 1.0 - largest / total_free if total_free else 0.0
        return PoolStats(
            bytes_live=self._bytes_live,
            bytes_reserved=self._bytes_reserved,
            peak_live=self._peak_live,
            peak_reserved=self._peak_reserved,
            fragmentation=fragmentation,
            device_allocations=self._device_allocations,
            device_frees=self._device_frees,
            blocks=len(self._blocks),
            live_allocations=len(self._live),
        )

    def memory_stats(self) -> MemoryStats:
        """Counters only, safe to read from another thread (see :func:`memory_stats`)."""
        return MemoryStats(
            reserved=self._bytes_reserved,
            live=self._bytes_live,
            peak_live=self._peak_live,
            peak_reserved=self._peak_reserved,
            allocations=self._device_allocations,
            frees=self._device_frees,
            live_allocations=len(self._live),
            limit=self.limit or 0,
        )

    def reset_peaks(self) -> None:
        """Set the peak figures to the current ones."""
        self._peak_live = self._bytes_live
        self._peak_reserved = self._bytes_reserved

    def blocks(self) -> list[BlockInfo]:
        """A snapshot of every device block held, in creation order."""
        return [
            BlockInfo(b.id, b.size, b.dedicated, b.used, tuple(sorted(b.starts.items())))
            for b in self._blocks.values()
        ]

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def close(self) -> None:
        """Give every block back to the device, live or not; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for block in list(self._blocks.values()):
            self._release_block(block)
        self._extents.clear()
        self._partial.clear()
        self._live.clear()
        self._bytes_live = 0

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # requests -----------------------------------------------------------

    def _check_request(self, nbytes: int, alignment: int | None) -> int:
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0:
            raise PoolError(
                f"Allocation size must be a positive int of bytes, got {nbytes!r}; "
                "Vulkan buffers cannot be empty, so skip zero-size tensors"
            )
        if alignment is None:
            return self.alignment
        if not isinstance(alignment, int) or not _is_power_of_two(alignment):
            raise PoolError(f"Allocation alignment must be a power of two, got {alignment!r}")
        return max(alignment, self.alignment)

    # small requests: per-class slabs ------------------------------------

    def _take_chunk(self, span: int) -> tuple[_Slab, int]:
        chunk = size_class(span, self.alignment)
        partial = self._partial.setdefault(chunk, {})
        if partial:
            slab = next(iter(partial))
        else:
            slab_bytes = min(SLAB_BYTES, self.block_size // 8)
            count = max(1, min(SLAB_MAX_CHUNKS, slab_bytes // chunk))
            block, offset = self._take_extent(chunk * count, self.alignment)
            free = [offset + i * chunk for i in range(count - 1, -1, -1)]
            slab = _Slab(block, offset, chunk, chunk * count, free)
            partial[slab] = None
        offset = slab.free.pop()
        slab.live += 1
        if not slab.free:
            del partial[slab]
        return slab, offset

    def _put_chunk(self, slab: _Slab, offset: int) -> None:
        partial = self._partial[slab.chunk]
        slab.free.append(offset)
        slab.live -= 1
        if slab.live == 0:
            partial.pop(slab, None)
            self._put_extent(slab.block, slab.offset, slab.nbytes)
        elif len(slab.free) == 1:
            partial[slab] = None

    # large requests: best fit over the free extents of shared blocks -----

    def _take_extent(self, span: int, align: int) -> tuple[_Block, int]:
        found = self._best_fit(span, align)
        if found is None:
            self._grow(span)
            found = self._best_fit(span, align)
            assert found is not None
        size, block_id, start = found
        block = self._blocks[block_id]
        self._drop_extent(block, start, size)
        offset = _round_up(start, align)
        if offset > start:
            self._add_extent(block, start, offset - start)
        end = start + size
        if offset + span < end:
            self._add_extent(block, offset + span, end - offset - span)
        block.used += span
        return block, offset

    def _best_fit(self, span: int, align: int) -> tuple[int, int, int] | None:
        extents = self._extents
        for i in range(bisect_left(extents, (span,)), len(extents)):
            size, _, start = extents[i]
            if _round_up(start, align) - start + span <= size:
                return extents[i]
        return None

    def _put_extent(self, block: _Block, start: int, span: int) -> None:
        block.used -= span
        end = start + span
        before = block.ends.get(start)
        if before is not None:
            self._drop_extent(block, before, start - before)
            start = before
        after = block.starts.get(end)
        if after is not None:
            self._drop_extent(block, end, after)
            end += after
        self._add_extent(block, start, end - start)

    def _add_extent(self, block: _Block, start: int, size: int) -> None:
        block.starts[start] = size
        block.ends[start + size] = start
        insort(self._extents, (size, block.id, start))

    def _drop_extent(self, block: _Block, start: int, size: int) -> None:
        del block.starts[start]
        del block.ends[start + size]
        extents = self._extents
        del extents[bisect_left(extents, (size, block.id, start))]

    # device blocks --------------------------------------------------------

    def _grow(self, span: int) -> None:
        """Add a shared block that fits ``span``: see the module docstring."""
        minimum = min(self.max_block, _round_up(span, self.granularity))
        shared = sum(b.size for b in self._blocks.values() if not b.dedicated)
        share = min(self.block_size, _round_up(shared // GROWTH_DIVISOR, self.granularity))
        block = self._new_block(max(minimum, share), minimum, dedicated=False)
        self._add_extent(block, 0, block.size)

    def _take_dedicated(self, span: int) -> _Block:
        best: _Block | None = None
        for block in self._cached.values():
            if span <= block.size <= span + block.size // REUSE_SLACK:
                if best is None or block.size < best.size:
                    best = block
        if best is None:
            size = _round_up(span, self.granularity)
            best = self._new_block(size, size, dedicated=True)
        else:
            del self._cached[best.id]
        best.used = best.size
        return best

    def _new_block(self, size: int, minimum: int, *, dedicated: bool) -> _Block:
        """A device block of ``size`` bytes; when short, trim and try ``minimum``."""
        handle = self._try_allocate(size)
        if handle is _NO_HANDLE:
            self._release_idle()
            size = minimum
            handle = self._try_allocate(size)
        if handle is _NO_HANDLE:
            budget = f", limit {self.limit}" if self.limit is not None else ""
            raise OutOfMemory(minimum, f"{self._bytes_reserved} bytes reserved{budget}")
        return self._register(handle, size, dedicated)

    def _try_allocate(self, nbytes: int) -> Any:
        if self.limit is not None and self._bytes_reserved + nbytes > self.limit:
            return _NO_HANDLE
        try:
            return self._allocate(nbytes)
        except OutOfMemory:
            return _NO_HANDLE

    def _register(self, handle: Any, size: int, dedicated: bool) -> _Block:
        block = _Block(next(self._block_ids), handle, size, dedicated)
        self._blocks[block.id] = block
        self._device_allocations += 1
        self._bytes_reserved += size
        if self._bytes_reserved > self._peak_reserved:
            self._peak_reserved = self._bytes_reserved
        return block

    def _release_idle(self) -> int:
        """Give back wholly free shared blocks and cached dedicated blocks."""
        idle = [b for b in self._blocks.values() if b.used == 0]
        for block in idle:
            if block.dedicated:
                del self._cached[block.id]
            else:
                self._drop_extent(block, 0, block.size)
            self._release_block(block)
        return sum(b.size for b in idle)

    def _release_block(self, block: _Block) -> None:
        del self._blocks[block.id]
        self._cached.pop(block.id, None)
        self._bytes_reserved -= block.size
        self._device_frees += 1
        self._release(block.handle)
