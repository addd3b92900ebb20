"""Buffers: ranges of pooled device memory, with explicit transfers and mapped views.

Rules:

* Every buffer is a sub-allocation of a :class:`gpu.pool.Pool` block; a block is
  one ``VkBuffer`` bound to one ``VkDeviceMemory``, mapped once for its lifetime
  when the memory is host-visible (lavapipe, integrated GPUs, resizable BAR).
* ``memory="device"`` prefers device-local memory (host-visible too where the
  device has it); ``memory="host"`` is host-visible coherent memory for staging.
  Where device memory is host-visible both kinds share one pool.
* ``write``/``read`` are the explicit host<->device transfers: a copy into or out of
  the mapping, or through a staging buffer and a copy command when the memory is
  not host-visible. ``view()`` is a zero-copy numpy view of the mapping; it is valid
  until the buffer is closed, and the caller must not touch it while submitted work
  that uses the buffer is running (``view``, ``write`` and ``read`` wait for it).
* ``close()`` returns the memory to the pool only after the fence of the last
  submission that used the buffer; a buffer recorded in commands that were not
  submitted yet cannot be closed.
* :class:`ImportedBuffer` is a numpy array's own memory used by the device in
  place (VK_EXT_external_memory_host): no copy in, no copy out.
* A range is bound as a storage buffer as is, or as a texel buffer through
  ``texel(range, format)``; :class:`Hazards` tracks which byte ranges commands
  read and wrote, so barriers go only where they are needed.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from gpu.errors import ClosedError, GpuError
from gpu.pool import Allocation, OutOfMemory, Pool

if TYPE_CHECKING:  # pragma: no cover
    from gpu.device import Device


@dataclass(eq=False)
class Block:
    """One device allocation handed to the pool: a VkBuffer, its memory, its mapping."""

    buffer: Any
    memory: Any
    size: int
    host_visible: bool
    array: np.ndarray | None = None


def _memory_type(props: Any, bits: int, required: int, preferred: int) -> int:
    best, best_score = -1, -1
    for i in range(props.memoryTypeCount):
        flags = props.memoryTypes[i].propertyFlags
        if not bits & (1 << i) or flags & required != required:
            continue
        score = bin(flags & preferred).count("1")
        if score > best_score:
            best, best_score = i, score
    return best


def _usage(vk: Any) -> int:
    return (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT
            | vk.VK_BUFFER_USAGE_STORAGE_TEXEL_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
            | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)


def _allocate_block(state: Any, props: Any, name: str, type_index: int, nbytes: int) -> Block:
    vk, dev = state.vk, state.device
    buffer = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
        size=nbytes, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    try:
        req = vk.vkGetBufferMemoryRequirements(dev, buffer)
        memory = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
            allocationSize=req.size, memoryTypeIndex=type_index), None)
    except (vk.VkErrorOutOfDeviceMemory, vk.VkErrorOutOfHostMemory):
        vk.vkDestroyBuffer(dev, buffer, None)
        raise OutOfMemory(nbytes, f"vkAllocateMemory on {name}") from None
    vk.vkBindBufferMemory(dev, buffer, memory, 0)
    flags = props.memoryTypes[type_index].propertyFlags
    block = Block(buffer, memory, nbytes, bool(flags & vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
    if block.host_visible:
        mapped = vk.vkMapMemory(dev, memory, 0, nbytes, 0)  # explicit size: VK_WHOLE_SIZE is -1 here
        block.array = np.frombuffer(mapped, dtype=np.uint8, count=nbytes)
    return block


def _release_block(state: Any, block: Block) -> None:
    vk, dev = state.vk, state.device
    block.array = None
    if block.host_visible:
        vk.vkUnmapMemory(dev, block.memory)
    vk.vkDestroyBuffer(dev, block.buffer, None)
    vk.vkFreeMemory(dev, block.memory, None)


def make_pools(device: Device, block_size: int) -> dict[str, Pool]:
    """The device's pools: ``device`` and ``host`` (one shared pool when device memory is mappable)."""
    vk = device.vk
    probe = vk.vkCreateBuffer(device.handle, vk.VkBufferCreateInfo(
        size=256, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    bits = vk.vkGetBufferMemoryRequirements(device.handle, probe).memoryTypeBits
    vk.vkDestroyBuffer(device.handle, probe, None)
    visible = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
    local = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT
    props = device.memory_properties
    device_type = _memory_type(props, bits, local, visible)
    if device_type < 0:
        device_type = _memory_type(props, bits, 0, visible)
    host_type = _memory_type(props, bits, visible, vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT)
    if device_type < 0 or host_type < 0:
        raise GpuError(f"device {device.info.name!r} has no memory type for storage buffers")
    info = device.info
    alignment = max(256, info.min_storage_buffer_offset_alignment, info.non_coherent_atom_size)
    block_size = min(block_size, info.max_storage_buffer_range)

    state, name = device._state, info.name  # the pools must not keep the Device alive

    def pool_for(type_index: int) -> Pool:
        return Pool(lambda n: _allocate_block(state, props, name, type_index, n),
                    lambda b: _release_block(state, b),
                    block_size=block_size, alignment=alignment)

    device_pool = pool_for(device_type)
    flags = props.memoryTypes[device_type].propertyFlags
    host_pool = device_pool if flags & visible == visible else pool_for(host_type)
    return {"device": device_pool, "host": host_pool}


@dataclass(eq=False)
class _Lease:
    """What a buffer's finalizer needs: the device, how to free the memory, and its last use."""

    device: Device
    block: Block
    offset: int
    free: Callable[[], None]
    last_use: int = 0
    recording: int = 0
    freed: bool = field(default=False)
    keep: Any = None


def _release(lease: _Lease) -> None:
    if lease.freed:
        return
    lease.freed = True
    if not lease.device.closed:
        lease.device.defer(lease.last_use, lease.free)


def _pool_free(pool: Pool, allocation: Allocation) -> Callable[[], None]:
    def free() -> None:
        if not pool.closed:
            pool.free(allocation)

    return free


@dataclass(frozen=True)
class BufferRange:
    """``nbytes`` of ``buffer`` from ``offset``: what a binding or a copy refers to."""

    buffer: Buffer
    offset: int
    nbytes: int


class Hazards:
    """Byte ranges read and written since the last barrier of one command buffer.

    An operation needs a barrier first when it reads or writes bytes written
    earlier, or writes bytes read earlier.
    """

    def __init__(self) -> None:
        self.read: list[tuple[int, int, int]] = []
        self.written: list[tuple[int, int, int]] = []
        self.wrote = False

    @staticmethod
    def key(rng: BufferRange) -> tuple[int, int, int]:
        """(block identity, first byte, end byte) of a range."""
        start = rng.buffer.offset + rng.offset
        return (id(rng.buffer.block), start, start + rng.nbytes)

    @staticmethod
    def overlap(a: BufferRange, b: BufferRange) -> bool:
        """Whether two ranges share a byte."""
        ka, kb = Hazards.key(a), Hazards.key(b)
        return ka[0] == kb[0] and ka[1] < kb[2] and kb[1] < ka[2]

    def conflicts(self, accesses: list[tuple[BufferRange, bool, bool]]) -> bool:
        """Whether (range, reads, writes) accesses need a barrier before them."""

        def hits(k: tuple[int, int, int], seen: list[tuple[int, int, int]]) -> bool:
            return any(k[0] == o[0] and k[1] < o[2] and o[1] < k[2] for o in seen)

        keys = [(self.key(rng), writes) for rng, _, writes in accesses]
        return any(hits(k, self.written) or (writes and hits(k, self.read)) for k, writes in keys)

    def record(self, accesses: list[tuple[BufferRange, bool, bool]]) -> None:
        """Remember (range, reads, writes) accesses until the next barrier."""
        for rng, reads, writes in accesses:
            if reads:
                self.read.append(self.key(rng))
            if writes:
                self.written.append(self.key(rng))
                self.wrote = True

    def clear(self) -> None:
        """Forget the ranges (a barrier was recorded)."""
        self.read.clear()
        self.written.clear()


# texel format name -> (VkFormat constant name, bytes per texel)
TEXEL_FORMATS: dict[str, tuple[str, int]] = {
    "r32f": ("VK_FORMAT_R32_SFLOAT", 4), "rg32f": ("VK_FORMAT_R32G32_SFLOAT", 8),
    "rgba32f": ("VK_FORMAT_R32G32B32A32_SFLOAT", 16), "r16f": ("VK_FORMAT_R16_SFLOAT", 2),
    "rg16f": ("VK_FORMAT_R16G16_SFLOAT", 4), "rgba16f": ("VK_FORMAT_R16G16B16A16_SFLOAT", 8),
    "r32ui": ("VK_FORMAT_R32_UINT", 4), "rg32ui": ("VK_FORMAT_R32G32_UINT", 8),
    "rgba32ui": ("VK_FORMAT_R32G32B32A32_UINT", 16),
}


@dataclass(frozen=True)
class TexelRange:
    """A range seen as texels of ``format`` (e.g. ``rgba32f``): what a texel-buffer binding takes."""

    range: BufferRange
    format: str

    def __post_init__(self) -> None:
        if self.format not in TEXEL_FORMATS:
            raise GpuError(f"Unknown texel format {self.format!r}; available: {', '.join(TEXEL_FORMATS)}")
        size = TEXEL_FORMATS[self.format][1]
        if self.range.nbytes % size:
            raise GpuError(f"texel range of {self.range.nbytes} bytes is not a whole number of "
                           f"{self.format} texels ({size} bytes)")

    @property
    def texels(self) -> int:
        """How many texels the range holds."""
        return self.range.nbytes // TEXEL_FORMATS[self.format][1]


def texel_features(device: Device, format: str) -> frozenset[str]:
    """What buffers of texel ``format`` can be bound as on ``device``: uniform_texel, storage_texel."""
    cache = device.__dict__.setdefault("_texel_features", {})
    if format not in cache:
        vk = device.vk
        props = vk.vkGetPhysicalDeviceFormatProperties(device.physical, getattr(vk, TEXEL_FORMATS[format][0]))
        bits = {"uniform_texel": vk.VK_FORMAT_FEATURE_UNIFORM_TEXEL_BUFFER_BIT,
                "storage_texel": vk.VK_FORMAT_FEATURE_STORAGE_TEXEL_BUFFER_BIT}
        cache[format] = frozenset(name for name, bit in bits.items() if props.bufferFeatures & bit)
    return cache[format]


def texel(binding: Buffer | BufferRange, format: str) -> TexelRange:
    """``binding`` seen as a texel buffer of ``format`` (``rgba32f``, ``r16f``, ...)."""
    return TexelRange(binding if isinstance(binding, BufferRange) else binding.range(), format)


class Buffer:
    """``nbytes`` of pooled memory on ``device``; ``memory`` is ``"device"`` or ``"host"``."""

    def __init__(self, device: Device, nbytes: int, *, memory: str = "device") -> None:
        if memory not in ("device", "host"):
            raise GpuError(f"Unknown buffer memory {memory!r}; available: device, host")
        if not isinstance(nbytes, (int, np.integer)) or nbytes <= 0:
            raise GpuError(f"buffer size must be a positive number of bytes; got {nbytes!r}")
        pool = device.pools[memory]
        with device._lock:
            device.poll()
            allocation = pool.alloc(int(nbytes))
        lease = _Lease(device, allocation.handle, allocation.offset, _pool_free(pool, allocation))
        self._init(device, int(nbytes), memory, lease)

    def _init(self, device: Device, nbytes: int, memory: str, lease: _Lease) -> None:
        self.device = device
        self.nbytes = nbytes
        self.memory = memory
        self._lease = lease
        self._finalizer = weakref.finalize(self, _release, lease)
        device.adopt(self)

    @property
    def block(self) -> Block:
        """The pool block this buffer lives in."""
        if self._lease.freed or self.device.closed:
            raise ClosedError(f"buffer of {self.nbytes} bytes is closed; allocate a new one")
        return self._lease.block

    @property
    def offset(self) -> int:
        """Byte offset of this buffer inside its block's VkBuffer."""
        return self._lease.offset

    @property
    def host_visible(self) -> bool:
        """Whether ``view()`` works without a staging copy."""
        return self._mappable()

    def range(self, offset: int = 0, nbytes: int | None = None) -> BufferRange:
        """A sub-range, e.g. one chunk of a tensor bound at a time."""
        nbytes = self.nbytes - offset if nbytes is None else nbytes
        if offset < 0 or nbytes <= 0 or offset + nbytes > self.nbytes:
            raise GpuError(f"range [{offset}, {offset + nbytes}) is outside the buffer of {self.nbytes} bytes")
        return BufferRange(self, offset, nbytes)

    def used_by(self, serial: int) -> None:
        """Record that submission ``serial`` uses this buffer (frees wait for it)."""
        self._lease.last_use = max(self._lease.last_use, serial)

    def _sync(self) -> None:
        if self._lease.recording:
            raise GpuError("buffer is recorded in commands that were not submitted; submit them first")
        if self._lease.last_use > self.device.completed:
            self.device.wait(self._lease.last_use)

    def _host_bytes(self) -> tuple[np.ndarray, int]:
        """The mapped bytes holding this buffer and where it starts in them."""
        block = self.block
        if block.array is None:
            raise GpuError("buffer memory is not host-visible; use read()/write() to transfer")
        return block.array, self.offset

    def view(self, dtype: Any = np.uint8, shape: int | tuple[int, ...] | None = None,
             offset: int = 0) -> np.ndarray:
        """A zero-copy numpy view of the mapped memory (waits for GPU work using the buffer)."""
        raw, start = self._host_bytes()
        dt = np.dtype(dtype)
        count = (self.nbytes - offset) // dt.itemsize if shape is None else int(np.prod(shape))
        end = offset + count * dt.itemsize
        if offset < 0 or end > min(self.nbytes, raw.size - start):
            raise GpuError(f"view of {count} x {dt} at offset {offset} exceeds the buffer of {self.nbytes} bytes")
        self._sync()
        flat = raw[start + offset:start + end].view(dt)
        return flat if shape is None else flat.reshape(shape)

    def _mappable(self) -> bool:
        try:
            self._host_bytes()
        except GpuError:
            return False
        return True

    def write(self, array: Any, offset: int = 0) -> None:
        """Copy ``array`` (any shape, its own dtype) into the buffer at ``offset`` bytes."""
        src = np.asarray(array)
        if self._mappable():
            np.copyto(self.view(src.dtype, src.shape, offset), src, casting="no")
            return
        from gpu.pipeline import Commands

        with Buffer(self.device, max(src.nbytes, 1), memory="host") as stage:
            np.copyto(stage.view(src.dtype, src.shape), src, casting="no")
            with Commands(self.device) as cmd:
                cmd.copy(stage.range(0, src.nbytes), self.range(offset, src.nbytes))

    def read(self, dtype: Any = np.uint8, shape: int | tuple[int, ...] | None = None,
             offset: int = 0, out: np.ndarray | None = None) -> np.ndarray:
        """Copy the buffer's bytes from ``offset`` into a new array (or ``out``)."""
        dt = np.dtype(dtype if out is None else out.dtype)
        shape = (out.shape if out is not None else
                 ((self.nbytes - offset) // dt.itemsize,) if shape is None else shape)
        result = np.empty(shape, dt) if out is None else out
        if self._mappable():
            np.copyto(result, self.view(dt, shape, offset))
            return result
        from gpu.pipeline import Commands

        with Buffer(self.device, max(result.nbytes, 1), memory="host") as stage:
            with Commands(self.device) as cmd:
                cmd.copy(self.range(offset, result.nbytes), stage.range(0, result.nbytes))
            np.copyto(result, stage.view(dt, shape))
        return result

    @property
    def closed(self) -> bool:
        """True after ``close()`` (or after its device closed)."""
        return self._lease.freed or self.device.closed

    def close(self) -> None:
        """Return the memory to the pool once the GPU is done with it. Idempotent."""
        if self._lease.recording and not self._lease.freed and not self.device.closed:
            raise GpuError("buffer is recorded in commands that were not submitted; submit them first")
        self._finalizer()

    def __enter__(self) -> Buffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpu.Buffer {self.nbytes} bytes {self.memory}{' closed' if self.closed else ''}>"


def can_import(device: Device) -> bool:
    """Whether ``device`` can use host memory in place (VK_EXT_external_memory_host)."""
    return device.info.host_import_alignment > 0


class ImportedBuffer(Buffer):
    """A C-contiguous numpy array's own memory, used by the device in place (no copy).

    The pages around the array are imported (VK_EXT_external_memory_host) and the
    buffer starts at the array's first byte; ``nbytes`` is the array's size rounded
    up to 8 bytes, as 64-bit loads read whole words (an aligned word never crosses
    a page). The array is kept alive until the device is done with it; the caller
    must not resize or free it meanwhile, and sees the device's writes after the
    submission that made them has finished.
    """

    def __init__(self, device: Device, array: np.ndarray) -> None:
        align = device.info.host_import_alignment
        if not align:
            raise GpuError(f"device {device.info.name!r} cannot import host memory "
                           "(no VK_EXT_external_memory_host); use Buffer and write()")
        if not array.flags.c_contiguous or array.nbytes == 0:
            raise GpuError(f"only non-empty C-contiguous arrays can be imported; got {array.shape} "
                           f"{'contiguous' if array.flags.c_contiguous else 'strided'}")
        ptr = array.ctypes.data
        base = ptr // align * align
        size = -(-(ptr + array.nbytes) // align) * align - base
        block = _import_block(device, base, size)
        state = device._state

        def free() -> None:
            _release_block(state, block)

        self._init(device, -(-array.nbytes // 8) * 8, "host",
                   _Lease(device, block, ptr - base, free, keep=array))

    def _host_bytes(self) -> tuple[np.ndarray, int]:
        self.block  # raises once closed
        array = self._lease.keep
        return array.reshape(-1).view(np.uint8), 0


def _import_block(device: Device, base: int, size: int) -> Block:
    vk, dev = device.vk, device.handle
    handle_type = vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT
    pointer = vk.ffi.cast("void*", base)
    props = vk.VkMemoryHostPointerPropertiesEXT()
    get = vk.vkGetDeviceProcAddr(dev, "vkGetMemoryHostPointerPropertiesEXT")
    get(dev, handle_type, pointer, props)
    buffer = vk.vkCreateBuffer(dev, vk.VkBufferCreateInfo(
        pNext=vk.VkExternalMemoryBufferCreateInfo(handleTypes=handle_type),
        size=size, usage=_usage(vk), sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE), None)
    bits = vk.vkGetBufferMemoryRequirements(dev, buffer).memoryTypeBits & props.memoryTypeBits
    if not bits:
        vk.vkDestroyBuffer(dev, buffer, None)
        raise GpuError(f"device {device.info.name!r} has no memory type for imported host memory")
    type_index = (bits & -bits).bit_length() - 1
    try:
        memory = vk.vkAllocateMemory(dev, vk.VkMemoryAllocateInfo(
            pNext=vk.VkImportMemoryHostPointerInfoEXT(handleType=handle_type, pHostPointer=pointer),
            allocationSize=size, memoryTypeIndex=type_index), None)
    except vk.VkError as exc:
        vk.vkDestroyBuffer(dev, buffer, None)
        raise GpuError(f"importing {size} bytes of host memory failed: {type(exc).__name__}") from None
    vk.vkBindBufferMemory(dev, buffer, memory, 0)
    return Block(buffer, memory, size, host_visible=False)
