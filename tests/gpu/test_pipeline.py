"""Pipelines and command recording: bindings checks, hazards, timestamps, lifetime."""

from __future__ import annotations

import numpy as np
import pytest

import gpu
from gpu.buffers import BufferRange

pytestmark = pytest.mark.gpu

ADD = """#version 450
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const float STEP = 1.0;
layout(std430, binding = 0) readonly buffer In { float src[]; };
layout(std430, binding = 1) writeonly buffer Out { float dst[]; };
layout(push_constant) uniform Params { uint n; } pc;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < pc.n) { dst[i] = src[i] + STEP; }
}
"""


@pytest.fixture
def add(device: gpu.Device, compile_glsl):  # type: ignore[no-untyped-def]
    with gpu.Compute(device, compile_glsl(ADD, "add"), local_size=(64,), constants={1: 0.5},
                     name="add") as pipe:
        yield pipe


def test_chained_dispatches_see_each_others_writes(device: gpu.Device, add: gpu.Pipeline) -> None:
    n = 1000
    with gpu.Buffer(device, 4 * n) as a, gpu.Buffer(device, 4 * n) as b:
        a.write(np.arange(n, dtype=np.float32))
        with gpu.Commands(device) as cmd:
            for src, dst in [(a, b), (b, a), (a, b), (b, a)]:
                cmd.dispatch(add, -(-n // 64), {0: src, 1: dst}, {"n": n})
        assert cmd.barriers == 3
        assert np.array_equal(a.read(np.float32), np.arange(n, dtype=np.float32) + 2.0)


def test_disjoint_writes_need_no_barrier(device: gpu.Device, add: gpu.Pipeline) -> None:
    with gpu.Buffer(device, 4096) as a, gpu.Buffer(device, 4096) as b:
        a.write(np.ones(1024, np.float32))
        with gpu.Commands(device) as cmd:
            cmd.dispatch(add, 8, {0: a.range(0, 2048), 1: b.range(0, 2048)}, {"n": 512})
            cmd.dispatch(add, 8, {0: a.range(2048, 2048), 1: b.range(2048, 2048)}, {"n": 512})
        assert cmd.barriers == 0
        assert np.all(b.read(np.float32) == 1.5)


def test_local_size_and_constants_come_from_specialization(add: gpu.Pipeline) -> None:
    assert add.local_size == (64, 1, 1)
    assert add.reflection.local_size_spec_ids == (0, None, None)


def test_bindings_are_checked_against_the_shader(device: gpu.Device, add: gpu.Pipeline) -> None:
    with gpu.Buffer(device, 1024) as a, gpu.Commands(device) as cmd:
        with pytest.raises(gpu.GpuError, match=r"missing \[1\], unexpected \[5\]; the shader declares 0=In, 1=Out"):
            cmd.dispatch(add, 1, {0: a, 5: a}, {"n": 1})
        align = device.info.min_storage_buffer_offset_alignment
        if align > 1:
            with pytest.raises(gpu.GpuError, match="not a multiple of minStorageBufferOffsetAlignment"):
                cmd.dispatch(add, 1, {0: a.range(align // 2, 64), 1: a.range(512, 64)}, {"n": 1})
        huge = BufferRange(a, 0, device.info.max_storage_buffer_range + 4)
        with pytest.raises(gpu.GpuError, match="exceeds maxStorageBufferRange .* bind it in chunks"):
            cmd.dispatch(add, 1, {0: huge, 1: a}, {"n": 1})
        with pytest.raises(gpu.GpuError, match="each count must be in 1.."):
            cmd.dispatch(add, (0, 1), {0: a, 1: a}, {"n": 1})
        with pytest.raises(gpu.GpuError, match="push constants for 'add' are 3 bytes; the block needs 4"):
            cmd.dispatch(add, 1, {0: a, 1: a}, b"abc")
        cmd.discard()


def test_timestamps_measure_the_work(device: gpu.Device, add: gpu.Pipeline) -> None:
    n = 1 << 20
    with gpu.Buffer(device, 4 * n) as a, gpu.Buffer(device, 4 * n) as b:
        with gpu.Commands(device, timestamps=True) as cmd:
            cmd.mark("start")
            cmd.dispatch(add, n // 64, {0: a, 1: b}, {"n": n})
            cmd.mark("end")
        marks = cmd.submission.marks
        assert marks["start"] == 0.0 and marks["end"] > 0.0
        with gpu.Commands(device) as plain:
            with pytest.raises(gpu.GpuError, match="timestamps=True"):
                plain.mark("x")


def test_commands_are_used_once(device: gpu.Device, add: gpu.Pipeline) -> None:
    with gpu.Buffer(device, 256) as a:
        cmd = gpu.Commands(device)
        cmd.fill(a, 0)
        cmd.submit()
        with pytest.raises(gpu.ClosedError, match="submitted or discarded"):
            cmd.fill(a, 1)


def test_a_raising_block_discards_the_recording(device: gpu.Device, add: gpu.Pipeline) -> None:
    a = gpu.Buffer(device, 256)
    a.write(np.zeros(64, np.float32))
    with pytest.raises(RuntimeError):
        with gpu.Commands(device) as cmd:
            cmd.fill(a, 0x3F800000)
            raise RuntimeError("boom")
    a.close()  # not pinned by the discarded recording


def test_fill_copy_and_their_checks(device: gpu.Device) -> None:
    with gpu.Buffer(device, 1024) as a, gpu.Buffer(device, 1024) as b:
        with gpu.Commands(device) as cmd:
            cmd.fill(b, 0)
            cmd.fill(a.range(0, 512), 0x01010101)
            cmd.copy(a.range(0, 512), b.range(512, 512))
            with pytest.raises(gpu.GpuError, match="multiples of 4"):
                cmd.fill(a.range(0, 6))
            with pytest.raises(gpu.GpuError, match="overlap"):
                cmd.copy(a.range(0, 512), a.range(256, 512))
        assert cmd.barriers == 1
        assert np.all(b.read()[512:] == 1) and np.all(b.read()[:512] == 0)


def test_unknown_shader_lists_the_shaders(device: gpu.Device) -> None:
    with pytest.raises(gpu.GpuError, match=r"Unknown shader 'nope'; available: .*echo_push"):
        gpu.Compute(device, "nope")


def test_fixed_local_size_cannot_be_respecialized(device: gpu.Device) -> None:
    with pytest.raises(gpu.GpuError, match="fixed work-group size"):
        gpu.Compute(device, "echo_tight", local_size=(4,))


def test_local_size_over_the_limit_is_refused(device: gpu.Device, compile_glsl) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(gpu.GpuError, match="exceeds .* limits"):
        gpu.Compute(device, compile_glsl(ADD, "add"), local_size=(device.info.max_workgroup_invocations * 2,))
