"""Compute pipelines built from SPIR-V reflection, and command recording with fences.

Rules:

* A :class:`Pipeline` takes its descriptor layout and push-constant range from the
  module itself (:mod:`gpu.spirv`); push constants are packed by reflected offsets
  (:mod:`gpu.std430`) and refused when the block exceeds ``maxPushConstantsSize``.
* Every pipeline is created through the device's pipeline cache.
* :class:`Commands` records into one command buffer and submits it once, with a
  fence. Barriers are inserted only where an operation touches bytes that an
  earlier one in the same submission wrote (or writes bytes an earlier one read);
  readonly/writeonly come from the shader's NonWritable/NonReadable decorations.
* Bindings are checked before recording: every binding the shader declares, no
  others; a buffer range within ``maxStorageBufferRange``, aligned to
  ``minStorageBufferOffsetAlignment`` and large enough for the block's fixed part;
  a texel buffer given as ``gpu.texel(range, format)`` with a format the device
  supports for that kind of binding, within ``maxTexelBufferElements``, aligned to
  ``minTexelBufferOffsetAlignment``. Buffer views are made per submission and
  destroyed after its fence.
* A pipeline or descriptor pool is destroyed only after the fence of the last
  submission that used it.
"""

from __future__ import annotations

import struct
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from gpu import spirv, std430
from gpu.buffers import TEXEL_FORMATS, Buffer, BufferRange, Hazards, TexelRange, texel_features
from gpu.build_shaders import shader_path
from gpu.errors import ClosedError, GpuError

if TYPE_CHECKING:  # pragma: no cover
    from gpu.device import Device

_SETS_PER_POOL = 64


def _spirv_bytes(shader: bytes | str | Path) -> tuple[bytes, str]:
    if isinstance(shader, (bytes, bytearray, memoryview)):
        return bytes(shader), "<bytes>"
    path = Path(shader)
    if path.suffix != ".spv" and len(path.parts) == 1:
        path = shader_path(str(shader))
    return path.read_bytes(), path.stem


def _specialization(vk: Any, constants: Mapping[int, int | float | bool]) -> Any:
    if not constants:
        return None
    entries, data = [], bytearray()
    for spec_id, value in sorted(constants.items()):
        fmt = "<f" if isinstance(value, float) else "<i" if int(value) < 0 else "<I"
        entries.append(vk.VkSpecializationMapEntry(constantID=spec_id, offset=len(data), size=4))
        data += struct.pack(fmt, value)
    raw = bytes(data)
    return vk.VkSpecializationInfo(pMapEntries=entries, dataSize=len(raw), pData=vk.ffi.from_buffer(raw)), raw


def _destroy_pipeline(device: Device, handles: dict[str, Any], state: dict[str, Any]) -> None:
    if state["closed"]:
        return
    state["closed"] = True

    def destroy() -> None:
        if device.closed:
            return
        vk, dev = device.vk, device.handle
        for key, fn in (("pipeline", vk.vkDestroyPipeline), ("layout", vk.vkDestroyPipelineLayout),
                        ("set_layout", vk.vkDestroyDescriptorSetLayout), ("module", vk.vkDestroyShaderModule)):
            if handles.get(key) is not None:
                fn(dev, handles[key], None)

    if not device.closed:
        device.defer(state["last_use"], destroy)


