"""Buffers: pooled sub-allocation, explicit transfers, zero-copy views, host import."""

from __future__ import annotations

import numpy as np
import pytest

import gpu
from gpu.buffers import ImportedBuffer, can_import
from gpu.pool import OutOfMemory

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int64, np.uint8, np.float64])
def test_write_read_round_trip(device: gpu.Device, rng: np.random.Generator, dtype: type) -> None:
    data = (rng.standard_normal((37, 3)) * 100).astype(dtype)
    with gpu.Buffer(device, data.nbytes + 64) as buf:
        buf.write(data, offset=64)
        assert np.array_equal(buf.read(dtype, data.shape, offset=64), data)


def test_view_is_zero_copy(device: gpu.Device) -> None:
    with gpu.Buffer(device, 1024) as buf:
        v = buf.view(np.int32, (16, 16))
        v[:] = np.arange(256).reshape(16, 16)
        assert buf.read(np.int32)[17] == 17
        buf.write(np.full(4, 9, np.int32), offset=8)
        assert list(v.reshape(-1)[:5]) == [0, 1, 9, 9, 9]


def test_small_buffers_share_one_device_block(device: gpu.Device) -> None:
    pool = device.pools["device"]
    before = pool.stats().device_allocations
    with gpu.Buffer(device, 1000) as a, gpu.Buffer(device, 3000) as b:
        assert a.block.buffer == b.block.buffer
        assert a.offset != b.offset and a.offset % 256 == 0 and b.offset % 256 == 0
        a.view()[:] = 1
        b.view()[:] = 2
        assert a.read().max() == 1 and b.read().min() == 2
    assert pool.stats().device_allocations - before <= 1


def test_bad_sizes_and_ranges_are_refused(device: gpu.Device) -> None:
    with pytest.raises(gpu.GpuError, match="positive number of bytes; got 0"):
        gpu.Buffer(device, 0)
    with pytest.raises(gpu.GpuError, match="Unknown buffer memory 'vram'; available: device, host"):
        gpu.Buffer(device, 16, memory="vram")
    with gpu.Buffer(device, 64) as buf:
        with pytest.raises(gpu.GpuError, match=r"range \[32, 96\) is outside the buffer of 64 bytes"):
            buf.range(32, 64)
        with pytest.raises(gpu.GpuError, match="exceeds the buffer of 64 bytes"):
            buf.view(np.float64, 9)


def test_host_memory_buffers(device: gpu.Device) -> None:
    with gpu.Buffer(device, 256, memory="host") as buf:
        assert buf.host_visible
        buf.write(np.arange(64, dtype=np.float32))
        assert buf.read(np.float32)[63] == 63


def test_out_of_memory_carries_the_size(device: gpu.Device, monkeypatch: pytest.MonkeyPatch) -> None:
    vk = device.vk

    def refuse(*args: object, **kwargs: object) -> None:
        raise vk.VkErrorOutOfDeviceMemory()

    monkeypatch.setattr(vk, "vkAllocateMemory", refuse)
    with pytest.raises(OutOfMemory) as exc:
        gpu.Buffer(device, 300 << 20)
    assert exc.value.size_hint >= 300 << 20
    assert isinstance(exc.value, gpu.GpuError)


def test_imported_host_arrays_are_used_in_place(device: gpu.Device, rng: np.random.Generator) -> None:
    assert can_import(device)
    src = rng.standard_normal(50_000).astype(np.float32)
    dst = np.zeros(50_001, np.float32)[1:]  # an unaligned start inside its page
    with ImportedBuffer(device, src) as a, ImportedBuffer(device, dst) as b:
        assert a.nbytes == src.nbytes and b.offset % 4 == 0
        with gpu.Commands(device) as cmd:
            cmd.copy(a, b.range(0, src.nbytes))
        assert np.array_equal(dst, src)
        assert b.view(np.float32)[5] == src[5]


def test_import_refuses_strided_arrays(device: gpu.Device) -> None:
    with pytest.raises(gpu.GpuError, match="C-contiguous"):
        ImportedBuffer(device, np.zeros((8, 8), np.float32)[:, ::2])


def test_read_only_arrays_can_be_imported_for_reading(device: gpu.Device) -> None:
    src = np.frombuffer(np.arange(4096, dtype=np.int32).tobytes(), np.int32)
    out = np.zeros(4096, np.int32)
    with ImportedBuffer(device, src) as a, gpu.Buffer(device, src.nbytes) as b:
        with gpu.Commands(device) as cmd:
            cmd.copy(a, b)
        b.read(out=out)
    assert np.array_equal(out, src)