class Pipeline:
    """A compute pipeline: a SPIR-V module, its reflected layout and a VkPipeline.

    ``shader`` is SPIR-V bytes, a ``.spv`` path, or the name of a module in
    ``gpu/shaders``. ``local_size`` sets the work-group size through the module's
    specialization constants; ``constants`` sets others by id. ``name`` (default:
    the file's stem) appears in error messages.
    """

    def __init__(
        self,
        device: Device,
        shader: bytes | str | Path,
        *,
        local_size: tuple[int, ...] | None = None,
        constants: Mapping[int, int | float | bool] | None = None,
        name: str | None = None,
    ) -> None:
        code, stem = _spirv_bytes(shader)
        self.name = name or stem
        self.device = device
        self.reflection = spirv.reflect(code)
        self.push_block = self.reflection.push_constants
        self.push_size = std430.padded_size(self.push_block.struct) if self.push_block else 0
        if self.push_size > device.info.max_push_constants_size:
            raise GpuError(
                f"shader {self.name!r}: push-constant block {self.push_block.name!r} is "  # type: ignore[union-attr]
                f"{self.push_size} bytes; {device.info.name} allows "
                f"{device.info.max_push_constants_size} (maxPushConstantsSize); move members to a buffer"
            )
        for (set_, binding) in self.reflection.bindings:
            if set_ != 0:
                raise GpuError(f"shader {self.name!r} uses descriptor set {set_}; only set 0 is supported")
        self.local_size = self._local_size(local_size)
        spec = dict(constants or {})
        if local_size is not None:
            ids = self.reflection.local_size_spec_ids or (None, None, None)
            spec.update({i: v for i, v in zip(ids, self.local_size) if i is not None})
        self._handles: dict[str, Any] = {}
        self._state: dict[str, Any] = {"closed": False, "last_use": 0}
        self._finalizer = weakref.finalize(self, _destroy_pipeline, device, self._handles, self._state)
        self._create(code, spec)
        device.adopt(self)

    def _local_size(self, requested: tuple[int, ...] | None) -> tuple[int, int, int]:
        if requested is None:
            return self.reflection.local_size or (1, 1, 1)
        size = (tuple(requested) + (1, 1, 1))[:3]
        ids = self.reflection.local_size_spec_ids
        if ids is None:
            raise GpuError(f"shader {self.name!r} has a fixed work-group size {self.reflection.local_size}; "
                           "declare local_size_x_id to set it at pipeline creation")
        info = self.device.info
        total = size[0] * size[1] * size[2]
        if total > info.max_workgroup_invocations or any(s > m for s, m in zip(size, info.max_workgroup_size)):
            raise GpuError(f"work-group size {size} exceeds {info.name}'s limits "
                           f"({info.max_workgroup_size}, {info.max_workgroup_invocations} invocations)")
        return size  # type: ignore[return-value]

    def _create(self, code: bytes, spec: dict[int, int | float | bool]) -> None:
        vk, dev = self.device.vk, self.device.handle
        h = self._handles
        h["module"] = vk.vkCreateShaderModule(dev, vk.VkShaderModuleCreateInfo(codeSize=len(code), pCode=code), None)
        layout_bindings = [
            vk.VkDescriptorSetLayoutBinding(
                binding=b, descriptorType=self._descriptor_type(blk), descriptorCount=1,
                stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT)
            for (_, b), blk in self.reflection.bindings.items()
        ]
        h["set_layout"] = vk.vkCreateDescriptorSetLayout(dev, vk.VkDescriptorSetLayoutCreateInfo(
            pBindings=layout_bindings or None), None)
        ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                         size=self.push_size)] if self.push_size else None
        h["layout"] = vk.vkCreatePipelineLayout(dev, vk.VkPipelineLayoutCreateInfo(
            pSetLayouts=[h["set_layout"]], pPushConstantRanges=ranges), None)
        specialization = _specialization(vk, spec)
        stage = vk.VkPipelineShaderStageCreateInfo(
            stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=h["module"], pName=self.reflection.entry_point,
            pSpecializationInfo=specialization[0] if specialization else None)
        info = vk.VkComputePipelineCreateInfo(stage=stage, layout=h["layout"])
        h["pipeline"] = vk.vkCreateComputePipelines(dev, self.device.pipeline_cache, 1, [info], None)[0]

    def _descriptor_type(self, block: spirv.Block) -> int:
        vk = self.device.vk
        return getattr(vk, _DESCRIPTOR_TYPES[block.kind])

    def pack(self, values: Mapping[str, Any]) -> bytes:
        """Push-constant bytes for ``values`` (see :func:`gpu.std430.pack`)."""
        if self.push_block is None:
            if values:
                raise GpuError(f"shader {self.name!r} has no push constants; got {sorted(values)}")
            return b""
        return std430.pack(self.push_block, values, limit=self.device.info.max_push_constants_size)

    @property
    def handles(self) -> dict[str, Any]:
        """The Vulkan handles; raises ClosedError after ``close()``."""
        if self._state["closed"] or self.device.closed:
            raise ClosedError(f"pipeline {self.name!r} is closed")
        return self._handles

    def used_by(self, serial: int) -> None:
        """Record that submission ``serial`` uses this pipeline."""
        self._state["last_use"] = max(self._state["last_use"], serial)

    def close(self) -> None:
        """Destroy the pipeline once no submitted work uses it. Idempotent."""
        self._finalizer()

    def __enter__(self) -> Pipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<gpu.Pipeline {self.name!r} local_size={self.local_size}>"


Compute = Pipeline
_DESCRIPTOR_TYPES = {
    "storage": "VK_DESCRIPTOR_TYPE_STORAGE_BUFFER", "uniform": "VK_DESCRIPTOR_TYPE_UNIFORM_BUFFER",
    "uniform_texel": "VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER",
    "storage_texel": "VK_DESCRIPTOR_TYPE_STORAGE_TEXEL_BUFFER",
}


@dataclass
class Submission:
    """A submitted command buffer: its serial, and its timestamps once finished."""

    device: Device
    serial: int
    marks: dict[str, float] = field(default_factory=dict)

    def wait(self) -> Submission:
        """Block until the GPU has finished this submission."""
        self.device.wait(self.serial)
        return self

    @property
    def done(self) -> bool:
        """Whether the submission has finished (polls the fence)."""
        self.device.poll()
        return self.serial <= self.device.completed


Binding = Buffer | BufferRange | TexelRange


def _as_range(binding: Binding) -> BufferRange:
    if isinstance(binding, TexelRange):
        return binding.range
    return binding if isinstance(binding, BufferRange) else binding.range()


def _check_alignment(where: str, start: int, offset: int, alignment: int, limit: str) -> None:
    """GpuError unless a range bound at device offset ``start`` honours the device ``limit`` (an alignment)."""
    if start % alignment:
        raise GpuError(f"{where}: offset {offset} is not a multiple of {limit} {alignment}")


class Commands:
    """One command buffer: record dispatches, copies and fills, then submit once with a fence.

    As a context manager it submits and waits on a clean exit and discards the
    recording when the block raised. ``timestamps=True`` enables ``mark(name)``.
    """

    close_first = True  # a device closing discards unsubmitted commands before freeing buffers

    def __init__(self, device: Device, *, timestamps: bool = False) -> None:
        self.device = device
        self._cb = device.command_buffer()
        self._buffers: dict[int, Buffer] = {}
        self._pipelines: dict[int, Pipeline] = {}
        self._pools: list[Any] = []
        self._sets_left = 0
        self._hazards = Hazards()
        self._bound: Any = None
        self._marks: list[str] = []
        self._views: list[Any] = []
        self._query_pool: Any = None
        self._open = True
        self.barriers = 0
        self.submission: Submission | None = None
        if timestamps:
            self._start_queries()
        device.adopt(self)

    # -- recording ---------------------------------------------------------------
    def dispatch(self, pipeline: Pipeline, groups: int | tuple[int, ...],
                 bindings: Mapping[int, Binding], push: Mapping[str, Any] | bytes | None = None) -> None:
        """Record ``pipeline`` over ``groups`` work groups with ``bindings`` and push constants."""
        vk, cb = self.device.vk, self._check_open()
        g = ((groups,) if isinstance(groups, int) else tuple(groups)) + (1, 1)
        g = g[:3]
        limits = self.device.info.max_workgroup_count
        if any(n < 1 or n > m for n, m in zip(g, limits)):
            raise GpuError(f"dispatch of {g} work groups on {pipeline.name!r}: each count must be in 1..{limits}")
        ranges = self._check_bindings(pipeline, bindings)
        data = push if isinstance(push, (bytes, bytearray)) else pipeline.pack(push or {})
        if len(data) != pipeline.push_size:
            raise GpuError(f"push constants for {pipeline.name!r} are {len(data)} bytes; the block needs "
                           f"{pipeline.push_size}")
        accesses = []
        for b, rng in ranges.items():
            blk = pipeline.reflection.bindings[(0, b)]
            accesses.append((rng, not blk.writeonly, not blk.readonly))
        self._touch(accesses)
        h = pipeline.handles
        dset = self._descriptor_set(h["set_layout"])
        writes = [self._write(pipeline, dset, b, bindings[b], rng) for b, rng in ranges.items()]
        if writes:
            vk.vkUpdateDescriptorSets(self.device.handle, len(writes), writes, 0, None)
        if self._bound is not h["pipeline"]:
            vk.vkCmdBindPipeline(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, h["pipeline"])
            self._bound = h["pipeline"]
        vk.vkCmdBindDescriptorSets(cb, vk.VK_PIPELINE_BIND_POINT_COMPUTE, h["layout"], 0, 1, [dset], 0, None)
        if data:
            vk.vkCmdPushConstants(cb, h["layout"], vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data),
                                  vk.ffi.from_buffer(bytes(data)))
        vk.vkCmdDispatch(cb, *g)
        self._pipelines[id(pipeline)] = pipeline

    def _write(self, pipeline: Pipeline, dset: Any, b: int, binding: Binding, rng: BufferRange) -> Any:
        vk = self.device.vk
        kind = pipeline._descriptor_type(pipeline.reflection.bindings[(0, b)])
        start = rng.buffer.offset + rng.offset
        if isinstance(binding, TexelRange):
            view = vk.vkCreateBufferView(self.device.handle, vk.VkBufferViewCreateInfo(
                buffer=rng.buffer.block.buffer, format=getattr(vk, TEXEL_FORMATS[binding.format][0]),
                offset=start, range=rng.nbytes), None)
            self._views.append(view)
            return vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=b, descriptorCount=1, descriptorType=kind,
                                           pTexelBufferView=[view])
        return vk.VkWriteDescriptorSet(dstSet=dset, dstBinding=b, descriptorCount=1, descriptorType=kind,
                                       pBufferInfo=[vk.VkDescriptorBufferInfo(
                                           buffer=rng.buffer.block.buffer, offset=start, range=rng.nbytes)])

    def copy(self, src: Binding, dst: Binding, nbytes: int | None = None) -> None:
        """Record a copy of ``nbytes`` (default: all of ``src``) from ``src`` to ``dst``."""
        vk, cb = self.device.vk, self._check_open()
        s, d = _as_range(src), _as_range(dst)
        n = s.nbytes if nbytes is None else nbytes
        if n > s.nbytes or n > d.nbytes:
            raise GpuError(f"copy of {n} bytes does not fit source {s.nbytes} / destination {d.nbytes} bytes")
        s, d = BufferRange(s.buffer, s.offset, n), BufferRange(d.buffer, d.offset, n)
        if Hazards.overlap(s, d):
            raise GpuError("copy source and destination overlap; copy through a temporary buffer")
        self._touch([(s, True, False), (d, False, True)])
        vk.vkCmdCopyBuffer(cb, s.buffer.block.buffer, d.buffer.block.buffer, 1, [vk.VkBufferCopy(
            srcOffset=s.buffer.offset + s.offset, dstOffset=d.buffer.offset + d.offset, size=n)])

    def fill(self, dst: Binding, value: int = 0) -> None:
        """Record filling ``dst`` with the 32-bit pattern ``value`` (size and offset multiples of 4)."""
        vk, cb = self.device.vk, self._check_open()
        d = _as_range(dst)
        if (d.buffer.offset + d.offset) % 4 or d.nbytes % 4:
            raise GpuError(f"fill needs an offset and size that are multiples of 4; got {d.offset}, {d.nbytes}")
        self._touch([(d, False, True)])
        vk.vkCmdFillBuffer(cb, d.buffer.block.buffer, d.buffer.offset + d.offset, d.nbytes, value & 0xFFFFFFFF)

    def mark(self, name: str) -> None:
        """Record a timestamp called ``name`` once all earlier commands have finished."""
        vk, cb = self.device.vk, self._check_open()
        if self._query_pool is None:
            raise GpuError("mark() needs Commands(device, timestamps=True)")
        if len(self._marks) >= _MAX_MARKS:
            raise GpuError(f"at most {_MAX_MARKS} timestamps per submission")
        vk.vkCmdWriteTimestamp(cb, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self._query_pool, len(self._marks))
        self._marks.append(name)

    def barrier(self) -> None:
        """Record a full compute/transfer memory barrier (hazards get one automatically)."""
        self._check_open()
        self._barrier()

    # -- submission --------------------------------------------------------------
    def submit(self, wait: bool = True) -> Submission:
        """Submit the recording with a fence; wait for it unless ``wait=False``."""
        vk, cb = self.device.vk, self._check_open()
        if self._hazards.wrote:
            vk.vkCmdPipelineBarrier(
                cb, _STAGES(vk), vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1,
                [vk.VkMemoryBarrier(srcAccessMask=vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
                                    dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)], 0, None, 0, None)
        submission = Submission(self.device, 0)
        done = _Completion(self.device, self._pools, self._views, self._query_pool, list(self._marks), submission)
        self._open = False
        serial = self.device.submit(cb, [done])
        submission.serial = serial
        for buf in self._buffers.values():
            buf.used_by(serial)
            buf._lease.recording -= 1
        for pipe in self._pipelines.values():
            pipe.used_by(serial)
        self._buffers.clear()
        self.submission = submission
        return submission.wait() if wait else submission

    def discard(self) -> None:
        """Drop the recording without submitting it. Idempotent."""
        if not self._open:
            return
        self._open = False
        for buf in self._buffers.values():
            buf._lease.recording -= 1
        self._buffers.clear()
        self.device.vk.vkEndCommandBuffer(self._cb)
        self.device.submit_nothing(self._cb)
        _Completion(self.device, self._pools, self._views, self._query_pool, [], None)()

    def close(self) -> None:
        """Discard the recording unless it was submitted. Idempotent."""
        self.discard()

    def __enter__(self) -> Commands:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None and self._open:
            self.submit(wait=True)
        else:
            self.discard()

    # -- internals ---------------------------------------------------------------
    def _check_open(self) -> Any:
        if not self._open:
            raise ClosedError("these commands were submitted or discarded; record new Commands")
        return self._cb

    def _touch(self, accesses: list[tuple[BufferRange, bool, bool]]) -> None:
        if self._hazards.conflicts(accesses):
            self._barrier()
        self._hazards.record(accesses)
        for rng, _, _ in accesses:
            if id(rng.buffer) not in self._buffers:
                self._buffers[id(rng.buffer)] = rng.buffer
                rng.buffer._lease.recording += 1

    def _barrier(self) -> None:
        vk = self.device.vk
        stages = _STAGES(vk)
        access = vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT
        vk.vkCmdPipelineBarrier(self._cb, stages, stages, 0, 1, [vk.VkMemoryBarrier(
            srcAccessMask=access,
            dstAccessMask=access | vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT,
        )], 0, None, 0, None)
        self.barriers += 1
        self._hazards.clear()

    def _check_bindings(self, pipeline: Pipeline, bindings: Mapping[int, Binding]) -> dict[int, BufferRange]:
        declared = {b: blk for (_, b), blk in pipeline.reflection.bindings.items()}
        missing = sorted(set(declared) - set(bindings))
        extra = sorted(set(bindings) - set(declared))
        if missing or extra:
            names = ", ".join(f"{b}={blk.variable or blk.name}" for b, blk in declared.items())
            raise GpuError(f"bindings for {pipeline.name!r}: missing {missing}, unexpected {extra}; "
                           f"the shader declares {names}")
        out = {}
        for b in sorted(declared):
            blk = declared[b]
            where = f"binding {b} ({blk.variable or blk.name}) of {pipeline.name!r}"
            out[b] = self._check_binding(where, blk, bindings[b])
        return out

    def _check_binding(self, where: str, blk: spirv.Block, binding: Binding) -> BufferRange:
        info, rng = self.device.info, _as_range(binding)
        if rng.buffer.device is not self.device:
            raise GpuError(f"{where}: the buffer belongs to another device")
        start = rng.buffer.offset + rng.offset
        if blk.kind.endswith("_texel"):
            if not isinstance(binding, TexelRange):
                raise GpuError(f"{where} is a texel buffer; bind gpu.texel(buffer, format)")
            if blk.kind not in texel_features(self.device, binding.format):
                raise GpuError(f"{where}: format {binding.format} cannot be a {blk.kind} buffer on {info.name}")
            if binding.texels > info.max_texel_buffer_elements:
                raise GpuError(f"{where}: {binding.texels} texels exceed maxTexelBufferElements "
                               f"{info.max_texel_buffer_elements}; bind it in chunks")
            _check_alignment(where, start, rng.offset, info.min_texel_buffer_offset_alignment,
                             "minTexelBufferOffsetAlignment")
            return rng
        if isinstance(binding, TexelRange):
            raise GpuError(f"{where} is a {blk.kind} buffer; bind the Buffer or a range of it")
        if rng.nbytes > info.max_storage_buffer_range:
            raise GpuError(f"{where}: range of {rng.nbytes} bytes exceeds maxStorageBufferRange "
                           f"{info.max_storage_buffer_range}; bind it in chunks")
        _check_alignment(where, start, rng.offset, info.min_storage_buffer_offset_alignment,
                         "minStorageBufferOffsetAlignment")
        if rng.nbytes < blk.size:
            raise GpuError(f"{where}: range of {rng.nbytes} bytes is smaller than the block ({blk.size})")
        return rng

    def _descriptor_set(self, set_layout: Any) -> Any:
        vk = self.device.vk
        if self._sets_left == 0:
            self._pools.append(self.device.descriptor_pool())
            self._sets_left = _SETS_PER_POOL
        self._sets_left -= 1
        return vk.vkAllocateDescriptorSets(self.device.handle, vk.VkDescriptorSetAllocateInfo(
            descriptorPool=self._pools[-1], descriptorSetCount=1, pSetLayouts=[set_layout]))[0]

    def _start_queries(self) -> None:
        vk, dev = self.device.vk, self.device.handle
        if self.device.timestamp_bits == 0:
            raise GpuError(f"device {self.device.info.name!r} has no timestamps on its compute queue")
        self._query_pool = vk.vkCreateQueryPool(dev, vk.VkQueryPoolCreateInfo(
            queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=_MAX_MARKS), None)
        vk.vkCmdResetQueryPool(self._cb, self._query_pool, 0, _MAX_MARKS)


_MAX_MARKS = 32


def _STAGES(vk: Any) -> int:
    return vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT


@dataclass
class _Completion:
    """Runs after a submission's fence: read timestamps, recycle descriptor pools, drop queries."""

    device: Device
    pools: list[Any]
    views: list[Any]
    query_pool: Any
    marks: list[str]
    submission: Submission | None

    def __call__(self) -> None:
        vk = self.device.vk
        for view in self.views:
            vk.vkDestroyBufferView(self.device.handle, view, None)
        if self.query_pool is not None:
            if self.marks and self.submission is not None:
                n = len(self.marks)
                data = vk.ffi.new("uint64_t[]", n)
                vk.vkGetQueryPoolResults(self.device.handle, self.query_pool, 0, n, 8 * n, data, 8,
                                         vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT)
                mask = (1 << self.device.timestamp_bits) - 1 if self.device.timestamp_bits < 64 else ~0
                period = self.device.info.timestamp_period_ns
                t0 = data[0] & mask
                self.submission.marks.update(
                    {name: ((data[i] & mask) - t0) * period for i, name in enumerate(self.marks)})
            vk.vkDestroyQueryPool(self.device.handle, self.query_pool, None)
        for pool in self.pools:
            self.device.recycle_descriptor_pool(pool)


__all__ = ["Binding", "Commands", "Compute", "Pipeline", "Submission", "shader_path"]
